"""The device RNG of the sample kernels: Philox4x32-10 uniforms drawn inside a kernel, one counter per draw
position in device memory (:func:`device_uniform`), and the state those counters live in (:func:`new_rng_state`).

A kernel that draws its own uniforms needs no ``torch.rand`` launch, and a CUDA graph that replays it draws new
numbers without registering a generator. The stream is documented in :func:`device_uniform` and checked bit
for bit against an independent NumPy Philox (``tests/_philox.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import expect

__all__ = ["device_uniform", "check_rng", "seed_word", "new_rng_state", "DEVICE_RNG_DRAWS", "RNG_DOMAIN"]

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
