"""TorchRL integration of the GPU-resident replay: storage, samplers, buffer and factory."""

from lightning_per.replay.buffer import GPUPrioritizedReplayBuffer, GPUReplayBuffer
from lightning_per.replay.errors import EmptyBufferError
from lightning_per.replay.factory import make_replay_buffer
from lightning_per.replay.frames import FrameStackStorage
from lightning_per.replay.host import PinnedHostStorage
from lightning_per.replay.ingress import IngressStats, SharedBufferWriter, WriterHandle
from lightning_per.replay.migration import from_torchrl
from lightning_per.replay.prioritized import GPUPrioritizedSampler
from lightning_per.replay.random import GPURandomSampler, GPUSamplerWithoutReplacement
from lightning_per.replay.rank import GPURankBasedSampler
from lightning_per.replay.rate import SamplesPerInsert
from lightning_per.replay.remote_ingress import RemoteIngress, RemoteStats, RemoteWriter
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
    "GPUReplayBuffer",
    "EmptyBufferError",
    "make_replay_buffer",
    "from_torchrl",
    "WriterHandle",
    "SharedBufferWriter",
    "IngressStats",
    "RemoteIngress",
    "RemoteWriter",
    "RemoteStats",
    "SamplesPerInsert",
]
