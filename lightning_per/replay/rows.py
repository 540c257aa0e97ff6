"""The packed-row codec of :class:`~lightning_per.replay.GPUTensorStorage`: how a transition's fields become one
row of int64 words, and back (views, no copies).

A packed ring is a ``(max_size, row_bytes / 8) int64`` tensor; each field of a transition lies at a byte offset
aligned to its element size (:func:`row_layout`), and a batch's fields are views into a gathered block of rows
(:func:`field_views`, :func:`batch_views`). Pure functions of tensors and layouts; no state.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from tensordict import TensorDictBase

__all__ = ["batch_views", "field_views", "item_spec", "last_writes", "layout_key", "pack_plan", "ring_leaves",
           "row_layout", "set_all", "view_plan"]


def item_spec(td: TensorDictBase, skip_batch: int = 1) -> dict[Any, tuple[tuple[int, ...], torch.dtype]]:
    """``{key: (per-item shape, dtype)}`` of every leaf of ``td`` (nested keys as tuples), its first
    ``skip_batch`` dimensions dropped: what a write is checked against."""
    return {k: (tuple(v.shape[skip_batch:]), v.dtype)
            for k, v in td.items(include_nested=True, leaves_only=True)}


def row_layout(spec: dict[Any, tuple[tuple[int, ...], torch.dtype]]):
    """Byte offsets of each field in a packed row: ``({key: (offset, nbytes, dtype, shape)}, row_bytes)``.

    Fields go in order of decreasing element size (then insertion order), each at an offset aligned to
    its element size; the row is padded to a multiple of 8 bytes. ``(None, 0)`` if some element size
    exceeds 8 bytes."""
    sizes = {k: torch.empty((), dtype=dtype).element_size() for k, (_, dtype) in spec.items()}
    if any(es > 8 for es in sizes.values()):
        return None, 0
    layout, offset = {}, 0
    for key in sorted(spec, key=lambda k: -sizes[k]):  # stable: insertion order within a size
        shape, dtype = spec[key]
        es = sizes[key]
        offset = -(-offset // es) * es
        nbytes = es * math.prod(shape)
        layout[key] = (offset, nbytes, dtype, shape)
        offset += nbytes
    return layout, max(8, -(-offset // 8) * 8)


def field_views(rows: torch.Tensor, layout) -> dict[Any, torch.Tensor]:
    """Views ``(n, *shape) dtype`` of each field of ``rows`` ``(n, row_bytes / 8) int64`` (no copy)."""
    raw = rows.view(torch.uint8)  # (n, row_bytes)
    n = rows.shape[0]
    return {key: raw[:, off:off + nbytes].view(dtype).view(n, *shape)
            for key, (off, nbytes, dtype, shape) in layout.items()}


def view_plan(layout, row_words: int) -> tuple:
    """How :func:`batch_views` rebuilds :func:`field_views` of a fresh block in one view op per field
    (plus one ``view(dtype)`` per dtype other than int64): per field, in layout order,
    ``(key, dtype, scalar, offset, shape, strides)`` in units of the field's element size, taken from
    ``field_views`` itself (so sizes, strides and offsets are the same tensors' metadata)."""
    probe = torch.empty((2, row_words), dtype=torch.int64)
    plan = []
    for key, view in field_views(probe, layout).items():
        es = view.element_size()
        scalar = view.dim() == 1
        plan.append((key, view.dtype, scalar, view.storage_offset(), tuple(view.shape[1:]),
                     (row_words * 8 // es,) + tuple(view.stride()[1:])))
    return tuple(plan)


def pack_plan(layout) -> tuple | None:
    """How a batch's fields become the bytes ``[0, end)`` of their packed rows in one ``torch.cat``:
    ``((key, two_d), ...), end)`` in row order, skipping empty fields (``two_d``: the field is ``(n, k)``,
    whose ``view(uint8)`` is its ``(n, k * itemsize)`` bytes; other shapes are flattened to 2-D first).
    None if some field does not start where the previous one ends (no such layout comes out of
    :func:`row_layout`, which orders fields by decreasing element size: only the row's tail is padding)."""
    pack, end = [], 0
    for key, (off, nbytes, _, shape) in sorted(layout.items(), key=lambda kv: kv[1][0]):
        if not nbytes:
            continue
        if off != end:
            return None
        pack.append((key, len(shape) == 1))
        end = off + nbytes
    return (tuple(pack), end) if pack else None


def batch_views(block: torch.Tensor, layout, plan: tuple) -> dict[Any, torch.Tensor]:
    """:func:`field_views` of ``block`` ``(n, row_words) int64``, a fresh contiguous tensor (storage
    offset 0, e.g. a gather ``rows[index]``): the same views (sizes, strides, offsets), built with fewer
    ops (hot read path). ``n <= 1`` goes through :func:`field_views` (its size-0/1 batch dim gets other
    strides)."""
    n = block.shape[0]
    if n <= 1:
        return field_views(block, layout)
    bases = {torch.int64: block}
    out = {}
    for key, dtype, scalar, offset, shape, strides in plan:
        base = bases.get(dtype)
        if base is None:
            base = bases[dtype] = block.view(dtype)
        out[key] = base.select(1, offset) if scalar else base.as_strided((n, *shape), strides, offset)
    return out


def layout_key(key: Any) -> Any:
    """A saved packed layout's key as the storage's layout holds it (a nested key saved as a list: a tuple)."""
    return tuple(key) if isinstance(key, list) else key


def last_writes(cursor: torch.Tensor, max_size: int) -> torch.Tensor:
    """For each write ``i`` of ``cursor`` ``(n,)`` (slots of a ring of ``max_size``), the position of the last
    write to the same slot. ``ring[cursor] = data[last_writes(cursor, max_size)]`` is ``ring[cursor] = data``
    with a slot written more than once keeping its last write, on every device: indexed assignment with a
    repeated index is undefined (on CUDA, concurrent threads write the slot in no fixed order). No host sync."""
    position = torch.arange(cursor.shape[0], device=cursor.device)
    last = torch.full((max_size,), -1, dtype=torch.long, device=cursor.device)
    slot = cursor.remainder(max_size)
    return last.scatter_reduce_(0, slot, position, reduce="amax")[slot]


def ring_leaves(data: TensorDictBase) -> bool:
    """Whether every leaf of ``data`` is a dense tensor (no non-tensor data, no nested tensor, no ragged lazy
    stack), what the ring's preallocated tensors can hold."""
    try:
        leaves = list(data.values(include_nested=True, leaves_only=True))
    except RuntimeError:  # a lazy stack of ragged tensors cannot present them as one tensor
        return False
    return all(isinstance(v, torch.Tensor) and not v.is_nested for v in leaves)


def set_all(data: TensorDictBase, extra: dict[str, torch.Tensor] | None) -> TensorDictBase:
    """``data.set(key, value)`` for each of ``extra`` (validated: moved to ``data``'s device, shape checked)."""
    for key, value in (extra or {}).items():
        data.set(key, value)
    return data
