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

from lightning_per.ops import block_size_for, reduce_blocks, reference, select_backend
from lightning_per.replay._rng import DeviceRNGMixin
from lightning_per.replay.errors import EmptyBufferError, check_batch_size, check_index, check_kind
from lightning_per.replay.prioritized import GPUPrioritizedSampler
from lightning_per.replay.rows import set_all
from lightning_per.replay.storage import GPUTensorStorage, resolve_device

__all__ = ["GPUSliceSampler", "GPUPrioritizedSliceSampler", "SLICE_PRIORITY_RULES"]

SLICE_SCHEMA_VERSION = 1
#: How :class:`GPUPrioritizedSliceSampler` turns transition priorities into a start's priority.
SLICE_PRIORITY_RULES = ("start", "max")
_CHUNK = 1 << 22  # starts recomputed per pass by a rebuild
_ONE_LAUNCH = 1024  # the largest priority write the compiled kernels do in one launch (ext.update.MAX_ONE_LAUNCH)
_AUTO_TRAJ_KEYS = (("collector", "traj_ids"), "episode")  # what TorchRL probes when no key is given


def _replace_last(key, last: str):
    return (*key[:-1], last) if isinstance(key, tuple) else last


def _ring_tensor(storage, key) -> Tensor | None:
    """The stored ``(N, ...)`` tensor of ``key`` (a TorchRL tensor storage's TensorDict), or None."""
    data = getattr(storage, "_storage", None)
    if data is None or not hasattr(data, "get"):
        return None
    try:
        return data.get(key, None)
    except (KeyError, TypeError):
        return None


def _reduce_touched(leaves: Tensor, block_sum: Tensor, block_min: Tensor | None, pos: Tensor) -> None:
    """Recompute the sums (and minima) of the blocks of ``leaves`` ``(nb, blk)`` holding slots ``pos`` ``(K,)``
    from their leaves: per touched block, or in one O(N) pass when ``K`` reaches the number of blocks."""
    if pos.numel() >= leaves.shape[0]:
        total, low = reduce_blocks(leaves)
        block_sum.copy_(total)
        if block_min is not None:
            block_min.copy_(low)
        return
    rows = torch.div(pos, leaves.shape[1], rounding_mode="floor")
    total, low = reduce_blocks(leaves[rows])  # a block touched twice gets the same values twice
    block_sum[rows] = total
    if block_min is not None:
        block_min[rows] = low


def next_end(end_leaves: Tensor, end_bsum: Tensor, pos: Tensor) -> Tensor:
    """The first effective end at or after each slot ``pos`` ``(B,)`` int64, cyclically: ``(B,)`` int64.

    ``end_leaves`` ``(nb, blk)`` float32 holds 1.0 at ends, ``end_bsum`` ``(nb,)`` float64 its row sums. The
    count of ends before ``pos`` (block prefix + row prefix) is ``k``; the answer is the ``(k + 1)``-th end (the
    first one when none follows ``pos``): a two-level inverse-CDF search for ``k + 0.5``.
    """
    blk = end_leaves.shape[1]
    cdf = torch.cumsum(end_bsum, 0)  # [nb] float64
    row = torch.div(pos, blk, rounding_mode="floor")
    offset = pos - row * blk
    before = (cdf - end_bsum)[row] + (end_leaves[row] * (torch.arange(blk, device=pos.device) < offset[:, None])
                                      ).sum(1, dtype=torch.float64)
    target = torch.where(before >= cdf[-1] - 0.5, torch.zeros_like(before), before) + 0.5
    b = torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.numel() - 1)
    rest = target - (cdf - end_bsum)[b]
    row_cdf = torch.cumsum(end_leaves[b], 1, dtype=torch.float64)
    j = torch.searchsorted(row_cdf, rest.unsqueeze(1), right=True).squeeze(1).clamp_(max=blk - 1)
    return b * blk + j


def uniform_starts(first: Tensor, pick: Tensor, end_leaves: Tensor, end_bsum: Tensor, n: int, T: int) -> Tensor:
    """TorchRL's uniform start inside each drawn trajectory: ``first`` ``(S,)`` its first slot, ``pick`` ``(S,)``
    float64 U[0, 1); ``n_k = max(L_k - T + 1, 1)`` starts; returns ``(S,)`` int64 slots."""
    length = (next_end(end_leaves, end_bsum, first) - first) % n + 1  # [S] trajectory lengths
    n_starts = (length - T + 1).clamp_min(1)
    return (first + (pick * n_starts).floor().to(torch.int64).clamp_max(n_starts - 1)) % n


def slice_steps(start: Tensor, ends: Tensor, n: int, T: int, done: Tensor | None, terminated: Tensor | None,
                init: Tensor | None) -> tuple[Tensor, ...]:
    """The slots and markers of the slices starting at ``start`` ``(S,)`` (``ends``: ``(>= n,)`` float32
    effective end flags; ``done`` / ``terminated`` / ``init``: the stored ``(n, ...)`` flags or None).

    Returns:
        ``index (S*T,) int64`` (a short slice repeats its last slot), ``member (S*T,) bool`` (real steps),
        ``last (S*T, 1) bool`` (each slice's last real step), ``done | last``, ``terminated``, ``init | first``
        (``(S*T, 1)`` bool; None where the stored flag is None).
    """
    offsets = torch.arange(T, device=start.device)
    window = (start[:, None] + offsets) % n  # [S, T]
    e = (ends[window] > 0).to(torch.int32)
    member = (torch.cumsum(e, 1) - e) == 0  # no end before step j: inside the slice
    length = member.sum(1, keepdim=True)  # [S, 1]
    index = ((start[:, None] + torch.minimum(offsets, length - 1)) % n).reshape(-1)
    last = (offsets == length - 1).reshape(-1, 1)
    done_out = last if done is None else done[index].reshape(-1, 1).bool() | last
    term_out = torch.zeros_like(last) if terminated is None else terminated[index].reshape(-1, 1).bool()
    init_out = None
    if init is not None:
        got = init[index]
        first = (offsets == 0).expand(start.shape[0], T).reshape(-1)
        init_out = got | first.reshape(first.shape + (1,) * (got.dim() - 1))
    return index, member.reshape(-1), last, done_out, term_out, init_out


def hidden_raw(index: Tensor, raw: Tensor, valid: Tensor, n_valid: int, n: int, trash: int, max_raw: Tensor,
               raw_store: Tensor, n_dropped: Tensor, scratch: Tensor) -> Tensor:
    """The part of a ``"start"``-rule write the fused write does not do (:meth:`GPUPrioritizedSliceSampler._write`):
    the slots of ``index`` that cannot start a slice keep their cleaned raw priority (last write wins) in
    ``raw_store`` and are not counted as dropped (``scratch``: ``(n,)`` int32 for the last writers).
    Returns the write's slots (those slots sent to ``trash``) and the
    largest of their cleaned priorities, for the running max once the write (which cleans with the running max
    as it was) is done."""
    inside = (index >= 0) & (index < n_valid)
    hidden = inside & ~valid[index.clamp(0, n - 1)]  # written, but no slice starts there
    default = torch.nan_to_num(max_raw, nan=float("nan"), posinf=1.0, neginf=1.0)
    clean, _ = reference.sanitize_priority(raw, default)
    positions = torch.arange(index.numel(), dtype=torch.int32, device=index.device)
    last = clean[reference.last_writer(index.clamp(0, n - 1), scratch, positions)]  # each slot's last value
    raw_store.index_put_((torch.where(hidden, index, trash),), torch.where(hidden, last, 0.0))
    n_dropped -= hidden.sum()
    return torch.where(hidden, trash, index), torch.where(hidden, clean, float("-inf")).amax()


_COMPILED: dict[str, Any] = {}


def _device_fn(name: str, fn, device: torch.device, compiled: bool):
    """``fn`` as is (CPU, the reference), or compiled once by ``torch.compile`` (CUDA with the compiled kernels:
    its elementwise steps fused into a few kernels)."""
    if not compiled or device.type != "cuda":
        return fn
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile(fn, dynamic=False)
    return _COMPILED[name]


def _has_key(storage, key) -> bool:
    data = getattr(storage, "_storage", None)
    if data is None or not hasattr(data, "keys"):
        return False
    return key in data.keys(include_nested=True, leaves_only=True) or (
        isinstance(key, tuple) and len(key) == 1 and key[0] in data.keys())


class _SliceIndex:
    """The trajectory bookkeeping both slice samplers share (device state; see the module docstring)."""

    _device: torch.device

    # ------------------------------------------------------------------ construction
    def _init_slices(self, capacity: int, *, num_slices, slice_len, end_key, end_keys, traj_key, strict_length,
                     truncated_key, init_key, span) -> None:
        if (num_slices is None) == (slice_len is None):
            raise ValueError(f"give exactly one of num_slices and slice_len, got num_slices={num_slices!r} and "
                             f"slice_len={slice_len!r}")
        for name, value in (("num_slices", num_slices), ("slice_len", slice_len)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if end_key is not None and end_keys is not None:
            raise ValueError("end_key and end_keys are exclusive: give the single end flag as end_key, or the "
                             "flags to OR together as end_keys")
        if end_keys is not None and not len(end_keys):
            raise ValueError("end_keys must name at least one key")
        if span not in (False, 0, (False, False), (0, 0), (False, 0), (0, False)):
            raise NotImplementedError(f"span={span!r}: slices that run past a trajectory's ends are not supported "
                                      f"by the GPU slice samplers (span=False only)")
        # TorchRL's SliceSampler attributes (its methods and __repr__ read them)
        self.num_slices, self.slice_len = num_slices, slice_len
        self.end_key = end_key if end_key is not None or end_keys is not None else ("next", "done")
        self.end_keys = tuple(end_keys) if end_keys is not None else None
        self.traj_key = traj_key
        self.truncated_key, self.init_key = truncated_key, init_key
        self.strict_length = bool(strict_length)
        self.span = (False, False)
        self.step_key, self.fragmented, self._fragmented_index = None, False, None
        self.cache_values, self._cache, self.pad_output, self.compile = False, {}, not strict_length, False
        self.use_gpu, self._gpu_device = self._device.type == "cuda", self._device
        self._auto_traj_key = traj_key is None and end_key is None and end_keys is None
        self._signal: tuple[str, Any] | None = None  # ("traj", key) or ("end", keys), resolved at the first write
        n = self._slots = capacity
        self.slice_block = block_size_for(n + 1)
        self.slice_blocks = -(-(n + 1) // self.slice_block)
        self._T: int | None = slice_len  # the slice length the start mask is built for (host int)
        self._checked = False  # a valid start was seen since the mask was last rebuilt (see _check_valid)
        self._init_slice_state()

    def _init_slice_state(self) -> None:
        d, n, nb, blk = self._device, self._slots, self.slice_blocks, self.slice_block
        self._raw_end = torch.zeros(n, dtype=torch.bool, device=d)  # the stored end signal
        self._traj_ids = torch.zeros(n, dtype=torch.int64, device=d)  # traj_key values (trajectory ids mode)
        self._end_leaves = torch.ones(nb, blk, dtype=torch.float32, device=d)  # effective ends (1.0)
        self._end_leaves.view(-1)[n:] = 0  # padding slots are no ends (the search never returns them)
        self._end_bsum = self._end_leaves.sum(1, dtype=torch.float64)
        self._valid = torch.zeros(nb * blk, dtype=torch.bool, device=d)
        self._last = torch.full((), -1, dtype=torch.int64, device=d)  # last written slot
        self._n_filled = 0  # host: len(storage) after the last write seen
        self._checked = False

    # ------------------------------------------------------------------ writes
    def _resolve_signal(self, storage) -> None:
        """Which stored key marks trajectories (host, once): ``traj_key``, else (no key given) TorchRL's probe
        of ``("collector", "traj_ids")`` then ``"episode"``, else ``end_keys`` / ``end_key``.

        Raises:
            KeyError: none of them is in the storage (the message names the arguments).
        """
        if self.traj_key is not None and _has_key(storage, self.traj_key):
            self._signal = ("traj", self.traj_key)
            return
        if self._auto_traj_key:
            for key in _AUTO_TRAJ_KEYS:
                if _has_key(storage, key):
                    self._signal = ("traj", key)
                    return
        keys = self.end_keys if self.end_keys is not None else (self.end_key,)
        present = tuple(k for k in keys if _has_key(storage, k))
        if present:
            self._signal = ("end", present)
            return
        wanted = (f"traj_key={self.traj_key!r}" if self.traj_key is not None else
                  f"end_keys={list(keys)!r}" if self.end_keys is not None else f"end_key={self.end_key!r}")
        raise KeyError(f"{type(self).__name__}: the stored data has no trajectory marker: {wanted} is not among "
                       f"its keys (give end_key, end_keys or traj_key naming a stored entry)")

    def check_signal(self, data) -> None:
        """Raise before a write of ``data`` (a TensorDict ``[n]``) that carries no trajectory marker this sampler
        can read (see :meth:`_resolve_signal`), changing nothing. The replay buffer calls it before writing.

        Raises:
            KeyError: no ``traj_key`` / ``end_key`` / ``end_keys`` entry in ``data``.
        """
        keys = set(data.keys(include_nested=True, leaves_only=True))
        if self._signal is not None:
            wanted = (self._signal[1],) if self._signal[0] == "traj" else self._signal[1]
            if any(k in keys for k in wanted):
                return
        else:
            candidates = ([self.traj_key] if self.traj_key is not None else []) + (
                list(_AUTO_TRAJ_KEYS) if self._auto_traj_key else []) + list(
                self.end_keys if self.end_keys is not None else (self.end_key,))
            if any(k in keys for k in candidates):
                return
        self._resolve_signal(_KeysOnly(keys))  # raises the named error

    def _slices_written(self, index: Tensor, storage) -> None:
        """The ring just took slots ``index`` ``(n,)`` (consecutive modulo N): new end flags, then the
        starts they affect (no host sync; ``n`` and ``len(storage)`` are host ints)."""
        n = index.numel()
        if n == 0 or storage is None:
            return
        if self._signal is None:
            self._resolve_signal(storage)
        if index.device != self._device:
            index = index.to(self._device, non_blocking=True)
        N = self._slots
        if n > N:
            index = index[-N:]  # a batch longer than the ring: its last N items survive
            n = N
        kind, key = self._signal
        if kind == "traj":
            self._traj_ids[index] = _ring_tensor(storage, key)[index].reshape(n, -1)[:, 0].to(torch.int64)
            pos = (index[0] - 1 + torch.arange(n + 1, device=self._device)) % N  # c-1 .. c+n-1
            self._raw_end[pos] = self._traj_ids[pos] != self._traj_ids[(pos + 1) % N]
        else:
            flag = None
            for k in key:
                value = _ring_tensor(storage, k)[index].reshape(n, -1).any(1)
                flag = value if flag is None else flag | value
            self._raw_end[index] = flag
            pos = (index[0] - 1 + torch.arange(n + 1, device=self._device)) % N
        self._last.copy_(index[-1])
        self._n_filled = len(storage)
        self._refresh_ends(pos)
        T = self._T
        if T is None:
            return
        if n + T >= N:
            self._refresh_all()
        else:
            self._refresh_starts(index[0] - (T - 1), n + T)

    # ------------------------------------------------------------------ derived state
    def _refresh_ends(self, pos: Tensor | None = None) -> None:
        """Effective end flags at slots ``pos`` (all when None): stored end, write head, or unfilled."""
        if pos is None:
            pos = torch.arange(self._slots, device=self._device)
        end = self._raw_end[pos] | (pos >= self._n_filled) | (pos == self._last)
        self._end_leaves.view(-1)[pos] = end.to(torch.float32)
        _reduce_touched(self._end_leaves, self._end_bsum, None, pos)

    def _refresh_all(self) -> None:
        self._refresh_ends()
        self._refresh_starts(0, self._slots)
        self._checked = False

    def _refresh_starts(self, first: Tensor | int, count: int) -> None:
        """Recompute the start mask at slots ``first .. first + count - 1`` (mod N, ``count <= N``)."""
        N, T, d = self._slots, self._T, self._device
        if count > _CHUNK:  # bounded temporaries (a full rebuild of 1e8 slots): pieces of _CHUNK starts
            for at in range(0, count, _CHUNK):
                self._refresh_starts(first + at, min(_CHUNK, count - at))
            return
        first = torch.as_tensor(first, device=d)
        start = (first + torch.arange(count, device=d)) % N  # [count]
        window = (first - 1 + torch.arange(count + T - 1, device=d)) % N  # pred of the first .. last window slot
        ends = self._end_leaves.view(-1)[window] > 0  # [count + T - 1]
        cum = torch.nn.functional.pad(torch.cumsum(ends, 0), (1, 0))  # [count + T]
        inside = cum[T:T + count] - cum[1:1 + count]  # ends among s .. s + T - 2
        fits = inside == 0
        if not self.strict_length:
            fits = fits | ends[:count]  # a trajectory's first slot: a shorter slice
        valid = fits & (start < self._n_filled)
        self._valid[start] = valid
        self._starts_changed(start)

    def _starts_changed(self, start: Tensor) -> None:
        """Hook: the start mask changed at slots ``start``; the sampler's leaves follow."""
        raise NotImplementedError

    def _slice_state(self) -> dict[str, Any]:
        return {"slice_schema": SLICE_SCHEMA_VERSION, "raw_end": self._raw_end.clone(),
                "traj_ids": self._traj_ids.clone(), "last": self._last.clone(), "filled": self._n_filled,
                "slice_T": self._T, "signal": self._signal}

    def _check_slice_state(self, state: dict[str, Any]) -> None:
        missing = sorted(k for k in ("slice_schema", "raw_end", "traj_ids", "last", "filled", "slice_T", "signal")
                         if k not in state)
        if missing:
            raise ValueError(f"slice sampler checkpoint lacks {missing}")
        if state["slice_schema"] != SLICE_SCHEMA_VERSION:
            raise ValueError(f"slice sampler checkpoint schema {state['slice_schema']} is not {SLICE_SCHEMA_VERSION}")
        for key in ("raw_end", "traj_ids"):
            value = state[key]
            if not isinstance(value, Tensor) or value.shape != (self._slots,):
                raise ValueError(f"slice sampler checkpoint's {key!r} must be a ({self._slots},) tensor")
        filled = state["filled"]
        if isinstance(filled, bool) or not isinstance(filled, int) or not 0 <= filled <= self._slots:
            raise ValueError(f"slice sampler checkpoint's 'filled' must be an int in [0, {self._slots}], "
                             f"got {filled!r}")

    def _load_slice_state(self, state: dict[str, Any]) -> None:
        self._raw_end.copy_(state["raw_end"].to(self._device))
        self._traj_ids.copy_(state["traj_ids"].to(self._device))
        self._last.copy_(state["last"].to(self._device))
        self._n_filled = state["filled"]
        self._signal = state["signal"]
        self._T = state["slice_T"] if self.slice_len is None else self.slice_len
        self._refresh_ends()
        if self._T is not None:
            self._refresh_all()

    # ------------------------------------------------------------------ draws
    def _slice_shape(self, batch_size: int) -> tuple[int, int]:
        """``(T, num_slices)`` for a batch of ``batch_size`` transitions.

        Raises:
            ValueError: ``batch_size`` is not a multiple of ``slice_len`` / ``num_slices`` (named).
        """
        check_batch_size(batch_size)
        if self.num_slices is not None:
            if batch_size % self.num_slices:
                raise ValueError(f"batch_size ({batch_size}) must be a multiple of num_slices ({self.num_slices})")
            return batch_size // self.num_slices, self.num_slices
        if batch_size % self.slice_len:
            raise ValueError(f"batch_size ({batch_size}) must be a multiple of slice_len ({self.slice_len})")
        return self.slice_len, batch_size // self.slice_len

    def _prepare_draw(self, storage, batch_size: int) -> tuple[int, int]:
        """Checks before a draw; (re)builds the start mask for a new slice length (host-decided)."""
        T, num = self._slice_shape(batch_size)
        if storage is None or len(storage) == 0:
            raise EmptyBufferError("Cannot sample from an empty storage (the replay buffer holds no transition): "
                                   "extend it first")
        if self._signal is None:
            self._resolve_signal(storage)
        if T != self._T:
            self._T = T
            self._refresh_all()
        if not self._checked:
            self._check_valid(T)
        self._follow_buffer_rng()  # a buffer generator re-seeded in place replays the same slices
        return T, num

    def _check_valid(self, T: int) -> None:
        """Raise unless some slot can start a slice. One host read, made once per start mask (after the mask
        is first built, or rebuilt for another slice length or a load); later draws trust it.

        Raises:
            ValueError: no trajectory holds ``T`` transitions under ``strict_length=True``.
        """
        if not bool(self._valid.any()):  # sync-ok: once per start mask, not per step (see the docstring)
            raise ValueError(f"no valid slice: every stored trajectory is shorter than the slice length {T} "
                             f"(slice_len / batch_size // num_slices) and strict_length=True; store longer "
                             f"trajectories or pass strict_length=False")
        self._checked = True

    def _init_fns(self) -> None:
        """The draw's steps: compiled on CUDA when the compiled kernels serve the draws (``torch.compile``, once per
        slice shape: the first draw of a shape compiles, outside any capture), else plain torch."""
        compiled = self._ops is not reference
        self._slice_steps = _device_fn("slice_steps", slice_steps, self._device, compiled)
        self._uniform_starts = _device_fn("uniform_starts", uniform_starts, self._device, compiled)
        self._hidden_raw = hidden_raw  # plain: the writes' batch sizes vary (a compile per size would stall them)

    def _expand(self, start: Tensor, T: int, storage) -> tuple[Tensor, dict[Any, Tensor]]:
        """Slots of the slices starting at ``start`` ``(S,)``: ``(index (S * T,) int64, info)``."""
        marks = self.truncated_key is not None
        done_key = _replace_last(self.truncated_key, "done") if marks else None
        terminated_key = _replace_last(self.truncated_key, "terminated") if marks else None
        init = _ring_tensor(storage, self.init_key) if self.init_key is not None else None
        index, member, last, done, terminated, init = self._slice_steps(
            start, self._end_leaves.view(-1), self._slots, T, _ring_tensor(storage, done_key) if marks else None,
            _ring_tensor(storage, terminated_key) if marks else None, init)
        info: dict[Any, Tensor] = {}
        if marks:
            info[self.truncated_key], info[done_key], info[terminated_key] = last, done, terminated
        if not self.strict_length:
            info[("collector", "mask")] = member
        if init is not None:
            info[self.init_key] = init
        return index, info

    def sample_gather(self, storage, batch_size: int, *, with_info: bool = False):
        """:meth:`sample`, and the batch ``storage[index]`` with the info's entries set in it (the replay buffer's
        direct path): ``(index, info, batch)``."""
        index, info = self.sample(storage, batch_size)
        extra = dict(info)
        if with_info:
            extra["index"] = index
        batch = storage._read(index) if isinstance(storage, GPUTensorStorage) else storage.get(index)
        return index, info, set_all(batch, extra)


class _KeysOnly:
    """A stand-in storage exposing only a key set (for :meth:`_SliceIndex.check_signal`)."""

    def __init__(self, keys) -> None:
        self._storage = self
        self._keys = keys

    def keys(self, include_nested: bool = True, leaves_only: bool = True):
        return self._keys


class GPUSliceSampler(_SliceIndex, DeviceRNGMixin, SliceSampler):
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

    Memory: ~2 bytes + 4 bytes (end flags) + 8 bytes (trajectory ids) per slot.

    Raises:
        ValueError: a bad argument (named in the message); NotImplementedError: ``span`` other than False.

    Example::

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import TensorDictReplayBuffer
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
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
        self._device = resolve_device(device)
        self._init_slices(capacity, num_slices=num_slices, slice_len=slice_len, end_key=end_key, end_keys=end_keys,
                          traj_key=traj_key, strict_length=strict_length, truncated_key=truncated_key,
                          init_key=init_key, span=span)
        self._ops = select_backend(self._device, backend)
        self._init_fns()
        self._init_rng(seed)
        self._init_starts()

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
        _reduce_touched(self._start_leaves, self._start_bsum, self._start_bmin, start)

    def mark_update(self, index, *, storage=None) -> None:
        """Slots ``index`` were just written: update the trajectory state (see the module docstring)."""
        if storage is None:
            return
        self._slices_written(check_index(index, self._slots), storage)

    def add(self, index) -> None:
        return None

    def extend(self, index) -> None:
        return None

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
        u = self._rand((num,))
        first, _ = self._ops.sample_proportional(self._start_leaves, self._start_bsum, self._start_bmin, u, 0.0,
                                                 False, "buffer")
        pick = self._rand((num,))
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
        return {"_schema_version": SLICE_SCHEMA_VERSION, "kind": type(self).__name__, "capacity": self._slots,
                "rng": self._rng_state(), **self._slice_state()}

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
        self._check_rng_checkpoint(state_dict.get("rng"))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (raises as :meth:`check_state_dict`, before anything changes)."""
        self.check_state_dict(state_dict)
        self._load_rng_state(state_dict["rng"])
        self._load_slice_state(state_dict)

    def dumps(self, path) -> None:
        from pathlib import Path
        Path(path).mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), Path(path) / "sampler.pt")

    def loads(self, path) -> None:
        from pathlib import Path
        self.load_state_dict(torch.load(Path(path) / "sampler.pt", map_location=self._device, weights_only=True))

    def _empty(self) -> None:
        self._init_slice_state()
        self._init_starts()


class GPUPrioritizedSliceSampler(_SliceIndex, GPUPrioritizedSampler, PrioritizedSliceSampler):
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

    _uses_device_rng = True

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
        if isinstance(max_capacity, bool) or not isinstance(max_capacity, int) or max_capacity < 1:
            raise ValueError(f"max_capacity must be an int >= 1, got {max_capacity!r}")
        self._init_slices(max_capacity, num_slices=num_slices, slice_len=slice_len, end_key=end_key,
                          end_keys=end_keys, traj_key=traj_key, strict_length=strict_length,
                          truncated_key=truncated_key, init_key=init_key, span=span)
        GPUPrioritizedSampler.__init__(self, max_capacity, alpha, beta, eps, device=device, stratified=stratified,
                                       weight_normalization=weight_normalization, backend=backend, seed=seed,
                                       dtype=dtype, reduction=reduction, eager_graphs=eager_graphs)
        self._init_fns()
        self._scratch = torch.zeros(max_capacity, dtype=torch.int32, device=self._device)  # a write's last writers

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(max_capacity={self._max_capacity}, alpha={self._alpha}, beta={self._beta}, "
                f"eps={self._eps}, num_slices={self.num_slices}, slice_len={self.slice_len}, "
                f"strict_length={self.strict_length}, slice_priority={self.slice_priority!r}, device={self._device})")

    # ------------------------------------------------------------------ leaves = value * valid
    def _start_values(self, start: Tensor) -> Tensor:
        """Stored values ``(p + eps)^alpha`` of the starts ``start`` ``(S,)`` under :attr:`slice_priority`."""
        if self.slice_priority == "start" or self._T is None or self._T == 1:
            raw = self._raw[start]
        else:
            T, N = self._T, self._slots
            window = (start[:, None] + torch.arange(T, device=start.device)) % N
            ends = (self._end_leaves.view(-1)[window] > 0).to(torch.int32)
            member = (torch.cumsum(ends, 1) - ends) == 0
            raw = self._raw[window].masked_fill(~member, 0.0).amax(1)
        return self._ops.transform_priority(raw, self._alpha_t, self._eps)

    def _starts_changed(self, start: Tensor) -> None:
        flat = self._leaves.view(-1)
        flat[start] = torch.where(self._valid[start], self._start_values(start), torch.zeros((), device=start.device))
        _reduce_touched(self._leaves, self._block_sum, self._block_min, start)

    def _write(self, index: Tensor, raw: Tensor, n_valid: int) -> None:
        """The proportional sampler's write of raw priorities ``raw`` at slots ``index`` (both ``(B,)`` on the
        device), keeping the stored value of every slot that cannot start a slice at 0.

        ``"start"``: such slots are sent to the write's trash slot (one fused write, nothing else recomputed)
        and their raw priorities stored beside it (cleaned as the write cleans them, last write wins, folded
        into the running max). ``"max"``: the plain write, then the ``B * T`` starts whose slices hold the
        slots are recomputed.
        """
        if self._T is None or index.numel() == 0:  # no start mask yet: plain values (masked when it is built)
            return super()._write(index, raw, n_valid)
        d, N = self._device, self._slots
        if index.device != d:
            index = index.to(d, non_blocking=True)
        if self.slice_priority == "max" and self._T > 1:
            super()._write(index, raw, n_valid)
            slots = index.clamp(0, N - 1)  # slots the write dropped: recomputing a valid one is harmless
            starts = (slots[:, None] - torch.arange(self._T, device=d)) % N
            self._starts_changed(starts.reshape(-1))
            return
        if raw.device != d:
            raw = raw.to(d, non_blocking=True)
        target, hidden_max = self._hidden_raw(index, raw, self._valid, n_valid, N, self._max_capacity, self._max_raw,
                                              self._raw, self._n_dropped, self._scratch)
        B = index.numel()
        if self._ops is not reference and _ONE_LAUNCH < B <= 4 * _ONE_LAUNCH:
            for at in range(0, B, _ONE_LAUNCH):  # the kernels' one-launch write per piece (in order: last wins)
                super()._write(target[at:at + _ONE_LAUNCH], raw[at:at + _ONE_LAUNCH], n_valid)
        else:
            super()._write(target, raw, n_valid)
        torch.maximum(self._max_raw, hidden_max, out=self._max_raw)

    def _rebuild(self) -> None:
        if getattr(self, "_T", None) is None or not hasattr(self, "_valid"):
            return super()._rebuild()
        self._starts_changed(torch.arange(self._slots, device=self._device))

    def mark_update(self, index, *, storage=None) -> None:
        """New slots ``index`` get the default priority (the running max), then the trajectory state is updated
        (see the module docstring)."""
        GPUPrioritizedSampler.mark_update(self, index, storage=storage)
        if storage is not None:
            self._slices_written(check_index(index, self._filled_or(storage)), storage)

    def _filled_or(self, storage) -> int:
        return len(storage) if storage is not None else self._max_capacity

    def add(self, index) -> None:
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
        T, num = self._prepare_draw(storage, batch_size)
        start, weight = self._served(("slice", num, self.stratified, self.weight_normalization),
                                     lambda: self._draw(num), (), self._draw_state(num), self.draw_generators(num))
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
