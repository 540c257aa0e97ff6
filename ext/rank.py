"""Fused rank-based draw (PER paper section 3.3): draws -> rank search -> slot -> IS weight, one launch.

Kernel ``_rank_kernel`` (grid ``ceil(B / 128)``, one lane per draw), given the prefix sums
``cdf_k = sum_{i<=k} (i+1)^-alpha`` ``(N,)`` float64 and the slot of each rank ``order`` ``(N,)`` int64
(the sort refresh stays ``torch.sort``):

* ``u_k = (k + U_k) / B`` if stratified (``* (1/B)`` on CUDA, as torch computes it), else ``U_k``;
* ``r = min(upper_bound(cdf[0:n], u_k * cdf[n-1]), n - 1)`` by a branch-free binary search of
  ``bit_length(n)`` steps: exactly ``searchsorted(right=True)`` (the cdf is given, so indices are
  bit-identical to ``reference.inverse_cdf_search``);
* ``index = order[r]``, ``w = ((r + 1) / n)^(alpha beta)`` in float64 (PER section 3.4 normalised by
  ``min_j P(j) = P(rank n)``), stored as float32 (or float64 for batch normalisation, done after).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import (
    cdiv,
    check_device,
    compiling,
    expect,
    f64_bits,
    f64_from_bits,
    powf,
    register_op,
    scalar_arg,
)
from .state import RankTable

__all__ = ["rank_sample"]

_BLOCK = 128
MAX_RANKS = 1 << 30


@triton.jit(do_not_specialize=["n_draws", "n", "n_steps", "inv_bits", "inv_n_bits", "ab_bits"])
def _rank_kernel(u_ptr, cdf_ptr, order_ptr, alpha_ptr, beta_ptr, ab_bits, index_ptr, w_ptr,
                 n_draws, n, n_steps, inv_bits, inv_n_bits,
                 STRATIFIED: tl.constexpr, RECIP: tl.constexpr, AB_FROM_PTR: tl.constexpr,
                 BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n_draws
    u = tl.load(u_ptr + offs, mask=m, other=0.0)
    if STRATIFIED:
        if RECIP:
            u = (offs.to(tl.float64) + u) * f64_from_bits(inv_bits)
        else:
            u = (offs.to(tl.float64) + u) / n_draws.to(tl.float64)
    target = u * tl.load(cdf_ptr + n - 1)
    lo = tl.zeros([BLOCK], tl.int32)
    hi = tl.zeros([BLOCK], tl.int32) + n
    for _ in range(n_steps):  # upper bound: first position with cdf > target
        act = lo < hi
        mid = (lo + hi) // 2
        right = tl.load(cdf_ptr + mid, mask=act & m, other=0.0) <= target
        lo = tl.where(act & right, mid + 1, lo)
        hi = tl.where(act & ~right, mid, hi)
    r = tl.minimum(lo, n - 1)
    tl.store(index_ptr + offs, tl.load(order_ptr + r, mask=m, other=0), mask=m)
    if AB_FROM_PTR:
        ab = tl.load(alpha_ptr).to(tl.float64) * tl.load(beta_ptr).to(tl.float64)
    else:
        ab = f64_from_bits(ab_bits)
    if RECIP:
        x = (r + 1).to(tl.float64) * f64_from_bits(inv_n_bits)
    else:
        x = (r + 1).to(tl.float64) / n.to(tl.float64)
    tl.store(w_ptr + offs, powf(x, ab).to(w_ptr.dtype.element_ty), mask=m)


def _launch_rank(u: Tensor, rank_cdf: Tensor, order: Tensor, n: int, alpha: Tensor | None,
                 beta: Tensor | None, ab_value: float, stratified: bool,
                 weight_f64: bool) -> tuple[Tensor, Tensor]:
    b = u.numel()
    index = torch.empty(b, dtype=torch.int64, device=u.device)
    w = torch.empty(b, dtype=torch.float64 if weight_f64 else torch.float32, device=u.device)
    from_ptr = alpha is not None
    _rank_kernel[(cdiv(b, _BLOCK),)](
        u.contiguous(), rank_cdf, order, alpha if from_ptr else u, beta if from_ptr else u,
        f64_bits(ab_value), index, w, b, n, int(n).bit_length(), f64_bits(1.0 / b), f64_bits(1.0 / n),
        STRATIFIED=bool(stratified), RECIP=u.is_cuda, AB_FROM_PTR=from_ptr, BLOCK=_BLOCK)
    return index, w


@register_op("rank_sample", fake=lambda u, rank_cdf, order, n, alpha, beta, ab_value, stratified, weight_f64: (
    torch.empty(u.numel(), dtype=torch.int64, device=u.device),
    torch.empty(u.numel(), dtype=torch.float64 if weight_f64 else torch.float32, device=u.device)))
def _rank_op(u: Tensor, rank_cdf: Tensor, order: Tensor, n: int, alpha: Tensor | None, beta: Tensor | None,
             ab_value: float, stratified: bool, weight_f64: bool) -> tuple[Tensor, Tensor]:
    return _launch_rank(u, rank_cdf, order, n, alpha, beta, ab_value, stratified, weight_f64)


def rank_sample(table: RankTable, u: Tensor, n: int, stratified: bool = True,
                normalize: str = "buffer") -> tuple[Tensor, Tensor]:
    """Fused rank-based draw ``(index (B,) int64, w (B,) float32)`` (module docstring).

    Equals ``lightning_per.ops.reference.rank_sample`` (``GPURankBasedSampler.sample`` after its sort refresh).

    Args:
        table: the :class:`~.state.RankTable`: ``cdf`` ``(N,)`` float64 prefix sums of ``k^-alpha``, ``order``
            ``(N,)`` int64 slot holding rank k+1, the exponents ``alpha`` and ``beta`` (both floats or both
            1-element tensors on the device).
        u: ``(B,)`` float64 i.i.d. ``U[0, 1)`` draws, B >= 1.
        n: ranked (filled) items, host int in ``[1, min(N, MAX_RANKS)]``.
        stratified: one draw per equal-mass segment; normalize: ``"buffer"`` or ``"batch"``.

    Raises:
        ValueError, TypeError: a shape, dtype or device that does not fit (named), ``n`` out of range.

    Example::

        index, w = rank_sample(RankTable(cdf, order, 0.7, 0.5), u, n)
    """
    rank_cdf, order, alpha, beta = table

    expect(u, "u", torch.float64, ndim=1)
    check_device(u, "u")
    if u.numel() < 1:
        raise ValueError("u must hold at least one draw (B >= 1)")
    expect(rank_cdf, "rank_cdf", torch.float64, ndim=1, device=u.device)
    expect(order, "order", torch.int64, shape=rank_cdf.shape, device=u.device)
    if not (rank_cdf.is_contiguous() and order.is_contiguous()):
        raise ValueError("rank_cdf and order must be contiguous")
    if not (1 <= n <= min(rank_cdf.numel(), MAX_RANKS)):
        raise ValueError(f"n must lie in [1, {min(rank_cdf.numel(), MAX_RANKS)}], got {n}")
    if normalize not in ("buffer", "batch"):
        raise ValueError(f"normalize must be 'buffer' or 'batch', got {normalize!r}")
    alpha_t, alpha_v = scalar_arg(alpha, "alpha", u.device)
    beta_t, beta_v = scalar_arg(beta, "beta", u.device)
    if (alpha_t is None) != (beta_t is None):
        raise TypeError("alpha and beta must both be floats or both be tensors")
    f64 = normalize == "batch"
    if compiling():
        index, w = torch.ops.lightning_per.rank_sample(u, rank_cdf, order, int(n), alpha_t, beta_t,
                                                       alpha_v * beta_v, bool(stratified), f64)
    else:
        index, w = _launch_rank(u, rank_cdf, order, int(n), alpha_t, beta_t, alpha_v * beta_v, stratified,
                                f64)
    return index, ((w / w.max()).to(torch.float32) if f64 else w)
