"""Lightning callbacks that read device-side metrics without per-step host synchronisations.

- :class:`MetricAccumulator`: the device-side running metrics a module keeps (the protocol; it lives in
  :mod:`lightning_per.metrics` with the episode rings and is re-exported here).
- :class:`AsyncMetricsCallback`: once an epoch, copies them to the host asynchronously and logs them.
- :class:`RunArtifactsCallback`: ``summary.json``, a learning-curve PNG and a final line at the end of fit.
- :class:`AutoModeWandbLogger` / :func:`make_wandb_logger`: W&B offline unless credentials are configured.
- :class:`AtomicCheckpointIO`: crash-safe local checkpoints.
- episode-return ring helpers (:mod:`lightning_per.metrics.episodes`, re-exported here).
"""

from lightning_per.callbacks.async_metrics import AsyncMetricsCallback
from lightning_per.callbacks.checkpoint_io import AtomicCheckpointIO
from lightning_per.callbacks.run_artifacts import RunArtifactsCallback, save_learning_curve
from lightning_per.callbacks.wandb_utils import (
    AutoModeWandbLogger,
    make_wandb_logger,
    read_wandb_history,
    read_wandb_step_metrics,
    resolve_wandb_mode,
)
from lightning_per.metrics import (
    MetricAccumulator,
    episode_log_rows,
    new_episode_log,
    new_episode_ring,
    push_episode_log,
    push_episode_returns,
    recent_mean_return,
    reduce_across_ranks,
)

__all__ = [
    "MetricAccumulator",
    "AsyncMetricsCallback",
    "RunArtifactsCallback",
    "AutoModeWandbLogger",
    "make_wandb_logger",
    "AtomicCheckpointIO",
    "read_wandb_history",
    "read_wandb_step_metrics",
    "resolve_wandb_mode",
    "reduce_across_ranks",
    "new_episode_ring",
    "push_episode_returns",
    "recent_mean_return",
    "new_episode_log",
    "push_episode_log",
    "episode_log_rows",
    "save_learning_curve",
]
