"""Dynamic adjustment of (NA, NP, NT), GA3C section 4.2 (reference: ``ThreadDynamicAdjustment``).

Every window, each of the number of agents NA, predictors NP and trainers NT moves by -1, 0 or +1
at random (within ``[1, max]``); the change is kept if the trainings per second (TPS) measured over
the next window did not drop below the TPS of the configuration it replaced, otherwise it is
reverted. The TPS signal is pluggable (tests pass a function of the counts and a no-op wait).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Counts", "DynamicAdjuster"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Counts:
    """(NA, NP, NT): agents, predictors, trainers."""

    agents: int
    predictors: int
    trainers: int

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.agents, self.predictors, self.trainers)


class DynamicAdjuster:
    """Random-walk search over (NA, NP, NT) that keeps changes which do not lower TPS.

    Args:
        get_counts: returns the current :class:`Counts`.
        apply: sets new counts (starts/stops agents and threads).
        measure: blocks for one window and returns the TPS (trainings/s) measured over it, or
            None if the run is stopping. For tests, any function of the current counts.
        max_counts: upper bounds (NA, NP, NT); lower bounds are 1.
        warmup_s: seconds waited before the first measurement (through ``wait``).
        wait: ``wait(seconds) -> bool``, False when the run is stopping (default: a stop event).
        seed: seed of the random walk.
        tolerance: a change is kept if ``tps >= baseline * (1 - tolerance)``; 0 = "did not drop".

    Attributes:
        history: one dict per window: ``{"t", "counts", "tps", "kept"}`` (``t`` in seconds since start).
    """

    def __init__(self, get_counts: Callable[[], Counts], apply: Callable[[Counts], None],
                 measure: Callable[[], float | None], max_counts: Counts, warmup_s: float = 10.0,
                 wait: Callable[[float], bool] | None = None, seed: int = 0, tolerance: float = 0.0) -> None:
        if min(max_counts.as_tuple()) < 1:
            raise ValueError(f"max_counts must all be >= 1, got {max_counts}")
        if warmup_s < 0:
            raise ValueError(f"warmup_s must be >= 0, got {warmup_s}")
        if not 0.0 <= tolerance < 1.0:
            raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
        self.get_counts, self.apply, self.measure = get_counts, apply, measure
        self.max_counts = max_counts
        self.warmup_s = warmup_s
        self.tolerance = tolerance
        self._stop = threading.Event()
        self.wait = wait or (lambda s: not self._stop.wait(s))
        self.rng = random.Random(seed)
        self.baseline: float | None = None
        self.history: list[dict] = []
        self._t0 = time.monotonic()
        self._thread: threading.Thread | None = None

    def propose(self, current: Counts) -> Counts:
        """A random neighbour: each count moves by -1/0/+1, clamped to [1, max]."""
        moved = [min(hi, max(1, c + self.rng.randint(-1, 1)))
                 for c, hi in zip(current.as_tuple(), self.max_counts.as_tuple())]
        return Counts(*moved)

    def step(self) -> bool:
        """One window: (measure the baseline if none), propose, apply, measure, keep or revert.

        Returns False when the run is stopping (``measure`` returned None).
        """
        if self.baseline is None:
            tps = self.measure()
            if tps is None:
                return False
            self.baseline = tps
            self._record(self.get_counts(), tps, True)
        current = self.get_counts()
        candidate = self.propose(current)
        if candidate != current:
            self.apply(candidate)
        tps = self.measure()
        if tps is None:
            return False
        if candidate == current:  # nothing moved: refresh the baseline of this configuration
            self.baseline = tps
            self._record(current, tps, True)
            return True
        kept = tps >= self.baseline * (1.0 - self.tolerance)
        if kept:
            self.baseline = tps
            log.info("dynamic adjustment: %s -> %s kept (TPS %.1f)", current.as_tuple(),
                     candidate.as_tuple(), tps)
        else:
            self.apply(current)
            log.info("dynamic adjustment: %s -> %s reverted (TPS %.1f < %.1f)", current.as_tuple(),
                     candidate.as_tuple(), tps, self.baseline)
        self._record(candidate, tps, kept)
        return True

    def _record(self, counts: Counts, tps: float, kept: bool) -> None:
        self.history.append({"t": time.monotonic() - self._t0, "counts": counts.as_tuple(), "tps": tps,
                             "kept": kept})

    def run(self) -> None:
        """Warm up, then :meth:`step` until stopped."""
        if not self.wait(self.warmup_s):
            return
        while not self._stop.is_set() and self.step():
            pass

    def start(self) -> None:
        """Run in a daemon thread."""
        self._thread = threading.Thread(target=self.run, name="ga3c-adjust", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
