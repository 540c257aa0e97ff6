"""A SIGTERM handler chained in front of the installed one: it records the signal, then runs that one.

Agents share the learner's process group, so a SIGTERM to the group kills them at the moment the learner
is told to stop. The agent pool therefore only *records* the signal in the handler (setting an Event there
could take a lock the interrupted main thread holds); its supervisor turns the record into a stop before it
looks at any agent (see :mod:`lightning_per.actors.supervisor`).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["SigtermRecorder"]


class SigtermRecorder:
    """Install (main thread only) a SIGTERM handler calling ``record(signum)`` while ``active()`` is true,
    then the handler found at :meth:`install` (``SIG_DFL``: terminate as before; ``SIG_IGN``: nothing).

    Example::

        recorder = SigtermRecorder(lambda signum: print("got", signum), lambda: True)
        recorder.install()
        ...
        recorder.restore()
    """

    def __init__(self, record: Callable[[int], None], active: Callable[[], bool]) -> None:
        self._record, self._active = record, active
        self._handler: Callable | None = None  # ours, while installed
        self._previous: Any = None

    def install(self) -> None:
        """Chain our handler in front of the current one; a no-op outside the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum, frame):
            if self._active():
                self._record(signum)  # a plain store: the supervisor acts on it
            if callable(previous):
                previous(signum, frame)
            elif previous != signal.SIG_IGN:  # SIG_DFL (or None: not set from Python): terminate as before
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        signal.signal(signal.SIGTERM, on_sigterm)
        self._handler, self._previous = on_sigterm, previous

    def restore(self) -> None:
        """Put the previous handler back if ours is still the installed one (one installed over ours keeps
        calling it; ours then only forwards)."""
        handler, self._handler = self._handler, None
        if handler is None or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is handler:
            previous = self._previous
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
