"""GPU checks of the frame-deduplicated and pinned-host storages: the kernel paths, their equality with the
CPU reference, no host synchronisation on the step, CUDA-graph capture, the measured device memory."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from test_replay_frames import StackModel, _check_slots, _td

from lightning_per import FrameStackStorage, PinnedHostStorage, make_replay_buffer
from lightning_per.graphs.streams import capture_cuda_graph as capture

pytestmark = pytest.mark.gpu


def _cuda_td(model):
    return _td(*model.step()).to("cuda")


def test_frame_storage_runs_the_kernel_and_equals_the_cpu_reference():
    from lightning_per.ext.gather import gather_stacks

    model = StackModel(4, 4, n_step=3, seed=11)
    gpu = make_replay_buffer(64, 16, device="cuda", frame_stack=4, frames=300)
    cpu = make_replay_buffer(64, 16, device="cpu", frame_stack=4, frames=300)
    assert isinstance(gpu.storage, FrameStackStorage)
    for _ in range(40):
        td = _td(*model.step())
        gpu.extend(td.clone().to("cuda"))
        cpu.extend(td.clone())
    assert gpu.storage.ops.gather_stacks is gather_stacks
    assert int(gpu.storage.frames_written) == int(cpu.storage.frames_written)
    assert torch.equal(gpu.storage.slot_valid.cpu(), cpu.storage.slot_valid)
    index = torch.arange(64)
    a, b = gpu.storage.get(index.cuda()), cpu.storage.get(index)
    for key in ("observation", "next_observation", "tid"):
        assert torch.equal(a[key].cpu(), b[key]), key
    _check_slots(cpu.storage, model, range(64))


@pytest.mark.parametrize("kind", ["frames", "pinned"])
def test_no_host_sync_over_200_steps(kind):
    if kind == "frames":
        model = StackModel(8, 4, n_step=3, seed=12)
        rb = make_replay_buffer(4096, 64, device="cuda", frame_stack=4, generator=torch.Generator().manual_seed(0))
        batch = lambda: _cuda_td(model)  # noqa: E731
    else:
        rb = make_replay_buffer(4096, 64, device="cuda", pinned_host=True, generator=torch.Generator().manual_seed(0))
        batch = lambda: TensorDict({"observation": torch.randn(64, 51, device="cuda"),  # noqa: E731
                                    "reward": torch.randn(64, device="cuda")}, [64], device="cuda")
    for _ in range(8):  # allocation and the first writes outside the checked region
        rb.extend(batch())
    data = [batch() for _ in range(200)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for td in data:
            rb.extend(td)
            sample = rb.sample()
            rb.update_priority(sample["index"], sample["reward"].abs() + 0.1)
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.parametrize("kind", ["frames", "pinned"])
def test_sample_gather_update_capture_in_cuda_graph(kind):
    if kind == "frames":
        model = StackModel(8, 4, seed=13)
        rb = make_replay_buffer(1024, 64, device="cuda", frame_stack=4, generator=torch.Generator().manual_seed(0))
        for _ in range(200):
            rb.extend(_cuda_td(model))
    else:
        rb = make_replay_buffer(1024, 64, device="cuda", pinned_host=True, generator=torch.Generator().manual_seed(0))
        rb.extend(TensorDict({"observation": torch.randn(1024, 51, device="cuda"),
                              "reward": torch.randn(1024, device="cuda")}, [1024], device="cuda"))
    sampler, storage = rb.sampler, rb.storage
    static = {}

    def step():
        index, info, batch = sampler.sample_gather(storage, 64)
        sampler.update_priority(index, batch["reward"].abs() + 0.1, storage=storage)
        static["index"], static["batch"] = index, batch

    graph = capture(step, [sampler.generator])
    for _ in range(5):
        graph.replay()
        torch.cuda.synchronize()
        want = storage.get(static["index"])
        for key in want.keys():
            assert torch.equal(static["batch"][key], want[key]), key
    if kind == "frames":
        for row, tid in enumerate(static["batch"]["tid"].tolist()):
            assert torch.equal(static["batch"]["observation"][row].cpu(),
                               torch.from_numpy(model.transitions[tid][0]))


def test_pinned_host_is_pinned_zero_copy_and_equals_device_storage():
    from lightning_per.ext.gather import gather_rows

    kw = dict(device="cuda", seed=4)
    host = make_replay_buffer(5000, 64, pinned_host=True, generator=torch.Generator().manual_seed(4), **kw)
    dev = make_replay_buffer(5000, 64, packed=True, generator=torch.Generator().manual_seed(4), **kw)
    for step in range(30):
        g = torch.Generator().manual_seed(step)
        td = TensorDict({"observation": torch.randn(256, 51, generator=g), "reward": torch.randn(256, generator=g),
                         "action": torch.randint(0, 9, (256,), generator=g)}, [256]).to("cuda")
        host.extend(td.clone())
        dev.extend(td.clone())
        a, b = host.sample(), dev.sample()
        for key in b.keys():
            assert torch.equal(a[key], b[key]), key
        host.update_priority(a["index"], a["reward"].abs() + 0.1)
        dev.update_priority(b["index"], b["reward"].abs() + 0.1)
    storage = host.storage
    assert isinstance(storage, PinnedHostStorage) and storage.ring.rows.is_pinned()
    assert storage.ops.gather_rows is gather_rows
