"""The reference ops and the sampler's sums against NumPy models (hypothesis properties, drift)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lightning_per import GPUPrioritizedSampler
from lightning_per.ops import reference as ref


class _Len:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


@given(st.lists(st.tuples(st.integers(0, 20), st.floats(0, 100)), min_size=1, max_size=40))
@settings(max_examples=60, deadline=None)
def test_last_write_wins_matches_sequential_writes(pairs):
    index = torch.tensor([i for i, _ in pairs])
    values = torch.tensor([v for _, v in pairs], dtype=torch.float64)
    out = ref.last_write_wins(index, values)
    expected = {}
    for i, v in pairs:  # sequential writes: the later one overwrites
        expected[i] = v
    np.testing.assert_array_equal(out.numpy(), [expected[i] for i, _ in pairs])


@given(capacity=st.integers(1, 70),
       updates=st.lists(st.lists(st.tuples(st.integers(0, 69), st.floats(0, 50)), min_size=1, max_size=12),
                        min_size=1, max_size=8),
       alpha=st.sampled_from([0.0, 0.5, 1.0]))
@settings(max_examples=60, deadline=None)
def test_block_sums_equal_numpy_model_after_any_updates(capacity, updates, alpha):
    """Invariant: block sums/mins equal a float64 recomputation of a NumPy model of the priorities."""
    eps = 1e-6
    s = GPUPrioritizedSampler(capacity, alpha, 0.5, eps, device="cpu")
    model = np.zeros(capacity)  # stored values; 0 = never written
    s.mark_update(torch.arange(capacity), storage=_Len(capacity))
    model[:] = (1.0 + eps) ** alpha
    for batch in updates:
        idx = [i % capacity for i, _ in batch]
        s.update_priority(torch.tensor(idx), torch.tensor([p for _, p in batch]), storage=_Len(capacity))
        for i, (_, p) in zip(idx, batch):
            model[i] = (np.float64(np.float32(p)) + eps) ** alpha
    leaves = s.core.state.leaves.view(-1).double().numpy()
    np.testing.assert_allclose(leaves[:capacity], model, rtol=1e-6)
    assert (leaves[capacity:] == 0).all()  # padding and trash stay empty
    block = s.core.block
    for b in range(s.core.n_blocks):
        row = leaves[b * block:(b + 1) * block]
        assert s.core.state.block_sum[b].item() == pytest.approx(row.sum(), rel=1e-12)
    np.testing.assert_allclose(s.probabilities().numpy(), model / model.sum(), rtol=1e-6)


def test_no_drift_after_a_million_updates():
    """10^6 random priority writes: the sums equal a float64 recomputation from the leaves exactly
    (they are recomputed per touched block, never updated by deltas; cf. flashbax issue #52)."""
    n = 100_003
    s = GPUPrioritizedSampler(n, 0.6, 0.4, 1e-6, device="cpu", seed=0)
    store = _Len(n)
    s.mark_update(torch.arange(n), storage=store)
    g = torch.Generator().manual_seed(0)
    for _ in range(250):  # 250 x 4000 = 10^6 writes
        idx = torch.randint(0, n, (4000,), generator=g)
        s.update_priority(idx, torch.rand(4000, generator=g) * 10, storage=store)
    exact = s.core.state.leaves.double().sum(dim=1)
    rel = ((s.core.state.block_sum - exact).abs().max() / exact.abs().max()).item()
    assert rel < 1e-12
    total_exact = s.core.state.leaves.view(-1).double().numpy().sum()
    assert abs(s.core.state.block_sum.sum().item() - total_exact) / total_exact < 1e-6


@given(st.lists(st.floats(0, 10), min_size=1, max_size=50), st.lists(st.floats(0, 0.999), min_size=1, max_size=20))
@settings(max_examples=60, deadline=None)
@example(values=[1.0, 1.0], us=[0.5])  # u*S exactly on C_0: a tie (found by a random run)
def test_two_level_search_is_inverse_cdf(values, us):
    """Draw u lands on slot i with C_{i-1} <= u*S < C_i (NumPy cumulative sums), skipping empty slots."""
    cap = len(values)
    block = ref.block_size_for(cap)
    nb = -(-cap // block)
    leaves = torch.zeros(nb * block, dtype=torch.float32)
    leaves[:cap] = torch.tensor(values, dtype=torch.float32)
    leaves = leaves.view(nb, block)
    if leaves.sum() == 0:
        return
    block_sum, _ = ref.reduce_blocks(leaves)
    u = torch.tensor(us, dtype=torch.float64)
    got = ref.two_level_search(leaves, block_sum, u).numpy()
    flat = leaves.view(-1).double().numpy()
    cdf = np.cumsum(flat)
    target = np.asarray(us) * cdf[-1]
    expected = np.searchsorted(cdf, target, side="right")
    assert (flat[got] > 0).all()
    # away from ties the NumPy answer is exact; at u*S == C_{i-1} (a boundary, probability 0) either side
    # is a valid inverse CDF, so both boundaries of the expected slot are excluded
    tol = 1e-9 * cdf[-1]
    upper = cdf[np.minimum(expected, len(cdf) - 1)]
    lower = np.where(expected > 0, cdf[np.maximum(expected - 1, 0)], -np.inf)
    clear = (np.abs(upper - target) > tol) & (np.abs(lower - target) > tol)
    np.testing.assert_array_equal(got[clear], expected[clear])


def test_sanitize_and_transform():
    p = torch.tensor([1.0, float("nan"), float("inf"), -2.0, float("-inf"), 0.0])
    clean, bad = ref.sanitize_priority(p, torch.tensor(4.0))
    np.testing.assert_array_equal(clean.numpy(), [1.0, 4.0, 4.0, 0.0, 0.0, 0.0])
    assert bad.item() == 4
    stored = ref.transform_priority(clean, 0.5, 1e-2)
    np.testing.assert_allclose(stored.numpy(), (clean.double().numpy() + 1e-2) ** 0.5, rtol=1e-6)


def test_rank_weights_and_stratified_uniforms():
    w, cdf = ref.rank_weights(5, 0.5)
    np.testing.assert_allclose(w.numpy(), np.arange(1, 6) ** -0.5)
    np.testing.assert_allclose(cdf.numpy(), np.cumsum(np.arange(1, 6) ** -0.5))
    u = ref.stratified_uniforms(8, torch.Generator().manual_seed(0), torch.device("cpu"))
    seg = np.floor(u.numpy() * 8)
    np.testing.assert_array_equal(seg, np.arange(8))  # one draw per equal segment
    assert ref.block_size_for(1_000_000) == 1024 and ref.block_size_for(7) == 4
    with pytest.raises(ValueError, match="capacity"):
        ref.block_size_for(0)
    with pytest.raises(ValueError, match="normalize"):
        ref.is_weights(torch.ones(2), torch.tensor(1.0), 0.5, "global")
