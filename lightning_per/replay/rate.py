"""SamplesPerInsert: a cumulative sample-to-insert ratio limit on a buffer's ``sample()``.

The semantics of TorchRL 0.15's ``RateLimitedReplayBuffer(samples_per_insert=...)`` (docs.pytorch.org/rl/0.15,
"RateLimitedReplayBuffer"): at most ``samples_per_insert`` sampled records for every record written, counted
cumulatively (the buffer's ``write_count`` and the records returned by ``sample``, not its occupancy, so the limit
keeps its meaning after the ring wraps). A sample of ``B`` records is permitted when the buffer holds data and
``floor(write_count * samples_per_insert) - sampled >= B``. Without ``wait`` a sample the budget does not permit
raises :class:`RuntimeError`; with ``wait=True`` the owner ingests its writers' batches (the inserts it waits for)
until the budget permits it, or raises :class:`TimeoutError` after ``timeout`` seconds. Host integers only: the
check reads no device tensor.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from numbers import Real

__all__ = ["SamplesPerInsert"]


class SamplesPerInsert:
    """The sample-to-insert ratio limit of one buffer (module docstring), with its counters.

    Args:
        ratio: the most records sampled per record written, a finite number > 0 (TorchRL's ``samples_per_insert``).

    Attributes:
        sampled: records returned by the buffer's ``sample`` so far.
        waits: ``sample(wait=True)`` calls that had to wait.

    Raises:
        TypeError: ``ratio`` is not a real number (a bool included).
        ValueError: ``ratio`` is not finite or not > 0.

    Example::

        >>> limit = SamplesPerInsert(0.5)
        >>> limit.budget(write_count=10), limit.permits(write_count=10, filled=10, batch_size=4)
        (5, True)
        >>> limit.reserve(4, write_count=lambda: 10, filled=lambda: 10, refill=lambda: 0)
        >>> limit.reserve(4, write_count=lambda: 10, filled=lambda: 10, refill=lambda: 0)
        Traceback (most recent call last):
        ...
        RuntimeError: sample: the sample-to-insert ratio (samples_per_insert=0.5) permits 1 more records, not 4 ...
        >>> limit
        SamplesPerInsert(ratio=0.5, sampled=4, waits=0)
    """

    def __init__(self, ratio: float) -> None:
        if isinstance(ratio, bool) or not isinstance(ratio, Real):
            raise TypeError(f"samples_per_insert must be a finite number > 0, got {type(ratio).__name__}")
        if not (math.isfinite(ratio) and ratio > 0):
            raise ValueError(f"samples_per_insert must be a finite number > 0, got {ratio!r}")
        self.ratio = float(ratio)
        self.sampled = 0
        self.waits = 0

    def __repr__(self) -> str:
        return f"SamplesPerInsert(ratio={self.ratio}, sampled={self.sampled}, waits={self.waits})"

    def budget(self, write_count: int) -> int:
        """Records a sample may still return: ``floor(write_count * ratio) - sampled`` (may be negative)."""
        return math.floor(write_count * self.ratio) - self.sampled

    def permits(self, write_count: int, filled: int, batch_size: int) -> bool:
        """Whether a sample of ``batch_size`` records is permitted now (the buffer holds ``filled`` > 0 records)."""
        return filled > 0 and self.budget(write_count) >= batch_size

    def reserve(self, batch_size: int, *, write_count: Callable[[], int], filled: Callable[[], int],
                refill: Callable[[], object], wait: bool = False, timeout: float | None = None) -> None:
        """Count ``batch_size`` sampled records once the budget permits them.

        Args:
            batch_size: records the sample returns (>= 1).
            write_count, filled: the buffer's cumulative writes and current length, read at each check.
            refill: called while waiting (the buffer's ``ingest``: its writers' batches are the inserts awaited).
            wait: wait for the budget (True) or raise at once (False).
            timeout: seconds to wait at most (None: no limit), >= 0.

        Raises:
            RuntimeError: not permitted and ``wait`` False.
            TimeoutError: not permitted within ``timeout`` seconds.
            TypeError, ValueError: ``timeout`` not a number >= 0.
        """
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, Real) or timeout < 0):
            raise ValueError(f"sample: timeout must be a number of seconds >= 0 or None, got {timeout!r}")
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        pause, waited = 1e-4, False
        while not self.permits(write_count(), filled(), batch_size):
            if not wait:
                raise RuntimeError(
                    f"sample: the sample-to-insert ratio (samples_per_insert={self.ratio}) permits "
                    f"{max(0, self.budget(write_count()))} more records, not {batch_size} ({write_count()} written, "
                    f"{self.sampled} sampled); pass wait=True to wait for writes")
            if not waited:
                self.waits, waited = self.waits + 1, True
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"sample: the sample-to-insert ratio (samples_per_insert={self.ratio}) did not "
                                   f"permit {batch_size} records within {timeout} s ({write_count()} written, "
                                   f"{self.sampled} sampled)")
            refill()
            time.sleep(pause)
            pause = min(2 * pause, 5e-3)
        self.sampled += batch_size
