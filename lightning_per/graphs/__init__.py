"""CUDA-graph layer: whole-update capture for users' loops and for our modules.

- :func:`capture` / :class:`CapturedStep`: a user's whole training update (sample from our buffer, loss,
  backward, optimizer step, target update, priority update), K updates per call, as one CUDA-graph replay;
  plain eager calls on CPU. :class:`CaptureError` names what cannot be captured.
- :class:`HardUpdate`: TorchRL's hard target-network schedule on a device counter (capturable).
- :class:`CapturedUpdate`: the capture the DQN and GA3C modules build their graph modes on;
  :func:`count_optimizer_step` reports in-graph optimizer steps to Lightning; :func:`no_recompiles`.
"""

from lightning_per.graphs.capture import CapturedStep, CaptureError, capture
from lightning_per.graphs.targets import HardUpdate
from lightning_per.graphs.update import CapturedUpdate, count_optimizer_step, no_recompiles

__all__ = ["CaptureError", "CapturedStep", "CapturedUpdate", "HardUpdate", "capture", "count_optimizer_step",
           "no_recompiles"]
