"""GPU-only replay checks: no host synchronisation on the hot path, CUDA-graph capture, OOM fallback."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from lightning_per import GPUTensorStorage, make_replay_buffer
from lightning_per.graphs.streams import capture_cuda_graph as capture

pytestmark = pytest.mark.gpu


def _batch(n, device):
    return TensorDict({"observation": torch.randn(n, 51, device=device),
                       "next_observation": torch.randn(n, 51, device=device),
                       "action": torch.randint(0, 45, (n,), device=device),
                       "reward": torch.randn(n, device=device),
                       "done": torch.zeros(n, dtype=torch.bool, device=device)}, [n], device=device)


@pytest.mark.parametrize("kind", ["proportional", "rank", "uniform"])
def test_no_host_sync_over_1000_steps(kind):
    dev = torch.device("cuda")
    rb = make_replay_buffer(100_000, 256, sampler=kind, device=dev, generator=torch.Generator().manual_seed(0))
    rb.extend(_batch(1024, dev))  # first write allocates (outside the checked region)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(1000):
            rb.extend(_batch(64, dev))
            batch = rb.sample()
            if kind != "uniform":
                td = batch["reward"].abs() + 0.1
                rb.update_priority(batch["index"], td)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert len(rb) == 1024 + 64_000


@pytest.mark.parametrize("kind", ["proportional", "rank"])
def test_sample_and_update_capture_in_cuda_graph(kind):
    dev = torch.device("cuda")
    rb = make_replay_buffer(4096, 256, sampler=kind, device=dev, generator=torch.Generator().manual_seed(0))
    rb.extend(_batch(4096, dev))
    sampler, storage = rb.sampler, rb.storage
    td_src = torch.rand(4096, device=dev)
    static = {}

    def step():
        index, info = sampler.sample(storage, 256)
        sampler.update_priority(index, td_src[index] + 0.01, storage=storage)
        static["index"], static["w"] = index, info["priority_weight"]

    graph = capture(step, [sampler.generator])
    seen = set()
    for _ in range(20):
        graph.replay()
        seen.update(static["index"].cpu().tolist())
    torch.cuda.synchronize()
    assert len(seen) > 256  # fresh draws each replay
    probs = sampler.probabilities()
    raw = sampler.core.state.raw[:4096]
    written = td_src[torch.tensor(sorted(seen), device=dev)] + 0.01
    torch.testing.assert_close(raw[torch.tensor(sorted(seen), device=dev)], written)
    assert torch.isfinite(probs).all()


def test_storage_falls_back_to_cpu_on_oom(monkeypatch):
    storage = GPUTensorStorage(10, device="cuda")

    def boom(*args, **kwargs):
        raise torch.OutOfMemoryError("simulated")

    real = storage._allocate
    calls = []

    def allocate(item, device):
        calls.append(device)
        if device.type == "cuda":
            boom()
        return real(item, device)

    monkeypatch.setattr(storage, "_allocate", allocate)
    with pytest.warns(RuntimeWarning, match="out of memory"):
        storage.set(torch.arange(2), TensorDict({"x": torch.zeros(2)}, [2]))
    assert torch.device(storage.device).type == "cpu" and len(storage) == 2


def test_storage_raises_on_oom_without_fallback():
    free, _ = torch.cuda.mem_get_info()
    storage = GPUTensorStorage(int(free // 4) + 1, device="cuda", fallback=False)  # float32 x 2: > free
    with pytest.raises(torch.OutOfMemoryError):
        storage.set(torch.arange(1), TensorDict({"x": torch.zeros(1, 2)}, [1]))
