"""AsyncMetricsCallback: what reaches the loggers (mocked wandb), the progress bar, resume, bad inputs."""

from __future__ import annotations

import math
import sys
from types import SimpleNamespace
from unittest.mock import MagicMock, Mock

import lightning.pytorch as pl
import pytest
import torch
from _callbacks_toy import KINDS, STEPS, ToyModule, expected_epoch, trainer_kwargs
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_per.callbacks import AsyncMetricsCallback, AutoModeWandbLogger
from lightning_per.metrics import reduce_across_ranks


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b)


@pytest.fixture
def wandb_mock(monkeypatch):
    """A fake ``wandb`` module, as Lightning's own logger tests do (no service, no files)."""

    class RunType:  # stands in for wandb.wandb_run.Run
        pass

    class RunDisabledType:
        pass

    wandb = MagicMock(name="wandb")
    wandb.run = None
    run = Mock(name="run", id="abcd1234")
    run.name = "toy"
    wandb.init.return_value = run
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    monkeypatch.setitem(sys.modules, "wandb.sdk", Mock(lib=Mock(RunDisabled=RunDisabledType)))
    monkeypatch.setitem(sys.modules, "wandb.sdk.lib", Mock(RunDisabled=RunDisabledType))
    monkeypatch.setitem(sys.modules, "wandb.wandb_run", Mock(Run=RunType))
    return wandb


@pytest.fixture
def no_wandb_credentials(monkeypatch, tmp_path):
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_DISABLED",
                "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))


def test_one_log_call_per_epoch_with_right_values(tmp_path, wandb_mock, no_wandb_credentials):
    logger = AutoModeWandbLogger(save_dir=str(tmp_path), project="p", name="toy")
    cb = AsyncMetricsCallback()
    trainer = pl.Trainer(logger=logger, callbacks=[cb], **trainer_kwargs(tmp_path))
    trainer.fit(ToyModule())

    init_kw = wandb_mock.init.call_args.kwargs
    assert init_kw["mode"] == "offline" and init_kw["dir"] == str(tmp_path) and init_kw["project"] == "p"
    calls = wandb_mock.init.return_value.log.call_args_list
    assert len(calls) == 3, calls  # nothing else is logged: one row per epoch
    for e, call in enumerate(calls):
        row = call.args[0]
        assert row["epoch"] == e and row["trainer/global_step"] == STEPS * (e + 1)
        exp = expected_epoch(e)
        assert set(row) == {f"train/{k}" for k in KINDS} | {"epoch", "trainer/global_step"}
        for k, v in exp.items():
            assert same(row[f"train/{k}"], v), (e, k, row[f"train/{k}"], v)
    assert [h["epoch"] for h in cb.history] == [0, 1, 2]
    assert all(h["time_s"] >= 0 and h["epoch_time_s"] >= 0 for h in cb.history)
    # Values also reach the monitors and the bar (host values, NaN hidden from the bar).
    assert float(trainer.callback_metrics["train/value_max"]) == expected_epoch(2)["value_max"]
    bar = trainer.progress_bar_metrics
    assert bar["value_mean"] == expected_epoch(2)["value_mean"] and "never" not in bar


def test_step_by_epoch_prefix_and_prog_bar_subset(tmp_path):
    logger = MagicMock(spec=pl.loggers.Logger)
    cb = AsyncMetricsCallback(prefix="", step="epoch", prog_bar=["value_min"])
    trainer = pl.Trainer(logger=logger, callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=2))
    trainer.fit(ToyModule())
    steps = [c.kwargs["step"] for c in logger.log_metrics.call_args_list]
    assert steps == [0, 1]
    assert "value_min" in logger.log_metrics.call_args_list[0].args[0]
    bar = trainer.progress_bar_metrics
    assert bar == {"value_min": expected_epoch(1)["value_min"]}


def test_resume_continues_history(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    cb = AsyncMetricsCallback()
    pl.Trainer(callbacks=[cb, ckpt], **trainer_kwargs(tmp_path, max_epochs=2, logger=False,
                                                         enable_checkpointing=True)).fit(ToyModule())
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)
    state = saved["callbacks"][cb.state_key]
    assert [h["epoch"] for h in state["history"]] == [0, 1]

    cb2 = AsyncMetricsCallback()
    trainer = pl.Trainer(callbacks=[cb2], **trainer_kwargs(tmp_path, max_epochs=4, logger=False))
    trainer.fit(ToyModule(), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    hist = cb2.history
    assert [h["epoch"] for h in hist] == [0, 1, 2, 3]
    assert [h["steps"] for h in hist] == [expected_epoch(e)["steps"] for e in range(4)]  # persistent carried
    assert hist[2]["time_s"] >= hist[1]["time_s"]  # the clock continues after resume


def test_state_dict_roundtrip_and_version():
    cb = AsyncMetricsCallback()
    cb.load_state_dict({"version": 1, "history": [{"epoch": 0, "time_s": 2.5, "loss": 1.0}]})
    assert cb.state_dict()["history"] == [{"epoch": 0, "time_s": 2.5, "loss": 1.0}]
    with pytest.raises(ValueError, match="version"):
        cb.load_state_dict({"version": 99, "history": []})


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="step"):
        AsyncMetricsCallback(step="batch")
    with pytest.raises(TypeError, match="prog_bar"):
        AsyncMetricsCallback(prog_bar="loss")
    with pytest.raises(ValueError, match="rank_ops"):
        AsyncMetricsCallback(rank_ops={"loss": "median"})


def test_module_without_accumulator_is_rejected(tmp_path):
    class NoMetrics(ToyModule):
        def __init__(self):
            super().__init__()
            self.metrics = None

    trainer = pl.Trainer(callbacks=[AsyncMetricsCallback()], **trainer_kwargs(tmp_path, logger=False))
    with pytest.raises(TypeError, match="pl_module.metrics"):
        trainer.fit(NoMetrics())


def test_ddp_hook_reduces_once_per_epoch_with_fake_strategy():
    """world_size > 1: all_gather (W, M) then the per-kind reduction, before the copy."""
    module = SimpleNamespace(metrics=ToyModule().metrics)
    for name in KINDS:
        if name != "never":
            module.metrics.add(name, 1.0)
    other = torch.tensor([3.0, 5.0, 4.0, -2.0, 7.0, 2.0, math.nan], dtype=torch.float64)
    strategy = Mock()
    strategy.all_gather.side_effect = lambda t: torch.stack([t, other])
    trainer = SimpleNamespace(world_size=2, strategy=strategy, current_epoch=0, global_step=4,
                              is_global_zero=True, loggers=[], callback_metrics={}, progress_bar_metrics={})
    cb = AsyncMetricsCallback()
    cb.on_train_epoch_end(trainer, module)
    row = cb.history[0]
    assert strategy.all_gather.call_count == 1
    assert row["value_mean"] == 2.0 and row["value_sum"] == 6.0  # mean over ranks, sum over ranks
    assert row["value_max"] == 4.0 and row["value_min"] == -2.0 and row["value_last"] == 4.0
    assert row["steps"] == 3.0 and math.isnan(row["never"])


def test_reduce_across_ranks_ignores_nan_ranks():
    g = torch.tensor([[1.0, math.nan, 2.0, math.nan], [3.0, 4.0, math.nan, math.nan]])
    out = reduce_across_ranks(g, ["mean", "max", "min", "mean"])
    assert out[:3].tolist() == [2.0, 4.0, 2.0] and math.isnan(out[3])
    with pytest.raises(ValueError, match="ops"):
        reduce_across_ranks(g, ["mean", "median", "min", "max"])
    with pytest.raises(ValueError, match="shape"):
        reduce_across_ranks(g[0], ["mean"])
