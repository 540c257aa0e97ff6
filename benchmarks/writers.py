"""Many writers, one buffer: transitions/s ingested, write-to-sampleable latency, the learner's step beside them.

Writer processes (``spawn``, one pool a transition kind, reused by every row of it) send batches of B transitions
(each with a writer id and the writer's ``time.monotonic_ns()``) for ``--seconds`` while the owner (this process)
makes them sampleable and runs its learner step, one sample of 256 + one priority update of random values.
Rows, per transition kind, number of writers W and batch size B, measured in one run:

  shm        ours: ``rb.writer_handle()`` shared-memory rings, ``rb.ingest()`` (make_replay_buffer, proportional)
  gloo       ours: ``RemoteWriter`` -> ``RemoteIngress`` over Gloo point-to-point on loopback TCP, same buffer kind
  torchrl    TorchRL's own shared buffer: ``TensorDictPrioritizedReplayBuffer(LazyMemmapStorage, sync=False,
             shared=True)``; writers ``extend`` it under its shared lock, the learner's sampler catches up

Transition kinds (``--transition``; :data:`TRANSITIONS`):

  tiny       observation 4 float32, action, reward, writer id, stamp: 44 bytes (the CPU suite's default)
  small      observation and next observation 51 float32 each, action, reward, done, writer id, stamp
  pong       observation and next observation 4x84x84 uint8 (frame stacks), action, reward, done, writer id,
             stamp; each writer sends the stacks of its own stream of distinct random frames (consecutive
             stacks share 3 frames, as an Atari env's), so our buffer deduplicates them as the DQN's
             ``replay.frame_dedup`` does (``make_replay_buffer(frame_stack=4)``); TorchRL's stores them whole

Our buffer lives on ``--device``. Its learner step is ``graphs.capture`` of the step above: on CUDA one CUDA-graph
replay, timed with CUDA events and run under ``torch.cuda.set_sync_debug_mode("error")`` (a host
synchronisation raises; ``syncs_per_step`` counts the steps that raised); on a CPU the same captured callable
runs the step eagerly, timed with ``time.perf_counter``. TorchRL's rows keep their learner on the CPU (its
shared buffer is a host memmap storage), timed with ``time.perf_counter``.

Each writer sends as fast as it can (its ring or its credits full: the rate a transport sustains), or, with
``--rate R``, one batch every ``W * B / R`` seconds (R transitions/s offered by the W writers together; a writer
that falls behind sends at once): the write-to-sampleable latency of a load below capacity. A saturated row's
latency is the depth of the full rings over the rate (Little's law), whatever the owner's speed.

Columns: ``offered_per_s`` (``--rate``; null: saturated), ``rows_per_s`` (transitions made sampleable per second
of the run), ``lat_p50_ms`` / ``lat_p99_ms``
(from the writer's timestamp to the end of the owner's call that made the row sampleable; both clocks are the
host's CLOCK_MONOTONIC; at most the last capacity rows of a loop are still stored to be read),
``learn_idle_us`` / ``learn_idle_p99_us`` (learner step p50 / p99 with no writer running) and ``learn_busy_us``
/ ``learn_busy_p99_us`` (the step while the writers run; the owner's explicit ingest is outside it; on a CPU
our ``sample()`` ingests what arrived since, a CUDA-graph replay runs no host code and ingests nothing).

    python -m benchmarks run writers --device cpu                  # tiny; W = 1, 2, 4, 8, 16; B = 64, 1024
    python -m benchmarks run writers --quick --device cpu           # tiny; W = 1, 2; B = 64 (CI)
    python -m benchmarks run writers --device cuda                  # small (B = 64, 1024) and pong (B = 64)
    python -m benchmarks run writers --device cuda --transition small --writers 16 --batches 64 --rate 100000
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import shutil
import socket
import tempfile
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from benchmarks._results import Results, markdown_table

TRANSPORTS = ("shm", "gloo", "torchrl")
LEARN_B = 256
CAPACITY = 1 << 17  # transitions in each buffer of the tiny and small kinds (ours and TorchRL's alike)
SLOTS = 8  # slots of each writer's shared-memory ring (fewer where one drain would exceed a frame-dedup extend)
STAMPS_PER_READ = 256  # stamps read per owner iteration: a strided subsample of the rows that became sampleable
_SYNC = "synchroniz"  # in torch's error under set_sync_debug_mode("error")


@dataclass(frozen=True)
class Transition:
    """A kind of transition the writers send.

    Attributes:
        name: the ``--transition`` choice.
        obs: per-item shape of the observation (and next observation).
        dtype: their dtype.
        next_obs: whether the transition carries a next observation and a done flag.
        frame_stack: frames a stack (leading dim of ``obs``): our buffer stores each frame once
            (``make_replay_buffer(frame_stack=...)``); None: stored whole.
        capacity: transitions each buffer holds (ours and TorchRL's).
        batches: default batch sizes B of a full run.
    """

    name: str
    obs: tuple[int, ...]
    dtype: torch.dtype
    next_obs: bool
    frame_stack: int | None
    capacity: int
    batches: tuple[int, ...]


#: The transition kinds, by ``--transition`` name. Pong's capacity is 2^16 so that TorchRL's memmap files (its
#: transitions whole: 56 KB each) stay at 3.7 GB; its batch of 64 lets 16 writers' rings of 8 slots drain in one
#: extend of the frame-dedup buffer (at most (frames - window) / 8 transitions an extend: docs/replay.md).
TRANSITIONS = {
    "tiny": Transition("tiny", (4,), torch.float32, False, None, CAPACITY, (64, 1024)),
    "small": Transition("small", (51,), torch.float32, True, None, CAPACITY, (64, 1024)),
    "pong": Transition("pong", (4, 84, 84), torch.uint8, True, 4, 1 << 16, (64,)),
}
FRAMES_PER_WRITER = 2048  # distinct frames a pong writer cycles through: > the dedup window (1024 frames)


def add_arguments(parser) -> None:
    parser.add_argument("--writers", type=int, nargs="+", default=None, help="writer counts (default 1 2 4 8 16)")
    parser.add_argument("--batches", type=int, nargs="+", default=None,
                        help="batch sizes (default: the transition kind's: 64 1024, pong 64)")
    parser.add_argument("--seconds", type=float, default=None, help="seconds of writing per row (default 2)")
    parser.add_argument("--transports", nargs="+", default=list(TRANSPORTS), choices=TRANSPORTS)
    parser.add_argument("--transition", nargs="+", default=None, choices=list(TRANSITIONS),
                        help="transition kinds (default: tiny on a CPU, small and pong on CUDA)")
    parser.add_argument("--rate", type=float, default=None,
                        help="transitions/s offered by all the writers together, each writer pacing its batches "
                             "(default: as fast as each can send, the rings full)")


def _fields(kind: Transition, b: int, wid: int, obs: torch.Tensor, next_obs: torch.Tensor | None):
    from tensordict import TensorDict

    fields = {"observation": obs}
    if kind.next_obs:
        fields["next_observation"] = next_obs
    fields.update(action=torch.zeros(b, dtype=torch.int64), reward=torch.zeros(b))
    if kind.next_obs:
        fields["done"] = torch.zeros(b, dtype=torch.bool)
    fields.update(writer=torch.full((b,), wid, dtype=torch.int64), t_ns=torch.zeros(b, dtype=torch.int64))
    return TensorDict(fields, [b])


def _example(kind: Transition):
    """One transition of ``kind`` (zeros): the layout of the buffers and the writers' rings."""
    obs = torch.zeros(1, *kind.obs, dtype=kind.dtype)
    return _fields(kind, 1, 0, obs, obs.clone())


class _Batches:
    """The batches of ``b`` transitions of ``kind`` that writer ``wid`` sends, in turn (:meth:`next`).

    tiny / small: one batch of random observations, sent again and again (its stamp refilled). pong: the writer's
    own stream of ``FRAMES_PER_WRITER``-odd distinct random 84x84 frames (seeded by ``wid``); transition ``t``'s
    observation is frames ``t .. t + 3`` and its next observation frames ``t + 1 .. t + 4``, as views of the
    stream (no copy a batch); the stream wraps around.
    """

    def __init__(self, kind: Transition, b: int, wid: int) -> None:
        gen = torch.Generator().manual_seed(1000 + wid)
        if kind.frame_stack is None:
            obs = torch.randn(b, *kind.obs, generator=gen).to(kind.dtype)
            self.tds = [_fields(kind, b, wid, obs, torch.randn(b, *kind.obs, generator=gen).to(kind.dtype))]
        else:
            s = kind.frame_stack
            n = b * math.ceil(FRAMES_PER_WRITER / b)  # distinct frames: whole batches, so none straddles the wrap
            frames = torch.randint(0, 256, (n, *kind.obs[1:]), generator=gen, dtype=torch.uint8)
            frames = torch.cat([frames, frames[:s]])  # the wrap: the last stacks end with the first frames

            def stacks(first: int) -> torch.Tensor:  # (n, s, *frame): stack t holds frames first + t .. + s - 1
                view = frames[first:]
                return view.as_strided((n, s, *view.shape[1:]), (view.stride(0), *view.stride()))

            obs, nxt = stacks(0), stacks(1)
            self.tds = [_fields(kind, b, wid, obs[i:i + b], nxt[i:i + b]) for i in range(0, n, b)]
        self.k = 0

    def next(self):
        td = self.tds[self.k % len(self.tds)]
        self.k += 1
        return td


def _worker(wid: int, kind: Transition, commands, results, running, torchrl_rb) -> None:
    """A pool process: for each command, write batches while ``running`` holds the command's run id."""
    torch.set_num_threads(1)
    from lightning_per import RemoteWriter

    sources: dict[int, _Batches] = {}
    results.put(("up", wid))  # imports done: the rows measure nothing of this process's start
    while True:
        cmd = commands.get()
        if cmd is None:
            return
        transport, run_id, b, interval, arg = cmd
        if b not in sources:
            sources[b] = _Batches(kind, b, wid)
        source = sources[b]
        writer = None
        if transport == "shm":
            sink = arg.write
        elif transport == "torchrl":
            sink = torchrl_rb.extend
        else:
            writers, port = arg
            writer = RemoteWriter(wid + 1, writers, addr="127.0.0.1", port=port, credits=4, timeout=120.0)
            sink = writer.write
        results.put(("ready", wid))
        while running.value not in (run_id, -1):
            time.sleep(1e-3)
        rows = 0
        due = time.monotonic()
        while running.value == run_id:
            if interval:  # paced: one batch every `interval` s; a writer that falls behind sends at once, no burst
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                due = max(due, time.monotonic() - interval) + interval
            td = source.next()
            td["t_ns"].fill_(time.monotonic_ns())
            sink(td)
            rows += b
        if writer is not None:
            writer.close()
        if transport == "shm":
            arg.close()
        results.put(("done", wid, rows))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _HostClock:
    """Step times from ``time.perf_counter`` (the CPU learners)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def stop(self) -> None:
        self.seconds.append(time.perf_counter() - self.t0)

    def values_us(self) -> np.ndarray:
        return 1e6 * np.asarray(self.seconds)


class _CudaClock:
    """Step times from CUDA events recorded around each step on the current stream. A pair is read once its end
    event has completed (``query()``: no wait) and then reused; :meth:`values_us` waits for the rest."""

    def __init__(self) -> None:
        self.free: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.pending: deque[tuple[torch.cuda.Event, torch.cuda.Event]] = deque()
        self.us: list[float] = []

    def start(self) -> None:
        self.pair = self.free.pop() if self.free else (torch.cuda.Event(enable_timing=True),
                                                       torch.cuda.Event(enable_timing=True))
        self.pair[0].record()

    def stop(self) -> None:
        self.pair[1].record()
        self.pending.append(self.pair)
        while self.pending and self.pending[0][1].query():
            self._read()

    def _read(self) -> None:
        pair = self.pending.popleft()
        self.us.append(1e3 * pair[0].elapsed_time(pair[1]))  # ms -> us
        self.free.append(pair)

    def values_us(self) -> np.ndarray:
        torch.cuda.synchronize()  # sync-ok: the end of a measurement
        while self.pending:
            self._read()
        return np.asarray(self.us)


class _Learner:
    """The owner's learner step (sample 256, update their priorities with random values) and its clock.

    Ours (``captured=True``): the step through ``graphs.capture`` with the buffer and the priorities' generator
    as its state: one CUDA-graph replay on CUDA, each under ``set_sync_debug_mode("error")`` and timed with CUDA
    events; checked eager calls on a CPU, timed on the host. TorchRL's: the step called plainly on the host.
    """

    def __init__(self, rb, device: torch.device, captured: bool, seed: int) -> None:
        from lightning_per import graphs
        from lightning_per.graphs.check import host_syncs_raise

        gen = torch.Generator(device=device).manual_seed(seed)

        def step() -> None:
            td = rb.sample(LEARN_B)
            rb.update_priority(td["index"], torch.rand(LEARN_B, generator=gen, device=device) + 0.1)

        self.on_cuda = captured and device.type == "cuda"
        self.step = graphs.capture(step, state=[rb, gen]) if captured else step
        self.clock_kind = _CudaClock if self.on_cuda else _HostClock
        self.syncs_raise = host_syncs_raise  # on CUDA only: see learn()
        self.new_clock()

    def new_clock(self) -> None:
        """Start a new series of step times and sync counts."""
        self.clock, self.steps, self.syncs = self.clock_kind(), 0, 0

    def learn(self) -> None:
        """One step, timed; a host synchronisation inside it (CUDA) is counted, not raised."""
        self.clock.start()
        try:
            with self.syncs_raise(self.on_cuda):
                self.step()
        except RuntimeError as exc:
            if _SYNC not in str(exc):
                raise
            self.syncs += 1
        self.clock.stop()
        self.steps += 1

    def series(self) -> tuple[float, float, float | None]:
        """``(p50 us, p99 us, syncs per step or None)`` of the steps since :meth:`new_clock`."""
        us = self.clock.values_us()
        syncs = self.syncs / max(1, self.steps) if self.on_cuda else None
        return float(np.quantile(us, 0.5)), float(np.quantile(us, 0.99)), syncs

    def idle(self, steps: int) -> tuple[float, float]:
        """p50 / p99 us of ``steps`` steps after one untimed step (on CUDA the capture, outside the sync check:
        ``graphs.capture`` checks its warm-up for syncs itself)."""
        self.step()
        self.new_clock()
        for _ in range(steps):
            self.learn()
        p50, p99, _ = self.series()
        self.new_clock()
        return p50, p99


class _Pool:
    def __init__(self, n: int, kind: Transition, torchrl_rb) -> None:
        ctx = mp.get_context("spawn")
        self.running = ctx.Value("q", 0, lock=False)
        self.results = ctx.Queue()
        self.commands = [ctx.Queue() for _ in range(n)]
        self.procs = [ctx.Process(target=_worker, args=(w, kind, self.commands[w], self.results, self.running,
                                                        torchrl_rb), daemon=True) for w in range(n)]
        for p in self.procs:
            p.start()
        for _ in range(n):
            assert self.results.get(timeout=900)[0] == "up"

    def close(self) -> None:
        self.running.value = -1
        for q in self.commands:
            q.put(None)
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


def _ring_slots(rb, kind: Transition, writers: int, b: int) -> int:
    """Slots of each writer's ring: ``SLOTS``, or fewer where one ingest's drain (every ring's slots at most)
    would exceed what one extend of a frame-dedup storage takes ((frames - window) / (2 S) transitions).

    Raises:
        SystemExit: not even one slot of ``b`` transitions a writer fits (name a smaller ``--batches``).
    """
    if kind.frame_stack is None:
        return SLOTS
    s = rb.storage
    limit = (s.n_frames - s.window) // (2 * s.frame_stack)
    slots = min(SLOTS, limit // (writers * b))
    if slots < 1:
        raise SystemExit(f"writers: {writers} rings of one slot of B={b} {kind.name} transitions exceed one extend "
                         f"of the frame-dedup buffer ({limit} transitions): pass smaller --batches")
    return slots


def _check_shared_memory(kind: Transition, rows: int) -> None:
    """Refuse rings of ``rows`` transitions in all that ``/dev/shm`` cannot hold: a writer writing past the end of
    a tmpfs that is full dies of SIGBUS instead of raising.

    Raises:
        SystemExit: not enough free space in ``/dev/shm`` (say how much is needed).
    """
    from lightning_per.replay.ingress import IngressLayout

    if not os.path.isdir("/dev/shm"):
        return
    need = rows * (IngressLayout.of(_example(kind)).row_bytes() + 4)  # + each row's float32 priority
    free = shutil.disk_usage("/dev/shm").free
    if need > free:
        raise SystemExit(f"writers: the {kind.name} rings need {need / 2**20:.0f} MiB of /dev/shm, "
                         f"{free / 2**20:.0f} MiB are free: pass fewer --writers or smaller --batches")


def _ours(kind: Transition, device: torch.device, transport: str, writers: int, b: int):
    """Our buffer of ``kind`` on ``device`` filled with 4 x 256 transitions, and the writers' handles (shm)."""
    from lightning_per import make_replay_buffer

    rb = make_replay_buffer(kind.capacity, LEARN_B, sampler="proportional", device=device,
                            frame_stack=kind.frame_stack)
    handles = []
    if transport == "shm":  # made before the first write, as when the published rows ran
        slots = _ring_slots(rb, kind, writers, b)
        _check_shared_memory(kind, writers * slots * b)
        handles = [rb.writer_handle(_example(kind), slots=slots, rows=b) for _ in range(writers)]
    rb.extend(_Batches(kind, 4 * LEARN_B, -1).next())
    return rb, handles


def _stamps(rb, seen: int, count: int, capacity: int) -> torch.Tensor:
    """The writers' stamps ``(k,) int64`` (on the storage's device) of a strided subsample of slots ``seen ..
    count - 1`` still stored: one column of the storage, read without a host synchronisation."""
    from lightning_per.replay.compat import stored_data

    column = stored_data(rb.storage)["t_ns"]  # (capacity,) int64
    first = max(seen, count - capacity)
    slots = torch.arange(first, count, max(1, (count - first) // STAMPS_PER_READ), device=column.device) % capacity
    return column[slots]


def _row(kind: Transition, transport: str, pool: _Pool, writers: int, b: int, seconds: float, run_id: int,
         torchrl_rb, device: torch.device, quick: bool, rate: float | None):
    from lightning_per import RemoteIngress

    example = _example(kind)
    owner = None
    if transport == "torchrl":
        rb, handles = torchrl_rb, []
        learner = _Learner(rb, torch.device("cpu"), captured=False, seed=run_id)
    else:
        rb, handles = _ours(kind, device, transport, writers, b)
        learner = _Learner(rb, device, captured=True, seed=run_id)
    idle_p50, idle_p99 = learner.idle(20 if quick else 100)
    args = handles if transport == "shm" else [None] * writers
    if transport == "gloo":
        port = _free_port()
        args = [(writers, port)] * writers
    interval = writers * b / rate if rate else 0.0  # seconds between one writer's batches
    for w in range(writers):
        pool.commands[w].put((transport, run_id, b, interval, args[w]))
    if transport == "gloo":
        owner = RemoteIngress(rb, writers, example=example, addr="127.0.0.1", port=port, timeout=120.0)
    for _ in range(writers):
        assert pool.results.get(timeout=600)[0] == "ready"

    def sampleable() -> int:
        """Make what the writers sent sampleable; returns the rows that became so."""
        if transport == "shm":
            return rb.ingest()
        if transport == "gloo":
            return owner.ingest()
        return 0  # TorchRL's learner catches up inside sample(): rows count through write_count

    first = seen = rb.write_count
    stamps, nows = [], []  # per owner iteration: the stamps read (device tensors), the host clock then
    pool.running.value = run_id
    start = time.perf_counter()
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        sampleable()
        learner.learn()
        now = time.monotonic_ns()
        count = rb.write_count
        if count < kind.capacity:  # TorchRL counts rows before its storage holds them: those are not sampleable yet
            count = min(count, len(rb))
        if count > seen:  # the stamps of (a subsample of) the rows that became sampleable and are still stored
            stamps.append(_stamps(rb, seen, count, kind.capacity))
            nows.append(now)
        seen = count
    elapsed = time.perf_counter() - start
    pool.running.value = 0
    busy_p50, busy_p99, syncs = learner.series()
    finished = 0
    while finished < writers:  # writers blocked on a full ring or unacknowledged batches need the owner
        sampleable()
        while not pool.results.empty():
            pool.results.get()
            finished += 1
        time.sleep(1e-3)
    sampleable()
    if owner is not None:
        owner.close()
    if transport == "shm":
        rb.close_writers()
    lat = torch.full((1,), float("nan"), dtype=torch.float64)
    if stamps:  # one read of every stamp, after the loop
        t_ns = torch.cat(stamps).cpu()
        now_ns = torch.repeat_interleave(torch.tensor(nows), torch.tensor([len(s) for s in stamps]))
        lat = ((now_ns - t_ns)[t_ns > 0]).double() / 1e6
    name = transport if kind.name == "tiny" else f"{transport}-{kind.name}"
    learner_kind = "cuda-graph" if learner.on_cuda else "cpu"
    offered = f"-R{rate:g}" if rate else ""
    return {"impl": f"{name}-W{writers}-B{b}{offered}", "transport": transport, "writers": writers, "batch": b,
            "rows_per_s": round((seen - first) / elapsed), "lat_p50_ms": round(float(lat.quantile(0.5)), 3),
            "lat_p99_ms": round(float(lat.quantile(0.99)), 3), "learn_idle_us": round(idle_p50, 1),
            "learn_busy_us": round(busy_p50, 1), "learn_idle_p99_us": round(idle_p99, 1),
            "learn_busy_p99_us": round(busy_p99, 1), "syncs_per_step": syncs, "transition": kind.name,
            "learner": learner_kind, "offered_per_s": rate}


def _torchrl_buffer(scratch: str, kind: Transition):
    """TorchRL's shared prioritized buffer: memmap storage (initialised here, so writers share its files),
    ``sync=False`` (writers sample uniformly, the learner's sampler catches up), a process-shared write lock."""
    from torchrl.data import LazyMemmapStorage, TensorDictPrioritizedReplayBuffer

    storage = LazyMemmapStorage(kind.capacity, scratch_dir=os.path.join(scratch, kind.name))
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=storage, sync=False, shared=True,
                                           batch_size=LEARN_B)
    rb.extend(_Batches(kind, 4 * LEARN_B, -1).next())
    return rb


def _plot(rows):
    def draw(path):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for kind in dict.fromkeys(r["transition"] for r in rows):
            for transport in TRANSPORTS:
                for b in sorted({r["batch"] for r in rows}):
                    sel = [r for r in rows if r["transport"] == transport and r["batch"] == b
                           and r["transition"] == kind]
                    if sel:
                        w = [r["writers"] for r in sel]
                        label = f"{transport} {kind} B={b}"
                        axes[0].plot(w, [r["rows_per_s"] for r in sel], marker="o", label=label)
                        axes[1].plot(w, [r["lat_p99_ms"] for r in sel], marker="o", label=label)
        for ax, label in zip(axes, ("transitions/s made sampleable", "write-to-sampleable p99 (ms)")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("writer processes")
            ax.set_ylabel(label)
            ax.grid(True, alpha=0.3)
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)

    return draw


def run(args) -> Results:
    device = torch.device(args.device)
    if device.type not in ("cpu", "cuda"):
        raise SystemExit(f"writers: --device must be cpu or cuda, got {args.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("writers: --device cuda but CUDA is not available here")
    kinds = [TRANSITIONS[k] for k in (args.transition or (["tiny"] if device.type == "cpu" else ["small", "pong"]))]
    writers = args.writers or ([1, 2] if args.quick else [1, 2, 4, 8, 16])
    seconds = args.seconds or (0.5 if args.quick else 2.0)
    if args.rate is not None and not (math.isfinite(args.rate) and args.rate > 0):
        raise SystemExit(f"writers: --rate must be a number of transitions/s > 0, got {args.rate}")
    torch.set_num_threads(1)
    load_start = os.getloadavg()[0]
    rows = []
    run_id = 0
    for kind in kinds:
        batches = args.batches or ([64] if args.quick else list(kind.batches))
        with tempfile.TemporaryDirectory(prefix="lper-writers-") as scratch:
            torchrl_rb = _torchrl_buffer(scratch, kind) if "torchrl" in args.transports else None
            warm, _ = _ours(kind, device, "warm", 0, 0)
            _Learner(warm, device, captured=True, seed=0).idle(20)  # first calls (allocations, lazy inits, kernels)
            if torchrl_rb is not None:
                _Learner(torchrl_rb, torch.device("cpu"), captured=False, seed=0).idle(20)
            del warm
            pool = _Pool(max(writers), kind, torchrl_rb)
            try:
                for transport in args.transports:
                    for b in batches:
                        for w in writers:
                            run_id += 1
                            rows.append(_row(kind, transport, pool, w, b, seconds, run_id, torchrl_rb, device,
                                             args.quick, args.rate))
                            print(rows[-1], flush=True)
            finally:
                pool.close()
    table = markdown_table(rows)
    by = {(r["transition"], r["transport"], r["writers"], r["batch"]): r for r in rows}
    gpu = device.type == "cuda"
    offered = (f"The writers offer {args.rate:g} transitions/s together (`offered_per_s`), each sending a batch every "
               "W x B / rate seconds" if args.rate else "Each writer sends as fast as it can (`offered_per_s` null)")
    notes = [f"{os.cpu_count()} CPU cores shared by the owner and every writer process; {seconds} s of writing per "
             f"row. {offered}: a saturated run keeps every ring full, so its latency is the rings' depth over "
             "the rate, and the latency of a load below capacity needs `--rate`. Latency: writer's timestamp to "
             "the end of the owner's call that made the row sampleable (ours: `rb.ingest()` / "
             "`RemoteIngress.ingest()`; TorchRL: the catch-up inside `sample()`). Other "
             "jobs on the host move the rows: the host's 1-minute load average was "
             f"{load_start:.1f} at the start and {os.getloadavg()[0]:.1f} at the end of this run."]
    if gpu:
        notes.append(f"Our buffer on {torch.cuda.get_device_name(device)}; its learner step is one CUDA-graph replay "
                     "(`lightning_per.graphs.capture` of sample 256 + update_priority), timed with CUDA events, each "
                     "under `torch.cuda.set_sync_debug_mode(\"error\")` while the writers ingest: `syncs_per_step` "
                     "is the share of steps that raised. TorchRL's rows keep their learner on the CPU: its shared "
                     "buffer is a host memmap storage.")
    for (kind, transport, w, b), r in sorted(by.items()):
        if transport == "shm" and (kind, "torchrl", w, b) in by and by[kind, "torchrl", w, b]["rows_per_s"]:
            notes.append(f"{kind}, W={w}, B={b}: shm / torchrl rows/s = "
                         f"{r['rows_per_s'] / by[kind, 'torchrl', w, b]['rows_per_s']:.2f}")
    learner = ("our learner's sample 256 + update (us, p50 and p99; ours one CUDA-graph replay, TorchRL's on the "
               "CPU)" if gpu else "the learner's sample 256 + update (us, p50 and p99)")
    return Results(rows=rows, table=table, metric="rows_per_s", plot=_plot(rows), notes="\n\n".join(notes),
                   title="Writer processes x batch size x transition kind: transitions/s made sampleable, "
                         f"write-to-sampleable latency (ms), {learner} idle and beside the writers.")
