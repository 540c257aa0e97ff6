"""CUDA-graph layer: whole-update capture for users' loops and for our modules.

- :func:`capture` / :class:`CapturedStep`: a user's whole training update (sample from our buffer, loss,
  backward, optimizer step, target update, priority update), K updates per call, as one CUDA-graph replay;
  plain eager calls on CPU, checked there for what a GPU capture would refuse (:mod:`.check` watches the first
  call). :class:`CaptureError` names what cannot be captured.
- :class:`HardUpdate`: TorchRL's hard target-network schedule on a device counter (capturable).
- :class:`CapturedUpdate`: the capture the DQN and GA3C modules build their graph modes on;
  :func:`count_optimizer_step` reports in-graph optimizer steps to Lightning; :func:`no_recompiles`.
- :class:`EagerGraphs`: the samplers' cache of small graphs for eager calls, paused inside
  :func:`eager_graphs_paused`.
- Building blocks: :func:`cuda_graph_capture` (register generators, GC paused), :func:`warm_up_on_side_stream`,
  :func:`capture_cuda_graph` (both at once), :func:`gc_paused`.
- :class:`CapturableSampler`: what a capture asks of a sampler (duck-typed: this layer sits below
  :mod:`lightning_per.replay` and imports nothing of it, nor of Lightning).

Names are imported on first use (PEP 562): the modules' graph modes need neither tensordict's nor TorchRL's
objectives at import time.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_per.graphs.captured_step import CapturedStep, capture
    from lightning_per.graphs.capturing import cuda_graph_capture, gc_paused
    from lightning_per.graphs.eager import EagerGraphs, eager_graphs_are_paused, eager_graphs_paused
    from lightning_per.graphs.errors import CaptureError
    from lightning_per.graphs.protocol import CapturableSampler
    from lightning_per.graphs.streams import capture_cuda_graph, warm_up_on_side_stream
    from lightning_per.graphs.targets import HardUpdate
    from lightning_per.graphs.update import CapturedUpdate, count_optimizer_step, no_recompiles

_WHERE = {"CaptureError": "errors", "CapturedStep": "captured_step", "capture": "captured_step",
          "HardUpdate": "targets", "CapturedUpdate": "update", "count_optimizer_step": "update",
          "no_recompiles": "update", "EagerGraphs": "eager", "eager_graphs_paused": "eager",
          "eager_graphs_are_paused": "eager", "cuda_graph_capture": "capturing", "gc_paused": "capturing",
          "capture_cuda_graph": "streams", "warm_up_on_side_stream": "streams", "CapturableSampler": "protocol"}
__all__ = ["CapturableSampler", "CaptureError", "CapturedStep", "CapturedUpdate", "EagerGraphs", "HardUpdate",
           "capture", "capture_cuda_graph", "count_optimizer_step", "cuda_graph_capture", "eager_graphs_are_paused",
           "eager_graphs_paused", "gc_paused", "no_recompiles", "warm_up_on_side_stream"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        module = importlib.import_module(f"{__name__}.{_WHERE[name]}")
        globals().update({n: getattr(module, n) for n, where in _WHERE.items() if where == _WHERE[name]})
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
