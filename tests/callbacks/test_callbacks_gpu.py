"""CUDA paths of AsyncMetricsCallback: pinned copy on a side stream, no host sync inside steps."""

from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace
from unittest.mock import MagicMock

import lightning.pytorch as pl
import pytest
import torch
from _callbacks_toy import KINDS, ToyModule, expected_epoch, trainer_kwargs
from lightning.pytorch.callbacks import Callback

from lightning_per.callbacks import AsyncMetricsCallback, RunArtifactsCallback
from lightning_per.metrics import MetricAccumulator

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@contextlib.contextmanager
def sync_errors():
    """Any host<->device synchronisation inside raises (torch.cuda.set_sync_debug_mode)."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


class _SyncGuardOn(Callback):
    """First in the callback list: syncs raise from here on (each step, and our epoch-end snapshot)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        torch.cuda.set_sync_debug_mode("error")

    def on_train_epoch_end(self, trainer, pl_module):
        torch.cuda.set_sync_debug_mode("error")


class _SyncGuardOff(Callback):
    """Last in the callback list: syncs allowed again (Lightning's own loop between steps)."""

    def on_train_epoch_end(self, trainer, pl_module):
        torch.cuda.set_sync_debug_mode("default")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        torch.cuda.set_sync_debug_mode("default")

    def on_exception(self, trainer, pl_module, exception):
        torch.cuda.set_sync_debug_mode("default")


def _fake_trainer(logger):
    return SimpleNamespace(world_size=1, strategy=None, current_epoch=0, global_step=7, is_global_zero=True,
                           loggers=[logger], callback_metrics={}, progress_bar_metrics={})


def test_accumulator_add_compute_reset_never_sync():
    kinds = {"m": "mean", "s": "sum", "hi": "max", "lo": "min", "l": "last", "eps": "last"}
    acc = MetricAccumulator(kinds, device="cuda", persistent=("eps",))
    x = torch.tensor([2.0, 5.0], device="cuda")  # made from host data: these copies sync
    two = torch.tensor(2.0, device="cuda")
    with sync_errors():
        for name in ("m", "s", "hi", "lo", "l"):
            acc.add(name, x.sum())  # device value
            acc.add(name, 1.0)  # Python number
        acc.add("m", x.sum(), two)
        acc.add("eps", 0.25)
        names, stacked = acc.compute_stacked()
        acc.reset()
        after = acc.compute_stacked()[1]
    got = dict(zip(names, stacked.tolist()))
    assert got == {"m": 15.0 / 4.0, "s": 8.0, "hi": 7.0, "lo": 1.0, "l": 1.0, "eps": 0.25}
    after = dict(zip(names, after.tolist()))
    assert after["s"] == 0.0 and after["eps"] == 0.25 and math.isnan(after["m"]) and math.isnan(after["hi"])


def test_snapshot_and_poll_never_sync_and_values_arrive():
    acc = MetricAccumulator({"loss": "mean", "hi": "max", "n": "sum"}, device="cuda", persistent=("n",))
    module = SimpleNamespace(metrics=acc, device=acc.device)
    logger = MagicMock()
    trainer = _fake_trainer(logger)
    cb = AsyncMetricsCallback()
    cb.on_train_start(trainer, module)  # side stream + kernel warm-up (both sync once, before training)
    assert cb.history == [] and cb.pending == 0  # the warm-up snapshot is not logged
    x = torch.arange(1, 5, device="cuda", dtype=torch.float32)  # [4]
    with sync_errors():
        acc.add("loss", x.sum(), x.numel())
        acc.add("hi", x.max())
        acc.add("n", 4.0)
        torch.cuda._sleep(int(5e8))  # keep the GPU busy (>0.25 s) so the copy is still in flight
        cb.on_train_epoch_end(trainer, module)  # snapshot + reset: no sync
        assert cb.pending == 1
        item = cb._pending[0]
        assert item.host.is_pinned() and item.event is not None and item.source is not None
        for i in range(3):
            cb.on_train_batch_start(trainer, module, None, i)  # polls: no sync
        assert cb.pending == 1 and logger.log_metrics.call_count == 0
        acc.add("loss", 100.0)  # next epoch's values do not leak into the snapshot
    cb.on_train_end(trainer, module)  # drain: the one sync
    assert cb.pending == 0 and logger.log_metrics.call_count == 1
    assert cb.history[0]["loss"] == 2.5 and cb.history[0]["hi"] == 4.0 and cb.history[0]["n"] == 4.0
    assert logger.log_metrics.call_args.kwargs["step"] == 7
    assert trainer.progress_bar_metrics == {"loss": 2.5, "hi": 4.0, "n": 4.0}


def test_fit_on_gpu_has_no_sync_inside_steps(tmp_path):
    cb = AsyncMetricsCallback()
    arts = RunArtifactsCallback(verbose=False)
    trainer = pl.Trainer(callbacks=[_SyncGuardOn(), cb, arts, _SyncGuardOff()],
                         **trainer_kwargs(tmp_path, logger=False, accelerator="gpu"))
    trainer.fit(ToyModule())
    assert [h["epoch"] for h in cb.history] == [0, 1, 2]
    for e, row in enumerate(cb.history):
        for k, v in expected_epoch(e).items():
            assert (math.isnan(row[k]) if math.isnan(v) else row[k] == pytest.approx(v)), (e, k)
    assert set(cb.history[0]) >= set(KINDS)
    assert arts.summary["device"].startswith("cuda") and arts.summary["mean_return"] is not None


def test_sync_at_epoch_end_publishes_before_next_epoch():
    acc = MetricAccumulator({"loss": "mean"}, device="cuda")
    module = SimpleNamespace(metrics=acc, device=acc.device)
    trainer = _fake_trainer(MagicMock())
    cb = AsyncMetricsCallback(sync_at_epoch_end=True)
    acc.add("loss", 3.0)
    cb.on_train_epoch_end(trainer, module)
    assert cb.pending == 0 and cb.history[0]["loss"] == 3.0
    assert float(trainer.callback_metrics["train/loss"]) == 3.0

