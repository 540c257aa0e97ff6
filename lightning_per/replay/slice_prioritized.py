"""GPUPrioritizedSliceSampler: prioritized trajectory slices on the storage's device, a drop-in for TorchRL's
:class:`~torchrl.data.PrioritizedSliceSampler` (:mod:`lightning_per.replay.slice` describes the slice state and the
batch; ``docs/replay.md``, "Slices", the rules)."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor
from torchrl.data.replay_buffers.samplers import PrioritizedSliceSampler

from lightning_per.graphs.protocol import CapturableSampler, SamplerCapture
from lightning_per.replay import priority, sampler_checkpoint
from lightning_per.replay.adapter import capture_view, checked_update, dump, mark_written, max_priority, new_core
from lightning_per.replay.errors import check_bool, check_kind, check_reduction
from lightning_per.replay.rules import Proportional
from lightning_per.replay.slice_index import SliceIndex, whole_rows
from lightning_per.replay.slice_output import expand, slice_batch
from lightning_per.replay.slice_spec import SliceSpec, parse_span
from lightning_per.replay.slice_starts import PriorityStarts

__all__ = ["GPUPrioritizedSliceSampler"]


class GPUPrioritizedSliceSampler(PrioritizedSliceSampler):
    """Prioritized slices drawn on ``device``: TorchRL's :class:`~torchrl.data.PrioritizedSliceSampler` rule.

    A start ``s`` is drawn with ``P(s) = v_s / sum_j v_j`` over the valid starts (module docstring), ``v_s =
    (p_s + eps)^alpha`` (PER eq. 1, TorchRL's stored value), by the proportional sampler's two-level draw
    (compiled kernels on CUDA) over priorities multiplied by the start mask; the slice is the ``T`` slots from
    ``s``. IS weights ``w = (v_s / min_j v_j)^-beta`` (PER section 3.4; the minimum over the valid starts,
    or ``weight_normalization="batch"``), repeated over the slice's ``T`` steps. :meth:`update_priority` sets
    one raw priority per transition (slots of the batch, ``index`` ``(B,)``; TorchRL's buffer reduces a
    stored row's extra dims with ``reduction`` first).

    Start priority rules (``slice_priority``):

    * ``"start"`` (default, TorchRL's): a start's own priority. A transition that cannot start a slice (the
      last ``T - 1`` of a trajectory) is only ever drawn as a later member of an earlier slice, whatever its
      priority (TorchRL's docstring warns about this).
    * ``"max"``: the largest raw priority among the slice's members ``s .. s + T - 1``, so a slice is drawn as
      often as its most surprising transition asks (as R2D2, Kapturowski et al. 2019, section 2.3, ranks a
      sequence by its max TD error, there mixed with the mean). An update of B slots recomputes the
      ``B * T`` starts whose slices hold them.

    Its slice state is :attr:`index` (a :class:`~lightning_per.replay.slice_index.SliceIndex` holding the starts rule
    :class:`~lightning_per.replay.slice_starts.PriorityStarts`), its priorities :attr:`core`, its keywords
    :attr:`spec`. On a 2-D storage (``[time, envs]``) slots are row-major, as the proportional sampler's.

    Args:
        max_capacity: the storage's ``max_size`` (slots N >= 1).
        alpha, beta, eps, dtype, reduction, max_priority_within_buffer: as
            :class:`GPUPrioritizedSampler` / TorchRL.
        num_slices, slice_len, end_key, end_keys, traj_key, ends, trajectories, cache_values, truncated_key,
            init_key, strict_length, compile, span, pad_output: as :class:`GPUSliceSampler` (a left ``span`` is
            turned off with a warning, as TorchRL does: a prioritized start is a stored slot).
        slice_priority: ``"start"`` or ``"max"`` (above).
        device, backend, seed, stratified, weight_normalization, eager_graphs: as
            :class:`GPUPrioritizedSampler`.

    Raises:
        ValueError, TypeError: a bad argument (named in the message).

    Example::

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import TensorDictReplayBuffer
        >>> from lightning_per import GPUPrioritizedSliceSampler
        >>> from lightning_per.replay import GPURoundRobinWriter, GPUTensorStorage
        >>> sampler = GPUPrioritizedSliceSampler(12, alpha=1.0, beta=1.0, slice_len=3, traj_key="episode",
        ...                                      device="cpu", seed=0)
        >>> rb = TensorDictReplayBuffer(storage=GPUTensorStorage(12, device="cpu"), sampler=sampler,
        ...                             writer=GPURoundRobinWriter(), batch_size=6)
        >>> _ = rb.extend(TensorDict({"episode": torch.arange(12) // 6}, [12]))
        >>> sampler.update_priority(torch.arange(12), torch.where(torch.arange(12) == 6, 5.0, 1.0))
        >>> batch = rb.sample()
        >>> starts = batch["index"].view(2, 3)[:, 0]
        >>> # w = (v_s / min_j v_j)^-beta over the valid starts: 1/5 for a slice from slot 6, 1 otherwise
        >>> torch.allclose(batch["priority_weight"], torch.where(starts == 6, 0.2, 1.0).repeat_interleave(3))
        True
    """

    def __init__(self, max_capacity: int, alpha: float, beta: float, eps: float = 1e-8,
                 dtype: torch.dtype = torch.float32, reduction: str = "max", *, num_slices: int | None = None,
                 slice_len: int | None = None, end_key=None, end_keys=None, traj_key=None, ends: Tensor | None = None,
                 trajectories: Tensor | None = None, cache_values: bool = False, truncated_key=("next", "truncated"),
                 init_key="is_init", strict_length: bool = True, compile: bool | dict = False, span=False,
                 max_priority_within_buffer: bool = False, pad_output: bool = False, slice_priority: str = "start",
                 device: torch.device | str | None = None, stratified: bool = True,
                 weight_normalization: str = "buffer", backend: str = "auto", seed: int | None = None,
                 eager_graphs: bool = True) -> None:
        check_bool("stratified", stratified)
        if parse_span(span)[0]:
            warnings.warn(f"{type(self).__name__}: a left span is turned off (a prioritized start is a stored slot), "
                          f"as TorchRL's PrioritizedSliceSampler does", UserWarning, stacklevel=2)
            span = (False, parse_span(span)[1])
        #: the checked keywords (:class:`~lightning_per.replay.slice_spec.SliceSpec`)
        self.spec = SliceSpec.build(
            num_slices=num_slices, slice_len=slice_len, end_key=end_key, end_keys=end_keys, traj_key=traj_key,
            ends=ends, trajectories=trajectories, cache_values=cache_values, truncated_key=truncated_key,
            init_key=init_key, strict_length=strict_length, pad_output=pad_output, compile=compile, span=span)
        self.reduction, self.dtype = check_reduction(reduction), dtype
        #: the starts' priorities, draws, IS weights and random streams (:class:`PriorityCore`)
        self.core = new_core(type(self).__name__, max_capacity, alpha, beta, eps,
                             Proportional(stratified, True, weight_normalization), device=device, backend=backend,
                             seed=seed, dtype=dtype, eager_graphs=eager_graphs,
                             max_priority_within_buffer=max_priority_within_buffer)
        #: the trajectory state, the start mask and its starts rule (:class:`SliceIndex`)
        self.index = SliceIndex(max_capacity, spec=self.spec, starts=PriorityStarts(self.core, slice_priority),
                                compiled=self.core.compiled, owner=type(self).__name__)
        self.spec.set_torchrl_attributes(self)
        self._fragmented_index, self._cache, self._gpu_device = None, {}, self.index.device  # TorchRL's, read by it

    def __getstate__(self) -> dict[str, Any]:
        """Pickle / ``copy.deepcopy`` state (what a ``spawn``ed process receives): the attributes, the core and the
        index pickling themselves (TorchRL's prioritized samplers refuse to)."""
        return self.__dict__.copy()

    def __repr__(self) -> str:
        c, i = self.core, self.index
        s = self.spec
        return (f"{type(self).__name__}(max_capacity={c.capacity}, alpha={c.alpha}, beta={c.beta}, "
                f"eps={c.state.eps}, num_slices={s.num_slices}, slice_len={s.slice_len}, "
                f"strict_length={s.strict_length}, span={s.span}, slice_priority={i.starts.rule!r}, device={c.device})")

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
        """Priority exponent; setting it re-transforms every start's stored value exactly, O(N) on the device."""
        return self.core.alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        before = self.core.alpha
        self.core.set_alpha(value)
        if self.core.alpha != before:  # the core rebuilt plain values: the start mask applies again
            self.index.starts.refresh(self.index)

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
        """What a CUDA-graph capture of the draws needs (:class:`lightning_per.graphs.protocol.CapturableSampler`;
        :func:`~lightning_per.replay.adapter.capture_view`): the draws and priority writes run on the device from
        device state, so ``problem`` is None for any storage."""
        return capture_view(self.core, batch_size)

    def probabilities(self) -> Tensor:
        """Exact P(s) of every slot as a start, ``(N,)`` float64 on :attr:`device`."""
        return self.core.probabilities()

    # ------------------------------------------------------------------ TorchRL's calls
    def update_priority(self, index, priority, *, storage=None, live=None) -> None:
        """One raw priority per transition at slots ``index`` (as :meth:`GPUPrioritizedSampler.update_priority`,
        raising the same; ``live`` as there); the starts' stored values follow :attr:`index`'s starts rule."""
        with torch.no_grad():  # the stored priorities never join an autograd graph
            self.index.starts.write(self.index, *checked_update(self.core, index, priority, storage,
                                                                type(self).__name__, live))

    def mark_update(self, index, *, storage=None) -> None:
        """New slots ``index`` get the default priority (the running max), then the trajectory state is updated
        (see the module docstring).

        Raises:
            ValueError: the storage's ``max_size`` is not this sampler's capacity.
        """
        if storage is not None:
            self._bind(storage)
        mark_written(self.core, index, storage, type(self).__name__)
        self.index.written(index, storage)

    def _bind(self, storage) -> None:
        """Take the ring's geometry from ``storage`` (:meth:`SliceIndex.bind`); when a storage of ``ndim > 1``
        rounded ``max_capacity`` up to whole rows (149 -> 150 slots for rows of 2, as TorchRL's storages do), the
        core, still empty at this first bind, is rebuilt with the storage's slots (TorchRL's sum tree, rounded up
        to a power of two, holds them too)."""
        self.index.bind(storage)
        if self.index.slots is not None and self.index.slots != self.core.capacity:
            self._use(self._resized(self.index.slots))

    def _resized(self, slots: int):
        """A fresh core of ``slots`` slots with this core's exponents, rule, device, backend and random streams."""
        old = self.core
        core = new_core(type(self).__name__, slots, old.alpha, old.beta, old.state.eps, old.rule, device=old.device,
                        backend=old.backend, seed=None, dtype=self.dtype, eager_graphs=old.graphs is not None,
                        max_priority_within_buffer=old.max_within_buffer)
        core.set_rng_state(old.get_rng_state())  # the same streams, as if built with these slots
        core.rng.attach(old.rng.buffer)
        return core

    def _use(self, core) -> None:
        self.core = core
        self.index.starts.core = core

    def _core_for(self, state_dict: dict[str, Any]):
        """The core a checkpoint loads into: this one, or, before the first bind, one resized to the checkpoint's
        slots when they are this capacity rounded up to whole rows (a checkpoint of a sampler built alike)."""
        slots, stride = state_dict.get("slots"), state_dict.get("stride")
        if (self.index.slots is None and isinstance(slots, int) and isinstance(stride, int) and stride >= 1
                and slots != self.core.capacity and whole_rows(self.core.capacity, stride) == slots):
            return self._resized(slots)
        return self.core

    def check_signal(self, data) -> None:
        """Raise before a write of ``data`` that carries no trajectory marker (:meth:`SliceIndex.check_signal`)."""
        self.index.check_signal(data)

    def add(self, index) -> None:  # new items get their priority through mark_update
        return None

    def extend(self, index) -> None:
        return None

    def sample(self, storage, batch_size: int) -> tuple[Tensor, dict]:
        """Draw ``batch_size // T`` slice starts by priority and expand them to slices.

        Returns:
            ``(index, info)`` as :meth:`GPUSliceSampler.sample`; ``info`` also holds ``"priority_weight"`` ``(B,)``
            float32 (each slice's start weight on its steps).

        Raises:
            As :meth:`GPUSliceSampler.sample`.
        """
        if storage is not None:
            self._bind(storage)
        T, num = self.index.prepare_draw(storage, batch_size)
        start, weight = self.core.sample(num, len(storage))
        return expand(self.index, start, None, T, storage, weight)

    def sample_gather(self, storage, batch_size: int, *, with_info: bool = False):
        """:meth:`sample`, and the batch with the info's entries set in it: ``(index, info, batch)``."""
        return slice_batch(storage, *self.sample(storage, batch_size), with_info)

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        return {**self.core.state_dict(type(self).__name__), **self.index.state(),
                "slice_priority": self.index.starts.rule}

    def check_state_dict(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """As :meth:`GPUPrioritizedSampler.check_state_dict`, and the trajectory state's entries.

        Raises:
            ValueError: the checkpoint is refused (the message names why).
        """
        check_kind(state_dict, self)
        if state_dict == {}:
            raise ValueError(f"an empty state is TorchRL's SliceSampler's (it holds no priorities), not a "
                             f"{type(self).__name__} checkpoint")
        self._core_for(state_dict).check_state_dict(state_dict)
        if state_dict.get("kind") != type(self).__name__:
            raise ValueError(f"sampler checkpoint is from {state_dict.get('kind')!r}, not {type(self).__name__}")
        return self.index.check_state(state_dict)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (raises as :meth:`check_state_dict`, before anything changes)."""
        state = self.check_state_dict(state_dict)
        core = self._core_for(state_dict)
        core.load_state_dict(state_dict)  # plain values; the slice state then masks them
        self._use(core)
        self.index.load_state(state)

    def dumps(self, path) -> None:
        dump(self.state_dict(), path)

    def loads(self, path) -> None:
        self.load_state_dict(sampler_checkpoint.load(path, self.core.device))

    def _empty(self) -> None:
        self.core.reset()
        self.index.reset()


CapturableSampler.register(GPUPrioritizedSliceSampler)  # isinstance answers; the MRO is unchanged
