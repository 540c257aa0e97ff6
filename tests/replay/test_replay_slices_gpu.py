"""GPU slice samplers: no host sync on the hot path, CUDA-graph capture, N = 1e8, the compiled kernels' draws
against the CPU reference's exact start probabilities."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from lightning_per import make_replay_buffer
from lightning_per.graphs.streams import capture_cuda_graph as capture

pytestmark = pytest.mark.gpu


def _episodes(n: int, device, seed: int = 0, low: int = 5, high: int = 40) -> TensorDict:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high, (n // low + 2,), generator=gen)
    ends = torch.cumsum(lengths, 0)
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[ends[ends <= n] - 1] = True
    return TensorDict({"observation": torch.randn(n, 4, generator=gen), "reward": torch.rand(n, generator=gen),
                       "is_init": torch.zeros(n, 1, dtype=torch.bool), ("next", "done"): done}, [n]).to(device)


@pytest.mark.parametrize("kind,rule", [("slice", None), ("prioritized_slice", "start"), ("prioritized_slice", "max")])
def test_no_host_sync_over_1000_steps(kind, rule):
    dev = torch.device("cuda")
    extra = {"slice_priority": rule} if rule else {}
    rb = make_replay_buffer(20_000, 256 * 16, sampler=kind, device=dev, slice_len=16,
                            generator=torch.Generator().manual_seed(0), **extra)
    rb.extend(_episodes(4096, dev))  # allocates the storage
    rb.sample()  # builds the start mask and checks once that a slice exists (the one documented host read)
    chunks = [_episodes(64, dev, seed) for seed in range(8)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(1000):
            rb.extend(chunks[step % 8])  # the ring wraps after ~250 steps
            batch = rb.sample()
            if kind == "prioritized_slice":
                rb.update_priority(batch["index"], batch["reward"] + 0.01)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert len(rb) == 20_000


@pytest.mark.parametrize("rule", ["start", "max"])
def test_sample_and_update_capture_in_cuda_graph(rule):
    dev = torch.device("cuda")
    rb = make_replay_buffer(50_000, 256 * 16, sampler="prioritized_slice", device=dev, slice_len=16,
                            slice_priority=rule, generator=torch.Generator().manual_seed(0))
    rb.extend(_episodes(50_000, dev))
    sampler, storage = rb.sampler, rb.storage
    sampler.sample(storage, 4096)
    td_src = torch.rand(50_000, device=dev) + 0.01
    static = {}

    def step():
        index, info = sampler.sample(storage, 4096)
        sampler.update_priority(index, td_src[index], storage=storage)
        static["index"], static["w"] = index, info["priority_weight"]

    graph = capture(step, sampler.capture_view(None, 256).generators)
    valid = sampler.index.valid[:50_000].clone()
    seen = set()
    for _ in range(20):
        graph.replay()
        starts = static["index"].reshape(256, 16)[:, 0]
        assert bool(valid[starts].all())
        seen.update(starts.cpu().tolist())
    torch.cuda.synchronize()
    assert len(seen) > 1000  # fresh draws each replay
    written = torch.tensor(sorted(seen), device=dev)
    torch.testing.assert_close(sampler.core.state.raw[written], td_src[written])
    probs = sampler.probabilities()
    assert torch.isfinite(probs).all() and bool((probs[:50_000][~valid] == 0).all())


def test_uniform_sample_captures_in_cuda_graph():
    dev = torch.device("cuda")
    rb = make_replay_buffer(50_000, 256 * 16, sampler="slice", device=dev, slice_len=16)
    rb.extend(_episodes(50_000, dev))
    sampler, storage = rb.sampler, rb.storage
    sampler.sample(storage, 4096)
    static = {}

    def step():
        static["index"], _ = sampler.sample(storage, 4096)

    graph = capture(step, [sampler.generator])
    starts = set()
    for _ in range(10):
        graph.replay()
        starts.update(static["index"].reshape(256, 16)[:, 0].cpu().tolist())
    assert len(starts) > 1000
    assert bool(sampler.index.valid[torch.tensor(sorted(starts), device=dev)].all())


def test_capacity_1e8():
    dev = torch.device("cuda")
    N = 100_000_000
    rb = make_replay_buffer(N, 256 * 16, sampler="prioritized_slice", device=dev, slice_len=16,
                            generator=torch.Generator().manual_seed(0))
    chunk = _episodes(1 << 22, dev, low=50, high=450)
    keep = {"observation", "is_init", ("next", "done")}
    chunk = chunk.select(*keep)
    written = 0
    while written < N + (1 << 22):  # fills the ring and wraps it once
        rb.extend(chunk)
        written += chunk.shape[0]
    batch = rb.sample()
    rb.update_priority(batch["index"], torch.rand(4096, device=dev) + 0.01)
    batch = rb.sample()
    starts = batch["index"].reshape(256, 16)[:, 0]
    assert bool(rb.sampler.index.valid[starts].all())
    steps = (batch["index"].reshape(256, 16).diff(dim=1) % N)
    assert bool((steps == 1).all())  # consecutive slots (strict_length: every slice has 16)
    assert bool((~batch["next", "done"].reshape(256, 16)[:, :-1]).all())  # no end inside a slice


@pytest.mark.parametrize("kind", ["slice", "prioritized_slice"])
def test_cuda_start_probabilities_equal_the_cpu_reference(kind):
    """The same writes and updates on CUDA (compiled kernels) and on the CPU (reference ops): the same exact
    start probabilities; and the CUDA draws fit them (chi-square, significance 1e-3)."""
    from scipy import stats

    def build(device):
        extra = dict(alpha=0.7, beta=0.5) if kind == "prioritized_slice" else {}
        rb = make_replay_buffer(3000, 64 * 8, sampler=kind, device=device, slice_len=8, strict_length=False,
                                pad_output=True,
                                generator=torch.Generator().manual_seed(0), **extra)
        for seed in range(7):
            rb.extend(_episodes(611, device, seed, low=1, high=30))
        if kind == "prioritized_slice":
            rb.update_priority(torch.arange(3000, device=device), torch.linspace(0.1, 4.0, 3000, device=device))
        rb.sample()
        return rb

    cpu, gpu = build("cpu"), build("cuda")
    p_cpu, p_gpu = cpu.sampler.probabilities()[:3000], gpu.sampler.probabilities()[:3000].cpu()
    torch.testing.assert_close(p_gpu, p_cpu, rtol=1e-5, atol=1e-12)
    counts = np.zeros(3000)
    for _ in range(200):
        starts = gpu.sample()["index"].reshape(64, 8)[:, 0].cpu().numpy()
        counts += np.bincount(starts, minlength=3000)
    p = p_cpu.double().numpy()
    assert counts[p == 0].sum() == 0
    # pooled into 50 bins of about equal probability (the per-slot expected counts are small)
    order = np.argsort(np.cumsum(p))
    bins = np.minimum((np.cumsum(p[order]) * 50).astype(int), 49)
    got = np.bincount(bins, weights=counts[order], minlength=50)
    want = np.bincount(bins, weights=p[order], minlength=50) * counts.sum()
    assert stats.chisquare(got[want > 0], want[want > 0]).pvalue > 1e-3
