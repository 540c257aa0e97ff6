"""CUDA-graph layer: whole-update capture, for users' loops and for the DQN and GA3C modules alike.

- :func:`capture` / :class:`CapturedStep`: a whole training update (sample from our buffer, loss, backward,
  optimizer step, target update, priority update), K updates per call, as one CUDA-graph replay; plain eager
  calls on CPU, checked there for what a GPU capture would refuse (:mod:`.check` watches the first call).
  :class:`CaptureError` names what cannot be captured; :func:`count_optimizer_step` reports in-graph optimizer
  steps to Lightning.
- :class:`HardUpdate`: TorchRL's hard target-network schedule on a device counter (capturable).
- :class:`CapturableSampler`: the type of a sampler a capture takes (registered with it, it hands its
  ``capture_view``, a :class:`~lightning_per.graphs.protocol.SamplerCapture`); this layer sits below
  :mod:`lightning_per.replay` and imports nothing of it, nor of Lightning.

Building blocks stay in their modules: :mod:`.capturing` (``cuda_graph_capture``, ``gc_paused``,
``no_recompiles``), :mod:`.streams` (``warm_up_on_side_stream``, ``capture_cuda_graph``), :mod:`.eager` (the
samplers' eager-call graph cache ``EagerGraphs``, ``eager_graphs_paused``), :mod:`.state` (what a capture rolls
back), :mod:`.pipeline` (the replay work overlapped with the learner on a second stream).

Names are imported on first use (PEP 562): the modules' graph modes need neither tensordict's nor TorchRL's
objectives at import time.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_per.graphs.captured_step import CapturedStep, capture, count_optimizer_step
    from lightning_per.graphs.errors import CaptureError
    from lightning_per.graphs.protocol import CapturableSampler
    from lightning_per.graphs.targets import HardUpdate

_WHERE = {"CaptureError": "errors", "CapturedStep": "captured_step", "capture": "captured_step",
          "count_optimizer_step": "captured_step", "HardUpdate": "targets", "CapturableSampler": "protocol"}
__all__ = ["CapturableSampler", "CaptureError", "CapturedStep", "HardUpdate", "capture", "count_optimizer_step"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        module = importlib.import_module(f"{__name__}.{_WHERE[name]}")
        globals().update({n: getattr(module, n) for n, where in _WHERE.items() if where == _WHERE[name]})
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
