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

    Example::

        >>> import torch
        >>> from lightning_per.metrics import MetricAccumulator
        >>> m = MetricAccumulator({"loss": "mean", "td_max": "max", "env_steps": "last"},
        ...                       persistent=("env_steps",))
        >>> m.add("loss", torch.tensor(3.0), count=2)  # for a mean, ``value`` sums ``count`` observations
        >>> m.add("loss", 1.0)
        >>> m.add("td_max", torch.tensor(0.5))
        >>> m.add("env_steps", 64)
        >>> {k: round(float(v), 4) for k, v in m.compute().items()}  # (3 + 1) / 3
        {'loss': 1.3333, 'td_max': 0.5, 'env_steps': 64.0}
        >>> m.reset()
        >>> {k: float(v) for k, v in m.compute().items()}  # no observation since: NaN; persistent kept
        {'loss': nan, 'td_max': nan, 'env_steps': 64.0}
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
        self._vector_slots: dict[tuple[str, ...], slice] = {}  # add_vector's names -> slice of slots
        n = len(names)
        # (M,) bool masks, kept on the accumulator's device so compute() does no host->device copy.
        self._is_mean = torch.tensor([k == "mean" for k in names.values()], device=device)
        self._needs_obs = torch.tensor([k != "sum" for k in names.values()], device=device)
        self._resettable = torch.tensor([k not in self.persistent for k in names], device=device)
        self._all = torch.ones(len(names), dtype=torch.bool, device=device)
        inits = [{"max": float("-inf"), "min": float("inf")}.get(k, 0.0) for k in names.values()]
        self._init = torch.tensor(inits, dtype=torch.float64, device=device)  # (M,) value after reset
        # values: (M,) float64 running value; counts: (M,) float64 number of adds since reset.
        self.values = torch.zeros(n, dtype=torch.float64, device=device)
        self.counts = torch.zeros(n, dtype=torch.float64, device=device)
        self.reset(clear_persistent=True)

    def __setstate__(self, state: dict) -> None:
        # Unpickled copies own their tensors: torch.multiprocessing (ddp_spawn, DataLoader workers) would
        # otherwise hand every process the same shared-memory storage, and ranks would add into one sum.
        self.__dict__.update({k: v.clone() if isinstance(v, Tensor) else v for k, v in state.items()})

    @property
    def device(self) -> torch.device:
        return self.values.device

    def to(self, device: torch.device | str) -> MetricAccumulator:
        """Move the running values to ``device`` (in place); returns self."""
        self.values = self.values.to(device)
        self.counts = self.counts.to(device)
        self._is_mean = self._is_mean.to(device)
        self._needs_obs = self._needs_obs.to(device)
        self._resettable = self._resettable.to(device)
        self._all = self._all.to(device)
        self._init = self._init.to(device)
        return self

    def add(self, name: str, value: Tensor | float, count: Tensor | float = 1.0) -> None:
        """Fold ``value`` into metric ``name`` in place (no host sync).

        Args:
            name: a declared metric.
            value: 0-d tensor (any float dtype, on :attr:`device`) or Python number. For ``"mean"``
                and ``"sum"`` metrics it is a *sum* of ``count`` observations.
            count: how many observations ``value`` sums (``"mean"`` only); 0-d tensor or number.
        """
        i = self._slot.get(name)
        if i is None:
            raise KeyError(f"metric {name!r} is not declared; declared metrics: {sorted(self._slot)}")
        kind = self.kinds[name]
        # Python numbers stay kernel arguments; tensors are cast on the device (no host round trip).
        # Only in-place ops on views: ``values[i] = <python float>`` would copy from the host and sync.
        v = value.to(torch.float64) if isinstance(value, Tensor) else float(value)
        val, cnt = self.values[i], self.counts[i]  # 0-d views
        if kind in ("mean", "sum"):
            val.add_(v)
            cnt.add_(count.to(torch.float64) if isinstance(count, Tensor) else float(count))
            return
        if kind == "max":
            val.clamp_(min=v)
        elif kind == "min":
            val.clamp_(max=v)
        elif isinstance(v, Tensor):  # last
            val.copy_(v)
        else:
            val.fill_(v)
        cnt.add_(1.0)

    def add_vector(self, names: tuple[str, ...], values: Tensor) -> None:
        """Fold one value into each of several ``"mean"``/``"sum"`` metrics at once (no host sync).

        Equivalent to ``add(name, values[j])`` for each ``names[j]``, in 2 in-place kernels instead of
        ~3 per metric (what matters when every launch costs host time, as in a per-step training loop).

        Args:
            names: K ``"mean"`` or ``"sum"`` metrics declared next to each other, in this order.
            values: (K,) float tensor on :attr:`device`, one value (a single observation) per name.

        Raises:
            KeyError: an undeclared name. ValueError: a metric that is not ``"mean"``/``"sum"``, names
            that are not consecutive declared metrics, or ``values`` not of shape (K,).
        """
        where = self._vector_slots.get(names)
        if where is None:
            for name in names:
                if name not in self._slot:
                    raise KeyError(f"metric {name!r} is not declared; declared metrics: {sorted(self._slot)}")
                if self.kinds[name] not in ("mean", "sum"):
                    raise ValueError(f"add_vector needs 'mean' or 'sum' metrics; {name!r} is {self.kinds[name]!r}")
            first = self._slot[names[0]]
            if [self._slot[n] for n in names] != list(range(first, first + len(names))):
                raise ValueError(f"add_vector needs metrics declared consecutively in this order, got {names}; "
                                 f"declared: {list(self._slot)}")
            where = self._vector_slots[names] = slice(first, first + len(names))
        if tuple(values.shape) != (len(names),):
            raise ValueError(f"values must have shape ({len(names)},) like names, got {tuple(values.shape)}")
        self.values[where].add_(values)  # in place on views: float32 values accumulate in float64
        self.counts[where].add_(1.0)

    def _compute(self) -> Tensor:
        out = torch.where(self._is_mean, self.values / self.counts.clamp_min(1), self.values)  # [M]
        return torch.where(self._needs_obs & (self.counts == 0), torch.full_like(out, float("nan")), out)

    def compute(self) -> dict[str, Tensor]:
        """Current values, 0-d float64 tensors on :attr:`device` (copies; safe to keep across resets)."""
        out = self._compute()
        return {name: out[i] for name, i in self._slot.items()}

    def compute_stacked(self) -> tuple[list[str], Tensor]:
        """(names, values): :meth:`compute` as one fresh ``(M,) float64`` tensor on :attr:`device`.

        Names are in declaration order. Launches a few kernels; no host sync."""
        return list(self._slot), self._compute()

    def reset(self, clear_persistent: bool = False) -> None:
        """Start a new accumulation window (in place). ``persistent`` metrics keep their value."""
        # Whole-vector device ops: no per-metric host->device writes (those would sync on CUDA).
        mask = self._all if clear_persistent else self._resettable  # [M] bool
        self.values.copy_(torch.where(mask, self._init, self.values))
        self.counts.masked_fill_(mask, 0.0)

    def state_dict(self) -> dict[str, Tensor]:
        return {"values": self.values.clone(), "counts": self.counts.clone()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """Restore :meth:`state_dict` output (any device).

        Raises:
            ValueError: the saved tensors do not hold one value per declared metric.
        """
        for key in ("values", "counts"):
            if tuple(state[key].shape) != tuple(self.values.shape):
                raise ValueError(f"state[{key!r}] has shape {tuple(state[key].shape)}, expected "
                                 f"{tuple(self.values.shape)} (one entry per metric: {list(self._slot)})")
        self.values.copy_(state["values"])
        self.counts.copy_(state["counts"])
