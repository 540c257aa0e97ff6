"""Host-side GA3C counters (section 4.2 metrics), shared by predictor/trainer/learner threads.

Everything here is a Python number updated under a lock: reading it never touches the device.
Rates are differences of two :meth:`Stats.snapshot` calls, so every reader (status line, epoch
metrics, dynamic adjustment) keeps its own window.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

__all__ = ["LAG_BINS", "Stats", "Snapshot", "agent_time_shares", "lag_max", "lag_quantile", "rates"]

#: bins of the per-transition policy-lag histogram: lags 0 .. LAG_BINS - 2 exactly, larger ones in the last bin
LAG_BINS = 4096


@dataclass(frozen=True)
class Snapshot:
    """Cumulative totals at wall time ``t`` (``time.monotonic()``, seconds)."""

    t: float
    predictions: int  # observations predicted (one per environment step)
    prediction_batches: int  # forward passes of the predictors
    steps: int  # environment steps received by trainers (T * E per rollout)
    updates: int  # optimizer steps (trainings, the paper's TPS counts these)
    episodes: int
    lag_sum: float  # sum over updates of the batch's mean policy lag
    batch_transitions: int  # transitions trained on
    lag_hist: np.ndarray = field(default_factory=lambda: np.zeros(LAG_BINS, np.int64))  # transitions per lag
    lag_dropped: int = 0  # transitions trained on with weight 0 (older than max_policy_lag), counted per update
    lag_downweighted: int = 0  # transitions trained on with a weight in (0, 1) (lag_policy: downweight)


def lag_quantile(hist: np.ndarray, q: float) -> float:
    """The ``q`` quantile (in [0, 1]) of the policy lags counted in ``hist`` (transitions per lag, in updates:
    the lower quantile, the smallest lag with at least ``q`` of the transitions at or below it); NaN when
    ``hist`` counts none. Example: ``lag_quantile(np.array([1, 0, 3]), 0.5) == 2.0``."""
    total = int(hist.sum())
    if total == 0:
        return float("nan")
    return float(np.searchsorted(np.cumsum(hist), q * total, side="left"))


def lag_max(hist: np.ndarray) -> float:
    """The largest policy lag counted in ``hist`` (``LAG_BINS - 1`` stands for that lag or more); NaN when
    ``hist`` counts none. Example: ``lag_max(np.array([1, 0, 3, 0])) == 2.0``."""
    seen = np.flatnonzero(hist)
    return float(seen[-1]) if seen.size else float("nan")


def rates(a: Snapshot, b: Snapshot, frame_skip: int = 1) -> dict[str, float]:
    """Per-second rates between snapshots ``a`` (earlier) and ``b``: tps, pps, steps_per_s, fps,
    plus the window's mean prediction batch (observations/forward), train batch, policy lag (mean over updates
    of each batch's mean), its 50th and 95th percentiles and maximum over the window's transitions (every
    transition of every update, those the lag bound dropped included), and the fraction of them dropped
    (``lag_dropped_frac``, weight 0 under ``max_policy_lag``; NaN without updates)."""
    dt = max(b.t - a.t, 1e-9)
    updates = b.updates - a.updates
    batches = b.prediction_batches - a.prediction_batches
    steps_per_s = (b.steps - a.steps) / dt
    hist = b.lag_hist - a.lag_hist
    trained = b.batch_transitions - a.batch_transitions
    return {
        "tps": updates / dt,
        "pps": (b.predictions - a.predictions) / dt,
        "steps_per_s": steps_per_s,
        "fps": steps_per_s * frame_skip,
        "predict_batch": (b.predictions - a.predictions) / batches if batches else float("nan"),
        "train_batch": (b.batch_transitions - a.batch_transitions) / updates if updates else float("nan"),
        "policy_lag": (b.lag_sum - a.lag_sum) / updates if updates else float("nan"),
        "policy_lag_p50": lag_quantile(hist, 0.5),
        "policy_lag_p95": lag_quantile(hist, 0.95),
        "policy_lag_max": lag_max(hist),
        "lag_dropped_frac": (b.lag_dropped - a.lag_dropped) / trained if trained else float("nan"),
    }


def agent_time_shares(before: np.ndarray, after: np.ndarray) -> dict[str, float]:
    """Where the agents' time went between two reads of the shared ``agent_time`` (A, 4) float64 seconds
    (:data:`~lightning_per.actors.shared.AGENT_TIME`: running, env, answer_wait, slot_wait): ``agent_env_share``,
    ``agent_answer_wait_share`` and ``agent_slot_wait_share``, each the agents' summed seconds of it over their summed
    running seconds (the rest is the agents' own work); an empty dict when no agent ran in between. A share near 1
    names the bound: the envs (add agents or cores), the predictors' answers (a faster prediction path) or free
    slots (the learner consumes too slowly).

    Example::

        >>> import numpy as np
        >>> agent_time_shares(np.zeros((2, 4)), np.array([[2.0, 0.5, 1.5, 0.0], [2.0, 1.5, 0.0, 0.25]]))
        {'agent_env_share': 0.5, 'agent_answer_wait_share': 0.375, 'agent_slot_wait_share': 0.0625}
    """
    spent = (after - before).sum(axis=0)  # [running, env, answer_wait, slot_wait] summed over agents
    running = float(spent[0])
    if running <= 0.0:
        return {}
    return {"agent_env_share": float(spent[1]) / running, "agent_answer_wait_share": float(spent[2]) / running,
            "agent_slot_wait_share": float(spent[3]) / running}


class Stats:
    """Thread-safe totals plus the episode history (for ``mean_return``, the learning curve and ``episodes.csv``).

    Args:
        history: most episodes kept (oldest dropped first); None: every episode of the run, which
            ``episodes.csv`` is written from (one tuple of four numbers an episode).
    """

    def __init__(self, history: int | None = None) -> None:
        self._lock = threading.Lock()
        self.t0 = time.monotonic()
        self._predictions = self._prediction_batches = self._steps = self._updates = 0
        self._episodes = self._batch_transitions = 0
        self._lag_sum = 0.0
        self._lag_hist = np.zeros(LAG_BINS, np.int64)
        self._lag_dropped = self._lag_downweighted = 0
        # (seconds since t0, env steps so far, return, length)
        self.episode_log: deque[tuple[float, int, float, int]] = deque(maxlen=history)

    def add_predictions(self, n_obs: int) -> None:
        with self._lock:
            self._predictions += n_obs
            self._prediction_batches += 1

    def add_rollout(self, n_steps: int, episodes: list[tuple[float, int]]) -> None:
        now = time.monotonic() - self.t0
        with self._lock:
            self._steps += n_steps
            for ret, length in episodes:
                self._episodes += 1
                self.episode_log.append((now, self._steps, float(ret), int(length)))

    def add_update(self, n_transitions: int, lag: float, lags: np.ndarray | None = None, dropped: int = 0,
                   downweighted: int = 0) -> None:
        """One optimizer step on ``n_transitions`` of mean policy lag ``lag``; ``lags``: each transition's (ints,
        updates between the prediction that acted and this step), counted for the quantiles; ``dropped`` /
        ``downweighted``: how many of them the lag bound gave weight 0 / a weight in (0, 1)."""
        counts = None if lags is None else np.bincount(np.clip(lags, 0, LAG_BINS - 1), minlength=LAG_BINS)
        with self._lock:
            self._updates += 1
            self._batch_transitions += n_transitions
            self._lag_sum += lag
            if counts is not None:
                self._lag_hist += counts
            self._lag_dropped += dropped
            self._lag_downweighted += downweighted

    @property
    def updates(self) -> int:
        return self._updates

    def snapshot(self) -> Snapshot:
        with self._lock:
            return Snapshot(time.monotonic(), self._predictions, self._prediction_batches, self._steps,
                            self._updates, self._episodes, self._lag_sum, self._batch_transitions,
                            self._lag_hist.copy(), self._lag_dropped, self._lag_downweighted)

    def recent_returns(self, n: int) -> list[float]:
        """The last ``n`` (or fewer) episode returns, oldest first."""
        if n <= 0:
            return []
        with self._lock:  # walk n entries from the right, not a copy of the whole history (per update)
            tail = list(itertools.islice(reversed(self.episode_log), n))
        return [r for _, _, r, _ in reversed(tail)]

    def recent_episodes(self, n: int) -> list[tuple[float, int, float, int]]:
        """The last ``n`` (or fewer) episodes, oldest first: ``(seconds since t0, env steps, return, length)``
        with the time and the env steps counted when the rollout that ended them was taken."""
        if n <= 0:
            return []
        with self._lock:
            tail = list(itertools.islice(reversed(self.episode_log), n))
        return tail[::-1]

    def episodes_range(self, first: int, end: int) -> list[tuple[float, int, float, int]]:
        """Episodes ``first`` (inclusive) to ``end`` (exclusive) by their number since the start, oldest first,
        as :meth:`recent_episodes` gives them; episodes dropped from the history are left out.

        Read by number, not "the last n": episodes that end while a caller works on an older count are not
        taken for older ones.
        """
        with self._lock:
            kept = len(self.episode_log)
            oldest = self._episodes - kept  # number of the first episode still kept
            lo, hi = max(first, oldest) - oldest, min(end, self._episodes) - oldest
            if hi <= lo:
                return []
            if lo < kept - hi:  # walk from the nearer end (a deque is a linked list of blocks)
                return list(itertools.islice(self.episode_log, lo, hi))
            tail = list(itertools.islice(reversed(self.episode_log), kept - hi, kept - lo))
        return tail[::-1]

    @property
    def episodes(self) -> int:
        """Episodes finished so far (a host int; no lock needed to read it)."""
        return self._episodes

    def mean_return(self, n: int) -> float:
        """Mean of the last ``n`` episode returns (NaN before the first episode)."""
        tail = self.recent_returns(n)
        return sum(tail) / len(tail) if tail else float("nan")
