"""Device-side metrics with no Lightning dependency: what training modules write and callbacks read.

- :class:`MetricAccumulator`: running metrics in one device tensor, updated in place (no host sync).
- episode rings and logs (:mod:`lightning_per.metrics.episodes`): recent returns and per-episode rows on the
  device, written with fixed shapes (CUDA-graph capturable).
- :func:`reduce_across_ranks`: per-rank metric vectors combined on the device (DDP).

The modules (:mod:`lightning_per.dqn`, :mod:`lightning_per.ga3c`) and the callbacks
(:mod:`lightning_per.callbacks`) both depend on this package; it depends on neither.
"""

from lightning_per.metrics.accumulator import MetricAccumulator
from lightning_per.metrics.episodes import (
    episode_log_rows,
    new_episode_log,
    new_episode_ring,
    push_episode_log,
    push_episode_returns,
    recent_mean_return,
)
from lightning_per.metrics.ranks import reduce_across_ranks

__all__ = [
    "MetricAccumulator",
    "episode_log_rows",
    "new_episode_log",
    "new_episode_ring",
    "push_episode_log",
    "push_episode_returns",
    "recent_mean_return",
    "reduce_across_ranks",
]
