"""NumPy Philox4x32-10 and the uniform stream the replay kernels document (test oracle).

Written from the algorithm's definition (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3",
SC'11, section 4: round function, multipliers and Weyl key increments as published with Random123), not
from the kernels' code; ``test_ext_device_rng.py`` checks it against Random123's known-answer vectors.
"""

from __future__ import annotations

import numpy as np

M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)  # Philox4x32 multipliers
W0, W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)  # Weyl key increments
MASK = np.uint64(0xFFFFFFFF)


def philox4x32_10(ctr: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Philox4x32-10 of counters ``ctr`` ``(n, 4)`` and keys ``key`` ``(n, 2)`` (uint32 values) -> ``(n, 4)``."""
    c = [ctr[:, i].astype(np.uint64) for i in range(4)]
    k0, k1 = key[:, 0].astype(np.uint64), key[:, 1].astype(np.uint64)
    for r in range(10):
        if r:
            k0, k1 = (k0 + W0) & MASK, (k1 + W1) & MASK
        p0, p1 = M0 * c[0], M1 * c[2]  # 64-bit products of 32-bit values: exact in uint64
        hi0, lo0, hi1, lo1 = p0 >> np.uint64(32), p0 & MASK, p1 >> np.uint64(32), p1 & MASK
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
    return np.stack(c, axis=1).astype(np.uint32)


#: the fourth counter word the replay kernels document ("PER!")
DOMAIN = 0x50455221


def expected_uniforms(seed: int, counts: np.ndarray) -> np.ndarray:
    """The documented stream: Philox keyed by the halves of the seed's 64 bits at ``(c_lo, c_hi, k, DOMAIN)``,
    then ``((x0 >> 5) * 2^26 + (x1 >> 6)) * 2^-53``."""
    k = np.arange(len(counts), dtype=np.uint64)
    counts = counts.astype(np.uint64)
    seed &= 0xFFFFFFFFFFFFFFFF
    ctr = np.stack([counts & MASK, counts >> np.uint64(32), k, np.full_like(k, DOMAIN)], axis=1)
    key = np.tile(np.array([seed & 0xFFFFFFFF, seed >> 32], dtype=np.uint64), (len(counts), 1))
    x = philox4x32_10(ctr, key).astype(np.uint64)
    return ((x[:, 0] >> np.uint64(5)).astype(np.float64) * 67108864.0
            + (x[:, 1] >> np.uint64(6)).astype(np.float64)) * 2.0**-53


def expected_shuffled_uniforms(seed: int, counts: np.ndarray) -> np.ndarray:
    """The documented shuffled stream (``ext.philox.shuffled_uniforms``): per position ``j`` the Philox block of
    :func:`expected_uniforms`; ``U_j`` from its words ``x0, x1``, a 53-bit key ``K_j`` from ``x2, x3``; ``pi(j)``
    the rank of ``(K_j, j)`` (lexicographic); ``u_j = (pi(j) + U_j) / n``."""
    n = len(counts)
    k = np.arange(n, dtype=np.uint64)
    c = counts.astype(np.uint64)
    seed &= 0xFFFFFFFFFFFFFFFF
    ctr = np.stack([c & MASK, c >> np.uint64(32), k, np.full_like(k, DOMAIN)], axis=1)
    key = np.tile(np.array([seed & 0xFFFFFFFF, seed >> 32], dtype=np.uint64), (n, 1))
    x = philox4x32_10(ctr, key).astype(np.uint64)
    uniform = ((x[:, 0] >> np.uint64(5)).astype(np.float64) * 67108864.0
               + (x[:, 1] >> np.uint64(6)).astype(np.float64)) * 2.0**-53
    keys = (x[:, 2] >> np.uint64(5)) * np.uint64(67108864) + (x[:, 3] >> np.uint64(6))
    order = np.lexsort((np.arange(n), keys))  # by key, then position
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    return (rank.astype(np.float64) + uniform) / np.float64(n)
