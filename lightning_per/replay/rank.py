"""GPURankBasedSampler: rank-based prioritized replay, P(i) ∝ rank(i)^-alpha, on the device.

Schaul et al. 2016 (arXiv:1511.05952), section 3.3, "rank-based prioritization": items are ranked by
raw priority (rank 1 = largest), ``P(i) = rank(i)^-alpha / sum_{k=1..n} k^-alpha``. Draws are an
inverse-CDF search over the fixed prefix sums of ``k^-alpha`` (stratified by default), then a lookup
of which slot holds each rank. IS weights (section 3.4, normalised by ``min_j P(j)`` = rank n):
``w_i = (rank(i) / n)^(alpha * beta)``.

The ranking is a stable device sort of the raw priorities (ties: lower slot first), refreshed before a
draw when priorities changed and ``sort_every`` updates have accumulated (default 1: every update is
reflected at the next draw).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchrl.data.replay_buffers.samplers import PrioritizedSampler

from lightning_per.ext.state import RankTable
from lightning_per.graphs.protocol import CapturableSampler, SamplerCapture
from lightning_per.ops import rank_weights
from lightning_per.replay import priority, sampler_checkpoint
from lightning_per.replay.adapter import (
    capture_view,
    checked_update,
    draw,
    draw_gather,
    dump,
    mark_written,
    max_priority,
    new_core,
)
from lightning_per.replay.errors import check_bool, check_kind, check_reduction
from lightning_per.replay.priority import PriorityState
from lightning_per.replay.rules import generator_uniforms

__all__ = ["GPURankBasedSampler", "RankIndex", "rank_sample", "sort_ranks"]


class RankIndex:
    """The rank-based draw rule (module docstring): the ranking of a core's slots by raw priority, as a value.

    Its tensors are allocated by :meth:`empty`, or at the first draw for the core's capacity, alpha and device.

    Args:
        sort_every: refresh the ranking after this many priority writes (1 = always exact).
        stratified, shuffle_strata, weight_normalization: as :class:`~lightning_per.replay.rules.Proportional`.

    Attributes:
        cdf: ``(N,) float64`` prefix sums of ``k^-alpha`` for ``alpha`` (refreshed in place when alpha changes).
        order: ``(N,) int64`` the slot holding rank ``k + 1`` (written in place by :func:`sort_ranks`).
        sorted_keys: ``(N,) float32`` the sort's keys, in rank order (scratch kept for in-place sorts).
        writes: the state's ``writes`` counter at the last sort (host int).
        stale: new slots were written since the last sort (always re-sort).
        sorted_n: the filled length at the last sort (host int).
        device_rng, fuses_gather, reads_filled: False, False, True (its uniforms come from the generator; it
            never fuses the row gather; its draw bakes in the filled length).

    Raises:
        ValueError: ``sort_every`` < 1, or ``weight_normalization`` neither ``"buffer"`` nor ``"batch"``.
    """

    cdf: Tensor | None
    order: Tensor | None
    sorted_keys: Tensor | None

    def __init__(self, *, sort_every: int = 1, stratified: bool = True, shuffle_strata: bool = True,
                 weight_normalization: str = "buffer") -> None:
        if isinstance(sort_every, bool) or not isinstance(sort_every, int) or sort_every < 1:
            raise ValueError(f"sort_every must be an int >= 1, got {sort_every!r}")
        if weight_normalization not in ("buffer", "batch"):
            raise ValueError(f"weight_normalization must be 'buffer' or 'batch', got {weight_normalization!r}")
        self.name, self.device_rng, self.fuses_gather, self.reads_filled = "rank", False, False, True
        self.sort_every, self.stratified, self.shuffle_strata = sort_every, stratified, shuffle_strata
        self.weight_normalization = weight_normalization
        self.cdf = self.order = self.sorted_keys = None
        self.alpha = float("nan")
        self.writes, self.stale, self.sorted_n = 0, False, 0

    @classmethod
    def empty(cls, capacity: int, alpha: float, device: torch.device, **kwargs) -> RankIndex:
        """The identity ranking of ``capacity`` slots (nothing sorted yet); ``kwargs`` as the constructor's."""
        index = cls(**kwargs)
        index.allocate(capacity, alpha, device)
        return index

    def allocate(self, capacity: int, alpha: float, device: torch.device) -> None:
        """The tensors of a ranking of ``capacity`` slots on ``device`` for ``alpha``: identity order."""
        self.cdf = rank_weights(capacity, alpha, device)[1]
        self.order = torch.arange(capacity, device=device)
        self.sorted_keys = torch.empty(capacity, dtype=torch.float32, device=device)
        self.alpha = float(alpha)

    def __repr__(self) -> str:
        return (f"RankIndex(sort_every={self.sort_every}, "
                f"stratified={self.stratified}, device_rng={self.device_rng}, fuses_gather={self.fuses_gather})")

    def tensors(self) -> tuple[Tensor, ...]:
        """The index's device tensors: ``order, sorted_keys, cdf`` (none before they are allocated)."""
        return () if self.order is None else (self.order, self.sorted_keys, self.cdf)

    def follow_alpha(self, alpha: float) -> None:
        """Recompute :attr:`cdf` in place for a new ``alpha`` (host work when it changed, nothing otherwise)."""
        if alpha != self.alpha:
            self.cdf.copy_(rank_weights(self.cdf.shape[0], alpha, self.cdf.device)[1])
            self.alpha = float(alpha)

    def plan(self, core, batch_size: int, n: int) -> tuple:
        """``(sort, stratified, shuffle_strata, weight_normalization)``: re-sort first when the ranking is stale,
        the filled length changed or ``sort_every`` writes accumulated."""
        if self.order is None:
            self.allocate(core.capacity, core.alpha, core.device)
        self.follow_alpha(core.alpha)
        sort = self.stale or n != self.sorted_n or core.state.writes - self.writes >= self.sort_every
        return sort, self.stratified, self.shuffle_strata, self.weight_normalization

    def draw(self, core, batch_size: int, n: int, plan: tuple, rows: Tensor | None) -> tuple[Tensor, Tensor]:
        """``(index (B,) int64, weight (B,) float32)``: the ranking refreshed first if planned, then the draw."""
        if plan[0]:
            sort_ranks(core.state, self)
        u, stratified = generator_uniforms(core, batch_size, self.stratified, self.shuffle_strata)
        return rank_sample(core.ops, core.state, self, u, n, stratified, self.weight_normalization)

    def drew(self, core, n: int, plan: tuple) -> None:
        if plan[0]:  # after the sort ran: a failed call leaves the ranking marked stale
            self.writes, self.stale, self.sorted_n = core.state.writes, False, n


def sort_ranks(state: PriorityState, index: RankIndex) -> None:
    """Rank the written slots of ``state`` by raw priority (descending, stable: ties keep the lower slot first) into
    ``index.order``, in place (cached graphs keep reading the same tensor); unwritten slots rank last."""
    cap = state.capacity
    keys = torch.where(state.leaves.view(-1)[:cap] > 0, state.raw[:cap], -1.0)  # [N]
    torch.sort(keys, descending=True, stable=True, out=(index.sorted_keys, index.order))


def rank_sample(ops, state: PriorityState, index: RankIndex, u: Tensor, n: int, stratified: bool,
                weight_normalization: str) -> tuple[Tensor, Tensor]:
    """A rank draw over the ``n`` ranked items from uniforms ``u`` ``(B,) float64``: ``(index (B,) int64, weight
    (B,) float32)`` (``ops.rank_sample``, see :func:`lightning_per.ops.reference.rank_sample`)."""
    return ops.rank_sample(RankTable(index.cdf, index.order, state.alpha, state.beta), u, n, stratified,
                           weight_normalization)


class GPURankBasedSampler(PrioritizedSampler):
    """Rank-based prioritized sampler (see module docstring): the contract of
    :class:`~lightning_per.replay.GPUPrioritizedSampler` (its arguments, properties and methods) with the draw rule
    :class:`RankIndex`, plus:

    Args:
        sort_every: refresh the ranking after this many priority updates (1 = always exact; larger
            values trade freshness for speed). Extends always mark the ranking stale.

    Memory: on top of the proportional sampler, ``(N,)`` int64 slot-by-rank, ``(N,)`` float32 sorted
    keys and ``(N,)`` float64 prefix sums of ``k^-alpha`` (20 bytes per slot), plus an ``(N,)`` float32
    temporary and the sort's scratch during each re-sort.

    Raises:
        ValueError: ``sort_every`` < 1 (and :class:`~lightning_per.replay.GPUPrioritizedSampler`'s checks).

    Example::

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import TensorDictReplayBuffer
        >>> from lightning_per import GPURankBasedSampler
        >>> from lightning_per.replay import GPURoundRobinWriter, GPUTensorStorage
        >>> sampler = GPURankBasedSampler(4, alpha=1.0, beta=1.0, device="cpu", seed=0)
        >>> rb = TensorDictReplayBuffer(storage=GPUTensorStorage(4, device="cpu"), sampler=sampler,
        ...                             writer=GPURoundRobinWriter(), batch_size=8)
        >>> _ = rb.extend(TensorDict({"reward": torch.arange(4.0)}, [4]))
        >>> sampler.update_priority(torch.arange(4), torch.tensor([1.0, 2.0, 3.0, 4.0]))
        >>> index, info = sampler.sample(rb.storage, 8)
        >>> P = 1 / torch.tensor([4.0, 3.0, 2.0, 1.0])  # rank(i)^-alpha: slot 3 has rank 1
        >>> P = P / P.sum()
        >>> torch.allclose(info["priority_weight"], (P[index] / P.min()) ** -1.0)
        True
    """

    def __init__(self, max_capacity: int, alpha: float, beta: float, eps: float = 1e-8, *,
                 device: torch.device | str | None = None, sort_every: int = 1, stratified: bool = True,
                 shuffle_strata: bool = True, weight_normalization: str = "buffer", backend: str = "auto",
                 seed: int | None = None, dtype: torch.dtype = torch.float32, reduction: str = "max",
                 eager_graphs: bool = True, max_priority_within_buffer: bool = False,
                 serial: bool | None = None) -> None:
        check_bool("stratified", stratified)
        check_bool("shuffle_strata", shuffle_strata)
        rule = RankIndex(sort_every=sort_every, stratified=stratified, shuffle_strata=shuffle_strata,
                         weight_normalization=weight_normalization)
        self.reduction, self.dtype = check_reduction(reduction), dtype
        #: priorities, the ranking (``core.rule``), draws, IS weights and the random streams
        self.core = new_core(type(self).__name__, max_capacity, alpha, beta, eps, rule, device=device, backend=backend,
                             seed=seed, dtype=dtype, eager_graphs=eager_graphs,
                             max_priority_within_buffer=max_priority_within_buffer, serial=serial)
        rule.allocate(max_capacity, self.core.alpha, self.core.device)  # its tensors exist from the start

    def __getstate__(self) -> dict[str, Any]:
        """Pickle / ``copy.deepcopy`` state: the attributes, the core pickling itself (TorchRL's refuses to)."""
        return self.__dict__.copy()

    def __repr__(self) -> str:
        c = self.core
        return (f"{type(self).__name__}(max_capacity={c.capacity}, alpha={c.alpha}, beta={c.beta}, "
                f"eps={c.state.eps}, sort_every={c.rule.sort_every}, device={c.device}, block={c.block}, "
                f"serial={c.serial})")

    @property
    def _rng(self) -> torch.Generator | None:
        return self.core.rng.buffer

    @_rng.setter
    def _rng(self, generator: torch.Generator | None) -> None:
        self.core.attach(generator)

    @property
    def generator(self) -> torch.Generator:
        """The sampler's own generator on :attr:`device` (what a CUDA graph of its draws registers)."""
        return self.core.rng.generator

    @property
    def device(self) -> torch.device:
        return self.core.device

    @property
    def max_size(self) -> int:
        return self.core.capacity

    @property
    def alpha(self) -> float:
        """Priority exponent; setting it re-transforms every stored value exactly, O(N) on the device."""
        return self.core.alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        self.core.set_alpha(value)

    @property
    def beta(self) -> float:
        """IS-weight exponent, also held in a device scalar that captured CUDA graphs read."""
        return self.core.beta

    @beta.setter
    def beta(self, value: float) -> None:
        self.core.set_beta(value)

    @property
    def default_priority(self) -> Tensor:
        """Raw priority given to new items: the running max (1.0 before any update), 0-d float32."""
        return priority.default_priority(self.core.state.max_raw)

    @property
    def _max_priority(self) -> tuple[Tensor | None, None]:
        return max_priority(self.core)

    # TorchRL's names of the exponents (its sampler keeps them as _alpha and _beta), read by code written for it
    _alpha = property(lambda self: self.core.alpha, doc="TorchRL's name of :attr:`alpha` (read-only).")
    _beta = property(lambda self: self.core.beta, doc="TorchRL's name of :attr:`beta` (read-only).")

    @property
    def clamped_priority_count(self) -> Tensor:
        """0-d int64 device tensor: priorities received that were clamped (``state.n_clamped``)."""
        return self.core.state.n_clamped

    @property
    def dropped_index_count(self) -> Tensor:
        """0-d int64 device tensor: device-side indices that were ignored (``state.n_dropped``)."""
        return self.core.state.n_dropped

    def get_rng_state(self) -> dict[str, Tensor | None]:
        """The state of every random stream the draws use (:meth:`PriorityCore.get_rng_state`)."""
        return self.core.get_rng_state()

    def set_rng_state(self, state: dict[str, Tensor | None]) -> None:
        """Restore a :meth:`get_rng_state` result (raises as :meth:`PriorityCore.set_rng_state`)."""
        self.core.set_rng_state(state)

    def manual_seed(self, seed: int) -> None:
        """Seed the generator and the compiled draws' counters (raises TypeError / ValueError for a bad seed)."""
        self.core.manual_seed(seed)

    def capture_view(self, storage, batch_size: int | None) -> SamplerCapture:
        """What a CUDA-graph capture of the draws needs (:class:`lightning_per.graphs.protocol.CapturableSampler`),
        with the reason it is refused for any storage: the ranking is refreshed on a host counter."""
        return capture_view(self.core, batch_size, problem=(
            f"{type(self).__name__} refreshes its ranking on a host counter (sort_every), which a CUDA graph "
            f"freezes; capture with GPUPrioritizedSampler (proportional), or capture the learner alone (pass "
            f"the batch as the step's input)"))

    def probabilities(self, n: int | None = None) -> Tensor:
        """Exact P(i) of every slot for a buffer holding ``n`` items, ``(N,)`` float64 (for tests)."""
        c, ranks = self.core, self.core.rule
        if n is None:  # the written slots
            n = int(c.state.written()[: c.capacity].sum())  # sync-ok: diagnostics only
        ranks.plan(c, 1, n)  # allocated, alpha followed
        sort_ranks(c.state, ranks)
        ranks.writes, ranks.stale, ranks.sorted_n = c.state.writes, False, n
        p = torch.zeros(c.capacity, dtype=torch.float64, device=c.device)
        w = torch.arange(1, n + 1, dtype=torch.float64, device=c.device).pow(-c.alpha)
        p[ranks.order[:n]] = w / w.sum()
        return p

    # ------------------------------------------------------------------ TorchRL's calls
    def update_priority(self, index, priority, *, storage=None, live=None) -> None:
        """As :meth:`GPUPrioritizedSampler.update_priority` (raises the same)."""
        with torch.no_grad():  # the stored priorities never join an autograd graph
            self.core.write(*checked_update(self.core, index, priority, storage, type(self).__name__, live))

    def mark_update(self, index, *, storage=None) -> None:
        """New slots get the default priority (:func:`mark_written`); the ranking is re-sorted at the next draw."""
        mark_written(self.core, index, storage, type(self).__name__)
        self.core.rule.stale = True

    def add(self, index) -> None:  # new items get their priority through mark_update
        return None

    def extend(self, index) -> None:
        return None

    def sample(self, storage, batch_size: int) -> tuple[Tensor, dict[str, Tensor]]:
        """``(index, {"priority_weight": w})`` by rank (:func:`draw`; raises the same)."""
        return draw(self.core, storage, batch_size)

    def sample_gather(self, storage, batch_size: int, *, with_info: bool = False, contiguous: bool = True):
        """:meth:`sample` and the batch (:func:`draw_gather`; ``contiguous`` as
        :meth:`GPUPrioritizedSampler.sample_gather`)."""
        return draw_gather(self.core, storage, batch_size, with_info, contiguous)

    # ------------------------------------------------------------------ persistence
    def _empty(self) -> None:
        self.core.reset()
        self.core.rule.stale = True

    def state_dict(self) -> dict[str, Any]:
        return {**self.core.state_dict(type(self).__name__), "sort_every": self.core.rule.sort_every}

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As :meth:`GPUPrioritizedSampler.check_state_dict` (raises the same)."""
        check_kind(state_dict, self)
        self.core.check_state_dict(state_dict)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        check_kind(state_dict, self)
        self.core.load_state_dict(state_dict)
        self.core.rule.stale = True

    def dumps(self, path) -> None:
        dump(self.state_dict(), path)

    def loads(self, path) -> None:
        self.load_state_dict(sampler_checkpoint.load(path, self.core.device))


CapturableSampler.register(GPURankBasedSampler)  # isinstance answers; the MRO is unchanged
