"""Slice samplers: one sequence-replay step (sample S slices of T + read them + update S*T priorities).

Rows, measured side by side in one process, per capacity N (default S = 256 slices of T = 16, 4,096
transitions, at N = 1e6 and 1e7 on CUDA):
  ours-prioritized-graph        GPUPrioritizedSliceSampler (slice_priority="start", TorchRL's rule): sample +
                                read + update_priority captured in one CUDA graph and replayed
  ours-prioritized-max-graph    the same with slice_priority="max" (a start ranked by its slice's max priority)
  ours-prioritized-eager        the "start" step, eager
  ours-uniform-graph            GPUSliceSampler: sample + read in one CUDA graph (no priorities)
  torchrl-prioritized-slice     TorchRL's PrioritizedSliceSampler + TensorDictReplayBuffer, LazyTensorStorage on
                                the same device, eager (its draws run on the CPU sum tree)
  torchrl-slice                 TorchRL's SliceSampler, same storage, sample + read
  *-no-markers                  the TorchRL rows with truncated_key=None, where TorchRL's version cannot build the
                                truncated markers of a CUDA storage (its index on the CPU, the storage on the GPU)
plus the extend of 64 transitions and host syncs per step (``torch.cuda.set_sync_debug_mode("warn")``).
Transition: observation 4 float32, action int64, reward float32, ("next", "done") bool; episodes of
50-450 steps (uniform), so N = 1e7 holds ~40,000 trajectories.

    python -m benchmarks run slice                  # N = 1e6, 1e7 on CUDA
    python -m benchmarks run slice --quick --device cpu --out runs/bench

Where TorchRL's C++ sum tree loads only in another interpreter (its wheel built for another torch), run
``--family ours`` and ``--family torchrl --out other/`` there, then ``--merge a.json b.json`` (one table).
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch

from benchmarks._harness import capture, count_syncs, timed
from benchmarks._results import Results, markdown_table


def transitions(n: int, device, generator: torch.Generator) -> TensorDict:  # noqa: F821
    from tensordict import TensorDict

    lengths = torch.randint(50, 451, (n // 50 + 2,), generator=generator)
    ends = torch.cumsum(lengths, 0)
    ends = ends[ends <= n] - 1
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[ends] = True
    return TensorDict({"observation": torch.randn(n, 4, generator=generator),
                       "action": torch.randint(0, 2, (n,), generator=generator),
                       "reward": torch.randn(n, generator=generator),
                       ("next", "done"): done}, [n]).to(device)


def fill(rb, n: int, device) -> None:
    gen = torch.Generator().manual_seed(0)
    chunk = 1 << 18
    for start in range(0, n, chunk):
        rb.extend(transitions(min(chunk, n - start), device, gen))


def ours(kind: str, N: int, T: int, S: int, device, rule: str = "start"):
    from lightning_per import make_replay_buffer

    extra = {"slice_priority": rule} if kind == "prioritized_slice" else {}
    rb = make_replay_buffer(N, S * T, sampler=kind, device=device, slice_len=T, alpha=0.6, beta=0.4,
                            generator=torch.Generator().manual_seed(0), **extra)
    fill(rb, N, device)
    rb.sample()  # builds the start mask for T and checks once that a slice exists (outside the timed steps)
    return rb


def torchrl_buffer(prioritized: bool, N: int, T: int, S: int, device, truncated_key=("next", "truncated")):
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import PrioritizedSliceSampler, SliceSampler

    kw = dict(slice_len=T, end_key=("next", "done"), truncated_key=truncated_key)
    sampler = PrioritizedSliceSampler(N, 0.6, 0.4, **kw) if prioritized else SliceSampler(**kw)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(N, device=device), sampler=sampler, batch_size=S * T)
    fill(rb, N, device)
    rb.sample()  # fails here where this TorchRL version cannot sample slices from this storage
    return rb


def step_fn(rb, prioritized: bool, priority: torch.Tensor):
    def step():
        data = rb.sample()
        if prioritized:
            rb.update_priority(data["index"], priority)
    return step


def graph_fn(rb, prioritized: bool, priority: torch.Tensor, B: int):
    sampler, storage = rb.sampler, rb.storage

    def step():
        index, info = sampler.sample(storage, B)
        storage.get(index)
        if prioritized:
            sampler.update_priority(index, priority, storage=storage)

    generators = sampler.capture_view(None, B // sampler.slice_len).generators if prioritized else [sampler.generator]
    return capture(step, generators)


def extend_fn(rb, device):
    data = transitions(64, device, torch.Generator().manual_seed(1))
    return lambda: rb.extend(data)


def measure(N: int, T: int, S: int, device, iters: int, torchrl_iters: int, families=("ours", "torchrl")
            ) -> list[dict]:
    cuda = device.type == "cuda"
    B = S * T
    priority = torch.rand(B, device=device) + 0.01
    rows = []

    def row(impl, fn, n, ext=None, syncs=True):
        us = timed(fn, n, device) * 1e6
        r = {"impl": impl, "N": N, "S": S, "T": T, "step_us": us,
             "syncs_per_step": count_syncs(fn, min(n, 20), device) if syncs else None}
        if ext is not None:
            r["extend64_us"] = timed(ext, max(n // 4, 3), device) * 1e6
        rows.append(r)
        print(r, flush=True)

    ours_rows = (("prioritized_slice", "start", "ours-prioritized"), ("prioritized_slice", "max",
                 "ours-prioritized-max"), ("slice", None, "ours-uniform")) if "ours" in families else ()
    for kind, rule, impl in ours_rows:
        prioritized = kind == "prioritized_slice"
        rb = ours(kind, N, T, S, device, rule or "start")
        if cuda:
            row(f"{impl}-graph", graph_fn(rb, prioritized, priority, B), iters, syncs=True)
        if rule != "max":
            row(f"{impl}-eager", step_fn(rb, prioritized, priority), iters, extend_fn(rb, device))
        del rb
        gc.collect()
    theirs = ((True, "torchrl-prioritized-slice"), (False, "torchrl-slice")) if "torchrl" in families else ()
    for prioritized, impl in theirs:
        try:
            rb = torchrl_buffer(prioritized, N, T, S, device)
        except ImportError as err:  # e.g. TorchRL's C++ sum tree not built for this torch
            print(f"{impl} skipped ({type(err).__name__}: {err})", file=sys.stderr)
            continue
        except RuntimeError as err:  # e.g. a device mismatch building the truncated markers of a CUDA storage
            print(f"{impl}: {type(err).__name__}: {err}; measured with truncated_key=None", file=sys.stderr)
            impl += "-no-markers"
            rb = torchrl_buffer(prioritized, N, T, S, device, truncated_key=None)
        row(impl, step_fn(rb, prioritized, priority), torchrl_iters, extend_fn(rb, device), syncs=False)
        del rb
        gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return rows


def ratios(rows: list[dict]) -> str:
    lines = []
    for N in sorted({r["N"] for r in rows}):
        by = {r["impl"]: r["step_us"] for r in rows if r["N"] == N}
        for base, mine in (("torchrl-prioritized-slice", ("ours-prioritized-graph", "ours-prioritized-eager")),
                           ("torchrl-slice", ("ours-uniform-graph", "ours-uniform-eager"))):
            name = base if base in by else f"{base}-no-markers"
            for impl in mine:
                if name in by and impl in by:
                    lines.append(f"- N = {N:,}: {name} / {impl} = {by[name] / by[impl]:.0f}x")
    return "Ratios of this run:\n\n" + "\n".join(lines) if lines else ""


def add_arguments(ap) -> None:
    ap.add_argument("--sizes", default=None, help="capacities N, comma-separated (default 1e6,1e7 on CUDA, 1e5 "
                                                  "on CPU)")
    ap.add_argument("--slices", type=int, default=256, help="slices per batch S (default %(default)s)")
    ap.add_argument("--slice-len", type=int, default=16, help="slice length T (default %(default)s)")
    ap.add_argument("--iters", type=int, default=200, help="timed steps per row of ours")
    ap.add_argument("--torchrl-iters", type=int, default=5, help="timed steps per TorchRL row")
    ap.add_argument("--family", choices=["ours", "torchrl", "all"], default="all",
                    help="implementations to run (TorchRL's C++ sum tree may load only in another interpreter: run "
                         "each family there, then --merge)")
    ap.add_argument("--merge", nargs="*", default=None,
                    help="results JSON files of earlier runs: one table of all their rows, nothing measured")


def run(args) -> Results:
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    sizes = "2e4" if args.quick else args.sizes or ("1e6,1e7" if cuda else "1e5")
    S, T = (16, 8) if args.quick else (args.slices, args.slice_len)
    iters = 5 if args.quick else args.iters
    t_iters = 2 if args.quick else args.torchrl_iters
    families = ("ours", "torchrl") if args.family == "all" else (args.family,)
    rows = []
    if args.merge:
        rows = [r for f in args.merge for r in json.loads(Path(f).read_text())["rows"]]
    else:
        for N in [int(float(s)) for s in sizes.split(",")]:
            rows += measure(N, T, S, device, iters, t_iters, families)
    columns = ["impl", "N", "S", "T", "step_us", "syncs_per_step", "extend64_us"]
    return Results(rows=rows, table=markdown_table(rows, columns), metric="step_us",
                   title="One sequence-replay step = sample S slices of T + read them + update S*T priorities "
                         "(uniform rows: no update): microseconds per step (CUDA events on a GPU, wall clock on a "
                         "CPU), host syncs per step, extend of 64 transitions.",
                   notes=ratios(rows))
