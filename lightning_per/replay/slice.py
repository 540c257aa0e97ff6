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

The ring must be written round-robin (consecutive slots, as TorchRL's and our writers do): the sampler reads
the slots of each write from ``mark_update`` and derives the write head from them, on the device.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchrl.data.replay_buffers.samplers import PrioritizedSliceSampler, SliceSampler

from lightning_per.ops import reference, select_backend
from lightning_per.replay import sampler_checkpoint
from lightning_per.replay._rng import SamplerRNG, check_rng_state
from lightning_per.replay.errors import check_capacity, check_exponent, check_index, check_kind
from lightning_per.replay.prioritized import GPUPrioritizedSampler
from lightning_per.replay.slice_index import SLICE_SCHEMA_VERSION, SliceIndex
from lightning_per.replay.slice_ops import reduce_touched
from lightning_per.replay.storage import resolve_device
from lightning_per.schema import stamp

__all__ = ["GPUSliceSampler", "GPUPrioritizedSliceSampler", "SLICE_PRIORITY_RULES"]

#: How :class:`GPUPrioritizedSliceSampler` turns transition priorities into a start's priority.
SLICE_PRIORITY_RULES = ("start", "max")


class GPUSliceSampler(SliceIndex, SliceSampler):
    """Uniform slices of trajectories, drawn on ``device``: TorchRL's :class:`~torchrl.data.SliceSampler` rule.

    A trajectory uniformly among those with a valid start, then a start uniformly among its valid starts,
    so ``P(s) = 1 / (K n_k)``; the batch holds ``num_slices`` slices of ``T`` consecutive slots, slice after
    slice (``T = slice_len``, or ``batch_size // num_slices``). Subclasses TorchRL's class (``isinstance``
    holds); needs no host scan of the storage per draw (see :mod:`lightning_per.replay.slice`).

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
        self._device = resolve_device(device)
        self._init_slices(capacity, num_slices=num_slices, slice_len=slice_len, end_key=end_key, end_keys=end_keys,
                          traj_key=traj_key, strict_length=strict_length, truncated_key=truncated_key,
                          init_key=init_key, span=span)
        self._backend = backend
        self._ops = select_backend(self._device, backend)
        self._slice_compiled = self._ops is not reference
        self._init_fns()
        #: the sampler's generator, driven by the buffer's (:class:`~lightning_per.replay._rng.SamplerRNG`)
        self.rng = SamplerRNG(self._device, seed, type(self).__name__)
        self._init_starts()

    def __getstate__(self) -> dict[str, Any]:
        """Pickle / ``copy.deepcopy`` state (also what a ``spawn``ed process receives): the generators as bytes,
        without the backend module, which :meth:`__setstate__` selects afresh."""
        state = super().__getstate__()
        state["_ops"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        state["_ops"] = select_backend(state["_device"], state["_backend"])
        super().__setstate__(state)

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

    def _init_starts(self) -> None:
        nb, blk, d = self.slice_blocks, self.slice_block, self._device
        self._start_leaves = torch.zeros(nb, blk, dtype=torch.float32, device=d)  # 1 at usable trajectory starts
        self._start_bsum = torch.zeros(nb, dtype=torch.float64, device=d)
        self._start_bmin = torch.full((nb,), float("inf"), dtype=torch.float32, device=d)

    @property
    def device(self) -> torch.device:
        return self._device

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(capacity={self._slots}, num_slices={self.num_slices}, "
                f"slice_len={self.slice_len}, strict_length={self.strict_length}, device={self._device})")

    def _starts_changed(self, start: Tensor) -> None:
        ends = self._end_leaves.view(-1)
        first = ends[(start - 1) % self._slots] > 0  # the slot before is an end: a trajectory's first slot
        self._start_leaves.view(-1)[start] = (self._valid[start] & first).to(torch.float32)
        reduce_touched(self._start_leaves, self._start_bsum, self._start_bmin, start)

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
        T, num = self._prepare_draw(storage, batch_size)
        self.rng.follow()  # a buffer generator re-seeded in place replays the same slices
        u = self.rng.rand((num,))
        first, _ = self._ops.sample_proportional(self._start_leaves, self._start_bsum, self._start_bmin, u, 0.0,
                                                 False, "buffer")
        pick = self.rng.rand((num,))
        start = self._uniform_starts(first, pick, self._end_leaves, self._end_bsum, self._slots, T)
        return self._expand(start, T, storage)

    def probabilities(self, T: int | None = None) -> Tensor:
        """Exact ``P(s)`` of every slot as a start, ``(N,)`` float64 (host loop; for tests and diagnostics)."""
        starts = self._start_leaves.view(-1)[: self._slots].to(torch.float64).cpu()  # sync-ok: diagnostics
        ends = (self._end_leaves.view(-1)[: self._slots] > 0).cpu()  # sync-ok: diagnostics
        valid = self._valid[: self._slots].cpu()  # sync-ok: diagnostics
        k = starts.sum()
        p = torch.zeros(self._slots, dtype=torch.float64)
        N = self._slots
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
        return stamp({"kind": type(self).__name__, "capacity": self._slots, "rng": self.rng.state(),
                      **self._slice_state()}, "slice sampler", SLICE_SCHEMA_VERSION)

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raise what :meth:`load_state_dict` refuses, changing nothing.

        Raises:
            ValueError: another sampler kind or capacity, or missing / misshapen entries.
        """
        check_kind(state_dict, self)
        if state_dict.get("kind") != type(self).__name__ or state_dict.get("capacity") != self._slots:
            raise ValueError(f"not a {type(self).__name__} checkpoint of capacity {self._slots} (kind "
                             f"{state_dict.get('kind')!r}, capacity {state_dict.get('capacity')!r})")
        self._check_slice_state(state_dict)
        self.rng.check(state_dict.get("rng"))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (raises as :meth:`check_state_dict`, before anything changes)."""
        self.check_state_dict(state_dict)
        self.rng.load(state_dict["rng"])
        self._load_slice_state(state_dict)

    def dumps(self, path) -> None:
        sampler_checkpoint.dump(path, self.state_dict())

    def loads(self, path) -> None:
        self.load_state_dict(sampler_checkpoint.load(path, self._device))

    def _empty(self) -> None:
        self._init_slice_state()
        self._init_starts()


class GPUPrioritizedSliceSampler(SliceIndex, GPUPrioritizedSampler, PrioritizedSliceSampler):
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
        if slice_priority not in SLICE_PRIORITY_RULES:
            raise ValueError(f"slice_priority must be one of {SLICE_PRIORITY_RULES}, got {slice_priority!r}")
        self.slice_priority = slice_priority
        self._device = resolve_device(device)
        check_capacity("max_capacity", max_capacity)
        self._init_slices(max_capacity, num_slices=num_slices, slice_len=slice_len, end_key=end_key,
                          end_keys=end_keys, traj_key=traj_key, strict_length=strict_length,
                          truncated_key=truncated_key, init_key=init_key, span=span)
        GPUPrioritizedSampler.__init__(self, max_capacity, alpha, beta, eps, device=device, stratified=stratified,
                                       weight_normalization=weight_normalization, backend=backend, seed=seed,
                                       dtype=dtype, reduction=reduction, eager_graphs=eager_graphs)
        self._slice_compiled = self.core.compiled
        self._init_fns()

    def __repr__(self) -> str:
        c = self.core
        return (f"{type(self).__name__}(max_capacity={c.capacity}, alpha={c.alpha}, beta={c.beta}, "
                f"eps={c.state.eps}, num_slices={self.num_slices}, slice_len={self.slice_len}, "
                f"strict_length={self.strict_length}, slice_priority={self.slice_priority!r}, device={self._device})")

    # ------------------------------------------------------------------ leaves = value * valid
    def _start_values(self, start: Tensor) -> Tensor:
        """Stored values ``(p + eps)^alpha`` of the starts ``start`` ``(S,)`` under :attr:`slice_priority`."""
        if self.slice_priority == "start" or self._T is None or self._T == 1:
            raw = self.core.state.raw[start]
        else:
            T, N = self._T, self._slots
            window = (start[:, None] + torch.arange(T, device=start.device)) % N
            ends = (self._end_leaves.view(-1)[window] > 0).to(torch.int32)
            member = (torch.cumsum(ends, 1) - ends) == 0
            raw = self.core.state.raw[window].masked_fill(~member, 0.0).amax(1)
        state = self.core.state
        return self.core.ops.transform_priority(raw, state.alpha, state.eps)

    def _starts_changed(self, start: Tensor) -> None:
        state = self.core.state
        flat = state.leaves.view(-1)
        flat[start] = torch.where(self._valid[start], self._start_values(start), torch.zeros((), device=start.device))
        reduce_touched(state.leaves, state.block_sum, state.block_min, start)

    @property
    def alpha(self) -> float:
        """Priority exponent; setting it re-transforms every start's stored value exactly, O(N) on the device."""
        return self.core.alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        value = check_exponent("alpha", value, eps=self.core.state.eps)
        if value == self.core.alpha:
            return
        self.core.set_alpha(value)
        if self._T is not None:
            self._starts_changed(torch.arange(self._slots, device=self._device))

    def _store(self, index: Tensor, raw: Tensor, n_valid: int) -> None:
        """The proportional sampler's write of raw priorities ``raw`` at slots ``index`` (both ``(B,)`` on the
        device), keeping the stored value of every slot that cannot start a slice at 0.

        ``"start"``: one fused write masked by the start mask (such a slot keeps its raw priority, which the running
        max folds in, and stores the value 0; nothing else recomputed). ``"max"``: the plain write, then the
        ``B * T`` starts whose slices hold the slots are recomputed.
        """
        if self._T is None or index.numel() == 0:  # no start mask yet: plain values (masked when it is built)
            return self.core.write(index, raw, n_valid)
        d, N = self._device, self._slots
        if self.slice_priority == "max" and self._T > 1:
            self.core.write(index, raw, n_valid)
            slots = index.clamp(0, N - 1)  # slots the write dropped: recomputing a valid one is harmless
            starts = (slots[:, None] - torch.arange(self._T, device=d)) % N
            self._starts_changed(starts.reshape(-1))
            return
        self.core.write(index, raw, n_valid, self._valid)

    def mark_update(self, index, *, storage=None) -> None:
        """New slots ``index`` get the default priority (the running max), then the trajectory state is updated
        (see the module docstring).

        Raises:
            ValueError: the storage's ``max_size`` is not this sampler's capacity.
        """
        if storage is not None:
            self._check_ring(storage)
        GPUPrioritizedSampler.mark_update(self, index, storage=storage)
        if storage is not None:
            self._slices_written(check_index(index, self._filled(storage)), storage)

    def sample(self, storage, batch_size: int) -> tuple[Tensor, dict]:
        """Draw ``batch_size // T`` slice starts by priority and expand them to slices.

        Returns:
            ``(index, info)``: ``(batch_size,)`` int64 slots on :attr:`device`, slice after slice; ``info`` holds
            ``"priority_weight"`` ``(batch_size,)`` float32 (each slice's start weight on its ``T`` steps) and
            the markers of :meth:`GPUSliceSampler.sample`.

        Raises:
            As :meth:`GPUSliceSampler.sample`.
        """
        T, num = self._prepare_draw(storage, batch_size)
        start, weight = self.core.sample(num, len(storage))
        index, info = self._expand(start, T, storage)
        info["priority_weight"] = weight[:, None].expand(num, T).reshape(-1)
        return index, info

    def probabilities(self) -> Tensor:
        """Exact P(s) of every slot as a start, ``(N,)`` float64 on :attr:`device`."""
        return super().probabilities()

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.update(self._slice_state())
        state["slice_priority"] = self.slice_priority
        return state

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As :meth:`GPUPrioritizedSampler.check_state_dict`, and the trajectory state's entries."""
        super().check_state_dict(state_dict)
        if state_dict.get("kind") != type(self).__name__:
            raise ValueError(f"sampler checkpoint is from {state_dict.get('kind')!r}, not {type(self).__name__}")
        self._check_slice_state(state_dict)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (raises as :meth:`check_state_dict`, before anything changes)."""
        self.check_state_dict(state_dict)
        self._T = None  # the base load rebuilds plain values; the slice state then masks them
        super().load_state_dict(state_dict)
        self._load_slice_state(state_dict)

    def _empty(self) -> None:
        super()._empty()
        self._init_slice_state()
