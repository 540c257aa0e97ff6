"""history.csv of a GA3C run: Lightning's CSVLogger fed by AsyncMetricsCallback's epoch rows."""

import csv
import math
from types import SimpleNamespace

import pytest

from lightning_per.ga3c.history import EpochCSVLogger


def test_epoch_rows_become_history_csv_and_episode_rows_are_dropped(tmp_path):
    rows = [{"epoch": 0, "global_step": 5, "time_s": 1.5, "epoch_time_s": 1.5, "loss": 2.0}]
    cb = SimpleNamespace(prefix="train/", history=rows)
    logger = EpochCSVLogger(tmp_path, cb)
    path = logger.open()
    assert path == tmp_path / "history.csv"
    logger.log_hyperparams({"lr": 1e-3})  # config.yaml holds them: nothing written
    logger.log_metrics({"episode/return": 3.0, "episode/env_steps": 10}, step=10)
    logger.log_metrics({"train/loss": 2.0, "train/mean_return": math.nan, "epoch": 0}, step=5)
    logger.save()
    rows.append({"epoch": 1, "global_step": 9, "time_s": 2.5, "epoch_time_s": 1.0, "loss": 1.0})
    logger.log_metrics({"train/loss": 1.0, "train/mean_return": 7.0, "epoch": 1}, step=9)
    logger.finalize("success")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history.csv"]
    with open(path) as fh:
        got = list(csv.DictReader(fh))
    assert [r["epoch"] for r in got] == ["0", "1"] and [r["step"] for r in got] == ["5", "9"]
    assert [r["global_step"] for r in got] == ["5", "9"] and [r["time_s"] for r in got] == ["1.5", "2.5"]
    assert [r["loss"] for r in got] == ["2.0", "1.0"] and [r["mean_return"] for r in got] == ["", "7.0"]
    assert not any(k.startswith(("episode/", "train/")) for k in got[0])


@pytest.mark.parametrize("name", ["", "a/history.csv"])
def test_a_file_name_with_a_directory_is_refused(tmp_path, name):
    with pytest.raises(ValueError, match="file_name"):
        EpochCSVLogger(tmp_path, file_name=name)
