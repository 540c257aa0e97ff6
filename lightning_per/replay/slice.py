"""GPU slice samplers: trajectory slices drawn on the storage's device, drop-ins for TorchRL's
:class:`~torchrl.data.SliceSampler` and :class:`~torchrl.data.PrioritizedSliceSampler`.

A slice is ``T`` consecutive ring slots of one trajectory. Which slots may start a slice is kept as device
state updated where the ring changes (``mark_update``, i.e. at every ``extend``), so a draw scans nothing:

* ``ends`` (an effective end flag per slot): the stored end signal (``end_key`` / ``end_keys``, or a change of
  ``traj_key`` between a slot and the next), OR the slot under the write head (the data after it was
  overwritten or never written: TorchRL's implicit truncation), OR an unfilled slot. Kept as a two-level
  array like the priorities (:mod:`lightning_per.ops.reference`), so "the first end at or after slot s" is
  one two-level search.
* ``valid`` (a start mask): slot ``s`` is filled and no end lies in ``s .. s + T - 2`` (the slice fits), or,
  with ``strict_length=False``, ``s`` starts a trajectory (the slot before it is an end: a shorter slice).
  An extend of ``n`` slots at ``c .. c + n - 1`` changes the ends at ``c - 1 .. c + n - 1`` only, hence the
  starts at ``c - T + 1 .. c + n`` only: ``n + T`` slots are recomputed, from one gather and one cumulative
  sum (static shapes, no host sync).

Draws (TorchRL's rules, so results are comparable):

* :class:`GPUSliceSampler`: a trajectory uniformly among those with a valid start, then a start uniformly
  among its valid starts (TorchRL's ``SliceSampler``: ``P(s) = 1 / (K n_k)`` for ``K`` usable trajectories,
  ``n_k = L_k - T + 1`` valid starts, or 1 for a shorter trajectory with ``strict_length=False``).
* :class:`GPUPrioritizedSliceSampler`: a start with ``P(s) = v_s valid_s / sum_j v_j valid_j`` over the valid
  starts, ``v_s = (p_s + eps)^alpha`` (TorchRL's ``PrioritizedSliceSampler``; PER, Schaul et al. 2016,
  arXiv:1511.05952, eq. 1), through the proportional sampler's two-level draw with the masked values as
  leaves. ``slice_priority="max"`` ranks a start by the largest raw priority of its slice's members instead
  of its own (see the class).

The batch is always ``num_slices * T`` slots (static shape): a shorter slice (``strict_length=False``) repeats
its last slot up to ``T`` and the batch marks where each slice ends (TorchRL's ``pad_output=True`` layout):
``truncated_key`` is True at each slice's last real step, ``("collector", "mask")`` False on the padding,
and ``init_key`` (when stored) True at each slice's first step.

This module holds one thing, TorchRL's two slice rules over one :class:`~lightning_per.replay.slice_index.SliceIndex`
each, and so passes 450 lines: each sampler is one class on its TorchRL base, its state the index and its starts
rule (:mod:`lightning_per.replay.slice_starts`), and for the prioritized one a
:class:`~lightning_per.replay.core.PriorityCore` (:mod:`lightning_per.replay.adapter` has its shared steps).

The ring must be written round-robin (consecutive slots, as TorchRL's and our writers do): the sampler reads
the slots of each write from ``mark_update`` and derives the write head from them, on the device.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchrl.data.replay_buffers.samplers import PrioritizedSliceSampler, SliceSampler

from lightning_per.replay import priority, sampler_checkpoint
from lightning_per.replay._rng import SamplerRNG, check_rng_state
from lightning_per.replay.adapter import (
    checked_update,
    dump,
    filled,
    mark_written,
    mask_slots,
    max_priority,
    new_core,
)
from lightning_per.replay.errors import check_bool, check_capacity, check_index, check_kind
from lightning_per.replay.rules import Proportional
from lightning_per.replay.slice_index import SLICE_SCHEMA_VERSION, SliceIndex, set_torchrl_attributes, slice_batch
from lightning_per.replay.slice_starts import PriorityStarts, UniformStarts
from lightning_per.replay.storage import resolve_device
from lightning_per.schema import stamp

__all__ = ["GPUSliceSampler", "GPUPrioritizedSliceSampler"]


class GPUSliceSampler(SliceSampler):
    """Uniform slices of trajectories, drawn on ``device``: TorchRL's :class:`~torchrl.data.SliceSampler` rule.

    A trajectory uniformly among those with a valid start, then a start uniformly among its valid starts,
    so ``P(s) = 1 / (K n_k)``; the batch holds ``num_slices`` slices of ``T`` consecutive slots, slice after
    slice (``T = slice_len``, or ``batch_size // num_slices``). Subclasses TorchRL's class (``isinstance``
    holds); needs no host scan of the storage per draw (see :mod:`lightning_per.replay.slice`).

    Its state is :attr:`index` (a :class:`~lightning_per.replay.slice_index.SliceIndex` holding the starts rule
    :class:`~lightning_per.replay.slice_starts.UniformStarts`) and :attr:`rng`.

    Args:
        capacity: the storage's ``max_size`` (slots N >= 1).
        num_slices, slice_len: exactly one: slices per batch, or slots per slice (int >= 1).
        end_key: stored flag that ends a trajectory (default ``("next", "done")``); exclusive with ``end_keys``.
        end_keys: stored flags OR-ed together (absent ones skipped).
        traj_key: stored trajectory id (a change of id ends a trajectory). With no key given, TorchRL's probe:
            ``("collector", "traj_ids")``, then ``"episode"``, then ``end_key``.
        strict_length: True: trajectories shorter than ``T`` are never used. False: they give one shorter
            slice each (from their first slot), padded to ``T`` by repeating its last slot.
        truncated_key: where the batch marks each slice's last step (and ``done`` / ``terminated`` beside it,
            as TorchRL); None: no marks.
        init_key: the stored ``is_init`` flag, OR-ed with True at each slice's first step (when stored).
        span: False only (slices that run past a trajectory's ends are not supported).
        device: where the state lives and the draws run (default CUDA when available, else CPU).
        seed: seed of the device generator when no buffer generator is set.

    Memory: ~18 bytes per slot: the stored end signal and the start mask (1 byte each), the effective end
    flags and the usable trajectory starts (float32 each), the trajectory ids (int64).

    Raises:
        ValueError: a bad argument (named in the message); NotImplementedError: ``span`` other than False.

    Example::

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import TensorDictReplayBuffer
        >>> from lightning_per import GPUSliceSampler
        >>> from lightning_per.replay import GPURoundRobinWriter, GPUTensorStorage
        >>> sampler = GPUSliceSampler(12, slice_len=3, traj_key="episode", device="cpu", seed=0)
        >>> rb = TensorDictReplayBuffer(storage=GPUTensorStorage(12, device="cpu"), sampler=sampler,
        ...                             writer=GPURoundRobinWriter(), batch_size=6)
        >>> _ = rb.extend(TensorDict({"episode": torch.arange(12) // 6, "obs": torch.arange(12.0)}, [12]))
        >>> batch = rb.sample()  # 2 slices of 3 consecutive steps, each inside one episode
        >>> episode, obs = batch["episode"].view(2, 3), batch["obs"].view(2, 3)
        >>> bool((episode == episode[:, :1]).all()), bool((obs.diff(dim=1) == 1).all())
        (True, True)
    """

    def __init__(self, capacity: int, *, num_slices: int | None = None, slice_len: int | None = None,
                 end_key=None, end_keys=None, traj_key=None, strict_length: bool = True,
                 truncated_key=("next", "truncated"), init_key="is_init", span=False,
                 device: torch.device | str | None = None, seed: int | None = None,
                 backend: str = "auto") -> None:
        check_capacity("capacity", capacity)
        starts = UniformStarts(capacity, resolve_device(device), backend)
        #: the trajectory state, the start mask and its starts rule (:class:`SliceIndex`)
        self.index = SliceIndex(capacity, starts=starts, compiled=starts.compiled, owner=type(self).__name__,
                                num_slices=num_slices, slice_len=slice_len, end_key=end_key, end_keys=end_keys,
                                traj_key=traj_key, strict_length=strict_length, truncated_key=truncated_key,
                                init_key=init_key, span=span)
        set_torchrl_attributes(self, self.index)
        self._fragmented_index, self._cache, self._gpu_device = None, {}, self.index.device  # TorchRL's, read by it
        #: the sampler's generator, driven by the buffer's (:class:`~lightning_per.replay._rng.SamplerRNG`)
        self.rng = SamplerRNG(starts.device, seed, type(self).__name__)

    @property
    def _rng(self) -> torch.Generator | None:
        """The buffer's generator (TorchRL assigns it); the draws follow it."""
        return self.rng.buffer

    @_rng.setter
    def _rng(self, generator: torch.Generator | None) -> None:
        self.rng.attach(generator)
        self.rng.follow()

    @property
    def generator(self) -> torch.Generator:
        """The sampler's own generator on :attr:`device`."""
        return self.rng.generator

    @property
    def device(self) -> torch.device:
        return self.index.device

    def manual_seed(self, seed: int) -> None:
        """Seed the generator. Raises TypeError / ValueError for a seed outside ``[-2**63, 2**64)``."""
        self.rng.manual_seed(seed)

    def get_rng_state(self) -> dict[str, Tensor | None]:
        """``{"generator": CPU uint8 tensor, "device_rng": None}``, to replay the draws with :meth:`set_rng_state`."""
        return {"generator": self.rng.generator.get_state(), "device_rng": None}

    def set_rng_state(self, state: dict[str, Tensor | None]) -> None:
        """Restore a :meth:`get_rng_state` result. Raises TypeError / ValueError for another dict; nothing changes."""
        check_rng_state(state)
        self.rng.generator.set_state(state["generator"])

    def __repr__(self) -> str:
        i = self.index
        return (f"{type(self).__name__}(capacity={i.slots}, num_slices={i.num_slices}, "
                f"slice_len={i.slice_len}, strict_length={i.strict_length}, device={i.device})")

    def add(self, index) -> None:  # the trajectory state follows mark_update (every write calls it)
        return None

    def extend(self, index) -> None:
        return None

    def mark_update(self, index, *, storage=None) -> None:
        """Slots ``index`` were just written: update the trajectory state (see the module docstring).

        Raises:
            ValueError: the storage's ``max_size`` is not this sampler's capacity.
        """
        if storage is None:
            return
        self.index.check_ring(storage)
        self.index.written(check_index(index, self.index.slots), storage)

    def check_signal(self, data) -> None:
        """Raise before a write of ``data`` that carries no trajectory marker (:meth:`SliceIndex.check_signal`)."""
        self.index.check_signal(data)

    def sample(self, storage, batch_size: int) -> tuple[Tensor, dict]:
        """Draw ``batch_size // T`` slices.

        Returns:
            ``(index, info)``: ``(batch_size,)`` int64 slots on :attr:`device`, slice after slice; ``info`` the
            markers of the module docstring (``(batch_size, 1)`` bool under ``truncated_key`` and its done /
            terminated keys; ``("collector", "mask")`` ``(batch_size,)`` with ``strict_length=False``).

        Raises:
            ValueError: ``batch_size`` not a multiple of the slice length / ``num_slices``; no valid slice.
            EmptyBufferError: the storage is empty.
        """
        T, num = self.index.prepare_draw(storage, batch_size)
        self.rng.follow()  # a buffer generator re-seeded in place replays the same slices
        start = self.index.starts.draw(self.index, self.rng, num, T)
        return self.index.expand(start, T, storage)

    def sample_gather(self, storage, batch_size: int, *, with_info: bool = False):
        """:meth:`sample`, and the batch with the info's entries set in it: ``(index, info, batch)``."""
        return slice_batch(storage, *self.sample(storage, batch_size), with_info)

    def probabilities(self, T: int | None = None) -> Tensor:
        """Exact ``P(s)`` of every slot as a start, ``(N,)`` float64 (host loop; for tests and diagnostics)."""
        i, N = self.index, self.index.slots
        starts = i.starts.leaves.view(-1)[:N].to(torch.float64).cpu()  # sync-ok: diagnostics
        ends = (i.end_leaves.view(-1)[:N] > 0).cpu()  # sync-ok: diagnostics
        valid = i.valid[:N].cpu()  # sync-ok: diagnostics
        k = starts.sum()
        p = torch.zeros(N, dtype=torch.float64)
        for s in torch.nonzero(starts).flatten().tolist():  # sync-ok: host copy (diagnostics)
            members = []
            j = s
            while True:
                members.append(j)
                if ends[j]:
                    break
                j = (j + 1) % N
            ok = [m for m in members if valid[m]]
            for m in ok:
                p[m] += 1.0 / (k * len(ok))
        return p

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        return stamp({"kind": type(self).__name__, "capacity": self.index.slots, "rng": self.rng.state(),
                      **self.index.state()}, "slice sampler", SLICE_SCHEMA_VERSION)

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raise what :meth:`load_state_dict` refuses, changing nothing.

        Raises:
            ValueError: another sampler kind or capacity, or missing / misshapen entries.
        """
        check_kind(state_dict, self)
        slots = self.index.slots
        if state_dict.get("kind") != type(self).__name__ or state_dict.get("capacity") != slots:
            raise ValueError(f"not a {type(self).__name__} checkpoint of capacity {slots} (kind "
                             f"{state_dict.get('kind')!r}, capacity {state_dict.get('capacity')!r})")
        self.index.check_state(state_dict)
        self.rng.check(state_dict.get("rng"))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (raises as :meth:`check_state_dict`, before anything changes)."""
        self.check_state_dict(state_dict)
        self.rng.load(state_dict["rng"])
        self.index.load_state(state_dict)

    def dumps(self, path) -> None:
        sampler_checkpoint.dump(path, self.state_dict())

    def loads(self, path) -> None:
        self.load_state_dict(sampler_checkpoint.load(path, self.index.device))

    def _empty(self) -> None:
        self.index.reset()


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
    :class:`~lightning_per.replay.slice_starts.PriorityStarts`), its priorities :attr:`core`.

    Args:
        max_capacity: the storage's ``max_size`` (slots N >= 1).
        alpha, beta, eps, reduction: as :class:`GPUPrioritizedSampler` / TorchRL.
        num_slices, slice_len, end_key, end_keys, traj_key, strict_length, truncated_key, init_key, span:
            as :class:`GPUSliceSampler`.
        slice_priority: ``"start"`` or ``"max"`` (above).
        device, backend, seed, stratified, weight_normalization, eager_graphs: as
            :class:`GPUPrioritizedSampler`.

    Raises:
        ValueError: a bad argument (named in the message); NotImplementedError: ``span`` other than False.

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
                 slice_len: int | None = None, end_key=None, end_keys=None, traj_key=None, strict_length: bool = True,
                 truncated_key=("next", "truncated"), init_key="is_init", span=False, slice_priority: str = "start",
                 device: torch.device | str | None = None, stratified: bool = True,
                 weight_normalization: str = "buffer", backend: str = "auto", seed: int | None = None,
                 eager_graphs: bool = True) -> None:
        check_bool("stratified", stratified)
        self.reduction, self.dtype = reduction, dtype
        #: the starts' priorities, draws, IS weights and random streams (:class:`PriorityCore`)
        self.core = new_core(type(self).__name__, max_capacity, alpha, beta, eps,
                             Proportional(stratified, True, weight_normalization), device=device, backend=backend,
                             seed=seed, dtype=dtype, eager_graphs=eager_graphs, max_priority_within_buffer=False)
        #: the trajectory state, the start mask and its starts rule (:class:`SliceIndex`)
        self.index = SliceIndex(max_capacity, starts=PriorityStarts(self.core, slice_priority),
                                compiled=self.core.compiled, owner=type(self).__name__, num_slices=num_slices,
                                slice_len=slice_len, end_key=end_key, end_keys=end_keys, traj_key=traj_key,
                                strict_length=strict_length, truncated_key=truncated_key, init_key=init_key, span=span)
        set_torchrl_attributes(self, self.index)
        self._fragmented_index, self._cache, self._gpu_device = None, {}, self.index.device  # TorchRL's, read by it

    def __getstate__(self) -> dict[str, Any]:
        """Pickle / ``copy.deepcopy`` state (what a ``spawn``ed process receives): the attributes, the core and the
        index pickling themselves (TorchRL's prioritized samplers refuse to)."""
        return self.__dict__.copy()

    def __repr__(self) -> str:
        c, i = self.core, self.index
        return (f"{type(self).__name__}(max_capacity={c.capacity}, alpha={c.alpha}, beta={c.beta}, "
                f"eps={c.state.eps}, num_slices={i.num_slices}, slice_len={i.slice_len}, "
                f"strict_length={i.strict_length}, slice_priority={i.starts.rule!r}, device={c.device})")

    @property
    def _rng(self) -> torch.Generator | None:
        return self.core.rng.buffer

    @_rng.setter
    def _rng(self, generator: torch.Generator | None) -> None:
        self.core.rng.attach(generator)
        self.core.follow()

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

    @property
    def clamped_priority_count(self) -> Tensor:
        """0-d int64 device tensor: priorities received that were clamped (``state.n_clamped``)."""
        return self.core.state.n_clamped

    @property
    def dropped_index_count(self) -> Tensor:
        """0-d int64 device tensor: device-side indices that were ignored (``state.n_dropped``)."""
        return self.core.state.n_dropped

    def device_state(self) -> list[Tensor]:
        """The device tensors draws read and writes change (:meth:`PriorityState.tensors`)."""
        return list(self.core.state.tensors())

    def get_rng_state(self) -> dict[str, Tensor | None]:
        """The state of every random stream the draws use (:meth:`PriorityCore.get_rng_state`)."""
        return self.core.get_rng_state()

    def set_rng_state(self, state: dict[str, Tensor | None]) -> None:
        """Restore a :meth:`get_rng_state` result (raises as :meth:`PriorityCore.set_rng_state`)."""
        self.core.set_rng_state(state)

    def manual_seed(self, seed: int) -> None:
        """Seed the generator and the compiled draws' counters (raises TypeError / ValueError for a bad seed)."""
        self.core.manual_seed(seed)

    def draw_generators(self, batch_size: int) -> tuple[torch.Generator, ...]:
        """The generators a draw of ``batch_size`` consumes (:meth:`PriorityCore.draw_generators`)."""
        return self.core.draw_generators(batch_size)

    def capture_problem(self, storage) -> str | None:
        """None: the draws and priority writes run on the device from device state."""
        return None

    def probabilities(self) -> Tensor:
        """Exact P(s) of every slot as a start, ``(N,)`` float64 on :attr:`device`."""
        return self.core.probabilities()

    # ------------------------------------------------------------------ TorchRL's calls
    def update_priority(self, index, priority, *, storage=None, live=None) -> None:
        """One raw priority per transition at slots ``index`` (as :meth:`GPUPrioritizedSampler.update_priority`,
        raising the same); the starts' stored values follow :attr:`index`'s starts rule."""
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
            self.index.check_ring(storage)
        mark_written(self.core, index, storage, type(self).__name__)
        if storage is not None:
            self.index.written(check_index(index, filled(self.core, storage, type(self).__name__)), storage)

    def mask_slots(self, valid: Tensor) -> None:
        """Take the probability mass of every slot where ``valid`` is False (:func:`mask_slots`)."""
        mask_slots(self.core, valid)

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
            ``(index, info)``: ``(batch_size,)`` int64 slots on :attr:`device`, slice after slice; ``info`` holds
            ``"priority_weight"`` ``(batch_size,)`` float32 (each slice's start weight on its ``T`` steps) and
            the markers of :meth:`GPUSliceSampler.sample`.

        Raises:
            As :meth:`GPUSliceSampler.sample`.
        """
        T, num = self.index.prepare_draw(storage, batch_size)
        start, weight = self.core.sample(num, len(storage))
        index, info = self.index.expand(start, T, storage)
        info["priority_weight"] = weight[:, None].expand(num, T).reshape(-1)
        return index, info

    def sample_gather(self, storage, batch_size: int, *, with_info: bool = False):
        """:meth:`sample`, and the batch with the info's entries set in it: ``(index, info, batch)``."""
        return slice_batch(storage, *self.sample(storage, batch_size), with_info)

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        return {**self.core.state_dict(type(self).__name__), **self.index.state(),
                "slice_priority": self.index.starts.rule}

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As :meth:`GPUPrioritizedSampler.check_state_dict`, and the trajectory state's entries.

        Raises:
            ValueError: the checkpoint is refused (the message names why).
        """
        check_kind(state_dict, self)
        self.core.check_state_dict(state_dict)
        if state_dict.get("kind") != type(self).__name__:
            raise ValueError(f"sampler checkpoint is from {state_dict.get('kind')!r}, not {type(self).__name__}")
        self.index.check_state(state_dict)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (raises as :meth:`check_state_dict`, before anything changes)."""
        self.check_state_dict(state_dict)
        self.core.load_state_dict(state_dict)  # plain values; the slice state then masks them
        self.index.load_state(state_dict)

    def dumps(self, path) -> None:
        dump(self.state_dict(), path)

    def loads(self, path) -> None:
        self.load_state_dict(sampler_checkpoint.load(path, self.core.device))

    def _empty(self) -> None:
        self.core.reset()
        self.index.reset()
