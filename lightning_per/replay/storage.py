"""GPUTensorStorage: one preallocated ring of transitions on the device (its TorchRL adapter).

A :class:`torchrl.data.LazyTensorStorage` whose writes are device-to-device copies with no host
synchronisation: ``len()`` is a host int advanced by the host-side write cursor (as in the ring
buffer of the seed design), a sampler's reads (``get`` of a slot tensor) index the whole preallocated
tensors (static shapes, so sample and read can be captured in a CUDA graph) while other reads
(``storage[...]``, ``rb[...]``, slices, ints) see the filled part only, as TorchRL's, and a write whose keys,
shapes or dtypes differ from the stored ones is rejected *before* anything changes.

Items that the ring does not hold (plain tensors, tensorclasses, pytrees, items with batch dimensions of
their own, ragged lazy stacks, ``ndim > 1``, ``consolidated`` or ``shared_init`` storages) are stored in
TorchRL's own layout and through TorchRL's own code, on the same device (:attr:`GPUTensorStorage.ring`
is then False).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import LazyTensorStorage

from lightning_per.replay.compat import bump_mutation_revision, tree_leaves, unlocked_len
from lightning_per.replay.errors import check_bool, check_capacity
from lightning_per.replay.ring import RingState, match_pairs, read_slots, ring_field, rows_batch, write_pairs
from lightning_per.replay.rows import (
    field_views,
    item_spec,
    last_writes,
    pack_plan,
    ring_leaves,
    row_layout,
    set_all,
    view_plan,
)
from lightning_per.replay.slots import filled_slots
from lightning_per.replay.storage_checkpoint import StorageCheckpoint

__all__ = ["GPUTensorStorage", "default_device", "resolve_device"]


def default_device() -> torch.device:
    """``cuda`` (the current device) when available, else ``cpu``."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def resolve_device(device: torch.device | str | None, name: str = "device") -> torch.device:
    """``device`` as a ``torch.device`` (:func:`default_device` for None).

    Raises:
        ValueError: ``device`` is not a device torch knows, is neither the CPU nor a CUDA device (``"meta"``), or
            names a CUDA device this machine does not have (the message names ``name``).
    """
    if device is None:
        return default_device()
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"{name} must be a torch.device, a device string such as 'cuda', 'cuda:1' or 'cpu', or "
                         f"None; got {device!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} must be 'cpu' or a CUDA device ('cuda', 'cuda:1'), or None; got {str(device)!r} "
                         f"(the replay keeps its tensors and draws on the CPU or a CUDA device)")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name}={str(device)!r} but CUDA is not available on this machine; use {name}='cpu' "
                         f"or leave it None (CUDA when available, else CPU)")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"{name}={str(device)!r} but this machine has {torch.cuda.device_count()} CUDA device(s) "
                         f"(cuda:0 .. cuda:{torch.cuda.device_count() - 1})")
    return device


_TORCHRL_SET = LazyTensorStorage.set  # named on its class: torch.compile cannot trace super() to it


class GPUTensorStorage(LazyTensorStorage):
    """Ring storage of transitions preallocated on ``device`` at the first write.

    Args:
        max_size: capacity in transitions (>= 1).
        device: where the data lives; default ``cuda`` when available, else ``cpu``.
        fallback: on CUDA out-of-memory at allocation, keep the data on the CPU instead (one
            :class:`RuntimeWarning`); with ``False`` the OOM error propagates.
        packed: keep all keys in one ring of rows (one gather per read; batch fields are views, see
            Layout). Default False: batches are plain contiguous tensors, as TorchRL's.
        ndim: dimensions of the storage's batch (TorchRL's ``ndim``: ``2`` keeps ``[n_envs, T]`` batches of a
            parallel collector as ``[T, n_envs]`` rows); ``ndim > 1`` uses TorchRL's layout (see Layout).
        compilable, consolidated, shared_init, cleanup_memmap: as TorchRL's ``LazyTensorStorage``
            (``consolidated`` and ``shared_init`` use TorchRL's layout).

    Layout (:attr:`ring` True): a :class:`~tensordict.TensorDict` of batch ``[max_size]``, one tensor per key
    (e.g. ``observation: (max_size, 4) float32``), on :attr:`device`. With ``packed=True`` every key
    is a view into one row-major ``(max_size, row_bytes / 8) int64`` ring (:attr:`rows`):
    each transition is one row of ``row_bytes`` bytes (its fields at offsets aligned to their element
    size, the row padded to 8 bytes), so a read of ``B`` transitions is a single gather kernel, whatever
    the number of keys, and the batch's tensors are views into that gathered ``(B, row_bytes / 8)``
    block: their batch stride is the row, not the field. Consequences: ``torch.save`` of a batch (or
    of two of its fields) fails (views of one buffer under different dtypes) and ``.view(-1)`` of a
    multi-dimensional field fails, until ``.contiguous()``/``.clone()``; one field kept alive keeps the
    whole gathered block alive. Made for learners that consume a batch at once (the DQN module uses it).
    Keys whose element size exceeds 8 bytes (e.g. complex128) keep one tensor each (``packed`` then
    has no effect). Items the ring does not hold (the module docstring lists them) are stored as TorchRL's
    ``LazyTensorStorage`` stores them, on :attr:`device` (:attr:`ring` False; ``packed`` has no effect).

    Reads: ``get(index)`` with a 1-D slot tensor (a sampler's draw) indexes the whole ring (static shapes, no
    host length involved: the slots must lie in ``[0, len(self))``); every other read, ``storage[index]``
    included, indexes the filled part ``[0, len(self))`` only, as TorchRL's (``storage[-1]`` is the last
    filled slot, ``storage[len(self)]`` raises IndexError).

    Raises:
        ValueError: ``max_size < 1`` or ``ndim < 1``.
        TypeError/ValueError (from :meth:`check_spec`): a write with other keys, shapes or dtypes.

    Example::

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from lightning_per import GPUTensorStorage
        >>> storage = GPUTensorStorage(8, device="cpu", packed=True)
        >>> storage.set(torch.arange(3), TensorDict({"observation": torch.ones(3, 4),
        ...                                          "reward": torch.arange(3.0)}, [3]))
        >>> len(storage), tuple(storage.rows.shape)  # 3 of 8 slots written; one row of 3 words each
        (3, (8, 3))
        >>> batch = storage.get(torch.tensor([2, 0]))  # one gather of whole rows
        >>> batch["reward"], tuple(batch["observation"].shape)
        (tensor([2., 0.]), (2, 4))
    """

    def __init__(self, max_size: int, *, device: torch.device | str | None = None, fallback: bool = True,
                 ndim: int = 1, packed: bool = False, compilable: bool = False, consolidated: bool = False,
                 shared_init: bool = False, cleanup_memmap: bool = True) -> None:
        check_capacity("max_size", max_size)
        check_bool("fallback", fallback)
        check_bool("packed", packed)
        if isinstance(ndim, bool) or not isinstance(ndim, int) or ndim < 1:
            raise ValueError(f"ndim must be an int >= 1, got {ndim!r}")
        device = resolve_device(device)
        options = {k: v for k, v in (("compilable", compilable), ("consolidated", consolidated),
                                     ("shared_init", shared_init)) if v}  # TorchRL versions without them
        if not cleanup_memmap:
            options["cleanup_memmap"] = False
        super().__init__(max_size, device=device, ndim=ndim, **options)
        self.fallback = fallback
        self.packed = packed
        #: TorchRL's layout and code paths (True: see Layout), decided at the first write or load
        self._generic = ndim > 1 or bool(consolidated) or bool(shared_init)
        self._spec: dict | None = None
        #: the ring's buffers and the plans of its fast paths (:class:`~lightning_per.replay.ring.RingState`)
        self._ring_state = RingState()

    # the ring state's fields under the names the subclasses and code written against this class use
    rows = ring_field("rows", "(max_size, row_bytes / 8) int64 packed ring, or None (not packed)")
    _layout = ring_field("layout")
    _plan = ring_field("plan")
    _pack = ring_field("pack")
    _ring_bytes = ring_field("ring_bytes")
    _flat = ring_field("flat")
    _flat_spec = ring_field("flat_spec")
    _device_cached = ring_field("device")

    # ------------------------------------------------------------------ allocation
    @property
    def ring(self) -> bool:
        """True when the items live in this class's ring (flat TensorDict items: the fast paths); False when they
        are kept in TorchRL's layout (see Layout). Before the first write: whether a ring is still possible."""
        return not self._generic

    def _uses_ring(self, data: Any, batched: bool = True) -> bool:
        """Whether a write of ``data`` goes to the ring; before the first write, decides it for good from ``data``
        (a TensorDict of plain tensors with one batch dimension, ``batched``, or none, not a ragged lazy stack)."""
        if self._generic:
            return False
        if self.initialized or type(self).set is not GPUTensorStorage.set:  # a subclass with its own writes
            return True                                                    # keeps its ring (and its checks)
        ok = (isinstance(data, TensorDictBase) and data.batch_dims == int(batched)
              and ring_leaves(data))
        if not ok:
            self._generic = True
        return ok

    def _init_standard(self, data: TensorDictBase | torch.Tensor) -> None:
        if self._generic or not self._uses_ring(data, batched=False):
            self._flat = self._flat_spec = None
            return super()._init_standard(data)
        try:
            self._allocate(data, torch.device(self.device))
        except torch.OutOfMemoryError:
            if not self.fallback:
                raise
            warnings.warn(f"GPUTensorStorage: out of memory allocating {self.max_size} transitions on "
                          f"{self.device}; keeping the replay data on the CPU instead (PinnedHostStorage, or "
                          f"make_replay_buffer(pinned_host=True), keeps it in host memory with priorities, "
                          f"draws and batches on the GPU)", RuntimeWarning,
                          stacklevel=4)
            torch.cuda.empty_cache()
            self.device = torch.device("cpu")
            self._allocate(data, self.device)

    def _allocate(self, item: TensorDictBase, device: torch.device) -> None:
        leaves = {k: v for k, v in item.items(include_nested=True, leaves_only=True) if k != "index"}
        layout, row_bytes = row_layout({k: (tuple(v.shape), v.dtype) for k, v in leaves.items()})
        if self.packed and layout is not None:
            self.rows = torch.zeros((self.max_size, row_bytes // 8), dtype=torch.int64, device=device)
            self._layout = layout
            self._plan = view_plan(layout, row_bytes // 8)
            self._pack = pack_plan(layout)
            self._ring_bytes = self.rows.view(torch.uint8)  # (max_size, row_bytes)
            tensors = field_views(self.rows, layout)
        else:
            self.rows, self._layout = None, {}
            self._plan = self._pack = self._ring_bytes = None
            tensors = {k: torch.zeros((self.max_size, *v.shape), dtype=v.dtype, device=device)
                       for k, v in leaves.items()}
        self._storage = TensorDict(tensors, batch_size=[self.max_size], device=device)
        self._spec = item_spec(self._storage)
        self._index_flat()
        self.initialized = True

    def _repack(self) -> None:
        """Put the packed views back after TorchRL's ``load_state_dict`` (it may install new tensors)."""
        views = field_views(self.rows, self._layout)
        for key, view in views.items():
            current = self._storage.get(key)
            if current is not view:
                if current.data_ptr() != view.data_ptr() or current.stride() != view.stride():
                    view.copy_(current)
                self._storage.set(key, view)

    def __setstate__(self, state) -> None:
        """TorchRL's unpickling (``pickle``, ``copy.deepcopy``, a spawned process), then the packed ring's views
        relinked (:meth:`_relink_views`)."""
        super().__setstate__(state)
        self._relink_views()

    def _relink_views(self) -> None:
        """Make the fast paths' tensors the stored ones again: the ring's leaf cache the TensorDict's leaves, and
        for a packed ring the fields and the byte view views of :attr:`rows`. Unpickling copies each tensor on
        its own (and ``copy.deepcopy`` of a TensorDict copies its leaves), so without this a write through one
        copy would never reach the copy that reads and samplers gather. The copies hold the same values, so no
        data is copied here."""
        ring = self._ring_state
        if not self.initialized or self._storage is None or self._generic:
            return
        if ring.rows is not None:
            ring.ring_bytes, ring.pack_bytes = ring.rows.view(torch.uint8), None
            for key, view in field_views(ring.rows, ring.layout).items():
                self._storage.set(key, view)
        device = ring.device
        self._index_flat()
        ring.device = device  # a subclass may read batches onto another device than the fields' (host storage)

    def _index_flat(self) -> None:
        """Cache the leaf tensors (nested keys as tuples) for the fast read and write paths."""
        keys = list(self._storage.keys(include_nested=True, leaves_only=True))
        self._flat = {k: self._storage.get(k) for k in keys}
        self._ring_state.nested = any(isinstance(k, tuple) for k in keys)
        # per flat key: (ring tensor, dtype, per-item shape), what a direct write checks a batch against
        self._flat_spec = ({k: (v, v.dtype, v.shape[1:]) for k, v in self._flat.items()}
                           if self._flat is not None else None)
        self._device_cached = self._storage.device

    def _bump_revision(self) -> None:
        """TorchRL's mutation counter after a write (:func:`~lightning_per.replay.compat.bump_mutation_revision`)."""
        bump_mutation_revision(self)

    def __len__(self) -> int:
        # TorchRL's __len__ reads a multiprocessing.Value under its lock, behind a torch.compile guard; the
        # unlocked read of the same int is what the hot paths need (sample, update_priority).
        value = None if torch.compiler.is_compiling() else unlocked_len(self)
        return super().__len__() if value is None else value

    @property
    def nbytes(self) -> int:
        """Bytes held by the preallocated transitions (0 before the first write)."""
        if not self.initialized:
            return 0
        if self._generic:
            return sum(v.numel() * v.element_size() for v in tree_leaves(
                self._storage.to_dict() if isinstance(self._storage, TensorDictBase) else self._storage)
                if isinstance(v, torch.Tensor))
        if self.rows is not None:
            return self.rows.numel() * self.rows.element_size()
        return sum(v.numel() * v.element_size() for v in self._storage.values(True, True))

    # ------------------------------------------------------------------ writes
    def check_spec(self, data: TensorDictBase) -> None:
        """Raise if a batch ``data`` (batch dim first) cannot be written; changes nothing.

        Raises:
            TypeError: ``data`` is not a TensorDict, or a key has another dtype.
            ValueError: other keys, or another per-item shape, than the stored ones.
        """
        if self._generic or (not self.initialized and not self._uses_ring(data)):
            return  # TorchRL's layout: TorchRL's write checks
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"data must be a TensorDict with a leading batch dimension, got "
                            f"{type(data).__name__}")
        if self._spec is None:
            return
        got = item_spec(data.exclude("index") if "index" in data.keys() else data)
        want = self._spec
        if set(got) != set(want):
            missing, extra = sorted(map(str, set(want) - set(got))), sorted(map(str, set(got) - set(want)))
            raise ValueError(f"data keys differ from the stored spec: missing {missing}, unexpected {extra}")
        for key, (shape, dtype) in want.items():
            if got[key][0] != shape:
                raise ValueError(f"data[{key!r}] has per-item shape {got[key][0]}, the storage holds {shape}")
            if got[key][1] != dtype:
                raise TypeError(f"data[{key!r}] has dtype {got[key][1]}, the storage holds {dtype}")

    def set(self, cursor, data, *, set_cursor: bool = True) -> None:
        """Write ``data`` (batch ``[n]``) at slots ``cursor`` (``(n,)`` int64 tensor, range or int).

        A device-to-device copy (``data`` is moved with ``non_blocking=True`` if it is elsewhere).
        With ``set_cursor`` the host length grows by ``n`` up to ``max_size`` (ring writes). A cursor longer
        than the ring (a batch of more than ``max_size`` items) repeats slots: each keeps its last write, on
        every device (plain indexed assignment leaves that undefined on CUDA).
        """
        if not self._uses_ring(data, batched=not (isinstance(data, TensorDictBase) and data.batch_dims == 0)):
            # TorchRL's set, named on its class: torch.compile(fullgraph=True) cannot trace super() to it
            return _TORCHRL_SET(self, cursor, data, set_cursor=set_cursor)
        if isinstance(data, TensorDictBase) and data.batch_dims == 0:
            data = data.unsqueeze(0)
            cursor = torch.as_tensor([cursor]) if isinstance(cursor, int) else cursor
        self.check_spec(data)
        if not self.initialized:
            self._init(data[0])
        device = torch.device(self.device)
        if isinstance(cursor, torch.Tensor):
            cursor = cursor.to(device, non_blocking=True)
        data = data.to(device, non_blocking=True)
        if "index" in data.keys():  # the writer tags batches with their slots; the sampler returns it
            data = data.exclude("index")
        if (isinstance(cursor, torch.Tensor) and cursor.ndim == 1 and cursor.shape[0] > self.max_size
                and data.shape[:1] == cursor.shape):
            data = data[last_writes(cursor, self.max_size)]  # a repeated slot keeps its last write
        self._storage[cursor] = data
        if set_cursor:  # after the write: a cursor that does not fit ``data`` raises with the length unchanged
            self._last_cursor = cursor
            self._len = min(self._len + data.shape[0], self.max_size)
        self._bump_revision()

    def direct_pairs(self, data) -> dict[str, tuple[torch.Tensor, torch.Tensor]] | None:
        """``{key: (ring tensor, data tensor)}`` in ``data``'s key order, when ``data`` is a TensorDict ``[n]``
        (``n >= 1``) whose top-level tensors, but ``"index"``, are exactly the stored keys with the stored
        per-item shapes and dtypes (what :meth:`check_spec` accepts, for flat storages); else None (the
        caller takes the generic path, which raises the documented errors). Changes nothing
        (:func:`lightning_per.replay.ring.match_pairs`)."""
        if not self.initialized:
            return None
        return match_pairs(self._ring_state, data)

    def write_direct(self, cursor: torch.Tensor, pairs, start: int | None = None) -> None:
        """:meth:`set` ``(cursor, data)`` for ``pairs`` from :meth:`direct_pairs` (already validated), through
        :func:`lightning_per.replay.ring.write_pairs` (``start``: ``cursor`` is ``range(start, start + n)``), then
        the host length and TorchRL's mutation counter."""
        cursor = write_pairs(self._ring_state, cursor, pairs, start, self.max_size)
        self._last_cursor = cursor
        self._len = min(self._len + cursor.shape[0], self.max_size)
        self._bump_revision()

    # ------------------------------------------------------------------ reads
    def get(self, index):
        """Transitions at ``index``: for a ``(B,)`` int64 slot tensor (a sampler's draw) a TensorDict ``[B]`` on the
        device read from the whole preallocated ring (no slicing by the host length: static shapes; the slots lie
        in ``[0, len(self))``); for any other index (int, slice, list, tuple) the filled part ``[0, len(self))``
        indexed as TorchRL's storages do.

        Raises:
            RuntimeError: nothing was ever written.
            IndexError: an int or list index outside the filled part.
        """
        if self._generic:
            return super().get(index)
        if isinstance(index, torch.Tensor) and index.ndim == 1 and index.dtype != torch.bool:
            return self._read(index)
        return self._read_filled(index)

    def __getitem__(self, index):
        """``storage[index]`` (``rb[index]`` reads through it): the filled part ``[0, len(self))`` indexed by
        ``index`` (an int, slice, list, range, array, bool mask or tensor; negative values count from the end of
        the filled part), as TorchRL's. A CUDA index tensor is wrapped on the device, without a bounds check
        (that would synchronise): its values must lie in ``[-len(self), len(self))``.

        Raises:
            RuntimeError: nothing was ever written.
            IndexError: an index outside the filled part (host-side indices).
        """
        if self._generic:
            return super().get(index)
        return self._read_filled(index)

    def _read_filled(self, index):
        """A read of the filled part: a slice, ``...``, a key or a tuple gives views into the stored tensors, as
        TorchRL's ``storage[:len]`` (``rb[:].set_(...)`` writes through them); ints, sequences and tensors gather
        the named slots."""
        if not isinstance(index, (int, list, range, torch.Tensor, np.ndarray)) and (
                type(self)._read is GPUTensorStorage._read):  # slices, keys, tuples: TorchRL's views
            if not self.initialized:
                raise RuntimeError("Cannot read from an empty GPUTensorStorage: extend it first")
            n = len(self)
            return (self._storage if n >= self.max_size else self._storage[:n])[index]
        return self._read(self._filled_slots(index))

    def _filled_slots(self, index) -> torch.Tensor:
        """The ring slots that ``index`` names within the filled part ``[0, len(self))``
        (:func:`lightning_per.replay.slots.filled_slots`).

        Raises:
            RuntimeError: nothing was ever written.
            IndexError: a host-side index outside the filled part.
        """
        if not self.initialized:
            raise RuntimeError("Cannot read from an empty GPUTensorStorage: extend it first")
        return filled_slots(index, len(self))

    def read(self, index, extra: dict[str, torch.Tensor] | None = None):
        """:meth:`get` of ``index`` with the ``(B,)`` tensors of ``extra`` set in the batch (e.g. ``"index"`` and
        ``"priority_weight"``: a sampler's ``sample_gather``); built once when they are on :attr:`device`."""
        return self._read(index, extra)

    def _read(self, index, extra: dict[str, torch.Tensor] | None = None):
        """:meth:`get`, then ``batch.set(key, value)`` for each of ``extra`` (e.g. ``"index"`` and the IS
        weights: the buffer's direct sample path). When ``index`` is a ``(B,)`` tensor and ``extra`` holds
        ``(B,)`` tensors on :attr:`device`, the batch is built once with them (no validated ``set``)."""
        if not self.initialized:
            raise RuntimeError("Cannot read from an empty GPUTensorStorage: extend it first")
        if self._generic:
            return set_all(super().get(index), extra)
        ring = self._ring_state
        device = ring.device
        if ring.flat is None or not isinstance(index, torch.Tensor) or index.ndim != 1:
            if isinstance(index, torch.Tensor) and index.device != device:
                index = index.to(device, non_blocking=True)
            return set_all(self._storage[index], extra)
        for value in (extra or {}).values():  # a loop, not all(<genexpr>): fewer Python calls on the hot path
            if not (isinstance(value, torch.Tensor) and value.device == device and value.shape == index.shape):
                return set_all(self._read(index), extra)  # validated sets (they move or reject such values)
        return read_slots(ring, index, extra)

    def _rows_batch(self, block: torch.Tensor, extra: dict[str, torch.Tensor] | None) -> TensorDict:
        """The TensorDict ``[B]`` of the packed fields' views into ``block`` ``(B, W) int64`` plus ``extra``
        (:func:`lightning_per.replay.ring.rows_batch`; no validation)."""
        return rows_batch(self._ring_state, block, extra)

    @property
    def gather_rows(self) -> torch.Tensor | None:
        """The packed ring :attr:`rows` ``(max_size, W) int64`` when a gathered block of its rows can become a
        batch through :meth:`rows_to_batch` (packed storage, flat keys, initialised); else None. What a
        sampler's fused sample + gather reads (:meth:`GPUPrioritizedSampler.sample_gather`)."""
        ring = self._ring_state
        return None if ring.flat is None else ring.rows

    def rows_to_batch(self, block: torch.Tensor, extra: dict[str, torch.Tensor] | None = None):
        """The batch of gathered packed rows: ``block`` ``(B, W) int64`` on :attr:`device`, a fresh contiguous
        gather of :attr:`gather_rows` (``rows[index]``, or the fused sample + gather op), becomes the
        TensorDict ``[B]`` that :meth:`get` ``(index)`` returns (the same field views into ``block``), plus the
        ``(B,)`` tensors of ``extra`` on :attr:`device` (e.g. ``"index"``, ``"priority_weight"``), set
        without validation.

        Raises:
            RuntimeError: the storage has no packed ring with flat keys (:attr:`gather_rows` is None).
        """
        if self.gather_rows is None:
            raise RuntimeError("rows_to_batch needs a packed GPUTensorStorage with flat keys, written at least once")
        return self._rows_batch(block, extra)

    # ------------------------------------------------------------------ persistence (replay/storage_checkpoint.py)
    state_dict = StorageCheckpoint.state_dict
    check_state_dict = StorageCheckpoint.check_state_dict
    load_state_dict = StorageCheckpoint.load_state_dict
    dumps = StorageCheckpoint.dumps
    loads = StorageCheckpoint.loads
    _fields = StorageCheckpoint._fields
    _load_packed = StorageCheckpoint._load_packed
