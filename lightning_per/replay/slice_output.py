"""The batch a slice sampler returns: its drawn starts expanded into slices with TorchRL's markers (the layout of
:mod:`lightning_per.replay.slice`), and the batch read with them. Functions of a
:class:`~lightning_per.replay.slice_index.SliceIndex`'s state; the device steps are
:func:`~lightning_per.replay.slice_ops.slice_steps`."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_per.replay.rows import set_all
from lightning_per.replay.slice_index import SliceIndex, ring_tensor
from lightning_per.replay.storage import GPUTensorStorage

__all__ = ["expand", "slice_batch"]


def _replace_last(key, last: str):
    return (*key[:-1], last) if isinstance(key, tuple) else last


def expand(index: SliceIndex, start: Tensor, cut: Tensor | None, T: int, storage,
           weight: Tensor | None = None) -> tuple[Any, dict[Any, Tensor]]:
    """The slices starting at slots ``start`` ``(S,)`` int64 (at most ``cut`` ``(S,)`` steps each, None for ``T``),
    following ``index``'s effective ends: ``(slots, info)``.

    Returns:
        ``slots``: ``(S * T,)`` int64 on the index's device, slice after slice (a ``(time, env)`` tuple of them on a
        2-D storage); ``info``: ``truncated_key`` / its done / terminated keys ``(S * T, 1)`` bool, ``init_key``
        (when stored), ``"priority_weight"`` ``(S * T,)`` float32 (``weight`` ``(S,)`` repeated over each slice,
        when given). A ragged spec (:attr:`SliceSpec.ragged`) without ``pad_output`` keeps the real steps only
        (TorchRL's shorter batch: a data-dependent length, read on the host); with ``pad_output`` a short slice
        repeats its last slot and ``("collector", "mask")`` ``(S * T,)`` bool marks the real steps.
    """
    spec, n = index.spec, index.slots
    marks = spec.truncated_key is not None
    done_key = _replace_last(spec.truncated_key, "done") if marks else None
    terminated_key = _replace_last(spec.truncated_key, "terminated") if marks else None
    slots, member, last, done, terminated, init = index.steps(
        start, cut, index.end_flat, n, index.stride, T, ring_tensor(storage, done_key, n),
        ring_tensor(storage, terminated_key, n), ring_tensor(storage, spec.init_key, n))
    info: dict[Any, Tensor] = {}
    if marks:
        info[spec.truncated_key], info[done_key], info[terminated_key] = last, done, terminated
    if init is not None:
        info[spec.init_key] = init
    if weight is not None:
        info["priority_weight"] = weight[:, None].expand(start.shape[0], T).reshape(-1)
    if spec.pad_output:
        info[("collector", "mask")] = member
    elif spec.ragged:  # sync-ok: TorchRL's default output, a batch of the real steps (data-dependent length)
        keep = member.nonzero().squeeze(1)
        slots, info = slots[keep], {k: v[keep] for k, v in info.items()}
    if index.stride > 1:
        return (torch.div(slots, index.stride, rounding_mode="floor"), slots % index.stride), info
    return slots, info


def slice_batch(storage, index, info: dict[Any, Tensor], with_info: bool) -> tuple[Any, dict, Any]:
    """``(index, info, batch)``: the batch ``storage[index]`` with the info's entries (and ``"index"`` with
    ``with_info``: ``(B,)``, or ``(B, 2)`` for a 2-D storage's tuple, as TorchRL's buffer stacks it) set in it, what
    a slice sampler's ``sample_gather`` returns (the replay buffer's direct path)."""
    extra = dict(info)
    if with_info:
        extra["index"] = torch.stack(index, -1) if isinstance(index, tuple) else index
    direct = isinstance(storage, GPUTensorStorage) and isinstance(index, Tensor)
    batch = storage.read(index) if direct else storage.get(index)
    return index, info, set_all(batch, extra)
