"""SliceIndex: the trajectory bookkeeping a slice sampler holds (device state of trajectory ends and valid starts,
updated at every write; see :mod:`lightning_per.replay.slice`) with its starts rule, a value
(:mod:`lightning_per.replay.slice_starts`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_per.ops import block_size_for
from lightning_per.replay.compat import stored_data
from lightning_per.replay.errors import EmptyBufferError, check_batch_size, check_bool, check_key
from lightning_per.replay.rows import set_all
from lightning_per.replay.slice_ops import device_fn, reduce_touched, slice_steps
from lightning_per.replay.storage import GPUTensorStorage
from lightning_per.schema import check, stamp

__all__ = ["SLICE_SCHEMA_VERSION", "SliceIndex", "set_torchrl_attributes", "slice_batch"]

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
    """The trajectory bookkeeping of a slice sampler on ``device`` (module docstring of
    :mod:`lightning_per.replay.slice`): the stored end signal, the effective ends and the start mask, updated at
    every write, and its starts rule (:class:`~lightning_per.replay.slice_starts.UniformStarts`, or
    :class:`~lightning_per.replay.slice_starts.PriorityStarts` of ``"start"`` /
    ``"max"``), which turns the start mask into the leaves a draw searches.

    Args:
        capacity: the storage's ``max_size`` (slots N >= 1).
        starts: the starts rule; it follows every change of the start mask.
        compiled: the draw's steps are compiled on CUDA (``torch.compile``; the compiled kernels serve the sampler).
        owner: the sampler's class name, for messages.
        num_slices, slice_len, end_key, end_keys, traj_key, strict_length, truncated_key, init_key, span: as
            :class:`~lightning_per.replay.GPUSliceSampler`.

    Attributes:
        raw_end: ``(N,) bool`` the stored end signal; traj_ids: ``(N,) int64`` the stored trajectory ids.
        end_leaves, end_bsum: ``(nb, blk) float32`` effective ends (1.0) and their ``(nb,) float64`` row sums.
        valid: ``(nb * blk,) bool`` the start mask; last: ``() int64`` the last written slot.
        n_filled, T, signal, checked: host values: the filled length, the slice length the mask is built for,
            the resolved trajectory marker, and whether a valid start was seen since the mask was rebuilt.

    Raises:
        ValueError, TypeError: a bad argument (named); NotImplementedError: ``span`` other than False.
    """

    def __init__(self, capacity: int, *, starts, compiled: bool, owner: str, num_slices, slice_len, end_key,
                 end_keys, traj_key, strict_length, truncated_key, init_key, span) -> None:
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
        self.starts, self.compiled, self.owner, self.device = starts, compiled, owner, starts.device
        self.num_slices, self.slice_len = num_slices, slice_len
        self.end_key = end_key if end_key is not None or end_keys is not None else ("next", "done")
        self.end_keys = tuple(end_keys) if end_keys is not None else None
        self.traj_key = traj_key
        self.truncated_key, self.init_key = truncated_key, init_key
        self.strict_length = strict_length
        self.auto_traj_key = traj_key is None and end_key is None and end_keys is None
        self.signal: tuple[str, Any] | None = None  # ("traj", key) or ("end", keys), resolved at the first write
        n = self.slots = capacity
        self.block = block_size_for(n + 1)
        self.blocks = -(-(n + 1) // self.block)
        self.T: int | None = slice_len  # the slice length the start mask is built for (host int)
        self._init_fns()
        self.reset()

    def __repr__(self) -> str:
        return (f"SliceIndex(slots={self.slots}, num_slices={self.num_slices}, slice_len={self.slice_len}, "
                f"strict_length={self.strict_length}, starts={self.starts!r}, compiled={self.compiled})")

    def check_ring(self, storage) -> None:
        """Refuse a storage whose ring is not this sampler's: slices wrap at slot N, so the sampler's capacity must
        be the storage's ``max_size``.

        Raises:
            ValueError: the storage's ``max_size`` is another int.
        """
        size = getattr(storage, "max_size", None)
        if isinstance(size, int) and size != self.slots:
            raise ValueError(f"{self.owner} has {self.slots} slots but the storage's max_size is {size}: "
                             f"build the sampler with the storage's max_size ({size}); slices wrap at the ring's end")

    def reset(self) -> None:
        """Forget every trajectory (fresh device state; the slice length and the resolved marker are kept), and the
        starts rule's own state."""
        d, n, nb, blk = self.device, self.slots, self.blocks, self.block
        self.raw_end = torch.zeros(n, dtype=torch.bool, device=d)  # the stored end signal
        self.traj_ids = torch.zeros(n, dtype=torch.int64, device=d)  # traj_key values (trajectory ids mode)
        self.end_leaves = torch.ones(nb, blk, dtype=torch.float32, device=d)  # effective ends (1.0)
        self.end_leaves.view(-1)[n:] = 0  # padding slots are no ends (the search never returns them)
        self.end_bsum = self.end_leaves.sum(1, dtype=torch.float64)
        self.valid = torch.zeros(nb * blk, dtype=torch.bool, device=d)
        self.last = torch.full((), -1, dtype=torch.int64, device=d)  # last written slot
        self.n_filled = 0  # host: len(storage) after the last write seen
        self.checked = False
        self.starts.reset()

    # ------------------------------------------------------------------ writes
    def resolve_signal(self, storage) -> None:
        """Which stored key marks trajectories (host, once): ``traj_key``, else (no key given) TorchRL's probe
        of ``("collector", "traj_ids")`` then ``"episode"``, else ``end_keys`` / ``end_key``.

        Raises:
            KeyError: none of them is in the storage (the message names the arguments).
        """
        if self.traj_key is not None and _has_key(storage, self.traj_key):
            self.signal = ("traj", self.traj_key)
            return
        if self.auto_traj_key:
            for key in _AUTO_TRAJ_KEYS:
                if _has_key(storage, key):
                    self.signal = ("traj", key)
                    return
        keys = self.end_keys if self.end_keys is not None else (self.end_key,)
        present = tuple(k for k in keys if _has_key(storage, k))
        if present:
            self.signal = ("end", present)
            return
        wanted = (f"traj_key={self.traj_key!r}" if self.traj_key is not None else
                  f"end_keys={list(keys)!r}" if self.end_keys is not None else f"end_key={self.end_key!r}")
        raise KeyError(f"{self.owner}: the stored data has no trajectory marker: {wanted} is not among "
                       f"its keys (give end_key, end_keys or traj_key naming a stored entry)")

    def check_signal(self, data) -> None:
        """Raise before a write of ``data`` (a TensorDict ``[n]``) that carries no trajectory marker this sampler
        can read (see :meth:`resolve_signal`), changing nothing. The replay buffer calls it before writing.

        Raises:
            KeyError: no ``traj_key`` / ``end_key`` / ``end_keys`` entry in ``data``.
        """
        keys = set(data.keys(include_nested=True, leaves_only=True))
        if self.signal is not None:
            wanted = (self.signal[1],) if self.signal[0] == "traj" else self.signal[1]
            if any(k in keys for k in wanted):
                return
        else:
            candidates = ([self.traj_key] if self.traj_key is not None else []) + (
                list(_AUTO_TRAJ_KEYS) if self.auto_traj_key else []) + list(
                self.end_keys if self.end_keys is not None else (self.end_key,))
            if any(k in keys for k in candidates):
                return
        self.resolve_signal(_KeysOnly(keys))  # raises the named error

    def written(self, index: Tensor, storage) -> None:
        """The ring just took slots ``index`` ``(n,)`` (consecutive modulo N): new end flags, then the
        starts they affect (no host sync; ``n`` and ``len(storage)`` are host ints)."""
        n = index.numel()
        if n == 0 or storage is None:
            return
        if self.signal is None:
            self.resolve_signal(storage)
        if index.device != self.device:
            index = index.to(self.device, non_blocking=True)
        N = self.slots
        if n > N:
            index = index[-N:]  # a batch longer than the ring: its last N items survive
            n = N
        kind, key = self.signal
        if kind == "traj":
            self.traj_ids[index] = _ring_tensor(storage, key)[index].reshape(n, -1)[:, 0].to(torch.int64)
            pos = (index[0] - 1 + torch.arange(n + 1, device=self.device)) % N  # c-1 .. c+n-1
            self.raw_end[pos] = self.traj_ids[pos] != self.traj_ids[(pos + 1) % N]
        else:
            flag = None
            for k in key:
                value = _ring_tensor(storage, k)[index].reshape(n, -1).any(1)
                flag = value if flag is None else flag | value
            self.raw_end[index] = flag
            pos = (index[0] - 1 + torch.arange(n + 1, device=self.device)) % N
        self.last.copy_(index[-1])
        self.n_filled = len(storage)
        self.refresh_ends(pos)
        T = self.T
        if T is None:
            return
        if n + T >= N:
            self.refresh_all()
        else:
            self.refresh_starts(index[0] - (T - 1), n + T)

    # ------------------------------------------------------------------ derived state
    def refresh_ends(self, pos: Tensor | None = None) -> None:
        """Effective end flags at slots ``pos`` (all when None): stored end, write head, or unfilled."""
        if pos is None:
            pos = torch.arange(self.slots, device=self.device)
        end = self.raw_end[pos] | (pos >= self.n_filled) | (pos == self.last)
        self.end_leaves.view(-1)[pos] = end.to(torch.float32)
        reduce_touched(self.end_leaves, self.end_bsum, None, pos)

    def refresh_all(self) -> None:
        self.refresh_ends()
        self.refresh_starts(0, self.slots)
        self.checked = False

    def refresh_starts(self, first: Tensor | int, count: int) -> None:
        """Recompute the start mask at slots ``first .. first + count - 1`` (mod N, ``count <= N``)."""
        N, T, d = self.slots, self.T, self.device
        if count > _CHUNK:  # bounded temporaries (a full rebuild of 1e8 slots): pieces of _CHUNK starts
            for at in range(0, count, _CHUNK):
                self.refresh_starts(first + at, min(_CHUNK, count - at))
            return
        first = torch.as_tensor(first, device=d)
        start = (first + torch.arange(count, device=d)) % N  # [count]
        window = (first - 1 + torch.arange(count + T - 1, device=d)) % N  # pred of the first .. last window slot
        ends = self.end_leaves.view(-1)[window] > 0  # [count + T - 1]
        cum = torch.nn.functional.pad(torch.cumsum(ends, 0), (1, 0))  # [count + T]
        inside = cum[T:T + count] - cum[1:1 + count]  # ends among s .. s + T - 2
        fits = inside == 0
        if not self.strict_length:
            fits = fits | ends[:count]  # a trajectory's first slot: a shorter slice
        valid = fits & (start < self.n_filled)
        self.valid[start] = valid
        self.starts.changed(self, start)

    def state(self) -> dict[str, Any]:
        """The checkpoint entries of the trajectory state (schema :data:`SLICE_SCHEMA_VERSION`)."""
        # the index shares its sampler's dict (which holds the sampler's own version): a key of its own
        return stamp({"raw_end": self.raw_end.clone(), "traj_ids": self.traj_ids.clone(), "last": self.last.clone(),
                      "filled": self.n_filled, "slice_T": self.T, "signal": self.signal},
                     "slice sampler", SLICE_SCHEMA_VERSION, key="slice_schema")

    def check_state(self, state: dict[str, Any]) -> None:
        """Raise what :meth:`load_state` refuses, changing nothing.

        Raises:
            ValueError: missing or misshapen entries, or a newer schema.
        """
        missing = sorted(k for k in ("slice_schema", "raw_end", "traj_ids", "last", "filled", "slice_T", "signal")
                         if k not in state)
        if missing:
            raise ValueError(f"slice sampler checkpoint lacks {missing}")
        check(state, "slice sampler", SLICE_SCHEMA_VERSION, key="slice_schema")
        for key in ("raw_end", "traj_ids"):
            value = state[key]
            if not isinstance(value, Tensor) or value.shape != (self.slots,):
                raise ValueError(f"slice sampler checkpoint's {key!r} must be a ({self.slots},) tensor")
        filled = state["filled"]
        if isinstance(filled, bool) or not isinstance(filled, int) or not 0 <= filled <= self.slots:
            raise ValueError(f"slice sampler checkpoint's 'filled' must be an int in [0, {self.slots}], "
                             f"got {filled!r}")

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state` (checked by :meth:`check_state`), then rebuild the ends and the start mask."""
        self.raw_end.copy_(state["raw_end"].to(self.device))
        self.traj_ids.copy_(state["traj_ids"].to(self.device))
        self.last.copy_(state["last"].to(self.device))
        self.n_filled = state["filled"]
        self.signal = state["signal"]
        self.T = state["slice_T"] if self.slice_len is None else self.slice_len
        self.refresh_ends()
        if self.T is not None:
            self.refresh_all()

    # ------------------------------------------------------------------ draws
    def slice_shape(self, batch_size: int) -> tuple[int, int]:
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

    def prepare_draw(self, storage, batch_size: int) -> tuple[int, int]:
        """Checks before a draw; (re)builds the start mask for a new slice length (host-decided)."""
        T, num = self.slice_shape(batch_size)
        if storage is not None:
            self.check_ring(storage)
        if storage is None or len(storage) == 0:
            raise EmptyBufferError("Cannot sample from an empty storage (the replay buffer holds no transition): "
                                   "extend it first")
        if self.signal is None:
            self.resolve_signal(storage)
        if T != self.T:
            self.T = T
            self.refresh_all()
        if not self.checked:
            self.check_valid(T)
        return T, num

    def check_valid(self, T: int) -> None:
        """Raise unless some slot can start a slice. One host read, made once per start mask (after the mask
        is first built, or rebuilt for another slice length or a load); later draws trust it.

        Raises:
            ValueError: no trajectory holds ``T`` transitions under ``strict_length=True``.
        """
        if not bool(self.valid.any()):  # sync-ok: once per start mask, not per step (see the docstring)
            raise ValueError(f"no valid slice: every stored trajectory is shorter than the slice length {T} "
                             f"(slice_len / batch_size // num_slices) and strict_length=True; store longer "
                             f"trajectories or pass strict_length=False")
        self.checked = True

    def __getstate__(self) -> dict[str, Any]:
        """Pickle / ``copy.deepcopy`` state: the index's, without the draw's step function (a compiled one does not
        pickle), which :meth:`__setstate__` takes afresh."""
        state = self.__dict__.copy()
        state.pop("steps", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_fns()

    def _init_fns(self) -> None:
        """The draw's steps: compiled on CUDA when the compiled kernels serve the draws (``torch.compile``, once per
        slice shape: the first draw of a shape compiles, outside any capture), else plain torch."""
        self.steps = device_fn("slice_steps", slice_steps, self.device, self.compiled)

    def expand(self, start: Tensor, T: int, storage) -> tuple[Tensor, dict[Any, Tensor]]:
        """Slots of the slices starting at ``start`` ``(S,)``: ``(index (S * T,) int64, info)``."""
        marks = self.truncated_key is not None
        done_key = _replace_last(self.truncated_key, "done") if marks else None
        terminated_key = _replace_last(self.truncated_key, "terminated") if marks else None
        init = _ring_tensor(storage, self.init_key) if self.init_key is not None else None
        index, member, last, done, terminated, init = self.steps(
            start, self.end_leaves.view(-1), self.slots, T, _ring_tensor(storage, done_key) if marks else None,
            _ring_tensor(storage, terminated_key) if marks else None, init)
        info: dict[Any, Tensor] = {}
        if marks:
            info[self.truncated_key], info[done_key], info[terminated_key] = last, done, terminated
        if not self.strict_length:
            info[("collector", "mask")] = member
        if init is not None:
            info[self.init_key] = init
        return index, info


def slice_batch(storage, index: Tensor, info: dict[Any, Tensor], with_info: bool) -> tuple[Tensor, dict, Any]:
    """``(index, info, batch)``: the batch ``storage[index]`` with the info's entries (and ``"index"`` with
    ``with_info``) set in it, what a slice sampler's ``sample_gather`` returns (the replay buffer's direct path)."""
    extra = dict(info)
    if with_info:
        extra["index"] = index
    batch = storage.read(index) if isinstance(storage, GPUTensorStorage) else storage.get(index)
    return index, info, set_all(batch, extra)


def set_torchrl_attributes(sampler, index: SliceIndex) -> None:
    """The attributes of TorchRL's ``SliceSampler`` that its inherited methods and TorchRL's code read
    (``__getstate__``, ``_used_traj_key``, ...), set on ``sampler`` once from ``index``'s arguments; its private
    ones the sampler sets on itself."""
    sampler.num_slices, sampler.slice_len = index.num_slices, index.slice_len
    sampler.strict_length, sampler.pad_output = index.strict_length, not index.strict_length
    sampler.end_key, sampler.end_keys, sampler.traj_key = index.end_key, index.end_keys, index.traj_key
    sampler.truncated_key, sampler.init_key, sampler.span = index.truncated_key, index.init_key, (False, False)
    sampler.step_key, sampler.fragmented, sampler.cache_values, sampler.compile = None, False, False, False
    sampler.use_gpu = index.device.type == "cuda"


class _KeysOnly:
    """A stand-in storage exposing only a key set (for :meth:`SliceIndex.check_signal`)."""

    def __init__(self, keys) -> None:
        self._storage = self
        self._keys = keys

    def keys(self, include_nested: bool = True, leaves_only: bool = True):
        return self._keys
