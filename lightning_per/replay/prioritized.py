"""GPUPrioritizedSampler: proportional prioritized replay kept entirely on the storage's device.

Proportional PER (Schaul et al. 2016, arXiv:1511.05952, section 3.3): ``P(i) = p_i^a / sum_k p_k^a``
with stored value ``(p_i + eps)^alpha`` (TorchRL's convention) and IS weights
``w_i = (P(i) / min_j P(j))^-beta`` (section 3.4, normalised over the filled buffer, or over the
batch as an option). Priorities live in a two-level flat array (see :mod:`lightning_per.ops.reference`):
a draw costs one scan over ``sqrt(N)`` block sums and one over a ``sqrt(N)`` block; an update
recomputes only the touched blocks *from their leaves* (no float drift, ever).

No method here synchronises with the host: ``len(storage)`` is a host int, every tensor op stays on
the device, and invalid input that can only be seen on the device is neutralised and counted instead
of raising (see :meth:`GPUPrioritizedSampler.update_priority`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch import Tensor
from torchrl.data.replay_buffers.samplers import PrioritizedSampler

from lightning_per.graphs.eager import EagerGraphs
from lightning_per.ops import block_size_for, select_backend
from lightning_per.replay import priority as core
from lightning_per.replay.draws import PriorityDraws
from lightning_per.replay.errors import (
    check_bool,
    check_capacity,
    check_draw,
    check_eps,
    check_exponent,
    check_index,
    check_index_priority,
    check_seed,
)
from lightning_per.replay.fused import FusedGather
from lightning_per.replay.prioritized_checkpoint import PrioritizedCheckpoint
from lightning_per.replay.priority import PriorityState
from lightning_per.replay.slots import flat_slots, skip_unkept, unravel, written_slots
from lightning_per.replay.storage import resolve_device

__all__ = ["GPUPrioritizedSampler"]



class GPUPrioritizedSampler(PriorityDraws, FusedGather, PrioritizedCheckpoint, PrioritizedSampler):
    """Proportional prioritized sampler whose priorities, draws and IS weights stay on ``device``.

    A drop-in for :class:`torchrl.data.PrioritizedSampler` (it subclasses it, so TorchRL's
    ``isinstance`` checks hold) that needs no ``torchrl._torchrl`` extension.

    Args:
        max_capacity: number of slots N (>= 1), the storage's ``max_size``.
        alpha: priority exponent (>= 0); settable, exactly (raw priorities are kept). With ``eps``, bounded so that
            every stored value ``(p + eps)^alpha`` is a normal float32: ``eps^alpha`` must not underflow and
            ``(1 + eps)^alpha`` (the default priority's) must not overflow (see ``check_exponent``).
        beta: IS-weight exponent (>= 0); settable (e.g. by a TorchRL ``ParameterScheduler``).
        eps: added to raw priorities before the exponent (> 0 keeps every stored value positive); at most
            ``min(FLOAT32_MAX, FLOAT32_MAX**(1/alpha) - 1)`` (:func:`~lightning_per.replay.errors.eps_limit`:
            the default priority 1 must store a finite value). Raw priorities whose stored value would overflow
            float32 are lowered to the largest that does not and counted in :attr:`clamped_priority_count`.
        device: where priorities live; default the CUDA device when available, else CPU.
        stratified: one draw per equal-mass segment (default) or i.i.d. draws.
        shuffle_strata: with ``stratified``, return the draws in a uniformly random order (default): a device-side
            permutation of the strata (the ranks of ``B`` random keys, no sync), so any part of a batch is
            distributed as any other (exchangeable, as TorchRL's i.i.d. draws); with the compiled kernels and
            ``B <= 1024`` the keys and uniforms come from their device RNG (one launch, no generator for a CUDA
            graph to register: what a capture made by others, such as tensordict's ``CudaGraphModule``, needs;
            draws from :attr:`generator` raise a RuntimeError naming it there). ``False`` returns them in stratum
            order, i.e. sorted by slot (one launch less).
        weight_normalization: ``"buffer"`` (TorchRL's, by min_j P(j)) or ``"batch"`` (by the batch max).
        backend: ``"auto"``, ``"reference"`` or ``"kernels"`` (see :func:`lightning_per.ops.select_backend`).
        seed: seed of the device generator when no buffer generator is set (default: drawn from
            torch's default CPU generator, so ``torch.manual_seed`` makes runs reproducible). With the
            compiled kernels the draws take their uniforms inside the sample kernel from a Philox stream
            keyed by the generator's seed (its counters in device memory, restarted whenever the sampler
            is seeded, saved in ``state_dict``; see :meth:`get_rng_state`): one launch less per draw and
            nothing to register with a CUDA graph. The same seed then gives other draws than the reference
            ops (which use ``torch.rand``); each backend is reproducible on its own.
        eager_graphs: on CUDA, serve repeated eager calls of one shape (a draw of B slots, with or without
            the row gather; a priority write of B slots into a full buffer, and the default priorities an
            extend of B items writes there) by replaying a CUDA graph
            recorded at the second such call: one launch instead of several, same results, fresh outputs
            (a call's outputs of one dtype share an allocation; see :mod:`lightning_per.graphs.eager`).
            The first capture of each shape synchronises the device once. Ignored on CPU, under
            ``torch.compile``, inside an outer CUDA-graph capture and during a capture's warm-up. The
            rank-based sampler serves its re-sort + draw too, once the buffer is full.

    Repeated indices in one :meth:`update_priority` call: the value given *last* wins.

    Memory: raw ``float32`` + stored ``float32`` per slot, plus ``O(sqrt(N))`` block sums; with the compiled
    kernels also the large writes' ``int32`` last-writer scratch per slot.

    Raises:
        ValueError: a bad argument (named in the message, with the range it must lie in).
        TypeError: a flag (``stratified``, ``shuffle_strata``, ``eager_graphs``, ``max_priority_within_buffer``)
            that is not a bool, or an exponent that is not a number.

    Example::

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import TensorDictReplayBuffer
        >>> from lightning_per import GPUPrioritizedSampler
        >>> from lightning_per.replay import GPURoundRobinWriter, GPUTensorStorage
        >>> sampler = GPUPrioritizedSampler(4, alpha=1.0, beta=1.0, device="cpu", seed=0)
        >>> rb = TensorDictReplayBuffer(storage=GPUTensorStorage(4, device="cpu"), sampler=sampler,
        ...                             writer=GPURoundRobinWriter(), batch_size=8)
        >>> _ = rb.extend(TensorDict({"reward": torch.arange(4.0)}, [4]))
        >>> sampler.update_priority(torch.arange(4), torch.tensor([1.0, 1.0, 1.0, 3.0]))
        >>> index, info = sampler.sample(rb.storage, 8)  # P = (1/6, 1/6, 1/6, 1/2), one draw per 1/8 of mass
        >>> int((index == 3).sum())
        4
        >>> # IS weights (P(i) / min_j P(j))^-beta: 1/3 for slot 3, 1 for the others
        >>> torch.allclose(info["priority_weight"], torch.where(index == 3, 1 / 3, 1.0))
        True
    """

    #: Whether this class's draws (:meth:`_draw`, :meth:`_draw_gather`) may take their uniforms from the compiled
    #: kernels' device RNG (a subclass with its own draw sets False).
    _uses_device_rng = True

    def __init__(self, max_capacity: int, alpha: float, beta: float, eps: float = 1e-8, *,
                 device: torch.device | str | None = None, stratified: bool = True,
                 weight_normalization: str = "buffer", backend: str = "auto", seed: int | None = None,
                 dtype: torch.dtype = torch.float32, reduction: str = "max", eager_graphs: bool = True,
                 max_priority_within_buffer: bool = False, shuffle_strata: bool = True) -> None:
        check_capacity("max_capacity", max_capacity)
        for name, flag in (("stratified", stratified), ("shuffle_strata", shuffle_strata),
                           ("eager_graphs", eager_graphs), ("max_priority_within_buffer", max_priority_within_buffer)):
            check_bool(name, flag)
        alpha = check_exponent("alpha", alpha)
        eps = check_eps(eps, alpha)  # (1 + eps)^alpha, the default priority's stored value, must be finite
        alpha, beta = check_exponent("alpha", alpha, eps=eps), check_exponent("beta", beta)
        check_seed(seed)
        if weight_normalization not in ("buffer", "batch"):
            raise ValueError(f"weight_normalization must be 'buffer' or 'batch', got {weight_normalization!r}")
        if dtype != torch.float32:
            raise ValueError(f"dtype: priorities are stored in float32 (sums in float64), got {dtype}")
        self._max_capacity = max_capacity
        self._alpha, self._beta, self._eps = float(alpha), float(beta), float(eps)
        self.reduction = reduction
        self.dtype = dtype
        self.stratified = stratified
        self.shuffle_strata = shuffle_strata
        self.weight_normalization = weight_normalization
        self._max_priority_within_buffer = max_priority_within_buffer
        self._device = resolve_device(device)
        self._backend = backend
        self._ops = select_backend(self._device, backend)
        self.block = block_size_for(max_capacity + 1)
        self.n_blocks = -(-(max_capacity + 1) // self.block)  # slot N is the trash slot (always 0)
        self._init_rng(seed)
        self._graphs = EagerGraphs() if eager_graphs and self._device.type == "cuda" else None
        #: the storage's ``slot_valid`` mask once a write showed one (``FrameStackStorage``), else None
        self._slot_valid: Tensor | None = None
        new_rng_state = getattr(self._ops, "new_rng_state", None)
        # the compiled draws' RNG state (seed, one counter per draw position; ``ext.philox.device_uniform``),
        # seeded from :attr:`generator`; None when the draws use ``torch.rand`` (reference ops, rank sampler)
        rng = (new_rng_state(self.generator.initial_seed(), self._device)
               if new_rng_state is not None and self._uses_device_rng else None)
        self._init(rng)

    # ------------------------------------------------------------------ state
    def _init(self, rng: Tensor | None = None) -> None:
        """A fresh :class:`~lightning_per.replay.priority.PriorityState` (no priority written); the device RNG
        state is kept (``rng`` at construction)."""
        old = self.__dict__.get("_state")
        #: the explicit device state every operation reads and writes (:mod:`lightning_per.replay.priority`)
        self._state = PriorityState.empty(self._max_capacity, block=self.block, alpha=self._alpha, beta=self._beta,
                                          eps=self._eps, device=self._device,
                                          rng=old.rng if old is not None else rng)
        prepare = getattr(self._ops, "prepare_write", None)  # compiled backend: its write's counters, now
        if prepare is not None:
            prepare(self._state.leaves)
        if getattr(self, "_graphs", None) is not None:
            self._graphs.clear()  # they point at the tensors just replaced

    # the state's tensors under the names code written against this class reads (tests, diagnostics)
    _raw = property(lambda self: self._state.raw)
    _leaves = property(lambda self: self._state.leaves)
    _block_sum = property(lambda self: self._state.block_sum)
    _block_min = property(lambda self: self._state.block_min)
    _max_raw = property(lambda self: self._state.max_raw)
    _n_clamped = property(lambda self: self._state.n_clamped)
    _n_dropped = property(lambda self: self._state.n_dropped)
    _alpha_t = property(lambda self: self._state.alpha)
    _beta_t = property(lambda self: self._state.beta)
    _raw_limit = property(lambda self: self._state.raw_limit)

    @property
    def _device_rng(self) -> Tensor | None:
        """The compiled draws' RNG state ``(1 + 65536,) int64`` (:attr:`PriorityState.rng`), or None."""
        state = self.__dict__.get("_state")
        return None if state is None else state.rng

    def _empty(self) -> None:
        self._init()

    def __getstate__(self) -> dict[str, Any]:
        """Pickle / ``copy.deepcopy`` state (also what a ``spawn``ed process receives): the generators as bytes
        (:meth:`DeviceRNGMixin.__getstate__ <lightning_per.replay._rng.DeviceRNGMixin.__getstate__>`), the
        compiled draws' device counters as a copy of their own (a draw advances them: a copy that shared them
        with the original would move the original's draws), and neither the backend module nor the cached CUDA
        graphs, which :meth:`__setstate__` selects and starts afresh. The priority tensors travel as tensors do
        (a ``spawn``ed process shares them, torch.multiprocessing's rule)."""
        state = super().__getstate__()
        if self._state.rng is not None:
            state["_state"] = dataclasses.replace(self._state, rng=self._state.rng.clone())
        state["_ops"] = None
        state["_graphs"] = self._graphs is not None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._ops = select_backend(self._device, self.__dict__.get("_backend", "auto"))
        self._graphs = EagerGraphs() if state["_graphs"] else None

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(max_capacity={self._max_capacity}, alpha={self._alpha}, "
                f"beta={self._beta}, eps={self._eps}, device={self._device}, block={self.block})")

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def max_size(self) -> int:
        return self._max_capacity

    @property
    def alpha(self) -> float:
        """Priority exponent; setting it re-transforms every stored value exactly, O(N) on the device."""
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        value = check_exponent("alpha", value, eps=self._eps)
        if value == self._alpha:
            return
        self._alpha = value
        self._state.raw_limit = core.raw_limit(value, self._eps)
        self._state.alpha.fill_(value)
        self._rebuild()

    @property
    def beta(self) -> float:
        """IS-weight exponent; also held in a device scalar so captured CUDA graphs see new values. Set it to a
        number or a 0-d tensor (e.g. from a TorchRL ``ParameterScheduler``; read as a number)."""
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        value = check_exponent("beta", value)
        if value == self._beta:  # annealing finished: no device write (one launch saved per update)
            return
        self._beta = value
        self._beta_t.fill_(self._beta)

    @property
    def default_priority(self) -> Tensor:
        """Raw priority given to new items: the running max raw priority (1.0 before any update).

        0-d float32 tensor on :attr:`device` (TorchRL's ``max_priority_within_buffer=False`` rule).
        """
        return core.default_priority(self._state.max_raw)

    _default_priority = staticmethod(core.default_priority)

    @property
    def _max_priority(self) -> tuple[Tensor | None, None]:
        """TorchRL's private ``(max raw priority, its slot)`` pair, for code written against TorchRL's sampler:
        ``(0-d float32 tensor, None)``, or ``(None, None)`` before any priority was written. Reads the device
        (a diagnostic, not for a training step); the slot is not tracked."""
        if bool(torch.isinf(self._max_raw)):  # sync-ok: a diagnostic accessor
            return None, None
        return self._max_raw.clone(), None

    @property
    def clamped_priority_count(self) -> Tensor:
        """0-d int64 device tensor: priorities received that were NaN, +/-Inf or negative, or finite but so large
        that ``(p + eps)^alpha`` would overflow float32 (alpha > 1; stored as the largest raw priority whose
        stored value is finite, see :func:`lightning_per.replay.priority.raw_limit`)."""
        return self._n_clamped

    @property
    def dropped_index_count(self) -> Tensor:
        """0-d int64 device tensor: device-side indices outside ``[0, len(storage))`` that were ignored."""
        return self._n_dropped

    def device_state(self) -> list[Tensor]:
        """The device tensors that sampling reads and priority updates write, in place
        (:meth:`PriorityState.tensors() <lightning_per.replay.priority.PriorityState.tensors>`): raw priorities
        ``(n_blocks * block,) float32``, stored values ``(n_blocks, block) float32``, block sums
        ``(n_blocks,) float64``, block minima ``(n_blocks,) float32``, the 0-d max raw priority and
        clamped / dropped counters, the 0-d alpha and beta, and with the compiled ops the draws' RNG state
        ``(1 + 65536,) int64`` (seed, counters). For snapshots around work that must leave no trace (e.g. a
        CUDA-graph warm-up, :class:`~lightning_per.graphs.CapturedUpdate`); restore them with ``copy_``."""
        return list(self._state.tensors())

    # ------------------------------------------------------------------ core
    def _filled(self, storage) -> int:
        """``len(storage)`` (the capacity without one), refused when the storage holds more than the sampler has
        slots for (e.g. a sampler of 5 under ``TensorDictReplayBuffer``'s default ``ListStorage(1000)``)."""
        if storage is None:
            return self._max_capacity
        n = len(storage)
        if n > self._max_capacity:
            raise ValueError(f"the storage holds {n} items but {type(self).__name__} has max_capacity="
                             f"{self._max_capacity} slots: give the sampler the storage's max_size "
                             f"({getattr(storage, 'max_size', n)})")
        return n

    def _rebuild(self) -> None:
        """Recompute every stored value and block reduction from the raw priorities (O(N))."""
        core.rebuild(self._ops, self._state)

    def _write(self, index: Tensor, raw: Tensor, n_valid: int, valid: Tensor | None = None) -> None:
        """Store raw priorities ``raw`` ``(B,)`` at slots ``index`` ``(B,)`` (both on the device):
        :func:`lightning_per.replay.priority.write` (``valid``: its optional mask of slots whose stored value may
        be non-zero), served by a cached CUDA graph into a full ring; counted in
        :attr:`PriorityState.writes <lightning_per.replay.priority.PriorityState.writes>` once done."""
        if index.numel() == 0:  # e.g. extending with an empty batch: nothing to write
            pass
        elif n_valid == self._max_capacity and index.device == raw.device and index.device.type == "cuda":
            # a full ring: n_valid is fixed, so the call shape is (B, eps, masked)
            masked = valid is not None
            self._served(("write", index.numel(), self._eps, self._state.raw_limit, masked),
                         functools.partial(self._write_full, valid=valid), (index, raw),
                         (*self._state.tensors(), valid) if masked else self._state.tensors())
        else:
            core.write(self._ops, self._state, index, raw, n_valid, valid)
            if self._max_priority_within_buffer:
                core.max_within_buffer(self._state)
        self._state.writes += 1

    def _write_full(self, index: Tensor, raw: Tensor, valid: Tensor | None = None) -> None:
        """:meth:`_write` into a full ring (every slot filled): what its cached graphs record."""
        core.write(self._ops, self._state, index, raw, self._max_capacity, valid)
        if self._max_priority_within_buffer:
            core.max_within_buffer(self._state)

    def update_priority(self, index, priority, *, storage=None) -> None:
        """Set raw priorities (usually ``|td_error|``) of ``index``; stored as ``(p + eps)^alpha``.

        Args:
            index: ``(B,)`` integer slots (tensor on any device, int or sequence).
            priority: ``(B,)`` raw priorities, or one number/0-d tensor for all.
            storage: the buffer's storage (gives the filled length); TorchRL passes it.

        Host-side input (CPU tensors, ints, lists) is fully validated before anything changes.
        Device-side index values outside ``[0, len(storage))`` are ignored and counted in
        :attr:`dropped_index_count`; NaN/Inf/negative priorities are clamped (see
        :func:`lightning_per.ops.sanitize_priority`) and counted in :attr:`clamped_priority_count`.
        While a CUDA graph captures the call, the bound is the capacity (``len(storage)`` would be frozen at
        its value of the capture): pass indices the sampler drew there.

        Raises:
            TypeError: non-integer ``index`` or non-numeric ``priority``.
            ValueError: ``priority`` shape does not match ``index``.
            IndexError: a host-side index outside ``[0, len(storage))``.
        """
        if isinstance(priority, Tensor) and priority.requires_grad and torch.is_grad_enabled():
            with torch.no_grad():  # the stored priorities never join an autograd graph
                return self.update_priority(index, priority, storage=storage)
        n_valid = self._filled(storage)
        if n_valid < self._max_capacity and isinstance(index, Tensor) and index.is_cuda and (
                torch.cuda.is_current_stream_capturing()):
            # a CUDA graph would freeze the host length len(storage) of the capture, and drop the writes to slots
            # filled after it; the slots a capture writes come from the sampler: always filled ones
            n_valid = self._max_capacity
        index = flat_slots(index, storage)
        index, priority = check_index_priority(index, priority, n_valid)
        device = self._device
        if index.device != device:
            index = index.to(device, non_blocking=True)
        if priority.device != device:
            priority = priority.to(device, non_blocking=True)
        if self._slot_valid is not None:  # invalid slots stay without mass: sent out of range (dropped)
            inside = index.clamp(0, self._max_capacity - 1)
            index = index.where(self._slot_valid[inside], -1)
        self._write(index, priority, n_valid)

    def mark_update(self, index, *, storage=None) -> None:
        """Give slots ``index`` (just written) the default priority (the running max); then, when ``storage``
        has a device ``slot_valid`` mask (:class:`~lightning_per.replay.frames.FrameStackStorage`), take the
        probability mass of every slot it marks invalid (:meth:`mask_slots`).

        Host-side ``-1`` entries (items a writer such as TorchRL's ``TensorDictMaxValueWriter`` did not keep) are
        skipped, as TorchRL's sampler does. On a storage of ``ndim > 1`` a 1-D ``index`` names written rows
        along dim 0 (the round-robin writer's): every item of those rows gets the default priority."""
        self._mark_update(index, storage)
        valid = getattr(storage, "slot_valid", None)
        if valid is not None:
            self.mask_slots(valid)

    def mask_slots(self, valid: Tensor) -> None:
        """Zero the stored priority of every slot where ``valid`` ``(max_capacity,) bool`` (on :attr:`device`) is
        False, so no draw returns it and the buffer-normalised IS weights ignore it; later
        :meth:`update_priority` calls skip those slots (counted in :attr:`dropped_index_count`), until a write
        of the slot makes it valid again. One O(N) pass on the device, no host synchronisation; ``valid`` is
        kept by reference (its owner updates it in place).

        Raises:
            ValueError: ``valid`` is not a ``(max_capacity,)`` bool tensor on :attr:`device`.
        """
        if not (isinstance(valid, Tensor) and valid.dtype == torch.bool and valid.shape == (self._max_capacity,)
                and valid.device.type == self._device.type):
            raise ValueError(f"valid must be a ({self._max_capacity},) bool tensor on {self._device}, got "
                             f"{getattr(valid, 'dtype', type(valid).__name__)} {tuple(getattr(valid, 'shape', ()))}")
        self._slot_valid = valid
        core.mask(self._ops, self._state, valid)

    def _mark_update(self, index, storage) -> None:
        n_valid = self._filled(storage)
        index = skip_unkept(written_slots(index, storage))
        index = check_index(index, n_valid)
        if index.device != self._device:
            index = index.to(self._device, non_blocking=True)
        if n_valid == self._max_capacity and index.device.type == "cuda" and index.numel():
            # a full ring (every extend once the buffer has filled): the default priority is computed in the
            # cached graph too, so the call copies only the slots in
            self._served(("mark", index.numel(), self._eps, self._state.raw_limit), self._mark_full, (index,),
                         self._state.tensors())
            return
        # one op: the default priority of each new slot, a fresh contiguous (B,) tensor
        self._write(index, core.default_priority(self._state.max_raw.expand(index.shape)), n_valid)

    def _mark_full(self, index: Tensor) -> None:
        """:meth:`mark_update` into a full ring: the default priority, then :meth:`_write_full`."""
        self._write_full(index, core.default_priority(self._state.max_raw.expand(index.shape)))

    def add(self, index) -> None:  # new items get their priority through mark_update
        return None

    def extend(self, index) -> None:
        return None

    def sample(self, storage, batch_size: int) -> tuple[Tensor, dict[str, Tensor]]:
        """Draw ``batch_size`` slots with probability P(i) and their IS weights (no autograd context
        needed: nothing here requires grad).

        Returns:
            ``(index, {"priority_weight": w})``: ``(B,)`` int64 and ``(B,)`` float32, on :attr:`device`.

        Raises:
            ValueError: ``batch_size`` is not an int >= 1.
            EmptyBufferError (a ValueError and RuntimeError): the storage is empty.
        """
        check_draw(storage, batch_size)
        self._follow_buffer_rng()
        index, weight = self._served(("sample", batch_size, self.stratified, self.weight_normalization),
                                     lambda: self._draw(batch_size), (), self._draw_state(batch_size),
                                     self.draw_generators(batch_size))
        return unravel(index, storage), {"priority_weight": weight}

    #: this class's proportional draw: a subclass whose ``sample`` is another one never fuses the gather
    _proportional_sample = sample

    def _served(self, key: Hashable, fn: Callable, args: tuple[Tensor, ...] = (), state: tuple[Tensor, ...] = (),
                generators: tuple[torch.Generator, ...] = ()):
        """``fn(*args)``, served by a cached CUDA graph of ``key`` when :attr:`_graphs` exists (``eager_graphs``
        on CUDA) and the call is plain eager (:meth:`EagerGraphs.run` documents the other arguments)."""
        graphs = self._graphs
        if graphs is not None and graphs.active():
            return graphs.run(key, fn, args, state, generators)
        return fn(*args)

    def capture_problem(self, storage) -> str | None:
        """None: draws and priority updates run on the device from device state, so a CUDA graph can record them
        (:class:`lightning_per.graphs.CapturableSampler`)."""
        return None

    def probabilities(self) -> Tensor:
        """Exact P(i) of every slot, ``(N,)`` float64 on :attr:`device` (for tests and diagnostics)."""
        return core.probabilities(self._state)
