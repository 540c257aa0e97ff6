"""Before/after: the same suite run alternately on two trees (two commits, each in its own interpreter), pooled.

A code change's effect on a GPU step is a few microseconds against a run-to-run spread of about as much, so one
run of each tree proves nothing. This pools the ``rows`` of several runs of each tree by row (``impl`` and the
size columns present: ``N``, ``B``, ``S``, ``T``, ``K``), and writes, per row, every run's value, the median and
the range of each tree, the ratio of the medians (after / before) and whether the after-median lies outside the
before-range in the bad direction ("slower than the spread", the criterion of a regression here).

    python -m benchmarks tool compare --metric step_us --before old*/replay-h100.json --after new*/replay-h100.json \
        --before-label 8811eeb --after-label HEAD --name replay-ab-8811eeb --out benchmarks/results

Writes ``<out>/<name>-<machine>.{json,md,png}`` (the machine and environment of the first ``--after`` file).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks._results import Results, write

KEYS = ("N", "B", "S", "T", "K")


def row_key(row: dict) -> tuple:
    """A row's identity across runs: its ``impl`` and the size columns it has."""
    return (row["impl"], *((k, row[k]) for k in KEYS if k in row))


def pool(paths: list[str], metric: str) -> dict[tuple, list[float]]:
    """``{row key: [metric of each run, in the order given]}`` over the results JSON files ``paths``."""
    runs: dict[tuple, list[float]] = {}
    for path in paths:
        for row in json.loads(Path(path).read_text())["rows"]:
            if isinstance(row.get(metric), (int, float)):
                runs.setdefault(row_key(row), []).append(float(row[metric]))
    return runs


def compare(before: dict[tuple, list[float]], after: dict[tuple, list[float]], higher_is_better: bool) -> list[dict]:
    """One row per key measured in both trees: medians, ranges, after/before ratio, and ``beyond_spread`` (the
    after-median worse than the worst run before)."""
    rows = []
    for key in after:
        if key not in before:
            continue
        b, a = before[key], after[key]
        mb, ma = statistics.median(b), statistics.median(a)
        worse = ma < min(b) if higher_is_better else ma > max(b)
        rows.append({"impl": key[0], **dict(key[1:]),
                     "before_runs": b, "after_runs": a, "before_median": mb, "after_median": ma,
                     "before_range": f"{min(b):,.1f}-{max(b):,.1f}", "after_range": f"{min(a):,.1f}-{max(a):,.1f}",
                     "after_over_before": ma / mb if mb else None, "beyond_spread": "worse" if worse else ""})
    return rows


def main(argv: list[str] | None = None) -> list[Path]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks tool compare", description=__doc__.splitlines()[0])
    ap.add_argument("--before", nargs="+", required=True, help="results JSON files of the old tree's runs")
    ap.add_argument("--after", nargs="+", required=True, help="results JSON files of the new tree's runs")
    ap.add_argument("--metric", required=True, help="the row key compared, e.g. step_us or updates_per_s")
    ap.add_argument("--higher-is-better", action="store_true", help="e.g. updates_per_s (default: lower, e.g. us)")
    ap.add_argument("--before-label", default="before")
    ap.add_argument("--after-label", default="after")
    ap.add_argument("--name", required=True, help="the results files' stem, e.g. replay-ab-8811eeb")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)

    first = json.loads(Path(args.after[0]).read_text())
    rows = compare(pool(args.before, args.metric), pool(args.after, args.metric), args.higher_is_better)
    sizes = [k for k in KEYS if any(k in r for r in rows)]
    columns = ["impl", *sizes, "before_median", "before_range", "after_median", "after_range", "after_over_before",
               "beyond_spread"]
    worse = [r["impl"] + "".join(f" {k}={r[k]:g}" for k in sizes if k in r) for r in rows if r["beyond_spread"]]
    direction = "higher is better" if args.higher_is_better else "lower is better"
    options = " ".join(f"--{k.replace('_', '-')} {' '.join(v) if isinstance(v, list) else v}"
                       for k, v in vars(args).items() if v not in (None, False) and k != "higher_is_better")
    flag = " --higher-is-better" if args.higher_is_better else ""
    env = {**first["environment"], "command": f"python -m benchmarks tool compare {options}{flag}"}
    results = Results(
        rows=rows, name=args.name, metric="after_over_before",
        table=_table(rows, columns),
        title=(f"`{first['suite']}` suite, `{args.metric}` ({direction}): {len(args.before)} runs of "
               f"{args.before_label} and {len(args.after)} of {args.after_label}, run alternately on one machine, "
               "each tree in its own interpreter; medians, ranges (min-max of the runs) and the ratio of medians."),
        notes=("Rows worse than the old tree's spread (after-median beyond its worst run): "
               + (", ".join(worse) if worse else "none") + "."))
    return write(first["suite"], results, args.out, env, machine=first["machine"])


def _table(rows: list[dict], columns: list[str]) -> str:
    from benchmarks._results import markdown_table

    shown = [{**r, "after_over_before": f"{r['after_over_before']:.3f}" if r["after_over_before"] else ""}
             for r in rows]
    return markdown_table(shown, columns)


if __name__ == "__main__":
    for path in main():
        print("wrote", path)
