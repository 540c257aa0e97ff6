"""CUDA-graph layer: whole-update capture for users' loops and for our modules.

- :func:`capture` / :class:`CapturedStep`: a user's whole training update (sample from our buffer, loss,
  backward, optimizer step, target update, priority update), K updates per call, as one CUDA-graph replay;
  plain eager calls on CPU. :class:`CaptureError` names what cannot be captured.
- :class:`HardUpdate`: TorchRL's hard target-network schedule on a device counter (capturable).
- :class:`CapturedUpdate`: the capture the DQN and GA3C modules build their graph modes on;
  :func:`count_optimizer_step` reports in-graph optimizer steps to Lightning; :func:`no_recompiles`.

Names are imported on first use (PEP 562): the modules' graph modes need neither tensordict's nor TorchRL's
objectives at import time.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_per.graphs.captured_step import CapturedStep, CaptureError, capture
    from lightning_per.graphs.targets import HardUpdate
    from lightning_per.graphs.update import CapturedUpdate, count_optimizer_step, no_recompiles

_WHERE = {"CaptureError": "captured_step", "CapturedStep": "captured_step", "capture": "captured_step",
          "HardUpdate": "targets", "CapturedUpdate": "update", "count_optimizer_step": "update",
          "no_recompiles": "update"}
__all__ = ["CaptureError", "CapturedStep", "CapturedUpdate", "HardUpdate", "capture", "count_optimizer_step",
           "no_recompiles"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        module = importlib.import_module(f"{__name__}.{_WHERE[name]}")
        globals().update({n: getattr(module, n) for n, where in _WHERE.items() if where == _WHERE[name]})
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
