"""Generation stamps: a priority update aimed at a slot rewritten since it was sampled is dropped, checked against
TorchRL's own stamps (``TensorDictRoundRobinWriter(track_generations=True)``: ``generations_of`` and
``update_if_present``, which skips the same records) and against the exact probabilities P(i) = p_i / sum_k p_k.
CPU only, well under a second."""

from __future__ import annotations

import copy
import importlib.metadata

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer, TensorDictRoundRobinWriter

from lightning_per.replay import GPUPrioritizedReplayBuffer, GPURoundRobinWriter, GPUTensorStorage

pytestmark = pytest.mark.skipif(
    tuple(int(p) for p in importlib.metadata.version("torchrl").split(".")[:2]) < (0, 14),
    reason="checks behaviour against TorchRL >= 0.14's own classes (features older TorchRL lacks)")

_N = 8
_EPS = 1e-8


def _pair(sampler: str = "proportional"):
    """Our buffer and TorchRL's, both stamping generations, over the same ``_N`` slots."""
    ours = GPUPrioritizedReplayBuffer(alpha=1.0, beta=0.0, eps=_EPS, storage=GPUTensorStorage(_N, device="cpu"),
                                      batch_size=_N, device="cpu", sampler=sampler,
                                      writer=GPURoundRobinWriter(track_generations=True))
    theirs = TensorDictReplayBuffer(storage=LazyTensorStorage(_N),
                                    writer=TensorDictRoundRobinWriter(track_generations=True), batch_size=_N)
    return ours, theirs


def _extend(rbs, start: int, n: int) -> None:
    for rb in rbs:
        rb.extend(TensorDict({"x": torch.arange(start, start + n, dtype=torch.float32)}, [n]))


def _probabilities(raw: torch.Tensor) -> torch.Tensor:
    p = (raw.double() + _EPS)
    return p / p.sum()


@pytest.mark.parametrize("through", ["update_priority", "update_tensordict_priority"])
def test_update_of_a_rewritten_slot_is_a_no_op(through):
    ours, theirs = _pair()
    _extend((ours, theirs), 0, _N)
    batch = ours.sample()
    index, generation = batch["index"], batch["index_generation"]
    assert torch.equal(generation, theirs.writer.generations_of(index))  # TorchRL's stamps, read the same way
    _extend((ours, theirs), 100, 3)  # slots 0, 1, 2 rewritten since the sample
    priority = index.to(torch.float32) + 2.0  # one value per slot: a repeated slot gets the same value
    if through == "update_priority":
        ours.update_priority(index, priority, generation=generation)
    else:
        batch["td_error"] = priority
        ours.update_tensordict_priority(batch)
    # TorchRL's answer: which (index, generation) records are still live
    result = theirs.update_if_present(index=index, generation=generation, patch={"x": torch.zeros(_N)})
    live = result.updated
    assert result.stale_count == int((index < 3).sum()) and result.stale_count > 0  # the sample hit slot 0..2
    raw = torch.ones(_N)  # every slot holds the default (the running max, 1) since its last write
    raw[index[live]] = priority[live]
    torch.testing.assert_close(ours.sampler.probabilities(), _probabilities(raw), rtol=0, atol=1e-6)  # float32 leaves
    assert int(ours.sampler.dropped_index_count) == int((~live).sum())


def test_rank_sampler_drops_stale_updates_too():
    ours, theirs = _pair("rank")
    _extend((ours, theirs), 0, _N)
    index = torch.arange(_N)
    generation = ours.writer.generations_of(index)
    _extend((ours, theirs), 100, 2)  # slots 0, 1 rewritten
    ours.update_priority(index, torch.arange(_N, dtype=torch.float32) + 10.0, generation=generation)
    live = theirs.update_if_present(index=index, generation=generation, patch={"x": torch.zeros(_N)}).updated
    assert live.tolist() == [False, False] + [True] * (_N - 2)
    # rank-based: slots 0 and 1 keep the default priority 1, the lowest: they hold the two last ranks
    order = ours.sampler.probabilities().argsort(descending=True)
    assert sorted(order[-2:].tolist()) == [0, 1]


def test_live_updates_after_an_unrelated_write_are_kept():
    ours, theirs = _pair()
    _extend((ours, theirs), 0, 4)  # slots 0..3; 4..7 never written
    index = torch.tensor([0, 1, 2, 3])
    generation = ours.writer.generations_of(index)
    _extend((ours, theirs), 100, 2)  # slots 4, 5: not the sampled ones
    ours.update_priority(index, torch.tensor([1.0, 2.0, 3.0, 4.0]), generation=generation)
    raw = torch.tensor([1.0, 2.0, 3.0, 4.0, 1.0, 1.0])  # slots 4, 5 got the running max when written: 1
    p = ours.sampler.probabilities()
    torch.testing.assert_close(p[:6], _probabilities(raw), rtol=0, atol=1e-6)  # float32 leaves
    assert torch.equal(p[6:], torch.zeros(2, dtype=torch.float64))  # never written
    assert int(ours.sampler.dropped_index_count) == 0


def test_generation_refusals_change_nothing():
    ours, _ = _pair()
    _extend((ours,), 0, _N)
    before = ours.sampler.probabilities().clone()
    index = torch.arange(4)
    with pytest.raises(ValueError, match="generation must be an int64 tensor of index's shape"):
        ours.update_priority(index, torch.full((4,), 5.0), generation=torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="generation must be an int64"):
        ours.update_priority(index, torch.full((4,), 5.0), generation=torch.zeros(4))
    plain = GPUPrioritizedReplayBuffer(alpha=1.0, beta=0.0, storage=GPUTensorStorage(_N, device="cpu"), device="cpu")
    _extend((plain,), 0, _N)
    with pytest.raises(ValueError, match="track_generations=True"):
        plain.update_priority(index, torch.full((4,), 5.0), generation=torch.zeros(4, dtype=torch.int64))
    assert torch.equal(ours.sampler.probabilities(), before)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_stale_updates_beyond_a_restored_fill_are_dropped(device):
    """A restore to a snapshot with fewer filled slots, then an update stamped before it aimed at every slot: the
    entries beyond the restored fill were written after the snapshot (their stamps moved back), so they are stale
    and dropped silently, as any stale entry; the live ones are written. Exact probabilities; well under a second."""
    rb = GPUPrioritizedReplayBuffer(alpha=1.0, beta=0.0, eps=_EPS, storage=GPUTensorStorage(_N, device=device),
                                    batch_size=_N, device=device, writer=GPURoundRobinWriter(track_generations=True))
    _extend((rb,), 0, 4)  # slots 0..3
    snapshot = copy.deepcopy(rb.state_dict())  # state_dict() aliases the live storage: copy it
    _extend((rb,), 100, 4)  # slots 4..7, after the snapshot
    index = torch.arange(_N, device=device)
    generation = rb.writer.generations_of(index)  # what a sample of every slot carried
    rb.load_state_dict(snapshot)
    assert len(rb) == 4
    rb.update_priority(index, torch.arange(_N, dtype=torch.float32, device=device) + 10.0, generation=generation)
    p = rb.sampler.probabilities().cpu()
    torch.testing.assert_close(p[:4], _probabilities(torch.tensor([10.0, 11.0, 12.0, 13.0])), rtol=0, atol=1e-6)
    assert torch.equal(p[4:], torch.zeros(4, dtype=torch.float64))  # not filled after the restore
    assert int(rb.sampler.dropped_index_count) == 4
    live = torch.tensor([5])  # a host index whose stamp matches: live, beyond the fill, refused (nothing changes)
    with pytest.raises(IndexError, match=r"\[0, 4\)"):
        rb.update_priority(live, torch.ones(1), generation=rb.writer.generations_of(live))
    assert torch.equal(rb.sampler.probabilities().cpu(), p)
