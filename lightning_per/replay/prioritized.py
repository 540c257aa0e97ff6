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

import json
import math
import os
import warnings
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torchrl.data.replay_buffers.samplers import PrioritizedSampler

from lightning_per.graphs.eager import EagerGraphs
from lightning_per.ops import block_size_for, select_backend
from lightning_per.replay import priority as core
from lightning_per.replay._rng import DeviceRNGMixin, _fingerprint, check_rng_state
from lightning_per.replay.errors import (
    EmptyBufferError,
    check_batch_size,
    check_exponent,
    check_index,
    check_index_priority,
    check_kind,
    check_seed,
)
from lightning_per.replay.priority import PriorityState
from lightning_per.replay.rows import set_all
from lightning_per.replay.storage import GPUTensorStorage, resolve_device

__all__ = ["GPUPrioritizedSampler"]

SAMPLER_SCHEMA_VERSION = 1
#: Largest batch whose strata permutation is ranked by one ``(B, B)`` comparison (two fully parallel kernels;
#: no sort kernel, which for a short row runs in a single thread block); larger batches argsort their keys.
RANK_PERMUTATION_MAX = 1024
FUSED_GATHER_MAX_WORDS = 1024
"""Widest packed row (int64 words, i.e. 8 KiB) that :meth:`GPUPrioritizedSampler.sample_gather` copies inside
the sample kernel (one program per draw copies its row); wider rows, e.g. Atari frame stacks, are gathered by
a separate kernel."""


class GPUPrioritizedSampler(DeviceRNGMixin, PrioritizedSampler):
    """Proportional prioritized sampler whose priorities, draws and IS weights stay on ``device``.

    A drop-in for :class:`torchrl.data.PrioritizedSampler` (it subclasses it, so TorchRL's
    ``isinstance`` checks hold) that needs no ``torchrl._torchrl`` extension.

    Args:
        max_capacity: number of slots N (>= 1), the storage's ``max_size``.
        alpha: priority exponent (>= 0); settable, exactly (raw priorities are kept).
        beta: IS-weight exponent (>= 0); settable (e.g. by a TorchRL ``ParameterScheduler``).
        eps: added to raw priorities before the exponent (> 0 keeps every stored value positive).
        device: where priorities live; default the CUDA device when available, else CPU.
        stratified: one draw per equal-mass segment (default) or i.i.d. draws.
        shuffle_strata: with ``stratified``, return the draws in a uniformly random order (default): a device-side
            permutation of the strata (the ranks of ``B`` random keys, no sync), so any part of a batch is
            distributed as any other (exchangeable, as TorchRL's i.i.d. draws). ``False`` returns them in stratum
            order, i.e. sorted by slot, and lets the compiled kernels draw their own uniforms (one launch less,
            and no generator for a CUDA graph to register: what a capture made by others, such as tensordict's
            ``CudaGraphModule``, needs; the shuffled draws raise a RuntimeError naming :attr:`generator` there).
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

    Memory: raw ``float32`` + stored ``float32`` per slot, plus ``O(sqrt(N))`` block sums.

    Raises:
        ValueError: a bad argument (named in the message).

    Example::

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import TensorDictReplayBuffer
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
        if not isinstance(max_capacity, int) or max_capacity < 1:
            raise ValueError(f"max_capacity must be an int >= 1, got {max_capacity!r}")
        if isinstance(eps, bool) or not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
            raise ValueError(f"eps must be a finite number > 0, got {eps!r}")
        alpha, beta = check_exponent("alpha", alpha, eps=float(eps)), check_exponent("beta", beta)
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
        self.shuffle_strata = bool(shuffle_strata)
        self.weight_normalization = weight_normalization
        self._max_priority_within_buffer = bool(max_priority_within_buffer)
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
        # the compiled draws' RNG state (seed, one counter per draw position; ``ext.sample._device_uniform``),
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
        """Pickle / ``copy.deepcopy`` state: everything but the backend module and the cached CUDA graphs, which
        :meth:`__setstate__` selects and starts afresh (also when handed to a spawned process)."""
        state = self.__dict__.copy()
        state["_ops"] = None
        state["_graphs"] = self._graphs is not None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
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
        return len(storage) if storage is not None else self._max_capacity

    def _rebuild(self) -> None:
        """Recompute every stored value and block reduction from the raw priorities (O(N))."""
        core.rebuild(self._ops, self._state)

    def _write(self, index: Tensor, raw: Tensor, n_valid: int) -> None:
        """Store raw priorities ``raw`` ``(B,)`` at slots ``index`` ``(B,)`` (both on the device):
        :func:`lightning_per.replay.priority.write`, served by a cached CUDA graph into a full ring; counted in
        :attr:`PriorityState.writes <lightning_per.replay.priority.PriorityState.writes>` once done."""
        if index.numel() == 0:  # e.g. extending with an empty batch: nothing to write
            pass
        elif n_valid == self._max_capacity and index.device == raw.device and index.device.type == "cuda":
            # a full ring: n_valid is fixed, so the call shape is (B, eps)
            self._served(("write", index.numel(), self._eps, self._state.raw_limit), self._write_full, (index, raw),
                         self._state.tensors())
        else:
            core.write(self._ops, self._state, index, raw, n_valid)
            if self._max_priority_within_buffer:
                core.max_within_buffer(self._state)
        self._state.writes += 1

    def _write_full(self, index: Tensor, raw: Tensor) -> None:
        """:meth:`_write` into a full ring (every slot valid): what its cached graphs record."""
        core.write(self._ops, self._state, index, raw, self._max_capacity)
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
        index = _flat_slots(index, storage)
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
        index = _skip_unkept(_written_slots(index, storage))
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
        self._check_draw(storage, batch_size)
        self._follow_buffer_rng()
        index, weight = self._served(("sample", batch_size, self.stratified, self.weight_normalization),
                                     lambda: self._draw(batch_size), (), self._draw_state(batch_size),
                                     self.draw_generators(batch_size))
        return _unravel(index, storage), {"priority_weight": weight}

    def _served(self, key: Hashable, fn: Callable, args: tuple[Tensor, ...] = (), state: tuple[Tensor, ...] = (),
                generators: tuple[torch.Generator, ...] = ()):
        """``fn(*args)``, served by a cached CUDA graph of ``key`` when :attr:`_graphs` exists (``eager_graphs``
        on CUDA) and the call is plain eager (:meth:`EagerGraphs.run` documents the other arguments)."""
        graphs = self._graphs
        if graphs is not None and graphs.active():
            return graphs.run(key, fn, args, state, generators)
        return fn(*args)

    def _check_draw(self, storage, batch_size: int) -> None:
        """The checks every draw makes: ``batch_size`` an int >= 1, a non-empty storage (errors as :meth:`sample`)."""
        check_batch_size(batch_size)
        if len(storage) == 0:
            raise EmptyBufferError("Cannot sample from an empty storage (the replay buffer holds no transition): "
                                   "extend it first")

    def _uniforms(self, batch_size: int) -> Tensor:
        """``(B,)`` float64 i.i.d. U[0, 1) draws from the sampler's generator on :attr:`device`."""
        return self._rand((batch_size,))

    def _unregistered_way(self) -> str:
        if self._device_rng is not None and self._shuffles():
            return ("build the sampler with shuffle_strata=False (with the compiled kernels its draws then take "
                    "their uniforms from counters in device memory: no generator to register)")
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
        (:attr:`_device_rng`, not while ``torch.compile`` traces), else from :attr:`generator`."""
        return (self._device_rng is not None and batch_size <= self._ops.DEVICE_RNG_DRAWS
                and not self._shuffles() and not torch.compiler.is_compiling())

    def _draw(self, batch_size: int) -> tuple[Tensor, Tensor]:
        """``(index (B,) int64, weight (B,) float32)``: uniforms, then the search and the IS weights
        (:func:`lightning_per.replay.priority.sample`)."""
        if self._device_draws(batch_size):  # one launch: the kernel draws its uniforms
            return core.sample(self._ops, self._state, batch_size, self.stratified, self.weight_normalization)
        u, stratified = self._draw_uniforms(batch_size)
        return core.sample(self._ops, self._state, u, stratified, self.weight_normalization)

    def _draw_gather(self, batch_size: int, rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(batch rows (B, W) int64, index (B,) int64, weight (B,) float32)``: :meth:`_draw` and the rows
        of the drawn slots, one fused op (:func:`lightning_per.replay.priority.sample_gather`; rows first: the
        cached graphs' outputs start with them)."""
        if self._device_draws(batch_size):
            return core.sample_gather(self._ops, self._state, batch_size, rows, self.stratified,
                                          self.weight_normalization)
        u, stratified = self._draw_uniforms(batch_size)
        return core.sample_gather(self._ops, self._state, u, rows, stratified, self.weight_normalization)

    def _draw_state(self, batch_size: int) -> tuple[Tensor, ...]:
        """The device tensors a draw reads or writes (besides a generator): the whole state."""
        return self._state.tensors()

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

    def capture_problem(self, storage) -> str | None:
        """None: draws and priority updates run on the device from device state, so a CUDA graph can record them
        (:class:`lightning_per.graphs.CapturableSampler`)."""
        return None

    def draw_generators(self, batch_size: int) -> tuple[torch.Generator, ...]:
        """The torch generators a draw of ``batch_size`` consumes: what a CUDA graph that records such draws must
        register (none when the compiled kernels draw the uniforms themselves; registering a generator costs
        every replay a host-to-device update of its seed and offset)."""
        return () if self._device_draws(batch_size) else (self.generator,)

    def _fusable_rows(self, storage) -> Tensor | None:
        """The storage's packed ring when a fused sample + gather can read it (packed, flat keys, on this
        sampler's device; ``cuda`` stands for the current CUDA device) and :meth:`sample` is this class's
        proportional draw (a subclass that overrides it, e.g. the rank-based sampler, never fuses), else None."""
        if type(self).sample is not GPUPrioritizedSampler.sample:
            return None
        rows = getattr(storage, "gather_rows", None)
        if rows is None or not hasattr(storage, "rows_to_batch"):
            return None
        if rows.shape[1] > FUSED_GATHER_MAX_WORDS:  # wide rows (pixels): a separate gather spreads each row
            return None                             # over many thread blocks; one program per row would not
        have, want = rows.device, self._device
        if have.type != want.type or (want.index is not None and have.index != want.index) or (
                want.index is None and have.type == "cuda" and have.index != torch.cuda.current_device()):
            return None
        return rows

    def sample_gather(self, storage, batch_size: int, *,
                      with_info: bool = False) -> tuple[Tensor, dict[str, Tensor], Any]:
        """:meth:`sample`, and the batch: ``(index, info, batch)``, with ``batch`` the TensorDict ``[B]``
        that ``storage.get(index)`` returns.

        With a packed :class:`~lightning_per.replay.GPUTensorStorage` (flat keys, rows of at most
        :data:`FUSED_GATHER_MAX_WORDS` int64 words) on this sampler's device the draw and the row gather are
        one op (``sample_proportional_gather``: one kernel launch with the compiled backend) and the batch's
        fields are views of the gathered rows
        (:meth:`GPUTensorStorage.rows_to_batch`); otherwise :meth:`sample` then ``storage.get(index)``.
        Either way the same generator draws give the same index, weights and batch values.

        Args:
            storage: the buffer's storage.
            batch_size: B >= 1.
            with_info: also put ``"index"`` and ``"priority_weight"`` in the batch (the replay buffer's keys).

        Returns:
            ``index`` ``(B,)`` int64 and ``info`` ``{"priority_weight": (B,) float32}`` on :attr:`device`, as
            :meth:`sample`; ``batch`` a TensorDict ``[B]`` on the storage's device (packed: its fields are
            views into one gathered ``(B, W)`` int64 block).

        Raises:
            As :meth:`sample`.
        """
        rows = self._fusable_rows(storage)
        if rows is None:
            index, info = self.sample(storage, batch_size)
            extra = {"index": index, "priority_weight": info["priority_weight"]} if with_info else None
            if isinstance(storage, GPUTensorStorage):  # the batch built once, with the extra keys
                return index, info, storage._read(index, extra)
            return index, info, set_all(storage.get(index), extra)
        self._check_draw(storage, batch_size)
        self._follow_buffer_rng()
        block, index, weight = self._served(("gather", batch_size, self.stratified, self.weight_normalization),
                                            lambda: self._draw_gather(batch_size, rows), (),
                                            (*self._draw_state(batch_size), rows), self.draw_generators(batch_size))
        extra = {"index": index, "priority_weight": weight} if with_info else None
        return index, {"priority_weight": weight}, storage.rows_to_batch(block, extra)

    def probabilities(self) -> Tensor:
        """Exact P(i) of every slot, ``(N,)`` float64 on :attr:`device` (for tests and diagnostics)."""
        return core.probabilities(self._state)

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        return {
            "_schema_version": SAMPLER_SCHEMA_VERSION,
            "kind": type(self).__name__,
            "max_capacity": self._max_capacity,
            "alpha": self._alpha, "beta": float(self._beta), "eps": self._eps,  # sync-ok: a device beta, saving
            "raw": self._raw.clone(), "max_raw": self._max_raw.clone(),
            "n_clamped": self._n_clamped.clone(), "n_dropped": self._n_dropped.clone(),
            "written": (self._leaves.view(-1) > 0).clone(),
            "rng": self._rng_state(),
            "device_rng": None if self._device_rng is None else self._device_rng.clone(),
        }

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raise what :meth:`load_state_dict` refuses, changing nothing (the replay buffer checks every part of
        a checkpoint this way before it loads any): another sampler kind, schema or ``max_capacity``, and
        missing or misshapen entries, which the load would otherwise meet half-way through. Host work only.

        Raises:
            ValueError: the checkpoint is refused (the message names why).
        """
        check_kind(state_dict, self)
        if "max_capacity" not in state_dict:
            raise ValueError(f"not a prioritized sampler checkpoint (keys {sorted(map(str, state_dict))})")
        version = state_dict.get("_schema_version", 0)
        if version != SAMPLER_SCHEMA_VERSION:
            raise ValueError(f"sampler checkpoint schema {version} is not {SAMPLER_SCHEMA_VERSION}")
        if state_dict["max_capacity"] != self._max_capacity:
            raise ValueError(f"checkpoint max_capacity {state_dict['max_capacity']} differs from "
                             f"this sampler's {self._max_capacity}")
        numbers, scalars = ("eps", "alpha", "beta"), ("max_raw", "n_clamped", "n_dropped")
        missing = sorted(k for k in (*numbers, *scalars, "raw", "written", "rng") if k not in state_dict)
        if missing:
            raise ValueError(f"prioritized sampler checkpoint lacks {missing}")
        for key in numbers:
            if isinstance(state_dict[key], bool) or not isinstance(state_dict[key], (int, float)):
                raise ValueError(f"sampler checkpoint's {key!r} must be a number, got {type(state_dict[key]).__name__}")
        if not (math.isfinite(state_dict["eps"]) and state_dict["eps"] > 0):
            raise ValueError(f"sampler checkpoint's 'eps' must be a finite number > 0, got {state_dict['eps']!r}")
        try:
            check_exponent("alpha", state_dict["alpha"], eps=float(state_dict["eps"]))
            check_exponent("beta", state_dict["beta"])
        except (TypeError, ValueError) as err:
            raise ValueError(f"sampler checkpoint's {err}") from None
        shapes = {"raw": self._raw.shape, "written": self._raw.shape, **{key: torch.Size([]) for key in scalars}}
        for key, shape in shapes.items():
            value = state_dict[key]
            if not isinstance(value, Tensor) or value.shape != shape:
                got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
                raise ValueError(f"sampler checkpoint's {key!r} must be a tensor of shape {tuple(shape)}, got {got}")
        raw = state_dict["raw"]
        if not bool(((raw >= 0) & torch.isfinite(raw)).all()):  # sync-ok: checkpoint load, not a step
            raise ValueError("sampler checkpoint's raw priorities must be finite and >= 0 (every write sanitizes "
                             "them): the checkpoint is corrupted")
        self._check_rng_checkpoint(state_dict["rng"])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (in place).

        Raises:
            ValueError: as :meth:`check_state_dict`, before anything changes.
        """
        self.check_state_dict(state_dict)
        d = self._device
        self._eps = float(state_dict["eps"])
        self._alpha, self._beta = float(state_dict["alpha"]), float(state_dict["beta"])
        self._state.eps, self._state.raw_limit = self._eps, core.raw_limit(self._alpha, self._eps)
        self._alpha_t.fill_(self._alpha)
        self._beta_t.fill_(self._beta)
        self._raw.copy_(state_dict["raw"].to(d))
        self._max_raw.copy_(state_dict["max_raw"].to(d))
        self._n_clamped.copy_(state_dict["n_clamped"].to(d))
        self._n_dropped.copy_(state_dict["n_dropped"].to(d))
        self._leaves.view(-1).copy_(state_dict["written"].to(d).to(torch.float32))  # mask, then values
        self._rebuild()
        self._load_rng_state(state_dict["rng"])
        if self._device_rng is not None:  # the draws' stream as saved
            saved = state_dict.get("device_rng")
            if saved is not None and saved.shape == self._device_rng.shape:
                self._device_rng.copy_(saved.to(d))
            else:  # a checkpoint without it (older, or from the reference ops): a stream of its own, not a restart
                warnings.warn("sampler checkpoint has no 'device_rng' (the compiled draws' random state): seeding "
                              "it from the restored generator's state; the draws differ from the original run's",
                              RuntimeWarning, stacklevel=2)
                self._seeded(_fingerprint(self.generator))

    def dumps(self, path: str | os.PathLike) -> None:
        """Write the state to ``path/sampler.pt`` (whole tensors, atomic rename) + a JSON summary."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), path / "sampler.pt.tmp")
        os.replace(path / "sampler.pt.tmp", path / "sampler.pt")
        meta = {"kind": type(self).__name__, "alpha": self._alpha, "beta": float(self._beta), "eps": self._eps,
                "max_capacity": self._max_capacity, "_schema_version": SAMPLER_SCHEMA_VERSION}
        (path / "sampler_metadata.json").write_text(json.dumps(meta))

    def loads(self, path: str | os.PathLike) -> None:
        self.load_state_dict(torch.load(Path(path) / "sampler.pt", map_location=self._device, weights_only=True))


def _flat_slots(index, storage):
    """``index`` as flat slots: a tuple of per-dimension indices or an ``(B, ndim)`` tensor on a storage of
    ``ndim > 1`` (what :meth:`GPUPrioritizedSampler.sample` returns there) becomes ``(B,)`` row-major slots."""
    ndim = getattr(storage, "ndim", 1) if storage is not None else 1
    if ndim <= 1:
        return index
    if isinstance(index, tuple):
        index = torch.stack([torch.as_tensor(i) for i in index], -1)
    if isinstance(index, Tensor) and index.ndim > 1 and index.shape[-1] == ndim:
        shape = storage.shape
        strides = [1] * ndim
        for d in range(ndim - 2, -1, -1):
            strides[d] = strides[d + 1] * shape[d + 1]
        index = (index * torch.as_tensor(strides, device=index.device)).sum(-1)
    return index


def _written_slots(index, storage):
    """:meth:`GPUPrioritizedSampler.mark_update`'s slots: on a storage of ``ndim > 1`` a 1-D ``index`` of written
    rows (dim 0) becomes the flat slots of every item in those rows; else ``index`` itself (see
    :func:`_flat_slots`)."""
    ndim = getattr(storage, "ndim", 1) if storage is not None else 1
    if ndim <= 1:
        return index
    if isinstance(index, int):
        index = torch.tensor([index])
    if isinstance(index, Tensor) and index.ndim <= 1 and storage.shape is not None:
        per_row = storage.shape[1:].numel()
        rows = index.reshape(-1, 1)
        flat = rows * per_row + torch.arange(per_row, device=index.device)
        return torch.where(rows >= 0, flat, -1).reshape(-1)
    return _flat_slots(index, storage)


def _skip_unkept(index):
    """``index`` without its host-side ``-1`` entries (items a writer did not keep); device indices unchanged
    (an out-of-range device index is dropped and counted by the write itself, without a sync)."""
    if isinstance(index, int):
        return index if index != -1 else torch.empty(0, dtype=torch.long)
    if isinstance(index, Tensor) and index.device.type == "cpu" and index.numel():
        keep = index != -1
        if not bool(keep.all()):  # sync-ok: a CPU tensor
            return index[keep]
    return index


def _unravel(index: Tensor, storage):
    """A draw's flat slots as the storage indexes them: unchanged for ``ndim == 1``, else the per-dimension
    tuple of ``torch.unravel_index`` over the storage's filled shape (TorchRL's samplers do the same)."""
    ndim = getattr(storage, "ndim", 1)
    if ndim <= 1:
        return index
    return torch.unravel_index(index, storage.shape)


def random_permutation(keys: Tensor) -> Tensor:
    """A uniformly random permutation of ``range(B)`` from ``B`` i.i.d. continuous keys: each key's rank (the
    number of keys below it), ``(B,)`` int64 on ``keys``' device, no host sync.

    The ranks of exchangeable keys are a uniformly random permutation (ties have probability ~2^-53 for
    float64 uniforms); up to :data:`RANK_PERMUTATION_MAX` keys they are counted by one ``(B, B)`` comparison
    and a row sum (no sort), beyond by ``argsort`` (whose result, the inverse of the ranks, is uniform too).

    Example::

        >>> import torch
        >>> random_permutation(torch.tensor([0.7, 0.1, 0.4]))
        tensor([2, 0, 1])
    """
    if keys.numel() > RANK_PERMUTATION_MAX:
        return keys.argsort()
    return (keys.unsqueeze(1) > keys).sum(1)
