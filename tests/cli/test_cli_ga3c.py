"""``lightning-per ga3c`` on LightningCLI: the committed config (``model:`` layout) runs, the old flat layout and
flat flags still run with one deprecation line naming the new spelling, Trainer settings GA3C derives from its
model fields are refused, and the docs show only the new spelling.

Real runs of the console command in this process (short CartPole runs: ``max_updates`` bounds them); the expected
values come from the committed config file and :class:`GA3CConfig`'s fields, not from the code under test.
About 25 s on 2 cores (two short runs, the rest parse only).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from lightning_per.cli import ga3c_main, ga3c_new_spelling
from lightning_per.console import main as console_main
from lightning_per.ga3c.config import GA3CConfig

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "ga3c_cartpole.yaml"
FIELDS = {f.name for f in dataclasses.fields(GA3CConfig)}
SHORT = {"agents": 1, "envs_per_agent": 2, "target_return": None, "max_updates": 10, "updates_per_epoch": 5,
         "status_interval_s": 0, "dynamic_adjustment": False}


def _flags(values: dict, prefix: str) -> list[str]:
    return [f"--{prefix}{k}={'null' if v is None else str(v).lower() if isinstance(v, bool) else v}"
            for k, v in values.items()]


def _one_run(runs: Path) -> Path:
    (run_dir,) = runs.iterdir()
    return run_dir


def test_the_committed_config_is_in_the_model_layout_and_every_key_is_a_field():
    data = yaml.safe_load(CONFIG.read_text())
    assert set(data) == {"model"} and set(data["model"]) <= FIELDS
    for path in sorted((ROOT / "configs").glob("ga3c_*.yaml")):
        data = yaml.safe_load(path.read_text())
        assert set(data) <= {"model", "trainer"} and set(data["model"]) <= FIELDS, path.name


def test_new_and_old_layouts_run_the_same_settings(tmp_path, capsys):
    new_runs, old_runs = tmp_path / "new", tmp_path / "old"
    assert console_main(["ga3c", "--config", str(CONFIG), *_flags({**SHORT, "run_dir": new_runs}, "model.")]) == 0
    err = capsys.readouterr().err
    assert "deprecated" not in err
    # the same file in the flat layout of the last release, with the flat flags
    flat = tmp_path / "flat.yaml"
    flat.write_text(yaml.safe_dump(yaml.safe_load(CONFIG.read_text())["model"]))
    assert console_main(["ga3c", "--config", str(flat), *_flags({**SHORT, "run_dir": old_runs}, "")]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "deprecated" in line]
    assert len(lines) == 1
    assert f"{flat}: its keys under 'model:'" in lines[0] and "--agents -> --model.agents" in lines[0]
    assert "--run_dir -> --model.run_dir" in lines[0]
    new, old = (yaml.safe_load((_one_run(r) / "config.yaml").read_text()) for r in (new_runs, old_runs))
    expected = {**yaml.safe_load(CONFIG.read_text())["model"], **SHORT}
    for cfg, runs in ((new, new_runs), (old, old_runs)):
        assert set(cfg) == {"model"}  # the run's config.yaml is a config file of the new layout
        assert {k: cfg["model"][k] for k in expected if k != "run_dir"} == {k: v for k, v in expected.items()
                                                                           if k != "run_dir"}
        assert cfg["model"]["run_dir"] == str(runs)
        summary = yaml.safe_load((_one_run(runs) / "summary.json").read_text())
        assert summary["updates"] == 10 and summary["stop_reason"] == "max_updates"
        assert (_one_run(runs) / "episodes.csv").is_file()


def test_an_env_step_budget_stops_the_run_at_the_first_update_past_it(tmp_path):
    # 1 agent x 2 envs x t_max 5: rollouts of 10 env steps, batches of >= 40 (the config's train_min_batch_size)
    budget = 200
    short = {**SHORT, "max_updates": -1, "max_env_steps": budget, "run_dir": tmp_path}
    assert console_main(["ga3c", "--config", str(CONFIG), *_flags(short, "model.")]) == 0
    summary = yaml.safe_load((_one_run(tmp_path) / "summary.json").read_text())
    assert summary["stop_reason"] == "max_env_steps"
    # at least the budget was trained on: updates x the batch's transitions (whole 10-step rollouts, >= 40)
    assert summary["env_steps"] >= budget and summary["updates"] >= 1
    assert summary["updates"] <= budget // 40  # it stopped at the first update past the budget, not later


@pytest.mark.parametrize("argv, new, notes", [
    (["--agents", "4", "--model.t_max", "3"], ["--model.agents", "4", "--model.t_max", "3"],
     ["--agents -> --model.agents"]),
    (["--max_time_s=5", "--trainer.precision", "32"], ["--model.max_time_s=5", "--trainer.precision", "32"],
     ["--max_time_s -> --model.max_time_s"]),
    (["--config", str(CONFIG), "--print_config"], ["--config", str(CONFIG), "--print_config"], []),
    (["--bogus", "1"], ["--bogus", "1"], []),  # not a field: the parser names it
])
def test_new_spelling_of_flat_flags(argv, new, notes):
    assert ga3c_new_spelling(argv) == (new, notes)


def test_a_flat_config_file_is_read_under_model(tmp_path):
    flat = tmp_path / "flat.yaml"
    flat.write_text("# a comment\nagents: 2\nhidden_sizes: [8, 8]\n")
    args, notes = ga3c_new_spelling([f"--config={flat}"])
    assert notes == [f"{flat}: its keys under 'model:'"] and args[0] == "--config"
    assert yaml.safe_load(args[1]) == {"model": {"agents": 2, "hidden_sizes": [8, 8]}}


@pytest.mark.parametrize("option, field", [
    ("--trainer.max_steps=3", "--model.max_updates"), ("--trainer.devices=2", "--model.devices"),
    ("--trainer.max_time=00:00:01:00", "--model.max_time_s"), ("--trainer.gradient_clip_val=1", "--model.grad_clip"),
    ("--seed_everything=3", "--model.seed"),
])
def test_a_setting_ga3c_derives_is_refused_in_one_line_naming_the_field(tmp_path, capsys, option, field):
    runs = tmp_path / "runs"
    assert ga3c_main(["--config", str(CONFIG), f"--model.run_dir={runs}", option]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lightning-per ga3c: error: ") and field in err[0]
    assert option.split("=")[0] in err[0] and not runs.exists()


def test_an_abbreviated_model_option_is_refused_with_the_closest(capsys):
    with pytest.raises(SystemExit) as exit_info:
        ga3c_main(["--config", str(CONFIG), "--model.agent", "3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 3  # as fit's: usage, tip, error
    assert "unrecognized arguments: --model.agent (did you mean --model.agents" in err[-1]


def test_the_docs_and_readme_spell_ga3c_options_the_new_way():
    flat = re.compile(r"(?<![\w.-])--(\w+)")
    for path in (ROOT / "README.md", ROOT / "docs" / "ga3c.md", *sorted((ROOT / "configs").glob("ga3c_*.yaml"))):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "benchmarks run ga3c" in line:  # the benchmark's own options
                continue
            old = [name for name in flat.findall(line) if name in FIELDS]
            assert not old, f"{path.name}:{number}: {old}"
