"""The GA3C module's host-side bookkeeping: host counters folded into the device metrics, the episode
ring and the episode log once an epoch (Python numbers and pinned non-blocking copies: no device
synchronisation), and the run's host summary."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lightning_per.actors.stats import agent_time_shares, lag_max, lag_quantile, rates
from lightning_per.metrics.episodes import episode_table

if TYPE_CHECKING:
    from lightning_per.ga3c.system import GA3CSystem

__all__ = ["HostState", "RING"]

RING = 100  # episode returns kept in the device ring (``episode_returns_ring``)


class HostState:
    """Mixin of :class:`~lightning_per.ga3c.GA3C`: the host state -> device metrics / episode ring / log, and
    the summary. It reads the module's ``cfg``, ``stats``, ``system``, ``metrics``, ``episode_returns_*``,
    ``episode_log*`` and stop bookkeeping."""

    def publish_host_state(self) -> None:
        """Fold host counters into :attr:`metrics` and the episode ring (Python numbers and one
        pinned non-blocking copy: no device synchronisation)."""
        if self.system is None:
            return
        snap = self.stats.snapshot()
        r = rates(self._epoch_snap, snap, self.cfg.frame_skip)
        m = self.metrics
        for name in ("tps", "pps", "steps_per_s", "fps", "predict_batch"):
            m.add(name, r[name])
        updates = snap.updates - self._epoch_snap.updates
        if updates > 0:  # means over this window's updates, as if added at each step
            m.add("batch_size", snap.batch_transitions - self._epoch_snap.batch_transitions, count=updates)
            m.add("policy_lag", snap.lag_sum - self._epoch_snap.lag_sum, count=updates)
            for name in ("policy_lag_p50", "policy_lag_p95", "policy_lag_max", "lag_dropped_frac"):
                if r[name] == r[name]:  # NaN when no update carried per-transition versions
                    m.add(name, r[name])
        counts = self.system.counts()
        m.add("na", counts.agents)
        m.add("np", counts.predictors)
        m.add("nt", counts.trainers)
        for name, size in self.system.queue_sizes().items():
            m.add(name, size)
        spent = self.system.shared.agent_time.copy()  # (max_agents, 4) seconds, from zero at the system's start
        before = np.zeros_like(spent) if self._agent_time_read is None else self._agent_time_read
        for name, share in agent_time_shares(before, spent).items():
            if share == share:  # NaN: no agent ran
                m.add(name, share)
        self._agent_time_read = spent
        new = snap.episodes - self._epoch_snap.episodes
        if new > 0:
            recent = self.stats.recent_returns(new)
            m.add("episode_return", sum(recent), count=len(recent))
            m.add("mean_return", self.stats.mean_return(self.cfg.return_window))
        m.add("env_steps", snap.steps)
        m.add("updates", snap.updates)
        m.add("episodes", snap.episodes)
        self._epoch_snap = snap
        self._sync_ring(snap.episodes)
        self._sync_log(snap.episodes)

    def _sync_log(self, total: int) -> None:
        """Copy the episodes that ended since the last call into :attr:`episode_log`: ``(env steps, time,
        return)`` with the env steps and the ``time.monotonic()`` counted when their rollout reached a
        trainer (one pinned non-blocking copy)."""
        new = total - self._log_synced
        if new <= 0:
            return
        cap = self.episode_log.shape[0]
        # by number: episodes that ended after the snapshot counted `total` belong to the next sync
        recent = self.stats.episodes_range(total - min(new, cap), total)  # [(t since t0, steps, return, len)]
        first = total - len(recent)
        t0 = self.stats.t0
        host = torch.tensor([(steps, t0 + t, ret) for t, steps, ret, _ in recent], dtype=torch.float64)  # [n, 3]
        slots = torch.tensor([k % cap for k in range(first, total)], dtype=torch.int64)  # [n]
        cuda = self.episode_log.device.type == "cuda"
        if cuda:
            host, slots = host.pin_memory(), slots.pin_memory()
        dev = self.episode_log.device
        self.episode_log.index_copy_(0, slots.to(dev, non_blocking=cuda), host.to(dev, non_blocking=cuda))
        self.episode_log_count.fill_(total)
        self._log_synced = total

    def _sync_ring(self, total: int) -> None:
        if total == self._ring_synced:
            return
        recent = self.stats.recent_returns(min(total, RING))
        host = torch.full((RING,), float("nan"), dtype=torch.float32)
        start = total - len(recent)
        for j, ret in enumerate(recent):
            host[(start + j) % RING] = ret
        if self.episode_returns_ring.device.type == "cuda":
            host = host.pin_memory()
        self.episode_returns_ring.copy_(host, non_blocking=True)
        self.episode_returns_count.fill_(total)
        self._ring_synced = total

    def _summarise(self, system: GA3CSystem, counts: tuple[int, int, int], t_close: float) -> dict[str, Any]:
        """The host summary, and :attr:`episode_rows` (``episodes.csv``) from the same snapshot of the stats, so
        the two agree: ``episodes`` rows, the last one's ``env_steps`` is ``last_episode_env_steps`` and its
        ``return_mean`` is ``mean_return``; ``env_steps`` adds the steps of the episodes still under way. Times in
        seconds from ``stats.t0`` (``on_fit_start``, the ``max_time_s`` clock): ``wall_time_s`` to the end of the
        shutdown, ``stopped_at_s`` to the stop decision (or to the shutdown's start if none was recorded:
        interruption, failure); ``shutdown_s``: :meth:`GA3CSystem.close`, which started at ``t_close``."""
        snap = self.stats.snapshot()
        t0 = self.stats.t0
        wall = max(snap.t - t0, 1e-9)
        c = self.cfg
        # by number: the episodes the snapshot counts, none that a late rollout adds meanwhile
        records = self.stats.episodes_range(0, snap.episodes)  # [(t since t0, env steps, return, length)]
        self.episode_rows = episode_table([(steps, t, ret) for t, steps, ret, _ in records], c.return_window,
                                          first=snap.episodes - len(records))
        last = self.episode_rows[-1] if self.episode_rows else None
        return {
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
            "stop_reason": self._stop_reason,
            "stopped_at_s": (self._stop_time if self._stop_time is not None else t_close) - t0,
            "shutdown_s": snap.t - t_close,
            "max_time_s": c.max_time_s,
            "env_steps": snap.steps,
            "updates": snap.updates,
            "predictions": snap.predictions,
            "time_to_target_s": self.time_to_target_s,
            "target_return": c.target_return,
            "final_counts": {"agents": counts[0], "predictors": counts[1], "trainers": counts[2]},
            "agents_replaced": system.pool.replaced if system.pool is not None else 0,
            "adjustments": system.adjuster.history if system.adjuster is not None else [],
        }


def _finite(x: float) -> float | None:
    """``x``, or None for NaN (no update counted: JSON has no NaN)."""
    return None if x != x else x
