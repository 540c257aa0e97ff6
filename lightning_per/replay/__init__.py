"""TorchRL integration of the GPU-resident replay: storage, samplers, buffer and factory."""

from lightning_per.replay.buffer import GPUPrioritizedReplayBuffer
from lightning_per.replay.errors import EmptyBufferError
from lightning_per.replay.factory import make_replay_buffer
from lightning_per.replay.frames import FrameStackStorage
from lightning_per.replay.host import PinnedHostStorage
from lightning_per.replay.ingress import IngressStats, WriterHandle
from lightning_per.replay.prioritized import GPUPrioritizedSampler
from lightning_per.replay.random import GPURandomSampler, GPUSamplerWithoutReplacement
from lightning_per.replay.rank import GPURankBasedSampler
from lightning_per.replay.slice import GPUSliceSampler
from lightning_per.replay.slice_prioritized import GPUPrioritizedSliceSampler
from lightning_per.replay.storage import GPUTensorStorage
from lightning_per.replay.writer import GPURoundRobinWriter

__all__ = [
    "GPUTensorStorage",
    "FrameStackStorage",
    "PinnedHostStorage",
    "GPURoundRobinWriter",
    "GPUPrioritizedSampler",
    "GPURankBasedSampler",
    "GPURandomSampler",
    "GPUSliceSampler",
    "GPUPrioritizedSliceSampler",
    "GPUSamplerWithoutReplacement",
    "GPUPrioritizedReplayBuffer",
    "EmptyBufferError",
    "make_replay_buffer",
    "WriterHandle",
    "IngressStats",
]
