"""Draw rules as values: how a :class:`~lightning_per.replay.core.PriorityCore` turns its priorities into slots.

A draw rule is a small object of explicit state that declares what it can do as attributes and offers four
functions the core calls (docs/architecture.md, "Adding a draw rule"):

* ``name`` (str): what its CUDA-graph keys and the core's repr call it.
* ``device_rng`` (bool): its draws may take their uniforms from the compiled kernels' device counters
  (:attr:`PriorityState.rng <lightning_per.replay.priority.PriorityState.rng>`) instead of the generator; such a
  rule also offers ``device_limit(ops)`` (the largest batch drawn there) and ``shuffles()``.
* ``fuses_gather`` (bool): it can draw and copy the drawn rows in one op (``sample_gather``).
* ``reads_filled`` (bool): its draw bakes ``len(storage)`` in, so a cached CUDA graph may serve it only once the
  ring is full.
* ``plan(core, batch_size, n) -> tuple``: the host decisions of one draw (hashable; part of its CUDA-graph key).
* ``draw(core, batch_size, n, plan, rows) -> tuple[Tensor, ...]``: the device work, ``(index, weight)``, or
  ``(block, index, weight)`` with ``rows``; no host sync (a cached graph replays it without Python).
* ``drew(core, n, plan)``: host bookkeeping once a draw has run.
* ``tensors() -> tuple[Tensor, ...]``: the device tensors of its own that a draw reads or writes.

:class:`Proportional` here; :class:`~lightning_per.replay.rank.RankIndex` (rank-based) in ``rank.py``.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from lightning_per.replay import priority

__all__ = ["DrawRule", "Proportional", "RANK_PERMUTATION_MAX", "generator_uniforms", "random_permutation"]

#: Largest batch whose strata permutation is ranked by one ``(B, B)`` comparison (two fully parallel kernels;
#: no sort kernel, which for a short row runs in a single thread block); larger batches argsort their keys.
RANK_PERMUTATION_MAX = 1024


class DrawRule(Protocol):
    """What :class:`~lightning_per.replay.core.PriorityCore` reads of a draw rule (module docstring)."""

    name: str
    device_rng: bool
    fuses_gather: bool
    reads_filled: bool

    def plan(self, core, batch_size: int, n: int) -> tuple: ...

    def draw(self, core, batch_size: int, n: int, plan: tuple, rows: Tensor | None) -> tuple[Tensor, ...]: ...

    def drew(self, core, n: int, plan: tuple) -> None: ...

    def tensors(self) -> tuple[Tensor, ...]: ...


class Proportional:
    """Proportional draws, ``P(i) = p_i / sum_k p_k`` over the stored values (PER, Schaul et al. 2016,
    arXiv:1511.05952, section 3.3), with IS weights ``(P(i) / min_j P(j))^-beta`` (section 3.4).

    Args:
        stratified: one draw per equal-mass segment, or i.i.d. draws.
        shuffle_strata: with ``stratified``, the draws in a uniformly random order of the strata (a device-side
            permutation, no sync); else in stratum order (sorted by slot).
        weight_normalization: ``"buffer"`` (by ``min_j P(j)``) or ``"batch"`` (by the batch max).

    Raises:
        ValueError: ``weight_normalization`` is neither.
    """

    def __init__(self, stratified: bool = True, shuffle_strata: bool = True,
                 weight_normalization: str = "buffer") -> None:
        if weight_normalization not in ("buffer", "batch"):
            raise ValueError(f"weight_normalization must be 'buffer' or 'batch', got {weight_normalization!r}")
        self.name, self.device_rng, self.fuses_gather, self.reads_filled = "proportional", True, True, False
        self.stratified, self.shuffle_strata = stratified, shuffle_strata
        self.weight_normalization = weight_normalization

    def __repr__(self) -> str:
        return (f"Proportional(stratified={self.stratified}, shuffle_strata={self.shuffle_strata}, "
                f"weight_normalization={self.weight_normalization!r}, device_rng={self.device_rng}, "
                f"fuses_gather={self.fuses_gather})")

    def shuffles(self) -> bool:
        """True when the draws come in a random order of the strata."""
        return self.stratified and self.shuffle_strata

    def plan(self, core, batch_size: int, n: int) -> tuple:
        return self.stratified, self.shuffle_strata, self.weight_normalization

    def drew(self, core, n: int, plan: tuple) -> None:
        return None

    def tensors(self) -> tuple[Tensor, ...]:
        return ()

    def device_limit(self, ops) -> int:
        """Largest batch the compiled kernels' device RNG draws for this rule."""
        return ops.SHUFFLE_DRAWS if self.shuffles() else ops.DEVICE_RNG_DRAWS

    def uniforms(self, core, batch_size: int) -> tuple[Tensor | int, bool]:
        """``(u, stratified)`` for the sample op: from the device counters when the core draws there (the shuffled
        stratified uniforms, one launch, or the int ``B``: the kernel draws its own), else from the generator:
        with :attr:`shuffle_strata` the targets ``u_j = (pi(j) + U_j) / B`` for a uniformly random permutation
        ``pi`` of the strata (``stratified=False`` then: the op takes ``u`` as it is), else i.i.d. uniforms."""
        if core.device_draws(batch_size):
            if self.shuffles():
                return core.ops.shuffled_uniforms(core.state.rng, batch_size), False
            return batch_size, self.stratified
        return generator_uniforms(core, batch_size, self.stratified, self.shuffle_strata)

    def draw(self, core, batch_size: int, n: int, plan: tuple, rows: Tensor | None) -> tuple[Tensor, ...]:
        u, stratified = self.uniforms(core, batch_size)
        if rows is None:
            return priority.sample(core.ops, core.state, u, stratified, self.weight_normalization)
        return priority.sample_gather(core.ops, core.state, u, rows, stratified, self.weight_normalization)


def generator_uniforms(core, batch_size: int, stratified: bool, shuffle_strata: bool) -> tuple[Tensor, bool]:
    """``(u (B,) float64, stratified)`` from the core's generator: with ``stratified`` and ``shuffle_strata`` the
    targets ``u_j = (pi(j) + U_j) / B`` for a uniformly random permutation ``pi`` of the strata (the ranks of B
    uniform keys, :func:`random_permutation`; ``stratified=False`` then: the op takes ``u`` as it is), else i.i.d.
    uniforms and ``stratified`` (the op stratifies them in stratum order)."""
    if not (stratified and shuffle_strata):
        return core.rand((batch_size,)), stratified
    draws = core.rand((2, batch_size))
    return (random_permutation(draws[0], core.serial) + draws[1]) / batch_size, False


def random_permutation(keys: Tensor, serial: bool = False) -> Tensor:
    """A uniformly random permutation of ``range(B)`` from ``B`` i.i.d. continuous keys: each key's rank (the
    number of keys below it), ``(B,)`` int64 on ``keys``' device, no host sync.

    The ranks of exchangeable keys are a uniformly random permutation (ties have probability ~2^-53 for
    float64 uniforms); up to :data:`RANK_PERMUTATION_MAX` keys they are counted by one ``(B, B)`` comparison
    and a row sum (no sort), beyond by ``argsort`` (whose result, the inverse of the ranks, is uniform too).
    ``serial`` (one CPU thread, :attr:`PriorityCore.serial <lightning_per.replay.core.PriorityCore.serial>`):
    the same ranks from one sort, ``O(B log B)`` work instead of ``O(B^2)``, scattered back (equal to the
    comparison's count for distinct keys).

    Example::

        >>> import torch
        >>> from lightning_per.replay.rules import random_permutation
        >>> random_permutation(torch.tensor([0.7, 0.1, 0.4]))
        tensor([2, 0, 1])
        >>> random_permutation(torch.tensor([0.7, 0.1, 0.4]), serial=True)
        tensor([2, 0, 1])
    """
    if keys.numel() > RANK_PERMUTATION_MAX:
        return keys.argsort()
    if serial:  # rank[order[k]] = k
        order = keys.argsort()  # [B]
        return torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=keys.device))
    return (keys.unsqueeze(1) > keys).sum(1)

