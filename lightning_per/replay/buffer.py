"""GPUPrioritizedReplayBuffer and make_replay_buffer: TorchRL replay buffers wired to our storage and
samplers, so that switching from TorchRL is one import."""

from __future__ import annotations

import inspect
import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict
from torchrl.data import (
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    RoundRobinWriter,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
    TensorStorage,
)

from lightning_per.integrity import atomic_directory, verify_directory
from lightning_per.replay.errors import check_batch_size, check_generator, check_seed
from lightning_per.replay.frames import FrameStackStorage
from lightning_per.replay.host import PinnedHostStorage
from lightning_per.replay.prioritized import GPUPrioritizedSampler
from lightning_per.replay.random import GPURandomSampler
from lightning_per.replay.rank import GPURankBasedSampler
from lightning_per.replay.slice import GPUPrioritizedSliceSampler, GPUSliceSampler
from lightning_per.replay.storage import GPUTensorStorage, default_device, resolve_device
from lightning_per.replay.writer import GPURoundRobinWriter

__all__ = ["GPUPrioritizedReplayBuffer", "make_replay_buffer", "BUFFER_SCHEMA_VERSION"]

BUFFER_SCHEMA_VERSION = 1
_SAMPLERS = {"proportional": GPUPrioritizedSampler, "rank": GPURankBasedSampler,
             "prioritized_slice": GPUPrioritizedSliceSampler}
#: Sampler constructor parameters that make_replay_buffer sets itself (not accepted in **sampler_kwargs).
_SET_BY_FACTORY = {"self", "max_capacity", "alpha", "beta", "eps", "device"}


def _resolve_storage(storage, device: torch.device | None, capacity: int | None) -> TensorStorage:
    """The storage the buffer keeps: ours for None or an uninitialised TorchRL ``LazyTensorStorage``, else
    ``storage`` itself, which must be a TorchRL tensor storage (the samplers read ``max_size`` and
    ``device`` and gather TensorDict rows by a slot tensor; a ``ListStorage`` has none of these).

    Raises:
        TypeError: ``storage`` is not None nor a TorchRL ``TensorStorage`` (e.g. ``ListStorage``), before
            anything is built.
    """
    if storage is not None and not isinstance(storage, TensorStorage):
        raise TypeError(
            "storage must be None, a GPUTensorStorage or a TorchRL tensor storage (LazyTensorStorage, "
            "LazyMemmapStorage, TensorStorage: TensorDicts in tensors on one device, which the samplers index "
            f"by slot); got {type(storage).__name__}" + (
                " (list storages of arbitrary items are not supported)" if isinstance(storage, ListStorage)
                else ""))
    if storage is None:
        return GPUTensorStorage(capacity or 1000, device=device)
    if type(storage) is LazyTensorStorage and not storage.initialized:  # TorchRL's: upgrade in place
        dev = device or (None if storage.device == "auto" else storage.device)
        return GPUTensorStorage(storage.max_size, device=dev, ndim=storage.ndim,
                                compilable=getattr(storage, "_compilable", False),
                                consolidated=getattr(storage, "consolidated", False),
                                shared_init=getattr(storage, "shared_init", False))
    return storage


def _build_sampler(cls, capacity: int, device: torch.device, **kw):
    """The sampler on ``device``; on CUDA out-of-memory, the same sampler on the CPU (one warning).

    Raises:
        ValueError: not even the CPU can hold the sampler's priorities (names the capacity).
    """
    def build(dev: torch.device):
        try:
            return cls(capacity, device=dev, **kw) if cls is not GPURandomSampler else cls(device=dev, **kw)
        except RuntimeError as err:
            if isinstance(err, torch.OutOfMemoryError) or "can't allocate memory" not in str(err):
                raise
            raise ValueError(f"capacity {capacity}: the sampler's priorities (8 bytes a slot and more) cannot be "
                             f"allocated on {dev} ({str(err).splitlines()[0][:160]})") from None

    try:
        return build(device)
    except torch.OutOfMemoryError:
        warnings.warn(f"{cls.__name__}: out of memory on {device}; keeping priorities on the CPU",
                      RuntimeWarning, stacklevel=3)
        torch.cuda.empty_cache()
        return build(torch.device("cpu"))


def _check_before_write(rb, data) -> None:
    """Raise before anything is written when the sampler cannot read ``data`` (a slice sampler's trajectory
    marker missing: :meth:`GPUSliceSampler.check_signal`)."""
    sampler = rb._sampler if rb.initialized else rb._init_sampler
    check = getattr(sampler, "check_signal", None)
    if check is not None and hasattr(data, "keys"):
        check(data)


def _direct_extend(rb, data, update_priority: bool | None):
    """TorchRL's ``TensorDictReplayBuffer.extend`` of a plain TensorDict ``data`` ``[n]`` that the
    storage takes as it is (:meth:`GPURoundRobinWriter._direct_pairs`), in one pass: the same slots,
    cursor, write count, stored values, ``mark_update`` calls and priority update, without TorchRL's
    generic machinery (its shallow copy of ``data``, which only ever receives the ``"index"`` tag, is
    skipped: ``data`` itself is left unchanged, as there). None when anything else applies (transforms,
    consuming samplers, ``dim_extend``, generation tracking, other writers or storages, nested keys,
    another spec): the caller then takes TorchRL's path, which validates and raises."""
    if type(data) is not TensorDict or (rb._delayed_init and not rb.initialized):
        return None
    writer, transform = rb._writer, rb._transform
    # exactly our writer: a subclass may override extend / _mark_update_entities, which this path would skip
    if (type(writer) is not GPURoundRobinWriter or (transform is not None and len(transform))
            or rb._dim_extend or getattr(rb, "_is_consuming", bool)()):  # no consuming buffers before torchrl 0.12
        return None
    pairs = writer._direct_pairs(data)
    if pairs is None:
        return None
    storage = rb._storage
    with rb._replay_lock, rb._write_lock:
        index = writer._write_direct(data, pairs)
        for entity in storage._attached_entities_iter():  # the writer's _mark_update_entities
            if entity is rb and type(rb).mark_update is ReplayBuffer.mark_update:
                rb._sampler.mark_update(index, storage=storage)  # what ReplayBuffer.mark_update does
            else:
                entity.mark_update(index)
        rb._sampler.extend(index)
    if update_priority is None or update_priority:
        priority = data.get(rb.priority_key, None)
        if priority is not None:
            try:
                rb.update_priority(index, priority)
            except Exception as e:
                raise RuntimeError(
                    "Failed to update priority of extended data. You can try to set update_priority=False in "
                    "the extend method and update the priority manually.") from e
    return index


def _check_extend_priority(rb, data, update_priority: bool | None) -> None:
    """Raise what the priority update of ``rb.extend(data)`` would refuse, before anything is written: the
    batch's ``priority_key`` entry must be a real tensor with one value per transition (or one for all).
    Host checks of type, dtype and shape only.

    Raises:
        TypeError: the entry is not a real-valued tensor (bool, complex, non-tensor data).
        ValueError: it holds another number of values.
    """
    if update_priority is False or not hasattr(data, "get"):
        return
    key = getattr(rb, "priority_key", None)
    if key is None or not hasattr(rb._sampler, "update_priority") or isinstance(rb._sampler, GPURandomSampler):
        return
    try:
        priority = data.get(key, None)
    except Exception:  # noqa: BLE001 - a batch TorchRL's own path validates
        return
    if priority is None:
        return
    if not isinstance(priority, torch.Tensor) or priority.dtype == torch.bool or priority.is_complex():
        what = f"dtype {priority.dtype}" if isinstance(priority, torch.Tensor) else type(priority).__name__
        raise TypeError(f"extend: the batch's priority entry {key!r} must be a real tensor, got {what} (nothing was "
                        f"written; pass update_priority=False to store it without setting priorities)")
    batch = getattr(data, "batch_size", ())
    if len(batch) == 1 and priority.numel() not in (1, batch[0]):
        raise ValueError(f"extend: the batch's priority entry {key!r} must hold one value per transition "
                         f"({batch[0]}), got shape {tuple(priority.shape)} (nothing was written)")


# ---------------------------------------------------------------------------- checkpoint checks
# TorchRL's ``load_state_dict`` / ``loads`` load the storage, then the sampler, then the writer: a part
# refused half-way (another sampler kind or schema, another transition shape) used to leave the earlier
# parts already replaced. The functions below raise every refusal of our storage's, samplers' and the
# writer's loads from the checkpoint alone, changing nothing, so the buffers call them first. Load paths
# only: host work.

#: What TorchRL's ``ReplayBuffer.load_state_dict`` reads with ``state_dict[key]``.
_BUFFER_KEYS = ("_storage", "_sampler", "_writer", "_transforms", "_batch_size")


def _components(rb) -> tuple[Any, Any]:
    """``(sampler, writer)`` of ``rb``, also before a ``delayed_init`` buffer is initialised (TorchRL then
    still holds them as constructor arguments)."""
    if rb.initialized:
        return rb._sampler, rb._writer
    return rb._init_sampler, rb._init_writer


def _check_part(part, state) -> None:
    """Raise what ``part.load_state_dict(state)`` would refuse, changing nothing: the ``check_state_dict`` of our
    storage and samplers; parts that are not ours are left to their own load."""
    check = getattr(part, "check_state_dict", None)
    if check is not None:
        check(state)


def _check_writer_state(writer, state, capacity: int | None = None) -> None:
    """Raise what TorchRL's round-robin writer's ``load_state_dict`` would fail on (its cursor, which must also
    lie inside the storage's ``capacity`` slots), changing nothing."""
    if isinstance(writer, RoundRobinWriter):
        if not (isinstance(state, dict) and "_cursor" in state):
            raise ValueError("the checkpoint's writer state has no '_cursor' (not a round-robin writer's state_dict)")
        cursor = state["_cursor"]
        if isinstance(cursor, bool) or not isinstance(cursor, int) or cursor < 0:
            raise ValueError(f"the checkpoint's writer cursor must be an int >= 0, got {cursor!r}")
        if capacity is not None and cursor >= capacity:
            raise ValueError(f"the checkpoint's writer cursor {cursor} lies outside the storage's {capacity} slots")
        count = state.get("_write_count")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
            raise ValueError(f"the checkpoint's writer write_count must be an int >= 0, got {count!r}")


def _check_parts_agree(rb, storage_state, sampler_state, writer_state) -> None:
    """Raise unless the storage's, the sampler's and the writer's saved states describe one buffer: the length
    the writer's count implies (``min(write_count, capacity)``, cursor ``write_count % capacity``) is the
    storage's, and a (plain) prioritized sampler knows exactly the filled slots. Parts from different saves disagree.
    Host reads of the (CPU) checkpoint only."""
    capacity = getattr(rb._storage, "max_size", None)
    length = storage_state.get("_len") if isinstance(storage_state, dict) else None
    length = int(length) if isinstance(length, int) or (isinstance(length, torch.Tensor) and length.numel() == 1) \
        else None
    count = writer_state.get("_write_count") if isinstance(writer_state, dict) else None
    if isinstance(capacity, int) and isinstance(count, int) and not isinstance(count, bool):
        if length is not None and length != min(count, capacity):
            raise ValueError(f"the checkpoint's parts disagree: the storage holds {length} transitions, the writer "
                             f"wrote {count} into {capacity} slots (parts of different saves)")
        cursor = writer_state.get("_cursor")
        if isinstance(cursor, int) and cursor != count % capacity:
            raise ValueError(f"the checkpoint's parts disagree: writer cursor {cursor} after {count} writes into "
                             f"{capacity} slots")
    written = sampler_state.get("written") if isinstance(sampler_state, dict) else None
    # the plain samplers give every written slot a priority (slice samplers only valid starts; frame-stack storages
    # mask slots): there the filled slots and the prioritized ones are the same set
    plain = (type(rb._storage) is GPUTensorStorage and isinstance(sampler_state, dict)
             and sampler_state.get("kind") in ("GPUPrioritizedSampler", "GPURankBasedSampler"))
    if plain and length is not None and isinstance(written, torch.Tensor) and written.device.type == "cpu":
        known = int(written[:capacity].sum()) if isinstance(capacity, int) else int(written.sum())  # host tensor
        if known != length:
            raise ValueError(f"the checkpoint's parts disagree: the storage holds {length} transitions, the "
                             f"sampler's priorities cover {known} slots (parts of different saves)")


def _check_batch_size_state(batch_size) -> None:
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"the checkpoint's batch_size must be None or an int >= 1, got {batch_size!r}")


def _checked_state(rb, state_dict) -> dict[str, Any]:
    """``state_dict`` without our schema tag, once every refusal that the buffer's load would meet part-way
    (a newer buffer schema, missing parts, the sampler's and the writer's refusals) has been ruled out.

    Raises:
        TypeError: ``state_dict`` is not a dict (or its sampler part is not).
        ValueError: the checkpoint is refused; nothing has changed.
    """
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a replay buffer's state_dict() (a dict), got {type(state_dict).__name__}")
    version = state_dict.get("_lightning_per_schema", BUFFER_SCHEMA_VERSION)
    if version > BUFFER_SCHEMA_VERSION:
        raise ValueError(f"replay checkpoint schema {version} is newer than this code "
                         f"({BUFFER_SCHEMA_VERSION}); upgrade lightning_per")
    missing = [key for key in _BUFFER_KEYS if key not in state_dict]
    if missing:
        raise ValueError(f"not a replay buffer checkpoint: it lacks {missing} (keys {sorted(map(str, state_dict))})")
    sampler, writer = _components(rb)
    _check_part(rb._storage, state_dict["_storage"])
    _check_part(sampler, state_dict["_sampler"])
    _check_writer_state(writer, state_dict["_writer"], getattr(rb._storage, "max_size", None))
    _check_parts_agree(rb, state_dict["_storage"], state_dict["_sampler"], state_dict["_writer"])
    _check_batch_size_state(state_dict["_batch_size"])
    return {k: v for k, v in state_dict.items() if k != "_lightning_per_schema"}


def _check_dumps_dir(rb, path: str | os.PathLike) -> None:
    """Raise what ``rb.loads(path)`` would refuse part-way, changing nothing: reads the storage's and the
    sampler's saved states the way our ``dumps`` wrote them (``path/storage/storage.pt``,
    ``path/sampler/sampler.pt``) and checks them as :func:`_check_part`; checks that the writer's and the
    buffer's metadata files (TorchRL's ``dumps``) are there and hold a valid cursor and batch size.

    Raises:
        FileNotFoundError: a part of the checkpoint is missing.
        TypeError, ValueError: as :func:`_check_part`, or a metadata file lacks its entries.
    """
    path = Path(path).absolute()  # as TorchRL's loads
    sampler, writer = _components(rb)
    states = {}
    for part, file in ((rb._storage, path / "storage" / "storage.pt"), (sampler, path / "sampler" / "sampler.pt")):
        if not hasattr(part, "check_state_dict"):
            continue
        if part is rb._storage and not file.is_file() and (file.parent / "storage_metadata.json").is_file():
            continue  # items in TorchRL's layout, saved by TorchRL's checkpointer: its own loads checks them
        if not file.is_file():
            raise FileNotFoundError(f"no {file.parent.name} checkpoint at {file} (a directory written by a replay "
                                    f"buffer's dumps() has one)")
        # memory-mapped onto the CPU: the checks read metadata and shapes (the sampler's also its priorities),
        # no device memory and no second copy of the ring
        states[file.parent.name] = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        _check_part(part, states[file.parent.name])
    if isinstance(writer, RoundRobinWriter):
        meta = _check_json(path / "writer" / "metadata.json", "cursor")
        states["writer"] = {"_cursor": meta["cursor"], "_write_count": meta.get("write_count")}
        _check_writer_state(writer, states["writer"], getattr(rb._storage, "max_size", None))
    _check_parts_agree(rb, states.get("storage"), states.get("sampler"), states.get("writer"))
    _check_batch_size_state(_check_json(path / "buffer_metadata.json", "batch_size")["batch_size"])


def _check_json(file: Path, key: str) -> dict[str, Any]:
    if not file.is_file():
        raise FileNotFoundError(f"no {file.name} at {file.parent} (a directory written by a replay buffer's dumps() "
                                f"has one)")
    try:
        content = json.loads(file.read_text())
    except ValueError as err:
        raise ValueError(f"{file} is not valid JSON: {err}") from err
    if not isinstance(content, dict) or key not in content:
        raise ValueError(f"{file} has no {key!r} entry")
    return content


class _VerifiedDumps:
    """``dumps`` / ``loads`` of our buffers: a dump is written whole into a new directory with a manifest of
    every file's SHA-256 (written last), then swapped into place (:func:`lightning_per.integrity.atomic_directory`);
    ``loads`` verifies the manifest before reading anything (a damaged, truncated, partial or mixed dump is
    refused naming the file). TorchRL pickles the prefetch queue to ``prefetch.pkl`` and unpickles it on load
    (which may run code): ours write none and never read one (a ``prefetch.pkl`` is not in the manifest, so a
    directory holding one is refused)."""

    def dumps(self, path) -> None:
        """Save the buffer to the directory ``path`` (replaced as a whole; see the class docstring).

        Raises:
            ValueError: ``path`` exists and is not a dump directory (nothing is written or removed).
        """
        with atomic_directory(path, kind=_DUMP_KIND, meta={"buffer": type(self).__name__,
                                                           "schema": BUFFER_SCHEMA_VERSION}) as staging:
            super().dumps(staging)

    def loads(self, path) -> None:
        """Load a :meth:`dumps` directory after verifying its manifest and checking every part (a refused
        directory changes nothing).

        Raises:
            FileNotFoundError: no directory at ``path``.
            IntegrityError (a ValueError): a missing, truncated, damaged or unlisted file, or no manifest.
            TypeError, ValueError: a part this buffer refuses (see :meth:`load_state_dict`).
        """
        verify_directory(path, kind=_DUMP_KIND)
        _check_dumps_dir(self, path)
        super().loads(path)

    def _dump_prefetch_state(self, path: Path, prefetch_state) -> None:
        return None  # prefetched batches are draws already made; a loaded buffer draws anew

    def _load_prefetch_state(self, path: Path) -> None:
        return None


_DUMP_KIND = "replay_dump"


class GPUPrioritizedReplayBuffer(_VerifiedDumps, TensorDictPrioritizedReplayBuffer):
    """TorchRL's :class:`~torchrl.data.TensorDictPrioritizedReplayBuffer` with the replay on the GPU.

    Same keyword arguments as TorchRL's class, plus:

    Args:
        device: where transitions and priorities live (default CUDA when available, else CPU).
        sampler: ``"proportional"`` (:class:`GPUPrioritizedSampler`, default), ``"rank"``
            (:class:`GPURankBasedSampler`) or ``"prioritized_slice"`` (:class:`GPUPrioritizedSliceSampler`).
        sampler_kwargs: extra arguments of the sampler (``stratified``, ``shuffle_strata``,
            ``weight_normalization``, ``sort_every``, ``backend``, ``seed``, ``eager_graphs``).

    A storage left as ``None`` or given as an uninitialised TorchRL ``LazyTensorStorage`` becomes a
    :class:`GPUTensorStorage` of the same size; other TorchRL tensor storages (``LazyMemmapStorage``,
    ``TensorStorage``, an initialised ``LazyTensorStorage``) are used as they are, the sampler on their
    device. ``sample()`` returns a TensorDict ``[B]`` on the device with ``"index"`` ``(B,) int64`` and
    ``"priority_weight"`` ``(B,) float32``; ``update_priority`` and ``update_tensordict_priority`` work as in
    TorchRL. ``state_dict`` carries a schema version; a checkpoint that :meth:`load_state_dict` or
    :meth:`loads` refuses leaves the buffer unchanged.

    Raises:
        ValueError: ``sync=False`` (not supported: the whole point is one device-resident sampler).
        TypeError: ``storage`` is not a TorchRL tensor storage (e.g. a ``ListStorage``).

    Example::

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer
        >>> rb = GPUPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(100), batch_size=4,
        ...                                 device="cpu")
        >>> isinstance(rb, TensorDictPrioritizedReplayBuffer)
        True
        >>> _ = rb.extend(TensorDict({"observation": torch.randn(10, 3), "td_error": torch.zeros(10)}, [10]))
        >>> batch = rb.sample()
        >>> batch.batch_size, sorted(batch.keys())
        (torch.Size([4]), ['index', 'observation', 'priority_weight', 'td_error'])
        >>> batch["td_error"] = torch.full((4,), 2.0)  # e.g. written by TorchRL's DQNLoss
        >>> rb.update_tensordict_priority(batch)
    """

    def __init__(self, *, alpha: float, beta: float, priority_key="td_error", eps: float = 1e-8,
                 storage=None, device: torch.device | str | None = None, sampler: str = "proportional",
                 sampler_kwargs: dict[str, Any] | None = None, sampler_device=None, sync: bool = True,
                 reduction: str = "max", **kwargs) -> None:
        if not sync:
            raise ValueError("sync=False is not supported by GPUPrioritizedReplayBuffer")
        if kwargs.get("batch_size") is not None:
            check_batch_size(kwargs["batch_size"])
        check_generator(kwargs.get("generator"))
        if sampler not in _SAMPLERS:
            raise ValueError(f"sampler must be one of {sorted(_SAMPLERS)}, got {sampler!r}")
        device = resolve_device(device) if device is not None else (
            resolve_device(sampler_device, "sampler_device") if sampler_device is not None else None)
        storage = _resolve_storage(storage, device, None)
        device = device or (torch.device(storage.device) if storage.device != "auto" else default_device())
        prioritized = _build_sampler(_SAMPLERS[sampler], storage.max_size, device, alpha=alpha, beta=beta,
                                     eps=eps, reduction=reduction, **(sampler_kwargs or {}))
        self._sync = True
        self._prioritized_sampler = None
        self._prioritized_sampler_write_count = 0
        kwargs.setdefault("writer", GPURoundRobinWriter())
        # TorchRL's own __init__ would build its C++-tree sampler: go one level up instead.
        TensorDictReplayBuffer.__init__(self, priority_key=priority_key, storage=storage, sampler=prioritized, **kwargs)
        # TorchRL sampling features, fixed at construction, that the direct sample path does not implement
        self._direct_sample = not (kwargs.get("collate_fn") is not None or kwargs.get("pin_memory")
                                   or kwargs.get("prefetch") or kwargs.get("sample_unit") is not None
                                   or kwargs.get("delayed_init") or kwargs.get("transform_factory") is not None
                                   or getattr(self._writer, "tracks_generations", False))  # (torchrl >= 0.14)

    def sample(self, batch_size: int | None = None, return_info: bool = False, include_info=None):
        """A batch ``[B]`` on the device with ``"index"`` and ``"priority_weight"`` (TorchRL's keys).

        Without transforms, prefetching, a custom ``collate_fn``, ``pin_memory``, a sample unit or generation
        tracking this takes a direct path (:meth:`GPUPrioritizedSampler.sample_gather`: one fused sample +
        gather with a packed storage), which skips TorchRL's generic machinery (its locks, collate, info
        re-packing) on the hot path; otherwise it defers to TorchRL's ``sample``. ``return_info=True`` also
        returns the info dict.
        """
        if not (self._direct_sample and include_info is None and not len(self._transform)
                and getattr(self._storage, "ring", False)):  # items in our ring, not in TorchRL's layout
            return super().sample(batch_size, return_info=return_info, include_info=include_info)
        if batch_size is None:
            batch_size = self._batch_size
            if batch_size is None:
                raise ValueError("batch_size must be given to sample() or to the buffer's constructor")
        with self._replay_lock, self._write_lock:  # as TorchRL's sample: no write lands in between
            index, info, data = self._sampler.sample_gather(self._storage, batch_size, with_info=True)
        info["index"] = index
        return (data, info) if return_info else data

    def extend(self, tensordicts, *, update_priority: bool | None = None) -> torch.Tensor:
        """TorchRL's ``extend``: writes the batch ``[n]``, new slots get the running max priority (or the
        batch's ``priority_key`` values); returns the slots ``(n,)`` int64 (on the batch's device).

        A plain TensorDict with the stored keys takes a direct path (no transform, no generic writer
        machinery: see :func:`_direct_extend`); anything else defers to TorchRL's ``extend``.
        """
        _check_extend_priority(self, tensordicts, update_priority)
        _check_before_write(self, tensordicts)
        index = _direct_extend(self, tensordicts, update_priority)
        if index is None:
            index = super().extend(tensordicts, update_priority=update_priority)
        return index

    def update_priority(self, index, priority) -> None:
        """Set raw priorities of slots ``index`` (see :meth:`GPUPrioritizedSampler.update_priority`).

        Raises:
            TypeError, ValueError, IndexError: as the sampler, before anything changes.
        """
        if isinstance(index, tuple) and self._storage.ndim == 1:
            raise TypeError("index must be a flat tensor of slots (the storage is 1-D), got a tuple")
        with self._replay_lock, self._write_lock:  # as TorchRL's update_priority
            self._sampler.update_priority(index, priority, storage=self._storage)  # validates first

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["_lightning_per_schema"] = BUFFER_SCHEMA_VERSION
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """TorchRL's ``load_state_dict``, after every refusal has been checked on the checkpoint alone.

        Raises:
            TypeError, ValueError: a newer buffer schema, a sampler checkpoint of another kind, schema or
                capacity, missing parts; raised before anything changes (storage, writer, sampler, generator).
        """
        super().load_state_dict(_checked_state(self, state_dict))



class _GPUUniformReplayBuffer(_VerifiedDumps, TensorDictReplayBuffer):
    """TorchRL's TensorDictReplayBuffer with a schema-versioned state (uniform sampling)."""

    def extend(self, tensordicts, *, update_priority: bool | None = None) -> torch.Tensor:
        """TorchRL's ``extend``, through the direct path of :func:`_direct_extend` when it applies."""
        _check_extend_priority(self, tensordicts, update_priority)
        _check_before_write(self, tensordicts)
        index = _direct_extend(self, tensordicts, update_priority)
        if index is None:
            index = super().extend(tensordicts, update_priority=update_priority)
        return index

    def sample(self, batch_size: int | None = None, return_info: bool = False, include_info=None):
        """TorchRL's ``sample``; a given ``batch_size`` is checked first (an int >= 1: ValueError otherwise,
        before TorchRL's warning about a batch size differing from the buffer's)."""
        if batch_size is not None:
            check_batch_size(batch_size)
        return super().sample(batch_size, return_info=return_info, include_info=include_info)

    def update_priority(self, index, priority) -> None:
        """Nothing to update: uniform sampling has no priorities. A silent no-op (TorchRL warns here), so
        one training loop serves every sampler of :func:`make_replay_buffer`."""
        return None

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["_lightning_per_schema"] = BUFFER_SCHEMA_VERSION
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As :meth:`GPUPrioritizedReplayBuffer.load_state_dict`: refusals before anything changes."""
        super().load_state_dict(_checked_state(self, state_dict))



def make_replay_buffer(capacity: int, batch_size: int, *, sampler: str = "proportional",
                       device: torch.device | str | None = None, alpha: float = 0.6, beta: float = 0.4,
                       eps: float = 1e-6, generator: torch.Generator | None = None,
                       priority_key: str = "td_error", fallback: bool = True, packed: bool = False,
                       frame_stack: int | None = None, frames: int | None = None, pinned_host: bool = False,
                       frame_keys: tuple[Any, Any] = ("observation", "next_observation"),
                       **sampler_kwargs) -> TensorDictReplayBuffer:
    """A replay buffer of ``capacity`` transitions on ``device`` with one of our samplers.

    Args:
        capacity: slots (>= 1).
        batch_size: default batch of ``sample()`` (>= 1).
        sampler: ``"proportional"``, ``"rank"``, ``"uniform"``, ``"slice"`` (:class:`GPUSliceSampler`) or
            ``"prioritized_slice"`` (:class:`GPUPrioritizedSliceSampler`); the slice samplers take
            ``slice_len`` or ``num_slices`` and their other options through ``**sampler_kwargs``.
        device: default CUDA when available, else CPU.
        alpha, beta, eps: PER exponents and offset (ignored by ``"uniform"``).
        generator: the buffer's ``torch.Generator`` (reproducible draws; see ``set_rng``).
        priority_key: key of raw priorities read by ``update_tensordict_priority``.
        fallback: on CUDA OOM at allocation use the CPU (one warning) instead of raising.
        packed: store each transition as one row (:class:`GPUTensorStorage` ``packed=True``): a batch read
            is one gather kernel whatever the number of keys, and the batch's fields are views into it
            (``torch.save`` of a batch needs ``.clone()`` first). For learners that consume batches at once.
        frame_stack: store the stacked-frame ``frame_keys`` with each frame once
            (:class:`~lightning_per.replay.frames.FrameStackStorage` of ``frame_stack`` frames a stack and a ring
            of ``frames`` frames); needs ``sampler="proportional"`` (it masks slots whose frames are gone).
        frames, frame_keys: the ring of frames' capacity and the two stacked keys (with ``frame_stack``).
        pinned_host: keep the transitions in page-locked host memory
            (:class:`~lightning_per.replay.host.PinnedHostStorage`; priorities, draws and the batch on
            ``device``): for buffers larger than the GPU.
        **sampler_kwargs: ``stratified``, ``shuffle_strata``, ``weight_normalization``, ``sort_every``,
            ``backend``, ``seed``, ``eager_graphs``; for the slice samplers ``slice_len`` / ``num_slices``,
            ``end_key``, ``end_keys``, ``traj_key``, ``strict_length``, ``truncated_key``, ``init_key``, ``span``,
            ``slice_priority``.

    Returns:
        :class:`GPUPrioritizedReplayBuffer` for ``"proportional"``/``"rank"``, else a TorchRL
        ``TensorDictReplayBuffer`` with :class:`GPURandomSampler`. Both sample TensorDicts ``[B]`` on
        the device with ``"index"``; prioritized ones add ``"priority_weight"``.

    Raises:
        ValueError: an unknown ``sampler`` or a bad size (named in the message).

    Example::

        >>> import torch
        >>> from tensordict import TensorDict
        >>> rb = make_replay_buffer(1000, 32, sampler="proportional", device="cpu", packed=True, seed=0)
        >>> _ = rb.extend(TensorDict({"observation": torch.randn(100, 4), "reward": torch.randn(100)}, [100]))
        >>> batch = rb.sample()
        >>> tuple(batch["observation"].shape), batch["priority_weight"].dtype
        ((32, 4), torch.float32)
        >>> rb.update_priority(batch["index"], batch["reward"].abs())
    """
    if not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
    check_batch_size(batch_size)
    check_generator(generator)
    check_seed(sampler_kwargs.get("seed"))
    device = resolve_device(device)
    if pinned_host:
        if frame_stack is not None:
            raise ValueError("pinned_host=True and frame_stack: choose one storage")
        storage = PinnedHostStorage(capacity, device=device)
    elif frame_stack is None:
        storage = GPUTensorStorage(capacity, device=device, fallback=fallback, packed=packed)
    else:
        if sampler != "proportional":
            raise ValueError(f"frame_stack needs sampler='proportional' (its draws skip transitions whose frames "
                             f"the ring overwrote), got sampler={sampler!r}")
        storage = FrameStackStorage(capacity, frame_stack=frame_stack, frames=frames, keys=frame_keys,
                                    device=device, fallback=fallback, packed=packed)
    if sampler == "slice":
        options = sorted(_init_options(GPUSliceSampler) - {"capacity", "device"})
        unknown = sorted(set(sampler_kwargs) - set(options))
        if unknown:
            raise TypeError(f"make_replay_buffer got unexpected keyword arguments {unknown} for sampler='slice'; "
                            f"its options are {options}")
        slicer = _build_sampler(GPUSliceSampler, capacity, device, **sampler_kwargs)
        slicer._slice_shape(batch_size)  # a batch_size the slices cannot divide fails here, not at sample()
        return _GPUUniformReplayBuffer(storage=storage, sampler=slicer, writer=GPURoundRobinWriter(),
                                       batch_size=batch_size, generator=generator, priority_key=priority_key)
    if sampler == "uniform":
        seed = sampler_kwargs.pop("seed", None)
        sampler_kwargs.pop("eager_graphs", None)  # accepted, as for the other samplers: nothing to serve here
        if sampler_kwargs:
            raise ValueError(f"uniform sampler takes no {sorted(sampler_kwargs)}")
        rb = _GPUUniformReplayBuffer(storage=storage, sampler=_build_sampler(GPURandomSampler, capacity, device,
                                                                            seed=seed),
                                     writer=GPURoundRobinWriter(), batch_size=batch_size,
                                     generator=generator, priority_key=priority_key)
        return rb
    if sampler not in _SAMPLERS:
        raise ValueError(f"sampler must be 'proportional', 'rank', 'uniform', 'slice' or 'prioritized_slice', "
                         f"got {sampler!r}")
    options = sorted(_init_options(_SAMPLERS[sampler]) - _SET_BY_FACTORY)
    unknown = sorted(set(sampler_kwargs) - set(options))
    if unknown:
        raise TypeError(f"make_replay_buffer got unexpected keyword arguments {unknown} for sampler={sampler!r}; "
                        f"its options are {options}")
    rb = GPUPrioritizedReplayBuffer(alpha=alpha, beta=beta, eps=eps, storage=storage, device=device,
                                    sampler=sampler, sampler_kwargs=sampler_kwargs, batch_size=batch_size,
                                    generator=generator, priority_key=priority_key)
    if sampler == "prioritized_slice":
        rb._sampler._slice_shape(batch_size)  # as for "slice": the batch must split into slices
    return rb


def _init_options(cls: type) -> set[str]:
    """Keyword names ``cls(...)`` accepts: its ``__init__``'s named parameters, plus those of the next
    ``__init__`` up the MRO as long as the current one forwards ``**kwargs`` (e.g. the rank sampler's
    ``sort_every`` and the proportional sampler's options)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(klass.__init__).parameters.values()
        names |= {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self"}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names

