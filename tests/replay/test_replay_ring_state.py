"""The storage core as functions of an explicit RingState."""

import pytest
import torch
from tensordict import TensorDict

from lightning_per.replay import GPUTensorStorage
from lightning_per.replay.ring import RingState, match_pairs, read_slots, rows_batch, write_pairs, write_rows


def _storage(packed):
    storage = GPUTensorStorage(4, device="cpu", packed=packed)
    storage.set(torch.arange(2), TensorDict({"obs": torch.zeros(2, 3), "reward": torch.zeros(2)}, [2]))
    return storage


def _batch(n, base=0.0):
    return TensorDict({"obs": torch.arange(3 * n, dtype=torch.float32).view(n, 3) + base,
                       "reward": torch.arange(n, dtype=torch.float32) + base}, [n])


def test_empty_ring_state():
    ring = RingState()
    assert ring.tensors() == () and ring.rows is None and ring.layout == {}
    assert match_pairs(ring, _batch(2)) is None


@pytest.mark.parametrize("packed", [False, True])
def test_state_is_the_storage_fields(packed):
    storage = _storage(packed)
    ring = storage.ring
    assert storage.ring.rows is ring.rows and storage.ring.flat is ring.flat and storage.ring.layout is ring.layout
    assert ring.tensors() == ((ring.rows,) if packed else tuple(ring.flat.values()))


@pytest.mark.parametrize("packed", [False, True])
def test_match_pairs_refuses_other_specs(packed):
    ring = _storage(packed).ring
    assert match_pairs(ring, _batch(2)) is not None
    assert match_pairs(ring, _batch(0)) is None
    assert match_pairs(ring, _batch(2).exclude("reward")) is None
    assert match_pairs(ring, TensorDict({"obs": torch.zeros(2, 4), "reward": torch.zeros(2)}, [2])) is None
    assert match_pairs(ring, TensorDict({"obs": torch.zeros(2, 3), "reward": torch.zeros(2, dtype=torch.int64)},
                                        [2])) is None


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("start", [None, 1])
def test_write_pairs_then_read_slots(packed, start):
    ring = _storage(packed).ring
    data = _batch(2, base=10.0)
    cursor = write_pairs(ring, torch.tensor([1, 2]), match_pairs(ring, data), start, 4)
    assert cursor.tolist() == [1, 2]
    got = read_slots(ring, torch.tensor([2, 1]), {"w": torch.ones(2)})
    assert torch.equal(got["obs"], data["obs"].flip(0)) and torch.equal(got["reward"], data["reward"].flip(0))
    assert torch.equal(got["w"], torch.ones(2))


def test_write_pairs_longer_than_the_ring_keeps_each_slots_last_write():
    ring = _storage(False).ring
    data = _batch(6, base=1.0)
    write_pairs(ring, torch.tensor([0, 1, 2, 3, 0, 1]), match_pairs(ring, data), None, 4)
    assert read_slots(ring, torch.arange(4))["reward"].tolist() == [5.0, 6.0, 3.0, 4.0]


def test_write_rows_only_for_packed_contiguous_values():
    plain, packed = _storage(False).ring, _storage(True).ring
    data = _batch(2, base=5.0)
    assert not write_rows(plain, 0, 2, match_pairs(plain, data))
    strided = TensorDict({"obs": torch.zeros(2, 3), "reward": torch.zeros(4)[::2]}, [2])  # a strided field
    assert not write_rows(packed, 0, 2, match_pairs(packed, strided))
    assert write_rows(packed, 0, 2, match_pairs(packed, data))
    block = packed.rows[torch.tensor([1, 0])]
    assert rows_batch(packed, block, None)["reward"].tolist() == [6.0, 5.0]


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
@pytest.mark.parametrize("packed", [False, True])
def test_a_copied_storage_keeps_every_write(packed, how):
    """An unpickled or deep-copied storage reads back what it is given afterwards, by both write paths (the
    generic ``set`` and the direct packed write), and keeps what the original held; the original is untouched."""
    import copy
    import pickle

    from lightning_per.replay.ring import match_pairs, write_pairs

    storage = _storage(packed)
    storage.set(torch.arange(2), _batch(2, base=10.0))
    copied = pickle.loads(pickle.dumps(storage)) if how == "pickle" else copy.deepcopy(storage)
    copied.set(torch.tensor([2]), _batch(1, base=20.0))
    new = _batch(1, base=30.0)
    write_pairs(copied.ring, torch.tensor([3]), match_pairs(copied.ring, new), 3, 4)
    got = copied.get(torch.arange(4))
    assert torch.equal(got["reward"], torch.tensor([10.0, 11.0, 20.0, 30.0]))
    assert torch.equal(got["obs"][2], torch.tensor([20.0, 21.0, 22.0])) and torch.equal(got["obs"][3], new["obs"][0])
    assert torch.equal(copied[2:4]["reward"], torch.tensor([20.0, 30.0]))  # the fields' views agree with the rows
    assert torch.equal(storage.get(torch.arange(2))["reward"], torch.tensor([10.0, 11.0]))
    assert torch.equal(storage.get(torch.arange(4))["reward"][2:], torch.zeros(2))


def test_layout_is_a_value_the_storage_holds():
    """Where items live is the storage's ``layout`` (in its repr), chosen at construction or by the first write."""
    from lightning_per import FrameStackStorage, PinnedHostStorage

    ring = _storage(True)
    assert ring.layout == "ring" and "layout='ring'" in repr(ring) and ring.gather_rows is ring.ring.rows
    plain = GPUTensorStorage(4, device="cpu")
    plain.set(torch.arange(2), torch.zeros(2, 3))  # a plain tensor: TorchRL's layout, for good
    assert plain.layout == "torchrl" and plain.ring.tensors() == () and plain.gather_rows is None
    assert GPUTensorStorage(4, device="cpu", ndim=2).layout == "torchrl"
    assert FrameStackStorage(4, frame_stack=2, device="cpu").layout == "frames"
    host = PinnedHostStorage(4, device="cpu", pin=False)
    host.set(torch.arange(2), _batch(2))
    assert host.layout == "host" and host.gather_rows is None and "layout='host'" in repr(host)


@pytest.mark.parametrize("packed", [False, True])
def test_set_with_repeated_slots_keeps_each_slots_last_write(packed):
    storage = _storage(packed)
    storage.set(torch.tensor([3, 0, 3, 1, 0, 2]), _batch(6, base=1.0))  # slots out of order, 6 writes on 4
    assert storage.get(torch.arange(4))["reward"].tolist() == [5.0, 4.0, 6.0, 3.0]


def test_storage_modules_read_no_capability_from_the_class():
    """No method compared by identity and no ``getattr`` probe decides what a storage does."""
    import inspect

    from lightning_per.replay import frames, host, ring, storage, storage_checkpoint

    for module in (storage, storage_checkpoint, frames, host, ring):
        source = inspect.getsource(module)
        assert "GPUTensorStorage.set" not in source and "GPUTensorStorage._read" not in source, module
        assert "getattr(self" not in source and "hasattr(self" not in source, module


def test_prioritized_buffer_samples_a_storage_in_torchrl_layout():
    """The buffer's direct sample path is for items in a ring; a storage in TorchRL's layout (``ndim=2``) is
    sampled through TorchRL's path, its ``"index"`` per dimension (TorchRL's ``test_rb_multidim``)."""
    from lightning_per import GPUPrioritizedReplayBuffer

    storage = GPUTensorStorage(100, device="cpu", ndim=2)
    rb = GPUPrioritizedReplayBuffer(alpha=0.9, beta=1.1, storage=storage, batch_size=4, device="cpu")
    rb.extend(TensorDict({"x": torch.ones(4, 3, 2)}, [4, 3]))
    assert storage.layout == "torchrl" and len(rb) == 12
    batch = rb.sample()
    assert batch.numel() == 4 and bool((batch.exclude("index") == 1).all())
