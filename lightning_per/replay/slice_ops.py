"""The slice samplers' device steps as pure functions of tensors: the two-level "next end" search, uniform starts,
and the expansion of starts into slices with their markers (:mod:`lightning_per.replay.slice` describes the state
they read)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_per.ops import reduce_blocks

__all__ = ["chain_order", "device_fn", "next_end", "reduce_touched", "row_major", "slice_steps", "uniform_starts"]


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


def chain_order(pos: Tensor, stride: int, rows: int) -> Tensor:
    """Row-major slots ``pos`` (``t * stride + e`` of a ``[rows, stride]`` storage) as positions in column order
    (``e * rows + t``), where each column's time steps are consecutive: the order the end search walks."""
    return pos if stride == 1 else (pos % stride) * rows + torch.div(pos, stride, rounding_mode="floor")


def row_major(pos: Tensor, stride: int, rows: int) -> Tensor:
    """The inverse of :func:`chain_order`."""
    return pos if stride == 1 else (pos % rows) * stride + torch.div(pos, rows, rounding_mode="floor")


def _first_end(end_leaves: Tensor, end_bsum: Tensor, pos: Tensor) -> Tensor:
    """The first end at or after column-order position ``pos`` in the whole array, cyclically (two-level search for
    ``k + 0.5``, ``k`` the count of ends before ``pos``)."""
    blk = end_leaves.shape[1]
    cdf = torch.cumsum(end_bsum, 0)  # [nb] float64
    below = cdf - end_bsum  # [nb] ends before each block (read twice: computed once)
    row = torch.div(pos, blk, rounding_mode="floor")
    offset = pos - row * blk
    before = below[row] + (end_leaves[row] * (torch.arange(blk, device=pos.device) < offset[:, None])
                           ).sum(1, dtype=torch.float64)
    target = torch.where(before >= cdf[-1] - 0.5, torch.zeros_like(before), before) + 0.5
    b = torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.numel() - 1)
    rest = target - below[b]
    row_cdf = torch.cumsum(end_leaves[b], 1, dtype=torch.float64)
    j = torch.searchsorted(row_cdf, rest.unsqueeze(1), right=True).squeeze(1).clamp_(max=blk - 1)
    return b * blk + j


def next_end(end_leaves: Tensor, end_bsum: Tensor, pos: Tensor, geometry: tuple[int, int]) -> Tensor:
    """The first effective end at or after each column-order position ``pos`` ``(B,)`` int64 in its own column of
    ``rows`` steps, cyclically within the column: ``(B,)`` int64 column-order positions (``geometry``:
    ``(stride, rows)`` of the storage, host ints).

    ``end_leaves`` ``(nb, blk)`` float32 holds 1.0 at ends (column order), ``end_bsum`` ``(nb,)`` float64 its row
    sums; every column holds an end (the write head's row is one). A search from ``pos`` that leaves the column
    (or wraps) is answered by a search from the column's first step instead. A flat storage (``stride == 1``) is
    one column, the whole array: its cyclic search is already the column's, so the second search is skipped (it
    would return the same end: the first of the array).
    """
    stride, rows = geometry
    found = _first_end(end_leaves, end_bsum, pos)
    if stride == 1:
        return found
    base = pos - pos % rows
    wrapped = _first_end(end_leaves, end_bsum, base)
    return torch.where((found >= pos) & (found < base + rows), found, wrapped)


def _rows_of(pos: Tensor, stride: int) -> Tensor:
    """The time step (row) of row-major slots ``pos``; the slots themselves on a flat storage (no division)."""
    return pos if stride == 1 else torch.div(pos, stride, rounding_mode="floor")


def _steps(count: Tensor, stride: int) -> Tensor:
    """``count`` time steps as a distance in row-major slots; ``count`` itself on a flat storage (no product)."""
    return count if stride == 1 else count * stride


def uniform_starts(first: Tensor, pick: Tensor, end_leaves: Tensor, end_bsum: Tensor, geometry: tuple[int, int],
                   T: int, need: int, left: int) -> tuple[Tensor, Tensor | None]:
    """TorchRL's uniform start inside each drawn trajectory: ``first`` ``(S,)`` its first slot (row-major),
    ``pick`` ``(S,)`` float64 U[0, 1); ``geometry`` ``(stride, rows)`` of the storage.

    A trajectory of ``L`` steps has ``n = max(L - need + 1, 1)`` starts (``need``: the fewest steps a slice must
    hold, ``T`` without a right span) plus ``left`` virtual ones before its first step (a left span); the
    relative start ``r`` is uniform over ``[-left, n)``. Returns ``(start, cut)``: ``(S,)`` int64 the start slot,
    and ``(S,)`` int64 the slice's most steps (``T + r`` for a virtual start, which begins at ``first``; ``T``
    otherwise), or None without a left span (every slice may hold ``T`` steps: nothing to cut, no work spent).
    """
    stride, rows = geometry
    n = stride * rows
    end = row_major(next_end(end_leaves, end_bsum, chain_order(first, stride, rows), geometry), stride, rows)
    length = (_rows_of(end, stride) - _rows_of(first, stride)) % rows + 1  # [S] trajectory lengths
    n_starts = (length - (need - 1)).clamp_min(1)
    if not left:  # no virtual starts: r = floor(pick * n), every slice holds its T steps
        r = (pick * n_starts).floor().to(torch.int64).clamp_max(n_starts - 1)
        return (first + _steps(r, stride)) % n, None
    choices = n_starts + left
    r = (pick * choices).floor().to(torch.int64).clamp_max(choices - 1) - left
    return (first + _steps(r.clamp_min(0), stride)) % n, T + r.clamp_max(0)


def slice_steps(start: Tensor, cut: Tensor | None, ends: Tensor, n: int, stride: int, T: int, done: Tensor | None,
                terminated: Tensor | None, init: Tensor | None) -> tuple[Tensor, ...]:
    """The slots and markers of the slices starting at ``start`` ``(S,)`` (``cut``: ``(S,)`` the most steps of each
    slice, None for ``T``; ``ends``: ``(n,)`` bool effective end flags, row-major; ``stride``: slots between two
    time steps; ``done`` / ``terminated`` / ``init``: the stored ``(n, ...)`` flags or None).

    Returns:
        ``index (S*T,) int64`` (a short slice repeats its last slot), ``member (S*T,) bool`` (real steps),
        ``last (S*T, 1) bool`` (each slice's last real step), ``done | last``, ``terminated``, ``init | first``
        (``(S*T, 1)`` bool; None where the stored flag is None).
    """
    offsets = torch.arange(T, device=start.device)
    window = (start[:, None] + _steps(offsets, stride)) % n  # [S, T]
    e = ends[window].to(torch.int32)
    member = torch.cumsum(e, 1) == e  # no end before step j: inside the slice
    if cut is not None:
        member = member & (offsets < cut[:, None])
    tail = member.sum(1, keepdim=True) - 1  # [S, 1] each slice's last real step
    index = window.gather(1, torch.minimum(offsets, tail)).reshape(-1)  # a short slice repeats its last slot
    last = (offsets == tail).reshape(-1, 1)
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
