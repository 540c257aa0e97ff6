"""The slice samplers' device steps as pure functions of tensors: the two-level "next end" search, uniform starts,
and the expansion of starts into slices with their markers (:mod:`lightning_per.replay.slice` describes the state
they read)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_per.ops import reduce_blocks

__all__ = ["device_fn", "next_end", "reduce_touched", "slice_steps", "uniform_starts"]


def reduce_touched(leaves: Tensor, block_sum: Tensor, block_min: Tensor | None, pos: Tensor) -> None:
    """Recompute the sums (and minima) of the blocks of ``leaves`` ``(nb, blk)`` holding slots ``pos`` ``(K,)``
    from their leaves: per touched block, or in one O(N) pass when ``K`` reaches the number of blocks."""
    if pos.numel() >= leaves.shape[0]:
        total, low = reduce_blocks(leaves)
        block_sum.copy_(total)
        if block_min is not None:
            block_min.copy_(low)
        return
    rows = torch.div(pos, leaves.shape[1], rounding_mode="floor")
    total, low = reduce_blocks(leaves[rows])  # a block touched twice gets the same values twice
    block_sum[rows] = total
    if block_min is not None:
        block_min[rows] = low


def next_end(end_leaves: Tensor, end_bsum: Tensor, pos: Tensor) -> Tensor:
    """The first effective end at or after each slot ``pos`` ``(B,)`` int64, cyclically: ``(B,)`` int64.

    ``end_leaves`` ``(nb, blk)`` float32 holds 1.0 at ends, ``end_bsum`` ``(nb,)`` float64 its row sums. The
    count of ends before ``pos`` (block prefix + row prefix) is ``k``; the answer is the ``(k + 1)``-th end (the
    first one when none follows ``pos``): a two-level inverse-CDF search for ``k + 0.5``.
    """
    blk = end_leaves.shape[1]
    cdf = torch.cumsum(end_bsum, 0)  # [nb] float64
    row = torch.div(pos, blk, rounding_mode="floor")
    offset = pos - row * blk
    before = (cdf - end_bsum)[row] + (end_leaves[row] * (torch.arange(blk, device=pos.device) < offset[:, None])
                                      ).sum(1, dtype=torch.float64)
    target = torch.where(before >= cdf[-1] - 0.5, torch.zeros_like(before), before) + 0.5
    b = torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.numel() - 1)
    rest = target - (cdf - end_bsum)[b]
    row_cdf = torch.cumsum(end_leaves[b], 1, dtype=torch.float64)
    j = torch.searchsorted(row_cdf, rest.unsqueeze(1), right=True).squeeze(1).clamp_(max=blk - 1)
    return b * blk + j


def uniform_starts(first: Tensor, pick: Tensor, end_leaves: Tensor, end_bsum: Tensor, n: int, T: int) -> Tensor:
    """TorchRL's uniform start inside each drawn trajectory: ``first`` ``(S,)`` its first slot, ``pick`` ``(S,)``
    float64 U[0, 1); ``n_k = max(L_k - T + 1, 1)`` starts; returns ``(S,)`` int64 slots."""
    length = (next_end(end_leaves, end_bsum, first) - first) % n + 1  # [S] trajectory lengths
    n_starts = (length - T + 1).clamp_min(1)
    return (first + (pick * n_starts).floor().to(torch.int64).clamp_max(n_starts - 1)) % n


def slice_steps(start: Tensor, ends: Tensor, n: int, T: int, done: Tensor | None, terminated: Tensor | None,
                init: Tensor | None) -> tuple[Tensor, ...]:
    """The slots and markers of the slices starting at ``start`` ``(S,)`` (``ends``: ``(>= n,)`` float32
    effective end flags; ``done`` / ``terminated`` / ``init``: the stored ``(n, ...)`` flags or None).

    Returns:
        ``index (S*T,) int64`` (a short slice repeats its last slot), ``member (S*T,) bool`` (real steps),
        ``last (S*T, 1) bool`` (each slice's last real step), ``done | last``, ``terminated``, ``init | first``
        (``(S*T, 1)`` bool; None where the stored flag is None).
    """
    offsets = torch.arange(T, device=start.device)
    window = (start[:, None] + offsets) % n  # [S, T]
    e = (ends[window] > 0).to(torch.int32)
    member = (torch.cumsum(e, 1) - e) == 0  # no end before step j: inside the slice
    length = member.sum(1, keepdim=True)  # [S, 1]
    index = ((start[:, None] + torch.minimum(offsets, length - 1)) % n).reshape(-1)
    last = (offsets == length - 1).reshape(-1, 1)
    done_out = last if done is None else done[index].reshape(-1, 1).bool() | last
    term_out = torch.zeros_like(last) if terminated is None else terminated[index].reshape(-1, 1).bool()
    init_out = None
    if init is not None:
        got = init[index]
        first = (offsets == 0).expand(start.shape[0], T).reshape(-1)
        init_out = got | first.reshape(first.shape + (1,) * (got.dim() - 1))
    return index, member.reshape(-1), last, done_out, term_out, init_out


_COMPILED: dict[str, Any] = {}


def device_fn(name: str, fn, device: torch.device, compiled: bool):
    """``fn`` as is (CPU, the reference), or compiled once by ``torch.compile`` (CUDA with the compiled kernels:
    its elementwise steps fused into a few kernels)."""
    if not compiled or device.type != "cuda":
        return fn
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile(fn, dynamic=False)
    return _COMPILED[name]
