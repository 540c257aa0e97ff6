"""The serial layout a CPU sampler takes by default (small blocks, an O(B) last-writer write, strata permutations
ranked by a sort) against the parallel layout of a CUDA sampler: the same draws, weights, writes and checkpoints.

Costs about 5 s on two cores (the checkpoint test fills a million slots twice).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_per import GPUPrioritizedSampler, GPURankBasedSampler
from lightning_per.ops import reference
from lightning_per.replay.rules import RANK_PERMUTATION_MAX, random_permutation


def test_a_cpu_sampler_takes_the_serial_layout():
    s = GPUPrioritizedSampler(1_000_000, 0.6, 0.4, device="cpu", backend="reference")
    assert s.core.serial and s.core.block == 64 and s.core.state.leaves.shape == (15626, 64)
    assert repr(s).endswith("block=64, serial=True)")
    p = GPUPrioritizedSampler(1_000_000, 0.6, 0.4, device="cpu", backend="reference", serial=False)
    assert not p.core.serial and p.core.block == 1024 and p.core.state.scratch is None
    r = GPURankBasedSampler(1000, 0.6, 0.4, device="cpu", backend="reference")
    assert r.core.serial and r.core.block == reference.block_size_for(1001, serial=True) == 2


def test_block_size_for_balances_the_serial_step():
    # serial: the power of two at or above sqrt(capacity / 256); parallel: at or above sqrt(capacity)
    for capacity in (1, 7, 256, 257, 5000, 1 << 20, 10**7):
        serial, parallel = reference.block_size_for(capacity, True), reference.block_size_for(capacity)
        assert serial >= 1 and serial & (serial - 1) == 0 and parallel & (parallel - 1) == 0
        assert serial >= np.sqrt(capacity / 256) and (serial == 1 or serial / 2 < np.sqrt(capacity / 256))
        assert parallel >= np.sqrt(capacity) and (parallel == 1 or parallel / 2 < np.sqrt(capacity))


@pytest.mark.parametrize("serial", ["yes", 1])
def test_serial_must_be_a_bool(serial):
    with pytest.raises(TypeError, match="serial"):
        GPUPrioritizedSampler(10, 0.6, 0.4, device="cpu", serial=serial)


@pytest.mark.parametrize("b", [1, 2, 5, 256, RANK_PERMUTATION_MAX, RANK_PERMUTATION_MAX + 1])
def test_serial_permutation_is_the_comparison_ranks(b):
    keys = torch.rand(b, generator=torch.Generator().manual_seed(b), dtype=torch.float64)
    want = random_permutation(keys)  # the parallel layout's (B, B) comparison (argsort beyond its size)
    assert torch.equal(random_permutation(keys, serial=True), want)
    if b <= RANK_PERMUTATION_MAX:  # the ranks: how many keys lie below each one (NumPy's count)
        k = keys.numpy()
        assert torch.equal(want, torch.from_numpy((k[None, :] < k[:, None]).sum(1)))


def test_two_level_search_is_the_same_under_both_layouts():
    """Integer stored values (exact sums in float64): every block size returns the slot NumPy's inverse CDF gives
    for each target, with the same stored value."""
    g = torch.Generator().manual_seed(0)
    flat = torch.randint(0, 5, (4096,), generator=g).float()  # zeros: empty slots, never drawn
    u = torch.rand(512, generator=g, dtype=torch.float64)
    cdf = np.cumsum(flat.double().numpy())
    want = np.searchsorted(cdf, u.numpy() * cdf[-1] * (1.0 - 2.0**-40), side="right")
    for block in (1, 4, 16, 64, 1024):
        leaves = flat.view(-1, block)
        s, _ = reference.reduce_blocks(leaves)
        index, value = reference.two_level_search_with_values(leaves, s, u)
        assert np.array_equal(index.numpy(), want), block
        assert torch.equal(value, flat[index]) and bool((value > 0).all())


def test_serial_write_keeps_the_last_value_of_a_repeated_slot_and_leaves_its_scratch():
    """Clashing values at repeated slots, out-of-range slots and invalid priorities, written by both layouts:
    the same raw and stored values, sums, minima and counters (the parallel write sorts, the serial one uses its
    last-writer buffer and leaves it at -1)."""
    out = {}
    for serial in (False, True):
        g = torch.Generator().manual_seed(1)
        s = GPUPrioritizedSampler(33, 0.7, 0.5, device="cpu", backend="reference", serial=serial)
        s.core.write(torch.arange(33), torch.rand(33, generator=torch.Generator().manual_seed(2)) + 0.1, 33)
        for _ in range(20):
            index = torch.randint(-3, 36, (40,), generator=g)  # repeats and slots outside [0, 33)
            prio = torch.rand(40, generator=g) * 4
            prio[::9] = torch.tensor([float("nan"), float("inf"), -1.0, float("-inf"), 2.0])[: len(prio[::9])]
            s.core.write(index, prio, 33)
        st = s.core.state
        if serial:
            assert bool((st.scratch.last_writer == -1).all())
        flat = st.leaves.view(-1)
        out[serial] = (st.raw[:33], flat[:33], flat[33:].count_nonzero(), st.block_min.min(), st.block_sum.sum(),
                       st.max_raw, st.n_clamped, st.n_dropped)
    for a, b in zip(out[False], out[True]):
        torch.testing.assert_close(a, b, rtol=1e-12 if a.dtype == torch.float64 else 0, atol=0)
    # a NumPy model of the rule, one write at a time in batch order (so the last one wins): NaN and +inf take the
    # running max, negatives and -inf 0, slots outside [0, 33) are dropped
    g = torch.Generator().manual_seed(1)
    raw = (torch.rand(33, generator=torch.Generator().manual_seed(2)) + 0.1).numpy().astype(np.float32)
    running = raw.max()
    for _ in range(20):
        index = torch.randint(-3, 36, (40,), generator=g).numpy()
        prio = (torch.rand(40, generator=g) * 4).numpy()
        prio[::9] = np.array([np.nan, np.inf, -1.0, -np.inf, 2.0], dtype=np.float32)[: len(prio[::9])]
        clean = np.where(prio < np.inf, np.maximum(prio, 0), running).astype(np.float32)
        ok = (index >= 0) & (index < 33)
        for i, c in zip(index[ok], clean[ok]):
            raw[i] = c
        running = max(running, clean[ok].max())
    assert np.array_equal(out[True][0].numpy(), raw) and float(out[True][5]) == running


def _written(serial: bool, capacity: int, seed: int) -> GPUPrioritizedSampler:
    s = GPUPrioritizedSampler(capacity, 0.6, 0.4, device="cpu", backend="reference", serial=serial, seed=seed)
    g = torch.Generator().manual_seed(seed)
    s.core.write(torch.arange(capacity - 5), torch.rand(capacity - 5, generator=g) * 3, capacity)
    return s


@pytest.mark.parametrize("saved_serial", [False, True])
def test_checkpoint_loads_across_layouts(saved_serial):
    """A checkpoint of a million-slot sampler with blocks of 1024 (a GPU's layout) loads into a CPU sampler (blocks
    of 64) and back: the same raw priorities, the same P(i) (block sums regrouped: float64 rounding only), the same
    counters; the 5 unwritten slots stay unwritten."""
    n = 1_000_000
    saved = _written(saved_serial, n, 3)
    target = GPUPrioritizedSampler(n, 0.1, 0.9, device="cpu", backend="reference", serial=not saved_serial)
    assert saved.core.block != target.core.block
    target.load_state_dict(saved.state_dict())
    a, b = saved.core.state, target.core.state
    assert torch.equal(a.raw[:n], b.raw[:n]) and not bool(b.raw[n:].any())
    assert torch.equal(a.leaves.view(-1)[:n], b.leaves.view(-1)[:n]) and not bool(b.leaves.view(-1)[n:].any())
    torch.testing.assert_close(saved.core.probabilities(), target.core.probabilities(), rtol=1e-12, atol=0)
    assert (target.core.alpha, target.core.beta) == (0.6, 0.4) and torch.equal(a.max_raw, b.max_raw)


def test_checkpoint_of_another_layout_is_checked():
    saved = _written(False, 100, 4).state_dict()
    target = GPUPrioritizedSampler(100, 0.6, 0.4, device="cpu", backend="reference", serial=True)
    before = target.core.state.raw.clone()
    bad = dict(saved, written=saved["written"].clone())
    bad["written"][100] = True  # the trash slot marked written
    with pytest.raises(ValueError, match="past max_capacity 100"):
        target.load_state_dict(bad)
    with pytest.raises(ValueError, match="more than max_capacity 100"):
        target.load_state_dict(dict(saved, raw=saved["raw"][:100], written=saved["written"][:100]))
    with pytest.raises(ValueError, match="'written' must be a 1-d tensor"):
        target.load_state_dict(dict(saved, written=saved["written"][:101]))
    assert torch.equal(target.core.state.raw, before)  # nothing changed


def test_serial_draws_match_the_exact_probabilities():
    """A serial sampler's draws over integer priorities: the slots the parallel layout draws from the same
    uniforms, and IS weights (p_i / p_min)^-beta of the stored values (TorchRL's closed form)."""
    g = torch.Generator().manual_seed(5)
    raw = torch.randint(1, 9, (3000,), generator=g).float()
    draws = {}
    for serial in (False, True):
        s = GPUPrioritizedSampler(3000, 1.0, 0.5, eps=2.0**-20, device="cpu", backend="reference", serial=serial,
                                  seed=7, shuffle_strata=False)
        s.core.write(torch.arange(3000), raw, 3000)
        index, w = s.core.sample(256, 3000)
        stored = (raw.double() + 2.0**-20).float()
        torch.testing.assert_close(w, (stored[index] / stored.min()).pow(-0.5), rtol=1e-6, atol=0)
        draws[serial] = index
    assert torch.equal(draws[False], draws[True])
