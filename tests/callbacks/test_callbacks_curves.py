"""The per-episode learning curves: the episode log read back once an epoch equals an independent model of
the scripted episodes (env steps, wall-clock of each step, return, rolling mean), the figure has the panels
and series users read (inspected on the matplotlib Figure, not the pixels), episodes.csv, and a W&B offline
run whose episode rows carry the env steps and plot against them."""

from __future__ import annotations

import csv
import math
import time

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_per.callbacks import (
    AsyncMetricsCallback,
    AutoModeWandbLogger,
    RunArtifactsCallback,
    read_wandb_history,
    read_wandb_step_metrics,
)
from lightning_per.callbacks.run_artifacts import learning_curve_figure
from lightning_per.metrics import MetricAccumulator, episode_log_rows, new_episode_log, push_episode_log

N_ENVS, STEPS_PER_EPOCH, EPOCHS, ENV_STEPS_PER_STEP = 3, 4, 3, 5


def _ends(step: int) -> list[bool]:
    """Which envs end an episode at global step ``step`` (0-based): env i every i + 1 steps, none in epoch 1."""
    quiet = STEPS_PER_EPOCH <= step < 2 * STEPS_PER_EPOCH
    return [not quiet and (step + 1) % (i + 1) == 0 for i in range(N_ENVS)]


def _return(step: int, env: int) -> float:
    return 100.0 * step + env


def model_episodes(steps: int) -> list[tuple[int, int, float]]:
    """(global step, env steps at the end, return) of each episode, oldest first, envs in index order."""
    return [(s, (s + 1) * ENV_STEPS_PER_STEP, _return(s, i)) for s in range(steps)
            for i, end in enumerate(_ends(s)) if end]


class ScriptedEpisodes(pl.LightningModule):
    """N_ENVS fake envs stepping ENV_STEPS_PER_STEP env steps per training step, ending episodes per _ends;
    it records the clock of each step in ``step_times`` (the test's own record)."""

    def __init__(self, log_rows: int = 64) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(1, 1)
        self.metrics = MetricAccumulator({"loss": "mean", "is_weight_mean": "mean", "env_steps": "last"},
                                         persistent=("env_steps",))
        log, count = new_episode_log(log_rows)
        self.register_buffer("episode_log", log, persistent=False)
        self.register_buffer("episode_log_count", count, persistent=False)
        self.step_times: list[float] = []

    def training_step(self, batch, batch_idx):
        step = self.global_step
        env_steps = (step + 1) * ENV_STEPS_PER_STEP
        done = torch.tensor(_ends(step))
        returns = torch.tensor([_return(step, i) for i in range(N_ENVS)])
        t = time.monotonic()
        self.step_times.append(t)
        push_episode_log(self.episode_log, self.episode_log_count, returns, done, env_steps=env_steps, time_s=t)
        loss = self.lin(batch.float().unsqueeze(1)).pow(2).mean()
        self.metrics.add("loss", loss.detach())
        self.metrics.add("is_weight_mean", 0.5 + 0.01 * step)
        self.metrics.add("env_steps", float(env_steps))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return DataLoader(torch.arange(STEPS_PER_EPOCH), batch_size=1)


def _fit(tmp_path, module, **kw):
    metrics = AsyncMetricsCallback(prog_bar=False, return_window=3)
    arts = RunArtifactsCallback(dirpath=str(tmp_path / "run"), verbose=False)
    trainer = pl.Trainer(default_root_dir=str(tmp_path), max_epochs=EPOCHS, accelerator="cpu", devices=1,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         log_every_n_steps=1, callbacks=[metrics, arts], **{"logger": False, **kw})
    trainer.fit(module)
    return metrics, arts


def test_episode_rows_equal_the_model_of_the_episodes(tmp_path):
    module = ScriptedEpisodes()
    metrics, arts = _fit(tmp_path, module)
    expected = model_episodes(EPOCHS * STEPS_PER_EPOCH)
    rows = metrics.episodes
    assert [r["episode"] for r in rows] == list(range(len(expected)))
    assert [(r["env_steps"], r["return"]) for r in rows] == [(float(s), r) for _, s, r in expected]
    # wall time: each episode at the clock of the step that ended it (differences: the callback's origin apart)
    t_first = module.step_times[expected[0][0]]
    for row, (step, _, _) in zip(rows, expected):
        assert row["time_s"] - rows[0]["time_s"] == pytest.approx(module.step_times[step] - t_first, abs=1e-9)
    assert 0 <= rows[0]["time_s"] <= rows[-1]["time_s"] <= metrics.history[-1]["time_s"]
    returns = [r for _, _, r in expected]
    for k, row in enumerate(rows):
        window = returns[max(0, k - 2): k + 1]
        assert row["return_mean"] == pytest.approx(sum(window) / len(window))
    assert metrics.episodes_dropped == 0
    # the same rows in episodes.csv
    with open(tmp_path / "run" / "episodes.csv") as fh:
        csv_rows = list(csv.DictReader(fh))
    assert [(float(r["env_steps"]), float(r["return"])) for r in csv_rows] == [(float(s), r) for _, s, r in expected]
    assert arts.summary["episodes_csv"] == str(tmp_path / "run" / "episodes.csv")


def test_a_log_too_small_for_an_epoch_drops_the_oldest_and_says_so(tmp_path):
    with pytest.warns(UserWarning, match="overwritten"):
        metrics, _ = _fit(tmp_path, ScriptedEpisodes(log_rows=4))
    expected = model_episodes(EPOCHS * STEPS_PER_EPOCH)
    per_epoch = [[e for e in expected if e[0] // STEPS_PER_EPOCH == k] for k in range(EPOCHS)]
    kept = [e for epoch in per_epoch for e in epoch[-4:]]  # the newest 4 of each epoch survive in 4 rows
    assert [(r["env_steps"], r["return"]) for r in metrics.episodes] == [(float(s), r) for _, s, r in kept]
    assert metrics.episodes_dropped == len(expected) - len(kept)


def test_episode_log_rows_by_hand():
    log, count = new_episode_log(3)
    for k in range(5):  # one episode per call: env steps 10k, time k, return -k
        push_episode_log(log, count, torch.tensor([-float(k), 7.0]), torch.tensor([True, False]), 10 * k, float(k))
    assert int(count) == 5
    assert episode_log_rows(log, 5, 3) == ([(30.0, 3.0, -3.0), (40.0, 4.0, -4.0)], 0)
    assert episode_log_rows(log, 5, 0) == ([(20.0, 2.0, -2.0), (30.0, 3.0, -3.0), (40.0, 4.0, -4.0)], 2)
    with pytest.raises(ValueError, match="at least as many rows"):
        push_episode_log(log, count, torch.zeros(4), torch.ones(4, dtype=torch.bool), 0, 0.0)


def test_figure_plots_returns_against_env_steps_and_wall_time_and_metrics_below(tmp_path):
    metrics, arts = _fit(tmp_path, ScriptedEpisodes())
    episodes, history = metrics.episodes, metrics.history
    fig, axes = learning_curve_figure(history, episodes, panels=[("loss",), ("is_weight_mean",), ("absent",)])
    assert list(axes) == ["return_env_steps", "return_time", "loss", "is_weight_mean"]
    assert list(fig.axes) == list(axes.values())  # one figure, the panels top to bottom
    steps = [e["env_steps"] for e in episodes]
    for name, xs, xlabel in (("return_env_steps", steps, "env steps"),
                             ("return_time", [e["time_s"] for e in episodes], "wall time (s)")):
        ax = axes[name]
        assert ax.get_xlabel() == xlabel and ax.get_ylabel() == "episode return"
        points, mean = ax.get_lines()
        assert list(points.get_xdata()) == xs and list(points.get_ydata()) == [e["return"] for e in episodes]
        assert list(mean.get_ydata()) == [e["return_mean"] for e in episodes]
        assert all(math.isfinite(y) for y in mean.get_ydata())  # no gap for the epoch without an episode end
    for key in ("loss", "is_weight_mean"):
        ax = axes[key]
        (line,) = ax.get_lines()
        assert ax.get_xlabel() == "env steps" and ax.get_ylabel() == key
        assert list(line.get_xdata()) == [float((e + 1) * STEPS_PER_EPOCH * ENV_STEPS_PER_STEP)
                                          for e in range(EPOCHS)]
        assert list(line.get_ydata()) == [row[key] for row in history]
    png = tmp_path / "run" / "learning_curve.png"
    assert arts.summary["learning_curve"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_wandb_offline_run_has_episode_rows_keyed_by_env_steps(tmp_path, monkeypatch):
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DISABLED", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "wb"
    logger = AutoModeWandbLogger(save_dir=str(run_dir), project="p", name="curves", mode="offline",
                                 finish_on_end=True)
    metrics, _ = _fit(tmp_path, ScriptedEpisodes(), logger=logger)
    rows = read_wandb_history(run_dir, timeout_s=60.0)
    episode_rows = [r for r in rows if "episode/return" in r]
    expected = model_episodes(EPOCHS * STEPS_PER_EPOCH)
    assert [(r["episode/env_steps"], r["episode/return"]) for r in episode_rows] == [(s, r) for _, s, r in expected]
    means = [e["return_mean"] for e in metrics.episodes]
    assert [r["episode/return_mean"] for r in episode_rows] == pytest.approx(means)
    assert len([r for r in rows if "train/loss" in r]) == EPOCHS
    steps = read_wandb_step_metrics(run_dir)
    assert steps["episode/*"] == "episode/env_steps" and steps["train/*"] == "train/env_steps"


class _DeviceScriptedEpisodes(ScriptedEpisodes):
    """The same episodes with every step's inputs made on the module's device before training (no host data
    enters a step)."""

    def on_fit_start(self) -> None:
        steps = EPOCHS * STEPS_PER_EPOCH
        self._done = torch.tensor([_ends(s) for s in range(steps)], device=self.device)  # [S, N]
        self._returns = torch.tensor([[_return(s, i) for i in range(N_ENVS)] for s in range(steps)],
                                     device=self.device)  # [S, N]
        self.metrics.to(self.device)

    def training_step(self, batch, batch_idx):
        step = self.global_step
        t = time.monotonic()
        self.step_times.append(t)
        push_episode_log(self.episode_log, self.episode_log_count, self._returns[step], self._done[step],
                         env_steps=(step + 1) * ENV_STEPS_PER_STEP, time_s=t)
        loss = self.lin(batch.float().unsqueeze(1)).pow(2).mean()
        self.metrics.add("loss", loss.detach())
        return loss


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_episode_log_on_gpu_never_syncs_inside_steps_and_reads_back_the_model(tmp_path):
    from test_callbacks_gpu import _SyncGuardOff, _SyncGuardOn

    module = _DeviceScriptedEpisodes()
    metrics = AsyncMetricsCallback(prog_bar=False, return_window=3)
    trainer = pl.Trainer(default_root_dir=str(tmp_path), max_epochs=EPOCHS, accelerator="gpu", devices=1,
                         logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, callbacks=[_SyncGuardOn(), metrics, _SyncGuardOff()])
    trainer.fit(module)
    expected = model_episodes(EPOCHS * STEPS_PER_EPOCH)
    assert [(r["env_steps"], r["return"]) for r in metrics.episodes] == [(float(s), r) for _, s, r in expected]


def test_a_resumed_run_continues_the_episode_series(tmp_path):
    """The log is not checkpointed (a fresh one after resume); the callback's rows are: the series after resume
    is the uninterrupted model's, indices and clock continuing."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    def fit(epochs, ckpt_path=None, callbacks=()):
        metrics = AsyncMetricsCallback(prog_bar=False, return_window=3)
        pl.Trainer(default_root_dir=str(tmp_path), max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                   enable_progress_bar=False, enable_model_summary=False, callbacks=[metrics, *callbacks],
                   enable_checkpointing=bool(callbacks)).fit(ScriptedEpisodes(), ckpt_path=ckpt_path)
        return metrics

    first = fit(2, callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)])
    resumed = fit(EPOCHS, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    expected = model_episodes(EPOCHS * STEPS_PER_EPOCH)
    rows = resumed.episodes
    assert [(r["episode"], r["env_steps"], r["return"]) for r in rows] == [
        (k, float(s), r) for k, (_, s, r) in enumerate(expected)]
    assert rows[:len(first.episodes)] == first.episodes
    assert all(b["time_s"] >= a["time_s"] for a, b in zip(rows, rows[1:]))
    returns = [r for _, _, r in expected]
    assert rows[-1]["return_mean"] == pytest.approx(sum(returns[-3:]) / 3)  # the window spans the resume
