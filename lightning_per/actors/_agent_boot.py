"""Entry script of agent processes, run by path with ``runpy.run_path`` (stdlib only).

Why not a plain ``Process(target=agent_main)``: unpickling that target in the spawned child
imports ``lightning_per`` first, whose ``__init__`` imports torch, TorchRL and the replay code
(seconds of CPU and hundreds of MB per agent). Agents need none of it, so the
learner starts each one with ``runpy.run_path`` (a stdlib target) on this file, which registers a
bare package object for ``lightning_per`` and then imports only the NumPy-only agent modules. A
side effect we want: an agent cannot touch CUDA, it never imports torch.

The learner injects ``AGENT_KWARGS``, the keyword arguments of :func:`lightning_per.actors.agent.agent_main` (one
loop for both learners; its ``writer`` spec picks GA3C's rollouts or Ape-X's transitions from a fixed table, nothing
named by a user is imported).
"""

import os
import sys
import types

if __name__ == "__actor_agent__":
    if "lightning_per" not in sys.modules:
        _pkg_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        _stub = types.ModuleType("lightning_per")
        _stub.__path__ = [_pkg_dir]
        _stub.__file__ = os.path.join(_pkg_dir, "__init__.py")
        sys.modules["lightning_per"] = _stub
    from lightning_per.actors.agent import agent_main

    agent_main(**AGENT_KWARGS)  # noqa: F821 - injected by runpy.run_path(init_globals=...)
