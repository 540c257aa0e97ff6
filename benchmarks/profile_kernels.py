"""Device time per kernel of one replay step, and host time per function of one extend (CUDA only).

``benchmarks/replay.py`` reports what a step costs end to end; this script says where the device time
inside it goes. For the buffer the benchmark builds (packed storage, ``backend="kernels"``, N
transitions, batch B) it records with ``torch.profiler`` (CUPTI kernel records: device execution time,
without the launch gaps between kernels):

* ``graph-x16``: 16 x (``sample_gather`` + the new priorities + ``update_priority``) captured in one CUDA
  graph, replayed ``--reps`` times (the kernels of a graph replay are recorded one by one);
* ``eager-launches``: the same step with ``eager_graphs=False`` (every kernel launched from the host);
* ``extend64``: ``rb.extend`` of 64 transitions (full ring), plus a cProfile listing of its host time.

Per section it prints each kernel's calls per step and mean device time (us), their sum, and the step's
wall time per step measured around the same loop (so wall - sum = gaps and host time).

    python benchmarks/profile_kernels.py --capacity 1000000 --batch 256 --out /tmp/profile_kernels.txt
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import sys
import time
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay import REPEAT, batch, fill, graph_step, step_fn  # noqa: E402


def kernel_table(fn, reps: int, per_call: int) -> tuple[list[tuple[str, float, float]], float]:
    """``([(kernel, calls per step, mean us)], wall us per step)`` of ``reps`` calls of ``fn``, each
    ``per_call`` steps."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / (reps * per_call) * 1e6
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    totals: dict[str, list[float]] = {}
    for ev in prof.events():
        if ev.device_type == DeviceType.CUDA and ev.device_time_total > 0:
            entry = totals.setdefault(ev.name, [0, 0.0])
            entry[0] += 1
            entry[1] += ev.device_time_total
    steps = reps * per_call
    rows = sorted(((name, n / steps, total / n) for name, (n, total) in totals.items()),
                  key=lambda r: -r[1] * r[2])
    return rows, wall


def render(title: str, rows, wall: float) -> str:
    lines = [f"== {title}: wall {wall:.1f} us/step, kernels {sum(c * t for _, c, t in rows):.1f} us/step",
             f"{'calls/step':>10} {'mean us':>8}  kernel"]
    lines += [f"{c:10.2f} {t:8.2f}  {name[:110]}" for name, c, t in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_kernels.py needs CUDA", file=sys.stderr)
        return 2
    from lightning_per import make_replay_buffer

    device = torch.device("cuda")
    report = []
    for eager_graphs in (True, False):
        rb = make_replay_buffer(a.capacity, a.batch, sampler="proportional", device=device, backend="kernels",
                                packed=True, eager_graphs=eager_graphs,
                                generator=torch.Generator().manual_seed(0))
        fill(rb, a.capacity, device)
        if eager_graphs:
            replay = graph_step(rb, a.batch, device, REPEAT)
            report.append(render(f"graph-x{REPEAT} step (N={a.capacity}, B={a.batch})",
                                 *kernel_table(replay, a.reps, REPEAT)))
        else:
            report.append(render("eager-launches step", *kernel_table(step_fn(rb, a.batch), a.reps, 1)))
            new = batch(64, device)

            def extend(rb=rb, new=new):
                rb.extend(new)

            report.append(render("extend64 (eager launches)", *kernel_table(extend, a.reps, 1)))
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(500):
                extend()
            pr.disable()
            text = io.StringIO()
            pstats.Stats(pr, stream=text).sort_stats("tottime").print_stats(25)
            report.append("== cProfile of 500 extends of 64 (eager launches)\n" + text.getvalue())
        del rb
        gc.collect()  # the buffer and its cached graphs, freed before the next configuration
    print("\n\n".join(report), flush=True)
    if a.out:
        Path(a.out).write_text("\n\n".join(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
