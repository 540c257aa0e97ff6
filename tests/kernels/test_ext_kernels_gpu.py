"""GPU-only checks of the compiled replay kernels (``ext/``): same indices as the reference up to
N = 1e6 (and 1e8 when memory allows), no drift after 10^6 updates, CUDA-graph capture and replay,
no host synchronisation over 1000 steps, torch.compile, and the forced-failure fallback.

    pytest -m gpu tests/kernels/test_ext_kernels.py tests/kernels/test_ext_kernels_gpu.py
"""

from __future__ import annotations

import warnings

import pytest
import torch

pytestmark = pytest.mark.gpu
triton = pytest.importorskip("triton")

from _philox import expected_uniforms  # noqa: E402
from lightning_per.ext import rank, sample, update  # noqa: E402
from lightning_per.ext.state import PriorityTree, RankTable  # noqa: E402

from lightning_per import GPUPrioritizedSampler  # noqa: E402
from lightning_per.graphs.streams import capture_cuda_graph as capture  # noqa: E402
from lightning_per.ops import dispatch, reference  # noqa: E402
from lightning_per.ops.selfcheck import boundary_uniforms, fresh_state  # noqa: E402

F64 = torch.float64


class _Len:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def _levels(capacity: int, integer: bool, seed: int):
    """Sampler-shaped ``(leaves, block_sum, block_min)`` built on the GPU (+1 trash slot, 25 % zeros)."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(seed)
    block = reference.block_size_for(capacity + 1)
    n_blocks = -(-(capacity + 1) // block)
    flat = torch.zeros(n_blocks * block, device=dev)
    if integer:
        flat[:capacity] = torch.randint(1, 4, (capacity,), device=dev, generator=g).float()
    else:
        flat[:capacity] = torch.rand(capacity, device=dev, generator=g) * 10 + 1e-3
    flat[:capacity][torch.rand(capacity, device=dev, generator=g) < 0.25] = 0
    leaves = flat.view(n_blocks, block)
    block_sum, block_min = (t.contiguous() for t in reference.reduce_blocks(leaves))
    return leaves, block_sum, block_min


@pytest.mark.parametrize("capacity", [7, 33, 1000, 1_000_000, 999_999])
@pytest.mark.parametrize("integer", [True, False])
def test_same_indices_as_reference_on_the_same_uniforms(capacity, integer):
    leaves, bs, bm = _levels(capacity, integer, seed=capacity)
    g = torch.Generator().manual_seed(capacity)
    u = torch.rand(4096, generator=g, dtype=F64).cuda()
    if integer:  # exact sums: boundary draws u S == C_i must resolve alike
        u = torch.cat([u, boundary_uniforms(bs, 0, g)])
    index, value = sample.two_level_search_with_values(leaves, bs, u)
    want_index, want_value = reference.two_level_search_with_values(leaves, bs, u)
    assert torch.equal(index, want_index), f"{(index != want_index).sum().item()} of {u.numel()} draws differ"
    assert torch.equal(value, want_value) and (value > 0).all()
    beta = torch.tensor(0.4, dtype=F64, device="cuda")
    for normalize in ("buffer", "batch"):
        got = sample.sample_proportional(PriorityTree(leaves, bs, bm, beta=beta), u[:256], True, normalize)
        want = reference.sample_proportional(PriorityTree(leaves, bs, bm, beta=beta), u[:256], True, normalize)
        assert torch.equal(got[0], want[0])
        torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=0)


@pytest.mark.parametrize("capacity", [1001, 1_000_000])
def test_sampler_kernels_backend_tracks_reference_backend(capacity, monkeypatch):
    """The kernels' sampler (cached eager graphs, uniforms drawn in the kernel) against the reference sampler
    fed the uniforms of the documented device Philox stream (tests/support/_philox.py): same slots, weights, state."""
    storage = _Len(capacity)
    fast = GPUPrioritizedSampler(capacity, 0.6, 0.4, device="cuda", backend="kernels", seed=7,
                                 shuffle_strata=False)  # strata in order: the kernel draws its uniforms
    slow = GPUPrioritizedSampler(capacity, 0.6, 0.4, device="cuda", backend="reference", seed=7,
                                 eager_graphs=False, shuffle_strata=False)  # its uniforms come from the host below
    assert "two_level_search_with_values" in fast.core.ops.COMPILED and int(fast.core.state.rng[0]) == 7

    def philox_uniforms(shape):  # the reference core's generator draws, (B,) in stratum order
        (batch_size,) = shape
        counts = fast.core.state.rng[1:1 + batch_size].cpu().numpy()
        return torch.from_numpy(expected_uniforms(7, counts)).cuda()

    monkeypatch.setattr(slow.core, "rand", philox_uniforms)
    td = torch.rand(capacity, device="cuda", generator=torch.Generator(device="cuda").manual_seed(0)) * 5
    for s in (fast, slow):
        for start in range(0, capacity, 1 << 16):  # the per-op _write gathers (B, block) rows: chunk it
            s.mark_update(torch.arange(start, min(capacity, start + (1 << 16))), storage=storage)
    for _ in range(20):
        (i_s, info_s), (i_f, info_f) = slow.sample(storage, 256), fast.sample(storage, 256)  # slow reads first
        assert torch.equal(i_f, i_s)
        torch.testing.assert_close(info_f["priority_weight"], info_s["priority_weight"], rtol=1e-6, atol=0)
        fast.update_priority(i_f, td[i_f], storage=storage)
        slow.update_priority(i_s, td[i_s], storage=storage)
    torch.testing.assert_close(fast.core.state.leaves, slow.core.state.leaves, rtol=1e-6, atol=0)
    torch.testing.assert_close(fast.core.state.block_sum, slow.core.state.block_sum, rtol=1e-12, atol=0)


ALPHA, EPS = 0.6, 1e-6


def _written_state(capacity: int, seed: int):
    """Every slot written: raw priorities in [0, 10), stored values ``(raw + EPS)^ALPHA``."""
    leaves = _levels(capacity, integer=False, seed=seed)[0]
    g = torch.Generator(device="cuda").manual_seed(seed)
    raw = torch.zeros(leaves.numel(), device="cuda")
    raw[:capacity] = torch.rand(capacity, device="cuda", generator=g) * 10
    leaves.view(-1)[:capacity] = reference.transform_priority(raw[:capacity], ALPHA, EPS)
    st = fresh_state(leaves)
    st.raw.copy_(raw)
    return st


def test_block_sums_equal_float64_recompute_after_1e6_updates():
    capacity, batch, steps = 1_000_003, 1000, 1000
    st = _written_state(capacity, seed=1)
    g = torch.Generator(device="cuda").manual_seed(2)
    alpha = torch.tensor(ALPHA, dtype=F64, device="cuda")
    for _ in range(steps):  # 10^6 updates over 6 orders of magnitude, with duplicates
        index = torch.randint(0, capacity, (batch,), device="cuda", generator=g)
        prio = torch.rand(batch, device="cuda", generator=g).pow(8) * 1e3
        update.write_priorities(st._replace(capacity=capacity, alpha=alpha, eps=EPS), index, prio, capacity)
    exact = st.leaves.double().sum(1)
    rel = ((st.block_sum - exact).abs() / exact.clamp_min(1e-300)).max().item()
    assert rel < 1e-6, rel
    assert abs(st.block_sum.sum().item() / exact.sum().item() - 1) < 1e-6
    low = st.leaves.masked_fill(st.leaves == 0, float("inf")).amin(1)
    assert torch.equal(st.block_min, low)
    stored = reference.transform_priority(st.raw[:capacity], alpha, EPS)
    torch.testing.assert_close(st.leaves.view(-1)[:capacity], stored, rtol=1e-6, atol=0)


@pytest.mark.parametrize("batch", [256, 1024])
def test_one_launch_write_equals_reference_under_clashes(batch):
    """The one-launch write (block tickets, programs racing on the GPU) against the plain-torch twin, 300
    calls: slots from a narrow range (many entries per block, repeated slots with clashing values), NaN /
    Inf / negative priorities, out-of-range slots; exact values, counters, and the tickets back at zero."""
    capacity, n_valid = 4099, 4000
    leaves = _written_state(capacity, seed=3).leaves
    got, want = fresh_state(leaves), fresh_state(leaves)
    g = torch.Generator(device="cuda").manual_seed(4)
    alpha = torch.tensor(ALPHA, dtype=F64, device="cuda")
    for _ in range(300):
        lo = int(torch.randint(0, capacity - 300, (1,), generator=g, device="cuda").item())
        index = torch.randint(lo - 20, lo + 300, (batch,), device="cuda", generator=g)
        prio = torch.rand(batch, device="cuda", generator=g) * 5
        prio[::97] = float("nan")
        prio[5::101] = -1.0
        update.write_priorities(got._replace(capacity=capacity, alpha=alpha, eps=EPS), index, prio, n_valid)
        reference.write_priorities(want._replace(capacity=capacity, alpha=alpha, eps=EPS), index, prio, n_valid)
        # after every call: a refresh that raced would be repaired by a later touch of its block
        torch.testing.assert_close(got.block_sum, want.block_sum, rtol=1e-12, atol=0)
        torch.testing.assert_close(got.block_min, want.block_min, rtol=0, atol=0)
    for key in ("raw", "leaves", "block_min", "max_raw", "n_clamped", "n_dropped"):
        torch.testing.assert_close(getattr(got, key), getattr(want, key), rtol=1e-6, atol=0, msg=key)
    assert not got.scratch.tickets.any()
    assert not got.scratch.tickets.any()


def _fused_step(st, td, beta, alpha, capacity, batch, gen, out, u=None):
    if u is None:
        u = torch.rand(batch, generator=gen, device="cuda", dtype=F64)
    index, w = sample.sample_proportional(PriorityTree(st.leaves, st.block_sum, st.block_min, beta=beta), u)
    update.write_priorities(st._replace(capacity=capacity, alpha=alpha, eps=1e-6), index, td[index] + 0.01, capacity)
    out["index"], out["w"] = index, w


def _replays(step, st, u_static, uniforms):
    """Capture ``step(out)`` (warm-up on a side stream, then the capture: ``capture_cuda_graph``), put ``st`` back
    to its state before the warm-up, and replay once per row of ``uniforms`` (copied into ``u_static``).
    Returns each replay's ``out`` (cloned) and ``st`` after the replays (cloned); ``st`` is then put back again,
    so the caller can run the same steps eagerly from the same state."""
    out = {}
    tensors = _tree_tensors(st)
    start = {k: v.clone() for k, v in tensors.items()}
    graph = capture(lambda: step(out))
    for k, v in start.items():
        tensors[k].copy_(v)
    seen = []
    for u in uniforms:
        u_static.copy_(u)
        graph.replay()
        seen.append({k: v.clone() for k, v in out.items()})
    after_graph = {k: v.clone() for k, v in tensors.items()}
    for k, v in start.items():
        tensors[k].copy_(v)
    return seen, after_graph


def _tree_tensors(st: PriorityTree) -> dict:
    """Every tensor a :class:`PriorityTree` holds, its write scratch's included, by field name."""
    parts = {name: value for name, value in zip(st._fields, st) if isinstance(value, torch.Tensor)}
    if st.scratch is not None:
        parts.update({f"scratch.{name}": value for name, value in zip(st.scratch._fields, st.scratch)
                      if isinstance(value, torch.Tensor)})
    return parts


def test_fused_step_captured_in_cuda_graph_replays_like_eager():
    capacity, batch, steps = 100_003, 256, 20
    st = _written_state(capacity, seed=3)
    td = torch.rand(capacity, device="cuda")
    beta, alpha = (torch.tensor(v, dtype=F64, device="cuda") for v in (0.4, ALPHA))
    uniforms = torch.rand(steps, batch, device="cuda", dtype=F64)
    u_static = uniforms[0].clone()
    seen, after_graph = _replays(lambda out: _fused_step(st, td, beta, alpha, capacity, batch, None, out, u_static),
                                 st, u_static, uniforms)
    for i in range(steps):  # the same steps eagerly, from the same state
        eager = {}
        _fused_step(st, td, beta, alpha, capacity, batch, None, eager, uniforms[i])
        assert torch.equal(eager["index"], seen[i]["index"]) and torch.equal(eager["w"], seen[i]["w"])
    for k, v in _tree_tensors(st).items():
        assert torch.equal(v, after_graph[k]), k
    assert len(torch.cat([s["index"] for s in seen]).unique()) > 1000


def test_sampler_with_kernels_captured_in_cuda_graph():
    capacity = 4096
    sampler = GPUPrioritizedSampler(capacity, 0.6, 0.4, device="cuda", backend="kernels", seed=0)
    storage = _Len(capacity)
    sampler.mark_update(torch.arange(capacity), storage=storage)
    td = torch.rand(capacity, device="cuda")
    static = {}

    def step():
        index, info = sampler.sample(storage, 256)
        sampler.update_priority(index, td[index] + 0.01, storage=storage)
        static["index"] = index

    graph = capture(step, [sampler.generator])
    seen = set()
    for _ in range(20):
        graph.replay()
        seen.update(static["index"].cpu().tolist())
    idx = torch.tensor(sorted(seen), device="cuda")
    torch.testing.assert_close(sampler.core.state.raw[idx], td[idx] + 0.01)
    exact = sampler.core.state.leaves.double().sum(1)
    torch.testing.assert_close(sampler.core.state.block_sum, exact, rtol=1e-12, atol=0)


def test_no_host_sync_over_1000_steps():
    capacity, batch = 100_000, 256
    sampler = GPUPrioritizedSampler(capacity, 0.6, 0.4, device="cuda", backend="kernels", seed=0)
    storage = _Len(capacity)
    sampler.mark_update(torch.arange(capacity), storage=storage)
    st = _written_state(capacity, seed=5)
    td = torch.rand(capacity, device="cuda")
    beta, alpha = (torch.tensor(v, dtype=F64, device="cuda") for v in (0.4, 0.6))
    gen = torch.Generator(device="cuda").manual_seed(6)
    _, r_cdf = reference.rank_weights(capacity, 0.6, "cuda")
    order = torch.randperm(capacity, device="cuda")

    def step():
        index, info = sampler.sample(storage, batch)
        sampler.update_priority(index, info["priority_weight"] + 0.01, storage=storage)
        _fused_step(st, td, beta, alpha, capacity, batch, gen, {})
        table = RankTable(r_cdf, order, alpha, beta)
        rank.rank_sample(table, torch.rand(batch, device="cuda", dtype=F64, generator=gen), capacity)

    for _ in range(3):  # JIT compilation happens here
        step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(1000):
            step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()


def test_capacity_1e8_works():
    free, _ = torch.cuda.mem_get_info()
    if free < 8 << 30:
        pytest.skip(f"needs 8 GB free, {free / 2**30:.1f} GB available")
    capacity = 100_000_000
    leaves, bs, bm = _levels(capacity, integer=True, seed=8)
    g = torch.Generator().manual_seed(9)
    u = torch.cat([torch.rand(512, generator=g, dtype=F64).cuda(), boundary_uniforms(bs, 0, g)])
    index, value = sample.two_level_search_with_values(leaves, bs, u)
    want_index, want_value = reference.two_level_search_with_values(leaves, bs, u)
    assert torch.equal(index, want_index) and torch.equal(value, want_value)
    st = fresh_state(leaves)
    del leaves, bs, bm
    g = torch.Generator(device="cuda").manual_seed(1)
    idx = torch.randint(0, capacity, (256,), device="cuda", generator=g)
    update.write_priorities(st._replace(capacity=capacity, alpha=1.0, eps=0.0), idx,
                            torch.full((256,), 2.0, device="cuda"), capacity)
    blk = idx // st.leaves.shape[1]
    torch.testing.assert_close(st.block_sum[blk], st.leaves[blk].double().sum(1), rtol=1e-12, atol=0)
    assert (st.leaves.view(-1)[idx] == 2.0).all()


def test_torch_compile_fullgraph_matches_eager():
    capacity, batch = 10_007, 128
    beta, alpha = (torch.tensor(v, dtype=F64, device="cuda") for v in (0.4, 0.6))
    td = torch.rand(capacity, device="cuda")

    def run(step_fn):
        st = _written_state(capacity, seed=10)._replace(capacity=capacity, alpha=alpha, eps=1e-6)
        gen = torch.Generator(device="cuda").manual_seed(11)
        u = torch.rand(4, batch, generator=gen, device="cuda", dtype=F64)
        outs = [step_fn(st, u[i]) for i in range(4)]
        return st, outs

    def step(st, u):
        index, w = sample.sample_proportional(PriorityTree(st.leaves, st.block_sum, st.block_min, beta=beta), u)
        update.write_priorities(st, index, td[index] + 0.01, capacity)
        return index, w

    st_e, outs_e = run(step)
    st_c, outs_c = run(torch.compile(step, fullgraph=True))
    for (ie, we), (ic, wc) in zip(outs_e, outs_c):
        assert torch.equal(ie, ic) and torch.equal(we, wc)
    for k in ("raw", "leaves", "block_sum", "block_min", "max_raw", "n_clamped", "n_dropped"):
        assert torch.equal(getattr(st_e, k), getattr(st_c, k)), k


def test_forced_failure_falls_back_to_reference_with_one_warning(monkeypatch):
    def boom(device):
        raise RuntimeError("forced self-check failure")

    monkeypatch.setattr(dispatch, "_CHECKED", {})
    monkeypatch.setattr(dispatch, "_WARNED", set())
    monkeypatch.setattr(dispatch, "make_kernel_ops", boom)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chosen = [dispatch.select_backend(torch.device("cuda"), "kernels") for _ in range(2)]
        sampler = GPUPrioritizedSampler(64, 0.6, 0.4, device="cuda", backend="kernels")
    assert chosen == [reference, reference] and sampler.core.ops is reference
    runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(runtime) == 1 and "forced self-check failure" in str(runtime[0].message)


# ------------------------------------------------------------------------ fused sample + row gather
@pytest.mark.parametrize("capacity,width", [(1_000_003, 54), (20_011, 7060), (999_999, 1)])
def test_sample_gather_same_as_unfused_at_scale(capacity, width):
    """N up to 1e6, CartPole- and Pong-sized rows: index and weights bit for bit as the unfused kernel,
    rows bit for bit as ``rows[index]``."""
    st = _written_state(capacity, seed=capacity)
    g = torch.Generator(device="cuda").manual_seed(1)
    rows = torch.randint(-2**62, 2**62, (capacity, width), device="cuda", generator=g)
    for batch, stratified, normalize in ((256, True, "buffer"), (1024, False, "batch"), (32, True, "batch")):
        u = torch.rand(batch, device="cuda", dtype=F64, generator=g)
        tree = PriorityTree(st.leaves, st.block_sum, st.block_min, beta=0.4)
        index, w, got = sample.sample_proportional_gather(tree, u, rows, stratified, normalize)
        tree = PriorityTree(st.leaves, st.block_sum, st.block_min, beta=0.4)
        want_index, want_w = sample.sample_proportional(tree, u, stratified, normalize)
        assert torch.equal(index, want_index) and torch.equal(w, want_w)
        assert torch.equal(got, rows[want_index])


def _gather_step(st, rows, td, beta, alpha, capacity, out, u, fused=True):
    if fused:
        tree = PriorityTree(st.leaves, st.block_sum, st.block_min, beta=beta)
        index, w, block = sample.sample_proportional_gather(tree, u, rows)
    else:  # the unfused path: sample, then one gather
        index, w = sample.sample_proportional(PriorityTree(st.leaves, st.block_sum, st.block_min, beta=beta), u)
        block = rows[index]
    update.write_priorities(st._replace(capacity=capacity, alpha=alpha, eps=1e-6), index, td[index] + 0.01, capacity)
    out["index"], out["w"], out["rows"] = index, w, block


def test_sample_gather_captured_in_cuda_graph_replays_like_unfused_eager():
    capacity, batch, steps, width = 100_003, 256, 20, 300
    st = _written_state(capacity, seed=4)
    rows = torch.randint(-2**62, 2**62, (capacity, width), device="cuda")
    td = torch.rand(capacity, device="cuda")
    beta, alpha = (torch.tensor(v, dtype=F64, device="cuda") for v in (0.4, ALPHA))
    uniforms = torch.rand(steps, batch, device="cuda", dtype=F64)
    u_static = uniforms[0].clone()
    seen, after_graph = _replays(lambda out: _gather_step(st, rows, td, beta, alpha, capacity, out, u_static),
                                 st, u_static, uniforms)
    for i in range(steps):  # the same steps eagerly and unfused, from the same state
        eager = {}
        _gather_step(st, rows, td, beta, alpha, capacity, eager, uniforms[i], fused=False)
        for k in ("index", "w", "rows"):
            assert torch.equal(eager[k], seen[i][k]), (i, k)
    for k, v in _tree_tensors(st).items():
        assert torch.equal(v, after_graph[k]), k
    assert len(torch.cat([s["index"] for s in seen]).unique()) > 1000


def test_buffer_sample_gather_captured_in_cuda_graph():
    """The sampler's fused path on a packed storage, captured with a priority update: each replay's batch is
    the stored rows at its indices, and the weights are those of the priorities it sampled from."""
    from tensordict import TensorDict

    from lightning_per import make_replay_buffer

    capacity, batch = 4096, 256
    rb = make_replay_buffer(capacity, batch, device="cuda", packed=True, backend="kernels", seed=0)
    i = torch.arange(capacity, device="cuda")
    rb.extend(TensorDict({"observation": (i % 251)[:, None, None].to(torch.uint8).expand(capacity, 4, 84).clone(),
                          "reward": i.float(), "action": i.clone()}, [capacity]))
    sampler, storage = rb.sampler, rb.storage
    assert sampler.core.gather_rows(storage) is not None
    static = {}

    def step():
        index, info, data = sampler.sample_gather(storage, batch)
        static.update(index=index, w=info["priority_weight"], reward=data["reward"], action=data["action"],
                      obs=data["observation"], leaves=sampler.core.state.leaves.view(-1)[index].clone(),
                      p_min=sampler.core.state.block_min.amin())
        sampler.update_priority(index, data["reward"] / capacity + 0.01, storage=storage)

    graph = capture(step, [sampler.generator])
    seen = set()
    for _ in range(10):
        graph.replay()
        idx = static["index"]
        assert torch.equal(static["reward"], idx.float()) and torch.equal(static["action"], idx)
        assert torch.equal(static["obs"], (idx % 251)[:, None, None].to(torch.uint8).expand(batch, 4, 84))
        want_w = reference.is_weights(static["leaves"], static["p_min"], 0.4)
        torch.testing.assert_close(static["w"], want_w, rtol=1e-6, atol=0)
        seen.update(idx.cpu().tolist())
    assert len(seen) > 1000


def test_sample_gather_under_torch_compile_matches_eager():
    capacity, batch, width = 10_007, 128, 70
    st = _written_state(capacity, seed=12)
    rows = torch.randint(-2**62, 2**62, (capacity, width), device="cuda")
    beta = torch.tensor(0.4, dtype=F64, device="cuda")
    u = torch.rand(batch, device="cuda", dtype=F64)

    def fn(u):
        tree = PriorityTree(st.leaves, st.block_sum, st.block_min, beta=beta)
        index, w, block = sample.sample_proportional_gather(tree, u, rows, True, "batch")
        return index, w, block, (block % 7).sum(1)  # a consumer Inductor compiles around the opaque op

    got = torch.compile(fn, fullgraph=True)(u)
    want = fn(u)
    for name, g, w in zip(("index", "weight", "rows", "consumer"), got, want):
        if name == "weight":  # Inductor compiles the batch normalisation w / w.max() itself: ulp-level rounding
            torch.testing.assert_close(g, w, rtol=2e-7, atol=0)
        else:
            assert torch.equal(g, w), name
    assert torch.equal(want[2], rows[want[0]])
