"""GPUPrioritizedReplayBuffer: TorchRL replay buffers wired to our storage and samplers, so that switching from
TorchRL is one import (:func:`lightning_per.replay.make_replay_buffer` builds them)."""

from __future__ import annotations

import warnings
from multiprocessing.context import get_spawning_popen
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import (
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
    TensorStorage,
)
from torchrl.data.replay_buffers.samplers import PrioritizedSampler, Sampler

from lightning_per.replay._rng import GeneratorBytes
from lightning_per.replay.buffer_checkpoint import (
    BUFFER_SCHEMA_VERSION,
    checked_state,
    verified_dumps,
    verified_loads,
)
from lightning_per.replay.compat import (
    attached_entities,
    buffer_generator,
    buffer_locks,
    buffer_parts,
    is_compilable,
    layout_options,
    plain_extend,
    tracks_generations,
)
from lightning_per.replay.errors import check_batch_size, check_generator
from lightning_per.replay.ingress import (
    IngressLayout,
    IngressStats,
    SharedBufferWriter,
    SharedIngress,
    WriterHandle,
    stored_layout,
    write_limit,
)
from lightning_per.replay.prioritized import GPUPrioritizedSampler
from lightning_per.replay.random import GPURandomSampler
from lightning_per.replay.rank import GPURankBasedSampler
from lightning_per.replay.rate import SamplesPerInsert
from lightning_per.replay.slice import GPUSliceSampler
from lightning_per.replay.slice_prioritized import GPUPrioritizedSliceSampler
from lightning_per.replay.storage import GPUTensorStorage, default_device, resolve_device
from lightning_per.replay.writer import GPURoundRobinWriter
from lightning_per.schema import stamp

__all__ = ["GPUPrioritizedReplayBuffer", "GPUReplayBuffer", "BUFFER_SCHEMA_VERSION", "SAMPLERS", "build_sampler",
           "check_prioritized_sampler", "resolve_storage"]


#: The prioritized samplers by the name ``make_replay_buffer(sampler=...)`` and the buffer take.
SAMPLERS = {"proportional": GPUPrioritizedSampler, "rank": GPURankBasedSampler,
             "prioritized_slice": GPUPrioritizedSliceSampler}

#: The classes :class:`GPUPrioritizedReplayBuffer` takes as a ``sampler=`` instance.
PRIORITIZED = tuple(SAMPLERS.values())


def check_prioritized_sampler(sampler, *, alpha: float | None, beta: float | None, eps: float | None,
                              reduction: str | None, capacity: int | None) -> None:
    """Raise unless ``sampler``, given to a prioritized buffer as an instance, is one of ours and agrees with what
    the caller also named: ``alpha``, ``beta``, ``eps``, ``reduction`` left None or equal to the sampler's, and the
    sampler's ``max_size`` equal to ``capacity`` (the storage's slots; None: not known yet). Host values only.

    Raises:
        TypeError: ``sampler`` is not a :class:`GPUPrioritizedSampler`, :class:`GPURankBasedSampler` or
            :class:`GPUPrioritizedSliceSampler` (the message says where uniform, slice and TorchRL's samplers go).
        ValueError: a named value differs from the sampler's (both quoted).
    """
    if not isinstance(sampler, PRIORITIZED):
        if isinstance(sampler, Sampler) and not isinstance(sampler, PrioritizedSampler):
            where = "; a sampler without priorities goes in GPUReplayBuffer(sampler=...) (TorchRL's " \
                    "TensorDictReplayBuffer with our storage and writer)"
        elif isinstance(sampler, Sampler):
            where = "; TorchRL's own prioritized samplers go in TorchRL's TensorDictReplayBuffer(sampler=...)"
        else:
            where = ""
        raise TypeError(f"sampler must be one of {sorted(SAMPLERS)} or an instance of "
                        f"{', '.join(c.__name__ for c in PRIORITIZED)}, got {type(sampler).__name__}{where}")
    ours = {"alpha": sampler.alpha, "beta": sampler.beta, "eps": float(sampler.core.state.eps),
            "reduction": sampler.reduction}
    for name, value in (("alpha", alpha), ("beta", beta), ("eps", eps), ("reduction", reduction)):
        if value is not None and value != ours[name]:
            raise ValueError(f"{name}={value!r} differs from the sampler's {name}={ours[name]!r}: with a sampler "
                             f"instance, leave {name} unset (the sampler's is used) or give the same value")
    if capacity is not None and sampler.max_size != capacity:
        raise ValueError(f"the sampler holds priorities of {sampler.max_size} slots, the storage max_size="
                         f"{capacity}: build the sampler with max_capacity={capacity}")


def resolve_storage(storage, device: torch.device | None, capacity: int | None) -> TensorStorage:
    """The storage the buffer keeps: ours for None or an uninitialised TorchRL ``LazyTensorStorage`` (a new object
    of its size and layout options: the one passed is left untouched and empty), else ``storage`` itself, which
    must be a TorchRL tensor storage (the samplers read ``max_size`` and
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
                                compilable=is_compilable(storage), **layout_options(storage))
    return storage


def build_sampler(cls, capacity: int, device: torch.device, **kw):
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
    """Raise before anything is written when ``data`` is not a TensorDict (these buffers store TensorDicts,
    as TorchRL's ``TensorDictReplayBuffer`` does; the error says how to wrap it) or the sampler cannot read it
    (a slice sampler's trajectory marker missing: :meth:`GPUSliceSampler.check_signal`)."""
    if not isinstance(data, TensorDictBase):
        sizes = [v.shape[0] for v in data.values() if getattr(v, "ndim", 0) > 0] if isinstance(data, dict) else []
        n = sizes[0] if sizes else "n"
        raise ValueError(f"{type(rb).__name__}.extend: data must be a TensorDict, got {type(data).__name__}; wrap "
                         f"a dict of (n, ...) tensors as tensordict.TensorDict(data, batch_size=[{n}]), or store "
                         "tensors, tensorclasses and pytrees in torchrl's ReplayBuffer(storage=GPUTensorStorage(...), "
                         "sampler=GPUPrioritizedSampler(...))")
    sampler = buffer_parts(rb).sampler
    if isinstance(sampler, (GPUSliceSampler, GPUPrioritizedSliceSampler)):  # ours that read a trajectory marker
        sampler.check_signal(data)


def _empty_extend(rb, data) -> torch.Tensor | None:
    """``rb.extend(data)`` of a batch ``[0, ...]`` (no transition): the slots written, an empty ``(0,)`` int64 tensor
    on the batch's device (the CPU for a batch without one), with nothing written, no cursor or count moved and the
    storage left as it was (uninitialised if it was), after the storage's spec check (a batch of other keys, dtypes
    or shapes than the stored ones is still refused). TorchRL's ``extend`` returns the same for such a batch once
    its storage holds data (it raises an IndexError on a storage never written). None for a batch with items."""
    if not (isinstance(data, TensorDictBase) and data.batch_dims >= 1 and data.batch_size[0] == 0):
        return None
    storage = buffer_parts(rb).storage
    if isinstance(storage, GPUTensorStorage):  # ours; TorchRL's storages have no spec check
        storage.check_spec(data)
    return torch.empty(0, dtype=torch.long, device=data.device or "cpu")


#: :func:`_check_extend_priority` did not look the batch's priority entry up
_NOT_LOOKED_UP = object()


def _direct_extend(rb, data, update_priority: bool | None, priority=_NOT_LOOKED_UP):
    """TorchRL's ``TensorDictReplayBuffer.extend`` of a plain TensorDict ``data`` ``[n]`` that the
    storage takes as it is (:meth:`GPURoundRobinWriter._direct_pairs`), in one pass: the same slots,
    cursor, write count, stored values, ``mark_update`` calls and priority update, without TorchRL's
    generic machinery (its shallow copy of ``data``, which only ever receives the ``"index"`` tag, is
    skipped: ``data`` itself is left unchanged, as there). None when anything else applies (transforms,
    consuming samplers, ``dim_extend``, generation tracking, other writers or storages, nested keys,
    another spec): the caller then takes TorchRL's path, which validates and raises. ``priority``: the batch's
    ``priority_key`` entry when the caller has looked it up (:func:`_check_extend_priority`), else
    :data:`_NOT_LOOKED_UP`."""
    if type(data) is not TensorDict or not plain_extend(rb):
        return None
    storage, sampler, writer = buffer_parts(rb)
    # exactly our writer: a subclass may override extend / _mark_update_entities, which this path would skip
    if type(writer) is not GPURoundRobinWriter:
        return None
    pairs = writer._direct_pairs(data)
    if pairs is None:
        return None
    replay_lock, write_lock = buffer_locks(rb)
    with replay_lock, write_lock:
        index = writer._write_direct(data, pairs)
        for entity in attached_entities(storage):  # the writer's _mark_update_entities
            if entity is rb and type(rb).mark_update is ReplayBuffer.mark_update:
                sampler.mark_update(index, storage=storage)  # what ReplayBuffer.mark_update does
            else:
                entity.mark_update(index)
        sampler.extend(index)
    if update_priority is None or update_priority:
        if priority is _NOT_LOOKED_UP:
            priority = data.get(rb.priority_key, None)
        if priority is not None:
            try:
                rb.update_priority(index, priority)
            except Exception as e:
                raise RuntimeError(
                    "Failed to update priority of extended data. You can try to set update_priority=False in "
                    "the extend method and update the priority manually.") from e
    return index


def _extend(rb, data, update_priority: bool | None, torchrl_extend) -> torch.Tensor:
    """``rb.extend(data)``: checked first (nothing written on a refusal), an empty batch written as nothing, else
    the direct path (:func:`_direct_extend`) or, where it does not apply, ``torchrl_extend`` (TorchRL's ``extend``
    of ``rb``). Returns the slots ``(n,)`` int64."""
    priority = _check_extend_priority(rb, data, update_priority)
    _check_before_write(rb, data)
    index = _empty_extend(rb, data)
    if index is not None:
        return index
    index = _direct_extend(rb, data, update_priority, priority)
    return torchrl_extend(data, update_priority=update_priority) if index is None else index


def _check_extend_priority(rb, data, update_priority: bool | None):
    """Raise what the priority update of ``rb.extend(data)`` would refuse, before anything is written: the
    batch's ``priority_key`` entry must be a real tensor with one value per transition (or one for all).
    Host checks of type, dtype and shape only. Returns the entry (None when the batch has none), or
    :data:`_NOT_LOOKED_UP` when no check applies.

    Raises:
        TypeError: the entry is not a real-valued tensor (bool, complex, non-tensor data).
        ValueError: it holds another number of values.
    """
    if update_priority is False or not hasattr(data, "get"):
        return _NOT_LOOKED_UP
    key = rb.priority_key  # both buffers are TorchRL TensorDictReplayBuffers
    sampler = buffer_parts(rb).sampler  # a TorchRL Sampler: every one has update_priority
    if key is None or isinstance(sampler, GPURandomSampler):
        return _NOT_LOOKED_UP
    try:
        priority = data.get(key, None)
    except Exception:  # noqa: BLE001 - a batch TorchRL's own path validates
        return _NOT_LOOKED_UP
    if priority is None:
        return None
    if not isinstance(priority, torch.Tensor) or priority.dtype == torch.bool or priority.is_complex():
        what = f"dtype {priority.dtype}" if isinstance(priority, torch.Tensor) else type(priority).__name__
        raise TypeError(f"extend: the batch's priority entry {key!r} must be a real tensor, got {what} (nothing was "
                        f"written; pass update_priority=False to store it without setting priorities)")
    batch = getattr(data, "batch_size", ())
    if len(batch) == 1 and priority.numel() not in (1, batch[0]):
        raise ValueError(f"extend: the batch's priority entry {key!r} must hold one value per transition "
                         f"({batch[0]}), got shape {tuple(priority.shape)} (nothing was written)")
    return priority


# ---------------------------------------------------------------------------- writers of other processes
# Both buffers hold a SharedIngress (lightning_per/replay/ingress.py) and delegate their writer methods to the
# functions below.

def _writer_handle(rb, example, slots: int, rows: int) -> WriterHandle:
    """``rb.writer_handle``: a new ingress ring of the buffer's layout (``example``'s, or the storage's once it is
    initialized, even emptied: the layout ``extend`` takes, a frame-deduplicated storage's stacked keys included,
    :func:`~lightning_per.replay.ingress.stored_layout`) and its handle.

    Raises:
        ValueError: no ``example`` and a storage never written; ``example`` of another layout than the stored one;
            ``slots`` / ``rows`` out of range (see :meth:`SharedIngress.handle`).
        TypeError: ``example`` is not a TensorDict or mapping of tensors.
    """
    stored = stored_layout(buffer_parts(rb).storage)
    if example is None:
        if stored is None:
            raise ValueError("writer_handle: the buffer holds no transition yet, so its layout is unknown; pass "
                             "example= (a TensorDict [n] of the transitions the writers will send)")
        layout = stored
    else:
        layout = IngressLayout.of(example)
        if stored is not None and not layout.same_fields(stored):
            raise ValueError(f"writer_handle: example's layout {layout.fields} differs from the stored "
                             f"transitions' {stored.fields}")
    handle = rb._ingress.handle(layout, slots, rows)
    rb._ingress.publish(rb.write_count)
    return handle


def _reduced(rb, protocol: int):
    """``rb.__reduce_ex__(protocol)``: a shared buffer (``rb.share()``) pickled for a process being started becomes
    a :class:`~lightning_per.replay.ingress.SharedBufferWriter` around a new writer handle (TorchRL's multiprocess
    collectors pickle their ``replay_buffer`` so); any other pickle is a full copy (``__getstate__``)."""
    if rb.shared and get_spawning_popen() is not None:
        return SharedBufferWriter, (_writer_handle(rb, None, 8, 1024), rb.priority_key)
    return object.__reduce_ex__(rb, protocol)


def _ingest(rb) -> int:
    """``rb.ingest``: every ready batch of every writer into ``rb`` (one ``extend``, or several of at most what the
    storage takes in one, :func:`~lightning_per.replay.ingress.write_limit`; then one priority update of the rows
    whose writer gave priorities); returns the rows ingested. Host work over host staging. A call made while one
    runs (``len(rb)`` inside its ``extend``), or without writer handles, ingests nothing.

    Raises:
        Whatever an ``extend`` raises: the rows of that chunk stay in the rings, pending (no slot freed, nothing
        counted), and the chunks before it stay ingested.
    """
    ingress = rb._ingress
    if ingress.busy or not ingress.active:
        return 0
    ingress.busy = True
    try:
        return _ingest_ready(rb, write_limit(buffer_parts(rb).storage))
    finally:
        ingress.busy = False


def _ingest_ready(rb, limit: int | None) -> int:
    ingress = rb._ingress
    ingress.begin()
    total = 0
    while (drained := ingress.drain(limit)) is not None:
        batch, priority, given = drained
        try:
            index = rb.extend(batch, update_priority=False)
        except BaseException:
            ingress.rollback()  # nothing freed, nothing counted: the next ingest stages these rows again
            raise
        ingress.commit()
        ingress.publish(rb.write_count)
        total += batch.batch_size[0]
        if bool(given.any()):  # sync-ok: host staging flags
            if bool(given.all()):  # sync-ok: host staging flags
                rb.update_priority(index, priority.to(index.device))
            else:
                rb.update_priority(index[given.to(index.device)], priority[given].to(index.device))
    return total


def _checked_parts(backpressure: str, backpressure_timeout: float, samples_per_insert: float | None,
                   kwargs: dict[str, Any]) -> tuple[SharedIngress, SamplesPerInsert | None]:
    """A buffer's writers' ingress and its ``rate_limit`` from its arguments, and TorchRL's ``batch_size`` and
    ``generator`` keywords in ``kwargs`` checked, before anything of the buffer is built.

    Raises:
        ValueError: an unknown ``backpressure``, a ``backpressure_timeout`` <= 0, a ``samples_per_insert`` not finite
            or not > 0, a ``batch_size`` not an int >= 1.
        TypeError: as :class:`SamplesPerInsert`; a ``generator`` that is not a ``torch.Generator``.
    """
    ingress = SharedIngress(backpressure, backpressure_timeout)
    limit = None if samples_per_insert is None else SamplesPerInsert(samples_per_insert)
    if kwargs.get("batch_size") is not None:
        check_batch_size(kwargs["batch_size"])
    check_generator(kwargs.get("generator"))
    return ingress, limit


def _reserve(rb, batch_size: int | None, wait: bool, timeout: float | None) -> None:
    """Before ``rb.sample``: wait for (``wait``) or require the sample-to-insert budget of ``batch_size`` records
    (:meth:`SamplesPerInsert.reserve`; ingesting the writers' batches while waiting). Nothing without a limit."""
    limit = rb.rate_limit
    if limit is None:
        return
    if batch_size is None:
        batch_size = rb.batch_size
        if batch_size is None:
            raise ValueError("batch_size must be given to sample() or to the buffer's constructor")
    limit.reserve(batch_size, write_count=lambda: rb.write_count, filled=lambda: len(rb),
                  refill=lambda: _ingest(rb), wait=wait, timeout=timeout)


def _with_ingress(rb, text: str) -> str:
    """``text`` (TorchRL's repr, ending in ``)``) with the ingress counters when the buffer has writers."""
    if not rb._ingress.active:
        return text
    return f"{text[:-1].rstrip()}, \n    ingress={rb._ingress!r})"


def _pickled_generator(rb, state: dict[str, Any]) -> dict[str, Any]:
    """TorchRL's pickle state ``state`` of ``rb`` with the buffer's generator as bytes
    (:class:`~lightning_per.replay._rng.GeneratorBytes`) under ``"_rng_bytes"``, ``"_rng"`` None: TorchRL pickles
    it as a temporary clone of its state tensor, which a ``spawn``ed process then cannot rebuild (the clone's shared
    memory is freed before the child opens it)."""
    rng = buffer_generator(rb)
    if rng is not None:
        state["_rng"], state["_rng_bytes"] = None, GeneratorBytes.of(rng)
    return state


def _set_state(rb, state: dict[str, Any], torchrl_setstate) -> None:
    """``rb.__setstate__(state)``: TorchRL's ``torchrl_setstate`` of ``state`` without ``"_rng_bytes"``, then the
    buffer's generator rebuilt from those bytes (:func:`_pickled_generator`), when there were any."""
    state = dict(state)
    saved = state.pop("_rng_bytes", None)
    torchrl_setstate(state)
    if saved is not None:
        rb.set_rng(saved.generator())


# ---------------------------------------------------------------------------- checkpoint checks
# TorchRL's ``load_state_dict`` / ``loads`` load the storage, then the sampler, then the writer: a part
# refused half-way (another sampler kind or schema, another transition shape) used to leave the earlier
# parts already replaced. The functions below raise every refusal of our storage's, samplers' and the
# writer's loads from the checkpoint alone, changing nothing, so the buffers call them first. Load paths
# only: host work.

class GPUPrioritizedReplayBuffer(TensorDictPrioritizedReplayBuffer):
    """TorchRL's :class:`~torchrl.data.TensorDictPrioritizedReplayBuffer` with the replay on the GPU.

    Same keyword arguments as TorchRL's class, plus:

    Args:
        alpha, beta, eps, reduction: the sampler's PER exponents, offset (default 1e-8) and TorchRL's reduction of
            an item's priorities (default ``"max"``); required (alpha, beta) with a sampler named by a string, and
            with a sampler instance left unset or equal to the instance's.
        device: where transitions and priorities live (default CUDA when available, else CPU).
        sampler: as in TorchRL, a sampler instance: a :class:`GPUPrioritizedSampler`,
            :class:`GPURankBasedSampler` or :class:`GPUPrioritizedSliceSampler` of ``max_capacity`` the storage's
            ``max_size``; or the name of one built here: ``"proportional"`` (default), ``"rank"`` or
            ``"prioritized_slice"``. Uniform and slice samplers go in :class:`GPUReplayBuffer`.
        sampler_kwargs: with a name, extra arguments of the sampler (``stratified``, ``shuffle_strata``,
            ``weight_normalization``, ``sort_every``, ``backend``, ``seed``, ``eager_graphs``; for
            ``sampler="prioritized_slice"`` also ``slice_len`` or ``num_slices`` (one of them is required),
            ``end_key``, ``end_keys``, ``traj_key``, ``strict_length``, ``truncated_key``, ``init_key``, ``span``,
            ``slice_priority``: see :class:`GPUPrioritizedSliceSampler`).

    A storage left as ``None`` or given as an uninitialised TorchRL ``LazyTensorStorage`` becomes a
    :class:`GPUTensorStorage` of the same size (``max_size``, ``ndim``, ``compilable``, ``consolidated``,
    ``shared_init``; on ``device``, else the given storage's, else the default): a *new* object, so, unlike
    TorchRL's buffers, ``rb.storage is storage`` is False and the storage passed stays empty (``len(storage) ==
    0``, never written); read the data through ``rb.storage``. The ring is what keeps writes and reads on the
    device with no host read, and capturable (the drop-in use: replace TorchRL's class name, keep its
    arguments). A :class:`GPUTensorStorage` passed is used as it is (``rb.storage is storage``), and so are other
    TorchRL tensor storages (``LazyMemmapStorage``, ``TensorStorage``, an initialised ``LazyTensorStorage``), the
    sampler on their device, with TorchRL's reads (docs/replay.md "Differences from TorchRL").
    ``sample()`` returns a TensorDict ``[B]`` on the device with ``"index"`` ``(B,) int64`` and
    ``"priority_weight"`` ``(B,) float32``; ``update_priority`` and ``update_tensordict_priority`` work as in
    TorchRL. ``state_dict`` carries a schema version; a checkpoint that :meth:`load_state_dict` or
    :meth:`loads` refuses leaves the buffer unchanged.

        backpressure: what a writer of another process (:meth:`writer_handle`) does when its ring is full:
            ``"block"`` (default: wait up to ``backpressure_timeout`` seconds, then TimeoutError) or
            ``"drop_oldest"`` (reclaim its oldest batch not yet ingested; counted in :attr:`ingress_stats`).
        backpressure_timeout: seconds, > 0 (default 30).
        samples_per_insert: optional sample-to-insert ratio limit, TorchRL 0.15's ``RateLimitedReplayBuffer``
            semantics (:mod:`lightning_per.replay.rate`): ``sample`` returns at most this many records per record
            written, cumulatively; ``sample(wait=True, timeout=...)`` ingests writers' batches until permitted.
            Held as :attr:`rate_limit` (None without one).
        sync: TorchRL's flag, accepted either way with TorchRL's ``sync=False`` meaning, which this buffer always
            has: processes other than the owner only write (through writer handles: :meth:`writer_handle`, or the
            :class:`~lightning_per.replay.ingress.SharedBufferWriter` a shared buffer becomes in a spawned
            process), and the owner's one sampler gives their transitions the default priority before it samples
            (at :meth:`ingest`).

    Shared with other processes (``rb.share()``, ``shared=True``, or a TorchRL multiprocess collector given
    ``replay_buffer=rb``), the buffer pickled for a process being started becomes a
    :class:`~lightning_per.replay.ingress.SharedBufferWriter` of it (a new writer handle each), so the collector's
    workers write into this buffer; see docs/replay.md "Many writers". A writer ``track_generations=True``
    (``writer=GPURoundRobinWriter(track_generations=True)``, TorchRL's stamps) adds ``"index_generation"`` to
    each sample, and :meth:`update_priority` / :meth:`update_tensordict_priority` then drop the updates aimed at
    slots rewritten since they were sampled.

    Raises:
        ValueError: an unknown ``backpressure`` or a ``backpressure_timeout`` <= 0; a ``samples_per_insert`` not
            finite or not > 0; an unknown sampler name; a sampler instance whose capacity, alpha, beta, eps or
            reduction differs from the storage's or the one given.
        TypeError: ``storage`` is not a TorchRL tensor storage (e.g. a ``ListStorage``); ``samples_per_insert``
            not a number; ``sampler`` is neither a name nor one of our prioritized samplers; ``sampler_kwargs`` with
            an instance; no ``alpha`` / ``beta`` with a name.

    Example::

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer
        >>> from lightning_per import GPUPrioritizedReplayBuffer
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

    An uninitialised ``LazyTensorStorage`` is replaced by a ring of its size; the one passed stays empty::

        >>> storage = LazyTensorStorage(100)
        >>> rb = GPUPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=storage, device="cpu")
        >>> _ = rb.extend(TensorDict({"observation": torch.randn(5, 3)}, [5]))
        >>> type(rb.storage).__name__, rb.storage.max_size, rb.storage is storage, len(rb.storage), len(storage)
        ('GPUTensorStorage', 100, False, 5, 0)

    A sampler instance, as TorchRL's buffers take one::

        >>> from lightning_per import GPURankBasedSampler
        >>> rank = GPURankBasedSampler(100, alpha=0.7, beta=0.5, device="cpu")
        >>> rb = GPUPrioritizedReplayBuffer(sampler=rank, storage=LazyTensorStorage(100), batch_size=4)
        >>> rb.sampler is rank, rb.sampler.alpha
        (True, 0.7)
    """

    def __init__(self, *, alpha: float | None = None, beta: float | None = None, priority_key="td_error",
                 eps: float | None = None, storage=None, device: torch.device | str | None = None,
                 sampler: str | PrioritizedSampler = "proportional", sampler_kwargs: dict[str, Any] | None = None,
                 sampler_device=None, sync: bool = True, reduction: str | None = None, backpressure: str = "block",
                 backpressure_timeout: float = 30.0, samples_per_insert: float | None = None, **kwargs) -> None:
        self._ingress, self.rate_limit = _checked_parts(backpressure, backpressure_timeout, samples_per_insert, kwargs)
        named = isinstance(sampler, str)
        if named:
            if sampler not in SAMPLERS:
                raise ValueError(f"sampler must be one of {sorted(SAMPLERS)} or a sampler instance, got {sampler!r}")
            if alpha is None or beta is None:
                raise TypeError(f"GPUPrioritizedReplayBuffer(sampler={sampler!r}) needs alpha= and beta= (the "
                                f"PER exponents of the sampler it builds), or pass a sampler instance")
        else:
            check_prioritized_sampler(sampler, alpha=alpha, beta=beta, eps=eps, reduction=reduction, capacity=None)
            if sampler_kwargs:
                raise TypeError(f"sampler_kwargs configure a sampler built by name; the {type(sampler).__name__} "
                                f"given is already built (got sampler_kwargs {sorted(sampler_kwargs)})")
            if device is None and sampler_device is None:
                device = sampler.device
        device = resolve_device(device) if device is not None else (
            resolve_device(sampler_device, "sampler_device") if sampler_device is not None else None)
        storage = resolve_storage(storage, device, None if named else sampler.max_size)
        device = device or (torch.device(storage.device) if storage.device != "auto" else default_device())
        if not named and device != sampler.device:
            raise ValueError(f"device={device} differs from the sampler's device {sampler.device}: build the sampler "
                             f"on {device}, or leave device unset")
        if named:
            prioritized = build_sampler(SAMPLERS[sampler], storage.max_size, device, alpha=alpha, beta=beta,
                                         eps=1e-8 if eps is None else eps,
                                         reduction="max" if reduction is None else reduction,
                                         **(sampler_kwargs or {}))
        else:
            check_prioritized_sampler(sampler, alpha=None, beta=None, eps=None, reduction=None,
                                      capacity=storage.max_size)
            prioritized = sampler
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
                                   or tracks_generations(self._writer))

    def writer_handle(self, example=None, *, slots: int = 8, rows: int = 1024) -> WriterHandle:
        """A picklable handle through which another process of this host writes transitions into this buffer.

        Each call makes a new shared-memory ring of ``slots`` x ``rows`` transitions: one handle per writer
        process (see :mod:`lightning_per.replay.ingress`). The writers' batches enter the buffer at
        :meth:`ingest` (also run by :meth:`sample`).

        Args:
            example: a TensorDict ``[n]`` (or mapping of ``(n, ...)`` tensors) with the keys, per-item shapes and
                dtypes the writers send; optional once the buffer holds transitions (their layout is used).
            slots, rows: slots of the ring and transitions a slot (>= 1).

        Raises:
            ValueError, TypeError: see :func:`_writer_handle`.
        """
        return _writer_handle(self, example, slots, rows)

    def ingest(self) -> int:
        """Move every batch the writers have made ready into the buffer (one ``extend``; their priorities, when
        given, set after it); returns the transitions ingested. Run by :meth:`sample` too."""
        return _ingest(self)

    @property
    def ingress_stats(self) -> IngressStats:
        """The writers' counters (:class:`~lightning_per.replay.ingress.IngressStats`: rows written, ingested,
        dropped, pending; seconds blocked)."""
        return self._ingress.stats()

    def close_writers(self) -> None:
        """Close every writer handle (their next write raises ValueError) and free their rings; batches not
        ingested yet are lost (call :meth:`ingest` first)."""
        self._ingress.close()

    def __repr__(self) -> str:
        return _with_ingress(self, super().__repr__())

    def __len__(self) -> int:
        """Transitions stored, after ingesting what writer handles have made ready (:meth:`ingest`), so a loop
        that waits for ``len(rb)`` to grow sees the writers' transitions."""
        _ingest(self)
        return super().__len__()

    def sample(self, batch_size: int | None = None, return_info: bool = False, include_info=None, *,
               wait: bool = False, timeout: float | None = None):
        """A batch ``[B]`` on the device with ``"index"`` and ``"priority_weight"`` (TorchRL's keys).

        Without transforms, prefetching, a custom ``collate_fn``, ``pin_memory``, a sample unit or generation
        tracking this takes a direct path (:meth:`GPUPrioritizedSampler.sample_gather`: one fused sample +
        gather with a packed storage), which skips TorchRL's generic machinery (its locks, collate, info
        re-packing) on the hot path; otherwise it defers to TorchRL's ``sample``. ``return_info=True`` also
        returns the info dict. Batches of writer handles that are ready are ingested first (:meth:`ingest`).
        With a :attr:`rate_limit`, ``wait`` and ``timeout`` (seconds or None) say whether to wait for its budget
        (:meth:`SamplesPerInsert.reserve`: RuntimeError without ``wait``, TimeoutError after ``timeout``). A given
        ``batch_size`` is checked first (an int >= 1: ValueError otherwise, before the warning about a batch size that
        differs from the buffer's).
        """
        if batch_size is not None:
            check_batch_size(batch_size)
        _ingest(self)
        _reserve(self, batch_size, wait, timeout)
        if not (self._direct_sample and include_info is None and not len(self._transform)
                and isinstance(self._storage, GPUTensorStorage)
                and self._storage.layout != "torchrl"):  # items in our ring, not in TorchRL's layout
            return super().sample(batch_size, return_info=return_info, include_info=include_info)
        if batch_size is None:
            batch_size = self._batch_size
            if batch_size is None:
                raise ValueError("batch_size must be given to sample() or to the buffer's constructor")
        elif self._batch_size is not None and batch_size != self._batch_size:  # as TorchRL's sample warns
            warnings.warn(f"sample(batch_size={batch_size}) differs from the buffer's batch_size={self._batch_size}: "
                          f"this call draws {batch_size}", UserWarning, stacklevel=2)
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
        return _extend(self, tensordicts, update_priority, super().extend)

    def _get_priority_vector(self, tensordict):
        """TorchRL's per-item priority of a batch (its ``priority_key`` reduced with ``reduction`` over each item's
        extra dims); a floating ``(B,)`` or ``(B, 1)`` priority on a 1-D storage, the common case (a TD error per
        transition), is already that vector and is returned as a view instead of through a reduction kernel."""
        priority = tensordict.get(self.priority_key, None)
        if (self._storage.ndim == 1 and isinstance(priority, torch.Tensor) and priority.is_floating_point()
                and priority.numel() and (priority.ndim == 1 or (priority.ndim == 2 and priority.shape[1] == 1))):
            return priority.reshape(priority.shape[0])
        return super()._get_priority_vector(tensordict)

    def update_priority(self, index, priority, *, generation=None) -> None:
        """Set raw priorities of slots ``index`` (see :meth:`GPUPrioritizedSampler.update_priority`).

        Args:
            index, priority: as the sampler's.
            generation: optional ``(B,)`` int64, the slots' generation stamps when they were sampled (the sample's
                ``"index_generation"``, with a writer ``track_generations=True``): an entry whose slot has been
                written since (its stamp moved, TorchRL's ``writer.generations_of``) is dropped, on the device and
                without a host read; the others are written. TorchRL's ``update_if_present`` skips the same
                entries.

        Raises:
            TypeError, ValueError, IndexError: as the sampler, before anything changes; ValueError: ``generation``
                given while the writer does not track generations, or not a tensor of ``index``'s shape.

        Example::

            >>> import torch
            >>> from tensordict import TensorDict
            >>> from lightning_per.replay import GPUPrioritizedReplayBuffer, GPURoundRobinWriter, GPUTensorStorage
            >>> rb = GPUPrioritizedReplayBuffer(alpha=1.0, beta=0.0, batch_size=4, device="cpu",
            ...                                 storage=GPUTensorStorage(4, device="cpu"),
            ...                                 writer=GPURoundRobinWriter(track_generations=True))
            >>> _ = rb.extend(TensorDict({"x": torch.arange(4.0)}, [4]))
            >>> batch = rb.sample()
            >>> _ = rb.extend(TensorDict({"x": torch.zeros(2)}, [2]))  # slots 0 and 1 rewritten since the sample
            >>> rb.update_priority(batch["index"], torch.full((4,), 5.0), generation=batch["index_generation"])
            >>> rb.sampler.probabilities()  # slots 0, 1 keep priority 1; 2, 3 now hold 5
            tensor([0.0833, 0.0833, 0.4167, 0.4167], dtype=torch.float64)
        """
        if isinstance(index, tuple) and self._storage.ndim == 1:
            raise TypeError("index must be a flat tensor of slots (the storage is 1-D), got a tuple")
        live = None if generation is None else self._live(index, generation)
        with self._replay_lock, self._write_lock:  # as TorchRL's update_priority
            self._sampler.update_priority(index, priority, storage=self._storage, live=live)  # validates first

    def _live(self, index, generation) -> torch.Tensor:
        """``(B,) bool``: which slots of ``index`` still hold what was sampled with stamps ``generation``."""
        if not tracks_generations(self._writer):
            raise ValueError("update_priority: generation= needs a writer that tracks generations "
                             "(writer=GPURoundRobinWriter(track_generations=True))")
        index = torch.as_tensor(index)
        if not isinstance(generation, torch.Tensor) or generation.shape != index.shape or (
                generation.dtype != torch.int64):
            raise ValueError(f"update_priority: generation must be an int64 tensor of index's shape "
                             f"{tuple(index.shape)} (the sample's 'index_generation'), got "
                             f"{getattr(generation, 'dtype', type(generation).__name__)} "
                             f"{tuple(getattr(generation, 'shape', ()))}")
        current = self._writer.generations_of(index)  # TorchRL's stamps, on the storage's device
        return current == generation.to(current.device, non_blocking=True)

    def update_tensordict_priority(self, data) -> None:
        """TorchRL's ``update_tensordict_priority``; a batch ``[B]`` holding ``"index_generation"`` (sampled with
        a writer ``track_generations=True``) passes it as :meth:`update_priority`'s ``generation``."""
        generation = data.get("index_generation", None) if tracks_generations(self._writer) else None
        if generation is None or data.ndim != 1 or self._storage.ndim != 1:
            return super().update_tensordict_priority(data)
        self.update_priority(data.get("index"), self._get_priority_vector(data), generation=generation)

    def __getstate__(self) -> dict[str, Any]:
        """TorchRL's pickle / ``copy.deepcopy`` state, the buffer's generator as bytes: a copy (also one a
        ``spawn``ed process receives) holds the same transitions and draws what this buffer draws next."""
        return _pickled_generator(self, super().__getstate__())

    def __setstate__(self, state: dict[str, Any]) -> None:
        _set_state(self, state, super().__setstate__)

    def __reduce_ex__(self, protocol: int):
        """Pickled for a process being started while shared: a
        :class:`~lightning_per.replay.ingress.SharedBufferWriter` of this buffer (a new writer handle); else a
        copy (:meth:`__getstate__`)."""
        return _reduced(self, protocol)

    def state_dict(self) -> dict[str, Any]:
        return stamp(super().state_dict(), "replay", BUFFER_SCHEMA_VERSION)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """TorchRL's ``load_state_dict``, after every refusal has been checked on the checkpoint alone.

        Raises:
            TypeError, ValueError: a newer buffer schema, a sampler checkpoint of another kind, schema or
                capacity, missing parts; raised before anything changes (storage, writer, sampler, generator).
        """
        super().load_state_dict(checked_state(self, state_dict))

    def dumps(self, path) -> None:
        """Save the buffer to the directory ``path``, replaced as a whole with a manifest of every file's SHA-256
        (:func:`~lightning_per.replay.buffer_checkpoint.verified_dumps`; no ``prefetch.pkl``).

        Raises:
            ValueError: ``path`` exists and is not a dump directory (nothing is written or removed).
        """
        verified_dumps(self, path, super().dumps)

    def loads(self, path) -> None:
        """Load a :meth:`dumps` directory after verifying its manifest and checking every part
        (:func:`~lightning_per.replay.buffer_checkpoint.verified_loads`); a refused directory changes nothing.

        Raises:
            FileNotFoundError: no directory at ``path``.
            IntegrityError (a ValueError): a missing, truncated, damaged or unlisted file, or no manifest.
            TypeError, ValueError: a part this buffer refuses (see :meth:`load_state_dict`).
        """
        verified_loads(self, path, super().loads)

    def _dump_prefetch_state(self, path, prefetch_state) -> None:
        return None  # prefetched batches are draws already made; a loaded buffer draws anew

    def _load_prefetch_state(self, path) -> None:
        return None  # TorchRL unpickles prefetch.pkl here; ours never write one


class GPUReplayBuffer(TensorDictReplayBuffer):
    """TorchRL's :class:`~torchrl.data.TensorDictReplayBuffer` on our storage and writer: uniform or slice sampling
    on the device, a schema-versioned state and writers of other processes.

    Same keyword arguments as TorchRL's class, plus ``device``, ``backpressure``, ``backpressure_timeout`` and
    ``samples_per_insert`` (as :class:`GPUPrioritizedReplayBuffer`'s); :func:`make_replay_buffer` builds it for
    ``sampler="uniform"`` and ``"slice"``.

    Args:
        storage: None (a :class:`GPUTensorStorage` of 1000 slots on ``device``), an uninitialised TorchRL
            ``LazyTensorStorage`` (replaced by a new :class:`GPUTensorStorage` of its size: ``rb.storage is
            storage`` is False and the one passed stays empty, unlike TorchRL's buffers; see
            :class:`GPUPrioritizedReplayBuffer`), a :class:`GPUTensorStorage` or another TorchRL tensor storage
            (used as it is).
        sampler: a sampler instance, as in TorchRL (default :class:`GPURandomSampler` on ``device``):
            :class:`GPURandomSampler`, :class:`GPUSamplerWithoutReplacement`, :class:`GPUSliceSampler` or one of
            TorchRL's samplers without priorities. Prioritized samplers go in :class:`GPUPrioritizedReplayBuffer`.
        writer: default :class:`GPURoundRobinWriter`.
        device: where the default storage and sampler live (default CUDA when available, else CPU).

    ``sample()`` returns a TensorDict ``[B]`` with ``"index"``; ``update_priority`` is a silent no-op (uniform and
    slice sampling have no priorities), so one training loop serves every buffer of :func:`make_replay_buffer`.

    Raises:
        TypeError: ``sampler`` is not a TorchRL sampler instance (e.g. a name: :func:`make_replay_buffer` takes
            those), or is a prioritized one; ``storage`` is not a TorchRL tensor storage.
        ValueError: an unknown ``backpressure`` or a ``backpressure_timeout`` <= 0; a ``samples_per_insert`` not
            finite or not > 0.

    Example::

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from lightning_per import GPURandomSampler, GPUReplayBuffer, GPUTensorStorage
        >>> rb = GPUReplayBuffer(storage=GPUTensorStorage(16, device="cpu"),
        ...                      sampler=GPURandomSampler(device="cpu", seed=0), batch_size=4)
        >>> _ = rb.extend(TensorDict({"reward": torch.arange(8.0)}, [8]))
        >>> batch = rb.sample()
        >>> batch.batch_size, sorted(batch.keys())
        (torch.Size([4]), ['index', 'reward'])
    """

    def __init__(self, *, storage=None, sampler: Sampler | None = None, writer=None,
                 device: torch.device | str | None = None, backpressure: str = "block",
                 backpressure_timeout: float = 30.0, samples_per_insert: float | None = None, **kwargs) -> None:
        self._ingress, self.rate_limit = _checked_parts(backpressure, backpressure_timeout, samples_per_insert, kwargs)
        if sampler is not None and (not isinstance(sampler, Sampler) or isinstance(sampler, PrioritizedSampler)):
            what = (f"the name {sampler!r} (make_replay_buffer(sampler=...) takes names)" if isinstance(sampler, str)
                    else type(sampler).__name__)
            raise TypeError(f"sampler must be a sampler instance without priorities (GPURandomSampler, "
                            f"GPUSamplerWithoutReplacement, GPUSliceSampler, or TorchRL's), got {what}" + (
                                "; prioritized samplers go in GPUPrioritizedReplayBuffer(sampler=...)"
                                if isinstance(sampler, PrioritizedSampler) else ""))
        device = resolve_device(device) if device is not None else None
        storage = resolve_storage(storage, device, None)
        if sampler is None:
            sampler = GPURandomSampler(device=device or (torch.device(storage.device) if storage.device != "auto"
                                                         else default_device()))
        super().__init__(storage=storage, sampler=sampler, writer=GPURoundRobinWriter() if writer is None
                         else writer, **kwargs)

    def writer_handle(self, example=None, *, slots: int = 8, rows: int = 1024) -> WriterHandle:
        """As :meth:`GPUPrioritizedReplayBuffer.writer_handle` (priorities given by writers are ignored)."""
        return _writer_handle(self, example, slots, rows)

    def ingest(self) -> int:
        """As :meth:`GPUPrioritizedReplayBuffer.ingest`."""
        return _ingest(self)

    @property
    def ingress_stats(self) -> IngressStats:
        """As :attr:`GPUPrioritizedReplayBuffer.ingress_stats`."""
        return self._ingress.stats()

    def close_writers(self) -> None:
        """As :meth:`GPUPrioritizedReplayBuffer.close_writers`."""
        self._ingress.close()

    def __repr__(self) -> str:
        return _with_ingress(self, super().__repr__())

    def __len__(self) -> int:
        """As :meth:`GPUPrioritizedReplayBuffer.__len__`: the writers' ready transitions ingested first."""
        _ingest(self)
        return super().__len__()

    def extend(self, tensordicts, *, update_priority: bool | None = None) -> torch.Tensor:
        """TorchRL's ``extend``, through the direct path of :func:`_direct_extend` when it applies."""
        return _extend(self, tensordicts, update_priority, super().extend)

    def sample(self, batch_size: int | None = None, return_info: bool = False, include_info=None, *,
               wait: bool = False, timeout: float | None = None):
        """TorchRL's ``sample``; a given ``batch_size`` is checked first (an int >= 1: ValueError otherwise,
        before TorchRL's warning about a batch size differing from the buffer's), after ingesting the writers' ready
        batches (:meth:`ingest`); ``wait``, ``timeout``: as :meth:`GPUPrioritizedReplayBuffer.sample`."""
        if batch_size is not None:
            check_batch_size(batch_size)
        _ingest(self)
        _reserve(self, batch_size, wait, timeout)
        return super().sample(batch_size, return_info=return_info, include_info=include_info)

    def update_priority(self, index, priority) -> None:
        """Nothing to update: uniform sampling has no priorities. A silent no-op (TorchRL warns here), so
        one training loop serves every sampler of :func:`make_replay_buffer`."""
        return None

    def __getstate__(self) -> dict[str, Any]:
        """As :meth:`GPUPrioritizedReplayBuffer.__getstate__`: the buffer's generator as bytes."""
        return _pickled_generator(self, super().__getstate__())

    def __setstate__(self, state: dict[str, Any]) -> None:
        _set_state(self, state, super().__setstate__)

    def __reduce_ex__(self, protocol: int):
        """As :meth:`GPUPrioritizedReplayBuffer.__reduce_ex__`: a new writer handle for a process being started while
        shared, else a copy."""
        return _reduced(self, protocol)

    def state_dict(self) -> dict[str, Any]:
        return stamp(super().state_dict(), "replay", BUFFER_SCHEMA_VERSION)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As :meth:`GPUPrioritizedReplayBuffer.load_state_dict`: refusals before anything changes."""
        super().load_state_dict(checked_state(self, state_dict))

    def dumps(self, path) -> None:
        """As :meth:`GPUPrioritizedReplayBuffer.dumps`: a whole directory with its manifest."""
        verified_dumps(self, path, super().dumps)

    def loads(self, path) -> None:
        """As :meth:`GPUPrioritizedReplayBuffer.loads`: the manifest and every part checked first."""
        verified_loads(self, path, super().loads)

    def _dump_prefetch_state(self, path, prefetch_state) -> None:
        return None  # as GPUPrioritizedReplayBuffer's

    def _load_prefetch_state(self, path) -> None:
        return None  # as GPUPrioritizedReplayBuffer's
