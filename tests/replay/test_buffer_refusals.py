"""A refused replay checkpoint changes nothing: storage, writer and sampler stay as they were.

TorchRL's ``ReplayBuffer.load_state_dict`` / ``loads`` load the storage before the sampler, so a sampler
refusing its part (another kind, another schema) used to leave the storage replaced (50 -> 100 rows) under
the old cursor and priorities. Every expected value here comes from before the call: the rows written,
the cursor they imply, and a twin buffer built and filled the same way that never sees the refused load
(its next draws are what the victim's must be).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ListStorage, TensorDictReplayBuffer

from lightning_per import (
    GPUPrioritizedReplayBuffer,
    GPUPrioritizedSampler,
    GPURankBasedSampler,
    GPUTensorStorage,
    make_replay_buffer,
)
from lightning_per.integrity import seal_directory

KINDS = ["proportional", "rank", "uniform"]
CLASS = {"proportional": "GPUPrioritizedSampler", "rank": "GPURankBasedSampler", "uniform": "GPURandomSampler"}
CAPACITY, FILLED, OTHER = 128, 50, 100


def rows(n: int, start: int = 0, obs: int = 3) -> TensorDict:
    """n distinguishable transitions: every field of row i holds start + i (observations of ``obs`` values)."""
    i = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict({"observation": i[:, None].expand(n, obs).clone(), "reward": i.clone()}, [n])


def filled_as(kind: str, packed: bool, n: int = FILLED, start: int = 0, seed: int = 0, obs: int = 3):
    rb = make_replay_buffer(CAPACITY, 8, sampler=kind, device="cpu", packed=packed,
                            generator=torch.Generator().manual_seed(seed))
    rb.extend(rows(n, start, obs))
    rb.update_priority(torch.arange(n), torch.linspace(0.1, 5.0, n))  # a no-op for uniform
    return rb


def filled(kind: str, n: int = FILLED, start: int = 0, seed: int = 0):
    return filled_as(kind, False, n, start, seed)


def ring(rb) -> dict[str, torch.Tensor]:
    """Every slot of the storage (filled or not), copied."""
    got = rb.storage.get(torch.arange(CAPACITY))
    return {k: v.clone() for k, v in got.items()}


def draws(rb, n: int = 3) -> list[torch.Tensor]:
    out = []
    for _ in range(n):
        batch = rb.sample()
        out.append(batch["index"].clone())
        if "priority_weight" in batch.keys():
            out.append(batch["priority_weight"].clone())
    return out


def assert_unchanged(rb, twin, before_ring) -> None:
    expected_rows = rows(FILLED)
    assert len(rb) == FILLED
    assert rb._writer._cursor == FILLED and rb._writer._write_count == FILLED
    after = ring(rb)
    for key, value in before_ring.items():
        assert torch.equal(after[key], value), key
    for key in ("observation", "reward"):  # the filled slots hold the rows written, as before the call
        assert torch.equal(after[key][:FILLED], expected_rows[key]), key
    assert torch.equal(rb.sampler.get_rng_state()["generator"], twin.sampler.get_rng_state()["generator"])
    for got, want in zip(draws(rb), draws(twin), strict=True):
        assert torch.equal(got, want)


def victim_and_twin(kind: str):
    rb, twin = filled(kind), filled(kind)
    return rb, twin, ring(rb)


def _bump_sampler_version(state: dict) -> dict:
    state["_sampler"] = dict(state["_sampler"], _schema_version=999)
    return state


PAIRS = list(itertools.permutations(KINDS, 2))


@pytest.mark.parametrize("src,dst", PAIRS)
def test_load_state_dict_of_another_sampler_kind_changes_nothing(src, dst):
    rb, twin, before = victim_and_twin(dst)
    state = filled(src, OTHER, start=1000, seed=7).state_dict()
    with pytest.raises(ValueError, match=f"sampler checkpoint is from {CLASS[src]}; this buffer's sampler is "
                                         f"{CLASS[dst]}"):
        rb.load_state_dict(state)
    assert_unchanged(rb, twin, before)


@pytest.mark.parametrize("src,dst", PAIRS)
def test_loads_of_another_sampler_kind_changes_nothing(src, dst, tmp_path):
    filled(src, OTHER, start=1000, seed=7).dumps(tmp_path / "rb")
    rb, twin, before = victim_and_twin(dst)
    with pytest.raises(ValueError, match=f"sampler checkpoint is from {CLASS[src]}"):
        rb.loads(tmp_path / "rb")
    assert_unchanged(rb, twin, before)


@pytest.mark.parametrize("kind", KINDS)
def test_load_state_dict_of_a_newer_sampler_schema_changes_nothing(kind):
    rb, twin, before = victim_and_twin(kind)
    state = _bump_sampler_version(filled(kind, OTHER, start=1000, seed=7).state_dict())
    with pytest.raises(ValueError, match=r"sampler checkpoint schema 999 is newer than this code.s \(it reads 1\)"):
        rb.load_state_dict(state)
    assert_unchanged(rb, twin, before)


@pytest.mark.parametrize("kind", KINDS)
def test_loads_of_a_newer_sampler_schema_changes_nothing(kind, tmp_path):
    filled(kind, OTHER, start=1000, seed=7).dumps(tmp_path / "rb")
    file = tmp_path / "rb" / "sampler" / "sampler.pt"
    saved = torch.load(file, weights_only=False)
    saved["_schema_version"] = 999
    torch.save(saved, file)
    seal_directory(tmp_path / "rb", "replay_dump")  # a consistent dump of a newer sampler, not a damaged one
    rb, twin, before = victim_and_twin(kind)
    with pytest.raises(ValueError, match=r"sampler checkpoint schema 999 is newer than this code.s \(it reads 1\)"):
        rb.loads(tmp_path / "rb")
    assert_unchanged(rb, twin, before)


@pytest.mark.parametrize("kind", KINDS)
def test_other_refusals_change_nothing(kind, tmp_path):
    """What the sampler's and writer's loads would only meet after the storage was replaced."""
    rb, twin, before = victim_and_twin(kind)
    src = filled(kind, OTHER, start=1000, seed=7)
    state = src.state_dict()
    with pytest.raises(ValueError, match=r"lacks \['_writer'\]"):
        rb.load_state_dict({k: v for k, v in state.items() if k != "_writer"})
    with pytest.raises(ValueError, match="no '_cursor'"):
        rb.load_state_dict(dict(state, _writer={}))
    bad_rng = dict(state["_sampler"], rng=dict(state["_sampler"]["rng"], generator=torch.zeros(3, dtype=torch.uint8)))
    with pytest.raises(ValueError, match="generator state does not fit"):
        rb.load_state_dict(dict(state, _sampler=bad_rng))
    if kind != "uniform":
        short = dict(state["_sampler"], raw=state["_sampler"]["raw"][:-1])
        with pytest.raises(ValueError, match="'raw' must be a 1-d tensor of more than max_capacity"):
            rb.load_state_dict(dict(state, _sampler=short))
        with pytest.raises(ValueError, match=r"lacks \['eps'\]"):
            rb.load_state_dict(dict(state, _sampler={k: v for k, v in state["_sampler"].items() if k != "eps"}))
    with pytest.raises(ValueError, match="replay checkpoint schema 2 is newer"):
        rb.load_state_dict(dict(state, _lightning_per_schema=2))
    with pytest.raises(TypeError, match="state_dict must be a replay buffer's state_dict"):
        rb.load_state_dict([state])
    src.dumps(tmp_path / "rb")
    (tmp_path / "rb" / "buffer_metadata.json").unlink()
    seal_directory(tmp_path / "rb", "replay_dump")  # (the manifest's own refusal is tested in test_integrity.py)
    with pytest.raises(FileNotFoundError, match="buffer_metadata.json"):
        rb.loads(tmp_path / "rb")
    (tmp_path / "rb" / "sampler" / "sampler.pt").unlink()
    seal_directory(tmp_path / "rb", "replay_dump")
    with pytest.raises(FileNotFoundError, match="no sampler checkpoint"):
        rb.loads(tmp_path / "rb")
    assert_unchanged(rb, twin, before)


@pytest.mark.parametrize("kind", KINDS)
def test_accepted_checkpoints_still_load(kind, tmp_path):
    src = filled(kind, OTHER, start=1000, seed=7)
    src.dumps(tmp_path / "rb")
    state = src.state_dict()
    want_rows, want_draws = ring(src), draws(src)
    for load in (lambda rb: rb.load_state_dict(state), lambda rb: rb.loads(tmp_path / "rb")):
        rb = filled(kind)
        load(rb)
        assert len(rb) == OTHER and rb._writer._cursor == OTHER
        got = ring(rb)
        assert all(torch.equal(got[k], v) for k, v in want_rows.items())
        for got_draw, want in zip(draws(rb), want_draws, strict=True):
            assert torch.equal(got_draw, want)


def test_a_list_storage_is_a_clear_error():
    with pytest.raises(TypeError, match=r"storage must be None, a GPUTensorStorage or a TorchRL tensor storage "
                                        r"\(LazyTensorStorage, LazyMemmapStorage, TensorStorage.*got ListStorage"):
        GPUPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=ListStorage(1000))


@pytest.mark.parametrize("sampler_cls", [GPUPrioritizedSampler, GPURankBasedSampler])
def test_a_storage_larger_than_the_sampler_is_refused_at_the_first_slot_past_it(sampler_cls):
    """TensorDictReplayBuffer's default storage is ListStorage(1000): a sampler of 5 under it would write
    priorities past its slots (TorchRL's tree, rounded up to 8 leaves, never draws slots 8 and up)."""
    sampler = sampler_cls(5, alpha=0.7, beta=0.5, device="cpu")
    rb = TensorDictReplayBuffer(sampler=sampler, batch_size=4)
    rb.extend(rows(5))  # exactly the sampler's slots: fine
    before = [t.clone() for t in sampler.capture_view(None, None).tensors]
    with pytest.raises(ValueError, match=r"the storage holds 8 items but \w+ has max_capacity=5 slots: give the "
                                         r"sampler the storage's max_size \(1000\)"):
        rb.extend(rows(3, start=5))
    assert all(torch.equal(a, b) for a, b in zip(sampler.capture_view(None, None).tensors, before, strict=True))


@pytest.mark.parametrize("make_storage", [lambda: None, lambda: LazyTensorStorage(64), lambda: LazyMemmapStorage(64)],
                         ids=["none", "lazy", "memmap"])
def test_tensor_storages_still_work(make_storage):
    storage = make_storage()
    rb = GPUPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=storage, batch_size=4, device="cpu")
    assert isinstance(rb.storage, GPUTensorStorage) == (not isinstance(storage, LazyMemmapStorage))
    rb.extend(rows(20))
    batch = rb.sample()
    assert torch.equal(batch["reward"], batch["index"].float())


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_a_bad_batch_size_on_a_uniform_buffer_is_one_clear_error(bad, recwarn):
    rb = filled("uniform")
    with pytest.raises(ValueError, match=f"batch_size must be an int >= 1, got {bad!r}"):
        rb.sample(bad)
    assert not [w for w in recwarn if "batch_size" in str(w.message)]  # TorchRL's warning never reached




def _storage_corruptions(state: dict, packed: bool) -> list[tuple[str, dict]]:
    """(expected message, corrupted buffer state) pairs: the storage part and the buffer's own entries."""
    storage = state["_storage"]
    out = [("length must be an int in", dict(state, _storage=dict(storage, _len=10 ** 6))),
           ("length must be an int in", dict(state, _storage=dict(storage, _len=-5))),
           (r"storage checkpoint lacks \['_len'\]", dict(state, _storage={k: v for k, v in storage.items()
                                                                          if k != "_len"})),
           ("holds 100 transitions but says it is not initialized",
            dict(state, _storage=dict(storage, initialized=False))),
           ("'initialized' must be a bool", dict(state, _storage=dict(storage, initialized="yes"))),
           ("writer cursor must be an int", dict(state, _writer=dict(state["_writer"], _cursor="7"))),
           ("batch_size must be None or an int", dict(state, _batch_size="abc"))]
    if packed:
        out.append(("does not fit its", dict(state, _storage=dict(storage, packed_rows=storage["packed_rows"][:, :1]))))
    return out


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_storage_refusals_change_nothing(kind, packed):
    """Another transition shape, a length outside the ring, a layout that does not fit its rows, a bad cursor
    or batch size: refused by the storage / buffer checks before TorchRL loads anything."""
    rb, twin = filled_as(kind, packed), filled_as(kind, packed)
    before = ring(rb)
    other = filled_as(kind, packed, OTHER, start=1000, seed=7, obs=4)  # observation (4,) vs the victim's (3,)
    with pytest.raises(ValueError, match="transitions differ from this storage's in"):
        rb.load_state_dict(other.state_dict())
    state = filled_as(kind, packed, OTHER, start=1000, seed=7).state_dict()
    for match, bad in _storage_corruptions(state, packed):
        with pytest.raises(ValueError, match=match):
            rb.load_state_dict(bad)
    if kind != "uniform":
        nan = dict(state["_sampler"], raw=torch.full_like(state["_sampler"]["raw"], float("nan")))
        with pytest.raises(ValueError, match="raw priorities must be finite"):
            rb.load_state_dict(dict(state, _sampler=nan))
        sampler, top = state["_sampler"], float(state["_sampler"]["raw"].max())
        for max_raw in (float("nan"), float("inf"), -5.0, top / 2):  # a running max below a written priority
            with pytest.raises(ValueError, match=r"'max_raw' must be -inf \(nothing written\) or finite and >= every "
                                                 r"written raw priority"):
                rb.load_state_dict(dict(state, _sampler=dict(sampler, max_raw=torch.tensor(max_raw))))
        with pytest.raises(ValueError, match=r"'n_clamped' must be an int64 count >= 0"):
            rb.load_state_dict(dict(state, _sampler=dict(sampler, n_clamped=torch.tensor(-1))))
    assert_unchanged(rb, twin, before)


@pytest.mark.parametrize("packed", [False, True])
def test_loads_of_another_transition_shape_changes_nothing(packed, tmp_path):
    filled_as("proportional", packed, OTHER, start=1000, seed=7, obs=4).dumps(tmp_path / "rb")
    rb, twin = filled_as("proportional", packed), filled_as("proportional", packed)
    before = ring(rb)
    with pytest.raises(ValueError, match="transitions differ from this storage's in"):
        rb.loads(tmp_path / "rb")
    assert_unchanged(rb, twin, before)


@pytest.mark.parametrize("kind", KINDS)
def test_extending_with_a_plain_dict_says_how_to_wrap_it_and_writes_nothing(kind):
    rb = make_replay_buffer(8, 2, sampler=kind, device="cpu")
    rb.extend(rows(3))
    with pytest.raises(ValueError, match=r"data must be a TensorDict, got dict; wrap a dict of \(n, \.\.\.\) tensors "
                                         r"as tensordict\.TensorDict\(data, batch_size=\[4\]\)"):
        rb.extend(rows(4).to_dict())
    assert len(rb) == 3 and rb._writer._cursor == 3
    # the advice works: the wrapped dict is stored
    rb.extend(TensorDict(rows(4, start=3).to_dict(), batch_size=[4]))
    assert len(rb) == 7 and torch.equal(rb[:]["reward"], torch.arange(7.0))


@pytest.mark.parametrize("sampler", ["proportional", "rank", "prioritized_slice"])
def test_make_replay_buffer_takes_reduction(sampler):
    """``reduction=`` reaches the buffer: a (B, 3) td_error sets each slot's priority to the mean of its row."""
    kw = {"slice_len": 2} if sampler == "prioritized_slice" else {}
    rb = make_replay_buffer(8, 4, sampler=sampler, device="cpu", reduction="mean", seed=0, **kw)
    rb.extend(TensorDict({"x": torch.arange(8.0), ("next", "done"): torch.zeros(8, 1, dtype=torch.bool)}, [8]))
    td_error = torch.tensor([[1.0, 2.0, 6.0], [0.5, 0.5, 2.0], [3.0, 3.0, 3.0], [9.0, 0.0, 0.0]])
    rb.update_tensordict_priority(TensorDict({"index": torch.tensor([0, 2, 4, 6]), "td_error": td_error}, [4]))
    assert rb._sampler.reduction == "mean"
    assert rb._sampler.core.state.raw[[0, 2, 4, 6]].tolist() == [3.0, 1.0, 3.0, 3.0]  # the row means


def test_make_replay_buffer_unknown_uniform_option_is_a_type_error_listing_the_options():
    with pytest.raises(TypeError,
                       match=r"\['backend'\] for sampler='uniform'; its options are \['eager_graphs', 'seed'\]"):
        make_replay_buffer(8, 4, sampler="uniform", device="cpu", backend="reference")


@pytest.mark.parametrize("capacity", [200, 30])
@pytest.mark.parametrize("prioritized", [False, True])
def test_a_slice_sampler_of_another_size_than_its_storage_is_refused_by_name(capacity, prioritized):
    """Slices wrap at the ring's end: a slice sampler must have the storage's max_size slots."""
    from lightning_per import GPUPrioritizedSliceSampler, GPUSliceSampler
    from lightning_per.replay import GPURoundRobinWriter

    sampler = (GPUPrioritizedSliceSampler(capacity, 0.6, 0.4, slice_len=4, device="cpu", seed=0) if prioritized
               else GPUSliceSampler(capacity, slice_len=4, device="cpu", seed=0))
    rb = TensorDictReplayBuffer(storage=GPUTensorStorage(100, device="cpu"), sampler=sampler,
                                writer=GPURoundRobinWriter(), batch_size=16)
    data = TensorDict({"obs": torch.arange(150.0), ("next", "done"): (torch.arange(150) % 10 == 9)[:, None]}, [150])
    with pytest.raises(ValueError, match=rf"has {capacity} slots but the storage's max_size is 100"):
        rb.extend(data)
    with pytest.raises(ValueError, match="max_size is 100"):
        sampler.sample(rb.storage, 16)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where CUDA is missing")
def test_capture_on_a_cuda_device_without_cuda_is_a_value_error():
    from lightning_per import graphs

    update = graphs.capture(lambda: None, state=[], device="cuda")  # the capturability checks run here
    with pytest.raises(ValueError, match="CUDA is not available"):
        update()
    assert update.calls == 0
    assert graphs.capture(lambda: None, state=[], device="cuda", enabled=False).graphed is False


@pytest.mark.torchrl_tree
def test_loading_torchrl_sampler_state_names_torchrl_and_the_way_out():
    from torchrl.data import PrioritizedSampler

    theirs = PrioritizedSampler(8, 0.6, 0.4)
    theirs.update_priority(torch.arange(4), torch.ones(4))
    with pytest.raises(ValueError, match="TorchRL's PrioritizedSampler.*lightning_per.from_torchrl"):
        GPUPrioritizedSampler(8, 0.6, 0.4, device="cpu").load_state_dict(theirs.state_dict())
