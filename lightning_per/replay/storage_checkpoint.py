"""Persistence of :class:`~lightning_per.replay.GPUTensorStorage` as pure functions its own ``state_dict``,
``check_state_dict``, ``load_state_dict``, ``dumps`` and ``loads`` call: the packed state (schema
:data:`STORAGE_SCHEMA_VERSION`), what a saved state must hold before anything loads (schema, slots, length, packed
layout, per-transition fields: host work on metadata only), the saved parts as the ring holds them, and the file
(atomic rename; TorchRL's layout checked before TorchRL reads it)."""

from __future__ import annotations

import copy
import inspect
import json
import math
import os
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from lightning_per.integrity import IntegrityError, refuse_pickled_files, walk_files
from lightning_per.replay.ring import RingState
from lightning_per.replay.rows import layout_key
from lightning_per.schema import SCHEMA_KEY, check, stamp
from lightning_per.utils import atomic_write

__all__ = ["STORAGE_MIGRATIONS", "STORAGE_SCHEMA_VERSION", "check_storage_state", "check_torchrl_layout",
           "packed_parts", "packed_state", "read_saved", "save_state", "saved_leaves", "stamped", "state_leaves",
           "stored_fields", "without_index"]

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


def without_index(stored: Any, foreign: bool) -> Any:
    """A saved ``TensorDict`` state, without the round-robin writer's ``"index"`` tag when it is ``foreign``
    (TorchRL's: its storages keep the writer's tag as a field). Our own states keep an ``"index"`` field: the ring
    stores one like any other field when its first write holds it."""
    if foreign and isinstance(stored, dict) and "index" in stored:
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
    foreign = SCHEMA_KEY not in state_dict  # TorchRL's state (no version of ours)
    state_dict = check(state_dict, "storage", STORAGE_SCHEMA_VERSION, STORAGE_MIGRATIONS, missing=0)
    missing = [k for k in ("_storage", "initialized", "_len") if k not in state_dict]
    if missing:
        raise ValueError(f"storage checkpoint lacks {missing}")
    if "packed_rows" in state_dict:
        slots, saved = _packed_fields(state_dict)
    else:
        stored = without_index(state_dict["_storage"], foreign)
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


def stamped(state: dict[str, Any]) -> dict[str, Any]:
    """A storage state (TorchRL's per-key one) stamped with :data:`STORAGE_SCHEMA_VERSION`."""
    return stamp(state, "storage", STORAGE_SCHEMA_VERSION)


def packed_state(ring: RingState, initialized: bool, length: int) -> dict[str, Any]:
    """The state of a packed ring (schema 2): its rows once (``packed_rows``, ``(max_size, W) int64``, not
    copied), their layout (``packed_layout``: ``[key, byte offset, bytes, dtype name, shape]`` per field), with
    ``initialized`` and the host length ``_len`` (``_storage`` empty)."""
    layout = [(key, off, nbytes, str(dtype).removeprefix("torch."), list(shape))
              for key, (off, nbytes, dtype, shape) in ring.layout.items()]
    return stamped({"_storage": {}, "packed_rows": ring.rows, "packed_layout": layout, "initialized": initialized,
                    "_len": length})


def packed_parts(state_dict: dict[str, Any]) -> tuple[torch.Tensor, dict[Any, tuple[int, int, torch.dtype,
                                                                                   tuple[int, ...]]]]:
    """``(rows, layout)`` of a checked packed state (:func:`packed_state`): the ``(slots, W) int64`` rows and the
    layout as :class:`RingState` holds it (``{key: (offset, bytes, dtype, shape)}``)."""
    layout = {layout_key(k): (off, nbytes, getattr(torch, dtype), tuple(shape))
              for k, off, nbytes, dtype, shape in state_dict["packed_layout"]}
    return state_dict["packed_rows"], layout


def saved_leaves(stored: Any) -> dict[Any, torch.Tensor]:
    """``{key: (slots, *shape) tensor}`` of a saved per-key ``_storage`` (:func:`state_leaves`), or ``{}`` when it
    is not a TensorDict state (a tensor, a pytree: TorchRL's layout)."""
    return state_leaves(stored) if isinstance(stored, dict) else {}


def stored_fields(ring: RingState, stored: TensorDictBase) -> dict[Any, tuple[torch.dtype, tuple[int, ...]]]:
    """``{key: (dtype, shape of one transition)}`` of what a ring holds (a packed ring's layout, else the leaves
    of ``stored``, the ``(max_size, ...)`` TensorDict): what a checkpoint's fields are checked against."""
    if ring.rows is not None:
        return {k: (dtype, tuple(shape)) for k, (_, _, dtype, shape) in ring.layout.items()}
    return {(k if isinstance(k, str) or len(k) > 1 else k[0]): (v.dtype, tuple(v.shape[1:]))
            for k, v in stored.items(include_nested=True, leaves_only=True)}


def save_state(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """``torch.save`` of a storage ``state`` to ``path/storage.pt``, atomically (temp + rename)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    atomic_write(path / "storage.pt", lambda f: torch.save(state, f))


def read_saved(path: str | os.PathLike, device: torch.device) -> dict[str, Any] | None:
    """The state :func:`save_state` wrote under ``path`` (tensors onto ``device``, ``weights_only``), or None when
    ``path`` holds TorchRL's checkpointer layout instead (``storage_metadata.json``), checked by
    :func:`check_torchrl_layout` (load it with TorchRL's ``loads``).

    Raises:
        IntegrityError: a TorchRL-layout directory that :func:`check_torchrl_layout` refuses.
    """
    if not (Path(path) / "storage.pt").is_file() and (Path(path) / "storage_metadata.json").is_file():
        check_torchrl_layout(path)
        return None
    return torch.load(Path(path) / "storage.pt", map_location=device, weights_only=True)


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
