"""``python -m benchmarks tool first_updates``: its table's first-step sizes against RMSProp's formula (torch's square
average started at 0: lr / sqrt(1 - alpha) per weight where |g| >> eps; bias-corrected: lr), its refusals, its files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import UsageError, first_updates  # noqa: E402


def test_first_steps_follow_the_formula_and_the_files_are_written(tmp_path):
    import yaml

    cfg = yaml.safe_load((ROOT / "configs/ga3c_cartpole.yaml").read_text())
    cfg["model"]["rmsprop_eps"] = 1e-8  # the largest gradient's step is then lr / sqrt(1 - alpha) within 0.1%
    config = tmp_path / "ga3c_cartpole.yaml"
    config.write_text(yaml.safe_dump(cfg))
    paths = first_updates.main(["--config", str(config), "--optimizers", "rmsprop",
                                "adam:0.0,0.99", "--seeds", "0", "--updates", "3", "--steps", "320",
                                "--out", str(tmp_path)])
    assert [p.name for p in paths] == [f"first_updates-ga3c_cartpole-cpu.{e}" for e in ("json", "md", "png")]
    rows = {r["optimizer"]: r for r in json.loads(paths[0].read_text())["rows"]}
    alpha = 0.99  # configs/ga3c_cartpole.yaml's rmsprop_alpha (the dataclass default)
    assert rows["rmsprop"]["first_update_max_step_lr"] == pytest.approx(1 / (1 - alpha) ** 0.5, rel=0.02)
    assert rows["adam:0.0,0.99"]["first_update_max_step_lr"] == pytest.approx(1.0, rel=0.02)
    for r in rows.values():
        assert r["curves"]["updates"] == [0, 1, 2, 3]
        assert all(0.0 <= d <= 1.0 for d in r["curves"]["dead_unit_frac"])
    assert "| rmsprop | 0 |" in paths[1].read_text()


def test_each_obs_center_steps_is_a_row_per_seed_and_the_default_is_the_configs(tmp_path):
    import yaml

    cfg = yaml.safe_load((ROOT / "configs/ga3c_cartpole.yaml").read_text())
    cfg["model"]["obs_center_steps"] = 7
    config = tmp_path / "ga3c_cartpole.yaml"
    config.write_text(yaml.safe_dump(cfg))
    common = ["--config", str(config), "--optimizers", "rmsprop", "--seeds", "0", "1", "--updates", "2",
              "--steps", "320", "--out", str(tmp_path)]
    rows = json.loads(first_updates.main([*common, "--obs-center-steps", "0", "5"])[0].read_text())["rows"]
    assert [(r["obs_center_steps"], r["seed"]) for r in rows] == [(0, 0), (0, 1), (5, 0), (5, 1)]
    assert all(-1.0 <= r["feature_cos_at_0"] <= 1.0 + 1e-6 for r in rows)
    # the same network seed, centered or not: the first update starts from the same weights but another input
    assert rows[0]["feature_cos_at_0"] != rows[2]["feature_cos_at_0"]
    rows = json.loads(first_updates.main(common)[0].read_text())["rows"]
    assert [r["obs_center_steps"] for r in rows] == [7, 7]
    with pytest.raises(UsageError, match=r"^--obs-center-steps must be >= 0"):
        first_updates.main([*common, "--obs-center-steps", "-1"])
    with pytest.raises(UsageError, match=r"^--obs-center-steps: each value once"):
        first_updates.main([*common, "--obs-center-steps", "0", "0"])


def test_feature_cosine_is_numpys_mean_over_pairs_of_different_rows():
    import numpy as np
    import torch

    assert first_updates.feature_cosine(torch.ones(5, 3)) == pytest.approx(1.0)  # every frame alike
    assert first_updates.feature_cosine(torch.eye(4)) == pytest.approx(0.0)  # no two alike
    rng = np.random.default_rng(0)
    h = np.maximum(rng.normal(size=(7, 16)), 0.0)
    h[2] = 0.0  # a frame on which every unit is dead
    want = np.mean([0.0 if not (h[i].any() and h[j].any()) else
                    h[i] @ h[j] / (np.linalg.norm(h[i]) * np.linalg.norm(h[j]))
                    for i in range(7) for j in range(7) if i != j])
    assert first_updates.feature_cosine(torch.from_numpy(h).float()) == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("spec", ["sgd", "rmsprop:0.9,0.9", "adam:0.9", "adam:a,b"])
def test_bad_optimizers_are_refused(spec):
    with pytest.raises(UsageError, match=r"^--optimizers: "):
        first_updates.parse_optimizer(spec)


@pytest.mark.parametrize(("argv", "match"), [
    (["--config", "configs/dqn_cartpole.yaml"], "a GA3C config is needed"),
    (["--config", "configs/nope.yaml"], "no such file"),
    (["--config", "configs/ga3c_cartpole.yaml", "--steps", "20"], "--steps must exceed the returns' horizon of 299"),
])
def test_a_config_it_cannot_study_is_one_line_and_exit_2(argv, match, tmp_path):
    """Run as users run it (``python -m benchmarks tool first_updates``): one error line, status 2, nothing written."""
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "benchmarks", "tool", "first_updates", *argv, "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and match in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not any(tmp_path.iterdir())
