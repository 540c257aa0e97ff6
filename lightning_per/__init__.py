"""lightning_per: GPU-resident prioritized experience replay for TorchRL, a DQN LightningModule and GA3C.

Public names (see README.md): the replay storage and samplers, the prioritized replay buffer and its
factory. ``lightning_per.dqn.DQN``, ``lightning_per.callbacks.AsyncMetricsCallback`` and
``lightning_per.ga3c`` live in their subpackages (imported lazily: they need Lightning).
"""

from lightning_per.replay import (
    GPUPrioritizedReplayBuffer,
    GPUPrioritizedSampler,
    GPURandomSampler,
    GPURankBasedSampler,
    GPUTensorStorage,
    make_replay_buffer,
)

__all__ = [
    "GPUTensorStorage",
    "GPUPrioritizedSampler",
    "GPURankBasedSampler",
    "GPURandomSampler",
    "GPUPrioritizedReplayBuffer",
    "make_replay_buffer",
]
__version__ = "0.1.0"
