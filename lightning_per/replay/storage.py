"""GPUTensorStorage: one preallocated ring of transitions on the device (its TorchRL adapter).

A :class:`torchrl.data.LazyTensorStorage` whose writes are device-to-device copies with no host
synchronisation: ``len()`` is a host int advanced by the host-side write cursor (as in the ring
buffer of the seed design), a sampler's reads (``get`` of a slot tensor) index the whole preallocated
tensors (static shapes, so sample and read can be captured in a CUDA graph) while other reads
(``storage[...]``, ``rb[...]``, slices, ints) see the filled part only, as TorchRL's, and a write whose keys,
shapes or dtypes differ from the stored ones is rejected *before* anything changes.

Items that the ring does not hold (plain tensors, tensorclasses, pytrees, items with batch dimensions of
their own, ragged lazy stacks, ``ndim > 1``, ``consolidated`` or ``shared_init`` storages) are stored in
TorchRL's own layout and through TorchRL's own ``LazyTensorStorage`` code, on the same device
(:attr:`GPUTensorStorage.layout` is then ``"torchrl"``).

This module holds one thing, the storage adapter (its one write path, one read path and persistence calling the
pure functions of :mod:`lightning_per.replay.storage_checkpoint`), and passes 450 lines for it.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import LazyTensorStorage

from lightning_per.replay.compat import bump_mutation_revision, tree_leaves, unlocked_len
from lightning_per.replay.errors import check_bool, check_capacity
from lightning_per.replay.ring import RingState, match_pairs, read_slots, rows_batch, write_pairs
from lightning_per.replay.rows import (
    check_dense,
    field_views,
    item_spec,
    pack_plan,
    ring_leaves,
    row_layout,
    set_all,
    view_plan,
)
from lightning_per.replay.slots import cursor_slots, filled_slots
from lightning_per.replay.storage_checkpoint import (
    check_storage_state,
    packed_parts,
    packed_state,
    read_saved,
    save_state,
    saved_leaves,
    stamped,
    stored_fields,
    without_index,
)
from lightning_per.schema import SCHEMA_KEY

__all__ = ["LAYOUTS", "GPUTensorStorage", "default_device", "resolve_device"]


def _writer_tag(value, slots: torch.Tensor) -> bool:
    """Whether a first write's ``"index"`` entry is a writer's tag (TorchRL's writers set each item's slot under
    ``"index"`` before the write): one int64 per item, equal to the slots. Else it is a field, stored."""
    if not (isinstance(value, torch.Tensor) and value.dtype == torch.int64 and value.shape == slots.shape):
        return False
    return bool((value.cpu() == slots).all())  # sync-ok: once, at the storage's first write


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

#: where a storage keeps its items (:attr:`GPUTensorStorage.layout`): ``"ring"`` this class's preallocated ring
#: (:class:`~lightning_per.replay.ring.RingState`), ``"torchrl"`` TorchRL's own layout and code, ``"host"`` a packed
#: ring in host memory read by the device (:class:`~lightning_per.replay.host.PinnedHostStorage`), ``"frames"`` a
#: ring of deduplicated frames beside the ring of the other keys
#: (:class:`~lightning_per.replay.frames.FrameStackStorage`).
LAYOUTS = ("ring", "torchrl", "host", "frames")


class GPUTensorStorage(LazyTensorStorage):
    """Ring storage of transitions preallocated on ``device`` at the first write.

    Args:
        max_size: capacity in transitions (>= 1).
        device: where the data lives; default ``cuda`` when available, else ``cpu``.
        fallback: on CUDA out-of-memory at allocation, keep the data on the CPU instead (one
            :class:`RuntimeWarning`); with ``False`` the OOM error propagates.
        packed: keep all keys in one ring of rows (one gather per read, see Layout). Default False. Either way
            batches are plain contiguous tensors, as TorchRL's.
        ndim: dimensions of the storage's batch (TorchRL's ``ndim``: ``2`` keeps ``[n_envs, T]`` batches of a
            parallel collector as ``[T, n_envs]`` rows); ``ndim > 1`` uses TorchRL's layout (see Layout).
        compilable, consolidated, shared_init, cleanup_memmap: as TorchRL's ``LazyTensorStorage``
            (``consolidated`` and ``shared_init`` use TorchRL's layout).

    Layout (:attr:`layout` ``"ring"``): a :class:`~tensordict.TensorDict` of batch ``[max_size]``, one tensor per
    key (e.g. ``observation: (max_size, 4) float32``), on :attr:`device`, its buffers and read plans held in
    :attr:`ring` (a :class:`~lightning_per.replay.ring.RingState`). With ``packed=True`` every key is a view into
    one row-major ``(max_size, row_bytes / 8) int64`` ring (``ring.rows``):
    each transition is one row of ``row_bytes`` bytes (its fields at offsets aligned to their element
    size, the row padded to 8 bytes), so a read of ``B`` transitions is a single gather kernel, whatever
    the number of keys, then one copy (:func:`lightning_per.replay.rows.batch_views`) cuts the gathered
    ``(B, row_bytes / 8)`` block into one contiguous tensor per field, each in memory of its own
    (``torch.save`` of the batch and ``.view`` of a field work as unpacked). The DQN module uses it.
    Keys whose element size exceeds 8 bytes (e.g. complex128) keep one tensor each (``packed`` then
    has no effect). Items the ring does not hold (the module docstring lists them) are stored as TorchRL's
    ``LazyTensorStorage`` stores them, on :attr:`device` (:attr:`layout` ``"torchrl"``, decided at
    construction for ``ndim > 1``, ``consolidated`` and ``shared_init``, else at the first write or load;
    ``packed`` has no effect).

    Reads: one path, :meth:`read` of slots. ``get(index)`` with a 1-D slot tensor (a sampler's draw) reads the
    whole ring (static shapes, no host length involved: the slots must lie in ``[0, len(self))``); every other
    read, ``storage[index]`` included, indexes the filled part ``[0, len(self))`` only, as TorchRL's
    (``storage[-1]`` is the last filled slot, ``storage[len(self)]`` raises IndexError). Writes: one path,
    :meth:`write_direct` of matched fields (:meth:`set` checks a batch, then writes through it).

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
        >>> storage
        GPUTensorStorage(max_size=8, device=cpu, layout='ring', packed=True, len=3)
        >>> tuple(storage.ring.rows.shape)  # 3 of 8 slots written; one row of 3 words each
        (8, 3)
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
        #: where the items live (one of :data:`LAYOUTS`): ``"ring"`` until a first write or load the ring cannot
        #: hold makes it ``"torchrl"`` for good (see Layout); the subclasses hold theirs from construction
        self.layout = "torchrl" if ndim > 1 or bool(consolidated) or bool(shared_init) else "ring"
        self._spec: dict | None = None
        #: ``(max_size,) bool`` on the device, the written slots a sampler may draw, or None: every written slot
        #: (:class:`~lightning_per.replay.frames.FrameStackStorage` holds a mask)
        self.slot_valid: torch.Tensor | None = None
        #: the ring's buffers and the plans of its read and write paths (empty before the first write, and in
        #: TorchRL's layout)
        self.ring = RingState()
        #: the most transitions one write (``set``, a buffer's ``extend``) takes, or None: any number
        #: (:class:`~lightning_per.replay.frames.FrameStackStorage` holds a bound; writer ingest extends in chunks)
        self.write_limit: int | None = None

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(max_size={self.max_size}, device={self.device}, layout={self.layout!r}, "
                f"packed={self.packed}, len={len(self)})")

    # ------------------------------------------------------------------ allocation
    def _choose_layout(self, data: Any, batched: bool = True) -> str:
        """:attr:`layout` for a write of ``data``: the first write of a ``"ring"`` storage whose item the ring
        cannot hold (it holds a TensorDict of dense tensors with one batch dimension, ``batched``, or none) makes
        it ``"torchrl"`` for good."""
        if self.layout == "ring" and not self.initialized and not (
                isinstance(data, TensorDictBase) and data.batch_dims == int(batched) and ring_leaves(data)):
            self.layout = "torchrl"
        return self.layout

    def _init_standard(self, data: TensorDictBase | torch.Tensor) -> None:
        if self._choose_layout(data, batched=False) == "torchrl":
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
        """Preallocate the ring for items like ``item`` (batch ``[]``) on ``device``."""
        leaves = dict(item.items(include_nested=True, leaves_only=True))  # a field named "index" too
        layout, row_bytes = row_layout({k: (tuple(v.shape), v.dtype) for k, v in leaves.items()})
        ring = self.ring = RingState()
        if self.packed and layout is not None:
            ring.rows = torch.zeros((self.max_size, row_bytes // 8), dtype=torch.int64, device=device)
            ring.layout, ring.plan, ring.pack = layout, view_plan(layout, row_bytes // 8), pack_plan(layout)
            ring.ring_bytes = ring.rows.view(torch.uint8)  # (max_size, row_bytes)
            tensors = field_views(ring.rows, layout)
        else:
            tensors = {k: torch.zeros((self.max_size, *v.shape), dtype=v.dtype, device=device)
                       for k, v in leaves.items()}
        self._storage = TensorDict(tensors, batch_size=[self.max_size], device=device)
        self._index_flat()
        self.initialized = True

    def __getstate__(self) -> dict[str, Any]:
        """Pickle / ``copy.deepcopy`` state: TorchRL's, without the ops backend a subclass holds (``ops``, which may
        be a module; the subclass's ``__setstate__`` chooses it again)."""
        state = super().__getstate__()
        state.pop("ops", None)
        return state

    def __setstate__(self, state) -> None:
        """TorchRL's unpickling (``pickle``, ``copy.deepcopy``, a spawned process), then the ring's views relinked
        (:meth:`_index_flat`)."""
        super().__setstate__(state)
        if self.initialized and self._storage is not None and self.layout != "torchrl":
            self._index_flat()

    def _index_flat(self) -> None:
        """Make the ring's read and write plans the stored tensors': the leaf cache (nested keys as tuples), the
        write spec and, for a packed ring, the fields and the byte view as views of ``ring.rows``. Unpickling
        copies each tensor on its own (and ``copy.deepcopy`` of a TensorDict copies its leaves), so this relinks
        them (the copies hold the same values: nothing is copied here). The ring's device is kept once set (a
        subclass may read batches onto another device than the fields', see the host storage)."""
        ring = self.ring
        if ring.rows is not None:
            ring.ring_bytes, ring.pack_bytes = ring.rows.view(torch.uint8), None
            for key, view in field_views(ring.rows, ring.layout).items():
                self._storage.set(key, view)
        keys = list(self._storage.keys(include_nested=True, leaves_only=True))
        ring.flat = {k: self._storage.get(k) for k in keys}
        ring.nested = any(isinstance(k, tuple) for k in keys)
        # per flat key: (ring tensor, dtype, per-item shape), what a write checks a batch against; a stored "index"
        # field is written on its own (:meth:`_with_index`)
        ring.flat_spec = {k: (v, v.dtype, v.shape[1:]) for k, v in ring.flat.items() if k != "index"}
        if ring.device is None:
            ring.device = self._storage.device
        self._spec = item_spec(self._storage)

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
        if self.layout == "torchrl":
            return sum(v.numel() * v.element_size() for v in tree_leaves(
                self._storage.to_dict() if isinstance(self._storage, TensorDictBase) else self._storage)
                if isinstance(v, torch.Tensor))
        return sum(t.numel() * t.element_size() for t in self.ring.tensors())

    # ------------------------------------------------------------------ writes
    def check_spec(self, data: TensorDictBase) -> None:
        """Raise if a batch ``data`` (batch dim first) cannot be written; changes nothing.

        Raises:
            TypeError: ``data`` is not a TensorDict, a key has another dtype, or a leaf is not a dense, strided
                tensor (sparse, in every layout: :func:`~lightning_per.replay.rows.check_dense`).
            ValueError: other keys, or another per-item shape, than the stored ones; a leaf on the ``"meta"``
                device (in every layout).
        """
        check_dense(data)
        if self._choose_layout(data) == "torchrl":
            return  # TorchRL's layout: TorchRL's write checks
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"data must be a TensorDict with a leading batch dimension, got "
                            f"{type(data).__name__}")
        if self._spec is None:
            return
        got = item_spec(data.exclude("index") if "index" in data.keys() else data)
        want = {k: v for k, v in self._spec.items() if k != "index"}  # "index": see _with_index
        if set(got) != set(want):
            missing, extra = sorted(map(str, set(want) - set(got))), sorted(map(str, set(got) - set(want)))
            raise ValueError(f"data keys differ from the stored spec: missing {missing}, unexpected {extra}")
        for key, (shape, dtype) in want.items():
            if got[key][0] != shape:
                raise ValueError(f"data[{key!r}] has per-item shape {got[key][0]}, the storage holds {shape}")
            if got[key][1] != dtype:
                raise TypeError(f"data[{key!r}] has dtype {got[key][1]}, the storage holds {dtype}")

    def set(self, cursor, data, *, set_cursor: bool = True) -> None:
        """Write ``data`` (batch ``[n]``) at slots ``cursor`` (``(n,)`` int64 tensor, slice, range, sequence or int).

        Checked (:meth:`check_spec`), then written through :meth:`write_direct`: a device-to-device copy (``data``
        is moved with ``non_blocking=True`` if it is elsewhere). With ``set_cursor`` the host length grows by
        ``n`` up to ``max_size`` (ring writes). A cursor longer than the ring (a batch of more than ``max_size``
        items) repeats slots: each keeps its last write, on every device. TorchRL's layout: TorchRL's ``set``.

        Raises:
            TypeError/ValueError: as :meth:`check_spec`, before anything changes.
            RuntimeError: ``cursor`` names another number of slots than ``data`` holds (nothing changes).
        """
        single = isinstance(data, TensorDictBase) and data.batch_dims == 0
        if self._choose_layout(data, batched=not single) == "torchrl":
            # TorchRL's set, named on its class: torch.compile(fullgraph=True) cannot trace super() to it
            return _TORCHRL_SET(self, cursor, data, set_cursor=set_cursor)
        if single:
            data = data.unsqueeze(0)
            cursor = torch.as_tensor([cursor]) if isinstance(cursor, int) else cursor
        self.check_spec(data)
        if not data.batch_size[0]:
            return  # nothing to write (an empty batch)
        if not self.initialized:
            tag = "index" in data.keys() and _writer_tag(data.get("index"), cursor_slots(cursor, self.max_size, "cpu"))
            self._init((data.exclude("index") if tag else data)[0])
        pairs = self._with_index(match_pairs(self.ring, data), data)
        if pairs is None:
            raise ValueError(f"data must be a TensorDict of batch [n] holding the stored keys, got batch "
                             f"{tuple(data.batch_size)}")
        slots = cursor_slots(cursor, self.max_size, self.ring.device)
        if slots.shape[0] != data.batch_size[0]:
            raise RuntimeError(f"cursor names {slots.shape[0]} slots for a batch of {data.batch_size[0]} items")
        self.write_direct(slots, pairs, set_cursor=set_cursor)

    def direct_pairs(self, data) -> dict[str, tuple[torch.Tensor, torch.Tensor]] | None:
        """``{key: (ring tensor, data tensor)}`` in ``data``'s key order, when ``data`` is a TensorDict ``[n]``
        (``n >= 1``) whose top-level tensors, but ``"index"``, are exactly the stored keys with the stored
        per-item shapes and dtypes (what :meth:`check_spec` accepts, for flat storages); else None (the
        caller takes the checked path, :meth:`set`, which raises the documented errors). Changes nothing
        (:func:`lightning_per.replay.ring.match_pairs`)."""
        if not self.initialized:
            return None
        return self._with_index(match_pairs(self.ring, data), data)

    def _with_index(self, pairs, data):
        """``pairs`` plus the stored ``"index"`` field's pair, when the ring holds one (its first write held a field
        named ``"index"``: stored like any other): ``data``'s ``"index"``, or None where ``data`` has none (the
        written slots are stored, what TorchRL's writer tags a batch with). A ring without one ignores a batch's
        ``"index"`` (a writer's tag)."""
        column = self.ring.flat.get("index") if pairs is not None else None
        if column is None:
            return pairs
        value = data.get("index") if "index" in data.keys() else None
        if value is not None and value.shape[1:] != column.shape[1:] and value.shape != data.batch_size:
            raise ValueError(f"data['index'] has per-item shape {tuple(value.shape[1:])}, the storage holds "
                             f"{tuple(column.shape[1:])}")
        return {**pairs, "index": (column, value)}

    def write_direct(self, cursor: torch.Tensor, pairs, start: int | None = None, *, set_cursor: bool = True) -> None:
        """The write path: ``pairs`` from :meth:`direct_pairs` (already checked) at slots ``cursor`` ``(n,)`` int64,
        through :func:`lightning_per.replay.ring.write_pairs` (``start``: ``cursor`` is ``range(start, start +
        n)``, one slot per value), then, with ``set_cursor``, the host length; then TorchRL's mutation counter."""
        index = pairs.get("index")
        if index is not None:  # the stored "index" field: the batch's values, else the slots (_with_index)
            column, value = index
            value = (cursor if value is None else value).to(column.dtype)
            value = value.reshape(value.shape + (1,) * (column.dim() - value.dim()))
            pairs = {**pairs, "index": (column, value.expand(cursor.shape[0], *column.shape[1:]).contiguous())}
        cursor = write_pairs(self.ring, cursor, pairs, start, self.max_size)
        if set_cursor:
            self._last_cursor = cursor
            self._len = min(self._len + cursor.shape[0], self.max_size)
        self._bump_revision()

    # ------------------------------------------------------------------ reads
    def get(self, index):
        """Transitions at ``index``: for a ``(B,)`` int64 slot tensor (a sampler's draw) a TensorDict ``[B]`` on the
        device read from the whole preallocated ring (:meth:`read`; no slicing by the host length: static shapes;
        the slots lie in ``[0, len(self))``); for any other index (int, slice, list, tuple) the filled part
        ``[0, len(self))`` indexed as TorchRL's storages do (``storage[index]``).

        Raises:
            RuntimeError: nothing was ever written.
            IndexError: an int or list index outside the filled part.
        """
        if (self.layout != "torchrl" and isinstance(index, torch.Tensor) and index.ndim == 1
                and index.dtype != torch.bool):
            return self.read(index)
        return self[index]

    def __getitem__(self, index):
        """``storage[index]`` (``rb[index]`` reads through it): the filled part ``[0, len(self))`` indexed by
        ``index`` (an int, slice, list, range, array, bool mask or tensor; negative values count from the end of
        the filled part), as TorchRL's: a slice, ``...``, a key or a tuple gives views into the stored tensors
        (``rb[:].set_(...)`` writes through them) in the ``"ring"`` layout; every other index is mapped to its
        slots (:func:`lightning_per.replay.slots.filled_slots`) and read (:meth:`read`). A CUDA index tensor is
        wrapped on the device, without a bounds check (that would synchronise): its values must lie in
        ``[-len(self), len(self))``.

        Raises:
            RuntimeError: nothing was ever written.
            IndexError: an index outside the filled part (host-side indices).
        """
        if self.layout == "torchrl":
            return LazyTensorStorage.get(self, index)
        if not self.initialized:
            raise RuntimeError(f"Cannot read from an empty {type(self).__name__}: extend it first")
        n = len(self)
        if self.layout == "ring" and not isinstance(index, (int, list, range, torch.Tensor, np.ndarray)):
            return (self._storage if n >= self.max_size else self._storage[:n])[index]  # TorchRL's views
        return self.read(filled_slots(index, n))

    def read(self, index, extra: dict[str, torch.Tensor] | None = None):
        """The read path: the transitions at slots ``index`` (a ``(B,)`` int64 tensor, or a 0-d one for one
        transition), with the ``(B,)`` tensors of ``extra`` set in the batch (e.g. ``"index"`` and
        ``"priority_weight"``: a sampler's ``sample_gather``). A TensorDict ``[B]`` on the device, read from the
        whole ring (:func:`lightning_per.replay.ring.read_slots`: one gather of whole rows when packed) and built
        once when ``extra``'s tensors are ``(B,)`` on the device; other values of ``extra`` are set validated
        (moved, or rejected). TorchRL's layout: TorchRL's ``get``.

        Raises:
            RuntimeError: nothing was ever written.
        """
        if self.layout == "torchrl":
            return set_all(LazyTensorStorage.get(self, index), extra)
        if not self.initialized:
            raise RuntimeError(f"Cannot read from an empty {type(self).__name__}: extend it first")
        ring = self.ring
        if not isinstance(index, torch.Tensor) or index.ndim != 1:
            if isinstance(index, torch.Tensor) and index.device != ring.device:
                index = index.to(ring.device, non_blocking=True)
            return set_all(self._storage[index], extra)
        for value in (extra or {}).values():  # a loop, not all(<genexpr>): fewer Python calls on the hot path
            if not (isinstance(value, torch.Tensor) and value.device == ring.device and value.shape == index.shape):
                return set_all(read_slots(ring, index), extra)  # validated sets (they move or reject such values)
        return read_slots(ring, index, extra)

    def write_example(self) -> TensorDictBase | dict[Any, torch.Tensor] | None:
        """One stored transition as a batch ``[1]`` of the layout a write takes (the stored keys, nested ones
        included, per-item shapes and dtypes; views on :attr:`device`, their values whatever slot 0 holds), or None
        before the first write: what the writer handles of a buffer copy their layout from.

        Example::

            >>> import torch
            >>> from tensordict import TensorDict
            >>> from lightning_per import GPUTensorStorage
            >>> storage = GPUTensorStorage(8, device="cpu")
            >>> storage.write_example() is None
            True
            >>> storage.set(torch.arange(2), TensorDict({"obs": torch.ones(2, 3)}, [2]))
            >>> storage.write_example()["obs"].shape
            torch.Size([1, 3])
        """
        if not self.initialized or self._storage is None:
            return None
        data = self._storage[:1]  # views: (1, ...) each
        return data.exclude("index") if isinstance(data, TensorDictBase) else data  # "index": TorchRL's tag

    @property
    def gather_rows(self) -> torch.Tensor | None:
        """The packed ring ``ring.rows`` ``(max_size, W) int64`` when a gathered block of its rows is a whole batch
        (:meth:`rows_to_batch`: the ``"ring"`` layout, packed, written at least once); else None. What a sampler's
        fused sample + gather reads (:meth:`GPUPrioritizedSampler.sample_gather`)."""
        return self.ring.rows if self.layout == "ring" else None

    def rows_to_batch(self, block: torch.Tensor, extra: dict[str, torch.Tensor] | None = None,
                      contiguous: bool = True):
        """The batch of gathered packed rows: ``block`` ``(B, W) int64`` on :attr:`device`, a fresh contiguous
        gather of :attr:`gather_rows` (``rows[index]``, or the fused sample + gather op), becomes the
        TensorDict ``[B]`` that :meth:`read` ``(index)`` returns (the same fields, copied out of ``block``,
        :func:`lightning_per.replay.ring.rows_batch`; with ``contiguous=False`` strided views into ``block``, no
        copy), plus the ``(B,)`` tensors of ``extra`` on :attr:`device` (e.g. ``"index"``, ``"priority_weight"``),
        set without validation.

        Raises:
            RuntimeError: the storage has no packed ring (:attr:`gather_rows` is None).
        """
        if self.gather_rows is None:
            raise RuntimeError("rows_to_batch needs a packed GPUTensorStorage, written at least once")
        return rows_batch(self.ring, block, extra, contiguous)

    # ------------------------------------------------------------------ persistence (pure functions of
    # replay/storage_checkpoint.py)
    def state_dict(self) -> dict[str, Any]:
        """TorchRL's storage state (``_storage``: one tensor per key, ``initialized``, ``_len``); a packed
        ring saves its rows once instead (``packed_rows`` + ``packed_layout``, schema 2,
        :func:`~lightning_per.replay.storage_checkpoint.packed_state`): ``torch.save`` cannot store views of one
        buffer under different dtypes, and a per-key copy would double the device memory while saving."""
        if self.ring.rows is None or self.layout == "torchrl":
            return stamped(LazyTensorStorage.state_dict(self))
        return packed_state(self.ring, self.initialized, self._len)

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raise what :meth:`load_state_dict` refuses, changing nothing (the replay buffer checks every part of
        a checkpoint this way before it loads any): a newer schema, another ``max_size``, a length outside
        ``[0, max_size]``, missing entries, a packed layout that does not fit its rows and, once this storage
        holds transitions, other keys, dtypes or per-transition shapes than it stores
        (:func:`~lightning_per.replay.storage_checkpoint.check_storage_state`). Shapes and metadata only (no
        tensor data is read).

        Raises:
            ValueError: the checkpoint is refused (the message names why).
        """
        fields = stored_fields(self.ring, self._storage) if self.initialized and self.layout != "torchrl" else {}
        check_storage_state(state_dict, max_size=self.max_size, ndim=self.ndim, generic=self.layout == "torchrl",
                            fields=fields)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state from :meth:`state_dict` (packed or per-key, into a packed or per-key storage).

        Raises:
            ValueError: as :meth:`check_state_dict`, before anything changes.
        """
        self.check_state_dict(state_dict)
        self._load(state_dict)

    def _load(self, state_dict: dict[str, Any]) -> None:
        """:meth:`load_state_dict` of a checked ``state_dict``."""
        if "packed_rows" in state_dict:
            rows, layout = packed_parts(state_dict)
            fields = field_views(rows, layout)
            if not self.initialized:
                self._allocate(TensorDict({k: v[0] for k, v in fields.items()}, batch_size=[]),
                               torch.device(self.device))
            if self.ring.rows is not None and self.ring.layout == layout:
                self.ring.rows.copy_(rows)
            else:
                for key, value in fields.items():
                    self._storage.get(key).copy_(value)
            self._loaded(state_dict)
            return
        stored = without_index(state_dict["_storage"], SCHEMA_KEY not in state_dict)
        if not self.initialized and not isinstance(stored, dict):
            self.layout = "torchrl"  # e.g. a storage of plain tensors
        leaves = saved_leaves(stored) if self.layout != "torchrl" else {}
        if not leaves:
            LazyTensorStorage.load_state_dict(self, dict(state_dict, _storage=stored)
                                              if self.layout != "torchrl" else state_dict)
            if self.initialized and self.layout != "torchrl":
                self._index_flat()
            return
        if not self.initialized:  # allocated from the saved leaves (nested keys from either tensordict format)
            item = TensorDict({}, batch_size=[])
            for key, value in leaves.items():
                item.set(key, value[0])
            self._allocate(item, torch.device(self.device))
        # the values copied leaf by leaf into the ring (not through TorchRL's load_state_dict, whose tensordict
        # state format differs across versions)
        for key, value in leaves.items():
            self._storage.get(key).copy_(value)
        self._loaded(state_dict)

    def _loaded(self, state_dict: dict[str, Any]) -> None:
        """The saved length and flag after a load of the values, and TorchRL's mutation counter."""
        self.initialized = bool(state_dict["initialized"])
        self._len = int(state_dict["_len"])
        self._bump_revision()

    def dumps(self, path: str | os.PathLike) -> None:
        """Save the whole ring to ``path/storage.pt`` in one ``torch.save`` (atomic: temp + rename); items kept in
        TorchRL's layout are saved by TorchRL's checkpointer (memory-mapped, pytrees too)."""
        if self.layout == "torchrl" and self.initialized:
            return LazyTensorStorage.dumps(self, path)
        save_state(path, self.state_dict())

    def loads(self, path: str | os.PathLike) -> None:
        """Load what :meth:`dumps` wrote (onto this storage's device), either format; TorchRL's layout without
        unpickling anything (:func:`~lightning_per.replay.storage_checkpoint.read_saved`).

        Raises:
            IntegrityError: a TorchRL-layout directory holding a link, a special file, a file that is not JSON
                or raw memory-mapped data, or metadata naming a file outside it.
            ValueError: as :meth:`check_state_dict`.
        """
        state = read_saved(path, torch.device(self.device))
        if state is None:  # TorchRL's checkpointer wrote it (checked): TorchRL's layout
            self.layout = "torchrl"
            return LazyTensorStorage.loads(self, path)
        self.load_state_dict(state)
