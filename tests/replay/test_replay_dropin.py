"""Drop-in behaviour against TorchRL's own classes: each test runs the same lines with TorchRL's storage or
sampler and with ours and expects the same result (TorchRL's classes are the oracle), or checks a property
stated by TorchRL's documentation (re-seeding replays draws, an epoch without replacement visits every item
once)."""

import copy
import logging
import pickle
import warnings

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict, tensorclass
from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers.scheduler import LinearScheduler
from torchrl.data.replay_buffers.writers import TensorDictMaxValueWriter

from lightning_per import (
    GPUPrioritizedReplayBuffer,
    GPUPrioritizedSampler,
    GPUPrioritizedSliceSampler,
    GPURandomSampler,
    GPURankBasedSampler,
    GPUSamplerWithoutReplacement,
    GPUTensorStorage,
    make_replay_buffer,
)


def _both(device):
    """(TorchRL's storage class, ours on ``device``) as factories of a storage of ``n`` slots."""
    return (lambda n, **kw: LazyTensorStorage(n, device=device, **kw),
            lambda n, **kw: GPUTensorStorage(n, device=device, **kw))


# ---------------------------------------------------------------------------- reads see the filled part
@pytest.mark.parametrize("packed", [False, True])
def test_reads_see_only_the_filled_slots(device, packed):
    out = []
    for make in _both(device):
        kw = {"packed": packed} if make is _both(device)[1] and packed else {}
        rb = TensorDictReplayBuffer(storage=make(5, **kw) if kw else make(5), batch_size=2)
        rb.extend(TensorDict({"a": torch.arange(1, 4)}, [3]))
        out.append((rb[:]["a"].tolist(), rb[1:]["a"].tolist(), int(rb[-1]["a"]), rb[[0, 2]]["a"].tolist(),
                    rb[torch.tensor([-1])]["a"].tolist(), rb.storage.get(slice(None))["a"].tolist()))
        with pytest.raises(IndexError):
            rb[6]
        with pytest.raises(IndexError):
            rb[3]
    assert out[1] == out[0] == ([1, 2, 3], [2, 3], 3, [1, 3], [3], [1, 2, 3])


def test_sampler_reads_index_the_whole_ring(device):
    """A sampler's slot tensor reads the preallocated ring (static shapes): the read path stays graph-capturable."""
    storage = GPUTensorStorage(5, device=device)
    storage.set(torch.arange(3), TensorDict({"a": torch.arange(1, 4)}, [3]))
    assert storage.get(torch.tensor([2, 0], device=device))["a"].tolist() == [3, 1]
    assert storage.get(torch.tensor([4], device=device)).batch_size == torch.Size([1])  # no host length involved


# ---------------------------------------------------------------------------- pickling and deep copies
@pytest.mark.parametrize("cls", [GPUPrioritizedSampler, GPURankBasedSampler])
def test_prioritized_samplers_pickle_and_deepcopy(cls, device):
    storage = GPUTensorStorage(10, device=device)
    storage.set(torch.arange(10), TensorDict({"x": torch.arange(10.0)}, [10]))
    sampler = cls(10, 0.6, 0.4, device=device, seed=3)
    sampler.update_priority(torch.arange(10), torch.arange(1.0, 11.0), storage=storage)
    for clone in (lambda s: pickle.loads(pickle.dumps(s)), copy.deepcopy):
        twin = clone(sampler)
        torch.testing.assert_close(twin.probabilities(), sampler.probabilities())
        state = sampler.get_rng_state()
        expected = sampler.sample(storage, 6)[0]
        sampler.set_rng_state(state)
        assert torch.equal(twin.sample(storage, 6)[0], expected)


@pytest.mark.parametrize("kind", ["proportional", "rank", "uniform"])
def test_buffers_pickle_and_deepcopy(kind, device):
    rb = make_replay_buffer(10, 2, sampler=kind, device=device, generator=torch.Generator().manual_seed(0))
    rb.extend(TensorDict({"x": torch.arange(4.0)}, [4]))
    for clone in (lambda b: pickle.loads(pickle.dumps(b)), copy.deepcopy):
        twin = clone(rb)
        assert len(twin) == 4 and twin[:]["x"].tolist() == [0.0, 1.0, 2.0, 3.0]
        assert torch.equal(twin.sample()["index"], rb.sample()["index"])  # same generator states


# ---------------------------------------------------------------------------- the buffer's generator
@pytest.mark.parametrize("kind", ["proportional", "rank", "uniform"])
def test_reseeding_the_buffer_generator_in_place_replays_draws(kind, device):
    gen = torch.Generator().manual_seed(0)
    rb = make_replay_buffer(100, 8, sampler=kind, device=device, generator=gen)
    rb.extend(TensorDict({"x": torch.arange(100)}, [100]))
    gen.manual_seed(42)
    a = rb.sample()["x"]
    gen.manual_seed(42)
    b = rb.sample()["x"]
    gen.manual_seed(7)
    c = rb.sample()["x"]
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("kind", ["proportional", "rank", "uniform"])
def test_state_dict_round_trip_replays_draws(kind, device):
    gen = torch.Generator().manual_seed(0)
    rb = make_replay_buffer(100, 8, sampler=kind, device=device, generator=gen)
    rb.extend(TensorDict({"x": torch.arange(100)}, [100]))
    rb.sample()
    gen.manual_seed(42)  # re-seeded in place, then saved: the next draws follow the new seed, also on reload
    state = rb.state_dict()
    first = [rb.sample()["x"] for _ in range(2)]
    rb.load_state_dict(state)
    assert all(torch.equal(a, rb.sample()["x"]) for a in first)


def test_torchrl_buffer_with_our_sampler_follows_its_generator(device):
    gen = torch.Generator().manual_seed(0)
    rb = TensorDictReplayBuffer(storage=GPUTensorStorage(100, device=device),
                                sampler=GPUPrioritizedSampler(100, 0.7, 0.5, device=device), generator=gen,
                                batch_size=8)
    rb.extend(TensorDict({"x": torch.arange(100)}, [100]))
    gen.manual_seed(42)
    a = rb.sample()["x"]
    gen.manual_seed(42)
    assert torch.equal(a, rb.sample()["x"])


# ---------------------------------------------------------------------------- constructor options
def test_torchrl_storage_options_are_accepted(device):
    for kw in ({"compilable": True}, {"compilable": False}, {"consolidated": True}, {"shared_init": True},
               {"shared_init": True, "cleanup_memmap": False}):
        out = []
        for make in _both(device):
            rb = ReplayBuffer(storage=make(6, **kw), batch_size=2)
            rb.extend(TensorDict({"a": torch.arange(4), "b": torch.ones(4, 2)}, [4]))
            out.append((len(rb), rb[:]["a"].tolist(), rb[:]["b"].shape))
        assert out[1] == out[0], kw


@pytest.mark.torchrl_tree
def test_max_priority_within_buffer_as_torchrl():
    storage = LazyTensorStorage(3)
    storage.set(torch.arange(3), TensorDict({"x": torch.zeros(3)}, [3]))
    values = []
    for sampler in (PrioritizedSampler(3, 0.7, 0.5, max_priority_within_buffer=True),
                    GPUPrioritizedSampler(3, 0.7, 0.5, device="cpu", max_priority_within_buffer=True),
                    GPUPrioritizedSampler(3, 0.7, 0.5, device="cpu")):
        sampler.update_priority(torch.arange(3), torch.tensor([5.0, 1.0, 2.0]), storage=storage)
        sampler.update_priority(torch.tensor([0]), torch.tensor([0.5]), storage=storage)  # the max leaves
        values.append(float(sampler.default_priority))
    assert values == pytest.approx([2.0, 2.0, 5.0])  # within the buffer (TorchRL's), ours, the running max


@pytest.mark.torchrl_tree
@pytest.mark.parametrize("shape,reduction", [((6,), "max"), ((6, 1), "mean"), ((6, 3), "max"), ((6, 3), "mean")])
def test_update_tensordict_priority_reduces_as_torchrl(shape, reduction):
    """A batch's ``td_error`` of shape (B,), (B, 1) or (B, k) sets the priorities TorchRL's buffer sets (its
    ``reduction`` over each item's extra dims; a (B,) or (B, 1) vector is taken as it is)."""
    td_error = torch.rand(shape, generator=torch.Generator().manual_seed(3)) + 0.1
    probabilities = []
    for cls in (TensorDictPrioritizedReplayBuffer, GPUPrioritizedReplayBuffer):
        ours = cls is GPUPrioritizedReplayBuffer
        storage = GPUTensorStorage(10, device="cpu") if ours else LazyTensorStorage(10)
        rb = cls(alpha=1.0, beta=0.5, storage=storage, batch_size=6, reduction=reduction)
        rb.extend(TensorDict({"x": torch.arange(10.0)}, [10]))
        batch = TensorDict({"index": torch.tensor([0, 2, 4, 6, 8, 9]), "td_error": td_error}, [6])
        rb.update_tensordict_priority(batch)
        if not ours:  # TorchRL's stored values (p + eps)^alpha, from its tree
            values = torch.tensor([rb.sampler._sum_tree[i] for i in range(10)], dtype=torch.float64)
            probabilities.append(values / values.sum())
        else:
            probabilities.append(rb.sampler.probabilities().cpu())
    torch.testing.assert_close(probabilities[1], probabilities[0], rtol=1e-5, atol=1e-7)


@pytest.mark.torchrl_tree
def test_alpha_and_beta_as_tensors_follow_a_scheduler():
    out = []
    for sampler in (PrioritizedSampler(10, torch.tensor(0.6), torch.tensor(0.4)),
                    GPUPrioritizedSampler(10, torch.tensor(0.6), torch.tensor(0.4), device="cpu")):
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler, batch_size=4)
        rb.extend(TensorDict({"x": torch.arange(10)}, [10]))
        for name, final in (("alpha", 0.2), ("beta", 1.0)):
            scheduler = LinearScheduler(rb, param_name=name, final_value=final, num_steps=4)
            for _ in range(2):
                scheduler.step()
        out.append((float(sampler.alpha), float(sampler.beta)))
    assert out[1] == pytest.approx(out[0])
    assert out[0] != pytest.approx((0.6, 0.4))  # the schedulers moved both
    sampler = GPUPrioritizedSampler(4, 0.5, 0.5, device="cpu")
    sampler.beta = torch.tensor(0.9)
    assert float(sampler.core.state.beta) == pytest.approx(0.9)
    with pytest.raises(TypeError, match="beta"):
        sampler.beta = torch.ones(2)
    with pytest.raises(ValueError, match="alpha"):
        sampler.alpha = torch.tensor(-1.0)


@pytest.mark.torchrl_tree
@pytest.mark.parametrize("ours", [
    lambda: GPUPrioritizedSampler(10, 0.8, 0.6, device="cpu"),
    lambda: GPURankBasedSampler(10, 0.8, 0.6, device="cpu"),
    lambda: GPUPrioritizedSliceSampler(10, 0.8, 0.6, slice_len=2, traj_key="episode", device="cpu"),
])
def test_exponents_read_under_torchrl_names_as_torchrl(ours, tmp_path):
    """TorchRL's own test of a saved prioritized buffer (test_prb_serialization) reads ``sampler._alpha`` and
    ``_beta``: ours answer what TorchRL's sampler does, after a scheduler-style set and after a load."""
    theirs, ours = PrioritizedSampler(10, 0.8, 0.6), ours()
    assert (ours._alpha, ours._beta) == (theirs._alpha, theirs._beta) == (0.8, 0.6)
    for sampler in (theirs, ours):
        sampler.alpha, sampler.beta = 0.5, 0.9
    assert (ours._alpha, ours._beta) == (theirs._alpha, theirs._beta)
    ours.dumps(tmp_path)
    other = copy.deepcopy(ours)
    other.alpha, other.beta = 0.3, 0.2
    other.loads(tmp_path)
    assert (other._alpha, other._beta) == (theirs._alpha, theirs._beta)
    with pytest.raises(AttributeError):
        ours._alpha = 1.0  # read-only: alpha (validated, re-transforms the stored values) is the way to set it


def test_uniform_sampler_without_replacement(device):
    sampler = GPURandomSampler(replacement=False, device=device, seed=0)
    assert isinstance(sampler, GPUSamplerWithoutReplacement) and isinstance(sampler, SamplerWithoutReplacement)
    rb = ReplayBuffer(storage=GPUTensorStorage(10, device=device), sampler=sampler, batch_size=4)
    rb.extend(TensorDict({"x": torch.arange(10)}, [10]))
    epoch = torch.cat([rb.sample()["x"] for _ in range(3)])  # 4 + 4 + 2
    assert sorted(epoch.tolist()) == list(range(10)) and epoch.device.type == device.type
    dropping = GPURandomSampler(replacement=False, drop_last=True, device=device)
    rb = ReplayBuffer(storage=GPUTensorStorage(10, device=device), sampler=dropping, batch_size=4)
    rb.extend(TensorDict({"x": torch.arange(10)}, [10]))
    assert len(list(rb)) == 2  # two full batches per epoch, as TorchRL's drop_last


def test_empty_sample_message_as_torchrl():
    rb = GPUPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=GPUTensorStorage(10, device="cpu"), batch_size=2)
    with pytest.raises(RuntimeError, match="empty storage"):
        rb.sample()


# ---------------------------------------------------------------------------- writers and checkpoints
@pytest.mark.torchrl_tree
def test_max_value_writer_unkept_items_are_skipped():
    out = []
    for storage, sampler in ((LazyTensorStorage(3), PrioritizedSampler(3, alpha=0.8, beta=0.9)),
                             (GPUTensorStorage(3, device="cpu"), GPUPrioritizedSampler(3, 0.8, 0.9, device="cpu"))):
        rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, writer=TensorDictMaxValueWriter(rank_key="r"),
                                    batch_size=2)
        rb.extend(TensorDict({"r": torch.tensor([1.0, 2.0, 3.0])}, [3]))
        rb.extend(TensorDict({"r": torch.tensor([0.5, 4.0])}, [2]))  # 0.5 is not kept (index -1)
        out.append(sorted(rb[:]["r"].tolist()))
    assert out[1] == out[0] == [2.0, 3.0, 4.0]


def test_storage_state_saved_by_torchrl_loads_into_an_initialised_storage():
    src = TensorDictReplayBuffer(storage=LazyMemmapStorage(100), batch_size=3)
    td = TensorDict({"obs": torch.arange(4.0).view(1, 4)}, [1])
    for _ in range(3):
        src.extend(td)
    dst = TensorDictReplayBuffer(storage=GPUTensorStorage(100, device="cpu"), batch_size=3)
    dst.extend(TensorDict({"obs": torch.zeros(1, 4)}, [1]))
    dst.load_state_dict(src.state_dict())  # holds the writer's "index" field
    assert len(dst) == 3 and torch.equal(dst[:]["obs"], src[:]["obs"])
    assert set(dst.storage._storage.keys()) == {"obs"}


# ---------------------------------------------------------------------------- other layouts
def test_two_dimensional_storage_as_torchrl(device):
    out = []
    for make in _both(device):
        rb = TensorDictReplayBuffer(storage=make(100, ndim=2), batch_size=4)
        rb.extend(TensorDict({"x": torch.arange(12.0).view(4, 3)}, [4, 3]))  # 4 envs x 3 steps
        out.append((tuple(rb.storage._storage.shape), len(rb), rb[:]["x"].tolist(), tuple(rb.sample().batch_size)))
    assert out[1] == out[0]


@pytest.mark.parametrize("sampler", ["prioritized", "uniform"])
def test_our_samplers_on_a_two_dimensional_torchrl_storage(sampler):
    storage = LazyMemmapStorage(100, ndim=2)
    if sampler == "prioritized":
        rb = GPUPrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=storage, batch_size=64, device="cpu")
    else:
        rb = TensorDictReplayBuffer(storage=storage, sampler=GPURandomSampler(device="cpu"), batch_size=64)
    rb.extend(TensorDict({"x": torch.arange(12.0).view(4, 3)}, [4, 3]))  # stored as [3 steps, 4 envs]
    batch = rb.sample()
    assert batch.batch_size == torch.Size([64])
    rows, cols = batch["index"].unbind(-1) if batch["index"].ndim == 2 else batch["index"]
    assert torch.equal(batch["x"], storage._storage["x"][rows, cols])  # each item the one stored at its index
    assert bool((rows < 3).all() and (cols < 4).all())
    if sampler == "prioritized":  # a priority update through the 2-D index reaches that item only
        rb.update_priority(torch.tensor([[2, 1]]), torch.tensor([1e6]))
        assert bool((rb.sample()["x"] == storage._storage["x"][2, 1]).float().mean() > 0.9)


def test_items_keep_their_own_batch_dims(device):
    out = []
    for make in _both(device):
        rb = TensorDictReplayBuffer(storage=make(10), batch_size=2)
        rb.extend(TensorDict({"obs": torch.arange(60.0).view(5, 3, 4)}, [5, 3]))
        batch = rb.sample()
        out.append((tuple(batch.batch_size), tuple(batch["obs"].shape), tuple(batch["index"].shape), rb[:].shape))
        assert torch.equal(batch["obs"], rb[:]["obs"][batch["index"][:, 0]])
    assert out[1] == out[0] == ((2, 3), (2, 3, 4), (2, 3), torch.Size([5, 3]))


def test_ragged_lazy_stacks_as_torchrl():
    out = []
    for make in _both("cpu"):
        rb = ReplayBuffer(storage=make(6), batch_size=2)
        ragged = LazyStackedTensorDict(TensorDict(a=torch.arange(160.0).view(5, 4, 8), batch_size=5),
                                       TensorDict(a=torch.arange(120.0).view(5, 3, 8), batch_size=5), stack_dim=1)
        rb.extend(ragged)
        out.append((len(rb), rb[2][1]["a"].tolist(), rb[4][0]["a"].shape))
    assert out[1] == out[0]


@tensorclass
class _Step:
    obs: torch.Tensor
    reward: torch.Tensor


@pytest.mark.parametrize("item", ["tensor", "tensorclass", "pytree"])
def test_plain_tensors_tensorclasses_and_pytrees_are_stored(item, device):
    data = {"tensor": torch.arange(5.0),
            "tensorclass": _Step(obs=torch.arange(10.0).view(5, 2), reward=torch.arange(5.0), batch_size=[5]),
            "pytree": {"obs": torch.arange(10.0).view(5, 2), "reward": torch.arange(5.0)}}[item]
    out = []
    for make in _both(device):
        rb = ReplayBuffer(storage=make(8), batch_size=3)
        rb.extend(data)
        got = rb[1:3]
        out.append((len(rb), type(got).__name__, str(torch.utils._pytree.tree_leaves(
            got.to_dict() if hasattr(got, "to_dict") else got))))
        sample = rb.sample()
        leaves = torch.utils._pytree.tree_leaves(sample.to_dict() if hasattr(sample, "to_dict") else sample)
        assert leaves[0].shape[0] == 3
    assert out[1] == out[0]


# ---------------------------------------------------------------------------- exchangeable stratified batches
@pytest.mark.parametrize("cls", [GPUPrioritizedSampler, GPURankBasedSampler])
def test_stratified_batches_are_exchangeable(cls, device):
    """With equal priorities a stratified batch holds one slot per stratum of N / B slots; shuffled (the default),
    its halves have the same distribution: over 200 batches the mean slot of the first half minus that of the
    second has mean 0 and standard deviation sigma / sqrt(200), sigma <= N / sqrt(3 * B) (each half-mean averages
    B / 2 slots, one per distinct stratum: variance at most that of B / 2 independent uniforms on [0, N), x2 for
    the difference). The bound 5 sigma / sqrt(200) is exceeded with probability < 1e-6; in stratum order the
    difference is -N / 2 (about 100 standard errors away)."""
    n, b, draws = 2048, 64, 200
    storage = GPUTensorStorage(n, device=device)
    storage.set(torch.arange(n), TensorDict({"x": torch.zeros(n)}, [n]))
    sampler = cls(n, 1.0, 0.4, device=device, seed=0)
    sampler.update_priority(torch.arange(n), torch.ones(n), storage=storage)
    batches = torch.stack([sampler.sample(storage, b)[0] for _ in range(draws)]).double().cpu()  # [draws, B]
    if cls is GPUPrioritizedSampler:  # still stratified: one slot per stratum of n / b slots
        assert all(torch.equal((row // (n // b)).sort().values, torch.arange(b).double()) for row in batches)
    diff = batches[:, : b // 2].mean(1) - batches[:, b // 2:].mean(1)
    bound = 5 * n / (3 * b) ** 0.5 / draws ** 0.5
    assert abs(float(diff.mean())) < bound
    ordered = cls(n, 1.0, 0.4, device=device, seed=0, shuffle_strata=False)
    ordered.update_priority(torch.arange(n), torch.ones(n), storage=storage)
    first = ordered.sample(storage, b)[0].cpu()
    assert torch.equal(first, first.sort().values)  # stratum order: sorted by slot


@pytest.mark.skipif(not hasattr(TensorDictReplayBuffer, "set_"), reason="torchrl < 0.12 has no ReplayBuffer.set_")
def test_slice_reads_are_views_as_torchrl(device):
    out = []
    for make in _both(device):
        rb = TensorDictReplayBuffer(storage=make(6), batch_size=2)
        rb.extend(TensorDict({"a": torch.arange(4.0)}, [4]))
        rb.set_("a", torch.full((4,), 7.0))  # TorchRL writes through storage[:]
        rb.set_at_("a", torch.tensor([1.0]), torch.tensor([2]))
        out.append(rb[:]["a"].tolist())
    assert out[1] == out[0] == [7.0, 7.0, 1.0, 7.0]


def test_slice_sampler_follows_its_buffer_generator():
    from lightning_per import GPUSliceSampler

    gen = torch.Generator().manual_seed(0)
    rb = TensorDictReplayBuffer(storage=GPUTensorStorage(64, device="cpu"), batch_size=8, generator=gen,
                                sampler=GPUSliceSampler(64, num_slices=2, traj_key="episode", device="cpu"))
    rb.extend(TensorDict({"episode": torch.arange(64) // 16, "x": torch.arange(64)}, [64]))
    gen.manual_seed(42)
    a = rb.sample()["x"]
    gen.manual_seed(42)
    assert torch.equal(a, rb.sample()["x"])


def test_key_reads_and_nested_torchrl_states_as_torchrl(tmp_path):
    item = TensorDict({"obs": torch.ones(1, 4), "next": {"obs": torch.ones(1, 4)}}, [1])
    out = []
    for make in _both("cpu"):
        src = TensorDictReplayBuffer(storage=make(10), batch_size=3)
        for _ in range(3):
            src.extend(item)
        dst = TensorDictReplayBuffer(storage=GPUTensorStorage(10, device="cpu"), batch_size=3)
        dst.extend(item * 0)
        dst.load_state_dict(src.state_dict())  # nested keys saved flat by tensordict, TorchRL's with "index"
        out.append((dst.storage.get(("next", "obs")).tolist(), src.storage.get("obs").shape,
                    sorted(map(str, dst.storage._storage.keys(True, True)))))
    assert out[1] == out[0] and out[0][0] == [[1.0] * 4] * 3 and out[0][1] == torch.Size([3, 4])


def test_pytree_storage_dumps_and_loads(tmp_path):
    data = {"obs": torch.arange(10.0).view(5, 2), "reward": torch.arange(5.0)}
    storage = GPUTensorStorage(8, device="cpu")
    ReplayBuffer(storage=storage, batch_size=2).extend(data)
    storage.dumps(tmp_path / "s")
    other = GPUTensorStorage(8, device="cpu")
    ReplayBuffer(storage=other, batch_size=2).extend({k: v * 0 for k, v in data.items()})  # as TorchRL's: initialised
    other.loads(tmp_path / "s")
    assert len(other) == 5 and torch.equal(other[1:3]["obs"], data["obs"][1:3])


def test_compilable_storage_of_tensors_writes_inside_a_full_graph():
    storage = GPUTensorStorage(100, device="cpu", compilable=True)
    data = torch.arange(25).unsqueeze(-1)
    storage.set(torch.arange(25), data)

    @torch.compile(fullgraph=True)
    def write(cursor, value):
        storage.set(cursor, value)

    write(torch.arange(25, 50), data)
    write(torch.arange(50, 75), data)
    assert len(storage) == 75 and torch.equal(storage[:75], data.repeat(3, 1))


@pytest.mark.torchrl_tree
@pytest.mark.parametrize("packed", [False, True])
def test_a_sample_size_other_than_the_buffers_warns_as_torchrl(packed):
    """TorchRL warns when ``sample(n)`` differs from the constructor's batch size; so do ours (direct path
    included), and a matching or omitted size does not warn."""
    for cls, storage in ((TensorDictPrioritizedReplayBuffer, LazyTensorStorage(16)),
                         (GPUPrioritizedReplayBuffer, GPUTensorStorage(16, device="cpu", packed=packed))):
        rb = cls(alpha=0.7, beta=0.5, storage=storage, batch_size=8)
        rb.extend(TensorDict({"x": torch.arange(10.0)}, [10]))
        with pytest.warns(UserWarning, match=r"batch_size"):
            assert rb.sample(4).batch_size == (4,)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert rb.sample().batch_size == (8,) and rb.sample(8).batch_size == (8,)


class _Recompiles(logging.Handler):
    """Collects torch.compile's recompile records (the log TorchRL's own recompile test counts)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.endswith("__recompiles"):
            self.records.append(record)


def _recompiles_of_extend_and_sample(storage, sampler) -> int:
    """Recompiles of one compiled ``set`` + ``sample`` over 5 growing lengths (TorchRL's
    ``test__rand_given_ndim_recompile``, with the eager backend: dynamo's guards are the same)."""
    torch._dynamo.reset()

    def extend_and_sample(data):
        storage.set(torch.arange(50) + len(storage), data)
        return sampler.sample(storage, 3)

    compiled = torch.compile(extend_and_sample, backend="eager")
    data = torch.randint(100, (50, 1))
    handler, logger = _Recompiles(), logging.getLogger("torch._dynamo")
    torch._logging.set_logs(recompiles=True)
    logger.addHandler(handler)
    try:
        for _ in range(5):
            index, _ = compiled(data)
            assert bool(((index >= 0) & (index < len(storage))).all())
    finally:
        logger.removeHandler(handler)
        torch._logging.set_logs()
    assert len(storage) == 250
    return len(handler.records)


def test_uniform_draw_recompiles_no_more_than_torchrl():
    """A compiled write + uniform draw recompiles no more often with our storage and sampler than with
    TorchRL's: the draw reads ``len(storage)``, a host int every write changes, outside the compiled graph."""
    theirs = _recompiles_of_extend_and_sample(LazyTensorStorage(300, compilable=True), RandomSampler())
    ours = _recompiles_of_extend_and_sample(GPUTensorStorage(300, device="cpu", compilable=True),
                                            GPURandomSampler(device="cpu", seed=0))
    assert ours <= theirs


# ---------------------------------------------------------------------------- the storage a buffer keeps
def _five_rows() -> TensorDict:
    i = torch.arange(5, dtype=torch.float32)
    return TensorDict({"observation": i[:, None].expand(5, 3).clone(), "reward": i + 1}, [5])


@pytest.mark.parametrize("prioritized", [pytest.param(True, marks=pytest.mark.torchrl_tree), False])
def test_an_unwritten_lazy_tensor_storage_is_replaced_where_torchrl_keeps_it(prioritized):
    """TorchRL's buffer keeps the ``LazyTensorStorage`` it was given and writes into it; ours builds a
    ``GPUTensorStorage`` of its size instead (documented in the class docstring and docs/replay.md), leaves the one
    given empty and holds the same rows TorchRL's storage holds."""
    from lightning_per import GPUReplayBuffer

    theirs_storage, ours_storage = LazyTensorStorage(100), LazyTensorStorage(100)
    if prioritized:
        theirs = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=theirs_storage, batch_size=4)
        ours = GPUPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=ours_storage, batch_size=4, device="cpu")
    else:
        theirs = TensorDictReplayBuffer(storage=theirs_storage, batch_size=4)
        ours = GPUReplayBuffer(storage=ours_storage, batch_size=4, device="cpu")
    theirs.extend(_five_rows())
    ours.extend(_five_rows())
    assert theirs.storage is theirs_storage and len(theirs_storage) == 5
    assert ours.storage is not ours_storage and type(ours.storage) is GPUTensorStorage
    assert ours.storage.max_size == theirs_storage.max_size == 100
    assert len(ours_storage) == 0 and not ours_storage.initialized  # the one passed: never written
    assert len(ours.storage) == len(theirs_storage) == 5
    for key in ("observation", "reward"):
        assert torch.equal(ours.storage[:][key], theirs_storage[:][key]), key


@pytest.mark.parametrize("prioritized", [True, False])
@pytest.mark.parametrize("kind", ["ours", "written LazyTensorStorage", "LazyMemmapStorage"])
def test_other_storages_are_kept_as_torchrl_keeps_them(kind, prioritized, tmp_path):
    from lightning_per import GPUReplayBuffer

    if kind == "ours":
        storage = GPUTensorStorage(100, device="cpu")
    elif kind == "written LazyTensorStorage":
        storage = LazyTensorStorage(100)
        storage.set(torch.arange(2), _five_rows()[:2])
    else:
        storage = LazyMemmapStorage(100, scratch_dir=tmp_path)
    before = len(storage)
    rb = (GPUPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=storage, batch_size=4, device="cpu") if prioritized
          else GPUReplayBuffer(storage=storage, batch_size=4, device="cpu"))
    rb.extend(_five_rows())
    assert rb.storage is storage and len(storage) == before + 5
