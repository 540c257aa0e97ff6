"""The capture's view of a sampler, decided by type: a sampler that is not a ``CapturableSampler`` is refused with
TorchRL's sentence whatever members it holds, and ours hand a ``SamplerCapture`` whose RNG accessors and device
tensors put a sampler back after work that must leave no trace (the warm-up of a capture; on a CPU, a refused first
call), so the draws that follow are those of a twin buffer that never went through a capture. CPU only (~3 s)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import PrioritizedSampler, Sampler

from lightning_per import make_replay_buffer
from lightning_per.graphs import CapturableSampler, CaptureError, capture
from lightning_per.graphs.protocol import SamplerCapture
from lightning_per.graphs.state import CaptureState, sampler_view

#: the refusal of a sampler that is not ours, word for word as the capture has always written it
TORCHRL_REFUSAL = ("sampler {} cannot be captured (TorchRL's samplers draw on the host); use lightning_per's "
                   "GPUPrioritizedReplayBuffer / make_replay_buffer, or capture the learner alone (pass the batch as "
                   "the step's input)")


class _UserSampler(Sampler):
    """A user's sampler on TorchRL's base (not ours), holding the members the capture once probed for."""

    def __init__(self) -> None:
        self.generator = torch.Generator().manual_seed(0)
        self.device = torch.device("cpu")

    def sample(self, storage, batch_size):
        return torch.randint(len(storage), (batch_size,), generator=self.generator), {}

    def capture_problem(self, storage):  # the old duck-typed member: never read
        return None

    def device_state(self):
        return [torch.zeros(3)]

    def state_dict(self):
        return {}

    def load_state_dict(self, state_dict):
        return None

    def _empty(self):
        return None

    def dumps(self, path):
        return None

    def loads(self, path):
        return None


def test_a_user_sampler_on_torchrl_base_gets_torchrl_refusal_word_for_word():
    sampler = _UserSampler()
    assert not isinstance(sampler, CapturableSampler)
    message = TORCHRL_REFUSAL.format("_UserSampler")
    assert sampler_view(sampler, None, 4) == SamplerCapture(message)  # no tensors, device nor generators of its own
    with pytest.raises(CaptureError) as bare:
        capture(lambda: None, state=[sampler], enabled=True, device="cuda")
    assert str(bare.value) == message
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), sampler=_UserSampler(), batch_size=4)
    rb.extend(TensorDict({"x": torch.arange(8.0)}, [8]))
    with pytest.raises(CaptureError) as buffered:
        capture(lambda: rb.sample(), state=[rb])  # on a CPU: the same check, at construction
    assert str(buffered.value) == message
    parts = CaptureState([rb])
    assert parts.tensors == {} and parts.generators() == [] and parts.device() == torch.device("cpu")
    # TorchRL's prioritized sampler: the same refusal, with the device its tree is on (its public ``device``)
    prioritized = PrioritizedSampler(8, alpha=0.6, beta=0.4)
    assert sampler_view(prioritized, None, 4) == SamplerCapture(TORCHRL_REFUSAL.format("PrioritizedSampler"),
                                                                device=torch.device("cpu"))


def _pair(kind: str):
    """Two buffers of ``kind`` built and filled alike (the same seeds), the second never captured."""
    def make():
        rb = make_replay_buffer(16, 4, sampler=kind, device="cpu", alpha=0.6, beta=0.4, seed=3,
                                generator=torch.Generator().manual_seed(7))
        rb.extend(TensorDict({"x": torch.arange(16.0), "td_error": torch.linspace(0.1, 3.0, 16)}, [16]))
        return rb
    return make(), make()


def _draw(rb, n: int = 3) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """``n`` batches' indices and IS weights (None: uniform), each followed by a priority write when prioritized."""
    out = []
    for _ in range(n):
        batch = rb.sample()
        out.append((batch["index"].clone(), batch.get("priority_weight", None)))
        if "priority_weight" in batch.keys():
            rb.update_priority(batch["index"], batch["x"] + 0.5)
    return out


def _same(a, b) -> bool:
    return all(torch.equal(ia, ib) and (wa is None and wb is None or torch.equal(wa, wb))
               for (ia, wa), (ib, wb) in zip(a, b, strict=True))


@pytest.mark.parametrize("kind", ["proportional", "rank", "uniform"])
def test_a_snapshot_and_restore_leave_the_draws_of_a_never_captured_twin(kind):
    rb, twin = _pair(kind)
    assert isinstance(rb.sampler, CapturableSampler)
    parts = CaptureState([rb])
    view = rb.sampler.capture_view(rb.storage, 4)
    assert parts.generators() == [] and rb.sampler.generator in view.generators  # a CPU generator: not registered
    saved = parts.snapshot(torch.device("cpu"))
    warm = _draw(rb)  # the warm-up's draws and priority writes
    parts.restore(saved)
    assert _same(_draw(rb), _draw(twin))
    assert _same(warm, _draw(_pair(kind)[1]))  # the warm-up drew what a fresh buffer draws first


def test_a_refused_first_call_on_a_cpu_puts_the_sampler_back():
    rb, twin = _pair("proportional")

    def step():
        batch = rb.sample()
        rb.update_priority(batch["index"], batch["x"] + 0.5)
        return batch["x"].sum().item()  # a host read: a graph cannot hold it

    update = capture(step, state=[rb])
    assert update.checked and not update.graphed
    with pytest.raises(CaptureError, match="reads on the host"):
        update()
    assert _same(_draw(rb), _draw(twin))


def test_a_checked_first_call_on_a_cpu_draws_what_the_twin_draws():
    rb, twin = _pair("proportional")
    update = capture(lambda: _draw(rb, 1)[0][0], state=[rb])
    first = update()
    assert torch.equal(first, _draw(twin, 1)[0][0])
    assert _same(_draw(rb), _draw(twin))
