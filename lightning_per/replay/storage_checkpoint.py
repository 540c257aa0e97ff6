"""Persistence of :class:`~lightning_per.replay.GPUTensorStorage`: its ``state_dict`` (schema
:data:`STORAGE_SCHEMA_VERSION`), what a saved state must hold before anything loads (schema, slots, length, packed
layout, per-transition fields: host work on metadata only), the load, and ``dumps`` / ``loads`` (atomic rename)."""

from __future__ import annotations

import copy
import inspect
import json
import math
import os
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage

from lightning_per.integrity import IntegrityError, refuse_pickled_files, walk_files
from lightning_per.replay.rows import field_views, item_spec, layout_key
from lightning_per.schema import check, stamp
from lightning_per.utils import atomic_write

__all__ = ["STORAGE_MIGRATIONS", "STORAGE_SCHEMA_VERSION", "StorageCheckpoint", "check_storage_state",
           "check_torchrl_layout", "state_leaves", "without_index"]

STORAGE_SCHEMA_VERSION = 2  # 2: packed storages save their ring of rows (packed_rows)


def _per_key_layout(state_dict: dict[str, Any]) -> dict[str, Any]:
    """A version-0 state (TorchRL's own storage state, no version) or version-1 state (the same layout,
    stamped) as the next version: both hold ``_storage`` with one tensor per key, ``initialized`` and ``_len``,
    which every later version still reads as is (version 2 only added the packed layout beside it)."""
    return dict(state_dict)


#: ``{v: f}``: ``f`` turns a storage state of schema ``v`` into one of ``v + 1`` (:func:`lightning_per.schema.check`).
STORAGE_MIGRATIONS = {0: _per_key_layout, 1: _per_key_layout}


def state_leaves(stored, prefix: tuple[str, ...] = ()) -> dict[Any, torch.Tensor]:
    """``{key: tensor}`` (a str, or a tuple for a nested key) of a ``TensorDict.state_dict()``, in either
    tensordict format: flat with ``"."``-joined keys (e.g. tensordict 0.14) or nested dicts carrying
    ``"__batch_size"``/``"__device"`` entries at every level (e.g. 0.11); the metadata is skipped."""
    leaves = {}
    for name, value in stored.items():
        if not isinstance(name, str) or name in ("__batch_size", "__device"):
            continue
        key = prefix + tuple(name.split("."))
        if isinstance(value, dict):
            leaves.update(state_leaves(value, key))
        elif isinstance(value, torch.Tensor):
            leaves[key[0] if len(key) == 1 else key] = value
    return leaves


def without_index(stored: Any) -> Any:
    """A saved ``TensorDict`` state without the round-robin writer's ``"index"`` tag (TorchRL's storages keep it
    as a field; this ring never stores it)."""
    if isinstance(stored, dict) and "index" in stored:
        stored = copy.copy(stored)  # keeps the state's own attributes (tensordict's nesting metadata)
        del stored["index"]
    return stored


def check_storage_state(state_dict: Any, *, max_size: int, ndim: int, generic: bool,
                        fields: dict[Any, tuple[torch.dtype, tuple[int, ...]]]) -> None:
    """Raise what a storage of ``max_size`` slots refuses to load, changing nothing: a newer schema, another
    number of slots, a length outside ``[0, max_size]``, missing entries, a packed layout that does not fit its
    rows and, when ``fields`` (``{key: (dtype, per-transition shape)}`` of what the storage holds) is not empty,
    other keys, dtypes or shapes. ``generic`` / ``ndim > 1``: the state is in TorchRL's layout (TorchRL's load
    checks its fields). Shapes and metadata only (no tensor data is read).

    Raises:
        ValueError: the checkpoint is refused (the message names why).
    """
    if not isinstance(state_dict, dict):
        raise ValueError(f"storage checkpoint must be a dict, got {type(state_dict).__name__}")
    state_dict = check(state_dict, "storage", STORAGE_SCHEMA_VERSION, STORAGE_MIGRATIONS, missing=0)
    missing = [k for k in ("_storage", "initialized", "_len") if k not in state_dict]
    if missing:
        raise ValueError(f"storage checkpoint lacks {missing}")
    if "packed_rows" in state_dict:
        slots, saved = _packed_fields(state_dict)
    else:
        stored = without_index(state_dict["_storage"])
        leaves = state_leaves(stored) if isinstance(stored, dict) else {}
        if generic or not isinstance(stored, dict) or ndim > 1:
            leaves = {}  # TorchRL's layout (a tensor, a pytree, batch dims of their own): TorchRL's load
        slots = next(iter(leaves.values())).shape[0] if leaves else max_size
        if any(v.shape[0] != slots for v in leaves.values()):
            raise ValueError("storage checkpoint's fields hold different numbers of slots")
        saved = {k: (v.dtype, tuple(v.shape[1:])) for k, v in leaves.items()}
    if slots != max_size:
        raise ValueError(f"the saved storage holds {slots} slots, this one max_size={max_size}")
    n = state_dict["_len"]
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= max_size:
        raise ValueError(f"storage checkpoint's length must be an int in [0, {max_size}], got {n!r}")
    if not isinstance(state_dict["initialized"], bool):
        raise ValueError(f"storage checkpoint's 'initialized' must be a bool, got {state_dict['initialized']!r}")
    if n and not state_dict["initialized"]:
        raise ValueError(f"storage checkpoint holds {n} transitions but says it is not initialized (an uninitialized "
                         "storage is empty): the checkpoint is corrupted")
    have = fields
    if have and saved != have:
        diff = sorted((k for k in set(have) | set(saved) if have.get(k) != saved.get(k)), key=str)
        names = [str(k) for k in diff]
        raise ValueError(f"storage checkpoint's transitions differ from this storage's in {names}: saved "
                         f"{ {k: saved.get(k) for k in diff} }, stored { {k: have.get(k) for k in diff} }")


def _packed_fields(state_dict: dict[str, Any]) -> tuple[int, dict[Any, tuple[torch.dtype, tuple[int, ...]]]]:
    """``(slots, {key: (dtype, shape)})`` of a packed state's ``packed_rows`` and ``packed_layout``.

    Raises:
        ValueError: the rows are not a 2-D tensor, or a layout entry is malformed or does not fit the rows.
    """
    rows, layout = state_dict["packed_rows"], state_dict.get("packed_layout")
    if not isinstance(rows, torch.Tensor) or rows.dim() != 2 or not isinstance(layout, list):
        raise ValueError("storage checkpoint's packed_rows must be a (slots, words) tensor with a "
                         "packed_layout list")
    slots, row_bytes = rows.shape[0], rows.shape[1] * rows.element_size()
    saved = {}
    for entry in layout:
        try:
            key, off, nbytes, dtype, shape = entry
            dtype = getattr(torch, dtype)
        except (TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"storage checkpoint's packed_layout entry {entry!r} is not "
                             f"(key, offset, bytes, dtype, shape)") from err
        if not (isinstance(dtype, torch.dtype) and 0 <= off and off + nbytes <= row_bytes
                and nbytes == math.prod(shape) * dtype.itemsize):
            raise ValueError(f"storage checkpoint's packed_layout entry {entry!r} does not fit its "
                             f"{row_bytes}-byte rows")
        saved[layout_key(key)] = (dtype, tuple(shape))
    return slots, saved


class StorageCheckpoint:
    """The persistence methods of :class:`~lightning_per.replay.GPUTensorStorage` (``state_dict``,
    ``check_state_dict``, ``load_state_dict``, ``dumps``, ``loads``): the class takes them by assignment, so TorchRL's
    ``LazyTensorStorage`` stays its direct base; items kept in TorchRL's layout go through its methods."""

    def state_dict(self) -> dict[str, Any]:
        """TorchRL's storage state (``_storage``: one tensor per key, ``initialized``, ``_len``); a packed
        storage saves its ring of rows once instead (``packed_rows`` + ``packed_layout``, schema 2):
        ``torch.save`` cannot store views of one buffer under different dtypes, and a per-key copy would
        double the device memory while saving."""
        if self.rows is None or self._generic:
            state = LazyTensorStorage.state_dict(self)
            return stamp(state, "storage", STORAGE_SCHEMA_VERSION)
        layout = [(key, off, nbytes, str(dtype).removeprefix("torch."), list(shape))
                  for key, (off, nbytes, dtype, shape) in self._layout.items()]
        return stamp({"_storage": {}, "packed_rows": self.rows, "packed_layout": layout,
                      "initialized": self.initialized, "_len": self._len}, "storage", STORAGE_SCHEMA_VERSION)

    def _fields(self) -> dict[Any, tuple[torch.dtype, tuple[int, ...]]]:
        """``{key: (dtype, shape of one transition)}`` of the stored fields (empty before the first write)."""
        if not self.initialized or self._generic:
            return {}
        if self.rows is not None:
            return {k: (dtype, tuple(shape)) for k, (_, _, dtype, shape) in self._layout.items()}
        return {(k if isinstance(k, str) or len(k) > 1 else k[0]): (v.dtype, tuple(v.shape[1:]))
                for k, v in self._storage.items(include_nested=True, leaves_only=True)}

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raise what :meth:`load_state_dict` refuses, changing nothing (the replay buffer checks every part of
        a checkpoint this way before it loads any): a newer schema, another ``max_size``, a length outside
        ``[0, max_size]``, missing entries, a packed layout that does not fit its rows and, once this storage
        holds transitions, other keys, dtypes or per-transition shapes than it stores. Shapes and metadata
        only (no tensor data is read).

        Raises:
            ValueError: the checkpoint is refused (the message names why).
        """
        check_storage_state(state_dict, max_size=self.max_size, ndim=self.ndim, generic=self._generic,
                            fields=self._fields())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state from :meth:`state_dict` (packed or per-key, into a packed or per-key storage).

        Raises:
            ValueError: as :meth:`check_state_dict`, before anything changes.
        """
        self.check_state_dict(state_dict)
        if "packed_rows" in state_dict:
            self._load_packed(state_dict)
            return
        stored = without_index(state_dict["_storage"])
        if not self.initialized and not isinstance(stored, dict):
            self._generic = True  # e.g. a storage of plain tensors
        if self._generic:
            LazyTensorStorage.load_state_dict(self, state_dict)
            return
        state_dict = dict(state_dict, _storage=stored)
        leaves = state_leaves(stored) if isinstance(stored, dict) else {}
        for value in leaves.values():  # checked before anything changes (TorchRL's message names a batch size)
            if value.shape[0] != self.max_size:
                raise ValueError(f"the saved storage holds {value.shape[0]} slots, this one max_size={self.max_size}")
            break
        if leaves and not self.initialized:
            # allocate from the saved leaves (nested keys rebuilt from either tensordict format, see
            # _state_leaves)
            item = TensorDict({}, batch_size=[])
            for key, value in leaves.items():
                item.set(key, value[0])
            self._allocate(item, torch.device(self.device))
        if leaves:
            # the values copied leaf by leaf into the ring (not through TorchRL's load_state_dict, whose
            # tensordict state format differs across versions)
            for key, value in leaves.items():
                self._storage.get(key).copy_(value)
            self.initialized = bool(state_dict["initialized"])
            self._len = int(state_dict["_len"])
            self._bump_revision()
        else:
            LazyTensorStorage.load_state_dict(self, state_dict)
        if self.initialized:
            if self.rows is not None:
                self._repack()
            self._spec = item_spec(self._storage)
            self._index_flat()

    def _load_packed(self, state_dict: dict[str, Any]) -> None:
        rows = state_dict["packed_rows"]
        layout = {layout_key(k): (off, nbytes, getattr(torch, dtype), tuple(shape))
                  for k, off, nbytes, dtype, shape in state_dict["packed_layout"]}
        if rows.shape[0] != self.max_size:
            raise ValueError(f"the saved storage holds {rows.shape[0]} slots, this one max_size={self.max_size}")
        fields = field_views(rows, layout)
        if not self.initialized:
            self._allocate(TensorDict({k: v[0] for k, v in fields.items()}, batch_size=[]),
                           torch.device(self.device))
        if self.rows is not None and self._layout == layout:
            self.rows.copy_(rows)
        else:
            for key, value in fields.items():
                self._storage.get(key).copy_(value)
        self.initialized = bool(state_dict["initialized"])
        self._len = int(state_dict["_len"])
        self._bump_revision()

    def dumps(self, path: str | os.PathLike) -> None:
        """Save the whole ring to ``path/storage.pt`` in one ``torch.save`` (atomic: temp + rename); items kept in
        TorchRL's layout (:attr:`ring` False) are saved by TorchRL's checkpointer (memory-mapped, pytrees too)."""
        if self._generic and self.initialized:
            return LazyTensorStorage.dumps(self, path)
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = self.state_dict()
        atomic_write(path / "storage.pt", lambda f: torch.save(state, f))

    def loads(self, path: str | os.PathLike) -> None:
        """Load what :meth:`dumps` wrote (onto this storage's device), either format; TorchRL's layout without
        unpickling anything (see :func:`check_torchrl_layout`).

        Raises:
            IntegrityError: a TorchRL-layout directory holding a link, a special file, a file that is not JSON
                or raw memory-mapped data, or metadata naming a file outside it.
        """
        if not (Path(path) / "storage.pt").is_file() and (Path(path) / "storage_metadata.json").is_file():
            check_torchrl_layout(path)
            self._generic = True  # TorchRL's checkpointer wrote it: TorchRL's layout
            return LazyTensorStorage.loads(self, path)
        state = torch.load(Path(path) / "storage.pt", map_location=torch.device(self.device), weights_only=True)
        self.load_state_dict(state)


#: tensordict's ``load_memmap`` takes a pickle policy (``allow_pickle``) from 0.14 on; older releases unpickle any
#: ``*.pickle`` they meet, which :func:`check_torchrl_layout` refuses before they run
_MEMMAP_PICKLE_POLICY = "allow_pickle" in inspect.signature(TensorDict.load_memmap).parameters


def check_torchrl_layout(path: str | os.PathLike) -> None:
    """Refuse a directory in TorchRL's storage layout (its checkpointer: ``storage_metadata.json``, tensordict's
    memory-mapped tensors and ``meta.json`` files) that a load could make run code or read outside it.

    - every entry is a regular file or directory, none a link (:func:`lightning_per.integrity.walk_files`) and
      every file JSON or raw ``.memmap`` data (tensordict keeps non-tensor fields in ``*.pickle`` files);
    - a pytree layout's metadata names only files of the directory (TorchRL joins its keys into paths);
    - tensordict >= 0.14 opens the layout with ``allow_pickle=False`` first (memory maps, nothing copied): a
      pickle reached any other way is refused too.

    Raises:
        IntegrityError: naming the entry and what is wrong.
    """
    root = Path(path)
    files = walk_files(root)
    refuse_pickled_files(root, frozenset({".json", ".memmap"}))
    meta_file = root / "storage_metadata.json"
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise IntegrityError(f"{meta_file}: not TorchRL's storage metadata ({type(err).__name__})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("is_pytree"), bool) or not isinstance(
            meta.get("metadata"), dict):
        raise IntegrityError(f"{meta_file}: not TorchRL's storage metadata (no 'is_pytree' / 'metadata' entries)")
    if meta["is_pytree"]:
        for key in meta["metadata"]:
            rel = f"{str(key).replace('.', '/')}.memmap"
            if rel not in files:
                raise IntegrityError(f"{meta_file}: names {rel!r}, not a file of the directory {root}")
    elif _MEMMAP_PICKLE_POLICY:
        try:
            TensorDict.load_memmap(root, allow_pickle=False)
        except Exception as err:  # noqa: BLE001 - whatever tensordict raises, the directory is refused
            raise IntegrityError(f"{root}: refused by tensordict without unpickling ({type(err).__name__}: "
                                 f"{str(err).splitlines()[0][:200] if str(err) else ''})") from None
