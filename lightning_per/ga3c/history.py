"""``history.csv`` of a GA3C run: Lightning's ``CSVLogger``, fed by the epoch rows of
:class:`~lightning_per.callbacks.AsyncMetricsCallback`."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger

__all__ = ["EpochCSVLogger"]


class EpochCSVLogger(CSVLogger):
    """``CSVLogger`` writing ``<save_dir>/<file_name>``: one row per epoch, one column per logged metric
    (named as in the callback's history, without its ``prefix``; sorted, as ``CSVLogger`` does), ``step`` =
    optimizer steps, plus the epoch row's ``global_step``,
    ``time_s`` and ``epoch_time_s`` (seconds) from ``metrics_cb``'s history. The callback's per-episode rows
    (``episode/*``) are left to ``episodes.csv``; a NaN (nothing observed that epoch) is an empty cell. The
    file is written at each epoch end (the callback calls :meth:`save`), so an interrupted run keeps the
    epochs it logged. Hyper-parameters are not written (the run's ``config.yaml`` holds them).

    Args:
        save_dir: the run directory.
        metrics_cb: the run's :class:`~lightning_per.callbacks.AsyncMetricsCallback` (None: metrics only).
        file_name: a plain file name.

    Raises:
        ValueError: ``file_name`` with a directory part, or empty.

    Example::

        logger = EpochCSVLogger(run_dir, metrics_cb)
        path = logger.open()  # before anything else is written in run_dir
        trainer = pl.Trainer(logger=logger, callbacks=[metrics_cb], ...)
    """

    def __init__(self, save_dir: str | os.PathLike[str], metrics_cb: Any = None,
                 file_name: str = "history.csv") -> None:
        if not file_name or os.sep in file_name or (os.altsep and os.altsep in file_name):
            raise ValueError(f"file_name must be a plain file name, got {file_name!r}")
        super().__init__(save_dir, name="", version="", flush_logs_every_n_steps=1)
        self.metrics_cb, self.file_name = metrics_cb, file_name
        self.path = Path(save_dir) / file_name

    def open(self) -> Path:
        """Create the writer (call it while the run directory is still empty: ``CSVLogger`` warns about a
        directory with files in it) and point it at :attr:`path`; returns that path."""
        writer = self.experiment  # rank zero only; a no-op stand-in elsewhere
        writer.metrics_file_path = str(self.path)
        return self.path

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """Nothing: ``config.yaml`` holds the run's configuration."""

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Log an epoch row (it has ``epoch``); rows without it (``episode/*``) are dropped."""
        if "epoch" not in metrics:
            return
        prefix = getattr(self.metrics_cb, "prefix", "") or ""
        row = {k[len(prefix):] if prefix and k.startswith(prefix) else k:
               None if isinstance(v, float) and math.isnan(v) else v for k, v in metrics.items()}
        history = self.metrics_cb.history if self.metrics_cb is not None else []
        if history and history[-1].get("epoch") == metrics["epoch"]:
            row.update({k: history[-1][k] for k in ("global_step", "time_s", "epoch_time_s") if k in history[-1]})
        super().log_metrics(row, step)
