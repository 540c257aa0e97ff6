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
wall time per step measured around the same loop (so wall - sum = gaps and host time). With ``--out X.txt``
it also writes ``X.json`` (the sections' rows) and ``X.png`` (device time per step, one stacked bar per
section); ``--replot X.txt`` rebuilds those two from a text report written earlier (e.g. on the GPU machine).

    python -m benchmarks.profile_kernels --capacity 1000000 --batch 256 --out /tmp/profile_kernels.txt
    python -m benchmarks.profile_kernels --replot /tmp/profile_kernels.txt
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import sys
import time
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from benchmarks._harness import host_profile  # noqa: E402
from benchmarks.replay import REPEAT, batch, fill, graph_step, step_fn  # noqa: E402


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


def parse(text: str) -> list[dict]:
    """The sections of a text report (:func:`render`'s format): ``[{"section", "wall_us", "kernels":
    [{"kernel", "calls_per_step", "mean_us"}]}]``."""
    sections = []
    for line in text.splitlines():
        head = re.match(r"== (.+): wall ([\d.]+) us/step, kernels ([\d.]+) us/step$", line)
        if head:
            sections.append({"section": head[1], "wall_us": float(head[2]), "kernels": []})
            continue
        row = re.match(r"\s*([\d.]+)\s+([\d.]+)  (\S.*)$", line)
        if row and sections:
            sections[-1]["kernels"].append({"kernel": row[3], "calls_per_step": float(row[1]),
                                            "mean_us": float(row[2])})
    return sections


def short_name(kernel: str) -> str:
    """A readable label: Triton kernels keep their name, ATen ones their functor (``AbsFunctor`` ...)."""
    if not kernel.startswith("void "):
        return kernel
    found = re.findall(r"(\w+Functor\w*|distribution\w*|CatArrayBatchedCopy|arange\w*|nan_to_num\w*)", kernel)
    return found[0] if found else kernel[5:40]


def plot(sections: list[dict], path: Path) -> None:
    """One stacked bar per section: device time per step of each kernel (one colour per kernel, in the
    legend), the step's wall time written after the bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(short_name(k["kernel"]) for sec in sections for k in sec["kernels"]))
    colours = {name: plt.get_cmap("tab10")(i % 10) for i, name in enumerate(names)}
    fig, ax = plt.subplots(figsize=(9, 1.8 + 0.6 * len(sections)))
    for y, sec in enumerate(sections):
        left = 0.0
        for k in sec["kernels"]:
            width = k["calls_per_step"] * k["mean_us"]
            ax.barh(y, width, left=left, color=colours[short_name(k["kernel"])], edgecolor="white")
            left += width
        ax.text(left + 0.3, y, f"{left:.1f} us of kernels; wall {sec['wall_us']:.1f} us/step", va="center",
                fontsize=8)
    ax.set_yticks(range(len(sections)), [s["section"][:40] for s in sections], fontsize=8)
    ax.set_xlabel("device time per step (us)")
    ax.set_xlim(0, 1.6 * max(sum(k["calls_per_step"] * k["mean_us"] for k in s["kernels"]) for s in sections))
    ax.invert_yaxis()
    ax.grid(True, axis="x", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[n]) for n in names]
    ax.legend(handles, names, fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_outputs(text: str, out: Path) -> None:
    """``out`` (.txt) and, beside it, ``.json`` and ``.png``."""
    out.write_text(text)
    sections = parse(text)
    out.with_suffix(".json").write_text(json.dumps({"sections": sections}, indent=1) + "\n")
    plot(sections, out.with_suffix(".png"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", default=None)
    ap.add_argument("--replot", default=None, help="a text report: write its .json and .png beside it")
    a = ap.parse_args(argv)
    if a.replot:
        path = Path(a.replot)
        write_outputs(path.read_text(), path)
        return 0
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
            report.append("== cProfile of 500 extends of 64 (eager launches)\n" + host_profile(extend, 500, 25))
        del rb
        gc.collect()  # the buffer and its cached graphs, freed before the next configuration
    print("\n\n".join(report), flush=True)
    if a.out:
        write_outputs("\n\n".join(report) + "\n", Path(a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
