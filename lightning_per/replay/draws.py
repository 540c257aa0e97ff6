"""The random streams of a prioritized sampler's draws: the generator's uniforms (stratified, optionally in a
random order of the strata) or the compiled kernels' device counters (:attr:`PriorityState.rng
<lightning_per.replay.priority.PriorityState.rng>`), their state for replays, and the generators a CUDA graph
recording the draws must register."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_per.replay import priority as core
from lightning_per.replay._rng import DeviceRNGMixin, check_rng_state

__all__ = ["PriorityDraws", "RANK_PERMUTATION_MAX", "random_permutation"]

#: Largest batch whose strata permutation is ranked by one ``(B, B)`` comparison (two fully parallel kernels;
#: no sort kernel, which for a short row runs in a single thread block); larger batches argsort their keys.
RANK_PERMUTATION_MAX = 1024


class PriorityDraws(DeviceRNGMixin):
    """Where a prioritized sampler's draws take their uniforms (mixed into
    :class:`~lightning_per.replay.GPUPrioritizedSampler`; reads its ``generator``, ``stratified``,
    ``shuffle_strata``, ``weight_normalization``, backend ``_ops`` and :class:`PriorityState
    <lightning_per.replay.priority.PriorityState>` ``_state``), and the draws themselves."""

    def _uniforms(self, batch_size: int) -> Tensor:
        """``(B,)`` float64 i.i.d. U[0, 1) draws from the sampler's generator on :attr:`device`."""
        return self._rand((batch_size,))

    def _unregistered_way(self) -> str:
        if self._device_rng is not None and self._shuffles():
            return (f"draw at most {self._ops.SHUFFLE_DRAWS} per call, or build the sampler with shuffle_strata=False "
                    f"(with the compiled kernels its draws then take their uniforms from counters in device "
                    f"memory: no generator to register)")
        return ""

    def _shuffles(self) -> bool:
        return self.stratified and self.shuffle_strata

    def _draw_uniforms(self, batch_size: int) -> tuple[Tensor, bool]:
        """``(u (B,) float64, stratified)`` for the ops: with :attr:`shuffle_strata`, the stratified targets
        ``u_j = (pi(j) + U_j) / B`` for a uniformly random permutation ``pi`` of the strata (the ranks of B
        uniform keys, :func:`random_permutation`; the ops then take ``u`` as it is, ``stratified=False``), else
        i.i.d. uniforms and
        :attr:`stratified` (the ops stratify them in stratum order)."""
        if not self._shuffles():
            return self._uniforms(batch_size), self.stratified
        draws = self._rand((2, batch_size))
        return (random_permutation(draws[0]) + draws[1]) / batch_size, False

    def _device_draws(self, batch_size: int) -> bool:
        """True when a draw of ``batch_size`` takes its uniforms from the kernels' device RNG
        (:attr:`_device_rng`, not while ``torch.compile`` traces), else from :attr:`generator`: in-kernel
        uniforms up to ``DEVICE_RNG_DRAWS`` draws, or, with :attr:`shuffle_strata`, the shuffled stratified
        uniforms of ``ops.shuffled_uniforms`` (one launch) up to ``SHUFFLE_DRAWS``."""
        return (self._device_rng is not None and not torch.compiler.is_compiling()
                and batch_size <= (self._ops.SHUFFLE_DRAWS if self._shuffles() else self._ops.DEVICE_RNG_DRAWS))

    def _device_uniforms(self, batch_size: int) -> Tensor | int:
        """What a device draw passes the sample op as ``u``: the shuffled stratified uniforms (drawn here, one
        launch) with :attr:`shuffle_strata`, else the batch size (the sample kernel draws its own)."""
        if self._shuffles():
            return self._ops.shuffled_uniforms(self._device_rng, batch_size)
        return batch_size

    def get_rng_state(self) -> dict[str, Tensor | None]:
        """The state of every random stream the draws use, to replay them with :meth:`set_rng_state`:
        ``{"generator": CPU uint8 tensor, "device_rng": (1 + 65536,) int64 device tensor or None}`` (the
        compiled draws' seed and counters, copied). No host sync."""
        return {"generator": self.generator.get_state(),
                "device_rng": None if self._device_rng is None else self._device_rng.clone()}

    def set_rng_state(self, state: dict[str, Tensor | None]) -> None:
        """Restore a :meth:`get_rng_state` result in place (cached CUDA graphs keep drawing from it).

        Raises:
            TypeError, ValueError: ``state`` is not a ``get_rng_state()`` dict, or lacks the ``"device_rng"`` this
                sampler draws from (e.g. the state of a sampler on the reference ops, or of another kind), or
                holds one of another shape; nothing is changed.
        """
        check_rng_state(state)
        saved = state.get("device_rng")
        if self._device_rng is not None and (saved is None or saved.shape != self._device_rng.shape):
            raise ValueError(f"state['device_rng'] must be a {tuple(self._device_rng.shape)} int64 tensor (this "
                             f"sampler's compiled draws use it), got {None if saved is None else tuple(saved.shape)}")
        self.generator.set_state(state["generator"])
        if self._device_rng is not None:
            self._device_rng.copy_(saved)

    def _seeded(self, seed: int | None = None) -> None:
        """The generator was seeded: the device RNG takes ``seed`` (default the generator's seed) and restarts
        its counters (in place)."""
        rng = getattr(self, "_device_rng", None)
        if rng is not None:
            rng[1:].zero_()
            rng[:1].fill_(self._ops.seed_word(self.generator.initial_seed() if seed is None else seed))

    def draw_generators(self, batch_size: int) -> tuple[torch.Generator, ...]:
        """The torch generators a draw of ``batch_size`` consumes: what a CUDA graph that records such draws must
        register (none when the compiled kernels draw the uniforms themselves; registering a generator costs
        every replay a host-to-device update of its seed and offset)."""
        return () if self._device_draws(batch_size) else (self.generator,)

    def _draw(self, batch_size: int) -> tuple[Tensor, Tensor]:
        """``(index (B,) int64, weight (B,) float32)``: uniforms, then the search and the IS weights
        (:func:`lightning_per.replay.priority.sample`)."""
        if self._device_draws(batch_size):  # the kernel draws its uniforms, or reads the shuffled ones
            u = self._device_uniforms(batch_size)
            return core.sample(self._ops, self._state, u, self.stratified and isinstance(u, int),
                               self.weight_normalization)
        u, stratified = self._draw_uniforms(batch_size)
        return core.sample(self._ops, self._state, u, stratified, self.weight_normalization)

    def _draw_gather(self, batch_size: int, rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(batch rows (B, W) int64, index (B,) int64, weight (B,) float32)``: :meth:`_draw` and the rows
        of the drawn slots, one fused op (:func:`lightning_per.replay.priority.sample_gather`; rows first: the
        cached graphs' outputs start with them)."""
        if self._device_draws(batch_size):
            u = self._device_uniforms(batch_size)
            return core.sample_gather(self._ops, self._state, u, rows, self.stratified and isinstance(u, int),
                                      self.weight_normalization)
        u, stratified = self._draw_uniforms(batch_size)
        return core.sample_gather(self._ops, self._state, u, rows, stratified, self.weight_normalization)

    def _draw_state(self, batch_size: int) -> tuple[Tensor, ...]:
        """The device tensors a draw reads or writes (besides a generator): the whole state."""
        return self._state.tensors()


def random_permutation(keys: Tensor) -> Tensor:
    """A uniformly random permutation of ``range(B)`` from ``B`` i.i.d. continuous keys: each key's rank (the
    number of keys below it), ``(B,)`` int64 on ``keys``' device, no host sync.

    The ranks of exchangeable keys are a uniformly random permutation (ties have probability ~2^-53 for
    float64 uniforms); up to :data:`RANK_PERMUTATION_MAX` keys they are counted by one ``(B, B)`` comparison
    and a row sum (no sort), beyond by ``argsort`` (whose result, the inverse of the ranks, is uniform too).

    Example::

        >>> import torch
        >>> from lightning_per.replay.draws import random_permutation
        >>> random_permutation(torch.tensor([0.7, 0.1, 0.4]))
        tensor([2, 0, 1])
    """
    if keys.numel() > RANK_PERMUTATION_MAX:
        return keys.argsort()
    return (keys.unsqueeze(1) > keys).sum(1)
