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
from dataclasses import dataclass

__all__ = ["Stats", "Snapshot", "rates"]


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


def rates(a: Snapshot, b: Snapshot, frame_skip: int = 1) -> dict[str, float]:
    """Per-second rates between snapshots ``a`` (earlier) and ``b``: tps, pps, steps_per_s, fps,
    plus the window's mean prediction batch (observations/forward), train batch and policy lag."""
    dt = max(b.t - a.t, 1e-9)
    updates = b.updates - a.updates
    batches = b.prediction_batches - a.prediction_batches
    steps_per_s = (b.steps - a.steps) / dt
    return {
        "tps": updates / dt,
        "pps": (b.predictions - a.predictions) / dt,
        "steps_per_s": steps_per_s,
        "fps": steps_per_s * frame_skip,
        "predict_batch": (b.predictions - a.predictions) / batches if batches else float("nan"),
        "train_batch": (b.batch_transitions - a.batch_transitions) / updates if updates else float("nan"),
        "policy_lag": (b.lag_sum - a.lag_sum) / updates if updates else float("nan"),
    }


class Stats:
    """Thread-safe totals plus the episode history (for ``mean_return`` and the learning curve).

    Args:
        history: most episodes kept for the learning curve (oldest dropped first).
    """

    def __init__(self, history: int = 100_000) -> None:
        self._lock = threading.Lock()
        self.t0 = time.monotonic()
        self._predictions = self._prediction_batches = self._steps = self._updates = 0
        self._episodes = self._batch_transitions = 0
        self._lag_sum = 0.0
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

    def add_update(self, n_transitions: int, lag: float) -> None:
        with self._lock:
            self._updates += 1
            self._batch_transitions += n_transitions
            self._lag_sum += lag

    @property
    def updates(self) -> int:
        return self._updates

    def snapshot(self) -> Snapshot:
        with self._lock:
            return Snapshot(time.monotonic(), self._predictions, self._prediction_batches, self._steps,
                            self._updates, self._episodes, self._lag_sum, self._batch_transitions)

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
            oldest = self._episodes - len(self.episode_log)  # number of the first episode still kept
            lo, hi = max(first, oldest) - oldest, min(end, self._episodes) - oldest
            return list(itertools.islice(self.episode_log, lo, hi)) if hi > lo else []

    @property
    def episodes(self) -> int:
        """Episodes finished so far (a host int; no lock needed to read it)."""
        return self._episodes

    def mean_return(self, n: int) -> float:
        """Mean of the last ``n`` episode returns (NaN before the first episode)."""
        tail = self.recent_returns(n)
        return sum(tail) / len(tail) if tail else float("nan")
