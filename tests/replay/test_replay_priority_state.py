"""The proportional replay core as functions of an explicit PriorityState (and the rank index over it)."""

import pytest
import torch

from lightning_per.ops import reference
from lightning_per.replay import GPUPrioritizedSampler, GPURankBasedSampler, priority
from lightning_per.replay.priority import PriorityState
from lightning_per.replay.rank import RankIndex, sort_ranks

CPU = torch.device("cpu")


def _state(capacity=7, block=4, alpha=0.6, beta=0.4, eps=1e-6):
    return PriorityState.empty(capacity, block=block, alpha=alpha, beta=beta, eps=eps, device=CPU)


def test_empty_state_shapes_and_tensors_order():
    s = _state(capacity=7, block=4)  # slot 7 is the trash slot: 8 slots -> 2 blocks
    assert s.leaves.shape == (2, 4) and s.raw.shape == (8,) and s.block_sum.dtype == torch.float64
    assert s.tensors() == (s.raw, s.leaves, s.block_sum, s.block_min, s.max_raw, s.n_clamped, s.n_dropped,
                           s.alpha, s.beta)
    rng = torch.zeros(3, dtype=torch.int64)
    with_rng = PriorityState.empty(7, block=4, alpha=0.6, beta=0.4, eps=1e-6, device=CPU, rng=rng)
    assert with_rng.tensors()[-1] is rng and len(with_rng.tensors()) == 10
    assert float(s.beta) == pytest.approx(0.4) and not s.written().any()


def test_write_stores_transformed_values_and_exact_block_sums():
    s = _state(capacity=7, alpha=0.5, eps=1e-6)
    p = torch.tensor([1.0, 4.0, 9.0, 0.25, 2.0, 3.0, 5.0])
    priority.write(reference, s, torch.arange(7), p, 7)
    want = (p.double() + 1e-6) ** 0.5
    torch.testing.assert_close(s.leaves.view(-1)[:7].double(), want, rtol=1e-6, atol=0)
    torch.testing.assert_close(s.block_sum, s.leaves.double().sum(1))
    assert float(s.max_raw) == 9.0
    torch.testing.assert_close(priority.probabilities(s), want / want.sum(), rtol=1e-6, atol=0)


def test_repeated_index_last_write_wins_and_out_of_range_is_dropped():
    s = _state()
    priority.write(reference, s, torch.tensor([2, 2, 2, 9]), torch.tensor([1.0, 5.0, 3.0, 7.0]), 7)
    assert float(s.raw[2]) == 3.0 and int(s.n_dropped) == 1 and float(s.leaves.view(-1)[7]) == 0.0


def test_rebuild_after_alpha_change_equals_fresh_writes():
    p = torch.tensor([1.0, 4.0, 9.0])
    a, b = _state(alpha=0.5), _state(alpha=1.0)
    priority.write(reference, a, torch.arange(3), p, 7)
    priority.write(reference, b, torch.arange(3), p, 7)
    a.alpha.fill_(1.0)
    priority.rebuild(reference, a)
    torch.testing.assert_close(a.leaves, b.leaves)
    torch.testing.assert_close(a.block_sum, b.block_sum)


def test_sample_and_sample_gather_agree():
    s = _state(capacity=4, block=4, beta=1.0)
    priority.write(reference, s, torch.arange(4), torch.tensor([1.0, 1.0, 1.0, 3.0]), 4)
    u = torch.tensor([0.05, 0.3, 0.6, 0.95], dtype=torch.float64)
    index, weight = priority.sample(reference, s, u, False, "buffer")
    rows = torch.arange(8, dtype=torch.int64).view(4, 2)
    block, index2, weight2 = priority.sample_gather(reference, s, u, rows, False, "buffer")
    assert torch.equal(index, index2) and torch.equal(weight, weight2) and torch.equal(block, rows[index])
    assert index.tolist()[-1] == 3


def test_mask_removes_mass_and_default_priority():
    s = _state(capacity=4, block=4)
    assert float(priority.default_priority(s.max_raw)) == 1.0
    priority.write(reference, s, torch.arange(4), torch.ones(4), 4)
    priority.mask(reference, s, torch.tensor([True, False, True, True]))
    assert float(priority.probabilities(s)[1]) == 0.0
    torch.testing.assert_close(s.block_sum, s.leaves.double().sum(1))


def test_bounded_clamps_overflowing_priorities_and_counts_them():
    s = _state(alpha=2.0)
    out = priority.bounded(s, torch.tensor([1.0, 3e38, float("inf")]))
    assert float(out[1]) == s.raw_limit and float(out[2]) == float("inf") and int(s.n_clamped) == 1


@pytest.mark.parametrize("kind", [GPUPrioritizedSampler, GPURankBasedSampler])
def test_sampler_capture_tensors_are_its_state_tensors(kind):
    sampler = kind(8, alpha=0.6, beta=0.4, device="cpu", seed=0)
    tensors = sampler.capture_view(None, None).tensors
    assert all(a is b for a, b in zip(tensors, sampler.core.state.tensors(), strict=True))
    sampler.update_priority(torch.arange(3), torch.tensor([1.0, 2.0, 3.0]))
    assert sampler.core.state.writes == 1


def test_rank_index_sorts_written_slots_descending_stable():
    s = _state(capacity=5, block=4)
    priority.write(reference, s, torch.tensor([0, 1, 2, 3]), torch.tensor([2.0, 5.0, 2.0, 1.0]), 5)
    index = RankIndex.empty(5, 0.6, CPU)
    sort_ranks(s, index)
    assert index.order.tolist() == [1, 0, 2, 3, 4]  # ties keep the lower slot first; unwritten slot 4 last
    before = index.cdf
    index.follow_alpha(1.0)
    assert index.cdf is before and index.alpha == 1.0
    torch.testing.assert_close(index.cdf, torch.cumsum(1 / torch.arange(1, 6, dtype=torch.float64), 0))
