"""Replay benchmark: one training-step's replay work (sample B + read the batch + update B priorities).

Rows, measured side by side in one process per implementation family:
  ours-eager        GPUPrioritizedReplayBuffer (proportional), eager; on a CPU its default serial layout
  ours-eager-parallel  the same in the parallel layout (``serial=False``, a GPU's blocks of ~sqrt(N) leaves): on a
                    CPU, what a CPU sampler ran before the serial layout (docs/replay.md, "On a CPU")
  ours-graph        the same step captured in one CUDA graph and replayed
  *-sample-update   the graph rows without the step's priority math: the new priorities are a given (B,)
                    tensor, so the graph holds only the replay's work (sample + read + update_priority)
  *-ordered         the same with ``shuffle_strata=False``: stratified draws in stratum order (the default
                    shuffles them on the device: with the kernels, one more launch draws the strata's order)
  ours-rank-eager   GPURankBasedSampler, eager (sort refreshed every update: the default); reference ops
  ours-rank-kernels-eager  the same with the compiled rank-sample kernel (the sort is torch.sort in both)
  *-eager           eager calls on CUDA replay the sampler's cached CUDA graphs (``eager_graphs=True``, the
                    default: the proportional draws and, the ring being full, the priority writes and the
                    rank sampler's re-sort + draw); ``ours-kernels-eager-launches`` is the same buffer with
                    ``eager_graphs=False`` (every kernel launched from the host)
  ours-kernels-*    the same with the compiled ext/ kernels (CUDA only); the
                    graph rows run what the buffer runs (draw + row gather fused in one launch with the packed
                    storage; the batch's fields views of the gathered rows, as the DQN's graph mode reads
                    them), the *-unfused rows the former sampler.sample + storage.get (two launches), the
                    *-contiguous rows the fields copied into tensors of their own (one more kernel: rb.sample())
  torchrl-per       TorchRL TensorDictPrioritizedReplayBuffer, LazyTensorStorage on the same device
  torchrl-uniform   TorchRL TensorDictReplayBuffer + RandomSampler
  bare-gather       torch.randint + index of the raw tensors (the floor)
plus extend of 64 transitions, host syncs per step (torch.cuda.set_sync_debug_mode("warn")) and
memory per slot. On a CPU every row is measured at each of ``--threads`` intra-op thread counts (default 1 and
the interpreter's default), and ``--quick`` measures N = 1e6, B = 256: ours against TorchRL's C++ tree where a
laptop or CI starts. Transition: observation 51 f32, next_observation 51 f32, action i64, reward f32,
done bool (421 bytes).

Where TorchRL's C++ sum tree does not load against the installed torch, run ``--family torchrl`` in an
interpreter with a TorchRL that loads, ``--family ours`` in ours, and pool both with ``--merge``
(see benchmarks/README.md):

    python -m benchmarks run replay                                   # every family, this machine
    python -m benchmarks run replay --quick --out runs/bench          # smoke test, any machine
    python -m benchmarks run replay --family ours --out /tmp/ours
    python -m benchmarks run replay --merge /tmp/ours/replay-h200.json /tmp/torchrl/replay-h200.json
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch

from benchmarks._harness import REPEAT, capture, count_syncs, timed
from benchmarks._results import Results

OBS = 51
TRANSITION_BYTES = OBS * 4 * 2 + 8 + 4 + 1


def batch(n: int, device) -> TensorDict:  # noqa: F821
    from tensordict import TensorDict

    return TensorDict({"observation": torch.randn(n, OBS, device=device),
                       "next_observation": torch.randn(n, OBS, device=device),
                       "action": torch.randint(0, 45, (n,), device=device),
                       "reward": torch.randn(n, device=device),
                       "done": torch.zeros(n, dtype=torch.bool, device=device)}, [n], device=device)


def fill(rb, n: int, device) -> None:
    chunk = 1 << 16
    for start in range(0, n, chunk):
        rb.extend(batch(min(chunk, n - start), device))


def step_fn(rb, B: int):
    def step():
        data = rb.sample(B)
        rb.update_priority(data["index"], data["reward"].abs() + 0.01)
    return step


def graph_step(rb, B: int, device, repeat: int = 1, fused: bool = True, priority=None, contiguous: bool = False):
    """Capture ``repeat`` x (sample + read the batch + update_priority) in one CUDA graph; return replay.

    ``fused``: what the buffer does (``sampler.sample_gather``: with the packed storage and the kernels one
    launch draws and gathers); else the unfused sequence ``sampler.sample`` + ``storage.get`` (two launches).
    ``contiguous``: the fused batch's fields copied into tensors of their own (one more kernel, what
    ``rb.sample()`` returns); default False, views of the gathered rows, what the DQN's graph mode reads.
    ``priority``: a ``(B,)`` tensor of new priorities to write (the replay's own work only: sample + read +
    update, the ``-sample-update`` rows); default the step's ``reward.abs() + 0.01`` of the batch (two more
    kernels, the learner's side)."""
    sampler, storage = rb.sampler, rb.storage

    def body():
        for _ in range(repeat):
            if fused:  # ours, proportional: every sampler that reaches here has sample_gather
                index, info, data = sampler.sample_gather(storage, B, contiguous=contiguous)
            else:
                index, info = sampler.sample(storage, B)
                data = storage.get(index)
            new = data["reward"].abs() + 0.01 if priority is None else priority
            sampler.update_priority(index, new, storage=storage)
        return info["priority_weight"]

    return capture(body, [sampler.generator])


def graph_rows(rb, row: dict, name: str, B: int, device, iters: int, suffix: str = "", **kw) -> list[dict]:
    """Rows of the step (variant ``kw`` of :func:`graph_step`) in one graph per step and REPEAT per graph (the
    host's graph-launch cost amortised), named after the eager row ``name`` with ``graph[-xREPEAT]{suffix}``."""
    replay = graph_step(rb, B, device, **kw)
    one = timed(replay, iters * 4, device) * 1e6
    replay = graph_step(rb, B, device, REPEAT, **kw)
    many = timed(replay, iters, device) / REPEAT * 1e6
    return [{**row, "impl": name.replace("eager", f"graph{suffix}"), "step_us": one, "syncs_per_step": 0.0},
            {**row, "impl": name.replace("eager", f"graph-x{REPEAT}{suffix}"), "step_us": many, "syncs_per_step": 0.0}]


def ours_rows(N: int, B: int, device, iters: int) -> list[dict]:
    from lightning_per import make_replay_buffer

    rows = []
    for name, kind, backend, eager_graphs, shuffle in (
            ("ours-eager", "proportional", "reference", True, True),
            ("ours-eager-parallel", "proportional", "reference", True, True),
            ("ours-eager-ordered", "proportional", "reference", True, False),
            ("ours-rank-eager", "rank", "reference", True, True),
            ("ours-rank-kernels-eager", "rank", "kernels", True, True),
            ("ours-kernels-eager", "proportional", "kernels", True, True),
            ("ours-kernels-eager-ordered", "proportional", "kernels", True, False),
            ("ours-kernels-eager-launches", "proportional", "kernels", False, True)):
        if backend == "kernels" and device.type != "cuda":
            continue
        if name == "ours-eager-parallel" and device.type == "cuda":  # the CUDA sampler's layout already
            continue
        layout = {"serial": False} if name == "ours-eager-parallel" else {}
        if device.type == "cuda":  # the previous buffer (held by reference cycles of its graphs) freed first
            gc.collect()
            torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        rb = make_replay_buffer(N, B, sampler=kind, device=device, backend=backend, packed=True,  # one gather
                                eager_graphs=eager_graphs, generator=torch.Generator().manual_seed(0),
                                shuffle_strata=shuffle, **layout)
        fill(rb, N, device)
        mem = (torch.cuda.memory_allocated(device) - base) / N if device.type == "cuda" else float("nan")
        step = step_fn(rb, B)
        ext = batch(64, device)
        row = {"impl": name, "N": N, "B": B, "step_us": timed(step, iters, device) * 1e6,
               "syncs_per_step": count_syncs(step, 50, device),
               "extend64_us": timed(lambda rb=rb, ext=ext: rb.extend(ext), iters, device) * 1e6,
               "bytes_per_slot": mem, "transition_bytes": TRANSITION_BYTES}
        rows.append(row)
        if device.type == "cuda" and kind == "proportional" and eager_graphs:
            rows += graph_rows(rb, row, name, B, device, iters)
            if backend == "kernels" and shuffle:  # the replay's own work: new priorities given (no priority math)
                given = torch.rand(B, device=device, generator=torch.Generator(device=device).manual_seed(1)) + 0.01
                rows += graph_rows(rb, row, name, B, device, iters, "-sample-update", priority=given)
                rows += graph_rows(rb, row, name, B, device, iters, "-unfused", fused=False)  # two launches
                rows += graph_rows(rb, row, name, B, device, iters, "-contiguous", contiguous=True)  # + one copy
        del rb
    # the floor: uniform indices + gather of the raw tensors
    data = batch(N, device)
    gen = torch.Generator(device=device).manual_seed(0)
    flat = {k: v for k, v in data.items()}

    def bare():
        idx = torch.randint(0, N, (B,), device=device, generator=gen)
        return [v[idx] for v in flat.values()]

    rows.append({"impl": "bare-gather", "N": N, "B": B, "step_us": timed(bare, iters, device) * 1e6,
                 "syncs_per_step": count_syncs(bare, 50, device)})
    if device.type == "cuda":
        replay = capture(lambda: [bare() for _ in range(REPEAT)], [gen])
        rows.append({"impl": f"bare-gather-graph-x{REPEAT}", "N": N, "B": B,
                     "step_us": timed(replay, iters, device) / REPEAT * 1e6, "syncs_per_step": 0.0})
        tick = torch.zeros(1, device=device)
        replay = capture(lambda: tick.add_(1))  # one tiny kernel: what one graph launch costs the host
        rows.append({"impl": "graph-launch-floor", "N": N, "B": B,
                     "step_us": timed(replay, iters * 4, device) * 1e6, "syncs_per_step": 0.0})
    return rows


def torchrl_rows(N: int, B: int, device, iters: int) -> list[dict]:
    from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer, TensorDictReplayBuffer

    rows = []
    for name in ("torchrl-per", "torchrl-uniform"):
        if name == "torchrl-per":
            rb = TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(N, device=device),
                                                   batch_size=B)
            step = step_fn(rb, B)
        else:
            rb = TensorDictReplayBuffer(storage=LazyTensorStorage(N, device=device), batch_size=B)

            def step(rb=rb):
                rb.sample(B)
        fill(rb, N, device)
        ext = batch(64, device)
        rows.append({"impl": name, "N": N, "B": B, "step_us": timed(step, iters, device) * 1e6,
                     "syncs_per_step": count_syncs(step, 50, device),
                     "extend64_us": timed(lambda rb=rb, ext=ext: rb.extend(ext),
                                                    max(iters // 4, 10), device) * 1e6})
        del rb
    return rows


def table(rows: list[dict]) -> str:
    def num(r, key, fmt):
        value = r.get(key)
        return format(float("nan") if value is None else value, fmt)

    lines = ["| impl | N | B | threads | step (us) | syncs/step | extend 64 (us) | bytes/slot |",
             "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["N"], r["B"], r.get("threads") or 0, r["impl"])):
        lines.append(f"| {r['impl']} | {r['N']:.0e} | {r['B']} | {r.get('threads') or '-'} | {r['step_us']:.1f} "
                     f"| {num(r, 'syncs_per_step', '.2f')} | {num(r, 'extend64_us', '.1f')} "
                     f"| {num(r, 'bytes_per_slot', '.1f')} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Bs = sorted({r["B"] for r in rows})
    fig, axes = plt.subplots(1, len(Bs), figsize=(5 * len(Bs), 4), squeeze=False)
    for ax, B in zip(axes[0], Bs):
        for impl in sorted({r["impl"] for r in rows}):
            pts = sorted((r["N"], r["step_us"]) for r in rows if r["impl"] == impl and r["B"] == B)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=impl)
        ax.set(xscale="log", yscale="log", xlabel="capacity N", ylabel="us per step (sample+read+update)",
               title=f"B = {B}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def add_arguments(ap) -> None:
    ap.add_argument("--family", choices=["ours", "torchrl", "all"], default="all",
                    help="implementations to run (default all; torchrl rows are skipped where TorchRL's "
                         "prioritized buffer does not load)")
    ap.add_argument("--sizes", default=None,
                    help="capacities N, comma-separated (default 1e6,1e7 on CUDA, 1e4,1e5 on CPU; --quick: 1e3 on "
                         "CUDA, 1e6 on CPU)")
    ap.add_argument("--batches", default=None, help="batch sizes B, comma-separated (default 256; --quick on CUDA: 32)")
    ap.add_argument("--iters", type=int, default=None, help="timed steps per row (default 200; --quick: 5 on a GPU, "
                                                               "50 on a CPU)")
    ap.add_argument("--threads", default=None,
                    help="on a CPU: intra-op thread counts, comma-separated, each row measured at each (default 1 "
                         "and the interpreter's default, torch.get_num_threads() at start)")
    ap.add_argument("--merge", nargs="*", default=None,
                    help="results JSON files of earlier runs (e.g. each family in its own interpreter): "
                         "one table of all their rows, nothing measured")


def run(args) -> Results:
    """Measure the rows for every (N, B); or, with ``--merge``, pool earlier runs' rows."""
    if args.merge:
        rows = [r for f in args.merge for r in json.loads(Path(f).read_text())["rows"]]
    else:
        device = torch.device(args.device)
        cuda = device.type == "cuda"
        if args.quick:  # a GPU: a smoke test; a CPU: the one size where laptops and CI meet TorchRL's tree
            sizes, batches, iters = ("1e3", "32", 5) if cuda else ("1e6", "256", 50)
        else:
            sizes, batches, iters = ("1e6,1e7" if cuda else "1e4,1e5"), "256", 200
        sizes, batches, iters = args.sizes or sizes, args.batches or batches, args.iters or iters
        default_threads = torch.get_num_threads()
        threads = [None] if cuda else sorted({int(t) for t in (args.threads or f"1,{default_threads}").split(",")})
        families = ("ours", "torchrl") if args.family == "all" else (args.family,)
        rows = []
        for N in [int(float(s)) for s in sizes.split(",")]:
            for B in [int(b) for b in batches.split(",")]:
                for n_threads in threads:
                    if n_threads is not None:
                        torch.set_num_threads(n_threads)
                    for family in families:
                        fn = ours_rows if family == "ours" else torchrl_rows
                        try:
                            rows += [{**r, "threads": n_threads} for r in fn(N, B, device, iters)]
                        except (ImportError, RuntimeError) as err:  # e.g. TorchRL's C++ tree missing for this torch
                            print(f"{family} rows skipped ({type(err).__name__}: {err})", file=sys.stderr)
                print(table([r for r in rows if r["N"] == N and r["B"] == B]), flush=True)
        torch.set_num_threads(default_threads)
    return Results(rows=rows, table=table(rows), plot=lambda path: plot(rows, path),
                   title="One replay step = sample B + read the batch + update B priorities: microseconds per step "
                         "(CUDA events on a GPU, wall clock on a CPU), host syncs per step, extend of 64 "
                         "transitions, memory per slot.",
                   notes=ratios(rows))


def ratios(rows: list[dict]) -> str:
    """Ratios of rows of this run, per (N, B): TorchRL's prioritized step / ours in one graph and eager."""
    lines = []
    for N, B, threads in sorted({(r["N"], r["B"], r.get("threads") or 0) for r in rows}):
        by = {r["impl"]: r["step_us"] for r in rows
              if r["N"] == N and r["B"] == B and (r.get("threads") or 0) == threads}
        ref = by.get("torchrl-per")
        where = f"N = {N:.0e}, B = {B}" + (f", {threads} thread{'s' * (threads > 1)}" if threads else "")
        for impl in ("ours-kernels-graph", "ours-kernels-eager", "ours-eager", "ours-eager-parallel"):
            if ref and impl in by:
                lines.append(f"- {where}: torchrl-per / {impl} = {ref / by[impl]:.2f}x "
                             f"({impl} / torchrl-per = {by[impl] / ref:.2f}x)")
    return "\n".join(lines)
