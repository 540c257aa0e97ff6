"""Checkpoint checks of :class:`~lightning_per.replay.GPUTensorStorage`: what a saved storage state must hold before
anything loads (schema, slots, length, packed layout, per-transition fields). Host work on metadata only."""

from __future__ import annotations

import copy
import math
from typing import Any

import torch

from lightning_per.replay.rows import layout_key

__all__ = ["STORAGE_SCHEMA_VERSION", "check_storage_state", "state_leaves", "without_index"]

STORAGE_SCHEMA_VERSION = 2  # 2: packed storages save their ring of rows (packed_rows)


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
    version = state_dict.get("_schema_version", 0)
    if version > STORAGE_SCHEMA_VERSION:
        raise ValueError(f"storage checkpoint schema {version} is newer than this code "
                         f"({STORAGE_SCHEMA_VERSION}); upgrade lightning_per")
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
