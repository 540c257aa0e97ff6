"""PinnedHostStorage: batches, IS weights and priorities equal the device storage's for the same seed; writes
that wrap the ring; checkpoints; bad input; the zero-copy gather/scatter kernels against plain indexing.

Without CUDA the host ring is plain (pageable) memory and the gather/scatter are the plain-torch ops: the same
storage logic (packing, slots, wrap-around, batch views, checkpoints) is what these tests check."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from lightning_per import PinnedHostStorage, make_replay_buffer


def _batch(n, seed):
    g = torch.Generator().manual_seed(seed)
    return TensorDict({"observation": torch.randn(n, 51, generator=g),
                       "action": torch.randint(0, 18, (n,), generator=g),
                       "reward": torch.randn(n, generator=g),
                       "done": torch.rand(n, generator=g) < 0.1}, [n])


@pytest.mark.parametrize("sampler", ["proportional", "uniform"])
def test_host_batches_equal_device_storage_batches_for_the_same_seed(sampler):
    kw = dict(sampler=sampler, device="cpu", generator=torch.Generator().manual_seed(3), seed=3)
    host = make_replay_buffer(300, 32, pinned_host=True, **kw)
    kw["generator"] = torch.Generator().manual_seed(3)
    ref = make_replay_buffer(300, 32, packed=True, **kw)
    assert isinstance(host.storage, PinnedHostStorage)
    for step in range(12):  # 12 x 40 = 480 transitions through 300 slots: the ring wraps
        data = _batch(40, step)
        assert torch.equal(host.extend(data.clone()), ref.extend(data.clone()))
        a, b = host.sample(), ref.sample()
        assert set(a.keys()) == set(b.keys())
        for key in b.keys():
            assert torch.equal(a[key], b[key]), key
        if sampler != "uniform":
            td = a["reward"].abs() + 0.1
            host.update_priority(a["index"], td)
            ref.update_priority(b["index"], td)
    assert len(host) == len(ref) == 300
    assert torch.equal(host.storage.get(torch.arange(300))["observation"],
                       ref.storage.get(torch.arange(300))["observation"])


def test_host_checkpoint_round_trip_and_bad_input(tmp_path):
    rb = make_replay_buffer(64, 8, pinned_host=True, device="cpu", seed=0)
    rb.extend(_batch(50, 0))
    rb.dumps(tmp_path / "rb")
    other = make_replay_buffer(64, 8, pinned_host=True, device="cpu", seed=0)
    other.loads(tmp_path / "rb")
    assert torch.equal(other.storage.get(torch.arange(50))["observation"], _batch(50, 0)["observation"])
    before = rb.storage.ring.rows.clone()
    bad = _batch(4, 1)
    bad.set("observation", torch.zeros(4, 50))
    with pytest.raises(ValueError, match=r"data\['observation'\] has per-item shape \(50,\)"):
        rb.extend(bad)
    assert len(rb) == 50 and torch.equal(rb.storage.ring.rows, before)
    with pytest.raises(ValueError, match="pinned_host=True and frame_stack"):
        make_replay_buffer(8, 2, device="cpu", pinned_host=True, frame_stack=4)


@pytest.mark.parametrize("row_bytes", [12, 16, 7056])
def test_compiled_scatter_and_gather_rows_equal_indexing(row_bytes):
    kd = pytest.importorskip("_kernel_devices")  # CUDA, or CPU through Triton's interpreter
    param = kd.KDEVS[0]
    if not isinstance(param, str) and any(m.name == "skip" for m in param.marks):
        pytest.skip("triton was imported without the interpreter")
    dev = param if isinstance(param, str) else param.values[0]
    from lightning_per.ext.gather import gather_rows, scatter_rows

    pin = dev == "cuda"
    g = torch.Generator().manual_seed(0)
    dst = torch.zeros((9, row_bytes), dtype=torch.uint8, pin_memory=pin)
    src = torch.randint(0, 256, (4, row_bytes), dtype=torch.uint8, generator=g).to(dev)
    index = torch.tensor([7, 0, 3, 8], device=dev)
    scatter_rows(dst, index, src)
    if dev == "cuda":
        torch.cuda.synchronize()
    want = torch.zeros_like(dst)
    want[index.cpu()] = src.cpu()
    assert torch.equal(dst, want)
    assert torch.equal(gather_rows(dst, index).cpu(), want[index.cpu()])


def test_storages_hold_their_ops_backend_and_a_pickled_copy_reads_the_same_batch():
    """The pinned-host and frame-stack storages copy rows through an ops backend they hold (``storage.ops``, the
    reference on CPU); a pickled copy chooses it again and reads what the original reads."""
    import pickle

    from lightning_per import FrameStackStorage
    from lightning_per.ops import ReplayOps, reference

    host = PinnedHostStorage(16, device="cpu")
    host.set(torch.arange(5), _batch(5, 0))
    frames = FrameStackStorage(16, frame_stack=2, device="cpu")
    f = torch.randint(0, 256, (6, 3, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    frames.set(torch.arange(4), TensorDict({"observation": torch.stack([f[i:i + 2] for i in range(4)]),
                                            "next_observation": torch.stack([f[i + 1:i + 3] for i in range(4)]),
                                            "reward": torch.arange(4.0)}, [4]))
    index = torch.tensor([3, 0, 3])
    for storage in (host, frames):
        assert storage.ops is reference and isinstance(storage.ops, ReplayOps)
        copy = pickle.loads(pickle.dumps(storage))
        assert copy.ops is reference
        got, want = copy.get(index), storage.get(index)
        for key in want.keys(include_nested=True, leaves_only=True):
            assert torch.equal(got[key], want[key]), key
    assert torch.equal(frames.get(index)["observation"], torch.stack([f[3:5], f[0:2], f[3:5]]))
