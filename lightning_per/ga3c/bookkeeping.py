"""The GA3C module's host-side bookkeeping (:class:`HostBookkeeping`, a component the module holds).

Host counters folded into the device metrics, the episode ring and the episode log once an epoch (Python numbers
and pinned non-blocking copies: no device synchronisation), and the run's host summary with its ``episodes.csv``
rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from lightning_per.actors.stats import Snapshot, Stats, agent_time_shares, lag_max, lag_quantile, rates
from lightning_per.metrics.episodes import episode_table

if TYPE_CHECKING:
    from lightning_per.ga3c.config import GA3CConfig
    from lightning_per.ga3c.system import GA3CSystem
    from lightning_per.metrics import MetricAccumulator

__all__ = ["EpisodeBuffers", "HostBookkeeping", "RING"]

RING = 100  # episode returns kept in the device ring (``episode_returns_ring``)


class EpisodeBuffers(NamedTuple):
    """The module's episode ring and log buffers, as registered at the time of the call.

    Registered buffers are replaced by ``.to(device)``: read them from the module at each call, never keep them.

    Attributes:
        returns_ring: (RING,) float32, the ``episode_returns_ring`` (:mod:`lightning_per.metrics.episodes`).
        returns_count: () int64, the ``episode_returns_count``.
        log: (cap, 3) float64, the ``episode_log``: ``(env steps, time, return)`` rows.
        log_count: () int64, the ``episode_log_count``.

    All four on the module's device.
    """

    returns_ring: Tensor
    returns_count: Tensor
    log: Tensor
    log_count: Tensor


class HostBookkeeping:
    """The host-side bookkeeping of one GA3C module, a component it holds.

    :class:`~lightning_per.actors.stats.Stats` counters folded into the device metrics once an epoch, the episode
    ring and log kept in step with the stats, and the run's summary with its ``episodes.csv`` rows.

    Args:
        cfg: the run configuration (``frame_skip``, ``return_window`` and the summary's settings).
        stats: the host counters of this fit (replaced by :meth:`start` when a fit starts with new ones).
        metrics: the module's device metrics, into which :meth:`publish` adds host numbers.

    Attributes:
        stats: the host counters read.
        epoch_snap: the stats' snapshot where this epoch's window began (:meth:`begin_epoch`, :meth:`start`): the
            rates, lag quantiles and agents' time shares of a :meth:`publish` cover the whole window, so a second
            publish in one epoch (a stop inside it) replaces the first one's with the longer window's.
        published_snap: the stats' snapshot at the last :meth:`publish` (or :meth:`start`): the sums of the mean
            metrics (batch size, policy lag, episode returns) are added from it, each once.
        epoch_agent_time, agent_time_read: (max_agents, 4) float64 seconds, the agents' time (``AGENT_TIME``) where
            the epoch's window began and at the last :meth:`publish`; None: zero (the system's start).
        ring_synced: episodes counted into the episode ring (-1: never synced).
        log_synced: episodes copied into the episode log.
    """

    def __init__(self, cfg: GA3CConfig, stats: Stats, metrics: MetricAccumulator) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.stats = stats
        self.epoch_snap: Snapshot = stats.snapshot()
        self.published_snap: Snapshot = self.epoch_snap
        self.epoch_agent_time: np.ndarray | None = None
        self.agent_time_read: np.ndarray | None = None
        self.ring_synced = -1
        self.log_synced = 0

    def start(self, stats: Stats, buffers: EpisodeBuffers) -> None:
        """Begin a fit counted by ``stats`` (new, from zero).

        The epoch snapshot and the agents' time start over, and so does the episode log (``buffers.log_count``
        zeroed in place: a fill, no read). The episode ring is refilled at the next sync, whatever the new count.

        Args:
            stats: the new fit's host counters.
            buffers: the module's current episode buffers; ``log_count`` () int64 is zeroed in place.
        """
        self.stats = stats
        self.log_synced = 0
        self.ring_synced = -1  # the new fit's count may equal the last fit's: refill all the same
        buffers.log_count.zero_()
        self.epoch_snap = self.published_snap = stats.snapshot()
        self.epoch_agent_time = self.agent_time_read = None

    def begin_epoch(self) -> None:
        """Start the next epoch's window where the last :meth:`publish` ended (windows tile the run)."""
        self.epoch_snap, self.epoch_agent_time = self.published_snap, self.agent_time_read

    def publish(self, system: GA3CSystem | None, buffers: EpisodeBuffers) -> None:
        """Fold host counters into the metrics, the episode ring and the episode log once an epoch.

        Python numbers and pinned non-blocking copies: no device synchronisation. Nothing without a ``system``.

        Args:
            system: the running GA3C system (counts, queue sizes, the agents' time), or None.
            buffers: the module's current episode buffers, written in place.
        """
        if system is None:
            return
        snap = self.stats.snapshot()
        r = rates(self.epoch_snap, snap, self.cfg.frame_skip)  # over the epoch's whole window
        m = self.metrics
        for name in ("tps", "pps", "steps_per_s", "fps", "predict_batch"):
            m.add(name, r[name])
        if snap.updates > self.epoch_snap.updates:
            for name in ("policy_lag_p50", "policy_lag_p95", "policy_lag_max", "lag_dropped_frac"):
                if r[name] == r[name]:  # NaN when no update carried per-transition versions
                    m.add(name, r[name])
        last = self.published_snap
        updates = snap.updates - last.updates
        if updates > 0:  # means over the updates since the last publish, as if added at each step
            m.add("batch_size", snap.batch_transitions - last.batch_transitions, count=updates)
            m.add("policy_lag", snap.lag_sum - last.lag_sum, count=updates)
        counts = system.counts()
        m.add("na", counts.agents)
        m.add("np", counts.predictors)
        m.add("nt", counts.trainers)
        for name, size in system.queue_sizes().items():
            m.add(name, size)
        spent = system.shared.agent_time.copy()  # (max_agents, 4) seconds, from zero at the system's start
        before = np.zeros_like(spent) if self.epoch_agent_time is None else self.epoch_agent_time
        for name, share in agent_time_shares(before, spent).items():
            m.add(name, share)
        self.agent_time_read = spent
        new = snap.episodes - last.episodes
        if new > 0:
            recent = self.stats.recent_returns(new)
            m.add("episode_return", sum(recent), count=len(recent))
            m.add("mean_return", self.stats.mean_return(self.cfg.return_window))
        m.add("env_steps", snap.steps)
        m.add("updates", snap.updates)
        m.add("episodes", snap.episodes)
        self.published_snap = snap
        self.sync_ring(snap.episodes, buffers)
        self.sync_log(snap.episodes, buffers)

    def sync_log(self, total: int, buffers: EpisodeBuffers) -> None:
        """Copy the episodes that ended since the last call, up to episode ``total``, into ``buffers.log``.

        Rows ``(env steps, time, return)``, with the env steps and the ``time.monotonic()`` counted when their
        rollout reached a trainer (one pinned non-blocking copy); ``buffers.log_count`` is filled with ``total``.

        Args:
            total: the episodes the stats counted (an epoch's snapshot: later ones belong to the next sync).
            buffers: the module's current episode buffers; ``log`` (cap, 3) float64 and ``log_count`` () int64
                are written in place.
        """
        new = total - self.log_synced
        if new <= 0:
            return
        log = buffers.log
        cap = log.shape[0]
        # by number: episodes that ended after the snapshot counted `total` belong to the next sync
        recent = self.stats.episodes_range(total - min(new, cap), total)  # [(t since t0, steps, return, len)]
        first = total - len(recent)
        t0 = self.stats.t0
        host = torch.tensor([(steps, t0 + t, ret) for t, steps, ret, _ in recent], dtype=torch.float64)  # [n, 3]
        slots = torch.tensor([k % cap for k in range(first, total)], dtype=torch.int64)  # [n]
        cuda = log.device.type == "cuda"
        if cuda:
            host, slots = host.pin_memory(), slots.pin_memory()
        dev = log.device
        log.index_copy_(0, slots.to(dev, non_blocking=cuda), host.to(dev, non_blocking=cuda))
        buffers.log_count.fill_(total)
        self.log_synced = total

    def sync_ring(self, total: int, buffers: EpisodeBuffers) -> None:
        """Rewrite the episode ring with the returns of the last ``RING`` of the first ``total`` episodes.

        Slot ``k % RING`` holds episode ``k``'s return, NaN where none (one pinned non-blocking copy), and
        ``buffers.returns_count`` is filled with ``total``; nothing when ``total`` was the last call's.

        Args:
            total: the episodes the stats counted.
            buffers: the module's current episode buffers; ``returns_ring`` (RING,) float32 and
                ``returns_count`` () int64 are written in place.
        """
        if total == self.ring_synced:
            return
        recent = self.stats.recent_returns(min(total, RING))
        host = torch.full((RING,), float("nan"), dtype=torch.float32)
        start = total - len(recent)
        for j, ret in enumerate(recent):
            host[(start + j) % RING] = ret
        ring = buffers.returns_ring
        if ring.device.type == "cuda":
            host = host.pin_memory()
        ring.copy_(host, non_blocking=True)
        buffers.returns_count.fill_(total)
        self.ring_synced = total

    def summarise(self, system: GA3CSystem, counts: tuple[int, int, int], t_close: float, stop_reason: str | None,
                  stop_time: float | None, time_to_target_s: float | None,
                  ) -> tuple[dict[str, Any], list[dict[str, float]]]:
        """The host summary and the ``episodes.csv`` rows, from the same snapshot of the stats so the two agree.

        The rows (:func:`~lightning_per.metrics.episodes.episode_table`): ``episodes`` of them, the last one's
        ``env_steps`` is ``last_episode_env_steps`` and its ``return_mean`` is ``mean_return``; ``env_steps``
        adds the steps of the episodes still under way. Times in seconds from ``stats.t0`` (``on_fit_start``,
        the ``max_time_s`` clock): ``wall_time_s`` to the end of the shutdown, ``stopped_at_s`` to the stop
        decision (or to the shutdown's start if none was recorded: interruption, failure); ``shutdown_s``:
        :meth:`GA3CSystem.close`, which started at ``t_close``.

        Args:
            system: the closed GA3C system (its agent pool and adjuster).
            counts: ``(agents, predictors, trainers)`` before the close.
            t_close: ``time.monotonic()`` when the close started.
            stop_reason: why training stopped (the first reason given), or None.
            stop_time: ``time.monotonic()`` of that decision, or None.
            time_to_target_s: seconds from ``stats.t0`` to ``target_return``, or None.

        Returns:
            ``(summary, rows)``: the summary's keys, and the rows of ``episodes.csv``.
        """
        snap = self.stats.snapshot()
        t0 = self.stats.t0
        wall = max(snap.t - t0, 1e-9)
        c = self.cfg
        # by number: the episodes the snapshot counts, none that a late rollout adds meanwhile
        records = self.stats.episodes_range(0, snap.episodes)  # [(t since t0, env steps, return, length)]
        rows = episode_table([(steps, t, ret) for t, steps, ret, _ in records], c.return_window,
                             first=snap.episodes - len(records))
        last = rows[-1] if rows else None
        summary = {
            "mean_return": last["return_mean"] if last else None,
            "mean_return_episodes": min(len(records), c.return_window),
            "episodes": snap.episodes,
            "last_episode_env_steps": last["env_steps"] if last else None,
            "tps": snap.updates / wall,
            "pps": snap.predictions / wall,
            "steps_per_s": snap.steps / wall,
            "fps": snap.steps * c.frame_skip / wall,
            "policy_lag_mean": snap.lag_sum / snap.updates if snap.updates else None,
            "policy_lag_p50": _finite(lag_quantile(snap.lag_hist, 0.5)),
            "policy_lag_p95": _finite(lag_quantile(snap.lag_hist, 0.95)),
            "policy_lag_max": _finite(lag_max(snap.lag_hist)),
            "max_policy_lag": c.max_policy_lag,
            "lag_policy": c.lag_policy,
            "lag_dropped": snap.lag_dropped,
            "lag_downweighted": snap.lag_downweighted,
            "lag_dropped_frac": snap.lag_dropped / snap.batch_transitions if snap.batch_transitions else None,
            "wall_time_s": wall,
            "stop_reason": stop_reason,
            "stopped_at_s": (stop_time if stop_time is not None else t_close) - t0,
            "shutdown_s": snap.t - t_close,
            "max_time_s": c.max_time_s,
            "env_steps": snap.steps,
            "updates": snap.updates,
            "predictions": snap.predictions,
            "time_to_target_s": time_to_target_s,
            "target_return": c.target_return,
            "final_counts": {"agents": counts[0], "predictors": counts[1], "trainers": counts[2]},
            "agents_replaced": system.pool.replaced if system.pool is not None else 0,
            "adjustments": system.adjuster.history if system.adjuster is not None else [],
        }
        return summary, rows


def _finite(x: float) -> float | None:
    """``x``, or None for NaN (no update counted: JSON has no NaN)."""
    return None if x != x else x
