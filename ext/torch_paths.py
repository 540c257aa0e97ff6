"""Plain-torch paths the launchers take where a kernel's size limit ends (batches above ``MAX_QUADRATIC``).

They compute what ``lightning_per.ops.reference`` computes under the same names (the self-check on the ops
side compares both), written here so that this package imports nothing outside itself.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["sorted_last_write_wins", "scatter_last_writer"]


def sorted_last_write_wins(index: Tensor, values: Tensor) -> Tensor:
    """``(B,)`` ``values[max{j : index[j] == index[k]}]`` by one stable O(B log B) sort.

    Args:
        index: ``(B,)`` int64 slots.
        values: ``(B,)`` values to write, same device.

    Returns:
        ``(B,)`` values, dtype and device of ``values``.

    Example::

        >>> sorted_last_write_wins(torch.tensor([3, 1, 3]), torch.tensor([10, 20, 30])).tolist()
        [30, 20, 30]
    """
    n = index.numel()
    if n <= 1:
        return values
    sorted_idx, order = torch.sort(index, stable=True)  # [B], equal indices keep batch order
    is_last = torch.ones_like(sorted_idx, dtype=torch.bool)
    is_last[:-1] = sorted_idx[1:] != sorted_idx[:-1]
    pos = torch.arange(n, device=index.device)
    big = torch.full_like(pos, n)
    end = torch.where(is_last, pos, big).flip(0).cummin(0).values.flip(0)  # [B] last member of each group
    out = torch.empty_like(values)
    out[order] = values[order][end]
    return out


def scatter_last_writer(index: Tensor, scratch: Tensor, positions: Tensor) -> Tensor:
    """``(B,)`` int64 ``positions[max{j : index[j] == index[k]}]`` by one O(B) scatter-amax into ``scratch``.

    Args:
        index: ``(B,)`` int64 slots.
        scratch: ``(N,)`` int32 (N > max index), same device; entries outside ``index`` are never read.
        positions: ``(B,)`` int32, ``arange(B)``.

    Returns:
        ``(B,)`` int64 batch positions.

    Example::

        >>> scatter_last_writer(torch.tensor([3, 1, 3]), torch.zeros(4, dtype=torch.int32),
        ...                     torch.arange(3, dtype=torch.int32)).tolist()
        [2, 1, 2]
    """
    scratch.scatter_reduce_(0, index, positions, reduce="amax", include_self=False)
    return scratch[index].long()
