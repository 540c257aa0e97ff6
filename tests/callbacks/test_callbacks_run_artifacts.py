"""RunArtifactsCallback (summary.json, PNG, final line), atomic writes and AtomicCheckpointIO."""

from __future__ import annotations

import csv
import json
import logging
import os
import pickle

import lightning.pytorch as pl
import pytest
import torch
from _callbacks_toy import STEPS, ToyModule, expected_episode_returns, trainer_kwargs
from lightning.pytorch.callbacks import ModelCheckpoint

try:
    from lightning.pytorch.utilities.exceptions import SIGTERMException
except ImportError:  # older Lightning
    SIGTERMException = None

from lightning_per.callbacks import AsyncMetricsCallback, AtomicCheckpointIO, RunArtifactsCallback
from lightning_per.callbacks.run_artifacts import format_final_line
from lightning_per.utils import atomic_torch_save, atomic_write, atomic_write_text

REQUIRED = {"mean_return", "env_steps", "updates", "wall_time_s", "updates_per_s", "world_size", "device"}


def test_summary_contents_plot_and_final_line(tmp_path, caplog):
    out = tmp_path / "run"
    arts = RunArtifactsCallback(dirpath=str(out), window=5)
    trainer = pl.Trainer(callbacks=[AsyncMetricsCallback(), arts], **trainer_kwargs(tmp_path, logger=False))
    with caplog.at_level(logging.INFO):
        trainer.fit(ToyModule())
    summary = json.loads((out / "summary.json").read_text())
    assert REQUIRED <= set(summary)
    returns = expected_episode_returns(3)
    assert summary["mean_return"] == pytest.approx(sum(returns[-5:]) / 5)
    assert summary["episodes"] == len(returns) == 3 * STEPS and summary["mean_return_episodes"] == 5
    assert summary["updates"] == trainer.global_step == 3 * STEPS  # no `updates` attr or metric: global_step
    assert summary["env_steps"] is None  # the toy has neither an attribute nor a metric of that name
    assert summary["epochs"] == 3 and summary["world_size"] == 1 and summary["device"] == "cpu"
    assert summary["status"] == "done" and summary["wall_time_s"] > 0
    assert summary["updates_per_s"] == pytest.approx(summary["updates"] / summary["wall_time_s"])
    assert summary["metrics"]["value_max"] == 27.0 and summary["metrics"]["never"] is None  # NaN -> null
    png = out / "learning_curve.png"
    assert summary["learning_curve"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.DictReader((out / "history.csv").open()))  # one row per epoch, as the callback logged
    assert summary["history"] == str(out / "history.csv") and [r["epoch"] for r in rows] == ["0", "1", "2"]
    assert float(rows[-1]["value_max"]) == 27.0 and rows[-1]["never"] == ""  # NaN -> empty cell
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp files left
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("done:")]
    assert lines == [arts.final_line] and lines[0].endswith(str(out / "summary.json"))


def test_counters_from_module_attributes_and_default_dir(tmp_path):
    class WithCounters(ToyModule):
        def __init__(self):
            super().__init__()
            self.register_buffer("env_steps", torch.tensor(98_304))
            self.updates = 1_530

    trainer = pl.Trainer(callbacks=[RunArtifactsCallback(plot=False, verbose=False)],
                         **trainer_kwargs(tmp_path, logger=False, max_epochs=1))
    trainer.fit(WithCounters())
    summary = json.loads((tmp_path / "summary.json").read_text())  # default_root_dir
    assert summary["env_steps"] == 98_304 and summary["updates"] == 1_530
    assert summary["metrics"] == {} and summary["learning_curve"] is None  # no AsyncMetricsCallback


def test_failed_run_still_writes_a_summary(tmp_path):
    class Boom(ToyModule):
        def training_step(self, batch, batch_idx):
            if self.current_epoch == 1:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    arts = RunArtifactsCallback(verbose=False)
    trainer = pl.Trainer(callbacks=[AsyncMetricsCallback(), arts], **trainer_kwargs(tmp_path, logger=False))
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Boom())
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["metrics"]["epoch"] == 0


def test_wall_time_survives_resume():
    arts = RunArtifactsCallback()
    arts.load_state_dict({"version": 1, "wall_time_s": 12.5})
    assert arts.wall_time_s() == 12.5 and arts.state_dict()["wall_time_s"] == 12.5


def test_format_final_line():
    s = {"status": "done", "epochs": 120, "env_steps": 98304, "mean_return": 487.34,
         "mean_return_episodes": 20, "wall_time_s": 133.0, "updates_per_s": 1530.2}
    assert format_final_line(s, "runs/x/summary.json") == (
        "done: 120 epochs, 98,304 env steps, mean return 487.3 (last 20), 2m13s, 1,530 updates/s "
        "-> runs/x/summary.json")


def test_bad_arguments():
    with pytest.raises(ValueError, match="window"):
        RunArtifactsCallback(window=0)
    with pytest.raises(ValueError, match="summary_name"):
        RunArtifactsCallback(summary_name="a/b.json")


# ------------------------------------------------------------------------------------ atomic writes
def test_atomic_write_keeps_old_file_when_writer_fails(tmp_path):
    path = tmp_path / "summary.json"
    atomic_write_text(path, "old")

    def fail(f):
        f.write(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, fail)
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["summary.json"]
    with pytest.raises(ValueError, match="local path"):
        atomic_write_text("s3://bucket/x.json", "x")
    with pytest.raises(ValueError, match="directory"):
        atomic_write_text(tmp_path, "x")


def test_atomic_torch_save_roundtrip_and_unpicklable(tmp_path):
    path = tmp_path / "sub" / "obj.pt"
    atomic_torch_save({"a": torch.arange(3)}, path)
    assert torch.equal(torch.load(path)["a"], torch.arange(3))
    with pytest.raises((AttributeError, TypeError, pickle.PicklingError)):
        atomic_torch_save({"f": lambda: 0}, path)  # pickling fails before the file is touched
    assert torch.equal(torch.load(path)["a"], torch.arange(3))


def test_atomic_checkpoint_io_with_trainer_and_resume(tmp_path, monkeypatch):
    replaced = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (replaced.append(str(b)), real_replace(a, b))[1])
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    kw = trainer_kwargs(tmp_path, logger=False, enable_checkpointing=True, max_epochs=1)
    pl.Trainer(callbacks=[ckpt], plugins=[AtomicCheckpointIO()], **kw).fit(ToyModule())
    assert any(p.endswith(".ckpt") for p in replaced)
    kw["max_epochs"] = 2
    trainer = pl.Trainer(plugins=[AtomicCheckpointIO()], **kw)
    trainer.fit(ToyModule(), ckpt_path=ckpt.last_model_path)
    assert trainer.global_step == 2 * STEPS
    with pytest.raises(TypeError, match="storage_options"):
        AtomicCheckpointIO().save_checkpoint({}, tmp_path / "x.ckpt", storage_options={"a": 1})


def test_atomic_writes_get_the_mode_a_plain_open_gives(tmp_path):
    """0666 & ~umask (the temp file from mkstemp starts at 0600)."""
    import stat

    from lightning_per.utils import atomic_write_text

    old = os.umask(0o027)
    try:
        path = atomic_write_text(tmp_path / "summary.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640


@pytest.mark.skipif(not isinstance(SIGTERMException, type), reason="this Lightning has no SIGTERMException")
def test_sigterm_run_is_interrupted_not_failed(tmp_path):
    """A run stopped by SIGTERM (preemption, `timeout`) is labelled like Ctrl-C, not as a failure."""
    class Term(ToyModule):
        def training_step(self, batch, batch_idx):
            if self.current_epoch == 1:
                raise SIGTERMException(15)
            return super().training_step(batch, batch_idx)

    trainer = pl.Trainer(callbacks=[AsyncMetricsCallback(), RunArtifactsCallback(verbose=False)],
                         **trainer_kwargs(tmp_path, logger=False))
    with pytest.raises(SIGTERMException):
        trainer.fit(Term())
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["metrics"]["epoch"] == 0
