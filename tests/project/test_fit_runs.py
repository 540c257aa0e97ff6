"""benchmarks.fit_runs pools repeated dqn-fit runs: medians, spreads and the scaling of the medians,
checked against values worked out by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2]))
from benchmarks import fit_runs  # noqa: E402


def _run(path: Path, world: int, total: float, name: str = "dqn-fit") -> str:
    path.write_text(json.dumps({"rows": [{"impl": name, "world_size": world, "updates_per_s_total": total}]}))
    return str(path)


def test_medians_spread_and_scaling(tmp_path):
    files = [_run(tmp_path / f"{i}.json", w, v) for i, (w, v) in enumerate([(1, 100), (1, 300), (1, 200),
                                                                            (2, 380), (2, 420)])]
    files.append(_run(tmp_path / "other.json", 2, 999, name="dqn-fit-serial-replay"))  # no 1-device run
    runs = fit_runs.load(files)
    assert runs[("dqn-fit", 1)] == [100, 300, 200] and runs[("dqn-fit", 2)] == [380, 420]
    lines = fit_runs.table(runs).splitlines()
    # 1 device: median 200, spread (300 - 100) / 200 = 100 %; 2 devices: median 400, 400 / 200 = 2.00x
    assert lines[2] == "| dqn-fit | 1 | 100, 300, 200 | 200 | 100% |  |"
    assert lines[3] == "| dqn-fit | 2 | 380, 420 | 400 | 10% | 2.00x |"
    assert lines[4] == "| dqn-fit-serial-replay | 2 | 999 | 999 | 0% |  |"  # no 1-device median: no ratio
