"""The device RNG of the sample kernels: Philox4x32-10 uniforms drawn inside a kernel, one counter per draw
position in device memory (:func:`device_uniform`), and the state those counters live in (:func:`new_rng_state`).

A kernel that draws its own uniforms needs no ``torch.rand`` launch, and a CUDA graph that replays it draws new
numbers without registering a generator. The stream is documented in :func:`device_uniform` and checked bit
for bit against an independent NumPy Philox (``tests/support/_philox.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import expect

__all__ = ["device_uniform", "check_rng", "seed_word", "new_rng_state", "shuffled_uniforms", "DEVICE_RNG_DRAWS",
           "RNG_DOMAIN", "SHUFFLE_DRAWS"]

#: Draws per call that the device RNG serves (one counter per draw position ``k``): the length of the RNG
#: state is ``1 + DEVICE_RNG_DRAWS`` int64 (seed, counters). Larger batches draw their uniforms with torch.
DEVICE_RNG_DRAWS = 1 << 16

#: Fourth Philox counter word of the device RNG ("PER!"): keeps its blocks apart from torch's CUDA generator's.
RNG_DOMAIN = 0x50455221


@triton.jit
def device_uniform(rng_ptr, k):
    """Draw ``k``'s uniform ``U`` in ``[0, 1)`` (float64, 53 random bits) from the device RNG state ``rng``
    (``(1 + DEVICE_RNG_DRAWS,)`` int64: the seed, then one counter per draw position), and count the draw.

    ``U`` = Philox4x32-10 (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3", SC'11) keyed
    by the seed's two 32-bit halves (its 64-bit pattern), at counter ``(c_lo, c_hi, k, D)`` with
    ``c = rng[1 + k]`` (the number of earlier draws at position ``k``) and ``D = 0x50455221`` (:data:`RNG_DOMAIN`:
    torch's CUDA generator, seeded alike, uses counters ``(offset / 4, 0, thread, 0)``; the fourth word keeps
    the two streams on different Philox blocks); of its four 32-bit outputs ``x0, x1``:
    ``U = ((x0 >> 5) * 2^26 + (x1 >> 6)) * 2^-53`` (the 53-bit construction of MT19937's
    ``genrand_res53``). Program ``k`` alone reads and writes its counter, so no two programs race and a
    replayed CUDA graph draws new numbers with no host update; the stream of a position does not depend
    on the batch sizes drawn. Every thread of the program reads the counter: a barrier lets them all read it
    before one of them stores the next value (without it a late warp could read the new count and search
    with another uniform than the rest of its program)."""
    seed = tl.load(rng_ptr)
    count = tl.load(rng_ptr + 1 + k)
    tl.debug_barrier()
    tl.store(rng_ptr + 1 + k, count + 1)
    x0, x1, _x2, _x3 = tl.philox(seed, count.to(tl.uint32), (count >> 32).to(tl.uint32), k.to(tl.uint32),
                                 (k * 0 + 0x50455221).to(tl.uint32))  # RNG_DOMAIN
    return ((x0 >> 5).to(tl.float64) * 67108864.0 + (x1 >> 6).to(tl.float64)) * 1.1102230246251565e-16  # 2^-53



def check_rng(rng: Tensor, device: torch.device) -> None:
    """Validate a device RNG state: ``(1 + DEVICE_RNG_DRAWS,)`` int64 on ``device`` (:func:`new_rng_state`)."""
    expect(rng, "rng", torch.int64, (1 + DEVICE_RNG_DRAWS,), device=device)


def seed_word(seed: int) -> int:
    """The int64 holding the 64-bit pattern of ``seed`` (taken modulo 2^64): what the RNG state stores."""
    return ((int(seed) & 0xFFFFFFFFFFFFFFFF) ^ (1 << 63)) - (1 << 63)


def new_rng_state(seed: int, device: torch.device | str) -> Tensor:
    """A fresh device RNG state for the ``rng`` argument of ``sample.sample_proportional`` and
    ``sample.sample_proportional_gather``: ``(1 + DEVICE_RNG_DRAWS,)`` int64 on ``device``, the seed's 64 bits
    (:func:`seed_word`) then zeroed counters (:func:`device_uniform` documents the stream)."""
    state = torch.zeros(1 + DEVICE_RNG_DRAWS, dtype=torch.int64, device=device)
    state[0] = seed_word(seed)
    return state


#: Largest batch :func:`shuffled_uniforms` serves (its one program sorts the batch's keys, each packed with its
#: position in the low 10 bits); larger shuffled batches draw their uniforms with torch.
SHUFFLE_DRAWS = 1024


@triton.jit
def _bits53(a, b):
    """The 53-bit integer ``(a >> 5) * 2^26 + (b >> 6)`` of two 32-bit Philox words, int64."""
    return (a >> 5).to(tl.int64) * 67108864 + (b >> 6).to(tl.int64)


@triton.jit(do_not_specialize=["n"])
def _shuffled_uniforms_kernel(rng_ptr, u_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    seed = tl.load(rng_ptr)
    count = tl.load(rng_ptr + 1 + offs, mask=m, other=0)
    _x0, _x1, x2, x3 = tl.philox(seed, count.to(tl.uint32), (count >> 32).to(tl.uint32), offs.to(tl.uint32),
                                 (offs * 0 + 0x50455221).to(tl.uint32))  # RNG_DOMAIN
    # (key, position) pairs in one int64 (53 + 10 bits), sorted: the r-th holds the position of rank r
    packed = tl.where(m, (_bits53(x2, x3) << 10) | offs.to(tl.int64), 0x7FFFFFFFFFFFFFFF)
    pos = tl.sort(packed) & 1023
    rank = offs  # of the position pos
    count_at = tl.load(rng_ptr + 1 + pos, mask=m, other=0)
    y0, y1, _y2, _y3 = tl.philox(seed, count_at.to(tl.uint32), (count_at >> 32).to(tl.uint32), pos.to(tl.uint32),
                                 (pos * 0 + 0x50455221).to(tl.uint32))
    uniform = _bits53(y0, y1).to(tl.float64) * 1.1102230246251565e-16  # 2^-53: U at that position
    tl.debug_barrier()  # every counter read (above) before one is advanced
    tl.store(rng_ptr + 1 + offs, count + 1, mask=m)
    tl.store(u_ptr + pos, (rank.to(tl.float64) + uniform) / n.to(tl.float64), mask=m)


def shuffled_uniforms(rng: Tensor, n: int) -> Tensor:
    """Stratified uniforms in a uniformly random order of the strata, drawn on the device from ``rng``: ``u_j =
    (pi(j) + U_j) / n``, ``(n,)`` float64, one launch of one program, no host sync.

    Position ``j`` takes one Philox4x32-10 block at its counter, exactly as :func:`device_uniform` (and counts it):
    its words ``x0, x1`` give ``U_j`` (the uniform :func:`device_uniform` returns there), its words ``x2, x3`` a
    53-bit key ``K_j = (x2 >> 5) * 2^26 + (x3 >> 6)``; ``pi(j)`` is the rank of ``(K_j, j)`` among the ``n`` pairs
    (lexicographic, so ties of keys break by position and ``pi`` is always a permutation), found by one sort of the
    pairs packed in an int64. Ranks of i.i.d. keys
    are a uniformly random permutation (ties have probability below ``n^2 2^-54``), as in
    ``lightning_per.replay.draws.random_permutation``. ``tests/support/_philox.py`` models the stream in NumPy.

    Args:
        rng: a device RNG state (:func:`new_rng_state`), advanced in place at positions ``0 .. n - 1``.
        n: the batch size, an int in ``[1, SHUFFLE_DRAWS]``.

    Raises:
        ValueError: ``n`` out of range; TypeError/ValueError: ``rng`` is not an RNG state.
    """
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= SHUFFLE_DRAWS:
        raise ValueError(f"n must be an int in [1, {SHUFFLE_DRAWS}], got {n!r}")
    check_rng(rng, rng.device)
    u = torch.empty(n, dtype=torch.float64, device=rng.device)
    block = max(triton.next_power_of_2(n), 2)
    _shuffled_uniforms_kernel[(1,)](rng, u, n, BLOCK=block, num_warps=4 if block <= 256 else 8)
    return u
