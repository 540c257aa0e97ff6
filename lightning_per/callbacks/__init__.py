"""Lightning callbacks that read device-side metrics without per-step host synchronisations.

- :class:`AsyncMetricsCallback`: once an epoch, copies a module's metrics to the host asynchronously and logs
  them (the device-side metrics themselves, :class:`~lightning_per.metrics.MetricAccumulator` and the episode
  rings, live in :mod:`lightning_per.metrics`).
- :class:`RunArtifactsCallback`: ``summary.json``, a learning-curve PNG and a final line at the end of fit.
- :class:`AutoModeWandbLogger` / :func:`make_wandb_logger`: W&B offline unless credentials are configured;
  :func:`run_metadata`: the versions and machine a run's W&B config records.
- :class:`AtomicCheckpointIO`: crash-safe local checkpoints.
"""

from lightning_per.callbacks.async_metrics import AsyncMetricsCallback
from lightning_per.callbacks.checkpoint_io import AtomicCheckpointIO
from lightning_per.callbacks.run_artifacts import RunArtifactsCallback, save_learning_curve
from lightning_per.callbacks.wandb_utils import (
    AutoModeWandbLogger,
    make_wandb_logger,
    read_wandb_config,
    read_wandb_history,
    read_wandb_run_id,
    read_wandb_step_metrics,
    resolve_wandb_mode,
    run_metadata,
)

__all__ = [
    "AsyncMetricsCallback",
    "RunArtifactsCallback",
    "AutoModeWandbLogger",
    "make_wandb_logger",
    "AtomicCheckpointIO",
    "read_wandb_config",
    "read_wandb_history",
    "read_wandb_run_id",
    "read_wandb_step_metrics",
    "resolve_wandb_mode",
    "run_metadata",
    "save_learning_curve",
]
