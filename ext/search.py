"""The two-level inverse-CDF search of the sample kernels (``@triton.jit`` device functions), and the
validation of the two-level array it searches.

The array is that of ``lightning_per.ops.reference`` (``leaves`` ``(n_blocks, block)`` float32, ``block_sum``
``(n_blocks,)`` float64). :func:`draw` is steps 1-3 of :mod:`.sample` (stratified uniform -> block -> leaf),
inlined by both sample kernels so they return the same slots; :func:`locate` is one inverse-CDF pass over a
row of masses with the positive-mass rule of :mod:`.sample`; :func:`min_all` the minimum the IS weights
divide by.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import MAX_BLOCK, MAX_BLOCKS, check_device, expect, f64_from_bits

__all__ = ["draw", "locate", "min_all", "sum_total", "check_levels"]


@triton.jit
def _chunk(ptr, start, n, carry, live, CHUNK: tl.constexpr):
    """Chunk ``[start, start+CHUNK)`` of the masses ``ptr[0:n]``: offsets, validity, float64 values
    and their inclusive prefix sums continued from ``carry``."""
    offs = start + tl.arange(0, CHUNK)
    valid = tl.where(live, offs < n, False)  # masks are bool (Triton 3.9's interpreter refuses others)
    x = tl.load(ptr + offs, mask=valid, other=0.0).to(tl.float64)
    cdf = tl.cumsum(x, 0) + carry
    return offs, valid, x, cdf


@triton.jit
def sum_total(ptr, n, CHUNK: tl.constexpr):
    """Sum of ``ptr[0:n]`` in float64: a tree reduction per chunk, chunks added in order (the search's
    total; equal to the scan's last value up to rounding, far inside the ``SHRINK`` margin)."""
    total = tl.zeros([], tl.float64)
    for start in range(0, n, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        total += tl.sum(tl.load(ptr + offs, mask=offs < n, other=0.0).to(tl.float64), 0)
    return total


@triton.jit
def _pick_combine(ih1, ch1, xh1, il1, cl1, xl1, ih2, ch2, xh2, il2, cl2, xl2):
    """Combine of :func:`_pick`'s one-pass reduction: the smaller hit position and the larger positive
    position, each with its cdf and mass (positions are distinct, so no ties but the sentinels)."""
    first = ih2 < ih1
    last = il2 > il1
    return (tl.where(first, ih2, ih1), tl.where(first, ch2, ch1), tl.where(first, xh2, xh1),
            tl.where(last, il2, il1), tl.where(last, cl2, cl1), tl.where(last, xl2, xl1))


@triton.jit
def _pick(offs, valid, x, cdf, target, n):
    """First position with positive mass and ``cdf > target`` (``n`` if none) with its cdf and mass;
    the last position with positive mass (``-1`` if none) with its cdf and mass. One reduction pass
    (six values carried together) instead of six. When a position is not found (``n`` / ``-1``) its cdf
    and mass are unspecified (callers use them only for found positions)."""
    pos = valid & (x > 0)
    hit = pos & (cdf > target)
    i_hit, c_hit, x_hit, i_last, c_last, x_last = tl.reduce(
        (tl.where(hit, offs, n), cdf, x, tl.where(pos, offs, -1), cdf, x), 0, _pick_combine)
    return i_hit, c_hit, x_hit, i_last, c_last, x_last


@triton.jit
def locate(ptr, n, value, shrink, known_total, IS_FRACTION: tl.constexpr, CHUNK: tl.constexpr,
            ONE: tl.constexpr, KNOWN_TOTAL: tl.constexpr):
    """Inverse CDF over the ``n`` masses at ``ptr`` (float32 or float64, scanned in float64).

    ``S`` = the float64 sum of the masses (:func:`sum_total`; in one chunk a reduction beside the scan), or
    ``known_total`` if ``KNOWN_TOTAL`` (a stored total of these masses: no
    reduction, and no first pass when ``n > CHUNK``); target ``t = value * (S * shrink)`` if
    ``IS_FRACTION`` else ``min(value, S * shrink)``. Returns ``(pos, C_pos, x_pos, t)``: int32 position
    (the positive-mass rule of :mod:`.sample`), its inclusive prefix sum, its mass (float64, exact), and ``t``. ``ONE``
    (``n <= CHUNK``): one load and one scan; else two passes (total, then search; chunks after the hit
    load nothing), one with ``KNOWN_TOTAL``.
    """
    if ONE:
        offs, valid, x, cdf = _chunk(ptr, 0, n, 0.0, n > 0, CHUNK)
        if KNOWN_TOTAL:
            total = known_total
        else:  # a reduction of x beside the scan, not after it (the max of cdf would wait for the scan)
            total = tl.sum(x, 0)
    elif KNOWN_TOTAL:
        total = known_total
    else:
        total = sum_total(ptr, n, CHUNK)
    scaled = total * shrink
    if IS_FRACTION:
        # min(): value < 1 so a no-op, but it keeps t a rounded product (no FMA into r = t - ...)
        target = tl.minimum(value * scaled, scaled)
    else:
        target = tl.minimum(value, scaled)
    if ONE:
        found, c_found, x_found, last, c_last, x_last = _pick(offs, valid, x, cdf, target, n)
    else:
        found = n
        c_found = tl.zeros([], tl.float64)
        x_found = tl.zeros([], tl.float64)
        last = n * 0 - 1
        c_last = tl.zeros([], tl.float64)
        x_last = tl.zeros([], tl.float64)
        carry = tl.zeros([], tl.float64)
        for start in range(0, n, CHUNK):
            offs, valid, x, cdf = _chunk(ptr, start, n, carry, found == n, CHUNK)
            i_hit, c_hit, x_hit, i_last, c_l, x_l = _pick(offs, valid, x, cdf, target, n)
            take = (found == n) & (i_hit < n)
            c_found = tl.where(take, c_hit, c_found)
            x_found = tl.where(take, x_hit, x_found)
            found = tl.where(take, i_hit, found)
            c_last = tl.where(i_last >= 0, c_l, c_last)
            x_last = tl.where(i_last >= 0, x_l, x_last)
            last = tl.where(i_last >= 0, i_last, last)
            carry = tl.max(tl.where(valid, cdf, 0.0), 0)
    has_hit = found < n
    has_last = last >= 0
    pos = tl.where(has_hit, found, tl.where(has_last, last, n - 1))
    c_pos = tl.where(has_hit, c_found, tl.where(has_last, c_last, total))
    x_pos = tl.where(has_hit, x_found, tl.where(has_last, x_last, 0.0))  # no positive mass: all zero
    return pos, c_pos, x_pos, target


@triton.jit
def min_all(ptr, n, CHUNK: tl.constexpr):
    """``min(ptr[0:n])`` of float32 values (``+inf`` for n == 0)."""
    acc = tl.full([], float("inf"), tl.float32)
    for start in range(0, n, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        acc = tl.minimum(acc, tl.min(tl.load(ptr + offs, mask=offs < n, other=float("inf")), 0))
    return acc


@triton.jit
def draw(k, u, leaves_ptr, bsum_ptr, n_blocks, block, inv_bits, shrink_bits,
          STRATIFIED: tl.constexpr, RECIP: tl.constexpr, NB_CHUNK: tl.constexpr, NB_ONE: tl.constexpr,
          ROW_CHUNK: tl.constexpr, ROW_ONE: tl.constexpr):
    """Steps 1-3 of :mod:`.sample`'s docstring for draw ``k`` of uniform ``u`` (float64): ``(index int64,
    p float32 = leaves[index])``. Shared by ``_sample_kernel`` and ``_sample_gather_kernel`` (inlined),
    so both return the same slots and weights."""
    if STRATIFIED:
        if RECIP:
            u = (k.to(tl.float64) + u) * f64_from_bits(inv_bits)
        else:
            u = (k.to(tl.float64) + u) / tl.num_programs(0).to(tl.float64)
    shrink = f64_from_bits(shrink_bits)
    blk, c_blk, s_blk, target = locate(bsum_ptr, n_blocks, u, shrink, 0.0, True, NB_CHUNK, NB_ONE, False)
    r = target - (c_blk - s_blk)  # mass left inside block blk (s_blk = block_sum[blk])
    row = blk.to(tl.int64) * block
    # the row's total is its stored block sum (the write keeps it as this scan's total): no reduction
    j, c_j, x_j, t_j = locate(leaves_ptr + row, block, r, shrink, s_blk, False, ROW_CHUNK, ROW_ONE, True)
    return row + j, x_j.to(tl.float32)  # p = leaves[blk, j], exactly


def check_levels(leaves: Tensor, block_sum: Tensor) -> None:
    """Validate a two-level array: ``leaves`` ``(n_blocks, block)`` float32 (CUDA), ``block_sum``
    ``(n_blocks,)`` float64 on the same device; both dimensions within the kernel limits."""
    expect(leaves, "leaves", torch.float32, ndim=2)
    check_device(leaves, "leaves")
    n_blocks, block = leaves.shape
    if not (1 <= block <= MAX_BLOCK and 1 <= n_blocks <= MAX_BLOCKS):
        raise ValueError(f"leaves shape {tuple(leaves.shape)} outside the kernel limits: block in "
                         f"[1, {MAX_BLOCK}], n_blocks in [1, {MAX_BLOCKS}]")
    expect(block_sum, "block_sum", torch.float64, (n_blocks,), device=leaves.device)
