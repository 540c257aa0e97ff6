"""One behavioural contract over every sampler x storage device.

Every expected value comes from an independent source: a NumPy model of the priorities, the stored
input data, or the closed forms of the PER paper.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import PrioritizedSampler, TensorDictPrioritizedReplayBuffer

from lightning_per import (
    GPUPrioritizedReplayBuffer,
    GPUPrioritizedSampler,
    GPURankBasedSampler,
    GPUTensorStorage,
    make_replay_buffer,
)

SAMPLERS = ["proportional", "rank", "uniform"]
PRIORITIZED = ["proportional", "rank"]


def transitions(n: int, start: int = 0, obs_dim: int = 3) -> TensorDict:
    """n distinguishable transitions: obs[i] = start + i in every feature."""
    i = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict({
        "observation": i[:, None].expand(n, obs_dim).clone(),
        "action": torch.arange(start, start + n) % 2,
        "reward": i.clone(),
        "done": torch.zeros(n, 1, dtype=torch.bool),
    }, [n])


def make(kind, device, capacity=16, batch=8, seed=0, **kw):
    gen = torch.Generator().manual_seed(seed)
    return make_replay_buffer(capacity, batch, sampler=kind, device=device, generator=gen, **kw)


@pytest.mark.parametrize("kind", SAMPLERS)
def test_sample_returns_stored_rows_on_device(kind, device):
    rb = make(kind, device)
    rb.extend(transitions(10))
    batch = rb.sample()
    assert batch.batch_size == torch.Size([8])
    assert batch["index"].device.type == device.type
    assert batch["observation"].device.type == device.type
    idx = batch["index"].cpu()
    assert ((idx >= 0) & (idx < 10)).all()
    # each sampled row is the row written at that slot
    torch.testing.assert_close(batch["reward"].cpu(), idx.float())
    if kind in PRIORITIZED:
        w = batch["priority_weight"]
        assert w.dtype == torch.float32 and w.device.type == device.type


@pytest.mark.parametrize("kind", SAMPLERS)
def test_ring_overwrites_oldest(kind, device):
    rb = make(kind, device, capacity=8)
    rb.extend(transitions(6))
    rb.extend(transitions(6, start=100))  # slots 6,7 then wrap to 0..3
    assert len(rb) == 8
    stored = rb.storage.get(torch.arange(8, device=device))["reward"].cpu()
    np.testing.assert_array_equal(stored.numpy(), [102, 103, 104, 105, 4, 5, 100, 101])


@pytest.mark.parametrize("kind", SAMPLERS)
def test_empty_buffer_and_bad_batch_size(kind, device):
    rb = make(kind, device)
    with pytest.raises(ValueError, match="empty"):
        rb.sample()
    with pytest.raises(RuntimeError):  # TorchRL's own samplers raise RuntimeError: still caught
        rb.sample()
    rb.extend(transitions(4))
    for bad in (0, -3):
        with pytest.raises(ValueError, match="batch_size"):
            rb.sampler.sample(rb.storage, bad)


@pytest.mark.parametrize("kind", SAMPLERS)
def test_wrong_spec_rejected_and_nothing_changes(kind, device):
    rb = make(kind, device)
    rb.extend(transitions(5))
    before = rb.storage.get(torch.arange(16, device=device)).clone()
    cursor, length = rb._writer._cursor, len(rb)
    probs = rb.sampler.probabilities().clone() if kind in PRIORITIZED else None
    bad_shape = transitions(3, obs_dim=4)
    bad_dtype = transitions(3)
    bad_dtype["reward"] = bad_dtype["reward"].double()
    bad_keys = transitions(3).exclude("done")
    for bad, err, word in ((bad_shape, ValueError, "shape"), (bad_dtype, TypeError, "dtype"),
                           (bad_keys, ValueError, "keys")):
        with pytest.raises(err, match=word):
            rb.extend(bad)
    assert rb._writer._cursor == cursor and len(rb) == length
    assert (rb.storage.get(torch.arange(16, device=device)) == before).all()
    if probs is not None:
        torch.testing.assert_close(rb.sampler.probabilities(), probs)


@pytest.mark.parametrize("kind", PRIORITIZED)
def test_bad_update_priority_inputs_change_nothing(kind, device):
    rb = make(kind, device)
    rb.extend(transitions(6))
    rb.update_priority(torch.arange(6), torch.arange(1.0, 7.0))
    probs = rb.sampler.probabilities().clone()
    with pytest.raises(IndexError, match="index"):
        rb.update_priority(torch.tensor([0, 6]), torch.tensor([1.0, 2.0]))  # 6 is not filled
    with pytest.raises(IndexError, match="index"):
        rb.update_priority(torch.tensor([-1]), torch.tensor([1.0]))
    with pytest.raises(ValueError, match="priority"):
        rb.update_priority(torch.tensor([0, 1, 2]), torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="index"):
        rb.update_priority(torch.tensor([0.5]), torch.tensor([1.0]))
    with pytest.raises(TypeError, match="priority"):
        rb.update_priority(torch.tensor([0]), "high")
    torch.testing.assert_close(rb.sampler.probabilities(), probs)


@pytest.mark.parametrize("kind", PRIORITIZED)
def test_new_items_get_running_max_raw_priority(kind, device):
    """TorchRL's rule: new items get max raw priority so far (1.0 before any update), transformed once."""
    alpha, eps = 0.7, 1e-6
    rb = make(kind, device, alpha=alpha, eps=eps)
    rb.extend(transitions(3))
    rb.update_priority(torch.tensor([0, 1, 2]), torch.tensor([0.5, 4.0, 2.0]))
    rb.extend(transitions(2, start=3))
    raw = np.array([0.5, 4.0, 2.0, 4.0, 4.0])
    if kind == "proportional":
        stored = (raw + eps) ** alpha
        expected = stored / stored.sum()
        np.testing.assert_allclose(rb.sampler.probabilities().cpu().numpy()[:5], expected, rtol=1e-6)
    assert float(rb.sampler.default_priority) == pytest.approx(4.0)


@pytest.mark.parametrize("kind", PRIORITIZED)
def test_repeated_index_last_write_wins(kind, device):
    rb = make(kind, device, alpha=1.0, eps=1e-8)
    rb.extend(transitions(4))
    rb.update_priority(torch.tensor([2, 0, 2, 1, 2, 3]), torch.tensor([9.0, 1.0, 7.0, 1.0, 3.0, 1.0]))
    raw = rb.sampler.core.state.raw[:4].cpu().numpy()
    np.testing.assert_allclose(raw, [1.0, 1.0, 3.0, 1.0])


@pytest.mark.parametrize("kind", PRIORITIZED)
def test_invalid_priorities_are_clamped_and_counted(kind, device):
    rb = make(kind, device, alpha=1.0, eps=1e-8)
    rb.extend(transitions(5))
    rb.update_priority(torch.arange(5), torch.tensor([2.0, 5.0, 1.0, 1.0, 1.0]))
    rb.update_priority(torch.tensor([0, 1, 2]), torch.tensor([float("nan"), float("inf"), -3.0]))
    raw = rb.sampler.core.state.raw[:5].cpu().numpy()
    np.testing.assert_allclose(raw, [5.0, 5.0, 0.0, 1.0, 1.0])  # NaN, +inf -> max (5); negative -> 0
    assert int(rb.sampler.clamped_priority_count) == 3
    assert torch.isfinite(rb.sampler.probabilities()).all()


@pytest.mark.parametrize("kind", PRIORITIZED)
def test_device_index_out_of_range_is_dropped_and_counted(kind, device):
    rb = make(kind, device, alpha=1.0)
    rb.extend(transitions(4))
    rb.update_priority(torch.arange(4), torch.ones(4))
    probs = rb.sampler.probabilities().clone()
    # a device tensor is not read on the host (no sync): bad values are ignored and counted
    rb.sampler.core.write(torch.tensor([7, -2], device=device), torch.tensor([9.0, 9.0], device=device), 4)
    torch.testing.assert_close(rb.sampler.probabilities(), probs)
    assert int(rb.sampler.dropped_index_count) == 2


@pytest.mark.parametrize("kind", SAMPLERS)
def test_state_dict_round_trip_gives_identical_next_samples(kind, device, tmp_path):
    rb = make(kind, device, seed=3)
    rb.extend(transitions(12))
    if kind in PRIORITIZED:
        rb.update_priority(torch.arange(12), torch.linspace(0.1, 3.0, 12))
    rb.sample()
    state = rb.state_dict()
    torch.save(state, tmp_path / "rb.pt")
    expected = [rb.sample()["index"].cpu() for _ in range(3)]

    fresh = make(kind, device, seed=99)  # different generator: the checkpoint must restore it
    fresh.load_state_dict(torch.load(tmp_path / "rb.pt", weights_only=False))
    got = [fresh.sample()["index"].cpu() for _ in range(3)]
    for a, b in zip(expected, got):
        torch.testing.assert_close(a, b)
    assert len(fresh) == 12


@pytest.mark.parametrize("kind", PRIORITIZED)
def test_sampler_dumps_loads_round_trip(kind, device, tmp_path):
    rb = make(kind, device, seed=5)
    rb.extend(transitions(9))
    rb.update_priority(torch.arange(9), torch.rand(9, generator=torch.Generator().manual_seed(1)))
    rb.sampler.dumps(tmp_path / "s")
    rb.storage.dumps(tmp_path / "s")
    expected = rb.sampler.sample(rb.storage, 16)[0].cpu()
    other = make(kind, device, seed=6)
    other.storage.loads(tmp_path / "s")
    other.sampler.loads(tmp_path / "s")
    torch.testing.assert_close(other.sampler.sample(other.storage, 16)[0].cpu(), expected)
    torch.testing.assert_close(other.sampler.probabilities(), rb.sampler.probabilities())


@pytest.mark.parametrize("kind", SAMPLERS)
def test_same_generator_seed_reproduces_draws(kind, device):
    a, b = make(kind, device, seed=11), make(kind, device, seed=11)
    for rb in (a, b):
        rb.extend(transitions(10))
    for _ in range(3):
        torch.testing.assert_close(a.sample()["index"], b.sample()["index"])
    c = make(kind, device, seed=12)
    c.extend(transitions(10))
    assert any(not torch.equal(c.sample()["index"], a.sample()["index"]) for _ in range(3))


def test_alpha_setter_is_exact(device):
    rb = make("proportional", device, alpha=0.5, eps=1e-6)
    rb.extend(transitions(5))
    raw = np.array([0.1, 1.0, 2.0, 3.0, 10.0])
    rb.update_priority(torch.arange(5), torch.tensor(raw, dtype=torch.float32))
    rb.sampler.alpha = 0.9
    stored = (raw.astype(np.float32).astype(np.float64) + 1e-6) ** 0.9
    np.testing.assert_allclose(rb.sampler.probabilities().cpu().numpy()[:5], stored / stored.sum(), rtol=1e-6)
    rb.sampler.alpha = 0.0  # uniform
    np.testing.assert_allclose(rb.sampler.probabilities().cpu().numpy()[:5], 0.2, rtol=1e-6)


def test_is_instance_of_torchrl_classes_and_update_tensordict_priority(device):
    rb = make("proportional", device, alpha=1.0, eps=1e-8)
    assert isinstance(rb, TensorDictPrioritizedReplayBuffer)
    assert isinstance(rb.sampler, PrioritizedSampler)
    rb.extend(transitions(4))
    batch = rb.sample()
    batch["td_error"] = torch.full((8,), 3.0, device=device)
    rb.update_tensordict_priority(batch)
    touched = batch["index"].unique().cpu()
    np.testing.assert_allclose(rb.sampler.core.state.raw[touched].cpu().numpy(), 3.0)


def test_drop_in_buffer_accepts_torchrl_lazy_storage(device):
    from torchrl.data import LazyTensorStorage

    rb = GPUPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(32), batch_size=4,
                                    device=device)
    assert isinstance(rb.storage, GPUTensorStorage)
    rb.extend(transitions(7))
    assert rb.sample()["priority_weight"].shape == (4,)


def test_constructor_arguments_are_validated():
    for kwargs, word in (({"max_capacity": 0, "alpha": 0.5, "beta": 0.5}, "max_capacity"),
                         ({"max_capacity": 4, "alpha": -1, "beta": 0.5}, "alpha"),
                         ({"max_capacity": 4, "alpha": 0.5, "beta": -0.1}, "beta"),
                         ({"max_capacity": 4, "alpha": 0.5, "beta": 0.5, "eps": 0}, "eps")):
        with pytest.raises(ValueError, match=word):
            GPUPrioritizedSampler(device="cpu", **kwargs)
    with pytest.raises(ValueError, match="sort_every"):
        GPURankBasedSampler(4, 0.5, 0.5, sort_every=0, device="cpu")
    with pytest.raises(ValueError, match="sampler"):
        make_replay_buffer(4, 2, sampler="lifo", device="cpu")
    with pytest.raises(ValueError, match="capacity"):
        make_replay_buffer(0, 2, device="cpu")
    with pytest.raises(ValueError, match="batch_size"):
        make_replay_buffer(4, 0, device="cpu")
    with pytest.raises(ValueError, match="max_size"):
        GPUTensorStorage(0, device="cpu")


def test_nested_keys_survive_a_state_dict_round_trip(device):
    """('next', 'observation') must come back nested, and the restored buffer must accept extends."""
    def nested(n, start=0):
        td = transitions(n, start)
        td["next"] = TensorDict({"observation": td["observation"] + 1}, [n])
        return td

    rb = make("proportional", device)
    rb.extend(nested(5))
    fresh = make("proportional", device)
    fresh.load_state_dict(rb.state_dict())
    fresh.extend(nested(3, start=5))
    got = fresh.storage.get(torch.arange(8, device=device))
    np.testing.assert_array_equal(got["next", "observation"][:, 0].cpu().numpy(), np.arange(8) + 1)


@pytest.mark.parametrize("kind", SAMPLERS)
def test_empty_extend_changes_nothing(kind, device):
    rb = make(kind, device)
    rb.extend(transitions(4))
    rb.extend(transitions(0))
    assert len(rb) == 4
    assert ((rb.sample()["index"] >= 0) & (rb.sample()["index"] < 4)).all()
    if kind == "proportional":  # four items at the default priority: uniform
        np.testing.assert_allclose(rb.sampler.probabilities().cpu().numpy()[:4], 0.25)


@pytest.mark.parametrize("kind", PRIORITIZED)
def test_alpha_change_updates_state_in_place(kind, device):
    """A CUDA graph captured before an alpha change keeps reading the sampler's tensors: they must be
    updated in place, not replaced."""
    rb = make(kind, device, alpha=0.5)
    rb.extend(transitions(6))
    s = rb.sampler
    tensors = [s.core.state.leaves, s.core.state.block_sum, s.core.state.block_min, s.core.state.raw] + (
        [s.core.rule.cdf] if kind == "rank" else [])
    before = [t.data_ptr() for t in tensors]
    s.alpha = 0.9
    assert [t.data_ptr() for t in tensors] == before
    fresh = [s.core.state.leaves, s.core.state.block_sum, s.core.state.block_min, s.core.state.raw] + (
        [s.core.rule.cdf] if kind == "rank" else [])
    assert all(a is b for a, b in zip(tensors, fresh))


@pytest.mark.parametrize("sampler", ["proportional", "rank"])
def test_factory_rejects_unknown_sampler_options_by_name(sampler):
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['foo'\].*" + sampler):
        make_replay_buffer(16, 4, sampler=sampler, device="cpu", foo=1)


def test_factory_passes_inherited_sampler_options_to_the_rank_sampler():
    """The rank sampler forwards **kwargs to the proportional one: its options (backend, seed) are accepted."""
    rb = make_replay_buffer(16, 4, sampler="rank", device="cpu", backend="reference", seed=3, sort_every=2)
    from lightning_per.ops import reference

    assert rb.sampler.core.rule.sort_every == 2 and rb.sampler.core.ops is reference


def test_uniform_update_priority_is_a_silent_no_op():
    import warnings

    rb = make_replay_buffer(16, 4, sampler="uniform", device="cpu")
    rb.extend(TensorDict({"x": torch.arange(8.0)}, batch_size=[8]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rb.update_priority(torch.arange(4), torch.ones(4)) is None


def _mixed(n: int, start: int = 0) -> TensorDict:
    """Transitions with every element size 1..8 and odd field sizes (alignment and padding cases)."""
    g = torch.Generator().manual_seed(start)
    return TensorDict({
        "pixels": torch.randint(0, 256, (n, 3, 5, 7), generator=g, dtype=torch.uint8),
        "done": torch.rand(n, 1, generator=g) < 0.5,
        "reward": torch.randn(n, generator=g, dtype=torch.float64),
        "action": torch.randint(-9, 9, (n,), generator=g),
        "half": torch.randn(n, 3, generator=g).to(torch.float16),
        "observation": torch.randn(n, 5, generator=g),
        "next": TensorDict({"observation": torch.randn(n, 5, generator=g)}, [n]),
    }, [n])


def test_packed_rows_hold_every_field_at_an_aligned_offset():
    s = GPUTensorStorage(8, device="cpu", packed=True)
    s.set(torch.arange(3), _mixed(3))
    layout = s.ring.layout
    fields = [(off, nbytes, torch.empty((), dtype=dtype).element_size()) for off, nbytes, dtype, _ in layout.values()]
    raw = sum(nbytes for _, nbytes, _ in fields)  # 105 + 1 + 8 + 8 + 6 + 20 + 20 = 168 bytes per transition
    assert raw == 168 and s.ring.rows.shape == (8, 168 // 8) and s.nbytes == 8 * 168
    spans = sorted((off, off + nbytes) for off, nbytes, _ in fields)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # no overlap
    assert all(off % es == 0 for off, _, es in fields)
    for v in s._storage.values(include_nested=True, leaves_only=True):  # every key is a view into the ring
        assert v.untyped_storage().data_ptr() == s.ring.rows.untyped_storage().data_ptr()


@pytest.mark.parametrize("packed", [True, False])
def test_reads_return_the_written_transitions(device, packed):
    s = GPUTensorStorage(10, device=device, packed=packed)
    data = _mixed(10)
    s.set(torch.arange(10), data)
    s.set(torch.tensor([3, 7]), _mixed(2, start=5))  # overwrite two slots
    data[torch.tensor([3, 7])] = _mixed(2, start=5)
    index = torch.tensor([7, 0, 3, 3, 9], device=device)
    got = s.get(index).cpu()
    want = data[index.cpu()]
    for key in want.keys(include_nested=True, leaves_only=True):
        assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape, key
        assert torch.equal(got[key], want[key]), key
    assert (s.ring.rows is not None) == packed


@pytest.mark.parametrize("src_packed, dst_packed", [(True, True), (True, False), (False, True)])
def test_packed_and_per_key_states_load_into_each_other(tmp_path, src_packed, dst_packed):
    src = GPUTensorStorage(6, device="cpu", packed=src_packed)
    data = _mixed(6)
    src.set(torch.arange(6), data)
    path = tmp_path / "s"
    src.dumps(path)
    dst = GPUTensorStorage(6, device="cpu", packed=dst_packed)
    dst.loads(path)
    assert len(dst) == 6 and (dst.ring.rows is not None) == dst_packed
    got = dst.get(torch.arange(6))
    for key in data.keys(include_nested=True, leaves_only=True):
        assert torch.equal(got[key], data[key]), key
    dst.set(torch.tensor([0]), _mixed(1, start=9))  # still writable, through the views when packed
    assert torch.equal(dst.get(torch.tensor([0]))["observation"], _mixed(1, start=9)["observation"])


def test_default_batches_are_plain_tensors_that_torch_save_accepts(tmp_path):
    """A sampled batch's fields are contiguous tensors of their own, packed or not."""
    rb = make("proportional", "cpu")
    rb.extend(_mixed(16))
    batch = rb.sample()
    assert all(v.is_contiguous() for v in batch.values(include_nested=True, leaves_only=True))
    torch.save(batch.to_dict(), tmp_path / "batch.pt")
    assert batch["observation"].view(-1).numel() == 8 * 5
    packed = make("proportional", "cpu", packed=True)
    packed.extend(transitions(16))  # flat keys: one gather of rows, then each field copied out of the block
    batch = packed.sample()
    assert packed.storage.ring.rows is not None
    assert all(v.is_contiguous() for v in batch.values(include_nested=True, leaves_only=True))
    torch.save(batch, tmp_path / "packed.pt")


@pytest.mark.parametrize("src_packed", [False, True])
def test_a_state_of_another_capacity_is_refused_before_anything_changes(src_packed):
    src = GPUTensorStorage(8, device="cpu", packed=src_packed)
    src.set(torch.arange(8), transitions(8))
    dst = GPUTensorStorage(4, device="cpu")
    with pytest.raises(ValueError, match="8 slots, this one max_size=4"):
        dst.load_state_dict(src.state_dict())
    assert len(dst) == 0 and not dst.initialized


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")
def test_a_cuda_device_without_cuda_is_a_clear_error():
    with pytest.raises(ValueError, match="device='cuda' but CUDA is not available"):
        make_replay_buffer(16, 4, device="cuda")
    with pytest.raises(ValueError, match="device='cuda:0' but CUDA is not available"):
        GPUTensorStorage(16, device="cuda:0")


def test_every_sampler_of_the_factory_accepts_eager_graphs():
    for kind in ("proportional", "rank", "uniform"):
        rb = make_replay_buffer(16, 4, sampler=kind, device="cpu", eager_graphs=False)
        rb.extend(transitions(16))
        assert rb.sample()["index"].shape == (4,)


@pytest.mark.parametrize("src,dst", [("proportional", "rank"), ("rank", "proportional"),
                                     ("proportional", "uniform"), ("uniform", "proportional")])
def test_a_checkpoint_of_another_sampler_kind_is_refused(src, dst):
    a = make_replay_buffer(16, 4, sampler=src, device="cpu", seed=1)
    b = make_replay_buffer(16, 4, sampler=dst, device="cpu", seed=2)
    with pytest.raises(ValueError, match="sampler checkpoint|not a prioritized sampler checkpoint"):
        b.sampler.load_state_dict(a.sampler.state_dict())


@pytest.mark.parametrize("sampler", ["proportional", "rank", "uniform"])
def test_every_sampler_replays_draws_with_get_and_set_rng_state(sampler):
    rb = make_replay_buffer(64, 8, sampler=sampler, device="cpu", seed=3)
    rb.extend(TensorDict({"x": torch.arange(64.0)}, [64]))
    state = rb.sampler.get_rng_state()
    first = rb.sample()["index"]
    rb.sampler.set_rng_state(state)
    assert torch.equal(rb.sample()["index"], first)
    with pytest.raises(TypeError, match="get_rng_state"):
        rb.sampler.set_rng_state(torch.Generator().get_state())  # a generator's own state
    with pytest.raises(ValueError, match="get_rng_state"):
        rb.sampler.set_rng_state(rb.sampler.state_dict())  # a checkpoint, not an RNG state
