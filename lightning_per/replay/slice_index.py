"""SliceIndex: the trajectory bookkeeping a slice sampler holds (device state of trajectory ends and valid starts,
updated at every write; see :mod:`lightning_per.replay.slice`) with its starts rule, a value
(:mod:`lightning_per.replay.slice_starts`).

Slots are row-major: on a storage of shape ``[rows, stride]`` (TorchRL's ``ndim=2`` layout ``[time, envs]``: the
ring runs along time, one trajectory stream per column) slot ``t * stride + e`` is followed in time by slot
``t * stride + e + stride`` (mod N); ``stride`` is 1 on a flat storage.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_per.ops import block_size_for
from lightning_per.replay.compat import last_written_row, mutation_revision, stored_data
from lightning_per.replay.errors import EmptyBufferError
from lightning_per.replay.slice_ops import chain_order, device_fn, reduce_touched, slice_steps
from lightning_per.replay.slice_spec import SliceSpec
from lightning_per.replay.slots import written_slots
from lightning_per.schema import check, stamp

__all__ = ["SLICE_SCHEMA_VERSION", "SliceIndex", "ring_tensor"]

SLICE_SCHEMA_VERSION = 2  # 2: "slots" and "stride" (2-D storages)
_CHUNK = 1 << 22  # starts recomputed per pass by a rebuild
_ADOPT = object()  # a loaded state's revision: the storage's, read at the next draw


def _v1_to_v2(state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "slots": state["raw_end"].shape[0], "stride": 1}


def ring_tensor(storage, key, n: int) -> Tensor | None:
    """The stored tensor of ``key`` (a TorchRL tensor storage's TensorDict) as ``(n, ...)`` row-major slots, or
    None."""
    data = stored_data(storage)
    if data is None or not hasattr(data, "get") or key is None:
        return None
    try:
        value = data.get(key, None)
    except (KeyError, TypeError):
        return None
    return None if value is None else value.reshape(n, *value.shape[data.batch_dims:])


def whole_rows(size: int, stride: int) -> int:
    """``size`` slots rounded up to whole rows of ``stride`` items: the ``max_size`` a storage of ``ndim > 1`` keeps
    (TorchRL's ``TensorStorage._max_size_along_dim0``: ``ceil(size / stride)`` rows), a host int."""
    return -(-size // stride) * stride


def _wide_signal(key, item_shape, ndim: int, owner: str) -> str:
    """The message for a trajectory marker with more than one value per item (TorchRL's first words)."""
    return (f"Expected the end-of-trajectory signal to be {ndim}-dimensional: {owner} reads {key!r}, which holds "
            f"{tuple(item_shape)} values per item; store one value per item (shape [*batch] or [*batch, 1])")


def _keys(storage) -> set:
    data = stored_data(storage)
    if data is None or not hasattr(data, "keys"):
        return set()
    return set(data.keys(include_nested=True, leaves_only=True)) | set(data.keys())


class SliceIndex:
    """The trajectory bookkeeping of a slice sampler on ``device`` (module docstring of
    :mod:`lightning_per.replay.slice`): the stored end signal, the effective ends and the start mask, updated at
    every write (or rebuilt from the storage when it changed unseen: a sampler used outside a buffer), and its
    starts rule (:class:`~lightning_per.replay.slice_starts.UniformStarts`, or
    :class:`~lightning_per.replay.slice_starts.PriorityStarts`), which turns the start mask into the leaves a
    draw searches.

    Args:
        capacity: the storage's ``max_size`` (slots N >= 1), or None: taken from the storage at first use.
        spec: the sampler's keywords (:class:`~lightning_per.replay.slice_spec.SliceSpec`).
        starts: the starts rule; it follows every change of the start mask.
        compiled: the draw's steps are compiled on CUDA (``torch.compile``; the compiled kernels serve the sampler).
        owner: the sampler's class name, for messages.

    Attributes:
        slots, stride, rows: N, the storage's items per time step and its time steps (host ints; None until the
            first storage is seen).
        raw_end: ``(N,) bool`` the stored end signal; traj_ids: ``(N,) int64`` the stored trajectory ids.
        end_flat: ``(N,) bool`` effective ends; end_leaves, end_bsum: the same as ``(nb, blk) float32`` leaves in
            column order (:func:`~lightning_per.replay.slice_ops.chain_order`) and their ``(nb,) float64`` sums.
        valid: ``(nb * blk,) bool`` the start mask (False on the padding); last: ``() int64`` the last written row.
        n_filled, T, signal, checked, seen, revision, rebuilds: host values: the filled rows, the slice length the
            mask is built for, the resolved trajectory marker, whether a valid start was seen since the mask was
            built, whether the state follows the storage, the storage revision last seen, and the count of rebuilds
            from the storage.
    """

    def __init__(self, capacity: int | None, *, spec: SliceSpec, starts, compiled: bool, owner: str) -> None:
        self.spec, self.starts, self.compiled, self.owner, self.device = spec, starts, compiled, owner, starts.device
        self.capacity = capacity
        self.slots: int | None = None
        self.stride = self.rows = None
        self.signal: tuple[str, Any] | None = None  # ("traj", key) / ("end", keys) / ("static", kind)
        self.T: int | None = spec.slice_len  # the slice length the start mask is built for (host int)
        self.revision: int | None = None
        self.rebuilds = 0
        self.n_filled, self.checked, self.seen = 0, False, False
        self._init_fns()

    def __repr__(self) -> str:
        return (f"SliceIndex(slots={self.slots}, stride={self.stride}, T={self.T}, starts={self.starts!r}, "
                f"compiled={self.compiled})")

    # ------------------------------------------------------------------ geometry
    def bind(self, storage) -> None:
        """Take the ring's geometry from ``storage`` (first use: allocate the device state), or check it.

        A capacity that a storage of ``ndim > 1`` rounds up to whole rows (``GPUTensorStorage(149, ndim=2)`` of rows of
        2 items holds 150 slots, as TorchRL's ``LazyTensorStorage``) is the storage's: the index takes its slots.

        Raises:
            ValueError: the storage's ``max_size`` is not the sampler's capacity (nor that capacity rounded up to
                whole rows), or its shape changed.
        """
        ndim = getattr(storage, "ndim", 1)
        shape = getattr(storage, "shape", None) if ndim > 1 else None
        if ndim > 1 and shape is None:
            return  # a 2-D storage before its first write: nothing to bind yet
        stride = 1 if ndim == 1 else int(torch.Size(shape[1:]).numel())
        size = getattr(storage, "max_size", None)
        slots = size if isinstance(size, int) else len(storage)
        want = self.capacity if self.slots is None else self.slots
        if self.slots is None and want is not None and whole_rows(want, stride) == slots:
            want = slots  # the storage rounded the same max_size up to whole rows, as TorchRL's storages do
        if want is not None and slots != want:
            raise ValueError(f"{self.owner} has {want} slots but the storage's max_size is {slots}: build the "
                             f"sampler with the storage's max_size ({slots}) or, for GPUSliceSampler, with none; "
                             f"slices wrap at the ring's end")
        if self.stride is not None:
            if stride != self.stride:
                raise ValueError(f"{self.owner} was built for storage rows of {self.stride} items, got {stride}")
            return
        self.slots, self.stride, self.rows = slots, stride, slots // stride
        self.block = block_size_for(slots + 1)
        self.blocks = -(-(slots + 1) // self.block)
        self.reset()

    def reset(self) -> None:
        """Forget every trajectory (fresh device state; the slice length and the resolved marker are kept), and the
        starts rule's own state."""
        self.revision, self.n_filled, self.checked, self.seen = None, 0, False, False
        if self.slots is None:
            return
        d, n, nb, blk = self.device, self.slots, self.blocks, self.block
        self.raw_end = torch.zeros(n, dtype=torch.bool, device=d)  # the stored end signal
        self.traj_ids = torch.zeros(n, dtype=torch.int64, device=d)  # traj_key values (trajectory ids mode)
        self.end_flat = torch.ones(n, dtype=torch.bool, device=d)
        self.end_leaves = torch.ones(nb, blk, dtype=torch.float32, device=d)  # effective ends (1.0), column order
        self.end_leaves.view(-1)[n:] = 0  # padding slots are no ends (the search never returns them)
        self.end_bsum = self.end_leaves.sum(1, dtype=torch.float64)
        self.valid = torch.zeros(nb * blk, dtype=torch.bool, device=d)  # padded as the core's leaves
        self.last = torch.full((), -1, dtype=torch.int64, device=d)  # last written row
        self.starts.reset(self)

    def rows_slots(self, rows: Tensor) -> Tensor:
        """The row-major slots of every item of ``rows`` ``(R,)``: ``(R * stride,)`` int64."""
        return (rows[:, None] * self.stride + torch.arange(self.stride, device=rows.device)).reshape(-1)

    # ------------------------------------------------------------------ writes
    def resolve_signal(self, storage) -> None:
        """Which stored key marks trajectories (host, once; see :attr:`SliceSpec.probe_keys`), else ``end_keys`` /
        ``end_key``; a static ``ends`` / ``trajectories`` signal needs none.

        Raises:
            KeyError: none of them is in the storage (the message names the arguments).
        """
        spec = self.spec
        if spec.ends is not None or spec.trajectories is not None:
            self.signal = ("static", "end" if spec.ends is not None else "traj")
            return
        keys = _keys(storage)
        for key in spec.probe_keys:
            if key in keys:
                self.signal = ("traj", key)
                return
        ends = spec.end_keys if spec.end_keys is not None else (spec.end_key,)
        present = tuple(k for k in ends if k in keys)
        if present:
            self.signal = ("end", present)
            return
        wanted = (f"traj_key={spec.traj_key!r}" if spec.traj_key is not None else
                  f"end_keys={list(ends)!r}" if spec.end_keys is not None else f"end_key={spec.end_key!r}")
        raise KeyError(f"{self.owner}: the stored data has no trajectory marker: {wanted} is not among "
                       f"its keys (give end_key, end_keys or traj_key naming a stored entry)")

    def check_signal(self, data) -> None:
        """Raise before a write of ``data`` (a TensorDict ``[n]``) that carries no trajectory marker this sampler
        can read (see :meth:`resolve_signal`), changing nothing. The replay buffer calls it before writing.

        Raises:
            KeyError: no ``traj_key`` / ``end_key`` / ``end_keys`` entry in ``data``.
            RuntimeError: such an entry holds more than one value per item.
        """
        if self.spec.ends is not None or self.spec.trajectories is not None:
            return
        keys = set(data.keys(include_nested=True, leaves_only=True))
        spec = self.spec
        if self.signal is not None:
            wanted = (self.signal[1],) if self.signal[0] == "traj" else self.signal[1]
        else:
            wanted = (*spec.probe_keys, *(spec.end_keys if spec.end_keys is not None else (spec.end_key,)))
        if not any(k in keys for k in wanted):
            self.resolve_signal(_KeysOnly(keys))  # raises the named error
        for key in wanted:
            if key in keys and data.get(key).shape[data.batch_dims:].numel() != 1:
                raise RuntimeError(_wide_signal(key, data.get(key).shape[data.batch_dims:], data.batch_dims,
                                                self.owner))

    def _read_signal(self, storage, slots: Tensor, pos: Tensor) -> None:
        """Stored end flags: ``traj_ids`` at ``slots`` from the storage (ids mode), then ``raw_end`` at ``pos``."""
        kind, key = self.signal
        n, stride = self.slots, self.stride
        if kind == "static":
            signal = (self.spec.ends if key == "end" else self.spec.trajectories).to(self.device)
            if signal.numel() != n:
                raise ValueError(f"{self.owner}: the static {key} signal has {signal.numel()} entries, the storage "
                                 f"{n} slots")
            if key == "end":
                self.raw_end[pos] = signal.bool()[pos]
                return
            self.traj_ids[slots] = signal.to(torch.int64)[slots]
        elif kind == "traj":
            self.traj_ids[slots] = self._signal(storage, key)[slots].reshape(-1).to(torch.int64)
        else:
            flag = None
            for k in key:
                value = self._signal(storage, k)[slots].reshape(-1)
                flag = value if flag is None else flag | value
            self.raw_end[slots] = flag
            return
        self.raw_end[pos] = self.traj_ids[pos] != self.traj_ids[(pos + stride) % n]

    def _signal(self, storage, key) -> Tensor:
        """The stored trajectory marker ``key`` as ``(N, ...)`` slots, one value per item (a trailing 1 allowed).

        Raises:
            RuntimeError: ``key`` holds more than one value per item (TorchRL's wording, and the key and shapes).
        """
        value = ring_tensor(storage, key, self.slots)
        if value[0].numel() != 1:
            raise RuntimeError(_wide_signal(key, value.shape[1:], getattr(storage, "ndim", 1), self.owner))
        return value

    def written(self, index, storage) -> None:
        """The ring just took the items ``index`` (what a writer hands ``mark_update``: rows, consecutive modulo the
        ring): new end flags, then the starts they affect (no host sync; the counts are host ints)."""
        if storage is None:
            return
        self.bind(storage)
        if self.slots is None:
            return
        slots = written_slots(index, storage)
        if not isinstance(slots, Tensor):
            slots = torch.as_tensor(slots, dtype=torch.int64).reshape(-1)
        if slots.numel() == 0:
            return
        if self.signal is None:
            self.resolve_signal(storage)
        if not self.seen and len(storage) > slots.numel():
            return self.rebuild(storage)  # the storage held items this index never saw
        slots = slots.to(self.device, non_blocking=True)
        stride, rows = self.stride, self.rows
        m = min(slots.numel() // stride, rows)
        if slots.numel() > self.slots:
            slots = slots[-self.slots:]  # a batch longer than the ring: its last N items survive
        first_row = torch.div(slots[0], stride, rounding_mode="floor")
        pos = self.rows_slots((first_row - 1 + torch.arange(m + 1, device=self.device)) % rows)  # rows c-1 .. c+m-1
        self._read_signal(storage, slots, pos)
        self.last.copy_(torch.div(slots[-1], stride, rounding_mode="floor"))
        self.n_filled = -(-len(storage) // stride)
        self.refresh_ends(pos)
        self.revision, self.seen = mutation_revision(storage), True
        if self.T is None:
            return
        need = self.spec.need(self.T)
        if m + need >= rows:
            self.refresh_all()
        else:
            self.refresh_starts(first_row - (need - 1), m + need)

    def rebuild(self, storage) -> None:
        """Rebuild the whole trajectory state from ``storage`` (its writes were not all seen: a sampler used outside
        a buffer, TorchRL's ``storage.set`` then ``sampler.sample``). Host-triggered, O(N) on the device, and a
        read of the storage's last cursor."""
        self.bind(storage)
        if self.signal is None:
            self.resolve_signal(storage)
        every = torch.arange(self.slots, device=self.device)
        self._read_signal(storage, every, every)
        self.n_filled = -(-len(storage) // self.stride)
        last = last_written_row(storage)
        self.last.fill_(last if last is not None else self.n_filled - 1 if self.n_filled < self.rows else -1)
        self.revision, self.seen = mutation_revision(storage), True
        self.rebuilds += 1
        self.refresh_ends()
        if self.T is not None:
            self.refresh_all()

    # ------------------------------------------------------------------ derived state
    def refresh_ends(self, pos: Tensor | None = None) -> None:
        """Effective end flags at slots ``pos`` (all when None): stored end, write head's row, or unfilled row."""
        if pos is None:
            pos = torch.arange(self.slots, device=self.device)
        row = torch.div(pos, self.stride, rounding_mode="floor")
        end = self.raw_end[pos] | (row >= self.n_filled) | (row == self.last)
        self.end_flat[pos] = end
        chain = chain_order(pos, self.stride, self.rows)
        self.end_leaves.view(-1)[chain] = end.to(torch.float32)
        reduce_touched(self.end_leaves, self.end_bsum, None, chain)

    def refresh_all(self) -> None:
        self.refresh_ends()
        self.refresh_starts(0, self.rows)
        self.checked = False

    def refresh_starts(self, first: Tensor | int, count: int) -> None:
        """Recompute the start mask at rows ``first .. first + count - 1`` (mod rows, ``count <= rows``): a start
        is valid when its slice holds at least ``need`` steps (:meth:`SliceSpec.need`) or, with
        ``strict_length=False``, when it is a trajectory's first step."""
        R, E, d = self.rows, self.stride, self.device
        if count * E > _CHUNK and count > 1:  # bounded temporaries (a full rebuild of 1e8 slots): pieces
            step = max(1, _CHUNK // E)
            for at in range(0, count, step):
                self.refresh_starts(first + at, min(step, count - at))
            return
        need = self.spec.need(self.T)
        first = torch.as_tensor(first, device=d)
        rows = (first + torch.arange(count, device=d)) % R  # [count]
        window = (first - 1 + torch.arange(count + need - 1, device=d)) % R  # pred of the first .. last window row
        ends = self.end_flat.view(R, E)[window]  # [count + need - 1, E]
        cum = torch.nn.functional.pad(torch.cumsum(ends, 0), (0, 0, 1, 0))  # [count + need, E]
        fits = (cum[need:need + count] - cum[1:1 + count]) == 0  # no end among s .. s + need - 2
        if not self.spec.strict_length:
            fits = fits | ends[:count]  # a trajectory's first step: a shorter slice
        start = self.rows_slots(rows)
        self.valid[start] = (fits & (rows < self.n_filled)[:, None]).reshape(-1)
        self.starts.changed(self, start)

    # ------------------------------------------------------------------ persistence
    def state(self) -> dict[str, Any]:
        """The checkpoint entries of the trajectory state (schema :data:`SLICE_SCHEMA_VERSION`)."""
        bound = self.slots is not None
        # the index shares its sampler's dict (which holds the sampler's own version): a key of its own
        return stamp({"raw_end": self.raw_end.clone() if bound else None,
                      "traj_ids": self.traj_ids.clone() if bound else None,
                      "last": self.last.clone() if bound else None, "filled": self.n_filled, "slice_T": self.T,
                      "signal": self.signal, "slots": self.slots, "stride": self.stride},
                     "slice sampler", SLICE_SCHEMA_VERSION, key="slice_schema")

    def check_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """Raise what :meth:`load_state` refuses, changing nothing; returns the state at this schema.

        Raises:
            ValueError: missing or misshapen entries, or a newer schema.
        """
        missing = sorted(k for k in ("slice_schema", "raw_end", "traj_ids", "last", "filled", "slice_T", "signal")
                         if k not in state)
        if missing:
            raise ValueError(f"slice sampler checkpoint lacks {missing} (a TorchRL sampler's state holds no "
                             f"trajectory state: load the storage, then let the sampler rebuild it at its first draw)")
        state = check(state, "slice sampler", SLICE_SCHEMA_VERSION, {1: _v1_to_v2}, key="slice_schema")
        slots, stride = state["slots"], state["stride"]
        want = self.slots if self.slots is not None else self.capacity
        if self.slots is None and want is not None and isinstance(stride, int) and stride >= 1 \
                and whole_rows(want, stride) == slots:
            want = slots  # written through a storage that rounded this capacity up to whole rows (see bind)
        if slots is not None and want is not None and slots != want:
            raise ValueError(f"slice sampler checkpoint holds {slots} slots, this sampler {want}")
        for key in ("raw_end", "traj_ids"):
            value = state[key]
            if slots is not None and (not isinstance(value, Tensor) or value.shape != (slots,)):
                raise ValueError(f"slice sampler checkpoint's {key!r} must be a ({slots},) tensor")
        filled = state["filled"]
        if isinstance(filled, bool) or not isinstance(filled, int) or not 0 <= filled <= (slots or 0):
            raise ValueError(f"slice sampler checkpoint's 'filled' must be an int in [0, {slots}], got {filled!r}")
        if stride is not None and self.stride is not None and stride != self.stride:
            raise ValueError(f"slice sampler checkpoint has rows of {stride} items, this sampler {self.stride}")
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore a state checked by :meth:`check_state`, then rebuild the ends and the start mask."""
        self.T = state["slice_T"] if self.spec.slice_len is None else self.spec.slice_len
        self.signal = state["signal"]
        if state["slots"] is None:
            return self.reset()
        if self.slots is None:
            self.slots, self.stride, self.rows = state["slots"], state["stride"], state["slots"] // state["stride"]
            self.block = block_size_for(self.slots + 1)
            self.blocks = -(-(self.slots + 1) // self.block)
            self.reset()
        self.raw_end.copy_(state["raw_end"].to(self.device))
        self.traj_ids.copy_(state["traj_ids"].to(self.device))
        self.last.copy_(state["last"].to(self.device))
        self.n_filled = state["filled"]
        self.seen, self.revision = True, _ADOPT  # the storage's counter restarts with it: the next draw adopts it
        self.refresh_ends()
        if self.T is not None:
            self.refresh_all()

    # ------------------------------------------------------------------ draws
    def prepare_draw(self, storage, batch_size: int) -> tuple[int, int]:
        """Checks before a draw; rebuilds the state after writes it did not see, and the start mask for a new slice
        length (host-decided; the storage's revision is a host int).

        Raises:
            ValueError: a bad ``batch_size`` (:meth:`SliceSpec.shape`), another ring, or no valid slice.
            EmptyBufferError: the storage is empty.
        """
        T, num = self.spec.shape(batch_size)
        if storage is None or len(storage) == 0:
            raise EmptyBufferError("Cannot sample from an empty storage (the replay buffer holds no transition): "
                                   "extend it first")
        self.bind(storage)
        revision = mutation_revision(storage)
        if self.revision is _ADOPT:
            self.revision = revision
        if not self.seen or (revision is not None and revision != self.revision):
            self.rebuild(storage)
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
            ValueError: no trajectory holds enough transitions under ``strict_length=True``.
        """
        if not bool(self.starts.usable(self)):  # sync-ok: once per start mask, not per step (see the docstring)
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


class _KeysOnly:
    """A stand-in storage exposing only a key set (for :meth:`SliceIndex.check_signal`)."""

    def __init__(self, keys) -> None:
        self._storage = _Keys(keys)


class _Keys:
    def __init__(self, keys) -> None:
        self._keys = keys

    def keys(self, include_nested: bool = True, leaves_only: bool = True):
        return self._keys
