"""TorchRL integration of the GPU-resident replay: storage, samplers, buffer and factory."""

import lightning_per
from lightning_per.replay.buffer import GPUPrioritizedReplayBuffer as GPUPrioritizedReplayBuffer
from lightning_per.replay.buffer import GPUReplayBuffer as GPUReplayBuffer
from lightning_per.replay.errors import EmptyBufferError as EmptyBufferError
from lightning_per.replay.factory import make_replay_buffer as make_replay_buffer
from lightning_per.replay.frames import FrameStackStorage as FrameStackStorage
from lightning_per.replay.host import PinnedHostStorage as PinnedHostStorage
from lightning_per.replay.ingress import IngressStats as IngressStats
from lightning_per.replay.ingress import SharedBufferWriter as SharedBufferWriter
from lightning_per.replay.ingress import WriterHandle as WriterHandle
from lightning_per.replay.migration import from_torchrl as from_torchrl
from lightning_per.replay.prioritized import GPUPrioritizedSampler as GPUPrioritizedSampler
from lightning_per.replay.random import GPURandomSampler as GPURandomSampler
from lightning_per.replay.random import GPUSamplerWithoutReplacement as GPUSamplerWithoutReplacement
from lightning_per.replay.rank import GPURankBasedSampler as GPURankBasedSampler
from lightning_per.replay.rate import SamplesPerInsert as SamplesPerInsert
from lightning_per.replay.remote_ingress import RemoteIngress as RemoteIngress
from lightning_per.replay.remote_ingress import RemoteStats as RemoteStats
from lightning_per.replay.remote_ingress import RemoteWriter as RemoteWriter
from lightning_per.replay.slice import GPUSliceSampler as GPUSliceSampler
from lightning_per.replay.slice_prioritized import GPUPrioritizedSliceSampler as GPUPrioritizedSliceSampler
from lightning_per.replay.storage import GPUTensorStorage as GPUTensorStorage
from lightning_per.replay.writer import GPURoundRobinWriter as GPURoundRobinWriter

#: the package root's public names (``lightning_per.__all__``, the one list of them) and the building blocks
#: a TorchRL user composes them with
__all__ = [*lightning_per.__all__, "GPURoundRobinWriter", "EmptyBufferError", "SamplesPerInsert"]
