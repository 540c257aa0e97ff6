"""Agent processes: their handles, and a ``spawn`` start that skips ``__main__``.

An agent runs :func:`lightning_per.actors.agent.agent_main` in a ``spawn`` child through
:mod:`lightning_per.actors._agent_boot` (a file run by path: the child imports neither this package's
``__init__`` nor the parent's main script).
:class:`AgentHandle` is what the learner keeps of one incarnation of an agent
index (see "incarnations" in :mod:`lightning_per.actors.supervisor`).
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AgentHandle", "agent_process", "start_process"]

_BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_agent_boot.py")
_MAIN_LOCK = threading.Lock()


@dataclass
class AgentHandle:
    """One incarnation of an agent index: its process and its two semaphores (answers, free slots), and what the
    supervisor saw of it (times in seconds)."""

    incarnation: int
    process: Any
    response_sem: Any
    free_sem: Any
    retiring: bool = False
    started: float = field(default_factory=time.monotonic)
    dead_since: float | None = None  # time.monotonic() when the supervisor first saw it dead
    beat: int | None = None  # its heartbeat at the supervisor's last change of it (None: not yet watched)
    silent_s: float = 0.0  # supervised seconds since the heartbeat last changed
    stalled: bool = False  # silent for agent_stall_timeout_s: reported and killed


@contextlib.contextmanager
def _no_main_reimport():
    """Hide ``__main__``'s file/spec while a spawn child is launched.

    ``spawn`` re-runs the parent's main script in the child (``multiprocessing.spawn.
    get_preparation_data``); for the ``lightning-per`` console script that imports the whole
    package with torch and Lightning. Agents need nothing from ``__main__``.
    """
    main = sys.modules.get("__main__")
    with _MAIN_LOCK:
        if main is None:
            yield
            return
        saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
        main.__dict__.pop("__file__", None)
        main.__spec__ = None
        try:
            yield
        finally:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


def agent_process(ctx: Any, index: int, kwargs: dict[str, Any], prefix: str) -> Any:
    """The (not yet started) daemon process ``<prefix>-agent-<index>`` of the ``spawn`` context ``ctx``, which
    runs :func:`lightning_per.actors.agent.agent_main` with ``**kwargs`` through
    :mod:`lightning_per.actors._agent_boot`; start it with :func:`start_process`."""
    return ctx.Process(target=runpy.run_path, args=(_BOOT,), name=f"{prefix}-agent-{index}", daemon=True,
                       kwargs={"init_globals": {"AGENT_KWARGS": kwargs}, "run_name": "__actor_agent__"})


def start_process(proc: Any) -> None:
    """``proc.start()`` with ``__main__``'s file hidden, so the child does not re-run the main script."""
    with _no_main_reimport():
        proc.start()
