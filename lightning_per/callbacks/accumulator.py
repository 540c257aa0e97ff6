"""Device-side metric accumulation: the tiny protocol the callbacks read.

A training module keeps running sums (and maxima) of its metrics in tensors on its own device and
updates them in place every step, so that logging never forces a host synchronisation. Once an
epoch, :class:`~lightning_per.callbacks.AsyncMetricsCallback` asks for :meth:`MetricAccumulator.compute`,
copies the result to the host asynchronously and calls :meth:`MetricAccumulator.reset`.

Protocol (what the callbacks rely on, nothing else): a LightningModule that has an attribute
``metrics`` providing ``compute() -> dict[str, Tensor]`` (0-d float tensors, any device) and
``reset() -> None``. :class:`MetricAccumulator` is the implementation shipped here.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["MetricAccumulator"]

_KINDS = ("mean", "sum", "max", "min", "last")


class MetricAccumulator:
    """Running metrics kept in one preallocated tensor on ``device``; updates are in place, no syncs.

    Each metric is declared once with a reduction:

    - ``"mean"``: sum of values / number of values added since the last reset (NaN if none),
    - ``"sum"``: sum of values since the last reset,
    - ``"max"`` / ``"min"``: extreme value since the last reset (NaN if none),
    - ``"last"``: the most recent value (NaN if none); with ``persistent=True`` it survives resets.

    Args:
        names: mapping ``metric name -> reduction`` (one of ``mean, sum, max, min, last``).
        device: where the running values live (the module's device).
        persistent: names whose value is *not* cleared by :meth:`reset` (counters such as env steps).

    Raises:
        ValueError: an unknown reduction, or ``persistent`` naming an undeclared metric.
    """

    def __init__(self, names: dict[str, str], device: torch.device | str = "cpu",
                 persistent: tuple[str, ...] = ()) -> None:
        for name, kind in names.items():
            if kind not in _KINDS:
                raise ValueError(f"metric {name!r}: reduction must be one of {_KINDS}, got {kind!r}")
        unknown = set(persistent) - set(names)
        if unknown:
            raise ValueError(f"persistent names {sorted(unknown)} are not declared metrics")
        self.kinds = dict(names)
        self.persistent = tuple(persistent)
        self._slot = {name: i for i, name in enumerate(names)}
        n = len(names)
        self._is_mean = torch.tensor([k == "mean" for k in names.values()])
        self._needs_obs = torch.tensor([k != "sum" for k in names.values()])
        # values: (M,) float64 running value; counts: (M,) float64 number of adds since reset.
        self.values = torch.zeros(n, dtype=torch.float64, device=device)
        self.counts = torch.zeros(n, dtype=torch.float64, device=device)
        self.reset(clear_persistent=True)

    @property
    def device(self) -> torch.device:
        return self.values.device

    def to(self, device: torch.device | str) -> MetricAccumulator:
        """Move the running values to ``device`` (in place); returns self."""
        self.values = self.values.to(device)
        self.counts = self.counts.to(device)
        return self

    def add(self, name: str, value: Tensor | float, count: Tensor | float = 1.0) -> None:
        """Fold ``value`` into metric ``name`` in place (no host sync).

        Args:
            name: a declared metric.
            value: 0-d tensor (any float dtype, on :attr:`device`) or Python number. For ``"mean"``
                and ``"sum"`` metrics it is a *sum* of ``count`` observations.
            count: how many observations ``value`` sums (``"mean"`` only); 0-d tensor or number.
        """
        i = self._slot[name]
        kind = self.kinds[name]
        # Python numbers stay kernel arguments; tensors are cast on the device (no host round trip).
        v = value.to(torch.float64) if isinstance(value, Tensor) else float(value)
        if kind in ("mean", "sum"):
            self.values[i] += v
            self.counts[i] += count.to(torch.float64) if isinstance(count, Tensor) else float(count)
        elif kind == "max":
            self.values[i] = torch.clamp(self.values[i], min=v)
            self.counts[i] += 1
        elif kind == "min":
            self.values[i] = torch.clamp(self.values[i], max=v)
            self.counts[i] += 1
        else:  # last
            self.values[i] = v
            self.counts[i] += 1

    def compute(self) -> dict[str, Tensor]:
        """Current values, 0-d float64 tensors on :attr:`device` (copies; safe to keep across resets)."""
        is_mean = self._is_mean.to(self.device, non_blocking=True)
        needs_obs = self._needs_obs.to(self.device, non_blocking=True)
        out = torch.where(is_mean, self.values / self.counts.clamp_min(1), self.values)
        out = torch.where(needs_obs & (self.counts == 0), torch.full_like(out, float("nan")), out)
        return {name: out[i] for name, i in self._slot.items()}

    def compute_stacked(self) -> tuple[list[str], Tensor]:
        """(names, values): the values of :meth:`compute` as one ``(M,) float64`` tensor on :attr:`device`."""
        d = self.compute()
        names = list(d)
        return names, torch.stack([d[n] for n in names])

    def reset(self, clear_persistent: bool = False) -> None:
        """Start a new accumulation window (in place). ``persistent`` metrics keep their value."""
        for name, i in self._slot.items():
            if name in self.persistent and not clear_persistent:
                continue
            kind = self.kinds[name]
            init = {"max": float("-inf"), "min": float("inf")}.get(kind, 0.0)
            self.values[i] = init
            self.counts[i] = 0

    def state_dict(self) -> dict[str, Tensor]:
        return {"values": self.values.clone(), "counts": self.counts.clone()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.values.copy_(state["values"])
        self.counts.copy_(state["counts"])
