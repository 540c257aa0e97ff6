"""lightning_per: GPU-resident prioritized experience replay for TorchRL, a DQN LightningModule and GA3C.

Public names (see README.md): the replay storage and samplers, the prioritized replay buffer and its
factory. ``lightning_per.dqn.DQN``, ``lightning_per.callbacks.AsyncMetricsCallback`` and
``lightning_per.ga3c`` live in their subpackages (imported lazily: they need Lightning). The public names
here are imported on first use, so that ``import lightning_per`` (e.g. by the console command) is fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported on first use (PEP 562): ``import lightning_per`` stays light (console command)
    from lightning_per.replay import (
        FrameStackStorage,
        GPUPrioritizedReplayBuffer,
        GPUPrioritizedSampler,
        GPUPrioritizedSliceSampler,
        GPURandomSampler,
        GPURankBasedSampler,
        GPUReplayBuffer,
        GPUSamplerWithoutReplacement,
        GPUSliceSampler,
        GPUTensorStorage,
        IngressStats,
        PinnedHostStorage,
        RemoteIngress,
        RemoteStats,
        RemoteWriter,
        SharedBufferWriter,
        WriterHandle,
        from_torchrl,
        make_replay_buffer,
    )

__all__ = [
    "GPUTensorStorage",
    "FrameStackStorage",
    "PinnedHostStorage",
    "GPUPrioritizedSampler",
    "GPURankBasedSampler",
    "GPURandomSampler",
    "GPUSliceSampler",
    "GPUPrioritizedSliceSampler",
    "GPUSamplerWithoutReplacement",
    "GPUPrioritizedReplayBuffer",
    "GPUReplayBuffer",
    "make_replay_buffer",
    "from_torchrl",
    "WriterHandle",
    "SharedBufferWriter",
    "IngressStats",
    "RemoteIngress",
    "RemoteWriter",
    "RemoteStats",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """The public names, imported from :mod:`lightning_per.replay` on first use (it imports torch and TorchRL)."""
    if name in __all__:
        value = getattr(importlib.import_module("lightning_per.replay"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lightning_per' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names, ``__version__`` and the subpackages imported so far (not this module's helpers)."""
    loaded = {name for name, value in globals().items()
              if getattr(value, "__name__", "").startswith("lightning_per.") and type(value).__name__ == "module"}
    return sorted(set(__all__) | {"__version__"} | loaded)
