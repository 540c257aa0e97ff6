"""Many writers, one buffer: transitions/s ingested, write-to-sampleable latency, the learner's step beside them.

Writer processes (``spawn``, one pool reused by every row) send batches of B small transitions (obs 4 float32,
action int64, reward float32, a writer id and the writer's ``time.monotonic_ns()``) for ``--seconds`` while the
owner (this process) makes them sampleable and runs its learner step, one sample of 256 + one priority update of
random values. Rows, per number of writers W and batch size B, measured in one run:

  shm        ours: ``rb.writer_handle()`` shared-memory rings, ``rb.ingest()`` (make_replay_buffer, proportional)
  gloo       ours: ``RemoteWriter`` -> ``RemoteIngress`` over Gloo point-to-point on loopback TCP, same buffer kind
  torchrl    TorchRL's own shared buffer: ``TensorDictPrioritizedReplayBuffer(LazyMemmapStorage, sync=False,
             shared=True)``; writers ``extend`` it under its shared lock, the learner's sampler catches up

Columns: ``rows_per_s`` (transitions made sampleable per second of the run), ``lat_p50_ms`` / ``lat_p99_ms``
(from the writer's timestamp to the end of the owner's call that made the row sampleable; both clocks are the
host's CLOCK_MONOTONIC; at most the last CAPACITY rows of a loop are still stored to be read), ``learn_idle_us``
(median learner step with no writer running) and ``learn_busy_us`` (the median step while the writers run; the
owner's explicit ingest is outside it, though our ``sample()`` ingests what arrived since).

    python -m benchmarks run writers --device cpu                  # W = 1, 2, 4, 8, 16; B = 64, 1024
    python -m benchmarks run writers --quick --device cpu           # W = 1, 2; B = 64 (CI)
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import tempfile
import time

import numpy as np
import torch

from benchmarks._results import Results, markdown_table

TRANSPORTS = ("shm", "gloo", "torchrl")
LEARN_B = 256
CAPACITY = 1 << 17  # transitions in each buffer (ours and TorchRL's alike)


def add_arguments(parser) -> None:
    parser.add_argument("--writers", type=int, nargs="+", default=None, help="writer counts (default 1 2 4 8 16)")
    parser.add_argument("--batches", type=int, nargs="+", default=None, help="batch sizes (default 64 1024)")
    parser.add_argument("--seconds", type=float, default=None, help="seconds of writing per row (default 2)")
    parser.add_argument("--transports", nargs="+", default=list(TRANSPORTS), choices=TRANSPORTS)


def _batch(b: int, wid: int):
    from tensordict import TensorDict

    return TensorDict({"obs": torch.randn(b, 4), "action": torch.zeros(b, dtype=torch.int64),
                       "reward": torch.zeros(b), "writer": torch.full((b,), wid, dtype=torch.int64),
                       "t_ns": torch.zeros(b, dtype=torch.int64)}, [b])


def _worker(wid: int, commands, results, running, torchrl_rb) -> None:
    """A pool process: for each command, write batches while ``running`` holds the command's run id."""
    torch.set_num_threads(1)
    from lightning_per import RemoteWriter

    results.put(("up", wid))  # imports done: the rows measure nothing of this process's start
    while True:
        cmd = commands.get()
        if cmd is None:
            return
        kind, run_id, b, arg = cmd
        td = _batch(b, wid)
        writer = None
        if kind == "shm":
            sink = arg.write
        elif kind == "torchrl":
            sink = torchrl_rb.extend
        else:
            writers, port = arg
            writer = RemoteWriter(wid + 1, writers, addr="127.0.0.1", port=port, credits=4, timeout=120.0)
            sink = writer.write
        results.put(("ready", wid))
        while running.value not in (run_id, -1):
            time.sleep(1e-3)
        rows = 0
        while running.value == run_id:
            td["t_ns"].fill_(time.monotonic_ns())
            sink(td)
            rows += b
        if writer is not None:
            writer.close()
        if kind == "shm":
            arg.close()
        results.put(("done", wid, rows))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _learn(rb, gen: torch.Generator) -> float:
    """One learner step (sample 256, update their priorities with random values): seconds."""
    t0 = time.perf_counter()
    td = rb.sample(LEARN_B)
    rb.update_priority(td["index"], torch.rand(LEARN_B, generator=gen) + 0.1)
    return time.perf_counter() - t0


def _idle_us(rb, gen, steps: int) -> float:
    _learn(rb, gen)
    return 1e6 * float(np.median([_learn(rb, gen) for _ in range(steps)]))


class _Pool:
    def __init__(self, n: int, torchrl_rb) -> None:
        ctx = mp.get_context("spawn")
        self.running = ctx.Value("q", 0, lock=False)
        self.results = ctx.Queue()
        self.commands = [ctx.Queue() for _ in range(n)]
        self.procs = [ctx.Process(target=_worker, args=(w, self.commands[w], self.results, self.running, torchrl_rb),
                                  daemon=True) for w in range(n)]
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


def _row(kind: str, pool: _Pool, writers: int, b: int, seconds: float, run_id: int, torchrl_rb, quick: bool):
    from lightning_per import RemoteIngress, make_replay_buffer

    gen = torch.Generator().manual_seed(run_id)
    example = _batch(1, 0)
    owner = None
    if kind == "torchrl":
        rb = torchrl_rb
        args = [None] * writers
    else:
        rb = make_replay_buffer(CAPACITY, LEARN_B, sampler="proportional", device="cpu")
        rb.extend(_batch(4 * LEARN_B, -1))
        if kind == "shm":
            args = [rb.writer_handle(example, slots=8, rows=b) for _ in range(writers)]
        else:
            port = _free_port()
            args = [(writers, port)] * writers
    idle_us = _idle_us(rb, gen, 20 if quick else 100)
    for w in range(writers):
        pool.commands[w].put((kind, run_id, b, args[w]))
    if kind == "gloo":
        owner = RemoteIngress(rb, writers, example=example, addr="127.0.0.1", port=port, timeout=120.0)
    for _ in range(writers):
        assert pool.results.get(timeout=600)[0] == "ready"

    def sampleable() -> int:
        """Make what the writers sent sampleable; returns the rows that became so."""
        if kind == "shm":
            return rb.ingest()
        if kind == "gloo":
            return owner.ingest()
        return 0  # TorchRL's learner catches up inside sample(): rows count through write_count

    first = seen = rb.write_count
    latencies, busy = [], []
    pool.running.value = run_id
    start = time.perf_counter()
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        sampleable()
        busy.append(_learn(rb, gen))
        now = time.monotonic_ns()
        count = rb.write_count
        if count < CAPACITY:  # TorchRL counts rows before its storage holds them: those are not sampleable yet
            count = min(count, len(rb))
        new = count - seen
        if new > 0:  # the stamps of (a subsample of) the rows that became sampleable and are still stored
            slots = (torch.arange(max(seen, count - CAPACITY), count) % CAPACITY)[:: max(1, new // 256)]
            stamps = rb.storage[slots]["t_ns"]
            latencies.append((now - stamps[stamps > 0]).double() / 1e6)
        seen = count
    elapsed = time.perf_counter() - start
    pool.running.value = 0
    sent = finished = 0
    while finished < writers:  # writers blocked on a full ring or unacknowledged batches need the owner
        sampleable()
        while not pool.results.empty():
            sent += pool.results.get()[2]
            finished += 1
        time.sleep(1e-3)
    sampleable()
    if owner is not None:
        owner.close()
    if kind == "shm":
        rb.close_writers()
    lat = torch.cat(latencies) if latencies else torch.full((1,), float("nan"), dtype=torch.float64)
    return {"impl": f"{kind}-W{writers}-B{b}", "transport": kind, "writers": writers, "batch": b,
            "rows_per_s": round((seen - first) / elapsed), "lat_p50_ms": round(float(lat.quantile(0.5)), 3),
            "lat_p99_ms": round(float(lat.quantile(0.99)), 3), "learn_idle_us": round(idle_us, 1),
            "learn_busy_us": round(1e6 * float(np.median(busy)), 1)}


def _torchrl_buffer(scratch: str):
    """TorchRL's shared prioritized buffer: memmap storage (initialised here, so writers share its files),
    ``sync=False`` (writers sample uniformly, the learner's sampler catches up), a process-shared write lock."""
    from torchrl.data import LazyMemmapStorage, TensorDictPrioritizedReplayBuffer

    storage = LazyMemmapStorage(CAPACITY, scratch_dir=scratch)
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=storage, sync=False, shared=True,
                                           batch_size=LEARN_B)
    rb.extend(_batch(4 * LEARN_B, -1))
    return rb


def _plot(rows):
    def draw(path):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for kind in TRANSPORTS:
            for b in sorted({r["batch"] for r in rows}):
                sel = [r for r in rows if r["transport"] == kind and r["batch"] == b]
                if sel:
                    w = [r["writers"] for r in sel]
                    axes[0].plot(w, [r["rows_per_s"] for r in sel], marker="o", label=f"{kind} B={b}")
                    axes[1].plot(w, [r["lat_p99_ms"] for r in sel], marker="o", label=f"{kind} B={b}")
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
    if args.device != "cpu":
        raise SystemExit("writers: the CPU suite (--device cpu); the GPU rows belong to the GPU run")
    writers = args.writers or ([1, 2] if args.quick else [1, 2, 4, 8, 16])
    batches = args.batches or ([64] if args.quick else [64, 1024])
    seconds = args.seconds or (0.5 if args.quick else 2.0)
    torch.set_num_threads(1)
    load_start = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="lper-writers-") as scratch:
        torchrl_rb = _torchrl_buffer(scratch)
        from lightning_per import make_replay_buffer

        warm = make_replay_buffer(CAPACITY, LEARN_B, sampler="proportional", device="cpu")
        warm.extend(_batch(4 * LEARN_B, -1))
        for rb in (warm, torchrl_rb):  # first calls (allocations, lazy inits) outside every row
            _idle_us(rb, torch.Generator().manual_seed(0), 20)
        pool = _Pool(max(writers), torchrl_rb)
        try:
            run_id = 0
            for kind in args.transports:
                for b in batches:
                    for w in writers:
                        run_id += 1
                        rows.append(_row(kind, pool, w, b, seconds, run_id, torchrl_rb, args.quick))
                        print(rows[-1], flush=True)
        finally:
            pool.close()
    table = markdown_table(rows)
    by = {(r["transport"], r["writers"], r["batch"]): r for r in rows}
    notes = [f"{os.cpu_count()} CPU cores shared by the owner and every writer process; {seconds} s of writing per "
             "row. Latency: writer's timestamp to the end of the owner's call that made the row sampleable "
             "(ours: `rb.ingest()` / `RemoteIngress.ingest()`; TorchRL: the catch-up inside `sample()`). A full "
             "run takes a few minutes on 2 cores; other jobs on the host move the rows: the host's 1-minute load "
             f"average was {load_start:.1f} at the start and {os.getloadavg()[0]:.1f} at the end of this run."]
    for (kind, w, b), r in sorted(by.items()):
        if kind == "shm" and ("torchrl", w, b) in by and by["torchrl", w, b]["rows_per_s"]:
            notes.append(f"W={w}, B={b}: shm / torchrl rows/s = "
                         f"{r['rows_per_s'] / by['torchrl', w, b]['rows_per_s']:.2f}")
    return Results(rows=rows, table=table, metric="rows_per_s", plot=_plot(rows), notes="\n\n".join(notes),
                   title="Writer processes x batch size: transitions/s made sampleable, write-to-sampleable latency "
                         "(ms), the learner's sample 256 + update (us) idle and beside the writers.")
