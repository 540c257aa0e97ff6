"""W&B without network, and what a kill takes from a run's ``.wandb`` file.

Real wandb throughout (its service process, its files, read back with the package's reader of wandb's
LevelDB-style log), real ``lightning-per fit`` processes killed with SIGKILL; no mocks.
"""

from __future__ import annotations

import csv
import math
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from _callbacks_toy import KINDS, STEPS, ToyModule, expected_epoch, trainer_kwargs
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_per import cli
from lightning_per.callbacks import AsyncMetricsCallback, AutoModeWandbLogger, read_wandb_history

ROOT = Path(__file__).parents[2]
CONFIG = str(ROOT / "configs" / "dqn_cartpole.yaml")
TINY = ["--model.env.num_envs=4", "--model.replay.capacity=1000", "--model.replay.batch_size=16",
        "--model.hidden_sizes=[16, 16]", "--model.warmup_steps=64", "--trainer.enable_progress_bar=false"]
READ_TIMEOUT_S = 60.0  # wandb.finish() may return before the service has written the run's last records
START_TIMEOUT_S = 300.0  # a fit process's start (imports, the W&B service) on a busy 2-core machine
FALLBACK = "W&B could not start online"


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


@pytest.fixture
def no_network_key(wandb_env, monkeypatch):
    """An (invalid) API key, online mode, and a W&B server URL on a local port nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    return wandb_env


def _train_rows(path, timeout_s: float = 0.0) -> list[dict]:
    """The epoch rows of a run's file; ``timeout_s`` > 0 for a run that finished (its service may still be writing
    it), 0 for a killed or cut one (no exit record will come)."""
    return [r for r in read_wandb_history(path, timeout_s=timeout_s)
            if "epoch" in r and any(k.startswith("train/") for k in r)]


def _same(got, want) -> bool:
    return math.isnan(float(got)) if math.isnan(want) else got == pytest.approx(want)


# ----------------------------------------------------------------------------------------- no network
def test_unreachable_service_trains_offline_with_one_warning(no_network_key):
    run_dir = no_network_key / "run"
    logger = AutoModeWandbLogger(save_dir=str(run_dir), project="p", finish_on_end=True, init_timeout_s=3)
    assert logger.mode == "online"  # a key is set: today's choice is online
    trainer = pl.Trainer(logger=logger, callbacks=[AsyncMetricsCallback()], **trainer_kwargs(run_dir))
    t0 = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(ToyModule())
    elapsed = time.monotonic() - t0
    print(f"fit with an unreachable W&B server (init_timeout_s=3): {elapsed:.1f} s")

    ours = [str(w.message) for w in caught if FALLBACK in str(w.message)]
    assert len(ours) == 1, ours
    assert logger.mode == "offline"
    offline = list(run_dir.glob("wandb/offline-run-*"))
    assert len(offline) == 1 and str(offline[0]) in ours[0] and "wandb sync" in ours[0]
    rows = read_wandb_history(offline[0], timeout_s=READ_TIMEOUT_S)
    assert [r["epoch"] for r in rows] == [0, 1, 2]
    for e, row in enumerate(rows):
        assert row["trainer/global_step"] == STEPS * (e + 1)
        assert all(_same(row[f"train/{k}"], v) for k, v in expected_epoch(e).items()), (e, row)


def test_console_fit_without_network_exits_0_with_one_line(no_network_key, capfd):
    """`lightning-per fit` with a key and no network: it trains, says so in one line, writes the offline run."""
    run_dir = no_network_key / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status = cli.main(["fit", "--config", CONFIG, *TINY, "--model.updates_per_epoch=20",
                           f"--trainer.default_root_dir={run_dir}", "--trainer.max_epochs=2",
                           "--trainer.logger.init_args.init_timeout_s=3"])
    err = capfd.readouterr().err
    assert status == 0 and "Traceback" not in err
    assert sum(FALLBACK in str(w.message) for w in caught) == 1
    rows = _train_rows(next(run_dir.glob("wandb/offline-run-*")), READ_TIMEOUT_S)
    assert [r["epoch"] for r in rows] == [0, 1]
    with open(run_dir / "history.csv") as f:
        history = list(csv.DictReader(f))
    for row, csv_row in zip(rows, history):  # the W&B rows are the epochs of history.csv
        assert row["train/loss"] == pytest.approx(float(csv_row["loss"]))


def test_bad_timeouts_are_refused(wandb_env):
    for kw, name in (({"init_timeout_s": 0}, "init_timeout_s"), ({"init_timeout_s": math.inf}, "init_timeout_s"),
                     ({"flush_interval_s": -1}, "flush_interval_s"), ({"flush_interval_s": "1"}, "flush_interval_s")):
        with pytest.raises(ValueError, match=name):
            AutoModeWandbLogger(save_dir=str(wandb_env / "run"), mode="offline", **kw)
    assert not (wandb_env / "run").exists()


def test_user_settings_win_over_the_loggers_own(wandb_env):
    import wandb

    logger = AutoModeWandbLogger(save_dir=str(wandb_env / "run"), mode="offline", init_timeout_s=7,
                                 settings={"init_timeout": 11.0})
    run = logger.experiment
    try:
        assert run.settings.init_timeout == 11.0  # the user's
        assert run.settings.x_transaction_log_flush_interval == 0.1  # the logger's default
    finally:
        run.finish()
    logger = AutoModeWandbLogger(save_dir=str(wandb_env / "run2"), mode="offline", flush_interval_s=0.5,
                                 settings=wandb.Settings(x_transaction_log_flush_interval=2.0))
    run = logger.experiment
    try:
        assert run.settings.init_timeout == 15.0 and run.settings.x_transaction_log_flush_interval == 2.0
    finally:
        run.finish()


# --------------------------------------------------------------------------------- kill -9, then resume
def _fit_cmd(run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "lightning_per.console", "fit", "--config", CONFIG, *TINY,
            f"--trainer.default_root_dir={run_dir}", *extra]


def _env() -> dict[str, str]:
    env = dict(os.environ, WANDB_MODE="offline", PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "support"),
                                                                            os.environ.get("PYTHONPATH", "")]))
    env.pop("WANDB_API_KEY", None)
    # each fit starts its own W&B service (the one _run_and_kill kills with it), not this process's: wandb
    # exports WANDB_SERVICE once it runs one, and a shared service keeps a killed fit's run open ("run ID ...
    # is in use" for the resume that continues it)
    env.pop("WANDB_SERVICE", None)
    return env


def _service_pids(parent: int) -> list[int]:
    """The W&B service processes started for process ``parent`` (wandb-core runs in its own session, so a
    kill of the fit's process group does not reach it; a machine-wide kill does)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline and cmdline[0].endswith(b"wandb-core") and b"--pid" in cmdline \
                and cmdline[cmdline.index(b"--pid") + 1:][:1] == [str(parent).encode()]:
            pids.append(int(entry))
    return pids


def _run_and_kill(run_dir: Path, epochs: int, *extra: str) -> int:
    """Start a fit, wait until ``epochs`` epochs have ended (the marker file), SIGKILL the fit's process group
    and its W&B service at once. Returns the epochs ended by then."""
    marker = run_dir / "epochs_done"
    run_dir.mkdir(parents=True, exist_ok=True)
    log = open(run_dir / "fit.log", "w")
    cmd = _fit_cmd(run_dir, "--trainer.max_epochs=1000", "--trainer.callbacks+=_epoch_marker.EpochMarker",
                   f"--trainer.callbacks.path={marker}", *extra)
    proc = subprocess.Popen(cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (marker.exists() and int(marker.read_text()) >= epochs):
            assert proc.poll() is None, (run_dir / "fit.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the fit did not reach its epochs in time"
            time.sleep(0.002)  # polling a file the process writes: no fixed wait
    finally:
        for pid in _service_pids(proc.pid):
            os.kill(pid, signal.SIGKILL)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
    return int(marker.read_text())


def test_a_kill_loses_at_most_the_last_epoch_of_the_wandb_file(wandb_env):
    run_dir = wandb_env / "run"
    done = _run_and_kill(run_dir, 4, "--model.updates_per_epoch=50")
    rows = _train_rows(next(run_dir.glob("wandb/offline-run-*")))
    epochs = [int(r["epoch"]) for r in rows]
    assert epochs == list(range(len(epochs))), epochs  # oldest first, no gap
    assert len(epochs) >= done - 1, (epochs, done)  # at most the last epoch's row was still in the service


def test_a_resume_relogs_the_epochs_the_killed_runs_file_lost(wandb_env):
    """The killed run writes its .wandb file only when its 32 KiB buffer fills (flush_interval_s=0, what every
    run did before): the file lacks the run's epochs. The resumed run's first rows are those epochs and
    episodes, the values history.csv / episodes.csv hold."""
    run_dir = wandb_env / "run"
    # an epoch writes about 6.5 KiB here: the first 32 KiB block holds the start records and epochs 0-2, the
    # second one ends near epoch 9; a kill after epoch 6 leaves epochs 3.. in the unwritten tail
    done = _run_and_kill(run_dir, 6, "--model.updates_per_epoch=50", "--trainer.logger.init_args.flush_interval_s=0")
    old_dir = next(run_dir.glob("wandb/offline-run-*"))
    old_epochs = {int(r["epoch"]) for r in _train_rows(old_dir)}
    assert len(old_epochs) < done - 1  # the scenario: a tail of several epochs is missing

    total = done + 2
    resumed = subprocess.run(_fit_cmd(run_dir, "--model.updates_per_epoch=50", f"--trainer.max_epochs={total}",
                                      "--ckpt_path", str(run_dir / "checkpoints" / "last.ckpt")),
                             env=_env(), capture_output=True, text=True, timeout=START_TIMEOUT_S)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "re-logged" in resumed.stderr + resumed.stdout
    new_dir = next(d for d in run_dir.glob("wandb/offline-run-*") if d != old_dir)
    new_rows = read_wandb_history(new_dir, timeout_s=READ_TIMEOUT_S)
    new_train = [r for r in new_rows if "train/loss" in r]
    with open(run_dir / "history.csv") as f:
        history = {int(r["epoch"]): r for r in csv.DictReader(f)}
    assert sorted(history) == list(range(total))
    assert old_epochs | {int(r["epoch"]) for r in new_train} == set(range(total))  # every epoch is in W&B
    relogged = [r for r in new_train if int(r["epoch"]) not in old_epochs and int(r["epoch"]) < done - 1]
    assert relogged and new_train[:len(relogged)] == relogged  # first thing in the new run, oldest first
    for row in new_train:
        want = history[int(row["epoch"])]
        assert row["train/loss"] == pytest.approx(float(want["loss"])), row["epoch"]
        assert row["trainer/global_step"] == int(want["global_step"])
    with open(run_dir / "episodes.csv") as f:
        episodes = [int(r["episode"]) for r in csv.DictReader(f)]
    logged = {int(r["episode/episode"]) for d in (old_dir, new_dir) for r in read_wandb_history(d)
              if "episode/episode" in r}
    assert logged >= set(episodes)


# ------------------------------------------------------------------- resume re-logs, in process (toy)
def _toy_fit(run_dir: Path, max_epochs: int, ckpt_path: str | None = None):
    logger = AutoModeWandbLogger(save_dir=str(run_dir), project="p", mode="offline", finish_on_end=True)
    ckpt = ModelCheckpoint(dirpath=str(run_dir / "checkpoints"), filename="last", save_top_k=1,
                           every_n_epochs=1, enable_version_counter=False)
    trainer = pl.Trainer(logger=logger, callbacks=[AsyncMetricsCallback(), ckpt],
                         **trainer_kwargs(run_dir, max_epochs=max_epochs, enable_checkpointing=True))
    trainer.fit(ToyModule(), ckpt_path=ckpt_path)
    return logger


def _cut_after_rows(path: Path, rows: int) -> None:
    """Truncate a .wandb file right after its first ``rows`` train rows (the tail a kill can leave unwritten)."""
    data = path.read_bytes()
    lo, hi = 0, len(data)
    while lo < hi:  # the shortest prefix that still holds `rows` train rows
        mid = (lo + hi) // 2
        path.write_bytes(data[:mid])
        lo, hi = (lo, mid) if len(_train_rows(path)) >= rows else (mid + 1, hi)
    path.write_bytes(data[:lo])
    assert [r["epoch"] for r in _train_rows(path)] == list(range(rows))


def test_resume_relogs_exactly_the_epochs_a_cut_file_lacks(wandb_env):
    run_dir = wandb_env / "run"
    _toy_fit(run_dir, 4)
    old_file = next(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    read_wandb_history(old_file, timeout_s=READ_TIMEOUT_S)  # complete on disk
    _cut_after_rows(old_file, 2)  # epochs 2 and 3 lost
    _toy_fit(run_dir, 6, ckpt_path=str(run_dir / "checkpoints" / "last.ckpt"))
    new_file = next(f for f in run_dir.glob("wandb/offline-run-*/run-*.wandb") if f != old_file)
    rows = [r for r in read_wandb_history(new_file, timeout_s=READ_TIMEOUT_S) if "train/steps" in r]
    assert [r["epoch"] for r in rows] == [2, 3, 4, 5]  # the lost ones first, then the trained ones
    for row in rows:
        e = row["epoch"]
        assert row["trainer/global_step"] == STEPS * (e + 1)
        assert all(_same(row[f"train/{k}"], v) for k, v in expected_epoch(e).items()), (e, row)
        assert set(row) >= {f"train/{k}" for k in KINDS}


def test_resume_warns_in_one_line_when_the_earlier_file_is_gone(wandb_env):
    run_dir = wandb_env / "run"
    _toy_fit(run_dir, 3)
    old_file = next(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    read_wandb_history(old_file, timeout_s=READ_TIMEOUT_S)
    old_file.unlink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _toy_fit(run_dir, 4, ckpt_path=str(run_dir / "checkpoints" / "last.ckpt"))
    ours = [str(w.message) for w in caught if "AsyncMetricsCallback" in str(w.message)]
    assert len(ours) == 1 and "\n" not in ours[0], ours
    assert str(old_file) in ours[0] and "epochs 0-2" in ours[0]
    new_file = next(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert [r["epoch"] for r in _train_rows(new_file, READ_TIMEOUT_S)] == [3]  # nothing re-logged


def test_resume_from_a_checkpoint_that_names_no_wandb_run_warns(wandb_env):
    run_dir = wandb_env / "run"
    _toy_fit(run_dir, 2)
    path = run_dir / "checkpoints" / "last.ckpt"
    ckpt = torch.load(path, weights_only=False)
    state = next(v for k, v in ckpt["callbacks"].items() if k.startswith("AsyncMetricsCallback"))
    del state["wandb_files"]  # a checkpoint written before the callback recorded its W&B runs
    torch.save(ckpt, path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _toy_fit(run_dir, 3, ckpt_path=str(path))
    ours = [str(w.message) for w in caught if "AsyncMetricsCallback" in str(w.message)]
    assert len(ours) == 1 and "does not name the W&B runs" in ours[0] and "epochs 0-1" in ours[0], ours
