"""Dynamic adjustment of (NA, NP, NT), GA3C section 4.2 (reference: ``ThreadDynamicAdjustment``).

Every window, each of the number of agents NA, predictors NP and trainers NT moves by -1, 0 or +1
at random (within ``[1, max]``); the change is kept if the trainings per second (TPS) measured over
the next window did not drop below the TPS of the configuration it replaced, otherwise it is
reverted. The measurement is pluggable (tests pass a function of the counts and a no-op wait).

Lag-aware (``max_lag_p95``): the paper's rule maximises TPS alone, which raises the policy lag its section
4.4 names as the source of instability (more agents, more rollouts waiting per update). With a bound on the
window's 95th percentile of the per-transition policy lag, the search maximises TPS subject to p95 <= bound:
a window within the bound beats one over it, two within it compare by TPS, two over it by lag (the one
nearer the bound is kept, so a start over the bound walks back into it). Every decision is logged with its
reason and recorded in :attr:`DynamicAdjuster.history`.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Counts", "DynamicAdjuster", "Window"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Counts:
    """(NA, NP, NT): agents, predictors, trainers."""

    agents: int
    predictors: int
    trainers: int

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.agents, self.predictors, self.trainers)


@dataclass(frozen=True)
class Window:
    """What one adjustment window measured: ``tps`` (optimizer steps per second) and ``lag_p95``, the 95th
    percentile of the per-transition policy lag in updates (NaN when no transition was trained on)."""

    tps: float
    lag_p95: float = math.nan


class DynamicAdjuster:
    """Random-walk search over (NA, NP, NT) that keeps changes which do not lower TPS (and, with ``max_lag_p95``,
    keep the p95 policy lag within its bound; see the module docstring).

    Args:
        get_counts: returns the current :class:`Counts`.
        apply: sets new counts (starts/stops agents and threads).
        measure: blocks for one window and returns the :class:`Window` measured over it (TPS, p95 lag), or
            None if the run is stopping. For tests, any function of the current counts.
        max_counts: upper bounds (NA, NP, NT); lower bounds are 1.
        warmup_s: seconds waited before the first measurement (through ``wait``).
        wait: ``wait(seconds) -> bool``, False when the run is stopping (default: a stop event).
        seed: seed of the random walk.
        tolerance: a change is kept if ``tps >= baseline * (1 - tolerance)``; 0 = "did not drop".
        max_lag_p95: bound (> 0, updates) on a window's p95 policy lag; None: TPS alone (the paper's rule).
            A window whose lag is NaN (nothing trained on) counts as within the bound.

    Attributes:
        history: one dict per window: ``{"t", "counts", "tps", "lag_p95", "kept", "reason"}`` (``t`` in seconds
            since start, ``lag_p95`` None when not measured).

    Raises:
        ValueError: a max count below 1, a negative ``warmup_s``, ``tolerance`` outside [0, 1) or ``max_lag_p95``
            <= 0 (each named).

    Example::

        >>> fake = {"counts": Counts(1, 1, 1)}
        >>> def apply(c): fake["counts"] = c
        >>> def measure():  # TPS grows with the agents, and so does the lag
        ...     a = fake["counts"].agents
        ...     return Window(tps=100.0 * a, lag_p95=3.0 * a)
        >>> adj = DynamicAdjuster(lambda: fake["counts"], apply, measure, Counts(8, 1, 1), warmup_s=0,
        ...                       wait=lambda s: True, max_lag_p95=12.0)
        >>> for _ in range(60): _ = adj.step()
        >>> fake["counts"].agents  # the most agents whose p95 lag stays within 12
        4
    """

    def __init__(self, get_counts: Callable[[], Counts], apply: Callable[[Counts], None],
                 measure: Callable[[], float | None], max_counts: Counts, warmup_s: float = 10.0,
                 wait: Callable[[float], bool] | None = None, seed: int = 0, tolerance: float = 0.0,
                 max_lag_p95: float | None = None) -> None:
        if min(max_counts.as_tuple()) < 1:
            raise ValueError(f"max_counts must all be >= 1, got {max_counts}")
        if warmup_s < 0:
            raise ValueError(f"warmup_s must be >= 0, got {warmup_s}")
        if not 0.0 <= tolerance < 1.0:
            raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
        if max_lag_p95 is not None and not (isinstance(max_lag_p95, (int, float)) and max_lag_p95 > 0):
            raise ValueError(f"max_lag_p95 must be a number > 0 (updates) or None, got {max_lag_p95!r}")
        self.get_counts, self.apply, self.measure = get_counts, apply, measure
        self.max_counts = max_counts
        self.warmup_s = warmup_s
        self.tolerance = tolerance
        self.max_lag_p95 = max_lag_p95
        self._stop = threading.Event()
        self.wait = wait or (lambda s: not self._stop.wait(s))
        self.rng = random.Random(seed)
        self.baseline: Window | None = None
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
            window = self.measure()
            if window is None:
                return False
            self.baseline = window
            self._record(self.get_counts(), window, True, "first measurement")
        current = self.get_counts()
        candidate = self.propose(current)
        if candidate != current:
            self.apply(candidate)
        window = self.measure()
        if window is None:
            return False
        if candidate == current:  # nothing moved: refresh the baseline of this configuration
            self.baseline = window
            self._record(current, window, True, "no move: baseline refreshed")
            return True
        kept, reason = self.decide(window, self.baseline)
        if kept:
            self.baseline = window
        else:
            self.apply(current)
        log.info("dynamic adjustment: %s -> %s %s: %s", current.as_tuple(), candidate.as_tuple(),
                 "kept" if kept else "reverted", reason)
        self._record(candidate, window, kept, reason)
        return True

    def within_bound(self, window: Window) -> bool:
        """Whether ``window``'s p95 lag is within ``max_lag_p95`` (always without a bound; NaN counts as within)."""
        return self.max_lag_p95 is None or not window.lag_p95 > self.max_lag_p95

    def decide(self, new: Window, base: Window) -> tuple[bool, str]:
        """Keep the configuration measured as ``new`` over the one measured as ``base``? Returns ``(kept, reason)``
        by the rule of the module docstring."""
        bound = self.max_lag_p95
        new_ok, base_ok = self.within_bound(new), self.within_bound(base)
        if new_ok and base_ok:
            if new.tps >= base.tps * (1.0 - self.tolerance):
                return True, f"TPS {new.tps:.1f} >= {base.tps:.1f}" + self._lag_note(new)
            return False, f"TPS {new.tps:.1f} < {base.tps:.1f}" + self._lag_note(new)
        if new_ok:
            return True, f"p95 lag {new.lag_p95:.1f} back within the bound {bound:g} (was {base.lag_p95:.1f})"
        if base_ok:
            return False, f"p95 lag {new.lag_p95:.1f} over the bound {bound:g} (TPS {new.tps:.1f})"
        if new.lag_p95 < base.lag_p95:
            return True, f"p95 lag {new.lag_p95:.1f} < {base.lag_p95:.1f}, both over the bound {bound:g}"
        return False, f"p95 lag {new.lag_p95:.1f} >= {base.lag_p95:.1f}, both over the bound {bound:g}"

    def _lag_note(self, window: Window) -> str:
        return "" if self.max_lag_p95 is None else f", p95 lag {window.lag_p95:.1f} <= {self.max_lag_p95:g}"

    def _record(self, counts: Counts, window: Window, kept: bool, reason: str) -> None:
        lag = None if math.isnan(window.lag_p95) else window.lag_p95
        self.history.append({"t": time.monotonic() - self._t0, "counts": counts.as_tuple(), "tps": window.tps,
                             "lag_p95": lag, "kept": kept, "reason": reason})

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
