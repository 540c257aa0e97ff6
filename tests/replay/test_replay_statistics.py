"""Sampling distributions and IS weights against exact closed forms and against TorchRL's sampler.

Chi-square goodness-of-fit tests: significance 1e-3 (a correct sampler fails one run in a thousand;
seeds are fixed, so the outcome is deterministic anyway), and the number of draws is chosen so the
test has power >= 0.99 against a deviation of Cohen's effect size w = 0.1 from the exact P(i)
(e.g. moving 5% of the mass between two slots). `draws_for_power` computes that number from the
noncentral chi-square distribution, so the threshold is derived, not hand-picked.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats
from tensordict import TensorDict

from lightning_per import make_replay_buffer

SIGNIFICANCE = 1e-3
EFFECT = 0.1
POWER = 0.99


def draws_for_power(k: int) -> int:
    """Smallest n (in steps of 500) with power >= POWER at effect size EFFECT, df = k - 1."""
    crit = stats.chi2.ppf(1 - SIGNIFICANCE, k - 1)
    n = 500
    while stats.ncx2.sf(crit, k - 1, n * EFFECT**2) < POWER:
        n += 500
    return n


def chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    mask = probs > 0
    assert counts[~mask].sum() == 0, "a zero-probability slot was sampled"
    return stats.chisquare(counts[mask], counts.sum() * probs[mask]).pvalue


def filled_buffer(kind, capacity, n, raw, device, alpha=0.7, **kw):
    rb = make_replay_buffer(capacity, 64, sampler=kind, device=device, alpha=alpha, beta=0.5, eps=1e-6,
                            generator=torch.Generator().manual_seed(capacity), **kw)
    rb.extend(TensorDict({"x": torch.arange(n, dtype=torch.float32)}, [n]))
    rb.update_priority(torch.arange(n), torch.tensor(raw, dtype=torch.float32))
    return rb


def exact_proportional(raw, alpha=0.7, eps=1e-6):
    stored = (np.asarray(raw, dtype=np.float32).astype(np.float64) + eps) ** alpha
    return stored / stored.sum()


def exact_rank(raw, alpha=0.7):
    order = np.argsort(-np.asarray(raw), kind="stable")
    p = np.empty(len(raw))
    p[order] = np.arange(1, len(raw) + 1, dtype=np.float64) ** -alpha
    return p / p.sum()


@pytest.mark.parametrize("capacity,n", [(7, 7), (11, 9), (33, 33), (33, 20)])
@pytest.mark.parametrize("stratified", [True, False])
def test_proportional_chi_square(capacity, n, stratified, device):
    rng = np.random.default_rng(capacity)
    raw = rng.exponential(1.0, n)
    raw[rng.integers(n)] = 0.0  # a zero raw priority still has mass eps^alpha
    rb = filled_buffer("proportional", capacity, n, raw, device, stratified=stratified)
    draws = draws_for_power(n)
    idx = torch.cat([rb.sampler.sample(rb.storage, 500)[0].cpu() for _ in range(draws // 500)])
    counts = np.bincount(idx.numpy(), minlength=capacity)
    probs = np.zeros(capacity)
    probs[:n] = exact_proportional(raw)
    assert chi_square_p(counts, probs) > SIGNIFICANCE


@pytest.mark.parametrize("capacity,n", [(7, 7), (11, 11), (33, 25)])
def test_rank_chi_square(capacity, n, device):
    raw = np.random.default_rng(capacity + 1).permutation(n).astype(np.float64) + 0.5  # distinct
    rb = filled_buffer("rank", capacity, n, raw, device)
    draws = draws_for_power(n)
    idx = torch.cat([rb.sampler.sample(rb.storage, 500)[0].cpu() for _ in range(draws // 500)])
    counts = np.bincount(idx.numpy(), minlength=capacity)
    probs = np.zeros(capacity)
    probs[:n] = exact_rank(raw)
    assert chi_square_p(counts, probs) > SIGNIFICANCE


@pytest.mark.parametrize("capacity", [7, 33])
def test_uniform_chi_square(capacity, device):
    rb = make_replay_buffer(capacity, 500, sampler="uniform", device=device,
                            generator=torch.Generator().manual_seed(4))
    rb.extend(TensorDict({"x": torch.zeros(capacity)}, [capacity]))
    draws = draws_for_power(capacity)
    idx = torch.cat([rb.sample()["index"].cpu() for _ in range(draws // 500)])
    assert chi_square_p(np.bincount(idx.numpy(), minlength=capacity), np.full(capacity, 1 / capacity)) > SIGNIFICANCE


def test_power_calculation_is_meaningful():
    """The test would catch a sampler that moves 5% of the mass between two of 7 slots."""
    probs = exact_proportional(np.arange(1.0, 8.0))
    wrong = probs.copy()
    wrong[0] += 0.05
    wrong[-1] -= 0.05
    n = draws_for_power(7)
    rng = np.random.default_rng(0)
    rejected = sum(chi_square_p(np.bincount(rng.choice(7, n, p=wrong), minlength=7), probs) < SIGNIFICANCE
                   for _ in range(50))
    assert rejected >= 45


@pytest.mark.parametrize("normalization", ["buffer", "batch"])
def test_proportional_is_weights_closed_form(normalization, device):
    raw = np.array([0.2, 1.0, 3.0, 0.05, 7.0, 1.5])
    alpha, beta, eps = 0.6, 0.4, 1e-6
    rb = filled_buffer("proportional", 8, 6, raw, device, alpha=alpha, weight_normalization=normalization)
    rb.sampler.beta = beta
    idx, info = rb.sampler.sample(rb.storage, 64)
    P = exact_proportional(raw, alpha, eps)
    w_all = (len(raw) * P) ** -beta  # PER eq. for w_i, before normalisation
    w = w_all[idx.cpu().numpy()]
    w = w / (w_all.max() if normalization == "buffer" else w.max())
    np.testing.assert_allclose(info["priority_weight"].cpu().numpy(), w, rtol=1e-5)


def test_rank_is_weights_closed_form(device):
    raw = np.array([5.0, 1.0, 3.0, 0.5, 2.0])
    alpha, beta = 0.7, 0.6
    rb = filled_buffer("rank", 8, 5, raw, device, alpha=alpha)
    rb.sampler.beta = beta
    idx, info = rb.sampler.sample(rb.storage, 64)
    P = exact_rank(raw, alpha)
    w_all = (len(raw) * P) ** -beta
    np.testing.assert_allclose(info["priority_weight"].cpu().numpy(), w_all[idx.cpu().numpy()] / w_all.max(),
                               rtol=1e-5)


def test_parity_with_torchrl_prioritized_sampler():
    """Same priorities in TorchRL's C++ sum tree (CPU) and ours: same P(i), same IS weight per index."""
    tr = pytest.importorskip("torchrl.data")
    try:
        ref = tr.PrioritizedSampler(16, alpha=0.8, beta=0.5, eps=1e-6)
    except RuntimeError:
        pytest.skip("torchrl._torchrl extension does not load with this torch")
    raw = np.random.default_rng(0).uniform(0.01, 5.0, 12).astype(np.float32)
    storage = tr.LazyTensorStorage(16)
    storage.set(torch.arange(12), TensorDict({"x": torch.zeros(12)}, [12]))
    ref.update_priority(torch.arange(12), torch.tensor(raw))
    ours = filled_buffer("proportional", 16, 12, raw, "cpu", alpha=0.8)
    ours.sampler.beta = 0.5
    ref_idx, ref_info = ref.sample(storage, 4000)
    # IS weight of each index TorchRL drew, computed by our sampler's formula and state
    leaves = ours.sampler.core.state.leaves.view(-1)
    ours_w = (leaves[torch.as_tensor(ref_idx)] / ours.sampler.core.state.block_min.min()).double() ** -0.5
    np.testing.assert_allclose(np.asarray(ref_info["priority_weight"], dtype=np.float64), ours_w.numpy(), rtol=1e-5)
    # TorchRL's empirical distribution agrees with our exact P(i)
    counts = np.bincount(np.asarray(ref_idx), minlength=16)
    assert chi_square_p(counts, ours.sampler.probabilities().numpy()) > SIGNIFICANCE
