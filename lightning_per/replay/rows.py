"""The packed-row codec of :class:`~lightning_per.replay.GPUTensorStorage`: how a transition's fields become one
row of int64 words, and back.

A packed ring is a ``(max_size, row_bytes / 8) int64`` tensor; each field of a transition lies at a byte offset
aligned to its element size (:func:`row_layout`). The ring's own fields are views into it (:func:`field_views`);
a batch's fields are fresh tensors cut from a gathered block of rows (:func:`batch_views`). Pure functions of
tensors and layouts; no state.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from tensordict import TensorDictBase

from lightning_per.replay.compat import tree_leaves

__all__ = ["batch_views", "check_dense", "field_views", "item_spec", "last_writes", "layout_key", "pack_plan",
           "ring_leaves", "row_layout", "set_all", "view_plan"]


def item_spec(td: TensorDictBase, skip_batch: int = 1) -> dict[Any, tuple[tuple[int, ...], torch.dtype]]:
    """``{key: (per-item shape, dtype)}`` of every leaf of ``td`` (nested keys as tuples), its first
    ``skip_batch`` dimensions dropped: what a write is checked against."""
    return {k: (tuple(v.shape[skip_batch:]), v.dtype)
            for k, v in td.items(include_nested=True, leaves_only=True)}


def check_dense(data: Any) -> None:
    """Raise if a leaf of ``data`` (a TensorDict, a tensor or a pytree of them) is a tensor no storage can copy
    from: a layout other than dense and strided (sparse COO/CSR, mkldnn), or a tensor on the ``"meta"`` device,
    which holds no data. Metadata only (no tensor is read); changes nothing. Non-tensor leaves pass (a storage
    in TorchRL's layout stores them); a ragged lazy stack passes (its writes are TorchRL's).

    Raises:
        TypeError: a leaf is not dense and strided (the message names its key and layout).
        ValueError: a leaf is on the ``"meta"`` device (the message names its key).

    Example::

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from lightning_per.replay.rows import check_dense
        >>> check_dense(TensorDict({"obs": torch.zeros(2, 3)}, [2]))
        >>> try:
        ...     check_dense(TensorDict({"obs": torch.zeros(2, 3).to_sparse()}, [2]))
        ... except TypeError as err:
        ...     print(str(err)[:50])
        data['obs'] has layout torch.sparse_coo: the stora
    """
    if isinstance(data, TensorDictBase):
        try:
            items = list(data.items(include_nested=True, leaves_only=True))
        except RuntimeError:  # a lazy stack of ragged tensors: TorchRL's layout writes it
            return
    else:
        items = [("", v) for v in tree_leaves(data)]
    for key, value in items:
        if not isinstance(value, torch.Tensor):
            continue
        where = f"data[{key!r}]" if key != "" else "data"
        if value.layout != torch.strided:
            raise TypeError(f"{where} has layout {value.layout}: the storage takes dense, strided tensors (call "
                            f".to_dense() first; nothing was written)")
        if value.is_meta:
            raise ValueError(f"{where} is on the 'meta' device, which holds no data: the storage takes tensors on "
                             f"a real device (cpu or cuda; nothing was written)")


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
    """How :func:`batch_views` cuts a gathered block of ``row_words``-word rows into one fresh tensor per field:
    ``(split_bytes, fields)``, ``split_bytes`` the byte width of each field in row order and then of the row's
    tail padding (the widths of ``torch.split_with_sizes_copy`` along the row), ``fields`` per field, in layout
    order, ``(key, position in split_bytes, dtype, shape)``; None when the fields do not tile the row from byte 0
    (no such layout comes out of :func:`row_layout`)."""
    ordered = sorted(layout.items(), key=lambda kv: kv[1][0])
    split, position, end = [], {}, 0
    for key, (off, nbytes, _, _) in ordered:
        if off != end:
            return None
        position[key] = len(split)
        split.append(nbytes)
        end = off + nbytes
    if row_words * 8 > end:
        split.append(row_words * 8 - end)
    return tuple(split), tuple((key, position[key], dtype, shape) for key, (_, _, dtype, shape) in layout.items())


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


def batch_views(block: torch.Tensor, layout, plan: tuple | None) -> dict[Any, torch.Tensor]:
    """The fields of ``block`` ``(n, row_words) int64`` (e.g. a gather ``rows[index]``) as fresh contiguous tensors
    ``(n, *shape) dtype``, each in memory of its own: a batch read from a packed ring behaves like one read per key
    (``torch.save`` of the batch, ``.view`` of a field), at the cost of one copy of the block, which
    ``torch.split_with_sizes_copy`` makes in one kernel on CUDA (``plan``: :func:`view_plan` of ``layout``; None
    copies field by field). The bytes are :func:`field_views`' (hot read path: no host sync).

    Example::

        >>> import torch
        >>> layout, row_bytes = row_layout({"x": ((2,), torch.float32), "d": ((), torch.bool)})
        >>> block = torch.zeros(3, row_bytes // 8, dtype=torch.int64)
        >>> fields = batch_views(block, layout, view_plan(layout, row_bytes // 8))
        >>> fields["x"].shape, fields["x"].is_contiguous(), fields["d"].dtype
        (torch.Size([3, 2]), True, torch.bool)
    """
    n = block.shape[0]
    if plan is None:
        return {key: view.clone(memory_format=torch.contiguous_format)
                for key, view in field_views(block, layout).items()}
    split, fields = plan
    raw = block.view(torch.uint8)  # (n, row_bytes)
    parts = [torch.empty((n, width), dtype=torch.uint8, device=block.device) for width in split]
    torch.split_with_sizes_copy(raw, list(split), dim=1, out=parts)
    return {key: parts[i].view(dtype).view(n, *shape) if parts[i].numel()
            else torch.empty((n, *shape), dtype=dtype, device=block.device)  # no bytes: nothing to reinterpret
            for key, i, dtype, shape in fields}


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
