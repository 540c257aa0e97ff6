"""Slot indices as the samplers take and return them: flat ``(B,)`` slots of a storage of ``ndim >= 1``, and the
host-side ``-1`` entries of items a writer did not keep. Pure functions (host work, or device ops without a sync)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["cursor_slots", "filled_slots", "flat_slots", "skip_unkept", "unravel", "written_slots"]


def flat_slots(index, storage):
    """``index`` as flat slots: a tuple of per-dimension indices or an ``(B, ndim)`` tensor on a storage of
    ``ndim > 1`` (what :meth:`GPUPrioritizedSampler.sample` returns there) becomes ``(B,)`` row-major slots."""
    ndim = getattr(storage, "ndim", 1) if storage is not None else 1
    if ndim <= 1:
        return index
    if isinstance(index, tuple):
        index = torch.stack([torch.as_tensor(i) for i in index], -1)
    if isinstance(index, Tensor) and index.ndim > 1 and index.shape[-1] == ndim:
        shape = storage.shape
        strides = [1] * ndim
        for d in range(ndim - 2, -1, -1):
            strides[d] = strides[d + 1] * shape[d + 1]
        index = (index * torch.as_tensor(strides, device=index.device)).sum(-1)
    return index


def written_slots(index, storage):
    """:meth:`GPUPrioritizedSampler.mark_update`'s slots: on a storage of ``ndim > 1`` a 1-D ``index`` of written
    rows (dim 0) becomes the flat slots of every item in those rows; else ``index`` itself (see
    :func:`flat_slots`)."""
    ndim = getattr(storage, "ndim", 1) if storage is not None else 1
    if ndim <= 1:
        return index
    if isinstance(index, int):
        index = torch.tensor([index])
    if isinstance(index, Tensor) and index.ndim <= 1 and storage.shape is not None:
        per_row = storage.shape[1:].numel()
        rows = index.reshape(-1, 1)
        flat = rows * per_row + torch.arange(per_row, device=index.device)
        return torch.where(rows >= 0, flat, -1).reshape(-1)
    return flat_slots(index, storage)


def skip_unkept(index):
    """``index`` without its host-side ``-1`` entries (items a writer did not keep); device indices unchanged
    (an out-of-range device index is dropped and counted by the write itself, without a sync)."""
    if isinstance(index, int):
        return index if index != -1 else torch.empty(0, dtype=torch.long)
    if isinstance(index, Tensor) and index.device.type == "cpu" and index.numel():
        keep = index != -1
        if not bool(keep.all()):  # sync-ok: a CPU tensor
            return index[keep]
    return index


def unravel(index: Tensor, storage):
    """A draw's flat slots as the storage indexes them: unchanged for ``ndim == 1``, else the per-dimension
    tuple of ``torch.unravel_index`` over the storage's filled shape (TorchRL's samplers do the same)."""
    ndim = getattr(storage, "ndim", 1)
    if ndim <= 1:
        return index
    return torch.unravel_index(index, storage.shape)


def filled_slots(index, n: int) -> Tensor:
    """The slots of a ring holding ``n`` items (the filled part ``[0, n)``) that ``index`` names: a ``(k,)`` int64
    tensor, or a 0-d one for an int (a read then drops the batch dimension, as TorchRL's). ``index``: an int,
    slice, ``...``, sequence, bool mask of ``(n,)`` or integer tensor; negative values count from the end. A
    host-side index is bounds-checked (host work); a device one is wrapped on the device, unchecked (no sync).

    Raises:
        TypeError: ``index`` is none of these.
        IndexError: a float index, a mask of another length, or a host-side index outside ``[-n, n)``.
    """
    if isinstance(index, slice):
        return torch.arange(*index.indices(n))
    if index is Ellipsis:
        return torch.arange(n)
    if isinstance(index, tuple) and len(index) == 1:
        index = index[0]
    if not isinstance(index, torch.Tensor):
        try:
            index = torch.as_tensor(index)
        except (TypeError, ValueError) as err:
            raise TypeError(f"index must be an int, slice, sequence or tensor of slots, got "
                            f"{type(index).__name__}") from err
    if index.dtype == torch.bool:
        if index.shape != (n,):
            raise IndexError(f"a boolean index must have one entry per stored item ({n}), got shape "
                             f"{tuple(index.shape)}")
        return torch.arange(n, device=index.device)[index]
    if index.is_floating_point() or index.is_complex():
        raise IndexError(f"index must hold integers, got dtype {index.dtype}")
    index = index.to(torch.int64)
    if index.device.type == "cpu" and index.numel():
        lo, hi = int(index.min()), int(index.max())  # sync-ok: a host tensor
        if lo < -n or hi >= n:
            raise IndexError(f"index {lo if lo < -n else hi} is out of range for a storage holding {n} items")
    return torch.where(index < 0, index + n, index)


def cursor_slots(cursor, max_size: int, device: torch.device) -> Tensor:
    """A write cursor as the ``(n,)`` int64 ring slots it names, on ``device`` (moved with ``non_blocking=True``):
    a tensor (flattened), a slice or range of the ring ``[0, max_size)``, an int, or a sequence of ints. Host
    work, or a device copy without a sync."""
    if isinstance(cursor, Tensor):
        return cursor.reshape(-1).to(device=device, dtype=torch.int64, non_blocking=True)
    if isinstance(cursor, slice):
        return torch.arange(max_size, device=device)[cursor]
    if isinstance(cursor, range):
        return torch.arange(cursor.start, cursor.stop, cursor.step, device=device)
    return torch.as_tensor(cursor, dtype=torch.int64).reshape(-1).to(device)
