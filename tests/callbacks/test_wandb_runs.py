"""The W&B runs of ``lightning-per fit`` and ``lightning-per ga3c``: every setting in the run config, and a resumed
fit that continues its W&B run.

Real wandb throughout (offline: its service and its ``.wandb`` files), real CLI runs and real Trainers, read back
with the package's readers of wandb's log; no mocks. The expected values come from the command lines and config
files given, the installed distributions' metadata and the run's own ``history.csv`` / ``episodes.csv``.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import socket
from importlib import metadata
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml
from _callbacks_toy import STEPS, ToyModule, trainer_kwargs
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_per import cli
from lightning_per.callbacks import (
    AsyncMetricsCallback,
    AutoModeWandbLogger,
    read_wandb_config,
    read_wandb_history,
    read_wandb_run_id,
)

ROOT = Path(__file__).parents[2]
CONFIG = ROOT / "configs" / "dqn_cartpole.yaml"
TINY = ["--model.env.num_envs=4", "--model.replay.capacity=1000", "--model.replay.batch_size=16",
        "--model.hidden_sizes=[16, 16]", "--model.warmup_steps=64", "--trainer.enable_progress_bar=false"]
READ_TIMEOUT_S = 60.0  # wandb.finish() may return before the service has written the run's last records
PACKAGES = ("torch", "torchrl", "tensordict", "lightning", "lightning_per")


@pytest.fixture
def wandb_env(monkeypatch, tmp_path):
    """No credentials, no W&B settings from this machine; wandb's config and cache in the test's directory."""
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_DISABLED", "WANDB_BASE_URL",
                "WANDB_DIR", "WANDB_PROJECT", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    return tmp_path


def _fit(run_dir: Path, *extra: str) -> int:
    return cli.main(["fit", "--config", str(CONFIG), *TINY, f"--trainer.default_root_dir={run_dir}", *extra])


def _parts(run_dir: Path) -> list[Path]:
    """The offline run directories under ``run_dir``, oldest first (each complete on disk)."""
    parts = sorted(run_dir.glob("wandb/offline-run-*"), key=lambda d: d.name)  # offline-run-<start time>-<id>[-n]
    for part in parts:
        read_wandb_history(part, timeout_s=READ_TIMEOUT_S)
    return parts


def _rows(part: Path, prefix: str) -> list[dict]:
    return [r for r in read_wandb_history(part, timeout_s=READ_TIMEOUT_S) if any(k.startswith(prefix) for k in r)]


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _check_versions_and_machine(config: dict) -> None:
    for name in PACKAGES:
        assert config["versions"][name] == metadata.version(name), name
    assert config["machine"]["cpu_count"] == os.cpu_count()
    assert config["machine"]["gpu_count"] == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    host = socket.gethostname()
    if len(host) >= 6:  # a short name could match any text by chance
        assert host not in json.dumps(config)


# --------------------------------------------------------------------------------------------------- configs
def test_fit_run_config_holds_the_model_replay_env_trainer_seed_and_versions(wandb_env):
    run_dir = wandb_env / "run"
    assert _fit(run_dir, "--model.updates_per_epoch=10", "--trainer.max_epochs=1", "--model.replay.alpha=0.7",
                "--seed_everything=5", "--model.seed=3") == 0
    (part,) = _parts(run_dir)
    config = read_wandb_config(part)
    given = yaml.safe_load(CONFIG.read_text())
    assert config["replay"]["alpha"] == 0.7 and config["replay"]["capacity"] == 1000
    assert config["replay"]["batch_size"] == 16 and config["replay"]["sampler"] == given["model"]["replay"]["sampler"]
    assert config["env"]["id"] == given["model"]["env"]["id"] and config["env"]["num_envs"] == 4
    assert config["env"]["backend"] == given["model"]["env"]["backend"]
    assert config["gamma"] == given["model"]["gamma"] and config["hidden_sizes"] == [16, 16]  # the flat arguments
    assert config["trainer"]["max_epochs"] == 1 and config["trainer"]["max_time"] == given["trainer"]["max_time"]
    assert config["trainer"]["default_root_dir"] == str(run_dir)
    assert config["seed"] == 3 and config["seed_everything"] == 5 and config["ckpt_path"] is None
    _check_versions_and_machine(config)


def test_ga3c_run_config_holds_every_field_the_trainer_seed_and_versions(wandb_env):
    """``lightning-per ga3c`` with W&B left at its default (offline without credentials, as ``fit``'s) and the
    config's ``wandb_mode: disabled`` overridden back to that default: the same groups as ``fit``'s run config."""
    from lightning_per.ga3c.config import GA3CConfig

    runs = wandb_env / "runs"
    assert cli.ga3c_main(["--config", str(ROOT / "configs/ga3c_cartpole.yaml"), "--model.agents", "1",
                          "--model.envs_per_agent", "2", "--model.target_return", "null",
                          "--model.updates_per_epoch", "5", "--model.max_updates", "10", "--model.max_time_s", "120",
                          "--model.seed", "7", "--model.dynamic_adjustment", "false", "--model.status_interval_s", "0",
                          "--model.run_dir", str(runs), f"--model.wandb_mode={GA3CConfig().wandb_mode}",
                          "--trainer.log_every_n_steps", "3"]) == 0
    (run_dir,) = runs.iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    (part,) = _parts(run_dir)
    config = read_wandb_config(part)
    given = yaml.safe_load((ROOT / "configs/ga3c_cartpole.yaml").read_text())["model"]
    assert {f.name for f in dataclasses.fields(GA3CConfig)} <= set(config)  # every field
    assert config["env"] == given["env"] and config["seed"] == 7 and config["agents"] == 1
    assert config["wandb_mode"] == "auto" and config["seed_everything"] == 7  # the one seed of a GA3C run
    assert config["trainer"]["max_epochs"] == -1  # GA3C runs on updates and time, no epoch bound
    assert config["trainer"]["max_steps"] == 10 and config["trainer"]["max_time"] == 120
    assert config["trainer"]["log_every_n_steps"] == 3  # --trainer.* reaches the Trainer and the run config
    assert config["trainer"]["devices"] == 1 and config["trainer"]["default_root_dir"] == summary["run_dir"]
    _check_versions_and_machine(config)


# ---------------------------------------------------------------------------------------------------- resume
def test_a_resumed_fit_continues_its_wandb_run_and_a_noop_resume_adds_nothing(wandb_env):
    run_dir = wandb_env / "run"
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    updates = 50
    assert _fit(run_dir, f"--model.updates_per_epoch={updates}", "--trainer.max_epochs=2") == 0
    (first,) = _parts(run_dir)
    run_id = read_wandb_run_id(first)
    assert _fit(run_dir, f"--model.updates_per_epoch={updates}", "--trainer.max_epochs=4",
                "--ckpt_path", str(ckpt)) == 0
    parts = _parts(run_dir)
    assert len(parts) == 2 and [read_wandb_run_id(p) for p in parts] == [run_id, run_id]  # one W&B run, two parts
    assert all(p.name.endswith(run_id) for p in parts)
    assert read_wandb_config(parts[1])["ckpt_path"] == str(ckpt)

    history = _csv(run_dir / "history.csv")
    rows = [r for p in parts for r in _rows(p, "train/")]
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2, 3] == [int(h["epoch"]) for h in history]  # each epoch once
    steps = [int(r["train/env_steps"]) for r in rows]
    assert steps == [int(float(h["env_steps"])) for h in history]
    per_epoch = updates / yaml.safe_load(CONFIG.read_text())["model"]["replay_ratio"]  # env steps an epoch
    assert [b - a for a, b in zip(steps, steps[1:])] == [per_epoch] * 3  # no gap, no repeat across the resume
    episodes = [r for p in parts for r in _rows(p, "episode/")]
    assert [int(r["episode/episode"]) for r in episodes] == [int(e["episode"]) for e in _csv(run_dir / "episodes.csv")]
    assert all(a["episode/env_steps"] <= b["episode/env_steps"] for a, b in zip(episodes, episodes[1:]))

    # a resume whose target is reached at once (the mean of the last 20 returns is >= 0): nothing trains
    assert len(_csv(run_dir / "episodes.csv")) >= 20
    assert _fit(run_dir, f"--model.updates_per_epoch={updates}", "--trainer.max_epochs=6", "--model.target_return=0",
                "--ckpt_path", str(ckpt)) == 0
    after = _parts(run_dir)
    assert {read_wandb_run_id(p) for p in after} == {run_id}  # no other run
    assert len(after) <= 3
    for part in after[2:]:  # offline, the part writes a directory of the same run: nothing in its history
        assert read_wandb_history(part) == []
    assert [int(h["epoch"]) for h in _csv(run_dir / "history.csv")] == [0, 1, 2, 3]


def _toy_fit(run_dir: Path, max_epochs: int, ckpt_path: Path | None = None) -> AutoModeWandbLogger:
    """A toy fit with the W&B logger and metrics callback; a resume continues the run its checkpoint names."""
    logger = AutoModeWandbLogger(save_dir=str(run_dir), project="p", mode="offline", finish_on_end=True)
    metrics = AsyncMetricsCallback()
    if ckpt_path is not None:
        run_id = metrics.wandb_run_id_in(torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True))
        if run_id is not None:
            logger.continue_run(run_id)
    ckpt = ModelCheckpoint(dirpath=str(run_dir / "checkpoints"), filename="last", save_top_k=1,
                           every_n_epochs=1, enable_version_counter=False)
    trainer = pl.Trainer(logger=logger, callbacks=[metrics, ckpt],
                         **trainer_kwargs(run_dir, max_epochs=max_epochs, enable_checkpointing=True))
    trainer.fit(ToyModule(), ckpt_path=ckpt_path)
    return logger


def test_the_checkpoint_names_the_run_and_a_python_resume_continues_it(wandb_env):
    run_dir = wandb_env / "run"
    _toy_fit(run_dir, 2)
    (first,) = _parts(run_dir)
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    assert AsyncMetricsCallback().wandb_run_id_in(torch.load(ckpt, weights_only=False)) == read_wandb_run_id(first)
    _toy_fit(run_dir, 3, ckpt)
    parts = _parts(run_dir)
    assert [read_wandb_run_id(p) for p in parts] == [read_wandb_run_id(first)] * 2
    assert [[r["epoch"] for r in _rows(p, "train/")] for p in parts] == [[0, 1], [2]]
    assert [r["trainer/global_step"] for p in parts for r in _rows(p, "train/")] == [STEPS, 2 * STEPS, 3 * STEPS]


def test_a_checkpoint_that_names_no_run_starts_a_new_one_and_relogs_nothing_it_has(wandb_env):
    """A checkpoint written before the run id was recorded still resumes: a new W&B run, whose rows are the new
    epochs only (the earlier file holds the others)."""
    run_dir = wandb_env / "run"
    _toy_fit(run_dir, 2)
    (first,) = _parts(run_dir)
    path = run_dir / "checkpoints" / "last.ckpt"
    ckpt = torch.load(path, weights_only=False)
    state = next(v for k, v in ckpt["callbacks"].items() if k.startswith("AsyncMetricsCallback"))
    del state["wandb_run_id"]
    torch.save(ckpt, path)
    _toy_fit(run_dir, 3, path)
    (second,) = [p for p in _parts(run_dir) if p != first]
    assert read_wandb_run_id(second) != read_wandb_run_id(first)
    assert [r["epoch"] for r in _rows(second, "train/")] == [2]
