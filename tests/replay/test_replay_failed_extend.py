"""A batch the storage cannot take is refused before anything moves, and the buffer keeps working.

One failed ``extend`` (a sparse observation, a tensor on the ``"meta"`` device) used to leave the writer's cursor and
write count three slots ahead of the storage's length, so every later ``extend`` failed. Each test takes a snapshot
of everything a write touches (length, cursor, write count, generations, the sampler's priorities, tree sums and
RNG, every stored slot), feeds a bad batch, and checks the snapshot is unchanged; then the next good batch must land
at the slots right after the filled ones, and the stored rows must equal what TorchRL's own
``TensorDictReplayBuffer`` over a ``LazyTensorStorage`` holds after the same good batches (TorchRL's buffer refuses
these batches too, with torch's raw error, but moves its cursor and length over rows it never wrote).
"""

from __future__ import annotations

import importlib.metadata

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from lightning_per import GPUPrioritizedReplayBuffer, make_replay_buffer
from lightning_per.replay import GPURoundRobinWriter

#: TorchRL's writers keep generation stamps (``generations_of``, ``track_generations``) from 0.14 on
GENERATIONS = tuple(int(p) for p in importlib.metadata.version("torchrl").split(".")[:2]) >= (0, 14)

CAPACITY, FILLED = 32, 10
KINDS = ["proportional", "rank", "uniform", "slice"]


def rows(n: int, start: int = 0) -> TensorDict:
    """n distinguishable transitions (row i holds start + i), each its own one-step trajectory."""
    i = torch.arange(start, start + n, dtype=torch.float32)
    data = TensorDict({"observation": i[:, None].expand(n, 4).clone(), "reward": i.clone(),
                       "action": (i.long() % 3)}, [n])
    data.set(("next", "done"), torch.ones(n, 1, dtype=torch.bool))
    return data


def bad_batches(start: int = 100) -> dict[str, tuple[TensorDict, type, str]]:
    """Three transitions the storage cannot take: ``{name: (batch, error type, message pattern)}``."""
    good = rows(3, start)
    return {
        "sparse": (good.clone().set("observation", good["observation"].to_sparse()), TypeError,
                   r"data\['observation'\] has layout torch.sparse_coo: the storage takes dense, strided tensors"),
        "meta": (good.clone().set("observation", good["observation"].to("meta")), ValueError,
                 r"data\['observation'\] is on the 'meta' device, which holds no data"),
        "dtype": (good.clone().set("reward", good["reward"].double()), TypeError,
                  r"data\['reward'\] has dtype torch.float64, the storage holds torch.float32"),
        "shape": (good.clone().set("observation", torch.zeros(3, 5)), ValueError,
                  r"data\['observation'\] has per-item shape \(5,\), the storage holds \(4,\)"),
        "missing": (good.exclude("reward"), ValueError, r"missing \['reward'\]"),
    }


def snapshot(rb) -> dict:
    """Everything a write may touch, copied."""
    storage, sampler, writer = rb.storage, rb.sampler, rb.writer
    out = {"len": len(rb), "storage_len": len(storage), "cursor": writer._cursor, "write_count": rb.write_count,
           "slots": {k: v.clone() for k, v in storage.get(torch.arange(CAPACITY)).items(include_nested=True,
                                                                                        leaves_only=True)}}
    core = getattr(sampler, "core", None)  # the prioritized samplers' state: priorities, tree sums and minima
    out["tree"] = tuple(t.clone() for t in core.state.tensors()) if core is not None else ()
    out["sampler"] = {k: v.clone() for k, v in sampler.state_dict().items() if isinstance(v, torch.Tensor)}
    out["rng"] = sampler.get_rng_state()["generator"].clone() if hasattr(sampler, "get_rng_state") else None
    out["generations"] = writer.generations_of(torch.arange(CAPACITY)) if GENERATIONS else None
    return out


def assert_same(got: dict, want: dict) -> None:
    for key in ("len", "storage_len", "cursor", "write_count"):
        assert got[key] == want[key], key
    for part in ("slots", "sampler"):
        assert got[part].keys() == want[part].keys(), part
        for key, value in want[part].items():
            assert torch.equal(got[part][key], value), (part, key)
    assert len(got["tree"]) == len(want["tree"])
    for a, b in zip(got["tree"], want["tree"], strict=True):
        assert torch.equal(a, b)
    for key in ("rng", "generations"):
        assert (got[key] is None and want[key] is None) or torch.equal(got[key], want[key]), key


def torchrl_after(*batches: TensorDict) -> TensorDictReplayBuffer:
    """TorchRL's own buffer after the good batches only: the rows ours must hold."""
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(CAPACITY), batch_size=4)
    for batch in batches:
        rb.extend(batch.clone())
    return rb


def assert_keeps_working(rb) -> None:
    """The next good batch lands right after the filled slots, with its values, as in TorchRL's buffer."""
    index = rb.extend(rows(2, FILLED))
    assert index.tolist() == [FILLED, FILLED + 1]
    assert len(rb) == FILLED + 2 and rb.write_count == FILLED + 2 and rb.writer._cursor == FILLED + 2
    reference = torchrl_after(rows(FILLED), rows(2, FILLED))
    assert len(reference) == len(rb)
    ours, theirs = rb[:], reference[:]
    for key in ("observation", "reward", "action", ("next", "done")):
        assert torch.equal(ours[key], theirs[key]), key
    batch = rb.sample(4)  # the sampler draws from the filled slots only
    assert int(batch["index"].max()) < FILLED + 2


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_a_batch_the_storage_cannot_take_changes_nothing(kind, packed):
    kwargs = {"slice_len": 1} if kind == "slice" else {}
    rb = make_replay_buffer(CAPACITY, 4, sampler=kind, device="cpu", packed=packed,
                            generator=torch.Generator().manual_seed(0), **kwargs)
    rb.extend(rows(FILLED))
    if kind in ("proportional", "rank"):
        rb.update_priority(torch.arange(FILLED), torch.linspace(0.5, 3.0, FILLED))
    before = snapshot(rb)
    for name, (batch, error, match) in bad_batches().items():
        with pytest.raises(error, match=match):
            rb.extend(batch)
        assert_same(snapshot(rb), before)
        assert name  # each refusal checked on its own
    assert_keeps_working(rb)


@pytest.mark.parametrize("name", ["sparse", "meta"])
def test_torchrl_refuses_these_batches_too_but_moves_its_cursor(name):
    """What our buffer is compared with: TorchRL's buffer raises torch's own error for the same batch and counts
    its three transitions as written (cursor and length 13); ours keeps 10 and names the problem."""
    reference = torchrl_after(rows(FILLED))
    with pytest.raises((RuntimeError, NotImplementedError)):
        reference.extend(bad_batches()[name][0])
    assert len(reference) == FILLED + 3 and reference.write_count == FILLED + 3


def test_the_first_write_refused_leaves_the_storage_empty():
    rb = make_replay_buffer(CAPACITY, 4, device="cpu")
    batch, error, match = bad_batches()["sparse"]
    with pytest.raises(error, match=match):
        rb.extend(batch)
    assert len(rb) == 0 and rb.write_count == 0 and rb.writer._cursor == 0 and not rb.storage.initialized
    rb.extend(rows(FILLED))
    assert_keeps_working(rb)


@pytest.mark.skipif(not GENERATIONS, reason="TorchRL < 0.14's writers keep no generations")
def test_a_writer_with_generations_keeps_them_on_a_refused_batch():
    """``track_generations=True`` takes the writer's checked path (TorchRL's ``extend`` order, cursor moved after
    the write): a refusal leaves the generation stamps as they were."""
    rb = GPUPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=None, device="cpu", batch_size=4,
                                    writer=GPURoundRobinWriter(track_generations=True))
    rb.extend(rows(FILLED))
    before = snapshot(rb)
    assert before["generations"][:FILLED].tolist() == [0] * FILLED
    for batch, error, match in bad_batches().values():
        with pytest.raises(error, match=match):
            rb.extend(batch)
        assert_same(snapshot(rb), before)
    assert_keeps_working(rb)
    assert rb.writer.generations_of(torch.arange(FILLED + 2)).tolist() == [0] * (FILLED + 2)


@pytest.mark.parametrize("name", ["sparse", "meta", "dtype"])
def test_the_frame_deduplicated_storage_refuses_before_any_frame_moves(name):
    rb = make_replay_buffer(CAPACITY, 4, frame_stack=4, frames=256, device="cpu")

    def frames(n: int, start: int) -> TensorDict:
        values = torch.arange(start, start + n + 4, dtype=torch.uint8)  # one new frame a step
        stacks = torch.stack([values[i:i + 4] for i in range(n + 1)])[:, :, None, None].expand(n + 1, 4, 2, 2)
        return TensorDict({"observation": stacks[:n].clone(), "next_observation": stacks[1:].clone(),
                           "reward": torch.arange(start, start + n, dtype=torch.float32)}, [n])

    rb.extend(frames(4, 0))
    storage = rb.storage
    before = (len(rb), rb.write_count, rb.writer._cursor, storage.frames.clone(), storage.frame_hash.clone(),
              storage.frame_positions.clone(), storage.oldest.clone(), storage.frames_written.clone(),
              storage.slot_valid.clone(), rb.sampler.core.state.leaves.clone())
    bad = frames(2, 50)
    if name == "sparse":
        bad.set("observation", bad["observation"].to_sparse())
    elif name == "meta":
        bad.set("next_observation", bad["next_observation"].to("meta"))
    else:
        bad.set("reward", bad["reward"].double())
    with pytest.raises((TypeError, ValueError), match="layout torch.sparse_coo|'meta' device|dtype torch.float64"):
        rb.extend(bad)
    after = (len(rb), rb.write_count, rb.writer._cursor, storage.frames, storage.frame_hash, storage.frame_positions,
             storage.oldest, storage.frames_written, storage.slot_valid, rb.sampler.core.state.leaves)
    for a, b in zip(after[:3], before[:3], strict=True):
        assert a == b
    for a, b in zip(after[3:], before[3:], strict=True):
        assert torch.equal(a, b)
    assert rb.extend(frames(2, 4)).tolist() == [4, 5]
    assert torch.equal(rb[:]["observation"][4:], frames(2, 4)["observation"])
