"""The base of the learner's worker threads (predictors here, GA3C's trainers): a daemon thread with its own stop
event that turns an exception into a stop of the whole system.

Each worker waits on its wake-up semaphore with a short timeout, so it notices a stop (its own event, set when the
dynamic adjustment removes it, or the system's ``stopping``) within one poll.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

__all__ = ["WorkerThread"]

log = logging.getLogger(__name__)


class WorkerThread(threading.Thread):
    """A daemon thread running ``self.loop()`` for ``system``; an exception in it calls ``system.fail(err)``.

    Args:
        system: the object whose ``stopping`` (a ``threading.Event``) and ``fail(error)`` the thread uses.
        name: thread name (shown in logs).
    """

    def __init__(self, system: Any, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.system = system
        self.stop_event = threading.Event()

    def stopped(self) -> bool:
        """This thread was removed (its ``stop_event``) or the whole system is stopping."""
        return self.stop_event.is_set() or self.system.stopping.is_set()

    def loop(self) -> None:
        """The thread's work until :meth:`stopped`; subclasses define it."""
        raise NotImplementedError

    def run(self) -> None:
        try:
            self.loop()
        except Exception as err:  # a worker that dies must not hang the run: stop everything, loudly
            log.exception("%s failed", self.name)
            self.system.fail(err)
