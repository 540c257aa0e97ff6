"""Writers on other hosts: batches sent to the buffer's owner over ``torch.distributed`` point-to-point.

Topology. One owner (the learner holding the buffer) and ``W`` remote writers form a process group of their own
(rank 0 the owner, ranks ``1 .. W`` the writers) on a ``torch.distributed.TCPStore`` the owner serves at
``MASTER_ADDR:MASTER_PORT`` (or the address and port given). The group is separate from any default group, so a
Lightning DDP rank can own one beside its DDP group (docs/replay.md, "Many writers").

- The owner publishes the buffer's layout (keys, per-item shapes, dtypes) in the store as JSON; a writer reads it
  there and checks every batch against it before anything is sent.
- A writer sends a batch as two messages: a header ``(n, has_priority)`` int64 and one byte payload holding the
  ``n`` rows field after field (each field's block 8-byte aligned), then the priorities. It may have ``credits``
  batches unacknowledged; the next write waits for the oldest acknowledgement.
- The owner receives each writer's batches on a thread of its own (blocking receives: Gloo reports a peer's
  death only to a waiting receive) and queues them on the host. :meth:`RemoteIngress.ingest` extends the buffer
  with every queued batch (one ``extend``, or chunks of what the storage takes in one) and answers each with the
  buffer slots its rows were written to: the owner assigns slots, the writer learns where its rows are.
- A writer idle for ``timeout / 4`` seconds sends an empty header (a heartbeat), so a silent writer is told from
  a dead one.

Failures. A writer process that dies closes its connection: the owner's receive of it fails at once and the next
``ingest()`` raises :class:`ConnectionError` naming the rank (the batches it sent in full before are ingested;
the other writers go on). The owner's death closes every writer's connection: a writer's next write (or its
heartbeat) raises :class:`ConnectionError` naming the owner's address. A peer that is alive but silent for
``timeout`` seconds (a lost host) ends the whole group: Gloo fails every pending operation on a timeout.

Backends: ``"gloo"`` for CPU batches (the tested path); ``"nccl"`` for batches that already live on a GPU
(payloads on the current CUDA device; the transport is NCCL's, with NCCL's watchdog timeout, the protocol the
same; not exercised by the CPU tests).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDict, TensorDictBase

from lightning_per.replay.ingress import IngressLayout, stored_layout, write_limit

__all__ = ["RemoteIngress", "RemoteStats", "RemoteWriter", "REMOTE_BACKENDS"]

#: the transports of :class:`RemoteIngress` (see the module docstring)
REMOTE_BACKENDS = ("gloo", "nccl")

_LAYOUT_KEY = "lightning_per/remote_ingress/layout"
_JOINED_KEY = "lightning_per/remote_ingress/joined/"  # + rank: set by each writer once it reached the store
_TAG_BATCH, _TAG_SLOTS = 1, 2
_CLOSE = -1  # header n of a writer that closes cleanly
_ALIGN = 8
_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.uint8, torch.int8, torch.int16, torch.int32,
    torch.int64, torch.bool)}


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _payload_bytes(layout: IngressLayout, n: int) -> int:
    """Bytes of the payload of ``n`` rows: each field's block and the priorities, each 8-byte aligned."""
    blocks = sum(_aligned(n * math.prod(shape) * dtype.itemsize) for _, shape, dtype in layout.fields)
    return blocks + _aligned(4 * n)


def pack(layout: IngressLayout, fields: Mapping[str, torch.Tensor], priority: torch.Tensor | None,
         n: int) -> torch.Tensor:
    """The payload of one batch: ``(payload_bytes,) uint8`` on the fields' device, field blocks in layout order,
    then ``n`` float32 priorities (zeros when ``priority`` is None). Inverse: :func:`unpack`."""
    device = next(iter(fields.values())).device
    out = torch.zeros(_payload_bytes(layout, n), dtype=torch.uint8, device=device)
    off = 0
    for key, shape, dtype in layout.fields:
        nbytes = n * math.prod(shape) * dtype.itemsize
        out[off:off + nbytes].view(dtype).copy_(fields[key].reshape(-1))
        off += _aligned(nbytes)
    if priority is not None:
        out[off:off + 4 * n].view(torch.float32).copy_(priority)
    return out


def unpack(layout: IngressLayout, payload: torch.Tensor, n: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """``({key: (n, *shape) view}, priority (n,) float32 view)`` of a payload made by :func:`pack`."""
    fields, off = {}, 0
    for key, shape, dtype in layout.fields:
        nbytes = n * math.prod(shape) * dtype.itemsize
        fields[key] = payload[off:off + nbytes].view(dtype).view(n, *shape)
        off += _aligned(nbytes)
    return fields, payload[off:off + 4 * n].view(torch.float32)


def _layout_json(layout: IngressLayout) -> bytes:
    return json.dumps([[key, list(shape), str(dtype).removeprefix("torch.")]
                       for key, shape, dtype in layout.fields]).encode()


def _layout_of_json(text: bytes) -> IngressLayout:
    """The layout the owner published (JSON, never unpickled). Raises ValueError on a dtype we do not send."""
    fields = []
    for key, shape, dtype in json.loads(text.decode()):
        if dtype not in _DTYPES:
            raise ValueError(f"remote ingress: the owner's layout holds field {key!r} of dtype {dtype!r}; remote "
                             f"writers send {sorted(_DTYPES)}")
        fields.append((str(key), tuple(int(s) for s in shape), _DTYPES[dtype]))
    return IngressLayout(tuple(fields))


def _rendezvous(addr: str | None, port: int | None) -> tuple[str, int]:
    """``(addr, port)``: the arguments, else ``MASTER_ADDR`` / ``MASTER_PORT`` (torchrun's variables)."""
    addr = addr if addr is not None else os.environ.get("MASTER_ADDR")
    if port is None and os.environ.get("MASTER_PORT"):
        port = int(os.environ["MASTER_PORT"])
    if not addr or port is None:
        raise ValueError("remote ingress: give addr= and port=, or set MASTER_ADDR and MASTER_PORT (torchrun sets "
                         f"them); got addr={addr!r}, port={port!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
        raise ValueError(f"remote ingress: port must be an int in [0, 65535] (0: any free port, owner only), got "
                         f"{port!r}")
    return addr, port


def _check_seconds(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:300] if text else type(err).__name__


def _group(backend: str, store, rank: int, size: int, timeout: float, join_timeout: float):
    """The group of ``size`` ranks on ``store``, built once every writer has reached the store (waited for up to
    ``join_timeout`` seconds): the group's own connection wait is bounded by ``timeout``, which a writer that is
    still starting would otherwise exceed."""
    if rank:
        store.set(f"{_JOINED_KEY}{rank}", b"1")
    store.wait([f"{_JOINED_KEY}{r}" for r in range(1, size)], timedelta(seconds=join_timeout))
    if backend not in REMOTE_BACKENDS:
        raise ValueError(f"backend must be one of {list(REMOTE_BACKENDS)}, got {backend!r}")
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, size, timedelta(seconds=timeout))
    return dist.ProcessGroupNCCL(store, rank, size)  # NCCL's own watchdog timeout (TORCH_NCCL_* variables)


def _stop_heartbeat(closed: threading.Event, heartbeat: threading.Thread, timeout: float) -> None:
    closed.set()
    heartbeat.join(timeout=timeout)


@dataclass
class _Received:
    """One batch a writer sent in full: ``n`` rows of ``fields`` (``(n, *shape)`` each), optional ``priority``
    ``(n,)`` float32; ``done`` rows of it are in the buffer, at the slots ``slots`` (one tensor an extend)."""

    rank: int
    n: int
    fields: dict[str, torch.Tensor]
    priority: torch.Tensor | None
    done: int = 0
    slots: list[torch.Tensor] = field(default_factory=list)


@dataclass(frozen=True)
class RemoteStats:
    """Counters of a :class:`RemoteIngress`, in transitions (rows).

    Attributes:
        writers: remote writers the group was made for.
        connected: writers neither closed nor lost.
        received: rows received in full (queued or ingested).
        ingested: rows written into the buffer.
        lost: ranks whose connection failed (their death, or the group's timeout).

    Example::

        >>> from lightning_per import RemoteStats
        >>> s = RemoteStats(writers=2, connected=1, received=96, ingested=64, lost=(2,))  # owner.stats
        >>> s.received - s.ingested  # rows received in full, written at the next owner.ingest()
        32
    """

    writers: int
    connected: int
    received: int
    ingested: int
    lost: tuple[int, ...]


class RemoteIngress:
    """The owner's side of remote writers: a process group of its own, one receiving thread per writer.

    Args:
        rb: the buffer the batches go into (ours or any TorchRL buffer of TensorDicts; ``rb.extend`` and, for
            batches with priorities, ``rb.update_priority`` are called from :meth:`ingest`).
        writers: number of remote writers ``W`` (ranks ``1 .. W``), an int >= 1.
        example: a TensorDict ``[n]`` (or mapping of ``(n, ...)`` tensors) of the transitions; None: the buffer's
            stored layout.
        addr, port: the store's address; None: ``MASTER_ADDR`` / ``MASTER_PORT``. ``port=0`` picks a free port
            (read it from :attr:`port` and hand it to the writers).
        backend: ``"gloo"`` (CPU payloads) or ``"nccl"`` (payloads on the current CUDA device).
        timeout: seconds a peer may stay silent before the group fails (writers heartbeat every ``timeout / 4``).
        join_timeout: seconds the rendezvous waits for every writer to join.

    The constructor returns once all ``W`` writers have joined (each runs ``RemoteWriter(...)``).

    Raises:
        ValueError: ``writers`` < 1, no layout (no ``example`` and an empty buffer), an unknown ``backend``, a bad
            ``timeout``, no address or port.
        RuntimeError: the writers did not join within ``join_timeout`` seconds (torch.distributed's message).

    Example::

        >>> import torch
        >>> from lightning_per import make_replay_buffer
        >>> from lightning_per.replay.remote_ingress import RemoteIngress
        >>> rb = make_replay_buffer(1000, 32, device="cpu")
        >>> # owner = RemoteIngress(rb, writers=2, example={"obs": torch.zeros(1, 4)})   # MASTER_ADDR/PORT
        >>> # ... in the loop: owner.ingest(); rb.sample(); ...  finally owner.close()
    """

    def __init__(self, rb, writers: int, *, example=None, addr: str | None = None, port: int | None = None,
                 backend: str = "gloo", timeout: float = 30.0, join_timeout: float = 300.0) -> None:
        if isinstance(writers, bool) or not isinstance(writers, int) or writers < 1:
            raise ValueError(f"writers must be an int >= 1 (the remote writers' ranks are 1 .. writers), got "
                             f"{writers!r}")
        if backend not in REMOTE_BACKENDS:
            raise ValueError(f"backend must be one of {list(REMOTE_BACKENDS)}, got {backend!r}")
        timeout = _check_seconds("timeout", timeout)
        join_timeout = _check_seconds("join_timeout", join_timeout)
        layout = IngressLayout.of(example) if example is not None else stored_layout(rb.storage)
        if layout is None:
            raise ValueError("RemoteIngress: the buffer holds no transition yet, so its layout is unknown; pass "
                             "example= (a TensorDict [n] of the transitions the writers will send)")
        addr, port = _rendezvous(addr, port)
        self.rb, self.layout, self.writers, self.backend, self.timeout = rb, layout, writers, backend, timeout
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self.store = dist.TCPStore(addr, port, writers + 1, True, timedelta(seconds=join_timeout),
                                   wait_for_workers=False)
        self.addr, self.port = addr, self.store.port
        self.store.set(_LAYOUT_KEY, _layout_json(layout))
        self.group = _group(backend, self.store, 0, writers + 1, timeout, join_timeout)
        self._lock = threading.Lock()
        self._queue: deque[_Received] = deque()
        self._errors: deque[tuple[int, str]] = deque()
        self._lost: list[int] = []
        self._closed_ranks: set[int] = set()
        self._acks: list[Any] = []
        self.received = self.ingested = 0
        self._threads = [threading.Thread(target=self._receive, args=(rank,), daemon=True,
                                          name=f"remote-ingress-{rank}") for rank in range(1, writers + 1)]
        for thread in self._threads:
            thread.start()

    def _receive(self, rank: int) -> None:
        """Thread body: receive writer ``rank``'s batches until it closes or its connection fails."""
        header = torch.empty(2, dtype=torch.int64, device=self.device)
        try:
            while True:
                self.group.recv([header], rank, _TAG_BATCH).wait()
                n, has_priority = (int(v) for v in header.cpu())  # sync-ok: the receiving thread, not the learner
                if n == _CLOSE:
                    with self._lock:
                        self._closed_ranks.add(rank)
                    return
                if n == 0:  # heartbeat
                    continue
                payload = torch.empty(_payload_bytes(self.layout, n), dtype=torch.uint8, device=self.device)
                self.group.recv([payload], rank, _TAG_BATCH).wait()
                fields, priority = unpack(self.layout, payload, n)
                with self._lock:
                    self._queue.append(_Received(rank, n, fields, priority if has_priority else None))
                    self.received += n
        except RuntimeError as err:
            with self._lock:
                if rank not in self._closed_ranks:
                    self._errors.append((rank, _first_line(err)))

    def ingest(self) -> int:
        """Write every batch received in full into the buffer (one ``extend``, or several of at most what the
        storage takes in one, :func:`~lightning_per.replay.ingress.write_limit`; the rows sent with priorities get
        them in one update each) and send each writer the slots of its rows; returns the rows ingested.

        Raises:
            ConnectionError: a writer's connection failed since the last call (its death, or the group's
                timeout); the rows received before are ingested first, the other writers go on.
            Whatever an ``extend`` raises: the rows of that chunk and after stay queued for the next call (the
                chunks before it stay ingested, a batch split across chunks resumes where it stopped).
        """
        with self._lock:
            batches = deque(self._queue)
            self._queue.clear()
        limit = write_limit(self.rb.storage)
        total = 0
        try:
            while batches:
                total += self._extend(batches, limit)
        finally:
            if batches:  # an extend raised: these go first at the next call
                with self._lock:
                    self._queue.extendleft(reversed(batches))
        self._reap_acks()
        with self._lock:  # the receivers' errors and those of the acknowledgements just sent
            errors = list(self._errors)
            self._errors.clear()
        if errors:
            ranks = [rank for rank, _ in errors]
            self._lost.extend(ranks)
            raise ConnectionError(f"remote ingress: writer rank(s) {ranks} lost ({errors[0][1]}); the rows they sent "
                                  f"in full before are ingested, the other writers go on")
        return total

    def _extend(self, batches: deque[_Received], limit: int | None) -> int:
        """One ``extend`` of the rows not written yet of the first batches of ``batches``, at most ``limit``; each
        batch written in full is answered with its slots and leaves ``batches``. Returns the rows written."""
        chunk, m = [], 0
        for batch in batches:
            k = batch.n - batch.done if limit is None else min(batch.n - batch.done, limit - m)
            if k > 0:
                chunk.append((batch, batch.done, k))
                m += k
            if limit is not None and m == limit:
                break
        if m:
            data = TensorDict({key: torch.cat([batch.fields[key][start:start + k] for batch, start, k in chunk])
                               for key, _, _ in self.layout.fields}, [m])
            index = self.rb.extend(data, update_priority=False)
            self.ingested += m
            written, at = [], 0
            for batch, start, k in chunk:  # first the record of what is in the buffer, then the priorities
                slots = index[at:at + k]
                batch.slots.append(slots)
                batch.done += k
                written.append((batch, start, k, slots))
                at += k
            for batch, start, k, slots in written:
                if batch.priority is not None:
                    self.rb.update_priority(slots, batch.priority[start:start + k].to(index.device))
        while batches and batches[0].done == batches[0].n:
            batch = batches.popleft()
            self._send_slots(batch.rank, torch.cat(batch.slots))
        return m

    def _send_slots(self, rank: int, slots: torch.Tensor) -> None:
        if rank in self._lost:
            return
        slots = slots.to(device=self.device, dtype=torch.int64).contiguous()
        try:
            self._acks.append((rank, self.group.send([slots], rank, _TAG_SLOTS), slots))
        except RuntimeError as err:  # the writer died after its batch arrived (Gloo may fail the send at once)
            self._record_error(rank, err)

    def _reap_acks(self) -> None:
        """Wait for the acknowledgements sent (each writer pre-posts their receives: no wait blocks long)."""
        acks, self._acks = self._acks, []
        for rank, work, _ in acks:
            try:
                work.wait()
            except RuntimeError as err:
                self._record_error(rank, err)

    def _record_error(self, rank: int, err: BaseException) -> None:
        with self._lock:
            if rank not in self._closed_ranks and all(rank != r for r, _ in self._errors):
                self._errors.append((rank, _first_line(err)))

    @property
    def stats(self) -> RemoteStats:
        """The counters (see :class:`RemoteStats`)."""
        with self._lock:
            gone = len(self._closed_ranks | set(self._lost) | {r for r, _ in self._errors})
            return RemoteStats(writers=self.writers, connected=self.writers - gone, received=self.received,
                               ingested=self.ingested, lost=tuple(sorted(self._lost)))

    def close(self) -> None:
        """End the group: writers still connected get :class:`ConnectionError` at their next write. Rows received
        and not ingested are dropped: call :meth:`ingest` first."""
        self.group.abort()

    def __repr__(self) -> str:
        s = self.stats
        return (f"RemoteIngress(addr={self.addr!r}, port={self.port}, backend={self.backend!r}, writers={s.writers}, "
                f"connected={s.connected}, received={s.received}, ingested={s.ingested}, lost={list(s.lost)})")


class RemoteWriter:
    """A writer of another host (or process): joins the owner's group and sends batches to its buffer.

    Args:
        rank: this writer's rank, ``1 .. W``; None: ``RANK`` (torchrun's variable).
        writers: ``W``, the number of remote writers; None: ``WORLD_SIZE - 1``.
        addr, port: the owner's store; None: ``MASTER_ADDR`` / ``MASTER_PORT``.
        backend: the owner's ``backend``.
        credits: batches sent and not acknowledged before a write waits (an int >= 1).
        timeout: as the owner's (seconds).
        join_timeout: seconds to wait for the owner's store and the other writers.
        keep_slots: keep the buffer slots of every acknowledged batch in :attr:`slots` (``(n,)`` int64 CPU each).

    Raises:
        ValueError: a rank outside ``1 .. W``, bad ``credits`` / ``timeout``, no address, the owner's layout
            holding a dtype writers do not send.
        RuntimeError: the owner's store did not answer, or the group did not form, within ``join_timeout`` seconds
            (torch.distributed's message).

    Example::

        >>> from lightning_per.replay.remote_ingress import RemoteWriter
        >>> # writer = RemoteWriter(rank=1, writers=2)        # MASTER_ADDR / MASTER_PORT of the owner
        >>> # writer.write({"obs": torch.ones(64, 4)}); ...; writer.close()
    """

    def __init__(self, rank: int | None = None, writers: int | None = None, *, addr: str | None = None,
                 port: int | None = None, backend: str = "gloo", credits: int = 4, timeout: float = 30.0,
                 join_timeout: float = 300.0, keep_slots: bool = False) -> None:
        if rank is None:
            rank = int(os.environ.get("RANK", "-1"))
        if writers is None:
            writers = int(os.environ.get("WORLD_SIZE", "0")) - 1
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= writers:
            raise ValueError(f"rank must be an int in 1 .. writers ({writers}) (rank 0 is the owner), got {rank!r}")
        if isinstance(credits, bool) or not isinstance(credits, int) or credits < 1:
            raise ValueError(f"credits must be an int >= 1, got {credits!r}")
        if backend not in REMOTE_BACKENDS:
            raise ValueError(f"backend must be one of {list(REMOTE_BACKENDS)}, got {backend!r}")
        self.timeout = _check_seconds("timeout", timeout)
        join_timeout = _check_seconds("join_timeout", join_timeout)
        self.addr, self.port = _rendezvous(addr, port)
        self.rank, self.writers, self.backend, self.credits = rank, writers, backend, credits
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self.store = dist.TCPStore(self.addr, self.port, writers + 1, False, timedelta(seconds=join_timeout))
        self.layout = _layout_of_json(self.store.get(_LAYOUT_KEY))
        self.group = _group(backend, self.store, rank, writers + 1, self.timeout, join_timeout)
        self._pending: deque[tuple[Any, torch.Tensor]] = deque()
        self._send_lock = threading.Lock()
        self._last_send = time.monotonic()
        self._error: str | None = None
        self._closed = threading.Event()
        self.sent = self.acknowledged = 0
        self.slots: list[torch.Tensor] = []  # the buffer slots of acknowledged batches, when keep_slots
        self.keep_slots = keep_slots
        self._heartbeat = threading.Thread(target=self._beat, daemon=True, name="remote-writer-heartbeat")
        self._heartbeat.start()
        # a writer left open at exit: the heartbeat stops before the interpreter does, not inside a Gloo call
        weakref.finalize(self, _stop_heartbeat, self._closed, self._heartbeat, self.timeout)

    def _gone(self, err: BaseException) -> ConnectionError:
        self._error = self._error or _first_line(err)
        self._closed.set()  # the heartbeat stops
        try:  # end this side of the group now: a send still pending in the heartbeat fails instead of outliving
            self.group.abort()  # the process, whose exit would then tear down a live Gloo context
        except RuntimeError:
            pass
        self._heartbeat.join(timeout=self.timeout)  # no Gloo call of this writer outlives it, nor a pending
        self._pending.clear()  # receive its group's teardown (either ends the process: "terminate called")
        if "Timed out" in self._error:
            return ConnectionError(f"remote writer rank {self.rank}: the owner at {self.addr}:{self.port} did not "
                                   f"answer for {self.timeout} s (it stopped calling ingest(), or its host is "
                                   f"lost); the group is ended: {self._error}")
        return ConnectionError(f"remote writer rank {self.rank}: the owner at {self.addr}:{self.port} is gone "
                               f"(closed, or its process died): {self._error}")

    def _send(self, header: torch.Tensor, payload: torch.Tensor | None) -> None:
        with self._send_lock:
            self.group.send([header], 0, _TAG_BATCH).wait()
            if payload is not None:
                self.group.send([payload], 0, _TAG_BATCH).wait()
            self._last_send = time.monotonic()

    def _beat(self) -> None:
        """Thread body: an empty header when no batch went out for ``timeout / 4`` seconds."""
        period = self.timeout / 4
        while not self._closed.wait(period / 4):
            if time.monotonic() - self._last_send >= period and self._error is None:
                try:
                    self._send(torch.zeros(2, dtype=torch.int64, device=self.device), None)
                except RuntimeError as err:
                    self._error = self._error or _first_line(err)
                    return

    def write(self, batch: TensorDictBase | Mapping[str, Any], priority=None) -> int:
        """Send ``batch`` (``n`` transitions) to the owner; returns ``n``. Waits for the oldest acknowledgement
        when ``credits`` batches are unacknowledged.

        Args:
            batch: a TensorDict ``[n]`` or mapping of CPU tensors ``(n, *shape)`` of the owner's layout.
            priority: optional raw priorities ``(n,)`` (finite, >= 0), set by the owner at ingest.

        Raises:
            TypeError, ValueError: as :meth:`WriterHandle.write` (the field named); nothing is sent.
            ConnectionError: the owner is gone (closed, or its process died).
        """
        if self._error is not None:
            raise self._gone(RuntimeError(self._error))
        if self._closed.is_set():
            raise ValueError(f"remote writer rank {self.rank} is closed; nothing was sent")
        n, fields, priority = self.layout.check(batch, priority)
        if n == 0:
            return 0
        payload = pack(self.layout, {k: v.to(self.device) for k, v in fields.items()},
                       None if priority is None else priority.to(self.device), n)
        header = torch.tensor([n, priority is not None], dtype=torch.int64, device=self.device)
        try:
            while len(self._pending) >= self.credits:
                self._take_ack()
            slots = torch.empty(n, dtype=torch.int64, device=self.device)
            self._pending.append((self.group.recv([slots], 0, _TAG_SLOTS), slots))  # posted before the batch
            self._send(header, payload)
        except RuntimeError as err:
            raise self._gone(err) from None
        self.sent += n
        return n

    def _take_ack(self) -> None:
        work, slots = self._pending.popleft()
        work.wait()
        self.acknowledged += slots.shape[0]
        if self.keep_slots:
            self.slots.append(slots.cpu())  # sync-ok: writer side, keep_slots only (a record for tests), after wait()

    def flush(self) -> int:
        """Wait until the owner has ingested every batch sent; returns the rows acknowledged in all.

        Raises:
            ConnectionError: the owner is gone.
        """
        try:
            while self._pending:
                self._take_ack()
        except RuntimeError as err:
            raise self._gone(err) from None
        return self.acknowledged

    def close(self) -> None:
        """Flush, tell the owner this writer is done, and leave the group."""
        if self._closed.is_set():
            return
        try:
            self.flush()
            self._closed.set()
            self._send(torch.tensor([_CLOSE, 0], dtype=torch.int64, device=self.device), None)
        finally:
            self._closed.set()
            self._heartbeat.join(timeout=self.timeout)
