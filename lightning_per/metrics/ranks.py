"""Combining per-rank metric vectors on the device: :func:`reduce_across_ranks` (DDP, no host sync)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["DEFAULT_RANK_OP", "RANK_OPS", "reduce_across_ranks"]

#: How columns can be combined across ranks.
RANK_OPS = ("mean", "sum", "max", "min")
#: How a metric of each :class:`~lightning_per.metrics.MetricAccumulator` reduction is combined by default.
DEFAULT_RANK_OP = {"mean": "mean", "sum": "sum", "max": "max", "min": "min", "last": "mean"}


def reduce_across_ranks(gathered: Tensor, ops: Sequence[str]) -> Tensor:
    """Combine per-rank metric vectors on their device, ignoring NaN (ranks without observations).

    Args:
        gathered: ``(W, M)`` float tensor, row ``r`` = metrics of rank ``r`` (``strategy.all_gather``).
        ops: ``M`` names from ``mean, sum, max, min``: how each column is combined. ``mean`` is the
            unweighted mean over the ranks that have a value.

    Returns:
        ``(M,)`` tensor (same dtype and device); NaN where every rank is NaN (``sum``: 0).

    Raises:
        ValueError: ``gathered`` is not 2-D, or ``ops`` has the wrong length or an unknown name.

    Example:
        >>> import torch
        >>> from lightning_per.metrics import reduce_across_ranks
        >>> g = torch.tensor([[1.0, 1.0, 1.0, float("nan")], [3.0, 2.0, 5.0, float("nan")]])
        >>> reduce_across_ranks(g, ["mean", "sum", "max", "min"]).tolist()
        [2.0, 3.0, 5.0, nan]
    """
    if gathered.dim() != 2 or gathered.shape[1] != len(ops):
        raise ValueError(f"gathered must be (W, M={len(ops)}), got shape {tuple(gathered.shape)}")
    bad = sorted(set(ops) - set(RANK_OPS))
    if bad:
        raise ValueError(f"ops must be from {RANK_OPS}, got {bad}")
    nan = torch.isnan(gathered)  # [W, M]
    n = (~nan).sum(0)  # [M]
    total = torch.where(nan, 0.0, gathered).sum(0)  # [M]
    mean = torch.where(n > 0, total / n.clamp_min(1), float("nan"))
    hi = torch.where(nan, float("-inf"), gathered).amax(0)
    lo = torch.where(nan, float("inf"), gathered).amin(0)
    hi = torch.where(n > 0, hi, float("nan"))
    lo = torch.where(n > 0, lo, float("nan"))
    code = torch.tensor([RANK_OPS.index(o) for o in ops], device=gathered.device)
    return torch.where(code == 0, mean, torch.where(code == 1, total, torch.where(code == 2, hi, lo)))
