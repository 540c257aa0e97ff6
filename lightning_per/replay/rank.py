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

import torch
from torch import Tensor

from lightning_per.ops import rank_weights
from lightning_per.replay.prioritized import GPUPrioritizedSampler
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
    return ops.rank_sample(u, index.cdf, index.order, n, state.alpha, state.beta, stratified, weight_normalization)


class GPURankBasedSampler(GPUPrioritizedSampler):
    """Rank-based prioritized sampler (see module docstring); same contract as
    :class:`~lightning_per.replay.GPUPrioritizedSampler`, plus:

    Args:
        sort_every: refresh the ranking after this many priority updates (1 = always exact; larger
            values trade freshness for speed). Extends always mark the ranking stale.

    Memory: on top of the proportional sampler, ``(N,)`` int64 slot-by-rank, ``(N,)`` float32 sorted
    keys and ``(N,)`` float64 prefix sums of ``k^-alpha`` (20 bytes per slot), plus an ``(N,)`` float32
    temporary and the sort's scratch during each re-sort.

    Raises:
        ValueError: ``sort_every`` < 1 (and the base class's checks).

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
                 sort_every: int = 1, stratified: bool = True, shuffle_strata: bool = True,
                 weight_normalization: str = "buffer", **kwargs) -> None:
        rule = RankIndex(sort_every=sort_every, stratified=stratified, shuffle_strata=shuffle_strata,
                         weight_normalization=weight_normalization)
        super().__init__(max_capacity, alpha, beta, eps, stratified=stratified, shuffle_strata=shuffle_strata,
                         weight_normalization=weight_normalization, rule=rule, **kwargs)
        rule.allocate(max_capacity, self.core.alpha, self.core.device)  # its tensors exist from the start

    def capture_problem(self, storage) -> str | None:
        """Why a CUDA graph cannot record this sampler's draws (:class:`lightning_per.graphs.CapturableSampler`)."""
        return (f"{type(self).__name__} refreshes its ranking on a host counter (sort_every), which a CUDA graph "
                f"freezes; capture with GPUPrioritizedSampler (proportional), or capture the learner alone (pass "
                f"the batch as the step's input)")

    def mark_update(self, index, *, storage=None) -> None:
        super().mark_update(index, storage=storage)
        self.core.rule.stale = True

    def _empty(self) -> None:
        super()._empty()
        self.core.rule.stale = True

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

    def state_dict(self):
        state = super().state_dict()
        state["sort_every"] = self.core.rule.sort_every
        return state

    def load_state_dict(self, state_dict) -> None:
        super().load_state_dict(state_dict)
        self.core.rule.stale = True
