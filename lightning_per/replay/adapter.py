"""The steps every prioritized TorchRL adapter (:class:`~lightning_per.replay.GPUPrioritizedSampler`,
:class:`~lightning_per.replay.GPURankBasedSampler`, :class:`~lightning_per.replay.GPUPrioritizedSliceSampler`) takes,
as pure functions of its :class:`~lightning_per.replay.core.PriorityCore`: build the core from TorchRL-shaped
arguments, check a priority write, mark new slots, draw (with or without the batch), dump a checkpoint. Host
checks and device ops only; no host sync on a step."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_per.graphs.protocol import SamplerCapture
from lightning_per.replay import sampler_checkpoint
from lightning_per.replay.core import SAMPLER_SCHEMA_VERSION, PriorityCore, on_device
from lightning_per.replay.errors import check_bool, check_capacity, check_draw, check_index, check_index_priority
from lightning_per.replay.rows import set_all
from lightning_per.replay.slots import flat_slots, skip_unkept, unravel, written_slots
from lightning_per.replay.storage import GPUTensorStorage, resolve_device
from lightning_per.schema import stamp

__all__ = ["capture_view", "checked_update", "draw", "draw_gather", "dump", "filled", "mark_written", "mask_slots",
           "max_priority", "new_core"]


def new_core(owner: str, max_capacity: int, alpha: float, beta: float, eps: float, rule, *,
             device: torch.device | str | None, backend: str, seed: int | None, dtype: torch.dtype,
             eager_graphs: bool, max_priority_within_buffer: bool, serial: bool | None = None) -> PriorityCore:
    """The core of a prioritized sampler named ``owner``, its TorchRL-shaped arguments checked
    (:class:`~lightning_per.replay.GPUPrioritizedSampler` documents them).

    Raises:
        ValueError: ``max_capacity`` < 1, ``dtype`` other than float32, or as :class:`PriorityCore`.
        TypeError: ``eager_graphs`` or ``max_priority_within_buffer`` is not a bool.
    """
    check_capacity("max_capacity", max_capacity)
    check_bool("eager_graphs", eager_graphs)
    check_bool("max_priority_within_buffer", max_priority_within_buffer)
    if dtype != torch.float32:
        raise ValueError(f"dtype: priorities are stored in float32 (sums in float64), got {dtype}")
    return PriorityCore(max_capacity, alpha=alpha, beta=beta, eps=eps, rule=rule, device=resolve_device(device),
                        backend=backend, seed=seed, eager_graphs=eager_graphs,
                        max_within_buffer=max_priority_within_buffer, owner=owner, serial=serial)


def filled(core: PriorityCore, storage, owner: str) -> int:
    """``len(storage)`` (the capacity without one), refused when the storage holds more than the sampler has
    slots for (e.g. a sampler of 5 under ``TensorDictReplayBuffer``'s default ``ListStorage(1000)``).

    Raises:
        ValueError: the storage holds more items than ``core.capacity`` (``owner`` names the sampler).
    """
    cap = core.capacity
    if storage is None:
        return cap
    n = len(storage)
    if n > cap:
        raise ValueError(f"the storage holds {n} items but {owner} has max_capacity={cap} slots: "
                         f"give the sampler the storage's max_size ({getattr(storage, 'max_size', n)})")
    return n


def checked_update(core: PriorityCore, index, priority, storage, owner: str,
                   live: Tensor | None = None) -> tuple[Tensor, Tensor, int]:
    """The checked arguments of a priority write: ``(index (B,) int64, raw (B,) float32, n_valid)`` on the core's
    device, ``n_valid`` the filled length (:meth:`~lightning_per.replay.GPUPrioritizedSampler.update_priority`
    documents the rules); entries where the optional ``live`` ``(B,) bool`` is False are dropped
    (:meth:`PriorityCore.keep_live`: their slots were rewritten since they were sampled).

    Raises:
        TypeError, ValueError, IndexError: as :meth:`~lightning_per.replay.GPUPrioritizedSampler.update_priority`.
    """
    n_valid = filled(core, storage, owner)
    if n_valid < core.capacity and isinstance(index, Tensor) and index.is_cuda and (
            torch.cuda.is_current_stream_capturing()):
        n_valid = core.capacity  # a graph would freeze len(storage); captured slots come from the sampler
    # stale entries (live False) are not range-checked: a restore may have shrunk the fill below their slots
    index, priority = check_index_priority(flat_slots(index, storage), priority, n_valid, live)
    index = core.keep_live(core.keep_valid(on_device(index, core.device)), live)
    return index, on_device(priority, core.device), n_valid


def mark_written(core: PriorityCore, index, storage, owner: str) -> None:
    """Give slots ``index`` (just written) the default priority (the running max); then, when ``storage``
    has a device ``slot_valid`` mask (:class:`~lightning_per.replay.frames.FrameStackStorage`), take the
    probability mass of every slot it marks invalid (:func:`mask_slots`). Host-side ``-1`` entries (items a
    writer did not keep) are skipped, as TorchRL's sampler does.

    Raises:
        IndexError, ValueError: an index outside the filled length, or an overfull storage (:func:`filled`).
    """
    n_valid = filled(core, storage, owner)
    index = check_index(skip_unkept(written_slots(index, storage)), n_valid)
    core.mark(on_device(index, core.device), n_valid)
    valid = storage.slot_valid if isinstance(storage, GPUTensorStorage) else None  # TorchRL's storages have none
    if valid is not None:
        mask_slots(core, valid)


def mask_slots(core: PriorityCore, valid: Tensor) -> None:
    """Zero the stored priority of every slot where ``valid`` ``(max_capacity,) bool`` (on the core's device) is
    False, so no draw returns it; later priority writes to those slots are skipped (counted in
    ``state.n_dropped``). One O(N) pass on the device; ``valid`` is kept by reference.

    Raises:
        ValueError: ``valid`` is not a ``(max_capacity,) bool`` tensor on the core's device.
    """
    cap, device = core.capacity, core.device
    if not (isinstance(valid, Tensor) and valid.dtype == torch.bool and valid.shape == (cap,)
            and valid.device.type == device.type):
        raise ValueError(f"valid must be a ({cap},) bool tensor on {device}, got "
                         f"{getattr(valid, 'dtype', type(valid).__name__)} {tuple(getattr(valid, 'shape', ()))}")
    core.mask(valid)


def draw(core: PriorityCore, storage, batch_size: int) -> tuple[Tensor, dict[str, Tensor]]:
    """``batch_size`` slots drawn by the core's rule and their IS weights: ``(index, {"priority_weight": w})``,
    ``(B,)`` int64 (unravelled to the storage's shape) and ``(B,)`` float32 on the core's device.

    Raises:
        ValueError: ``batch_size`` is not an int >= 1.
        EmptyBufferError (a ValueError and RuntimeError): the storage is empty.
    """
    check_draw(storage, batch_size)
    index, weight = core.sample(batch_size, len(storage))
    return unravel(index, storage), {"priority_weight": weight}


def draw_gather(core: PriorityCore, storage, batch_size: int, with_info: bool,
                contiguous: bool = True) -> tuple[Tensor, dict[str, Tensor], Any]:
    """:func:`draw`, and the batch ``storage.get(index)``: ``(index, info, batch)``, the draw and the row gather one
    op when the core can fuse them (:meth:`PriorityCore.gather_rows`); ``with_info`` also puts ``"index"`` and
    ``"priority_weight"`` in the batch; ``contiguous=False`` lets the fused path hand the fields as strided views
    of the gathered rows (:meth:`GPUTensorStorage.rows_to_batch`).

    Raises:
        As :func:`draw`.
    """
    rows = core.gather_rows(storage)
    if rows is None:
        index, info = draw(core, storage, batch_size)
        extra = {"index": index, "priority_weight": info["priority_weight"]} if with_info else None
        if isinstance(storage, GPUTensorStorage):  # the batch built once, with the extra keys
            return index, info, storage.read(index, extra)
        return index, info, set_all(storage.get(index), extra)
    check_draw(storage, batch_size)
    block, index, weight = core.sample(batch_size, len(storage), rows)
    extra = {"index": index, "priority_weight": weight} if with_info else None
    return index, {"priority_weight": weight}, storage.rows_to_batch(block, extra, contiguous)


def capture_view(core: PriorityCore, batch_size: int | None, problem: str | None = None) -> SamplerCapture:
    """What a CUDA-graph capture of a prioritized sampler's draws needs (its
    :meth:`~lightning_per.graphs.protocol.CapturableSampler.capture_view`): the core's device tensors
    (:meth:`PriorityState.tensors <lightning_per.replay.priority.PriorityState.tensors>`, restored after the
    warm-up), its device, the generators a draw of ``batch_size`` consumes (:meth:`PriorityCore.draw_generators`;
    the generator itself when ``batch_size`` is None), its RNG state accessors, and ``problem`` (None: capturable).
    Host work only."""
    generators = (core.rng.generator,) if batch_size is None else core.draw_generators(batch_size)
    return SamplerCapture(problem, tensors=tuple(core.state.tensors()), device=core.device, generators=generators,
                          get_rng_state=core.get_rng_state, set_rng_state=core.set_rng_state)


def max_priority(core: PriorityCore) -> tuple[Tensor | None, None]:
    """TorchRL's private ``(max raw priority, its slot)`` pair: ``(0-d float32 tensor, None)``, or ``(None, None)``
    before any priority was written. Reads the device (a diagnostic); the slot is not tracked."""
    max_raw = core.state.max_raw
    if bool(torch.isinf(max_raw)):  # sync-ok: a diagnostic accessor
        return None, None
    return max_raw.clone(), None


def dump(state: dict[str, Any], path) -> None:
    """Write a prioritized sampler's ``state`` to ``path/sampler.pt`` with a JSON summary of its exponents
    (:func:`sampler_checkpoint.dump`)."""
    summary = stamp({k: state[k] for k in ("kind", "alpha", "beta", "eps", "max_capacity")}, "sampler",
                    SAMPLER_SCHEMA_VERSION)
    sampler_checkpoint.dump(path, state, summary)
