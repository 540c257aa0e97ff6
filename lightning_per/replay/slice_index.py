"""SliceIndex: the trajectory bookkeeping both slice samplers share (device state of trajectory ends and valid
starts, updated at every write; see :mod:`lightning_per.replay.slice`), and the no-op TorchRL hooks they share."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_per.ops import block_size_for
from lightning_per.replay.compat import stored_data
from lightning_per.replay.errors import EmptyBufferError, check_batch_size, check_bool, check_index, check_key
from lightning_per.replay.rows import set_all
from lightning_per.replay.slice_ops import device_fn, reduce_touched, slice_steps, uniform_starts
from lightning_per.replay.storage import GPUTensorStorage
from lightning_per.schema import check, stamp

__all__ = ["SLICE_SCHEMA_VERSION", "SliceIndex"]

SLICE_SCHEMA_VERSION = 1
_CHUNK = 1 << 22  # starts recomputed per pass by a rebuild
_AUTO_TRAJ_KEYS = (("collector", "traj_ids"), "episode")  # what TorchRL probes when no key is given


def _replace_last(key, last: str):
    return (*key[:-1], last) if isinstance(key, tuple) else last


def _ring_tensor(storage, key) -> Tensor | None:
    """The stored ``(N, ...)`` tensor of ``key`` (a TorchRL tensor storage's TensorDict), or None."""
    data = stored_data(storage)
    if data is None or not hasattr(data, "get"):
        return None
    try:
        return data.get(key, None)
    except (KeyError, TypeError):
        return None


def _has_key(storage, key) -> bool:
    data = stored_data(storage)
    if data is None or not hasattr(data, "keys"):
        return False
    return key in data.keys(include_nested=True, leaves_only=True) or (
        isinstance(key, tuple) and len(key) == 1 and key[0] in data.keys())


class SliceIndex:
    """The trajectory bookkeeping both slice samplers share (device state; see the module docstring)."""

    _device: torch.device

    def add(self, index) -> None:  # the trajectory state follows mark_update (every write calls it)
        return None

    def extend(self, index) -> None:
        return None

    def mark_update(self, index, *, storage=None) -> None:
        """Slots ``index`` were just written: update the trajectory state (see the module docstring).

        Raises:
            ValueError: the storage's ``max_size`` is not this sampler's capacity (:meth:`_check_ring`).
        """
        if storage is None:
            return
        self._check_ring(storage)
        self._slices_written(check_index(index, self._slots), storage)

    def _check_ring(self, storage) -> None:
        """Refuse a storage whose ring is not this sampler's: slices wrap at slot N, so the sampler's capacity must
        be the storage's ``max_size``."""
        size = getattr(storage, "max_size", None)
        if isinstance(size, int) and size != self._slots:
            raise ValueError(f"{type(self).__name__} has {self._slots} slots but the storage's max_size is {size}: "
                             f"build the sampler with the storage's max_size ({size}); slices wrap at the ring's end")

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
        if end_keys is not None and not isinstance(end_keys, (list, tuple)):
            raise TypeError(f"end_keys must be a list or tuple of keys of the stored TensorDict, got "
                            f"{type(end_keys).__name__} {end_keys!r}")
        if end_keys is not None and not len(end_keys):
            raise ValueError("end_keys must name at least one key")
        for name, key in (("end_key", end_key), ("traj_key", traj_key), ("truncated_key", truncated_key),
                          ("init_key", init_key), *((f"end_keys[{i}]", k) for i, k in enumerate(end_keys or ()))):
            check_key(name, key, allow_none=not name.startswith("end_keys"))
        check_bool("strict_length", strict_length)
        if span not in (False, 0, (False, False), (0, 0), (False, 0), (0, False)):
            raise NotImplementedError(f"span={span!r}: slices that run past a trajectory's ends are not supported "
                                      f"by the GPU slice samplers (span=False only)")
        # TorchRL's SliceSampler attributes (its methods and __repr__ read them)
        self.num_slices, self.slice_len = num_slices, slice_len
        self.end_key = end_key if end_key is not None or end_keys is not None else ("next", "done")
        self.end_keys = tuple(end_keys) if end_keys is not None else None
        self.traj_key = traj_key
        self.truncated_key, self.init_key = truncated_key, init_key
        self.strict_length = strict_length
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
        reduce_touched(self._end_leaves, self._end_bsum, None, pos)

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
        # the index shares its sampler's dict (which holds the sampler's own version): a key of its own
        return stamp({"raw_end": self._raw_end.clone(), "traj_ids": self._traj_ids.clone(), "last": self._last.clone(),
                      "filled": self._n_filled, "slice_T": self._T, "signal": self._signal},
                     "slice sampler", SLICE_SCHEMA_VERSION, key="slice_schema")

    def _check_slice_state(self, state: dict[str, Any]) -> None:
        missing = sorted(k for k in ("slice_schema", "raw_end", "traj_ids", "last", "filled", "slice_T", "signal")
                         if k not in state)
        if missing:
            raise ValueError(f"slice sampler checkpoint lacks {missing}")
        check(state, "slice sampler", SLICE_SCHEMA_VERSION, key="slice_schema")
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
        if storage is not None:
            self._check_ring(storage)
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

    def __getstate__(self) -> dict[str, Any]:
        """Pickle / ``copy.deepcopy`` state: the sampler's, without the draw's step functions (compiled ones do not
        pickle), which :meth:`__setstate__` takes afresh."""
        state = self.__dict__.copy()
        state.pop("_slice_steps", None)
        state.pop("_uniform_starts", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_fns()

    def _init_fns(self) -> None:
        """The draw's steps: compiled on CUDA when the compiled kernels serve the draws (``torch.compile``, once per
        slice shape: the first draw of a shape compiles, outside any capture), else plain torch."""
        compiled = self._slice_compiled
        self._slice_steps = device_fn("slice_steps", slice_steps, self._device, compiled)
        self._uniform_starts = device_fn("uniform_starts", uniform_starts, self._device, compiled)

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
        batch = storage.read(index) if isinstance(storage, GPUTensorStorage) else storage.get(index)
        return index, info, set_all(batch, extra)


class _KeysOnly:
    """A stand-in storage exposing only a key set (for :meth:`SliceIndex.check_signal`)."""

    def __init__(self, keys) -> None:
        self._storage = self
        self._keys = keys

    def keys(self, include_nested: bool = True, leaves_only: bool = True):
        return self._keys
