"""The storage core: an explicit :class:`RingState` (the ring's device buffers and the plans of its fast paths)
and the functions that write and read it.

:class:`~lightning_per.replay.GPUTensorStorage` is the TorchRL adapter holding one state (its :attr:`ring`): it
allocates the buffers at the first write, keeps the host length and write cursor (host ints, as in TorchRL), and
writes and reads through these functions (its one write path, :func:`match_pairs` then :func:`write_pairs`, and its
one read path, :func:`read_slots`). None of them synchronises with the host.

Example::

    >>> import torch
    >>> from lightning_per.replay import GPUTensorStorage
    >>> from tensordict import TensorDict, TensorDictBase
    >>> from lightning_per.replay.ring import match_pairs, read_slots, write_pairs
    >>> storage = GPUTensorStorage(4, device="cpu", packed=True)
    >>> storage.set(torch.arange(2), TensorDict({"reward": torch.tensor([1.0, 2.0])}, [2]))
    >>> ring = storage.ring
    >>> pairs = match_pairs(ring, TensorDict({"reward": torch.tensor([3.0])}, [1]))
    >>> _ = write_pairs(ring, torch.tensor([2]), pairs, 2, 4)
    >>> read_slots(ring, torch.tensor([2, 0]))["reward"]
    tensor([3., 1.])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor

from lightning_per.replay.compat import unsafe_tensordict
from lightning_per.replay.rows import batch_views, field_views, last_writes

__all__ = ["RingState", "make_batch", "match_pairs", "read_slots", "rows_batch", "write_pairs", "write_rows"]


@dataclass(eq=False)
class RingState:
    """The device side of a storage's ring (empty until the first write allocates it).

    Attributes:
        rows: ``(max_size, row_bytes / 8) int64`` packed ring (every field a view into it), or None (one tensor
            per key).
        layout: packed rows: ``{key: (byte offset, nbytes, dtype, per-item shape)}``
            (:func:`lightning_per.replay.rows.row_layout`); empty when not packed.
        plan: packed rows: how a gathered block becomes the batch's field views
            (:func:`lightning_per.replay.rows.view_plan`).
        pack: packed rows: how a batch's fields become its rows' bytes in one ``torch.cat``
            (:func:`lightning_per.replay.rows.pack_plan`), or None.
        ring_bytes: ``(max_size, row_bytes) uint8`` view of :attr:`rows`, or None.
        flat: ``{key: (max_size, *shape) ring tensor}`` of every stored leaf (a str key, or a tuple for a nested
            one such as ``("next", "observation")``).
        flat_spec: ``{key: (ring tensor, dtype, per-item shape)}``, what a direct write checks a batch against.
        nested: whether some key of :attr:`flat` is nested (a read then builds the sub-TensorDicts).
        device: the ring's device.
        pack_bytes: ``(ring_bytes, ring_bytes[:, :end])``: the bytes :func:`write_rows` writes, a view kept for the
            :attr:`ring_bytes` tensor it was made from (rebuilt when that is replaced), or None.
    """

    rows: Tensor | None = None
    layout: dict[Any, tuple[int, int, torch.dtype, tuple[int, ...]]] = field(default_factory=dict)
    plan: tuple | None = None
    pack: tuple | None = None
    ring_bytes: Tensor | None = None
    flat: dict[Any, Tensor] | None = None
    flat_spec: dict[Any, tuple[Tensor, torch.dtype, torch.Size]] | None = None
    nested: bool = False
    device: torch.device | None = None
    pack_bytes: tuple[Tensor, Tensor] | None = None

    def tensors(self) -> tuple[Tensor, ...]:
        """The ring's device buffers: ``(rows,)`` when packed, else the leaves' tensors (empty before the first
        write)."""
        if self.rows is not None:
            return (self.rows,)
        return tuple(self.flat.values()) if self.flat else ()


def match_pairs(ring: RingState, data) -> dict[Any, tuple[Tensor, Tensor]] | None:
    """``{key: (ring tensor, data tensor)}`` in ``data``'s key order, when ``data`` is a TensorDict ``[n]`` (``n >=
    1``) whose leaves, but ``"index"``, are exactly the ring's keys (nested ones included) with their per-item
    shapes and dtypes, each dense, strided and off the ``"meta"`` device; else None (the caller's checked path names
    what is wrong). Host work on metadata only; changes nothing."""
    spec = ring.flat_spec
    if spec is None or data.batch_dims != 1 or not data.batch_size[0]:
        return None
    pairs = {}
    for key, value in (data.items(include_nested=True, leaves_only=True) if ring.nested else data.items()):
        if key == "index":
            continue
        want = spec.get(key)
        if want is None and isinstance(value, TensorDictBase) and value.is_empty():
            continue  # a sub-TensorDict left without leaves (e.g. by an ``exclude``) holds nothing to write
        if (want is None or not isinstance(value, Tensor) or value.dtype != want[1]
                or value.shape[1:] != want[2] or value.layout != torch.strided or value.is_meta):
            return None
        pairs[key] = (want[0], value)
    return pairs if len(pairs) == len(spec) else None


def write_pairs(ring: RingState, cursor: Tensor, pairs, start: int | None, max_size: int) -> Tensor:
    """Write ``pairs`` (from :func:`match_pairs`) at ring slots ``cursor`` ``(n,)`` int64 (values in ``[0,
    max_size)``): per key ``ring[cursor] = value``, or, when the caller knows ``cursor`` is ``range(start, start +
    n)``, ``ring[start:start + n] = value`` (the same writes with no index) and, for a packed ring, the bytes of all
    fields at once (:func:`write_rows`). A slot that ``cursor`` names more than once keeps its last write, on every
    device (a batch longer than the ring). ``cursor`` names one slot per value (the callers check it). Returns
    ``cursor`` on the ring's device (moved with ``non_blocking=True`` if it was elsewhere). No host sync."""
    device = ring.device
    if cursor.device != device:
        cursor = cursor.to(device, non_blocking=True)
    n = cursor.shape[0]
    if start is not None and write_rows(ring, start, n, pairs):
        return cursor
    keep = last_writes(cursor, max_size) if n > max_size else None  # a repeated slot: every write its last value
    for dest, value in pairs.values():
        if value.device != device:
            value = value.to(device, non_blocking=True)
        if start is None:
            dest[cursor] = value if keep is None else value[keep]
        else:
            dest[start:start + n] = value
    return cursor


def write_rows(ring: RingState, start: int, n: int, pairs) -> bool:
    """Packed ring: write rows ``[start, start + n)`` of every field with one ``torch.cat`` of the fields' bytes into
    the rows' bytes ``[0, end)`` (one kernel instead of one copy per key; the row's tail padding is left as it is,
    as the per-key writes leave it). False (nothing written) when the ring is not packed, a value is not
    contiguous or the values are on more than one device."""
    pack = ring.pack
    if pack is None:
        return False
    fields, end = pack
    pieces, src = [], None
    for key, two_d in fields:
        value = pairs[key][1]
        if not value.is_contiguous() or (src is not None and value.device != src):
            return False
        src = value.device
        pieces.append(value.view(torch.uint8) if two_d else value.view(n, -1).view(torch.uint8))
    packed = ring.pack_bytes
    if packed is None or packed[0] is not ring.ring_bytes or packed[1].shape[1] != end:
        packed = ring.pack_bytes = (ring.ring_bytes, ring.ring_bytes[:, :end])
    dst = packed[1].narrow(0, start, n)  # rows [start, start + n) of the fields' bytes: one view op
    if src == dst.device:
        torch.cat(pieces, 1, out=dst)
    else:  # one host-to-device copy of the packed block instead of one per key
        dst.copy_(torch.cat(pieces, 1), non_blocking=True)
    return True


def read_slots(ring: RingState, index: Tensor, extra: dict[str, Tensor] | None = None) -> TensorDict:
    """The TensorDict ``[B]`` of the transitions at slots ``index`` ``(B,)`` int64 (moved to the ring's device if
    elsewhere) of a ring with flat keys, plus ``extra`` (``(B,)`` tensors on the ring's device, set without
    validation): one gather of whole rows (the fields then copied out of it) when packed, else one gather per key."""
    device = ring.device
    if index.device != device:
        index = index.to(device, non_blocking=True)
    if ring.rows is not None:  # one gather of whole rows; the fields copied out of it
        return rows_batch(ring, ring.rows[index], extra)
    # one gather per key (advanced indexing: faster than index_select for these batches, python -m benchmarks.gather)
    fields = {k: v[index] for k, v in ring.flat.items()}
    if extra:
        fields.update(extra)
    return make_batch(ring, fields, index.shape)


def rows_batch(ring: RingState, block: Tensor, extra: dict[str, Tensor] | None,
               contiguous: bool = True) -> TensorDict:
    """The TensorDict ``[B]`` of the packed fields of ``block`` ``(B, W) int64`` (a fresh gather of the ring's rows),
    each a contiguous tensor of its own (:func:`~lightning_per.replay.rows.batch_views`: one copy of the block), or,
    with ``contiguous=False``, strided views into ``block`` (:func:`~lightning_per.replay.rows.field_views`: no
    copy, no kernel), plus ``extra`` (no validation: the callers guarantee the shapes)."""
    fields = batch_views(block, ring.layout, ring.plan) if contiguous else field_views(block, ring.layout)
    if extra:
        fields.update(extra)
    return make_batch(ring, fields, block.shape[:1])


def make_batch(ring: RingState, fields: dict[Any, Tensor], batch_size) -> TensorDict:
    """The TensorDict ``batch_size`` on the ring's device holding ``fields`` (leaf key -> tensor, nested keys as
    tuples), built without re-validating the shapes the read paths guarantee."""
    if not ring.nested:
        return unsafe_tensordict(fields, batch_size, ring.device)
    return _nest(fields, batch_size, ring.device)


def _nest(fields: dict[Any, Tensor], batch_size, device) -> TensorDict:
    top: dict[str, Any] = {}
    for key, value in fields.items():
        if isinstance(key, tuple):
            if len(key) > 1:
                top.setdefault(key[0], {})[key[1:] if len(key) > 2 else key[1]] = value
                continue
            key = key[0]
        top[key] = value
    for key, value in top.items():
        if isinstance(value, dict):
            top[key] = _nest(value, batch_size, device)
    return unsafe_tensordict(top, batch_size, device)
