"""The slice samplers in TorchRL's layouts and with TorchRL's keywords, against TorchRL's own SliceSampler /
PrioritizedSliceSampler on the same data, and against an independent model of TorchRL's documented rules
(``support``: the start points a slice of T steps may have, per column of a ``[time, envs]`` storage).

Set comparisons draw with fixed seeds, enough slices that every start of the model's support is expected at least
20 times (a miss has probability below e^-20 for every start, so the sets are compared exactly).
"""

from __future__ import annotations

import importlib.metadata
import warnings

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import (
    LazyTensorStorage,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    SliceSampler,
    TensorDictReplayBuffer,
)

from lightning_per import GPUPrioritizedSliceSampler, GPUSliceSampler, GPUTensorStorage, make_replay_buffer
from lightning_per.replay import (
    GPUPrioritizedSampler,
    GPURandomSampler,
    GPURankBasedSampler,
    GPUSamplerWithoutReplacement,
    compat,
)

pytestmark = pytest.mark.skipif(
    tuple(int(p) for p in importlib.metadata.version("torchrl").split(".")[:2]) < (0, 14),
    reason="checks behaviour against TorchRL >= 0.14's own classes (features older TorchRL lacks)")

ALPHA, BETA = 0.7, 0.5


def support(done: np.ndarray, T: int, strict: bool, need: int | None = None) -> set[tuple[int, int]]:
    """``(time, env)`` start points of TorchRL's rule over a full ``[time, envs]`` storage written at once (the
    last row is the write head): a start holds ``need`` (default ``T``) steps before its trajectory's end, or, with
    ``strict=False``, is a trajectory's first step."""
    rows, envs = done.shape
    need = T if need is None else need
    out = set()
    for e in range(envs):
        end = done[:, e].copy()
        end[rows - 1] = True
        for t in range(rows):
            first = t == 0 or end[t - 1]
            fits = not any(end[t + j] for j in range(need - 1) if t + j < rows) and t + need - 1 < rows
            if fits or (not strict and first):
                out.add((t, e))
    return out


def starts_of(sample, draws: int) -> set[tuple[int, int]]:
    """Start points ``(time, env)`` of ``draws`` batches (slices end where ``("next", "truncated")`` is set)."""
    seen = set()
    for _ in range(draws):
        index, info = sample()
        if isinstance(index, tuple) and len(index) == 1:  # TorchRL's index on a 1-D storage: a 1-tuple
            index = index[0]
        if not isinstance(index, tuple):
            index = (index, torch.zeros_like(index))
        last = info[("next", "truncated")].reshape(-1)
        first = torch.cat([torch.ones(1, dtype=torch.bool), last[:-1]])
        seen |= set(zip(index[0][first].tolist(), index[1][first].tolist()))
    return seen


def slices_of(rb, draws: int) -> set[tuple[int, ...]]:
    """The slices (their ``obs``) of ``draws`` batches of a buffer."""
    out = set()
    for _ in range(draws):
        batch = rb.sample()
        cur = []
        for obs, last in zip(batch["obs"].tolist(), batch["next", "truncated"].reshape(-1).tolist()):
            cur.append(obs)
            if last:
                out.add(tuple(cur))
                cur = []
    return out


def _buffer(sampler, storage, data, batch_size):
    rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=batch_size)
    rb.extend(data)
    return rb


# --------------------------------------------------------------------------------------- 2-D storages
@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("prioritized", [False, True])
def test_2d_storage_slices_are_torchrls(prioritized, strict):
    """The issue's repro: ``[envs, time]`` batches into ``GPUTensorStorage(100, ndim=2)`` (stored ``[time, envs]``);
    the same start points as TorchRL's sampler on TorchRL's storage, and as the model; index as (time, env)."""
    torch.manual_seed(0)
    done = torch.rand(100, 1) < 0.15
    data = TensorDict({"obs": torch.arange(100), ("next", "done"): done}, [100]).reshape(4, 25)
    kw = dict(slice_len=5, end_key=("next", "done"), strict_length=strict)
    if prioritized:
        theirs = PrioritizedSliceSampler(100, 1.0, 1.0, **kw)
        mine = GPUPrioritizedSliceSampler(100, 1.0, 1.0, device="cpu", seed=0, **kw)
    else:
        theirs, mine = SliceSampler(**kw), GPUSliceSampler(100, device="cpu", seed=0, **kw)
    rb_theirs = _buffer(theirs, LazyTensorStorage(100, ndim=2), data, 20)
    rb_mine = _buffer(mine, GPUTensorStorage(100, ndim=2, device="cpu"), data, 20)
    assert rb_mine.storage.shape == rb_theirs.storage.shape == (25, 4)
    want = support(data["next", "done"].reshape(4, 25).T.numpy(), 5, strict)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TorchRL's numpy call
        got_theirs = starts_of(lambda: theirs.sample(rb_theirs.storage, 40), 1000)
    got_mine = starts_of(lambda: mine.sample(rb_mine.storage, 40), 1000)
    assert got_theirs == want
    assert got_mine == want
    batch = rb_mine.sample()
    assert batch["index"].shape[1] == 2 and len(batch) <= 20  # TorchRL's stacked (time, env) index
    obs = batch["obs"]
    stored = rb_mine.storage[:]["obs"]
    assert torch.equal(obs, stored[batch["index"][:, 0], batch["index"][:, 1]])


def test_2d_exact_probabilities_follow_the_columns():
    """Uniform rule on a 2-D storage: P(s) = 1 / (K n_k), trajectories per column (model, module docstring)."""
    done = torch.zeros(12, 3, 1, dtype=torch.bool)
    done[[3, 7], 0] = True
    done[[1], 1] = True
    data = TensorDict({"obs": torch.arange(36).reshape(3, 12), ("next", "done"): done.transpose(0, 1)}, [3, 12])
    sampler = GPUSliceSampler(slice_len=3, device="cpu")
    rb = _buffer(sampler, GPUTensorStorage(36, ndim=2, device="cpu"), data, 6)
    rb.sample()
    end = done[..., 0].numpy().copy()
    end[-1] = True  # the write head's row
    p = np.zeros((12, 3))
    trajs = []
    for e in range(3):
        t = 0
        while t < 12:
            u = t
            while not end[u, e]:
                u += 1
            if u - t + 1 >= 3:
                trajs.append([(s, e) for s in range(t, u - 1)])
            t = u + 1
    for traj in trajs:
        for s, e in traj:
            p[s, e] += 1 / (len(trajs) * len(traj))
    np.testing.assert_allclose(sampler.probabilities().numpy(), p.reshape(-1), atol=1e-12)


def _trajectories_of_5_to_25_steps() -> TensorDict:
    """Two columns of the same 5 trajectories (5, 10, ..., 25 steps): 150 items as ``[envs=2, time=75]``."""
    done = torch.zeros(75, 1, dtype=torch.bool)
    done[torch.tensor([5, 15, 30, 50, 75]) - 1] = True
    one = TensorDict({"done": done, "obs": torch.arange(75)}, [75])
    data = torch.stack([one, one.clone()])
    data["obs"] = torch.arange(150).reshape(2, 75)
    return data


@pytest.mark.parametrize("prioritized", [False, True])
def test_2d_storage_rounding_the_capacity_up_is_accepted_as_torchrls(prioritized):
    """``max_size=149`` on a ``ndim=2`` storage of rows of 2 holds 150 slots (TorchRL's rounding up to whole rows);
    TorchRL's samplers built with 149 serve all of them, and so do ours: the same set of slices as TorchRL's
    sampler on TorchRL's storage (68 slices of 10 steps; 600 batches of 5 slices expect each >= 23 times), slot
    149 among them, and priorities writable at every slot."""
    data = _trajectories_of_5_to_25_steps()
    kw = dict(end_key="done", slice_len=10)
    if prioritized:
        theirs = PrioritizedSliceSampler(149, 1.0, 1.0, **kw)
        mine = GPUPrioritizedSliceSampler(149, 1.0, 1.0, device="cpu", seed=0, **kw)
    else:
        theirs, mine = SliceSampler(**kw), GPUSliceSampler(149, device="cpu", seed=0, **kw)
    rb_theirs = TensorDictReplayBuffer(storage=LazyTensorStorage(149, ndim=2), sampler=theirs, batch_size=50)
    rb_mine = TensorDictReplayBuffer(storage=GPUTensorStorage(149, ndim=2, device="cpu"), sampler=mine,
                                     batch_size=50)
    for rb in (rb_theirs, rb_mine):
        index = rb.extend(data)
        if prioritized:
            rb.update_priority(index, torch.ones(2, 75))
    assert rb_mine.storage.max_size == rb_theirs.storage.max_size == 150 and len(rb_mine) == 150
    assert mine.index.slots == 150
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TorchRL's numpy call
        got_theirs = slices_of(rb_theirs, 600)
    got_mine = slices_of(rb_mine, 600)
    assert len(got_theirs) == 68 and any(149 in s for s in got_theirs)
    assert got_mine == got_theirs


def test_2d_capacity_rounding_keeps_the_prioritized_streams_and_refuses_other_sizes():
    """The rebuilt core draws as a sampler built with the storage's 150 slots and the same seed; a capacity that
    does not round up to the storage's slots (140 against 150) is still refused, naming the storage's max_size."""
    data = _trajectories_of_5_to_25_steps()
    batches, built = [], []
    for capacity in (149, 150):
        sampler = GPUPrioritizedSliceSampler(capacity, 0.7, 0.5, end_key="done", slice_len=10, device="cpu", seed=4)
        rb = TensorDictReplayBuffer(storage=GPUTensorStorage(149, ndim=2, device="cpu"), sampler=sampler,
                                    batch_size=50)
        index = rb.extend(data)
        rb.update_priority(index, torch.arange(150.0).reshape(2, 75) + 1)
        assert sampler.max_size == 150
        batches.append([rb.sample() for _ in range(3)])
        built.append((sampler, rb))
    for a, b in zip(*batches):
        assert torch.equal(a["obs"], b["obs"]) and torch.equal(a["priority_weight"], b["priority_weight"])
    # a checkpoint of the rounded sampler loads into a fresh one built alike (nothing bound yet), drawing as it
    sampler, rb = built[0]  # the one built with 149
    fresh = GPUPrioritizedSliceSampler(149, 0.7, 0.5, end_key="done", slice_len=10, device="cpu", seed=9)
    fresh.load_state_dict(sampler.state_dict())
    assert fresh.max_size == 150
    index_a, info_a = sampler.sample(rb.storage, 50)
    index_b, info_b = fresh.sample(rb.storage, 50)
    assert all(torch.equal(x, y) for x, y in zip(index_a, index_b))
    assert torch.equal(info_a["priority_weight"], info_b["priority_weight"])
    for sampler in (GPUSliceSampler(140, end_key="done", slice_len=10, device="cpu"),
                    GPUPrioritizedSliceSampler(140, 1.0, 1.0, end_key="done", slice_len=10, device="cpu")):
        rb = TensorDictReplayBuffer(storage=GPUTensorStorage(149, ndim=2, device="cpu"), sampler=sampler,
                                    batch_size=50)
        with pytest.raises(ValueError, match=r"has 140 slots but the storage's max_size is 150"):
            rb.extend(data)


@pytest.mark.parametrize("key", ["end", "traj"])
def test_a_wide_trajectory_marker_is_refused_as_torchrls(key):
    """An end signal (or trajectory ids) of 5 values per item on a 1-D storage: TorchRL's SliceSampler raises
    RuntimeError "Expected the end-of-trajectory signal to be 1-dimensional" (TorchRL's test_samplers), and so do
    ours, naming the key; our buffer refuses the write before anything is stored."""
    done = torch.zeros(100, 1, dtype=torch.bool)
    done[torch.tensor([29, 54, 69])] = True
    data = TensorDict({"obs": torch.arange(100)}, [100])
    if key == "end":
        data["next", "done"] = done.unsqueeze(1).expand(100, 5, 1).clone()
        kw = dict(end_key=("next", "done"))
    else:
        data["episode"] = done.cumsum(0).expand(100, 5).clone()
        kw = dict(traj_key="episode")
    theirs_storage, mine_storage = LazyTensorStorage(100), GPUTensorStorage(100, device="cpu")
    theirs_storage.set(range(100), data)
    mine_storage.set(range(100), data)
    match = "Expected the end-of-trajectory signal to be 1-dimensional"
    samplers = [(SliceSampler(num_slices=10, **kw), theirs_storage),
                (GPUSliceSampler(num_slices=10, device="cpu", **kw), mine_storage),
                (GPUPrioritizedSliceSampler(100, 1.0, 1.0, num_slices=10, device="cpu", **kw), mine_storage)]
    for i, (sampler, storage) in enumerate(samplers):
        named = r".*'episode'" if key == "traj" else r".*\('next', 'done'\)"
        with pytest.raises(RuntimeError, match=match if i == 0 else match + named):  # ours name the key
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # TorchRL's numpy call
                sampler.sample(storage, batch_size=20)
    kind_kw = dict(alpha=ALPHA, beta=BETA, sampler="prioritized_slice")
    rb = make_replay_buffer(100, 20, device="cpu", num_slices=10, **kind_kw, **kw)
    with pytest.raises(RuntimeError, match=match):
        rb.extend(data)
    assert len(rb) == 0


# ------------------------------------------------------------------------------ TorchRL's constructor
def test_no_capacity_and_tuning_keywords_change_nothing():
    """``GPUSliceSampler(slice_len=4, traj_key="episode")`` takes N from the storage; cache_values / compile /
    use_gpu give the same draws as without them."""
    data = TensorDict({"episode": torch.arange(40) // 8, "obs": torch.arange(40)}, [40])
    out = []
    for kw in ({}, dict(cache_values=True, compile=True, use_gpu=False)):
        sampler = GPUSliceSampler(slice_len=4, traj_key="episode", device="cpu", seed=3, **kw)
        rb = _buffer(sampler, GPUTensorStorage(40, device="cpu"), data, 16)
        assert sampler.index.slots == 40
        out.append(torch.cat([rb.sample()["obs"] for _ in range(5)]))
        episode = rb.sample()["episode"].reshape(4, 4)
        assert bool((episode == episode[:, :1]).all())
    assert torch.equal(out[0], out[1])
    assert GPUSliceSampler(slice_len=4).cache_values is False and GPUSliceSampler(slice_len=4).span == (False, False)


def test_bad_keywords_are_named():
    with pytest.raises(ValueError, match="pad_output=True is incompatible with strict_length=True"):
        GPUSliceSampler(slice_len=4, pad_output=True)
    with pytest.raises(ValueError, match="ends and trajectories are exclusive"):
        GPUSliceSampler(slice_len=4, ends=torch.ones(4, dtype=torch.bool), trajectories=torch.zeros(4))
    with pytest.raises(ValueError, match="give no end_key"):
        GPUSliceSampler(slice_len=4, ends=torch.ones(4, dtype=torch.bool), end_key="done")
    with pytest.raises(TypeError, match="span must be"):
        GPUSliceSampler(slice_len=4, span="left")
    with pytest.raises(ValueError, match="fragmented=True"):
        GPUSliceSampler(slice_len=4, fragmented=True, span=True)
    with pytest.raises(ValueError, match="span's right int"):
        GPUSliceSampler(slice_len=4, span=(0, 4))
    sampler = GPUSliceSampler(num_slices=2, span=(0, 4), device="cpu")
    rb = _buffer(sampler, GPUTensorStorage(8, device="cpu"), TensorDict({"episode": torch.zeros(8)}, [8]), 8)
    with pytest.raises(ValueError, match="span's right int"):
        rb.sample()


# ----------------------------------------------------------------------- strict_length=False output
LENGTHS = [5, 9, 3, 12, 7, 20, 8]


@pytest.mark.parametrize("prioritized", [False, True])
def test_non_strict_start_points_are_torchrls(prioritized):
    """Trajectories of 5, 9, 3, 12, 7, 20, 8 steps in 64 slots, slice_len 4, strict_length=False: the same set of
    start points as TorchRL's over many draws (never the last step of the 3-step trajectory, slot 16)."""
    done = torch.zeros(64, 1, dtype=torch.bool)
    done[torch.tensor(np.cumsum(LENGTHS) - 1)] = True
    data = TensorDict({"obs": torch.arange(64), ("next", "done"): done}, [64])
    kw = dict(slice_len=4, strict_length=False, end_key=("next", "done"))
    if prioritized:
        theirs, mine = (PrioritizedSliceSampler(64, ALPHA, BETA, **kw),
                        GPUPrioritizedSliceSampler(64, ALPHA, BETA, device="cpu", seed=0, **kw))
    else:
        theirs, mine = SliceSampler(**kw), GPUSliceSampler(device="cpu", seed=0, **kw)
    torch.manual_seed(0)
    rb_theirs = _buffer(theirs, LazyTensorStorage(64), data, 32)
    rb_mine = _buffer(mine, GPUTensorStorage(64, device="cpu"), data, 32)
    want = support(done.reshape(64, 1).numpy(), 4, strict=False)
    got_theirs = starts_of(lambda: theirs.sample(rb_theirs.storage, 32), 400)
    got_mine = starts_of(lambda: mine.sample(rb_mine.storage, 32), 400)
    assert got_theirs == got_mine == want
    assert (16, 0) not in got_mine


@pytest.mark.parametrize("prioritized", [False, True])
def test_pad_output_false_returns_the_shorter_batch(prioritized):
    """3-step trajectories, slice_len 8, 4 slices: TorchRL returns 12 items, so do we; pad_output=True gives the
    static 32 with ("collector", "mask") on the 12 real steps."""
    data = TensorDict({"episode": torch.arange(30) // 3, "obs": torch.arange(30)}, [30])
    extra = dict(alpha=ALPHA, beta=BETA) if prioritized else {}
    kind = "prioritized_slice" if prioritized else "slice"
    theirs = (PrioritizedSliceSampler(30, ALPHA, BETA, slice_len=8, strict_length=False, traj_key="episode")
              if prioritized else SliceSampler(slice_len=8, strict_length=False, traj_key="episode"))
    assert len(_buffer(theirs, LazyTensorStorage(30), data, 32).sample()) == 12
    rb = make_replay_buffer(30, 32, sampler=kind, device="cpu", slice_len=8, strict_length=False,
                            traj_key="episode", **extra)
    rb.extend(data)
    batch = rb.sample()
    assert len(batch) == 12 and ("collector", "mask") not in batch.keys(include_nested=True)
    assert bool((batch["obs"].reshape(4, 3).diff(dim=1) == 1).all())
    if prioritized:
        assert batch["priority_weight"].shape == (12,)
    rb = make_replay_buffer(30, 32, sampler=kind, device="cpu", slice_len=8, strict_length=False,
                            traj_key="episode", pad_output=True, **extra)
    rb.extend(data)
    batch = rb.sample()
    assert len(batch) == 32 and int(batch["collector", "mask"].sum()) == 12


# -------------------------------------------------------------------------------------------- spans
@pytest.mark.parametrize("span", [(True, False), (2, False), (False, 2)])
@pytest.mark.parametrize("prioritized", [False, True])
def test_span_slices_are_torchrls(prioritized, span):
    """Trajectories of 3, 6, 9, 12, 15 steps, slice_len 5, strict: the same set of slices as TorchRL's (a left span
    is turned off for the prioritized sampler, with a warning, as TorchRL)."""
    done = torch.zeros(45, 1, dtype=torch.bool)
    done[torch.tensor([3, 6, 9, 12, 15]).cumsum(0) - 1] = True
    data = TensorDict({"obs": torch.arange(45), "done": done}, [45])
    kw = dict(slice_len=5, end_key="done", span=span)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = PrioritizedSliceSampler(45, 1.0, 1.0, **kw) if prioritized else SliceSampler(**kw)
        mine = (GPUPrioritizedSliceSampler(45, 1.0, 1.0, device="cpu", seed=1, **kw) if prioritized
                else GPUSliceSampler(device="cpu", seed=1, **kw))
    torch.manual_seed(1)
    a = slices_of(_buffer(theirs, LazyTensorStorage(45), data, 10), 600)
    b = slices_of(_buffer(mine, GPUTensorStorage(45, device="cpu"), data, 10), 600)
    assert a == b
    if prioritized and span[0]:
        assert mine.span == (False, False)
    else:
        assert any(len(s) < 5 for s in b)


def test_prioritized_span_right_true_keeps_the_short_trajectory():
    """TorchRL's test_slice_sampler_prioritized_span: with a right span, strict slices may end early, so the
    3-step trajectory is drawn; without, it never is."""
    done = torch.zeros(45, 1, dtype=torch.bool)
    done[torch.tensor([3, 6, 9, 12, 15]).cumsum(0) - 1] = True
    data = TensorDict({"obs": torch.arange(45), "done": done}, [45])
    for span, drawn in ((True, True), (False, False)):
        sampler = GPUPrioritizedSliceSampler(45, 1.0, 1.0, slice_len=5, end_key="done", span=span, device="cpu",
                                             seed=0)
        got = slices_of(_buffer(sampler, GPUTensorStorage(45, device="cpu"), data, 5), 300)
        assert any(s[0] < 3 for s in got) is drawn


# ---------------------------------------------------------------------- static signals, fragmented
@pytest.mark.parametrize("signal", ["ends", "trajectories"])
def test_static_signal_is_torchrls(signal):
    episode = torch.arange(40) // 10
    given = {"ends": torch.arange(40) % 10 == 9, "trajectories": episode}[signal]
    data = TensorDict({"obs": torch.arange(40)}, [40])
    out = []
    for sampler, storage in ((SliceSampler(slice_len=4, cache_values=True, **{signal: given}), LazyTensorStorage(40)),
                             (GPUSliceSampler(slice_len=4, cache_values=True, device="cpu", seed=0, **{signal: given}),
                              GPUTensorStorage(40, device="cpu"))):
        storage.set(range(40), data)  # TorchRL's static signal is for a filled storage (its extend drops it)
        slices = set()
        for _ in range(150):
            index = sampler.sample(storage, 8)[0]
            index = index[0] if isinstance(index, tuple) else index  # TorchRL's 1-tuple
            slices |= {tuple(row) for row in index.reshape(2, 4).tolist()}
        out.append(slices)
    assert out[0] == out[1] and all(len({x // 10 for x in s}) == 1 for s in out[1])


def test_fragmented_is_served_by_torchrls_code():
    """fragmented=True: TorchRL's own fragmented mode, so the same draws as TorchRL's under the same seed."""
    order = torch.randperm(24, generator=torch.Generator().manual_seed(0))
    data = TensorDict({"episode": (torch.arange(24) // 8)[order], "step_count": (torch.arange(24) % 8)[order],
                       "obs": torch.arange(24)[order]}, [24])
    kw = dict(slice_len=4, traj_key="episode", step_key="step_count", fragmented=True)
    out = []
    for sampler in (SliceSampler(**kw), GPUSliceSampler(device="cpu", **kw)):
        rb = _buffer(sampler, LazyTensorStorage(24), data, 8)
        torch.manual_seed(5)
        out.append(torch.stack([rb.sample()["obs"] for _ in range(4)]))
    assert torch.equal(out[0], out[1])
    assert bool((out[1].reshape(-1, 4).diff(dim=1) == 1).all())  # consecutive steps, scattered slots


# ------------------------------------------------------------------ outside a buffer; no rebuilds in one
@pytest.mark.parametrize("prioritized", [False, True])
def test_sampler_outside_a_buffer_rebuilds_from_the_storage(prioritized):
    """TorchRL's test flow: ``storage.set(range(100), data)`` then ``sampler.sample(storage, B)``: no false "every
    stored trajectory is shorter" error; the slices follow the stored episodes; a later write is seen."""
    storage = LazyTensorStorage(100)
    episode = torch.zeros(100, dtype=torch.int64)
    episode[:30], episode[30:55], episode[55:70], episode[70:] = 1, 2, 3, 4
    storage.set(range(100), TensorDict({"episode": episode, "count": torch.arange(100)}, [100]))
    sampler = (GPUPrioritizedSliceSampler(100, ALPHA, BETA, num_slices=4, traj_key="episode", device="cpu")
               if prioritized else GPUSliceSampler(num_slices=4, traj_key="episode", device="cpu"))
    if prioritized:
        sampler.extend(torch.arange(100))
        sampler.update_priority(torch.arange(100), 1.0)
    index, _ = sampler.sample(storage, 40)
    assert bool((episode[index].reshape(4, 10) == episode[index].reshape(4, 10)[:, :1]).all())
    assert sampler.index.rebuilds == 1
    storage.set(range(100), TensorDict({"episode": torch.arange(100) // 50, "count": torch.arange(100)}, [100]))
    index, _ = sampler.sample(storage, 40)
    assert sampler.index.rebuilds == 2 and bool(((index.reshape(4, 10) // 50).diff(dim=1) == 0).all())


@pytest.mark.parametrize("kind", ["slice", "prioritized_slice"])
def test_buffer_writes_are_followed_without_rebuilds(kind):
    extra = dict(alpha=ALPHA, beta=BETA) if kind == "prioritized_slice" else {}
    rb = make_replay_buffer(64, 8, sampler=kind, device="cpu", slice_len=4, traj_key="episode", **extra)
    theirs = TensorDictReplayBuffer(storage=GPUTensorStorage(64, device="cpu"), batch_size=8,
                                    sampler=GPUSliceSampler(slice_len=4, traj_key="episode", device="cpu"))
    for buffer in (rb, theirs):
        for k in range(5):
            buffer.extend(TensorDict({"episode": torch.full((20,), k)}, [20]))
            buffer.sample()
        assert buffer.sampler.index.rebuilds == 0


# ------------------------------------------------------------------------- storage, RNG, foreign states
def test_a_field_named_index_is_stored():
    """TorchRL's TensorDictMap stores a value TensorDict holding "index" in a storage: it reads back; a buffer's
    batch carries the sampled index under "index" (as TorchRL's)."""
    for packed in (False, True):
        storage = GPUTensorStorage(10, device="cpu", packed=packed)
        value = TensorDict({"index": torch.tensor([[10.0], [20.0], [30.0], [40.0]]), "x": torch.arange(4.0)}, [4])
        storage.set(torch.arange(4), value)
        assert torch.equal(storage[:]["index"], value["index"])
        storage.set(torch.arange(4, 6), TensorDict({"x": torch.ones(2)}, [2]))  # none given: the slots (TorchRL's tag)
        assert storage[4:6]["index"].flatten().tolist() == [4.0, 5.0]
        loaded = GPUTensorStorage(10, device="cpu")
        loaded.load_state_dict(storage.state_dict())
        assert torch.equal(loaded[:4]["index"], value["index"])
    rb = TensorDictReplayBuffer(storage=GPUTensorStorage(8, device="cpu"), batch_size=4)
    rb.extend(TensorDict({"x": torch.arange(6.0)}, [6]))
    batch = rb.sample()
    assert torch.equal(batch["index"], batch["x"].long())


@pytest.mark.parametrize("build", [
    lambda: GPUSliceSampler(slice_len=2), lambda: GPUPrioritizedSliceSampler(8, 0.6, 0.4, slice_len=2),
    lambda: GPUPrioritizedSampler(8, 0.6, 0.4), lambda: GPURankBasedSampler(8, 0.6, 0.4),
    lambda: GPURandomSampler(), lambda: GPUSamplerWithoutReplacement()])
def test_building_a_sampler_leaves_the_global_rng_untouched(build):
    torch.manual_seed(11)
    build()
    after = torch.rand(3)
    torch.manual_seed(11)
    assert torch.equal(torch.rand(3), after)


def test_foreign_states_name_torchrl():
    sampler = GPUSliceSampler(slice_len=2, traj_key="episode", device="cpu")
    rb = _buffer(sampler, LazyTensorStorage(8), TensorDict({"episode": torch.arange(8) // 4}, [8]), 4)
    rb.sample()
    sampler.load_state_dict(SliceSampler(slice_len=2).state_dict())  # TorchRL's: {} (it rescans the storage)
    rb.sample()
    assert sampler.index.rebuilds == 1  # the buffer's writes were followed; TorchRL's empty state: rebuilt
    with pytest.raises(ValueError, match="TorchRL's SliceSampler"):
        GPUPrioritizedSliceSampler(8, 0.6, 0.4, slice_len=2, device="cpu").load_state_dict({})
    with pytest.raises(ValueError, match="TorchRL's PrioritizedSampler"):
        GPUPrioritizedSliceSampler(8, 0.6, 0.4, slice_len=2, device="cpu").load_state_dict(
            PrioritizedSampler(8, 0.6, 0.4).state_dict())
    prioritized = GPUPrioritizedSliceSampler(8, 0.6, 0.4, slice_len=2, device="cpu")
    versionless = {k: v for k, v in prioritized.state_dict().items() if k != "_schema_version"}
    with pytest.raises(ValueError, match="lightning_per did not write it .TorchRL's own state_dict"):
        prioritized.load_state_dict(versionless)


def test_a_version_1_slice_state_loads():
    """Schema 1 (before 2-D storages) has no "slots" / "stride": migrated, it restores the same start mask."""
    rb = make_replay_buffer(16, 4, sampler="slice", device="cpu", slice_len=2, traj_key="episode")
    rb.extend(TensorDict({"episode": torch.arange(16) // 5}, [16]))
    rb.sample()
    state = rb.sampler.state_dict()
    old = {k: v for k, v in state.items() if k not in ("slots", "stride")}
    old["slice_schema"] = 1
    fresh = GPUSliceSampler(16, slice_len=2, traj_key="episode", device="cpu")
    fresh.load_state_dict(old)
    assert torch.equal(fresh.index.valid, rb.sampler.index.valid)


def test_compat_reads_torchrls_revision_and_cursor():
    storage = LazyTensorStorage(10)
    before = compat.mutation_revision(storage)
    storage.set(range(3, 7), TensorDict({"x": torch.zeros(4)}, [4]))
    assert compat.mutation_revision(storage) > before and compat.last_written_row(storage) == 6
    mine = GPUTensorStorage(10, device="cpu")
    mine.set(torch.arange(2, 5), TensorDict({"x": torch.zeros(3)}, [3]))
    assert compat.last_written_row(mine) == 4
