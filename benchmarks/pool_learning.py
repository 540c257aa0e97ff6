"""Pool the learning suite's results files of one config and machine (seeds run in separate calls) into one table.

Seeds of one config may run in several calls of the suite (a job time limit, say), each writing its own
``learning-<name>-<machine>.json``. This reads them (rows and curves), refuses files that differ in target, window
or machine, or that repeat a seed, and writes the table, the median / worst line and the plot of all the seeds, as
the suite does for one call (:func:`benchmarks.learning.summarise`); the notes list each file's command and time.

    python -m benchmarks tool pool_learning --name dqn_pong_apex --out benchmarks/results \
        runs/a/learning-dqn_pong_apex-h100.json runs/b/learning-dqn_pong_apex-h100.json

Writes ``<out>/learning-<name>-<machine>.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks import UsageError, learning
from benchmarks._results import Results, write


def pool(results: list[dict], name: str) -> Results:
    """The pooled results of the ``learning`` suite's JSON payloads ``results`` (rows ordered by seed).

    Raises:
        UsageError: a payload of another suite, target, window or machine than the first, or a seed twice.
    """
    first = results[0]
    for r in results:
        if r.get("suite") != "learning":
            raise UsageError(f"pool_learning: expected results of the learning suite, got {r.get('suite')!r}")
        for key in ("target", "window", "machine"):
            if r[key] != first[key]:
                raise UsageError(f"pool_learning: every file must have the {key} of the first ({first[key]!r}), "
                                 f"got {r[key]!r}")
    rows = sorted((row for r in results for row in r["rows"]), key=lambda row: row["seed"])
    seeds = [row["seed"] for row in rows]
    if len(set(seeds)) != len(seeds):
        raise UsageError(f"pool_learning: a seed appears in more than one file: {seeds}")
    curves = {int(seed): c for r in results for seed, c in r["curves"].items()}
    target, window = first["target"], first["window"]
    agg = learning.aggregate(rows)
    line = learning.aggregate_line(agg, target)
    sources = "\n".join(f"- seeds {', '.join(str(row['seed']) for row in r['rows'])}: "
                        f"`{r['environment'].get('command')}` at {r['environment'].get('utc')} (UTC)"
                        for r in results)
    title = (f"{name}: time and env steps until the mean return of the last {window} episodes reaches {target:g}, "
             f"one run per seed (time: seconds since Trainer.fit started), pooled from {len(results)} runs of the "
             "suite on one machine.")
    return Results(rows=rows, table=learning.table(rows, target, window), title=title,
                   notes=f"{line}\n\nThe runs pooled:\n\n{sources}", name=f"learning-{name}",
                   plot=lambda path: learning.plot(curves, target, window, name, path),
                   extra={"target": target, "window": window, "aggregate": agg, "curves": curves})


def main(argv: list[str] | None = None) -> list[Path]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks tool pool_learning", description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="learning-<name>-<machine>.json files of one config and machine")
    ap.add_argument("--name", required=True, help="the pooled files' name: learning-<name>-<machine>.*")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    results = []
    for path in map(Path, args.files):
        try:
            results.append(json.loads(path.read_text()))
        except OSError as err:
            raise UsageError(f"pool_learning: {path}: {err.strerror or err}") from None
        except json.JSONDecodeError as err:
            raise UsageError(f"pool_learning: {path}: not a results file (JSON: {err})") from None
    pooled = pool(results, args.name)
    env = {**results[0]["environment"], "utc": ", ".join(str(r["environment"].get("utc")) for r in results),
           "command": f"python -m benchmarks tool pool_learning --name {args.name} --out {args.out} "
                      + " ".join(args.files)}
    return write("learning", pooled, args.out, env, machine=results[0]["machine"])


if __name__ == "__main__":
    try:
        for path in main():
            print("wrote", path)
    except UsageError as err:  # a usage error: one line, exit status 2 (as the suites' in benchmarks.__main__)
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
