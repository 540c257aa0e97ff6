"""Repeated ``python -m benchmarks run dqn --fit-only`` runs, pooled: the spread of each configuration and
the DDP scaling of the medians.

One ``dqn-fit`` run under ``Trainer.fit`` is host-bound (Lightning's loop, the env collection, one graph replay
per step) and moves with the host from run to run, so one 1-GPU run and one 2-GPU run make a noisy ratio.
This groups the runs' JSON files by configuration (the row name, i.e. Inductor / TF32 / updates per graph /
serial replay) and device count, and writes a Markdown table (every run's total updates/s, the median, the
spread as (max - min) / median) with the scaling of the medians (total updates/s at N devices / at 1 device),
plus a plot with one dot per run.

    python -m benchmarks.fit_runs /tmp/fit*/dqn-*.json --out /tmp/fit_runs.md
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path


def load(paths: list[str]) -> dict[tuple[str, int], list[float]]:
    """``{(row name, world size): [total updates/s of each run, in the order given]}``."""
    runs: dict[tuple[str, int], list[float]] = defaultdict(list)
    for path in paths:
        for row in json.loads(Path(path).read_text())["rows"]:
            runs[(row["impl"], int(row["world_size"]))].append(float(row["updates_per_s_total"]))
    return runs


def table(runs: dict[tuple[str, int], list[float]]) -> str:
    lines = ["| row | devices | runs: total updates/s | median | spread | scaling of medians |",
             "|---|---|---|---|---|---|"]
    for (name, world), values in sorted(runs.items()):
        med = statistics.median(values)
        one = runs.get((name, 1))
        scaling = f"{med / statistics.median(one):.2f}x" if one and world > 1 else ""
        lines.append(f"| {name} | {world} | {', '.join(f'{v:,.0f}' for v in values)} | {med:,.0f} "
                     f"| {(max(values) - min(values)) / med:.0%} | {scaling} |")
    return "\n".join(lines)


def plot(runs: dict[tuple[str, int], list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(runs)
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(keys) + 1.5))
    for y, key in enumerate(keys):
        values = runs[key]
        ax.scatter(values, [y] * len(values), color="tab:blue", zorder=3)
        ax.scatter([statistics.median(values)], [y], marker="|", s=400, color="black", zorder=4)
    ax.set_yticks(range(len(keys)), [f"{name}\n{world} device(s)" for name, world in keys], fontsize=7)
    ax.set_xlabel("total updates/s (one dot per run; bar: median)")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="dqn.py --fit-only JSON files")
    ap.add_argument("--out", default=None, help="Markdown file to write (+ a .png plot beside it)")
    a = ap.parse_args(argv)
    runs = load(a.runs)
    text = table(runs)
    print(text)
    if a.out:
        out = Path(a.out)
        out.write_text(text + "\n")
        plot(runs, out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
