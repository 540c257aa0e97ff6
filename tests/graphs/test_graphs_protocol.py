"""The graph layer's contract with samplers (a :class:`CapturableSampler` hands its ``capture_view`` value; any
other sampler is refused) and its place below replay: importing ``lightning_per.graphs`` and its modules imports
nothing of ``lightning_per.replay`` nor Lightning."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import RandomSampler

from lightning_per import make_replay_buffer
from lightning_per.graphs import CapturableSampler, CaptureError, capture
from lightning_per.graphs.protocol import SamplerCapture
from lightning_per.graphs.state import CaptureState
from lightning_per.replay import GPURandomSampler, GPURoundRobinWriter, GPUTensorStorage


@CapturableSampler.register
class _Refusing(RandomSampler):
    def capture_view(self, storage, batch_size):
        return SamplerCapture("this sampler says no" if storage is None else None)


@CapturableSampler.register
class _Fine(RandomSampler):
    def capture_view(self, storage, batch_size):
        return SamplerCapture(None)


def test_a_sampler_is_refused_with_its_own_reason_and_accepted_when_it_has_none():
    with pytest.raises(CaptureError, match="this sampler says no"):
        capture(lambda: None, state=[_Refusing()], enabled=True, device="cuda")
    capture(lambda: None, state=[_Fine()], enabled=True, device="cuda")
    with pytest.raises(CaptureError, match="sampler RandomSampler cannot be captured"):
        capture(lambda: None, state=[RandomSampler()], enabled=True, device="cuda")


def test_our_samplers_implement_the_protocol():
    rb = make_replay_buffer(16, 4, sampler="proportional", device="cpu", alpha=0.6, beta=0.4)
    assert isinstance(rb.sampler, CapturableSampler) and rb.sampler.capture_view(rb.storage, 4).problem is None
    rank = make_replay_buffer(16, 4, sampler="rank", device="cpu", alpha=0.6, beta=0.4)
    assert "sort_every" in rank.sampler.capture_view(None, 4).problem


def test_a_uniform_sampler_is_ready_once_its_ring_is_full():
    sampler = GPURandomSampler(device="cpu", seed=0)
    rb = TensorDictReplayBuffer(storage=GPUTensorStorage(4, device="cpu"), sampler=sampler,
                                writer=GPURoundRobinWriter(), batch_size=2)
    parts = CaptureState([rb])
    parts.check_capturable()
    with pytest.raises(CaptureError, match="buffer is empty"):
        parts.check_ready()
    rb.extend(TensorDict({"reward": torch.arange(3.0)}, [3]))
    with pytest.raises(CaptureError, match=r"GPURandomSampler draws from len\(storage\).*\(3 of 4\)"):
        parts.check_ready()
    rb.extend(TensorDict({"reward": torch.arange(1.0)}, [1]))
    parts.check_ready()


def test_the_graph_layer_imports_neither_replay_nor_lightning():
    code = ("import sys, lightning_per.graphs as g\n"
            "for name in g.__all__: getattr(g, name)\n"
            "bad = [m for m in sys.modules if m.startswith(('lightning_per.replay', 'lightning_per.callbacks', "
            "'lightning_per.dqn', 'lightning_per.ga3c', 'pytorch_lightning')) or m == 'lightning' "
            "or m.startswith('lightning.')]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)
