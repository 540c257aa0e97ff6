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

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_per.ops import rank_weights
from lightning_per.replay.errors import check_draw
from lightning_per.replay.prioritized import GPUPrioritizedSampler
from lightning_per.replay.priority import PriorityState
from lightning_per.replay.slots import unravel

__all__ = ["GPURankBasedSampler", "RankIndex", "rank_sample", "sort_ranks"]


@dataclass(eq=False)
class RankIndex:
    """The ranking of a :class:`~lightning_per.replay.priority.PriorityState`'s slots by raw priority.

    Attributes:
        cdf: ``(N,) float64`` prefix sums of ``k^-alpha`` for ``alpha`` (refreshed in place when alpha changes).
        order: ``(N,) int64`` the slot holding rank ``k + 1`` (written in place by :func:`sort_ranks`).
        sorted_keys: ``(N,) float32`` the sort's keys, in rank order (scratch kept for in-place sorts).
        alpha: the host alpha ``cdf`` was computed for.
        writes: the state's ``writes`` counter at the last sort (host int).
        stale: new slots were written since the last sort (always re-sort).
        sorted_n: the filled length at the last sort (host int).
    """

    cdf: Tensor
    order: Tensor
    sorted_keys: Tensor
    alpha: float
    writes: int = 0
    stale: bool = False
    sorted_n: int = 0

    @classmethod
    def empty(cls, capacity: int, alpha: float, device: torch.device) -> RankIndex:
        """The identity ranking of ``capacity`` slots (nothing sorted yet)."""
        return cls(cdf=rank_weights(capacity, alpha, device)[1], order=torch.arange(capacity, device=device),
                   sorted_keys=torch.empty(capacity, dtype=torch.float32, device=device), alpha=float(alpha))

    def tensors(self) -> tuple[Tensor, ...]:
        """The index's device tensors: ``order, sorted_keys, cdf``."""
        return self.order, self.sorted_keys, self.cdf

    def follow_alpha(self, alpha: float) -> None:
        """Recompute :attr:`cdf` in place for a new ``alpha`` (host work when it changed, nothing otherwise)."""
        if alpha != self.alpha:
            self.cdf.copy_(rank_weights(self.cdf.shape[0], alpha, self.cdf.device)[1])
            self.alpha = float(alpha)


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

    _uses_device_rng = False  # the rank draw takes torch.rand uniforms from the generator

    def __init__(self, max_capacity: int, alpha: float, beta: float, eps: float = 1e-8, *,
                 sort_every: int = 1, **kwargs) -> None:
        if isinstance(sort_every, bool) or not isinstance(sort_every, int) or sort_every < 1:
            raise ValueError(f"sort_every must be an int >= 1, got {sort_every!r}")
        self.sort_every = sort_every
        super().__init__(max_capacity, alpha, beta, eps, **kwargs)
        self._ranks = RankIndex.empty(max_capacity, self._alpha, self._device)

    def capture_problem(self, storage) -> str | None:
        """Why a CUDA graph cannot record this sampler's draws (:class:`lightning_per.graphs.CapturableSampler`)."""
        return (f"{type(self).__name__} refreshes its ranking on a host counter (sort_every), which a CUDA graph "
                f"freezes; capture with GPUPrioritizedSampler (proportional), or capture the learner alone (pass "
                f"the batch as the step's input)")

    def _empty(self) -> None:
        super()._empty()
        self._ranks = RankIndex.empty(self._max_capacity, self._alpha, self._device)

    # the index's tensors under the names code written against this class reads (tests, diagnostics)
    _order = property(lambda self: self._ranks.order)
    _sorted_keys = property(lambda self: self._ranks.sorted_keys)

    @property
    def _rank_cdf(self) -> Tensor:
        """``(N,) float64`` prefix sums of ``k^-alpha`` for the current alpha (:attr:`RankIndex.cdf`)."""
        self._ranks.follow_alpha(self._alpha)
        return self._ranks.cdf

    def mark_update(self, index, *, storage=None) -> None:
        super().mark_update(index, storage=storage)
        self._ranks.stale = True

    def _refresh(self, n: int) -> None:
        sort_ranks(self._state, self._ranks)
        self._ranks.writes, self._ranks.stale, self._ranks.sorted_n = self._state.writes, False, n

    def _rank_draw(self, batch_size: int, n: int, sort: bool) -> tuple[Tensor, Tensor]:
        """``(index (B,) int64, weight (B,) float32)``: the ranking refreshed first if ``sort``, then the draw."""
        if sort:
            sort_ranks(self._state, self._ranks)
        u, stratified = self._draw_uniforms(batch_size)
        return rank_sample(self._ops, self._state, self._ranks, u, n, stratified, self.weight_normalization)

    def sample(self, storage, batch_size: int) -> tuple[Tensor, dict[str, Tensor]]:
        """Draw ``batch_size`` slots by rank; returns ``(index (B,) int64, {"priority_weight": (B,) f32})``.

        The ranking is refreshed first when it is stale (module docstring); on CUDA, once the ring is full,
        the refresh and the draw of a repeated call shape are served by one cached CUDA graph
        (``eager_graphs``; while the ring fills, the filled length changes the call shape every time).

        Raises:
            ValueError: ``batch_size`` is not an int >= 1.
            EmptyBufferError: the storage is empty.
        """
        check_draw(storage, batch_size)
        self._follow_buffer_rng()
        ranks, writes = self._ranks, self._state.writes
        ranks.follow_alpha(self._alpha)
        n = len(storage)
        sort = ranks.stale or n != ranks.sorted_n or writes - ranks.writes >= self.sort_every
        if n < self._max_capacity:  # n is baked into a draw: only a full ring repeats its call shape
            index, weight = self._rank_draw(batch_size, n, sort)
        else:
            index, weight = self._served(("rank", batch_size, sort, self.stratified, self.weight_normalization),
                                         lambda: self._rank_draw(batch_size, n, sort), (),
                                         (*self._state.tensors(), *ranks.tensors()), (self.generator,))
        if sort:  # after the sort ran: a failed call leaves the ranking marked stale
            ranks.writes, ranks.stale, ranks.sorted_n = writes, False, n
        return unravel(index, storage), {"priority_weight": weight}

    def probabilities(self, n: int | None = None) -> Tensor:
        """Exact P(i) of every slot for a buffer holding ``n`` items, ``(N,)`` float64 (for tests)."""
        if n is None:  # the written slots
            n = int((self._leaves.view(-1)[: self._max_capacity] > 0).sum())  # sync-ok: diagnostics only
        self._refresh(n)
        p = torch.zeros(self._max_capacity, dtype=torch.float64, device=self._device)
        w = torch.arange(1, n + 1, dtype=torch.float64, device=self._device).pow(-self._alpha)
        p[self._ranks.order[:n]] = w / w.sum()
        return p

    def state_dict(self):
        state = super().state_dict()
        state["sort_every"] = self.sort_every
        return state

    def load_state_dict(self, state_dict) -> None:
        super().load_state_dict(state_dict)
        self._ranks.stale = True
