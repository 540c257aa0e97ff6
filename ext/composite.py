"""Plain-torch versions of the fused ops, composed from :mod:`lightning_per.ops.reference` in exactly
the order the samplers call them: the oracle of the fused kernels and their fallback.

* :func:`sample_proportional` = ``GPUPrioritizedSampler.sample``'s body,
* :func:`write_priorities` = ``GPUPrioritizedSampler._write``,
* :func:`rank_sample` = ``GPURankBasedSampler.sample``'s body after the sort refresh.

Proposed home: ``lightning_per/ops/reference.py`` under the same names, so that
``select_backend`` can hand a sampler either implementation and the sampler calls one op per step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_per.ops import reference

__all__ = ["sample_proportional", "write_priorities", "rank_sample"]


def _stratify(u: Tensor, stratified: bool) -> Tensor:
    n = u.numel()
    return (torch.arange(n, device=u.device, dtype=torch.float64) + u) / n if stratified else u


def sample_proportional(leaves: Tensor, block_sum: Tensor, block_min: Tensor, u: Tensor, beta: Tensor | float,
                        stratified: bool = True, normalize: str = "buffer") -> tuple[Tensor, Tensor]:
    """Proportional draw from i.i.d. uniforms ``u`` ``(B,)`` float64: ``(index (B,) int64, w (B,) float32)``.

    ``u' = (arange(B) + u) / B`` if ``stratified``; ``index, p = two_level_search_with_values(leaves,
    block_sum, u')``; ``w = is_weights(p, block_min.amin(), beta, normalize)``.
    """
    index, p_sel = reference.two_level_search_with_values(leaves, block_sum, _stratify(u, stratified))
    return index, reference.is_weights(p_sel, block_min.amin(), beta, normalize)


def write_priorities(raw_store: Tensor, leaves: Tensor, block_sum: Tensor, block_min: Tensor, max_raw: Tensor,
                     n_clamped: Tensor, n_dropped: Tensor, index: Tensor, priority: Tensor, n_valid: int,
                     trash: int, alpha: Tensor | float, eps: float) -> None:
    """In-place priority write (arguments as ``ext.update.write_priorities``): sanitize against the
    running max (1 before any), reject slots outside ``[0, n_valid)`` to ``trash`` with value 0,
    transform, last write wins, recompute the touched blocks from their leaves, fold the counters."""
    default = torch.where(torch.isinf(max_raw), torch.ones_like(max_raw), max_raw)
    clean, n_bad = reference.sanitize_priority(priority, default)  # [B] float32
    ok = (index >= 0) & (index < n_valid)  # [B]
    idx = index.where(ok, trash)  # [B]
    clean = clean.where(ok, 0.0)
    stored = reference.transform_priority(clean, alpha, eps).where(ok, 0.0)  # [B]
    last = reference.last_write_wins(idx, torch.arange(idx.numel(), device=idx.device))  # [B]
    raw_store.index_put_((idx,), clean[last])
    leaves.view(-1).index_put_((idx,), stored[last])
    blk = torch.div(idx, leaves.shape[1], rounding_mode="floor")  # [B]
    s, m = reference.reduce_blocks(leaves[blk])
    block_sum.index_put_((blk,), s)
    block_min.index_put_((blk,), m)
    torch.maximum(max_raw, clean.where(ok, float("-inf")).amax(), out=max_raw)
    n_clamped += n_bad
    n_dropped += idx.numel() - ok.sum()


def rank_sample(u: Tensor, rank_cdf: Tensor, order: Tensor, n: int, alpha: Tensor | float,
                beta: Tensor | float,
                stratified: bool = True, normalize: str = "buffer") -> tuple[Tensor, Tensor]:
    """Rank-based draw (PER section 3.3) from i.i.d. uniforms ``u`` ``(B,)`` float64.

    ``k = searchsorted(cdf[:n], u' * cdf[n-1], right)`` (zero-based rank), ``index = order[k]``,
    ``w = ((k + 1) / n)^(alpha beta)`` in float64 (normalised by the batch max for ``"batch"``).

    Args:
        rank_cdf: ``(N,)`` float64 prefix sums of ``k^-alpha``; order: ``(N,)`` int64 slot of each rank;
        n: ranked items (host int, ``1 <= n <= N``).

    Returns:
        ``(index (B,) int64, w (B,) float32)``.
    """
    cdf = rank_cdf[:n]
    k = reference.inverse_cdf_search(cdf, _stratify(u, stratified) * cdf[-1])  # [B]
    weight = torch.pow((k + 1).to(torch.float64) / n, alpha * beta)
    if normalize == "batch":
        weight = weight / weight.max()
    return order[k], weight.to(torch.float32)
