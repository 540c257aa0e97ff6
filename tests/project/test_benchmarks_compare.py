"""``python -m benchmarks tool compare``: runs of two trees pooled by row, with hand-computed medians and verdicts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run_file(path: Path, rows: list[dict]) -> str:
    path.write_text(json.dumps({"suite": "replay", "machine": "h100", "environment": {"gpu": "NVIDIA H100"},
                                "rows": rows}))
    return str(path)


def test_medians_ranges_ratio_and_the_rows_worse_than_the_old_spread(tmp_path):
    before = [_run_file(tmp_path / f"b{i}.json", [{"impl": "graph", "N": 10, "B": 2, "step_us": v},
                                                  {"impl": "eager", "N": 10, "B": 2, "step_us": e}])
              for i, (v, e) in enumerate([(18.0, 130.0), (19.0, 126.0), (18.5, 137.0)])]
    after = [_run_file(tmp_path / f"a{i}.json", [{"impl": "graph", "N": 10, "B": 2, "step_us": v},
                                                 {"impl": "eager", "N": 10, "B": 2, "step_us": e},
                                                 {"impl": "new-only", "N": 10, "B": 2, "step_us": 1.0}])
             for i, (v, e) in enumerate([(18.9, 190.0), (18.2, 191.0), (18.7, 189.0)])]
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "tool", "compare", "--metric", "step_us",
                           "--before", *before, "--after", *after, "--name", "replay-ab", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["impl"]: r for r in json.loads((out / "replay-ab-h100.json").read_text())["rows"]}
    assert set(rows) == {"graph", "eager"}  # a row measured in one tree only is not compared
    graph, eager = rows["graph"], rows["eager"]
    assert (graph["before_median"], graph["after_median"]) == (18.5, 18.7)  # medians of 18/19/18.5, 18.9/18.2/18.7
    assert graph["before_range"] == "18.0-19.0" and graph["beyond_spread"] == ""  # 18.7 <= the worst old run, 19.0
    assert (eager["before_median"], eager["after_median"]) == (130.0, 190.0)
    assert abs(eager["after_over_before"] - 190.0 / 130.0) < 1e-12 and eager["beyond_spread"] == "worse"
    assert graph["N"] == 10 and graph["B"] == 2
    md = (out / "replay-ab-h100.md").read_text()
    assert "Rows worse than the old tree's spread (after-median beyond its worst run): eager N=10 B=2." in md


def test_higher_is_better_turns_the_verdict(tmp_path):
    before = [_run_file(tmp_path / f"b{i}.json", [{"impl": "loop", "K": 8, "updates_per_s": v}])
              for i, v in enumerate([2660.0, 2670.0])]
    after = [_run_file(tmp_path / f"a{i}.json", [{"impl": "loop", "K": 8, "updates_per_s": v}])
             for i, v in enumerate([2650.0, 2655.0])]
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "tool", "compare", "--metric", "updates_per_s",
                           "--higher-is-better", "--before", *before, "--after", *after, "--name", "loop-ab",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads((out / "loop-ab-h100.json").read_text())["rows"]
    assert row["before_median"] == 2665.0 and row["after_median"] == 2652.5
    assert row["beyond_spread"] == "worse"  # 2,652.5 below the worst old run, 2,660
