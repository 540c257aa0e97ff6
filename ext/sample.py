"""Fused proportional sampling: stratified draw -> two-level inverse CDF -> leaf -> IS weight, one launch.

The kernels here: ``_sample_kernel`` and ``_sample_gather_kernel`` (the same draw, plus the row copy); the
search of steps 2-3 they both inline is :mod:`.search`, the in-kernel uniforms of step 1 :mod:`.philox`.

Kernel ``_sample_kernel``, one program per draw ``k`` (grid ``(B,)``), over the two-level flat array of
:mod:`lightning_per.ops.reference` (``leaves`` ``(n_blocks, block)`` float32, ``block_sum``
``(n_blocks,)`` float64), with ``c = 1 - 2^-40`` (:data:`SHRINK`):

1. ``u_k = (k + U_k) / B`` (stratified, PER paper App. B.2.1; on CUDA computed as ``(k + U_k) * (1/B)``,
   as torch divides by a host scalar) or ``u_k = U_k``; float64. ``U_k`` is read from ``u`` (``torch.rand``),
   or, with a device RNG state (``tree.rng``, ``u`` the int B), drawn by the program itself
   (:func:`.philox.device_uniform`: Philox4x32-10, one counter per draw position in device memory): no
   ``torch.rand`` launch, and a CUDA graph that replays the kernel draws new numbers without registering a
   generator.
2. Block: ``C_b = sum_{c<=b} block_sum_c`` (float64 scan, chunks of at most ``MAX_CHUNK``), ``S`` the
   float64 sum of the block sums (a tree reduction: beside the scan when one chunk holds them all, else a
   first pass; equal to ``C_last`` up to rounding, which the ``c`` margin of ``2^-40`` covers for any but
   contrived magnitudes, and the positive-mass rule below covers the rest), target ``t = u_k (S c)``;
   ``b`` = the first block with ``C_b > t``; ``r = t - (C_b - block_sum_b)``.
3. Leaf: float64 scan ``D`` of row ``b``'s float32 leaves; ``j`` = the first leaf with
   ``D_j > min(r, R c)``, ``R = block_sum_b`` (the row's total as the priority write and ``reduce_blocks``
   keep it: the total of this same scan, which the reference recomputes as ``row_cdf[-1]``; taking the stored
   value saves the kernel a reduction, and for rows wider than ``MAX_CHUNK`` a whole pass);
   ``index = b * block + j``, ``p = leaves[b, j]``.
4. IS weight (PER section 3.4, buffer normalisation), float32 like the reference:
   ``w_k = powf(p / min_b block_min_b, float32(-beta))``.

These are the float64 formulas of ``reference.two_level_search_with_values`` and
``reference.is_weights``, so given the same uniforms the kernel returns the reference's index:
bit-for-bit whenever the prefix sums are exact (e.g. integer-valued priorities, where a tie
``t == C_b`` goes to the *next* slot of positive mass, ``searchsorted(right=True)``). With general
floats the scans round differently (Triton's tree vs torch's scan order, errors ~sqrt(n) ulp of the
total), which moves a draw only when ``t`` lies that close to a slot boundary: probability about
``N sqrt(n_blocks) 1e-16`` per draw (~3e-9 at N = 1e6).

Positive-mass rule (a refinement of the reference, documented): "first position with ``C > t``"
is taken among positions of positive mass; if rounding leaves none, the last positive position;
an all-zero input gives the last slot. With exact sums this is ``searchsorted(right=True)``; it
differs only where the reference would return a zero-mass slot (``r`` rounded ~1 ulp below 0, or an
all-zero buffer, where the reference indexes out of range).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import (
    MAX_CHUNK,
    SHRINK,
    check_device,
    chunk_for,
    compiling,
    expect,
    exponent,
    f64_bits,
    powf,
    register_op,
    remember_validated,
    scalar_arg,
    validated,
    warps_for,
)
from .philox import DEVICE_RNG_DRAWS, check_rng, device_uniform
from .search import check_levels, draw, min_all
from .state import PriorityTree

__all__ = ["two_level_search", "two_level_search_with_values", "sample_proportional", "is_weights",
           "sample_proportional_gather"]


# ----------------------------------------------------------------------------------------- kernels
@triton.jit(do_not_specialize=["n_blocks", "block", "inv_bits", "shrink_bits", "beta_bits"])
def _sample_kernel(leaves_ptr, bsum_ptr, bmin_ptr, u_ptr, beta_ptr, beta_bits, index_ptr, psel_ptr, w_ptr,
                   n_blocks, block, inv_bits, shrink_bits,
                   STRATIFIED: tl.constexpr, RECIP: tl.constexpr, WEIGHTS: tl.constexpr,
                   BETA_FROM_PTR: tl.constexpr, NB_CHUNK: tl.constexpr, NB_ONE: tl.constexpr,
                   ROW_CHUNK: tl.constexpr, ROW_ONE: tl.constexpr, DEVICE_RNG: tl.constexpr):
    k = tl.program_id(0)
    if DEVICE_RNG:  # u_ptr is the int64 RNG state (seed, counters)
        u = device_uniform(u_ptr, k)
    else:
        u = tl.load(u_ptr + k)  # float64
    if WEIGHTS:  # independent of the search: issued first so its latency overlaps the scans
        p_min = min_all(bmin_ptr, n_blocks, NB_CHUNK)
    index, p = draw(k, u, leaves_ptr, bsum_ptr, n_blocks, block, inv_bits, shrink_bits,
                     STRATIFIED, RECIP, NB_CHUNK, NB_ONE, ROW_CHUNK, ROW_ONE)
    tl.store(index_ptr + k, index)
    tl.store(psel_ptr + k, p)
    if WEIGHTS:
        neg_beta = (-exponent(beta_ptr, beta_bits, BETA_FROM_PTR)).to(tl.float32)
        tl.store(w_ptr + k, powf(tl.math.div_rn(p, p_min), neg_beta))


@triton.jit(do_not_specialize=["n", "beta_bits"])
def _is_weight_kernel(p_ptr, pmin_ptr, beta_ptr, beta_bits, w_ptr, n,
                      BETA_FROM_PTR: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    p = tl.load(p_ptr + offs, mask=m, other=1.0)
    neg_beta = (-exponent(beta_ptr, beta_bits, BETA_FROM_PTR)).to(tl.float32)
    w = powf(tl.math.div_rn(p, tl.load(pmin_ptr)), neg_beta)
    tl.store(w_ptr + offs, w, mask=m)


# --------------------------------------------------------------------------------------- launchers
def _check_u(u: Tensor, device: torch.device) -> None:
    expect(u, "u", torch.float64, ndim=1, device=device)
    if u.numel() < 1:
        raise ValueError("u must hold at least one draw (B >= 1)")


def _draws(u, rng: Tensor | None, device: torch.device) -> int:
    """B, with the checks of the two forms of ``u``: ``(B,)`` float64 uniforms, or the int B with ``rng`` (the
    tree's device RNG state)."""
    if rng is None and isinstance(u, int) and not isinstance(u, bool):
        raise ValueError(f"u is the batch size ({u}): the kernel draws the uniforms from tree.rng, which is None; "
                         f"give (B,) float64 uniforms or a tree with a device RNG state")
    if rng is None:
        _check_u(u, device)
        return u.numel()
    if compiling():
        raise ValueError("rng (uniforms drawn in the kernel) is not supported while torch.compile traces; "
                         "pass u = (B,) float64 uniforms")
    if isinstance(u, bool) or not isinstance(u, int) or not 1 <= u <= DEVICE_RNG_DRAWS:
        raise ValueError(f"u must be the batch size B, an int in [1, {DEVICE_RNG_DRAWS}], to draw from tree.rng; "
                         f"got {u!r}")
    if not validated((rng,)):
        check_rng(rng, device)
        remember_validated((rng,))
    return u


def _launch_sample(leaves: Tensor, block_sum: Tensor, block_min: Tensor | None, u: Tensor | int,
                   beta: Tensor | None, beta_value: float, stratified: bool,
                   max_chunk: int = MAX_CHUNK, rng: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Launch ``_sample_kernel``: ``(index (B,) int64, p_sel (B,) float32, w (B,) float32 or (0,))``; ``u`` is
    the ``(B,)`` uniforms, or B when the kernel draws them from ``rng``."""
    n_blocks, block = leaves.shape
    device = leaves.device
    n = u if rng is not None else u.numel()
    u = rng if rng is not None else u.contiguous()
    leaves, block_sum = leaves.contiguous(), block_sum.contiguous()
    index = torch.empty(n, dtype=torch.int64, device=device)
    p_sel = torch.empty(n, dtype=torch.float32, device=device)
    weights = block_min is not None
    w = torch.empty(n if weights else 0, dtype=torch.float32, device=device)
    nb_chunk, row_chunk = chunk_for(n_blocks, max_chunk), chunk_for(block, max_chunk)
    _sample_kernel[(n,)](
        leaves, block_sum, block_min.contiguous() if weights else p_sel, u,
        beta if beta is not None else u, f64_bits(beta_value), index, p_sel, w if weights else p_sel,
        n_blocks, block, f64_bits(1.0 / n), f64_bits(SHRINK),
        STRATIFIED=bool(stratified), RECIP=u.is_cuda, WEIGHTS=weights,
        BETA_FROM_PTR=beta is not None, NB_CHUNK=nb_chunk, NB_ONE=n_blocks <= nb_chunk,
        ROW_CHUNK=row_chunk, ROW_ONE=block <= row_chunk, DEVICE_RNG=rng is not None,
        num_warps=warps_for(max(nb_chunk, row_chunk)))
    return index, p_sel, w


@register_op("sample_proportional", fake=lambda leaves, block_sum, block_min, u, beta, beta_value, stratified: (
    torch.empty(u.numel(), dtype=torch.int64, device=u.device),
    torch.empty(u.numel(), dtype=torch.float32, device=u.device),
    torch.empty(u.numel() if block_min is not None else 0, dtype=torch.float32, device=u.device)))
def _sample_op(leaves: Tensor, block_sum: Tensor, block_min: Tensor | None, u: Tensor,
               beta: Tensor | None, beta_value: float, stratified: bool) -> tuple[Tensor, Tensor, Tensor]:
    return _launch_sample(leaves, block_sum, block_min, u, beta, beta_value, stratified)


def _launch_is_weights(p_sel: Tensor, p_min: Tensor, beta: Tensor | None, beta_value: float) -> Tensor:
    n = p_sel.numel()
    w = torch.empty(n, dtype=torch.float32, device=p_sel.device)
    p_min = p_min if p_min.dtype == torch.float32 else p_min.to(torch.float32)
    _is_weight_kernel[(triton.cdiv(n, 1024),)](
        p_sel.contiguous(), p_min, beta if beta is not None else p_min, f64_bits(beta_value), w, n,
        BETA_FROM_PTR=beta is not None, BLOCK=1024)
    return w


@register_op("is_weights", fake=lambda p_sel, p_min, beta, beta_value: torch.empty(
    p_sel.numel(), dtype=torch.float32, device=p_sel.device))
def _is_weights_op(p_sel: Tensor, p_min: Tensor, beta: Tensor | None, beta_value: float) -> Tensor:
    return _launch_is_weights(p_sel, p_min, beta, beta_value)


def _sample(leaves, block_sum, block_min, u, beta, beta_value, stratified, rng=None):
    if rng is not None:  # eager only (_draws refuses it while compiling)
        return _launch_sample(leaves, block_sum, block_min, u, beta, beta_value, stratified, rng=rng)
    if compiling():
        return torch.ops.lightning_per.sample_proportional(leaves, block_sum, block_min, u, beta, beta_value,
                                                           bool(stratified))
    return _launch_sample(leaves, block_sum, block_min, u, beta, beta_value, stratified)


# ------------------------------------------------------------------------------------ public ops
def two_level_search_with_values(leaves: Tensor, block_sum: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
    """Compiled ``reference.two_level_search_with_values`` (one launch; module docstring, steps 2-3).

    Args:
        leaves: ``(n_blocks, block)`` float32 stored values (0 = empty), CUDA.
        block_sum: ``(n_blocks,)`` float64 row sums of ``leaves`` (each row's search takes its block sum as the
            row's total, so they must be the sums of these leaves, as ``reduce_blocks`` makes them).
        u: ``(B,)`` float64 draws in ``[0, 1)``.

    Returns:
        ``(index, value)``: ``(B,)`` int64 slots ``b * block + j`` and ``(B,)`` float32 ``leaves`` there.

    Raises:
        ValueError/TypeError: shapes, dtypes, devices, or ``block > MAX_BLOCK``, ``n_blocks > MAX_BLOCKS``.
    """
    if not validated((leaves, block_sum)):
        check_levels(leaves, block_sum)
        remember_validated((leaves, block_sum))
    _check_u(u, leaves.device)
    index, p_sel, _ = _sample(leaves, block_sum, None, u, None, 0.0, False)
    return index, p_sel


def two_level_search(leaves: Tensor, block_sum: Tensor, u: Tensor) -> Tensor:
    """Compiled ``reference.two_level_search``: ``(B,)`` int64 slots (see
    :func:`two_level_search_with_values`)."""
    return two_level_search_with_values(leaves, block_sum, u)[0]


def sample_proportional(tree: PriorityTree, u: Tensor | int, stratified: bool = True,
                        normalize: str = "buffer") -> tuple[Tensor, Tensor]:
    """Fused proportional draw ``(index, w)`` from i.i.d. uniforms ``u`` (module docstring, steps 1-4).

    Equals ``lightning_per.ops.reference.sample_proportional`` (the sampler's reference sequence:
    ``stratified_uniforms`` -> ``two_level_search_with_values`` -> ``is_weights(p, block_min.amin())``).

    Args:
        tree: the :class:`~.state.PriorityTree` drawn from; it reads ``leaves`` ``(n_blocks, block)`` float32,
            ``block_sum`` ``(n_blocks,)`` float64 row sums of ``leaves`` (as :func:`two_level_search_with_values`),
            ``block_min`` ``(n_blocks,)`` float32 minimum positive leaf per block (``+inf`` if none), ``beta`` (IS
            exponent, float or 0-d tensor on the device, read on the device: graph-safe) and, when ``u`` is an
            int, ``rng``.
        u: ``(B,)`` float64 i.i.d. ``U[0, 1)`` draws (``torch.rand``), B >= 1; or the int B: the kernel draws the
            uniforms itself from ``tree.rng`` (a device RNG state, :func:`.philox.new_rng_state`; Philox, see
            :func:`.philox.device_uniform`) and counts them there, in place; no ``torch.rand`` launch and nothing
            to register with a CUDA graph. B <= ``DEVICE_RNG_DRAWS``; eager calls and CUDA graphs only
            (not while ``torch.compile`` traces).
        stratified: one draw per equal-mass segment.
        normalize: ``"buffer"`` (one launch) or ``"batch"`` (+ a max and a divide).

    Returns:
        ``index`` ``(B,)`` int64 and ``w`` ``(B,)`` float32 in ``(0, 1]``, on ``leaves.device``.

    Raises:
        ValueError, TypeError: a shape, dtype or device, an int ``u`` out of range or without ``tree.rng``, or an
            int ``u`` while ``torch.compile`` traces.

    Example::

        index, w = sample_proportional(PriorityTree(leaves, block_sum, block_min, beta=0.4), u)
    """
    leaves, block_sum, block_min, beta = tree.leaves, tree.block_sum, tree.block_min, tree.beta
    rng = tree.rng if isinstance(u, int) else None
    state = (leaves, block_sum, block_min)
    if not validated(state):
        check_levels(leaves, block_sum)
        expect(block_min, "block_min", torch.float32, block_sum.shape, device=leaves.device)
        remember_validated(state)
    _draws(u, rng, leaves.device)
    if normalize not in ("buffer", "batch"):
        raise ValueError(f"normalize must be 'buffer' or 'batch', got {normalize!r}")
    beta_t, beta_v = scalar_arg(beta, "beta", leaves.device)
    index, _, w = _sample(leaves, block_sum, block_min, u, beta_t, beta_v, stratified, rng)
    return index, (w / w.max() if normalize == "batch" else w)


def is_weights(p_sel: Tensor, p_min: Tensor, beta: Tensor | float, normalize: str = "buffer") -> Tensor:
    """Compiled ``reference.is_weights``: ``w = (p_sel / p_min)^-beta`` in float32, normalised by the
    buffer (as is) or by the batch max. ``p_sel`` ``(B,)`` float32, ``p_min`` 1-element; ``(B,)`` float32."""
    expect(p_sel, "p_sel", torch.float32, ndim=1)
    check_device(p_sel, "p_sel")
    if normalize not in ("buffer", "batch"):
        raise ValueError(f"normalize must be 'buffer' or 'batch', got {normalize!r}")
    if not isinstance(p_min, Tensor) or p_min.numel() != 1:
        raise ValueError("p_min must be a 1-element tensor")
    expect(p_min, "p_min", device=p_sel.device)
    beta_t, beta_v = scalar_arg(beta, "beta", p_sel.device)
    if p_sel.numel() == 0:
        return torch.empty_like(p_sel)
    if compiling():
        w = torch.ops.lightning_per.is_weights(p_sel, p_min, beta_t, beta_v)
    else:
        w = _launch_is_weights(p_sel, p_min, beta_t, beta_v)
    return w / w.max() if normalize == "batch" else w


# ------------------------------------------------------------------- sample + gather of packed rows
#: Largest number of row words one program copies per pass of the gather loop. A pass costs about one
#: memory latency (the store waits for its load), so large rows want few, wide passes: Pong's ~7,060-word
#: rows take two, CartPole's ~54 one (chunk 64). (``GPUPrioritizedSampler.sample_gather`` fuses rows of at most
#: ``FUSED_GATHER_MAX_WORDS`` = 1,024 words; wider ones reach this kernel only through the op itself.)
GATHER_CHUNK = 4096


def gather_warps(search_warps: int, w_chunk: int) -> int:
    """Warps of the fused sample + gather kernel: the search's, or 8 for copy chunks above 1024 words
    (<= 16 int64 per thread in flight)."""
    return max(search_warps, 8) if w_chunk > 1024 else search_warps


@triton.jit(do_not_specialize=["n_blocks", "block", "inv_bits", "shrink_bits", "beta_bits", "n_rows"])
def _sample_gather_kernel(leaves_ptr, bsum_ptr, bmin_ptr, u_ptr, beta_ptr, beta_bits, index_ptr, w_ptr,
                          rows_ptr, out_ptr, n_rows, width, row_stride,
                          n_blocks, block, inv_bits, shrink_bits,
                          STRATIFIED: tl.constexpr, RECIP: tl.constexpr, BETA_FROM_PTR: tl.constexpr,
                          NB_CHUNK: tl.constexpr, NB_ONE: tl.constexpr, ROW_CHUNK: tl.constexpr,
                          ROW_ONE: tl.constexpr, W_CHUNK: tl.constexpr, DEVICE_RNG: tl.constexpr):
    """``_sample_kernel`` (weights on) that also copies the drawn row: ``out[k, :] = rows[index_k, :]``.

    One program per draw, as ``_sample_kernel``; after the search the program copies its row in
    ``ceil(width / W_CHUNK)`` masked passes of ``W_CHUNK`` contiguous words (coalesced loads and stores;
    no p_sel output). A slot ``>= n_rows`` (only the all-zero-priority fallback slot can be) reads zeros
    instead of memory outside the ring."""
    k = tl.program_id(0)
    if DEVICE_RNG:  # u_ptr is the int64 RNG state (seed, counters)
        u = device_uniform(u_ptr, k)
    else:
        u = tl.load(u_ptr + k)  # float64
    p_min = min_all(bmin_ptr, n_blocks, NB_CHUNK)  # independent of the search: issued first
    index, p = draw(k, u, leaves_ptr, bsum_ptr, n_blocks, block, inv_bits, shrink_bits,
                     STRATIFIED, RECIP, NB_CHUNK, NB_ONE, ROW_CHUNK, ROW_ONE)
    live = index < n_rows
    src = rows_ptr + index * row_stride  # int64 offsets: N * W may exceed 2^31
    dst = out_ptr + k.to(tl.int64) * width
    for start in range(0, width, W_CHUNK):
        offs = start + tl.arange(0, W_CHUNK)
        m = offs < width
        tl.store(dst + offs, tl.load(src + offs, mask=tl.where(live, m, False), other=0), mask=m)
    tl.store(index_ptr + k, index)
    neg_beta = (-exponent(beta_ptr, beta_bits, BETA_FROM_PTR)).to(tl.float32)
    tl.store(w_ptr + k, powf(tl.math.div_rn(p, p_min), neg_beta))


def _check_rows(rows: Tensor, device: torch.device) -> None:
    expect(rows, "rows", torch.int64, ndim=2, device=device)
    if rows.shape[0] < 1 or rows.shape[1] < 1:
        raise ValueError(f"rows must be a non-empty (N, W) ring, got shape {tuple(rows.shape)}")
    if rows.stride(1) != 1:
        raise ValueError(f"rows must be contiguous along its rows (stride 1 in dim 1), got strides "
                         f"{tuple(rows.stride())}")


def _launch_sample_gather(leaves: Tensor, block_sum: Tensor, block_min: Tensor, u: Tensor | int,
                          beta: Tensor | None, beta_value: float, stratified: bool, rows: Tensor,
                          max_chunk: int = MAX_CHUNK, max_gather_chunk: int = GATHER_CHUNK,
                          rng: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Launch ``_sample_gather_kernel``: ``(index (B,) int64, w (B,) float32, rows[index] (B, W) int64)``;
    ``u`` is the ``(B,)`` uniforms, or B when the kernel draws them from ``rng``."""
    n_blocks, block = leaves.shape
    device = leaves.device
    n = u if rng is not None else u.numel()
    u = rng if rng is not None else u.contiguous()
    n_rows, width = rows.shape
    leaves, block_sum = leaves.contiguous(), block_sum.contiguous()
    block_min = block_min.contiguous()
    index = torch.empty(n, dtype=torch.int64, device=device)
    w = torch.empty(n, dtype=torch.float32, device=device)
    out = torch.empty((n, width), dtype=rows.dtype, device=device)
    nb_chunk, row_chunk = chunk_for(n_blocks, max_chunk), chunk_for(block, max_chunk)
    w_chunk = chunk_for(width, max_gather_chunk)
    _sample_gather_kernel[(n,)](
        leaves, block_sum, block_min, u, beta if beta is not None else u, f64_bits(beta_value), index, w,
        rows, out, n_rows, width, rows.stride(0),
        n_blocks, block, f64_bits(1.0 / n), f64_bits(SHRINK),
        STRATIFIED=bool(stratified), RECIP=u.is_cuda, BETA_FROM_PTR=beta is not None,
        NB_CHUNK=nb_chunk, NB_ONE=n_blocks <= nb_chunk, ROW_CHUNK=row_chunk, ROW_ONE=block <= row_chunk,
        W_CHUNK=w_chunk, DEVICE_RNG=rng is not None,
        num_warps=gather_warps(warps_for(max(nb_chunk, row_chunk)), w_chunk))
    return index, w, out


@register_op("sample_proportional_gather",
             fake=lambda leaves, block_sum, block_min, u, beta, beta_value, stratified, rows: (
                 torch.empty(u.numel(), dtype=torch.int64, device=u.device),
                 torch.empty(u.numel(), dtype=torch.float32, device=u.device),
                 torch.empty((u.numel(), rows.shape[1]), dtype=rows.dtype, device=u.device)))
def _sample_gather_op(leaves: Tensor, block_sum: Tensor, block_min: Tensor, u: Tensor, beta: Tensor | None,
                      beta_value: float, stratified: bool, rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return _launch_sample_gather(leaves, block_sum, block_min, u, beta, beta_value, stratified, rows)


def sample_proportional_gather(tree: PriorityTree, u: Tensor | int, rows: Tensor, stratified: bool = True,
                               normalize: str = "buffer") -> tuple[Tensor, Tensor, Tensor]:
    """:func:`sample_proportional` that also gathers the drawn rows of a packed ring, in the same launch.

    Equals ``reference.sample_proportional_gather`` (``sample_proportional`` then ``rows[index]``): the
    same slots and weights as :func:`sample_proportional` on the same uniforms (the search is the same
    inlined code), and the rows bit for bit.

    Args:
        tree, u, stratified, normalize: as :func:`sample_proportional` (with an int ``u``, the same draws as
            :func:`sample_proportional` from the same RNG state).
        rows: ``(N, W)`` int64 ring (``GPUTensorStorage(packed=True).rows``), rows contiguous, on the
            device of ``leaves``; slots index its rows.

    Returns:
        ``index`` ``(B,)`` int64, ``w`` ``(B,)`` float32, ``batch_rows`` ``(B, W)`` int64 (a fresh tensor).

    Raises:
        As :func:`sample_proportional`, and for a ``rows`` that is not a non-empty int64 ``(N, W)`` ring.

    Example::

        index, w, batch_rows = sample_proportional_gather(PriorityTree(leaves, block_sum, block_min), 256, rows)
    """
    leaves, block_sum, block_min, beta = tree.leaves, tree.block_sum, tree.block_min, tree.beta
    rng = tree.rng if isinstance(u, int) else None
    state = (leaves, block_sum, block_min, rows)
    if not validated(state):
        check_levels(leaves, block_sum)
        expect(block_min, "block_min", torch.float32, block_sum.shape, device=leaves.device)
        _check_rows(rows, leaves.device)
        remember_validated(state)
    _draws(u, rng, leaves.device)
    if normalize not in ("buffer", "batch"):
        raise ValueError(f"normalize must be 'buffer' or 'batch', got {normalize!r}")
    beta_t, beta_v = scalar_arg(beta, "beta", leaves.device)
    if rng is not None:
        index, w, out = _launch_sample_gather(leaves, block_sum, block_min, u, beta_t, beta_v, stratified, rows,
                                              rng=rng)
    elif compiling():
        index, w, out = torch.ops.lightning_per.sample_proportional_gather(
            leaves, block_sum, block_min, u, beta_t, beta_v, bool(stratified), rows)
    else:
        index, w, out = _launch_sample_gather(leaves, block_sum, block_min, u, beta_t, beta_v, stratified, rows)
    return index, (w / w.max() if normalize == "batch" else w), out
