"""Many writers, one owner: shared-memory ingress rings that other processes of the host write transitions into.

Topology. The process that owns a replay buffer keeps its storage, priorities and write cursor. It hands out
:class:`WriterHandle` s (``rb.writer_handle(...)``): small picklable objects that name one ingress ring in shared
memory (``multiprocessing.shared_memory``) and the buffer's fixed layout (keys, per-item shapes, dtypes). A writer
process calls :meth:`WriterHandle.write` with a batch; the owner moves every ready batch of every ring into the
buffer with ``rb.ingest()`` (also run by ``rb.sample()``): one ``extend`` of all of them together, or several of at
most what the storage takes in one (a frame-deduplicated storage's ``write_limit``).

One ring per handle (per-writer sub-rings): each ring has one producer (the process writing through its handle)
and one consumer (the owner), so no slot is ever claimed by two processes and no cross-process atomic is needed.
A handle is written by one process (one thread) at a time; a second live process writing through the same ring
is refused (:class:`ValueError` naming its pid). Make one handle per writer process.

A ring holds ``slots`` slots of up to ``rows`` transitions each; a batch larger than ``rows`` takes several slots.
Each slot has a sequence word ``seq``; for the writer's ticket ``t`` (its ``t``-th slot write, slot ``t % slots``)::

    4 t        free for ticket t            (the owner consumed ticket t - slots, or never used)
    4 t + 1    ticket t being written       (a writer killed here leaves this: never visible)
    4 t + 2    ticket t ready               (written LAST, after the rows, priorities, count)

The owner consumes ticket ``r`` only when its word reads ``4 r + 2``, copies the rows, reads the word again (a
seqlock: a word that changed meanwhile means the writer reclaimed the slot, and the copy is discarded), and frees
the slot (``4 (r + slots)``) only once the buffer's ``extend`` of the copy returned: an ``extend`` that raises frees
no slot and counts no row, and the next ingest copies the same rows again. A writer killed mid-write leaves
``4 t + 1``: nothing torn becomes visible, and the next process writing through the same handle reclaims the slot (it
resumes at ticket ``t``, whose word it owns). Ordering assumption: the aligned 8-byte stores of the words are
ordered after the row stores, and the owner's loads in program order, as on x86-64 (TSO); weakly ordered hosts
(aarch64) need explicit fences, not built yet.

Backpressure (the buffer's ``backpressure`` argument): ``"block"`` (a writer facing a full ring waits, up to
``backpressure_timeout`` seconds, then raises :class:`TimeoutError`) or ``"drop_oldest"`` (it reclaims the oldest
pending slot of its ring; the owner counts those rows as dropped). Counters (:class:`IngressStats`): rows
written, ingested, dropped, pending, and seconds writers spent blocked.

Page-locked rings and an asynchronous copy on a side stream for owners on CUDA are a later step: here the owner
copies ready rows into a host staging batch and extends the buffer with it (one host-to-device copy per ingest on
CUDA). A writer never touches ``torch.cuda``: unpickling a handle and writing through it create no CUDA context.
"""

from __future__ import annotations

import math
import os
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from lightning_per.replay.compat import stored_data
from lightning_per.replay.storage import GPUTensorStorage

__all__ = ["BACKPRESSURE", "IngressLayout", "IngressStats", "SharedBufferWriter", "SharedIngress", "WriterHandle",
           "stored_layout", "write_limit"]

#: the backpressure policies of a buffer's ingress (see the module docstring)
BACKPRESSURE = ("block", "drop_oldest")

_MAGIC = 0x4C50_4552_494E_4731  # "LPERING1": a ring of this module's format
# header words (int64), who writes them
_H_MAGIC, _H_CLOSED, _H_TICKET, _H_WRITTEN, _H_BLOCKED_NS, _H_PID = range(6)  # -, owner, writer x4
# owner, at each ingest: the buffer's write count, and this ring's rows accounted for by then (SharedBufferWriter)
_H_BASE_COUNT, _H_BASE_SEEN = 6, 7
_HEADER_WORDS = 8
_ALIGN = 64


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _flat_key(key: Any) -> str | tuple[str, ...] | None:
    """``key`` as the layout names it (a string, or a tuple of two or more strings), None if it is neither."""
    if isinstance(key, str):
        return key
    if isinstance(key, tuple) and key and all(isinstance(part, str) for part in key):
        return key[0] if len(key) == 1 else key
    return None


@dataclass(frozen=True)
class IngressLayout:
    """The fixed layout of the transitions a buffer's writers send: keys with per-item shapes and dtypes.

    A key is a string, or a tuple of strings for a nested TensorDict entry (``("next", "reward")``, as TorchRL's
    collectors write).

    Attributes:
        fields: ``((key, per-item shape, dtype), ...)`` in the example's key order.
    """

    fields: tuple[tuple[str | tuple[str, ...], tuple[int, ...], torch.dtype], ...]

    @classmethod
    def of(cls, example: TensorDictBase | Mapping[str, Any]) -> IngressLayout:
        """The layout of ``example``: a TensorDict ``[n]`` (nested entries included) or a mapping of ``(n, ...)``
        tensors keyed by strings or tuples of strings.

        Raises:
            TypeError: ``example`` is not a TensorDict or mapping, or holds a value that is not a tensor.
            ValueError: a key that is not a string or tuple of strings, no key, or a TensorDict with other than
                one batch dimension.
        """
        if isinstance(example, TensorDictBase):
            if example.batch_dims != 1:
                raise ValueError(f"example must be a TensorDict with one batch dimension [n], got batch_size "
                                 f"{tuple(example.batch_size)}")
            items = list(example.items(include_nested=True, leaves_only=True))
        elif isinstance(example, Mapping):
            items = list(example.items())
        else:
            raise TypeError(f"example must be a TensorDict [n] or a mapping of (n, ...) tensors, got "
                            f"{type(example).__name__}")
        if not items:
            raise ValueError("example holds no key: the writers' layout needs at least one field")
        fields = []
        for given, value in items:
            key = _flat_key(given)
            if key is None:
                raise ValueError(f"example key {given!r}: a key must be a string or a tuple of strings")
            if not isinstance(value, torch.Tensor) or value.ndim < 1:
                raise TypeError(f"example[{key!r}] must be a tensor (n, ...), got {type(value).__name__}")
            fields.append((key, tuple(value.shape[1:]), value.dtype))
        return cls(tuple(fields))

    def check(self, batch: TensorDictBase | Mapping[str, Any], priority=None
              ) -> tuple[int, dict[str | tuple[str, ...], torch.Tensor], torch.Tensor | None]:
        """``(n, {key: (n, *shape) CPU tensor}, priority (n,) float32 CPU or None)`` of a writer's ``batch`` after
        checking it against this layout: the one check every writer (:class:`WriterHandle`, the remote writers)
        runs before anything is sent or written.

        Raises:
            TypeError: ``batch`` or a field of another type or dtype; ``priority`` not real.
            ValueError: a key missing or extra, another per-item shape or row count, a non-CPU tensor, ``priority``
                of another length or with a NaN, infinite or negative value.
        """
        if isinstance(batch, TensorDictBase):
            if batch.batch_dims != 1:
                raise ValueError(f"write: batch must have one batch dimension [n], got batch_size "
                                 f"{tuple(batch.batch_size)} (nothing was written)")
            items = batch.items(include_nested=True, leaves_only=True)
        elif isinstance(batch, Mapping):
            items = batch.items()
        else:
            raise TypeError(f"write: batch must be a TensorDict [n] or a mapping of (n, ...) tensors, got "
                            f"{type(batch).__name__} (nothing was written)")
        items = {key if _flat_key(key) is None else _flat_key(key): value for key, value in items}
        expected = [key for key, _, _ in self.fields]
        for key in expected:
            if key not in items:
                raise ValueError(f"write: batch is missing key {key!r}; the buffer's layout holds {expected} "
                                 f"(nothing was written)")
        extra = [key for key in items if key not in expected]
        if extra:
            raise ValueError(f"write: batch has key {extra[0]!r} that the buffer's layout does not hold; it holds "
                             f"{expected} (nothing was written)")
        n = None
        out = {}
        for key, shape, dtype in self.fields:
            value = items[key]
            if isinstance(value, np.ndarray):
                value = torch.from_numpy(value)
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"write: batch[{key!r}] must be a tensor, got {type(value).__name__} "
                                f"(nothing was written)")
            if value.device.type != "cpu":
                raise ValueError(f"write: batch[{key!r}] is on {value.device}; writers send CPU tensors (the owner "
                                 f"moves them to its device) (nothing was written)")
            if value.dtype != dtype:
                raise TypeError(f"write: batch[{key!r}] has dtype {value.dtype}, the buffer's layout holds {dtype} "
                                f"(nothing was written)")
            if value.ndim < 1 or tuple(value.shape[1:]) != shape:
                raise ValueError(f"write: batch[{key!r}] has per-item shape {tuple(value.shape[1:])}, the buffer's "
                                 f"layout holds {shape} (nothing was written)")
            if n is None:
                n = value.shape[0]
            elif value.shape[0] != n:
                raise ValueError(f"write: batch[{key!r}] holds {value.shape[0]} transitions, batch[{expected[0]!r}] "
                                 f"{n} (nothing was written)")
            out[key] = value
        return n, out, self._priority(priority, n)

    @staticmethod
    def _priority(priority, n: int) -> torch.Tensor | None:
        """``priority`` as ``(n,) float32`` CPU after checking it (None for None)."""
        if priority is None:
            return None
        if isinstance(priority, np.ndarray):
            priority = torch.from_numpy(priority)
        elif not isinstance(priority, torch.Tensor):
            priority = torch.as_tensor(priority)
        if priority.dtype == torch.bool or priority.is_complex():
            raise TypeError(f"write: priority must hold real numbers, got dtype {priority.dtype} "
                            f"(nothing was written)")
        if priority.device.type != "cpu":
            raise ValueError(f"write: priority is on {priority.device}; writers send CPU tensors "
                             f"(nothing was written)")
        if priority.ndim != 1 or priority.shape[0] != n:
            raise ValueError(f"write: priority must have shape ({n},), one value per transition of the batch, got "
                             f"{tuple(priority.shape)} (nothing was written)")
        priority = priority.to(torch.float32)
        bad = ~(torch.isfinite(priority) & (priority >= 0))
        if bool(bad.any()):  # sync-ok: a writer's host tensor
            i = int(bad.nonzero()[0, 0])
            raise ValueError(f"write: priority must be finite and >= 0, got priority[{i}] = {float(priority[i])} "
                             f"(nothing was written)")
        return priority

    def same_fields(self, other: IngressLayout) -> bool:
        """Whether ``other`` holds the same keys with the same per-item shapes and dtypes, in any order (a ring's
        order is its own: the owner copies rows by key)."""
        return len(self.fields) == len(other.fields) and (
            {key: (shape, dtype) for key, shape, dtype in self.fields}
            == {key: (shape, dtype) for key, shape, dtype in other.fields})

    def row_bytes(self) -> int:
        """Bytes of one transition (all fields), excluding its priority."""
        return sum(math.prod(shape) * dtype.itemsize for _, shape, dtype in self.fields)


@dataclass(frozen=True)
class IngressStats:
    """Counters of a buffer's ingress, in transitions (rows) except ``blocked_s``.

    ``written == ingested + dropped + pending`` at every read. ``written`` counts rows whose ready flag was set;
    ``dropped`` rows a ``"drop_oldest"`` writer reclaimed before the owner ingested them (counted when the owner
    passes them); ``blocked_s`` the seconds ``"block"`` writers spent waiting for a free slot.

    Example::

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from lightning_per import make_replay_buffer
        >>> rb = make_replay_buffer(100, 4, device="cpu", backpressure="drop_oldest")
        >>> handle = rb.writer_handle(TensorDict({"obs": torch.zeros(1, 2)}, [1]), slots=1, rows=4)
        >>> for _ in range(3):  # one slot, nothing ingested in between: the first two batches are dropped
        ...     _ = handle.write({"obs": torch.ones(4, 2)})
        >>> rb.ingest()
        4
        >>> rb.ingress_stats
        IngressStats(writers=1, written=12, ingested=4, dropped=8, pending=0, blocked_s=0.0)
        >>> rb.close_writers()
    """

    writers: int
    written: int
    ingested: int
    dropped: int
    pending: int
    blocked_s: float


class _RingViews:
    """Views of one ring's shared memory: header and per-slot words (NumPy int64) and the rows (torch)."""

    def __init__(self, shm: shared_memory.SharedMemory, layout: IngressLayout, slots: int, rows: int) -> None:
        buf = shm.buf
        off = 0

        def words(count: int) -> np.ndarray:
            nonlocal off
            view = np.ndarray((count,), dtype=np.int64, buffer=buf, offset=off)
            off = _aligned(off + 8 * count)
            return view

        self.header = words(_HEADER_WORDS)
        self.seq, self.count, self.cumulative, self.has_priority = (words(slots) for _ in range(4))
        raw = torch.frombuffer(buf, dtype=torch.uint8)

        def block(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            nonlocal off
            nbytes = slots * rows * math.prod(shape) * dtype.itemsize
            view = raw[off:off + nbytes].view(dtype).view(slots, rows, *shape)
            off = _aligned(off + nbytes)
            return view

        self.priority = block((), torch.float32)  # (slots, rows) float32
        self.fields = {key: block(shape, dtype) for key, shape, dtype in layout.fields}  # (slots, rows, *shape)

    @staticmethod
    def nbytes(layout: IngressLayout, slots: int, rows: int) -> int:
        total = _aligned(8 * _HEADER_WORDS) + 4 * _aligned(8 * slots) + _aligned(4 * slots * rows)
        return total + sum(_aligned(slots * rows * math.prod(s) * d.itemsize) for _, s, d in layout.fields)


def _attach(name: str) -> shared_memory.SharedMemory:
    """The ring ``name`` mapped into this process. Attaching registers the name with the resource tracker that a
    process started by the owner shares with it; the owner alone unlinks it (:meth:`SharedIngress.close`)."""
    try:
        return shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        raise ValueError(f"writer handle: its ingress ring {name!r} is gone: the buffer that made this handle is "
                         f"closed (close_writers() or the owner process ended); nothing was written") from None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class WriterHandle:
    """A picklable handle through which one process of the owner's host writes transitions into its buffer.

    Made by ``rb.writer_handle(...)``; pass it to a writer process (a ``Process`` argument, a queue item). It holds
    the ring's name, the layout and the backpressure settings, and maps the ring on its first write.

    Example::

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from lightning_per import make_replay_buffer
        >>> rb = make_replay_buffer(100, 4, device="cpu")
        >>> handle = rb.writer_handle(TensorDict({"obs": torch.zeros(1, 3)}, [1]), slots=2, rows=8)
        >>> handle.write(TensorDict({"obs": torch.ones(5, 3)}, [5]), priority=torch.full((5,), 2.0))  # in any process
        5
        >>> rb.ingest(), len(rb)
        (5, 5)
        >>> handle.write({"obs": torch.ones(2, 4)})
        Traceback (most recent call last):
        ...
        ValueError: write: batch['obs'] has per-item shape (4,), the buffer's layout holds (3,) (nothing was written)
        >>> rb.close_writers()
    """

    def __init__(self, name: str, layout: IngressLayout, slots: int, rows: int, backpressure: str,
                 timeout: float) -> None:
        self.name, self.layout, self.slots, self.rows = name, layout, slots, rows
        self.backpressure, self.timeout = backpressure, timeout
        self._shm: shared_memory.SharedMemory | None = None
        self._views: _RingViews | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "layout": self.layout, "slots": self.slots, "rows": self.rows,
                "backpressure": self.backpressure, "timeout": self.timeout}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)

    def __repr__(self) -> str:
        keys = [key for key, _, _ in self.layout.fields]
        return (f"WriterHandle(ring={self.name!r}, keys={keys}, slots={self.slots}, rows={self.rows}, "
                f"backpressure={self.backpressure!r}, timeout={self.timeout})")

    def _ring(self) -> _RingViews:
        self.ring_header()  # mapped
        views = self._views
        if views.header[_H_CLOSED]:
            raise ValueError(f"writer handle {self.name!r}: the buffer that made this handle is closed "
                             f"(close_writers() or the owner process ended); nothing was written")
        pid, me = int(views.header[_H_PID]), os.getpid()
        if pid != me:
            if pid and _pid_alive(pid):
                raise ValueError(f"writer handle {self.name!r} is already written by process {pid}: one process "
                                 f"writes through a handle; make one rb.writer_handle(...) per writer process "
                                 f"(nothing was written)")
            views.header[_H_PID] = me
        return views

    def write(self, batch: TensorDictBase | Mapping[str, Any], priority=None) -> int:
        """Write ``batch`` (``n`` transitions) into the ring; returns ``n``.

        Args:
            batch: a TensorDict ``[n]`` or a mapping of CPU tensors (or NumPy arrays) ``(n, *shape)`` with exactly
                the layout's keys, per-item shapes and dtypes.
            priority: optional raw priorities ``(n,)`` (real, finite, >= 0; stored as float32), set by the owner
                at ingest; without them the transitions get the buffer's default (running max) priority.

        Raises:
            TypeError: ``batch`` or a field of another type or dtype; ``priority`` not real.
            ValueError: a key missing or extra, another per-item shape or row count, a non-CPU tensor, ``priority``
                of another length or with a NaN, infinite or negative value, the buffer closed, or the ring written
                by another live process. Nothing is written.
            TimeoutError: ``"block"`` backpressure and the ring stayed full for ``timeout`` seconds (the slots
                written before, when the batch spans several, stay written; the message says how many rows).
        """
        n, fields, priority = self.layout.check(batch, priority)
        views = self._ring()
        for start in range(0, n, self.rows):
            stop = min(n, start + self.rows)
            self._write_slot(views, {k: v[start:stop] for k, v in fields.items()},
                             None if priority is None else priority[start:stop], stop - start, start)
        return n

    def _write_slot(self, views: _RingViews, fields: dict[str, torch.Tensor], priority: torch.Tensor | None,
                    n: int, done: int) -> None:
        """Write one slot's ``n`` rows: wait for (or reclaim) the slot of the next ticket, mark it being written,
        copy, set the count, then the ready word last."""
        header, seq, slots = views.header, views.seq, self.slots
        t = int(header[_H_TICKET])
        s = t % slots
        while True:
            word = int(seq[s])
            if word == 4 * t + 2:  # published by a writer killed before it advanced the ticket: move on
                header[_H_WRITTEN] = views.cumulative[s]
                t += 1
                header[_H_TICKET] = t
                s = t % slots
                continue
            if word in (4 * t, 4 * t + 1):  # free, or torn by a writer killed mid-write: ours to write
                break
            if word != 4 * (t - slots) + 2:
                raise RuntimeError(f"writer handle {self.name!r}: slot {s} holds word {word}, expected ticket {t}'s "
                                   f"states; the ring is corrupt")
            if self.backpressure == "drop_oldest":  # reclaim the oldest pending slot (the owner counts it)
                break
            self._wait_free(views, s, 4 * t, done)
        seq[s] = 4 * t + 1
        for key, value in fields.items():
            views.fields[key][s, :n].copy_(value)
        if priority is not None:
            views.priority[s, :n].copy_(priority)
        views.has_priority[s] = priority is not None
        views.count[s] = n
        cumulative = int(header[_H_WRITTEN]) + n
        views.cumulative[s] = cumulative
        seq[s] = 4 * t + 2  # ready: written last
        header[_H_WRITTEN] = cumulative
        header[_H_TICKET] = t + 1

    def _wait_free(self, views: _RingViews, s: int, free: int, done: int) -> None:
        """Wait until slot ``s`` reads ``free`` (the owner ingested it), up to :attr:`timeout` seconds."""
        start = time.monotonic()
        pause = 20e-6
        try:
            while int(views.seq[s]) != free:
                if views.header[_H_CLOSED]:
                    raise ValueError(f"writer handle {self.name!r}: the buffer that made this handle was closed "
                                     f"while this write waited ({done} rows of the batch were written before)")
                waited = time.monotonic() - start
                if waited >= self.timeout:
                    raise TimeoutError(f"writer handle {self.name!r}: the ring stayed full for {self.timeout} s "
                                       f"(backpressure='block'); the owner must call rb.ingest() or rb.sample(). "
                                       f"{done} rows of this batch were written before, the rest was not")
                time.sleep(pause)
                pause = min(2 * pause, 1e-3)
        finally:
            views.header[_H_BLOCKED_NS] += int((time.monotonic() - start) * 1e9)

    def ring_header(self) -> np.ndarray:
        """The ring's header words ``(8,)`` int64, a view of the shared memory (mapped on first use).

        Raises:
            ValueError: the buffer that made this handle is closed or gone.
        """
        if self._views is None:
            self._shm = _attach(self.name)
            self._views = _RingViews(self._shm, self.layout, self.slots, self.rows)
        return self._views.header

    def close(self) -> None:
        """Unmap the ring in this process (the owner's buffer is not affected). Writing maps it again."""
        if self._shm is not None:
            self._views = None
            self._shm.close()
            self._shm = None


class SharedBufferWriter:
    """A shared buffer as a process it was handed to sees it: the write side of TorchRL's replay-buffer API.

    TorchRL's multiprocess collectors (``MultiSyncCollector`` / ``MultiAsyncCollector``, ``replay_buffer=rb``) call
    ``rb.share()`` and pickle ``rb`` into each worker, which calls ``extend`` (``add``) and reads ``write_count``. A
    shared buffer of ours (``rb.share()``, ``shared=True``) pickled for a process being started (``spawn`` or
    ``forkserver``) becomes one of these, around a new :class:`WriterHandle` (a new ring) for that process: the
    worker never holds the storage or the priorities, never touches ``torch.cuda``, and its writes enter the buffer
    at the owner's next ``rb.ingest()`` or ``rb.sample()``.

    Args:
        handle: the ring this process writes through.
        priority_key: the buffer's priority key: a batch holding it (and ``update_priority`` not False) sends it as
            the transitions' initial raw priorities (``(n,)`` or ``(n, 1)``), as TorchRL's ``extend`` would set them.

    Example::

        >>> import torch
        >>> from multiprocessing.context import set_spawning_popen
        >>> from tensordict import TensorDict
        >>> from lightning_per import make_replay_buffer
        >>> rb = make_replay_buffer(100, 4, device="cpu").share()
        >>> _ = rb.extend(TensorDict({"obs": torch.zeros(2, 3)}, [2]))
        >>> set_spawning_popen(object())  # what Process.start() does while it pickles the process's arguments
        >>> cls, args = rb.__reduce_ex__(4)  # what the pickle holds: how the process rebuilds it
        >>> set_spawning_popen(None)
        >>> writer = cls(*args)
        >>> writer  # doctest: +ELLIPSIS
        SharedBufferWriter(WriterHandle(ring=..., keys=['obs'], slots=8, rows=1024, ...))
        >>> writer.extend(TensorDict({"obs": torch.ones(5, 3)}, [5])), writer.write_count
        (5, 7)
        >>> rb.ingest(), len(rb), rb.write_count
        (5, 7, 7)
        >>> rb.close_writers()
    """

    def __init__(self, handle: WriterHandle, priority_key: Any = None) -> None:
        self.handle, self.priority_key = handle, priority_key

    @property
    def shared(self) -> bool:
        """Always True (TorchRL's ``shared`` flag: the collector does not share it again)."""
        return True

    @property
    def write_count(self) -> int:
        """Transitions written to the buffer as this process knows it: the owner's write count at its last ingest
        plus the rows this process wrote since (other writers' rows count once the owner ingests them). TorchRL's
        collectors compare it with ``init_random_frames``."""
        header = self.handle.ring_header()
        return int(header[_H_BASE_COUNT] + header[_H_WRITTEN] - header[_H_BASE_SEEN])

    def extend(self, data, *, update_priority: bool | None = None) -> int:
        """Write the batch ``data`` ``[n]`` (a TensorDict of the buffer's layout, nested keys included) through the
        handle; returns ``n`` (the slots are the owner's to choose, at ingest).

        Raises:
            As :meth:`WriterHandle.write`; ValueError: ``data``'s priority entry holds more than one value per
            transition.
        """
        priority = None
        if update_priority is not False and self.priority_key is not None and isinstance(data, TensorDictBase):
            priority = data.get(self.priority_key, None)
            if priority is not None:
                if priority.ndim < 1 or priority.numel() != priority.shape[0]:
                    raise ValueError(f"extend: the batch's priority entry {self.priority_key!r} must hold one value "
                                     f"per transition, got shape {tuple(priority.shape)} (nothing was written)")
                priority = priority.reshape(-1)
        return self.handle.write(data, priority=priority)

    def add(self, data) -> int:
        """Write one transition ``data`` (a TensorDict ``[]``); returns 1."""
        return self.extend(data.unsqueeze(0))

    def sample(self, *args, **kwargs):
        """Refused: a writer process writes; the buffer's owner samples.

        Raises:
            RuntimeError: always.
        """
        raise RuntimeError("a process holding a shared buffer's SharedBufferWriter writes only (extend, add); "
                           "sample in the process that owns the buffer")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.handle!r})"


class _OwnedRing:
    """The owner's side of one ring: its shared memory, views and consumer state.

    An ingest stages ready rows (:meth:`stage`, possibly part of a slot: a chunk of what one extend takes), then
    either commits them once the buffer holds them (:meth:`commit`: the slots fully taken are freed, the rows
    counted) or rolls back (:meth:`rollback`: nothing freed or counted, the rows staged again at the next ingest).
    """

    def __init__(self, layout: IngressLayout, slots: int, rows: int) -> None:
        self.layout, self.slots, self.rows = layout, slots, rows
        self.shm = shared_memory.SharedMemory(create=True, size=_RingViews.nbytes(layout, slots, rows))
        self.views = _RingViews(self.shm, layout, slots, rows)
        self.views.header[:] = 0
        self.views.header[_H_MAGIC] = _MAGIC
        self.views.seq[:] = 4 * np.arange(slots, dtype=np.int64)  # slot s free for ticket s
        self.next = 0  # next ticket to consume
        self.offset = 0  # rows of ticket `next` already ingested (a chunk took its slot in part)
        self.accounted = 0  # rows of this ring ingested or dropped so far
        self.ingested = 0
        self.dropped = 0
        # the ingest under way: where staging resumes (ticket, row), tickets it may still visit, slots it took
        self._cursor, self._steps, self._taken = (0, 0), 0, 0
        self._staged: list[tuple[int, int, int, int, int]] = []  # (ticket, first row, rows, count, cumulative)

    def written(self) -> int:
        # a writer killed between a slot's ready word and its header update: the owner has seen more
        return max(int(self.views.header[_H_WRITTEN]), self.accounted)

    def begin(self) -> None:
        """Start an ingest: at most one lap of slots, over the tickets the writer had reached by now (reclaimed
        ones are skipped one by one) plus one lap."""
        self._cursor = (self.next, self.offset)
        self._steps = max(0, int(self.views.header[_H_TICKET]) - self.next) + self.slots
        self._taken = 0
        self._staged = []

    def stage(self, staging: dict[str, torch.Tensor], priority: torch.Tensor, has_priority: torch.Tensor,
              at: int, stop: int) -> int:
        """Copy ready rows, in ticket order, into ``staging`` rows ``at .. stop - 1``; returns the new ``at``. The
        slots stay the owner's (not freed) until :meth:`commit`."""
        views, slots = self.views, self.slots
        r, row = self._cursor
        while at < stop and self._steps > 0 and not (row == 0 and self._taken == slots):
            s = r % slots
            word = int(views.seq[s])
            if word == 4 * r + 2:
                n, cumulative = int(views.count[s]), int(views.cumulative[s])
                k = min(n - row, stop - at)
                flagged = bool(views.has_priority[s])
                for key, block in views.fields.items():
                    staging[key][at:at + k].copy_(block[s, row:row + k])
                priority[at:at + k].copy_(views.priority[s, row:row + k])
                has_priority[at:at + k] = flagged
                if int(views.seq[s]) != word:  # reclaimed by a drop_oldest writer during the copy: discard
                    r, row, self._steps = r + 1, 0, self._steps - 1
                    continue
                self._staged.append((r, row, k, n, cumulative))
                at += k
                if row + k == n:
                    r, row, self._steps, self._taken = r + 1, 0, self._steps - 1, self._taken + 1
                else:  # the chunk is full: the rest of this slot goes into the next one
                    row += k
            elif word >= 4 * (r + slots) + 1:  # reclaimed by a drop_oldest writer: counted at a later ticket
                r, row, self._steps = r + 1, 0, self._steps - 1
            else:  # not ready yet (free, or being written)
                break
        self._cursor = (r, row)
        return at

    def commit(self) -> None:
        """The staged rows are in the buffer: count them, free each slot taken whole, move the consumer on."""
        views, slots = self.views, self.slots
        for r, row, k, n, cumulative in self._staged:
            first = cumulative - n + row  # rows written through this ring before the staged ones
            self.dropped += first - self.accounted  # reclaimed by a drop_oldest writer in between
            self.accounted = first + k
            self.ingested += k
            s = r % slots
            if row + k == n and int(views.seq[s]) == 4 * r + 2:  # else reclaimed after the copy: the writer's now
                views.seq[s] = 4 * (r + slots)  # free for the writer's next lap
        self.next, self.offset = self._cursor
        self._staged = []

    def rollback(self) -> None:
        """The staged rows did not reach the buffer: forget them (their slots stay ready, nothing is counted)."""
        self._cursor = (self.next, self.offset)
        self._staged = []

    def close(self) -> None:
        self.views.header[_H_CLOSED] = 1
        self.views = None
        self.shm.close()
        try:
            self.shm.unlink()
        except FileNotFoundError:
            pass


def _close_rings(rings: list[_OwnedRing]) -> None:
    for ring in rings:
        ring.close()
    rings.clear()


class SharedIngress:
    """The owner's side of a buffer's writers: its rings, a host staging batch and the counters.

    A buffer holds one (``rb.writer_handle``, ``rb.ingest``, ``rb.ingress_stats``, ``rb.close_writers``
    delegate to it). Pickling (a copy of the buffer) keeps the settings only: a copy has no writers.

    Args:
        backpressure: ``"block"`` or ``"drop_oldest"`` (see the module docstring).
        timeout: seconds a ``"block"`` writer waits for a free slot before :class:`TimeoutError` (> 0).

    Raises:
        ValueError: an unknown ``backpressure`` or a ``timeout`` that is not a finite number > 0.
    """

    def __init__(self, backpressure: str = "block", timeout: float = 30.0) -> None:
        if backpressure not in BACKPRESSURE:
            raise ValueError(f"backpressure must be one of {list(BACKPRESSURE)}, got {backpressure!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
                math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"backpressure_timeout must be a finite number of seconds > 0, got {timeout!r}")
        self.backpressure, self.timeout = backpressure, float(timeout)
        self._rings: list[_OwnedRing] = []
        self._layout: IngressLayout | None = None
        self._staging: dict[str, torch.Tensor] | None = None
        self.busy = False  # an ingest is using the staging batch (the buffer's _ingest sets it)
        self._finalizer = weakref.finalize(self, _close_rings, self._rings)

    def __getstate__(self) -> dict[str, Any]:
        return {"backpressure": self.backpressure, "timeout": self.timeout}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)

    @property
    def active(self) -> bool:
        """Whether any writer handle is open (``ingest`` has rings to read)."""
        return bool(self._rings)

    def handle(self, layout: IngressLayout, slots: int, rows: int) -> WriterHandle:
        """A new ring of ``slots`` x ``rows`` transitions of ``layout`` and its handle.

        Raises:
            ValueError: ``slots`` or ``rows`` not an int >= 1, or ``layout`` other than the earlier handles'.
        """
        for name, value in (("slots", slots), ("rows", rows)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"writer_handle: {name} must be an int >= 1, got {value!r}")
        if self._layout is not None and not layout.same_fields(self._layout):
            raise ValueError(f"writer_handle: the layout {layout.fields} differs from the earlier handles' "
                             f"{self._layout.fields}; all writers of a buffer send one layout")
        layout = self._layout or layout  # the same fields in the first handle's order
        ring = _OwnedRing(layout, slots, rows)
        self._layout = layout
        self._rings.append(ring)
        self._staging = None  # grows at the next ingest
        return WriterHandle(ring.shm.name, layout, slots, rows, self.backpressure, self.timeout)

    def begin(self) -> None:
        """Start an ingest: each ring gives at most one lap of its slots to the drains until :meth:`commit` or
        :meth:`rollback` of the last."""
        for ring in self._rings:
            ring.begin()

    def drain(self, limit: int | None = None) -> tuple[TensorDict, torch.Tensor, torch.Tensor] | None:
        """Stage ready rows of the rings, in ring and ticket order, in the host staging batch: ``(batch [m],
        priority (m,) float32, has_priority (m,) bool)``, all on the CPU, ``m`` at most ``limit`` (None: every ready
        slot, one lap a ring), a slot split across drains when ``limit`` ends inside it; None when nothing was
        ready. Nothing is freed or counted until :meth:`commit` (the buffer took the batch) or :meth:`rollback`
        (it did not); the batch's views are overwritten by the next drain.

        Raises:
            ValueError: ``limit`` is not None nor an int >= 1.
        """
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValueError(f"drain: limit must be None or an int >= 1, got {limit!r}")
        if not self._rings:
            return None
        capacity = sum(ring.slots * ring.rows for ring in self._rings)
        stop = capacity if limit is None else min(capacity, limit)
        if self._staging is None or self._staging_priority.shape[0] < stop:
            self._staging = {key: torch.empty(stop, *shape, dtype=dtype) for key, shape, dtype in self._layout.fields}
            self._staging_priority = torch.empty(stop, dtype=torch.float32)
            self._staging_flag = torch.empty(stop, dtype=torch.bool)
        at = 0
        for ring in self._rings:
            at = ring.stage(self._staging, self._staging_priority, self._staging_flag, at, stop)
        if at == 0:
            return None
        batch = TensorDict({key: value[:at] for key, value in self._staging.items()}, [at])
        return batch, self._staging_priority[:at], self._staging_flag[:at]

    def commit(self) -> None:
        """The last drain's rows are in the buffer: free the slots it took whole and count its rows ingested."""
        for ring in self._rings:
            ring.commit()

    def rollback(self) -> None:
        """The last drain's rows did not reach the buffer: free nothing, count nothing; the next ingest stages
        them again."""
        for ring in self._rings:
            ring.rollback()

    def publish(self, write_count: int) -> None:
        """Tell every ring the buffer's write count ``write_count`` (after an ingest): what
        :attr:`SharedBufferWriter.write_count` starts from."""
        for ring in self._rings:
            ring.views.header[_H_BASE_SEEN] = ring.accounted
            ring.views.header[_H_BASE_COUNT] = write_count

    def stats(self) -> IngressStats:
        """The counters summed over the rings (rows; ``blocked_s`` in seconds)."""
        written = ingested = dropped = blocked = 0
        for ring in self._rings:
            written += ring.written()
            ingested += ring.ingested
            dropped += ring.dropped
            blocked += int(ring.views.header[_H_BLOCKED_NS])
        return IngressStats(writers=len(self._rings), written=written, ingested=ingested, dropped=dropped,
                            pending=written - ingested - dropped, blocked_s=blocked / 1e9)

    def close(self) -> None:
        """Mark every ring closed (its writers' next write raises ValueError) and free the shared memory. Rows
        not ingested yet are lost: call ``ingest`` first. The ingress can hand out new handles afterwards."""
        _close_rings(self._rings)
        self._layout = None
        self._staging = None

    def __repr__(self) -> str:
        s = self.stats()
        return (f"SharedIngress(writers={s.writers}, backpressure={self.backpressure!r}, written={s.written}, "
                f"ingested={s.ingested}, dropped={s.dropped}, pending={s.pending}, blocked_s={s.blocked_s:.3f})")


def stored_layout(storage: Any) -> IngressLayout | None:
    """The layout of the transitions ``storage`` holds as a write takes them (what its writers send), None before
    its first write: :meth:`GPUTensorStorage.write_example` for ours (a frame-deduplicated storage's stacked keys
    included), the stored TensorDict of TorchRL's tensor storages.

    Raises:
        ValueError, TypeError: as :meth:`IngressLayout.of` (a storage of ``ndim > 1`` or of plain tensors).
    """
    if isinstance(storage, GPUTensorStorage):
        example = storage.write_example()
    else:  # TorchRL's tensor storages: their (max_size, ...) TensorDict
        data = stored_data(storage) if storage.initialized else None
        example = None if data is None else data[:1].exclude("index")  # "index": TorchRL's tag
    return None if example is None else IngressLayout.of(example)


def write_limit(storage: Any) -> int | None:
    """The most transitions one ``extend`` into ``storage`` takes (at least 1: a storage that takes none refuses
    that one with its own error), None for any number: what an ingest's chunks hold
    (:attr:`GPUTensorStorage.write_limit`; TorchRL's storages take any number)."""
    limit = storage.write_limit if isinstance(storage, GPUTensorStorage) else None
    return None if limit is None else max(1, limit)
