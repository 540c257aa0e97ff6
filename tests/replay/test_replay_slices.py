"""Slice samplers against TorchRL's SliceSampler / PrioritizedSliceSampler and an independent NumPy model.

The model (``model_probabilities``) writes TorchRL's documented rules out slot by slot: trajectories end at a
stored done flag, at the write head (the last written slot) and at the last filled slot; a start is valid
when the slice of T slots from it meets no end before its last slot, or (``strict_length=False``) when it is a
trajectory's first slot; the uniform rule draws a trajectory, then one of its valid starts; the prioritized
rule draws a valid start with probability proportional to ``(p + eps)^alpha``.

Chi-square goodness-of-fit tests of start points (our draws AND TorchRL's draws against the same model, so
both equal it): significance 1e-3, and the number of slices drawn gives power >= 0.99 against Cohen's effect
size w = 0.1 (``draws_for_power``, noncentral chi-square, as in test_replay_statistics.py). Seeds are fixed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import PrioritizedSampler, PrioritizedSliceSampler, SliceSampler

from lightning_per import GPUPrioritizedSliceSampler, GPUSliceSampler, make_replay_buffer

SIGNIFICANCE = 1e-3
EFFECT = 0.1
POWER = 0.99
ALPHA, EPS = 0.7, 1e-6


def draws_for_power(k: int) -> int:
    """Smallest n (in steps of 500) with power >= POWER at effect size EFFECT, df = k - 1."""
    crit = stats.chi2.ppf(1 - SIGNIFICANCE, k - 1)
    n = 500
    while stats.ncx2.sf(crit, k - 1, n * EFFECT**2) < POWER:
        n += 500
    return n


def chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    mask = probs > 0
    assert counts[~mask].sum() == 0, f"a zero-probability start was drawn: {np.nonzero(counts * ~mask)[0]}"
    return stats.chisquare(counts[mask], counts.sum() * probs[mask]).pvalue


# ---------------------------------------------------------------------------------------------- the model
def episodes(lengths: list[int]) -> np.ndarray:
    """Done flags of consecutive episodes of the given lengths."""
    done = np.zeros(sum(lengths), dtype=bool)
    done[np.cumsum(lengths) - 1] = True
    return done


def ring_after(done_stream: np.ndarray, capacity: int) -> tuple[np.ndarray, int, int]:
    """``(done per slot, filled, last written slot)`` after writing ``done_stream`` round-robin."""
    slots = np.zeros(capacity, dtype=bool)
    for t, d in enumerate(done_stream):
        slots[t % capacity] = d
    n = len(done_stream)
    return slots, min(n, capacity), (n - 1) % capacity


def model_probabilities(done, filled, last, T, strict, raw=None):
    """Exact P(start = s) of TorchRL's rule (module docstring), ``(capacity,)`` float64."""
    N = len(done)
    end = np.array([bool(done[i]) or i >= filled or i == last for i in range(N)])
    valid = np.zeros(N, dtype=bool)
    first = np.zeros(N, dtype=bool)
    for s in range(filled):
        first[s] = end[(s - 1) % N]
        fits = not any(end[(s + j) % N] for j in range(T - 1))
        valid[s] = fits or (not strict and first[s])
    if raw is not None:
        v = (np.asarray(raw, dtype=np.float32).astype(np.float64) + EPS) ** ALPHA * valid
        return v / v.sum() if valid.any() else v
    p = np.zeros(N)
    heads = [s for s in range(filled) if first[s] and valid[s]]
    for s in heads:
        members, j = [], s
        while True:
            members.append(j)
            if end[j]:
                break
            j = (j + 1) % N
        ok = [m for m in members if valid[m]]
        for m in ok:
            p[m] += 1.0 / (len(heads) * len(ok))
    return p


# ---------------------------------------------------------------------------------------------- helpers
def transitions(done: np.ndarray) -> TensorDict:
    n = len(done)
    return TensorDict({"obs": torch.arange(n, dtype=torch.float32),
                       ("next", "done"): torch.as_tensor(done).reshape(n, 1),
                       ("next", "terminated"): torch.as_tensor(done).reshape(n, 1)}, [n])


def slice_starts(index: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """First slot of each slice of a flat batch whose slices end where ``truncated`` is True."""
    last = torch.nonzero(truncated.reshape(-1)).flatten()
    first = torch.cat([torch.zeros(1, dtype=torch.long), last[:-1] + 1])
    return index.reshape(-1)[first]


def count_starts(sample, capacity: int, n_slices: int, num_per_call: int, T: int, padded: bool) -> np.ndarray:
    """Start counts of ``n_slices`` slices; ``padded``: every slice fills T steps (strict_length=True, or
    pad_output=True), else slices end where ``truncated`` is set (strict_length=False: shorter slices)."""
    counts = np.zeros(capacity, dtype=np.int64)
    drawn = 0
    while drawn < n_slices:
        index, info = sample(num_per_call * T)
        index = index[0] if isinstance(index, tuple) else index
        starts = (index.reshape(-1, T)[:, 0] if padded else slice_starts(index, info[("next", "truncated")]))
        counts += np.bincount(starts.numpy(), minlength=capacity)
        drawn += starts.numel()
    return counts


def torchrl_sampler(prioritized: bool, capacity: int, T: int, strict: bool, stream: np.ndarray, raw=None):
    if prioritized:
        sampler = PrioritizedSliceSampler(capacity, ALPHA, 0.5, EPS, slice_len=T, strict_length=strict,
                                          end_key=("next", "done"))
    else:
        sampler = SliceSampler(slice_len=T, strict_length=strict, end_key=("next", "done"))
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler, batch_size=T * 8)
    rb.extend(transitions(stream))
    if raw is not None:
        rb.update_priority(torch.arange(capacity)[: len(rb)], torch.as_tensor(raw[: len(rb)], dtype=torch.float32))
    return rb


def ours(prioritized: bool, capacity: int, T: int, strict: bool, stream: np.ndarray, raw=None, chunks=(None,),
         **kw):
    kind = "prioritized_slice" if prioritized else "slice"
    extra = dict(alpha=ALPHA, beta=0.5, eps=EPS) if prioritized else {}
    rb = make_replay_buffer(capacity, T * 8, sampler=kind, device="cpu", slice_len=T, strict_length=strict,
                            generator=torch.Generator().manual_seed(7), **extra, **kw)
    data = transitions(stream)
    pos = 0
    sizes = [len(stream)] if chunks == (None,) else list(chunks)
    for size in sizes:
        rb.extend(data[pos:pos + size])
        pos += size
    assert pos == len(stream)
    if raw is not None:
        rb.update_priority(torch.arange(len(rb)), torch.as_tensor(raw[: len(rb)], dtype=torch.float32))
    return rb


# Scenarios: mixed lengths in a ring that is not full, and a wrapped ring (a trajectory across the wrap,
# the write head inside a trajectory, the oldest trajectory cut by the overwrite).
SCENARIOS = {
    "mixed": (40, episodes([3, 9, 5, 1, 12, 2, 6])),            # 38 of 40 slots
    "wrapped": (32, episodes([7, 4, 11, 2, 9, 5, 8])[:-3]),      # 43 written into 32 slots, head mid-episode
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("prioritized", [False, True])
def test_exact_start_probabilities(scenario, strict, prioritized):
    """Our exact start probabilities equal the model's (itself checked against TorchRL's draws below)."""
    capacity, stream = SCENARIOS[scenario]
    T = 4
    done, filled, last = ring_after(stream, capacity)
    raw = np.random.default_rng(0).uniform(0.1, 3.0, capacity) if prioritized else None
    rb = ours(prioritized, capacity, T, strict, stream, raw)
    rb.sample()  # the start mask is built for T at the first draw
    want = model_probabilities(done, filled, last, T, strict, raw)
    got = rb._sampler.probabilities()[:capacity].double().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("prioritized", [False, pytest.param(True, marks=pytest.mark.torchrl_tree)])
def test_start_distribution_parity_with_torchrl(scenario, strict, prioritized):
    """Chi-square: our slice starts and TorchRL's follow the same exact distribution (module docstring)."""
    capacity, stream = SCENARIOS[scenario]
    T = 4
    done, filled, last = ring_after(stream, capacity)
    raw = np.random.default_rng(1).uniform(0.1, 3.0, capacity) if prioritized else None
    probs = model_probabilities(done, filled, last, T, strict, raw)
    k = int((probs > 0).sum())
    n = draws_for_power(k)
    torch.manual_seed(0)
    theirs = torchrl_sampler(prioritized, capacity, T, strict, stream, raw)
    counts_theirs = count_starts(lambda b: theirs._sampler.sample(theirs._storage, b), capacity, n, 64, T,
                                 padded=False)
    mine = ours(prioritized, capacity, T, strict, stream, raw)
    counts_mine = count_starts(lambda b: mine._sampler.sample(mine._storage, b), capacity, n, 64, T,
                               padded=strict)  # strict_length=False: TorchRL's shorter slices, as theirs
    assert chi_square_p(counts_theirs, probs) > SIGNIFICANCE
    assert chi_square_p(counts_mine, probs) > SIGNIFICANCE


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("prioritized", [False, True])
def test_incremental_state_equals_one_write(strict, prioritized):
    """Extends of many sizes (wrapping the ring several times) leave the same start probabilities as the
    model of the final ring, after every extend."""
    capacity, T = 29, 5
    stream = episodes(list(np.random.default_rng(2).integers(1, 12, 30)))[:131]
    sizes = [1, 3, 7, 2, 30, 1, 1, 13, 5, 29, 8, 31]
    sizes.append(len(stream) - sum(sizes))
    kind = "prioritized_slice" if prioritized else "slice"
    extra = dict(alpha=ALPHA, beta=0.5, eps=EPS) if prioritized else {}
    rb = make_replay_buffer(capacity, T * 2, sampler=kind, device="cpu", slice_len=T, strict_length=strict, **extra)
    data, pos = transitions(stream), 0
    for size in sizes:
        rb.extend(data[pos:pos + size])
        pos += size
        done, filled, last = ring_after(stream[:pos], capacity)
        want = model_probabilities(done, filled, last, T, strict, np.ones(capacity) if prioritized else None)
        if not want.sum() > 0:  # no valid start yet (nothing to compare: all zero)
            continue
        got = rb._sampler.probabilities()[:capacity].double().numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-12, err_msg=f"after {pos} transitions")


def test_update_priority_per_transition_and_max_rule():
    """'start' (TorchRL's): a start's own priority; 'max': the largest raw priority of its slice's members.
    A high priority on a slot that cannot start a slice moves no mass under 'start' and raises the starts
    whose slices hold it under 'max'."""
    capacity, T = 16, 3
    stream = episodes([6, 10])
    raw = np.full(capacity, 1.0)
    raw[5] = 50.0  # the last slot of the first trajectory: never a start
    for rule in ("start", "max"):
        rb = ours(True, capacity, T, True, stream, slice_priority=rule)
        rb.update_priority(torch.arange(16), torch.as_tensor(raw, dtype=torch.float32))
        rb.sample()
        got = rb._sampler.probabilities()[:capacity].double().numpy()
        valid = np.array([s <= 3 or 6 <= s <= 13 for s in range(capacity)])
        if rule == "start":
            value = raw
        else:
            value = np.array([raw[s:s + T].max() if valid[s] else 0.0 for s in range(capacity)])
        want = (value.astype(np.float32).astype(np.float64) + EPS) ** ALPHA * valid
        np.testing.assert_allclose(got, want / want.sum(), rtol=1e-5)


def test_is_weights_over_valid_starts():
    """w = (v_s / min over valid starts v)^-beta on each of the slice's T steps (PER section 3.4)."""
    capacity, T = 12, 3
    rb = ours(True, capacity, T, True, episodes([5, 7]))
    raw = torch.arange(1, 13, dtype=torch.float32)
    rb.update_priority(torch.arange(12), raw)
    batch = rb.sample()
    v = (raw.double() + EPS) ** ALPHA
    valid = torch.tensor([s <= 2 or 5 <= s <= 9 for s in range(12)])
    start = batch["index"].reshape(-1, T)[:, 0]
    want = (v[start] / v[valid].min()) ** -0.5
    torch.testing.assert_close(batch["priority_weight"].reshape(-1, T),
                               want[:, None].expand(-1, T).float(), rtol=1e-5, atol=0)


def test_batch_markers_strict_false():
    """pad_output=True: short slices are padded by their last slot; truncated marks each slice's last real step,
    the mask its real steps, is_init its first step (OR-ed with the stored flag), done = stored done | truncated."""
    stream = episodes([2, 9])
    n = len(stream)
    data = transitions(stream)
    data["is_init"] = torch.zeros(n, 1, dtype=torch.bool)
    data["is_init"][[0, 2]] = True
    rb = make_replay_buffer(16, 5 * 64, sampler="slice", device="cpu", slice_len=5, strict_length=False,
                            pad_output=True)
    rb.extend(data)
    batch = rb.sample()
    obs = batch["obs"].reshape(-1, 5)
    for row, trunc, mask, init, done in zip(obs, batch["next", "truncated"].reshape(-1, 5),
                                            batch["collector", "mask"].reshape(-1, 5),
                                            batch["is_init"].reshape(-1, 5), batch["next", "done"].reshape(-1, 5)):
        start = int(row[0])
        length = 2 if start == 0 else 5
        assert start in (0, 2, 3, 4, 5, 6)
        assert row.tolist() == [start + min(j, length - 1) for j in range(5)]
        assert mask.tolist() == [j < length for j in range(5)]
        assert trunc.tolist() == [j == length - 1 for j in range(5)]
        slots = [int(v) for v in row]  # padding steps repeat the last real slot, with its stored flags
        assert init.tolist() == [j == 0 or slots[j] in (0, 2) for j in range(5)]
        assert done.tolist() == [j == length - 1 or bool(stream[slots[j]]) for j in range(5)]


def test_torchrl_classes_and_update_tensordict_priority():
    rb = make_replay_buffer(32, 8, sampler="prioritized_slice", device="cpu", slice_len=4)
    assert isinstance(rb._sampler, PrioritizedSliceSampler) and isinstance(rb._sampler, PrioritizedSampler)
    assert isinstance(make_replay_buffer(32, 8, sampler="slice", device="cpu", slice_len=4)._sampler, SliceSampler)
    rb.extend(transitions(episodes([10, 10])))
    batch = rb.sample()
    batch["td_error"] = torch.full((8,), 5.0)
    rb.update_tensordict_priority(batch)
    raw = rb._sampler.core.state.raw[batch["index"]]
    assert torch.equal(raw, torch.full((8,), 5.0))


def test_traj_key_and_auto_detection():
    """A trajectory id ends a trajectory where it changes; with no key given, TorchRL's probe finds
    ("collector", "traj_ids") before the done flag."""
    ids = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1, 2, 2])
    data = TensorDict({"obs": torch.arange(10.), ("collector", "traj_ids"): ids,
                       ("next", "done"): torch.zeros(10, 1, dtype=torch.bool)}, [10])
    for kw in ({"traj_key": ("collector", "traj_ids")}, {}):
        rb = make_replay_buffer(12, 6, sampler="slice", device="cpu", slice_len=3, **kw)
        rb.extend(data)
        rb.sample()
        done, filled, last = ring_after(episodes([3, 5, 2]), 12)
        want = model_probabilities(done, filled, last, 3, True)
        np.testing.assert_allclose(rb._sampler.probabilities()[:12].numpy(), want, rtol=1e-6)


# ---------------------------------------------------------------------------------------------- bad input
def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="slice_len"):
        GPUSliceSampler(10, slice_len=0, device="cpu")
    with pytest.raises(ValueError, match="num_slices and slice_len"):
        GPUPrioritizedSliceSampler(10, 0.6, 0.4, device="cpu")
    with pytest.raises(ValueError, match="num_slices"):
        make_replay_buffer(10, 10, sampler="slice", device="cpu", num_slices=3)
    with pytest.raises(ValueError, match="slice_len"):
        make_replay_buffer(10, 10, sampler="prioritized_slice", device="cpu", slice_len=3)
    with pytest.raises(ValueError, match="slice_priority"):
        GPUPrioritizedSliceSampler(10, 0.6, 0.4, slice_len=2, slice_priority="mean", device="cpu")
    rb = make_replay_buffer(10, 4, sampler="slice", device="cpu", slice_len=2)
    rb.extend(transitions(episodes([5])))
    with pytest.raises(ValueError, match="slice_len"):
        rb.sample(5)


@pytest.mark.parametrize("kind", ["slice", "prioritized_slice"])
def test_missing_end_key_changes_nothing(kind):
    rb = make_replay_buffer(10, 4, sampler=kind, device="cpu", slice_len=2)
    with pytest.raises(KeyError, match="end_key"):
        rb.extend(TensorDict({"obs": torch.arange(4.)}, [4]))
    assert len(rb) == 0
    rb.extend(transitions(episodes([4])))
    with pytest.raises(KeyError, match="end_key"):
        rb.extend(TensorDict({"obs": torch.arange(4.)}, [4]))
    assert len(rb) == 4


@pytest.mark.parametrize("kind", ["slice", "prioritized_slice"])
def test_no_valid_slice_is_named_and_changes_nothing(kind):
    rb = make_replay_buffer(20, 8, sampler=kind, device="cpu", slice_len=4)
    rb.extend(transitions(episodes([2, 3, 1])))
    before = rb._sampler.state_dict()
    with pytest.raises(ValueError, match="no valid slice.*strict_length"):
        rb.sample()
    assert len(rb) == 6
    after = rb._sampler.state_dict()
    for key in ("raw_end", "traj_ids"):
        assert torch.equal(before[key], after[key])
    rb.extend(transitions(episodes([5])))  # a long enough trajectory: draws work
    starts = rb.sample()["index"].reshape(-1, 4)[:, 0]
    assert ((starts == 6) | (starts == 7)).all()  # the valid starts: slots 6, 7 (5 slots from 6)


@pytest.mark.parametrize("kind", ["slice", "prioritized_slice"])
def test_state_dict_round_trip(kind, tmp_path):
    rb = ours(kind == "prioritized_slice", 24, 3, True, episodes([5, 8, 6, 9]))
    if kind == "prioritized_slice":
        rb.update_priority(torch.arange(24), torch.rand(24) + 0.1)
    rb.sample()
    state = rb.state_dict()
    fresh = ours(kind == "prioritized_slice", 24, 3, True, episodes([4]))
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh._sampler.probabilities(), rb._sampler.probabilities())
    rb.dumps(tmp_path / "rb")
    again = ours(kind == "prioritized_slice", 24, 3, True, episodes([4]))
    again.loads(tmp_path / "rb")
    torch.testing.assert_close(again._sampler.probabilities(), rb._sampler.probabilities())


def test_priority_of_a_slot_that_cannot_start_yet_is_kept():
    """A slot whose slice would cross the write head holds no mass but keeps its raw priority: once its
    trajectory grows past it, it starts slices with that priority."""
    rb = ours(True, 16, 4, True, np.zeros(5, dtype=bool))  # an episode in progress: slots 0..4
    rb.update_priority(torch.arange(5), torch.tensor([1.0, 1.0, 1.0, 9.0, 1.0]))
    rb.sample()
    p = rb._sampler.probabilities()[:16].double().numpy()
    assert p[3] == 0 and p[:2].sum() == pytest.approx(1.0)  # starts 0, 1 only (slices of 4 before the head)
    rb.extend(transitions(episodes([3])))  # the episode goes on to slot 7 and ends there
    p = rb._sampler.probabilities()[:16].double().numpy()
    v = (np.array([1.0, 1.0, 1.0, 9.0, 1.0], dtype=np.float32).astype(np.float64) + EPS) ** ALPHA
    np.testing.assert_allclose(p[:5], v / v.sum(), rtol=1e-6)  # starts 0..4 of the 8-step episode
