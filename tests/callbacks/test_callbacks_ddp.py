"""AsyncMetricsCallback under DDP: one all_gather + reduction per epoch, logged once by rank 0."""

from __future__ import annotations

import csv
import math

import lightning.pytorch as pl
import pytest
import torch
from _callbacks_toy import ToyModule, expected_epoch, trainer_kwargs
from lightning.pytorch.loggers import CSVLogger

from lightning_per.callbacks import AsyncMetricsCallback

_TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")


@pytest.mark.parametrize("accelerator", [pytest.param("cpu", marks=pytest.mark.slow),
                                         pytest.param("gpu", marks=[pytest.mark.gpu, _TWO_GPUS])])
def test_two_ranks_reduce_once_per_epoch(tmp_path, accelerator):
    """Each rank sees half the data. Across ranks means are averaged, sums summed, max/min taken, so
    every metric except ``value_last`` (mean of the ranks' last batches: order-dependent) equals the
    single-process value; each rank runs 2 steps an epoch."""
    logger = CSVLogger(save_dir=str(tmp_path), name="ddp", version=0)
    trainer = pl.Trainer(callbacks=[AsyncMetricsCallback()], **trainer_kwargs(
        tmp_path, logger=logger, accelerator=accelerator, devices=2, strategy="ddp_spawn"))
    trainer.fit(ToyModule())
    with open(tmp_path / "ddp" / "version_0" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/value_mean")]
    assert len(rows) == 3  # rank 0 logs once an epoch
    for e, row in enumerate(rows):
        assert int(row["epoch"]) == e and int(row["step"]) == 2 * (e + 1)
        for k, v in expected_epoch(e).items():
            got = float(row[f"train/{k}"])
            if k == "value_last":
                assert 10 * e <= got <= 7 + 10 * e
            else:
                assert (math.isnan(got) if math.isnan(v) else got == pytest.approx(v)), (e, k, got, v)
