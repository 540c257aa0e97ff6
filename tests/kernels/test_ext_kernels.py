"""Compiled replay kernels (``ext/``, package ``lightning_per.ext``) against the reference ops.

Runs the kernels on CUDA when available (tests marked ``gpu``), else on CPU tensors through Triton's
interpreter (sizes kept small: ~12 s). The interpreter must be chosen before ``triton`` is first
imported (``import lightning_per`` imports it through torchrl), so ``conftest.py`` sets
``TRITON_INTERPRET=1`` on machines without CUDA; when the file runs alone this module sets it too.
If triton was imported without it, the CPU cases are skipped. GPU-only checks (large N, drift, CUDA
graphs, sync-free) live in ``test_ext_kernels_gpu.py``.
"""

from __future__ import annotations

import warnings

import lightning_per.ext as ext  # noqa: E402
import pytest
import torch
from _kernel_devices import KDEVS  # noqa: E402  (sets TRITON_INTERPRET on CPU, as conftest.py)
from _philox import expected_uniforms  # noqa: E402
from lightning_per.ext import _common, blocks, gather, priority, rank, sample, update  # noqa: E402
from lightning_per.ext.state import PriorityTree, RankTable  # noqa: E402

from lightning_per import GPUPrioritizedSampler, GPURankBasedSampler  # noqa: E402
from lightning_per.ops import dispatch, reference  # noqa: E402
from lightning_per.ops.selfcheck import boundary_uniforms, fresh_state, make_levels  # noqa: E402


@pytest.fixture(params=KDEVS)
def kdev(request):
    return torch.device(request.param)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


class _Len:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


# ---------------------------------------------------------------------------------------- search
@pytest.mark.parametrize("capacity,max_chunk", [(7, 4096), (33, 4)])
def test_two_level_search_same_index_as_reference_with_ties(kdev, gen, capacity, max_chunk):
    """Integer masses make every prefix sum exact: boundary draws (u S == C_i) must resolve alike."""
    leaves, bs, _ = make_levels(capacity, kdev, gen)
    u = boundary_uniforms(bs, 4, gen, n_bound=16 if max_chunk > 4 else 8)
    index, value, _ = sample._launch_sample(leaves, bs, None, u, None, 0.0, False, max_chunk=max_chunk)
    want_index, want_value = reference.two_level_search_with_values(leaves, bs, u)
    torch.testing.assert_close(index, want_index, rtol=0, atol=0)
    torch.testing.assert_close(value, want_value, rtol=0, atol=0)
    assert (value > 0).all()  # never a zero-mass slot


def test_two_level_search_float_masses_and_public_wrapper(kdev, gen):
    leaves, bs, _ = make_levels(50, kdev, gen, integer=False)
    u = torch.rand(8, generator=gen, dtype=torch.float64).to(kdev)
    torch.testing.assert_close(ext.sample.two_level_search(leaves, bs, u),
                               reference.two_level_search(leaves, bs, u))


@pytest.mark.parametrize("normalize", ["buffer", "batch"])
@pytest.mark.parametrize("stratified", [True, False])
def test_sample_proportional_matches_reference(kdev, gen, normalize, stratified):
    leaves, bs, bm = make_levels(30, kdev, gen)
    u = torch.rand(6, generator=gen, dtype=torch.float64).to(kdev)
    beta = torch.tensor(0.7, dtype=torch.float64, device=kdev) if stratified else 0.4  # tensor or float
    index, w = sample.sample_proportional(PriorityTree(leaves, bs, bm, beta=beta), u, stratified, normalize)
    tree = PriorityTree(leaves, bs, bm, beta=beta)
    want_index, want_w = reference.sample_proportional(tree, u, stratified, normalize)
    torch.testing.assert_close(index, want_index, rtol=0, atol=0)
    torch.testing.assert_close(w, want_w, rtol=1e-6, atol=0)
    assert w.dtype == torch.float32 and (w <= 1).all()


def test_all_zero_masses_give_the_last_slot_not_out_of_range(kdev):
    leaves = torch.zeros(3, 4, device=kdev)
    bs = torch.zeros(3, dtype=torch.float64, device=kdev)
    u = torch.tensor([0.0, 0.5], dtype=torch.float64, device=kdev)
    assert sample.two_level_search(leaves, bs, u).tolist() == [11, 11]


# ---------------------------------------------------------------------------------------- update
def _launch_state(tree):
    """The write launcher's state arguments of a :class:`~lightning_per.ext.state.PriorityTree`."""
    return (tree.raw, tree.leaves, tree.block_sum, tree.block_min, tree.max_raw, tree.n_clamped, tree.n_dropped,
            tree.scratch)


@pytest.mark.parametrize("max_chunk,max_quadratic,max_one", [(4096, 4096, 1024), (4, 4096, 1024), (4096, 4096, 0),
                                                             (4, 4096, 0), (4096, 8, 0)])
def test_write_priorities_matches_reference_with_clashes(kdev, gen, max_chunk, max_quadratic, max_one):
    """Duplicated slots with clashing values (last wins), NaN/Inf/negative priorities, rejected slots;
    each path: one launch with block tickets (max_one), two launches, the O(B) path above max_quadratic."""
    capacity, n_valid = 45, 40
    leaves = make_levels(capacity, kdev, gen, integer=False)[0]
    got, want = fresh_state(leaves), fresh_state(leaves)
    for alpha in (0.6, torch.tensor(0.5, dtype=torch.float64, device=kdev)):
        index = torch.randint(-3, capacity + 3, (20,), generator=gen)
        index[:8] = index[8:16].flip(0)  # clashes, in both orders
        prio = torch.rand(20, generator=gen, dtype=torch.float64) * 5
        prio[2], prio[9], prio[13], prio[17] = float("nan"), float("inf"), -float("inf"), -0.5
        index, prio = index.to(kdev), prio.to(kdev)
        update._launch_write(*_launch_state(got), index, prio, n_valid, capacity,
                             *_common.scalar_arg(alpha, "alpha", kdev), 1e-6, max_chunk=max_chunk,
                             max_quadratic=max_quadratic, max_one=max_one)
        reference.write_priorities(want._replace(capacity=capacity, alpha=alpha, eps=1e-6), index, prio, n_valid)
    for key in ("raw", "leaves", "block_min", "max_raw"):
        torch.testing.assert_close(getattr(got, key), getattr(want, key), rtol=1e-6, atol=0)
    torch.testing.assert_close(got.block_sum, want.block_sum, rtol=1e-12, atol=0)
    assert got.n_clamped.item() == want.n_clamped.item() == 8
    assert got.n_dropped.item() == want.n_dropped.item() > 0
    assert got.leaves.view(-1)[capacity].item() == 0  # the trash slot stays empty
    if max_one:  # the one-launch path leaves its counters at zero
        assert not got.scratch.tickets.any()
    if not max_one and max_quadratic < 20:  # the O(B) path leaves its scratch at -1 and its flags at zero
        assert bool((got.scratch.last_writer == -1).all()) and not bool(got.scratch.flags.any())


@pytest.mark.parametrize("max_chunk,max_quadratic,max_one", [(4096, 4096, 1024), (4096, 4096, 0), (4096, 8, 0)])
def test_masked_write_stores_zero_values_where_the_mask_is_false(kdev, gen, max_chunk, max_quadratic, max_one):
    """A write with ``valid`` (a slice sampler's start mask): the unmasked write's raw priorities, running max and
    counters, with the stored value 0 wherever the mask is False; every kernel path equals the reference."""
    capacity, n_valid = 45, 40
    leaves = make_levels(capacity, kdev, gen, integer=False)[0]
    valid = (torch.rand(leaves.numel(), generator=gen) < 0.6).to(kdev)
    got, want, plain = fresh_state(leaves), fresh_state(leaves), fresh_state(leaves)
    for state in (got, want):  # a masked state holds no value where the mask is False
        state.leaves.view(-1).mul_(valid)
        total, low = reference.reduce_blocks(state.leaves)
        state.block_sum.copy_(total)
        state.block_min.copy_(low)
    index = torch.randint(-3, capacity + 3, (20,), generator=gen)
    index[:8] = index[8:16].flip(0)  # clashes, in both orders
    prio = torch.rand(20, generator=gen, dtype=torch.float64) * 5
    prio[2], prio[9] = float("nan"), -0.5
    index[18], index[19] = -1, capacity + 1  # rejected entries: dropped, masked or not
    index, prio = index.to(kdev), prio.to(kdev)
    update._launch_write(*_launch_state(got), index, prio, n_valid, capacity,
                         *_common.scalar_arg(0.6, "alpha", kdev), 1e-6, valid, max_chunk=max_chunk,
                         max_quadratic=max_quadratic, max_one=max_one)
    reference.write_priorities(want._replace(capacity=capacity, alpha=0.6, eps=1e-6), index, prio, n_valid, valid)
    reference.write_priorities(plain._replace(capacity=capacity, alpha=0.6, eps=1e-6), index, prio, n_valid)
    for key in ("raw", "leaves", "block_min", "max_raw"):
        torch.testing.assert_close(getattr(got, key), getattr(want, key), rtol=1e-6, atol=0)
    torch.testing.assert_close(got.block_sum, want.block_sum, rtol=1e-12, atol=0)
    torch.testing.assert_close(want.leaves.view(-1), plain.leaves.view(-1) * valid, rtol=0, atol=0)
    for key in ("raw", "max_raw", "n_clamped", "n_dropped"):
        torch.testing.assert_close(getattr(want, key), getattr(plain, key), rtol=0, atol=0)
    assert got.n_dropped.item() == want.n_dropped.item() > 0


@pytest.mark.parametrize("n", [40, update.MAX_ONE_LAUNCH])  # the largest one-launch batch: the most entries per
def test_one_launch_write_many_entries_in_one_block(kdev, gen, n):  # block and per slot the packed counts hold
    """``n`` entries into one block of 8 slots (one block ticket drawn n times), every slot repeated with
    clashing values; a NaN as the *last* write of a slot, in a first call (no priority seen: it takes 1) and
    a second one (it takes the running max before the call). Each slot keeps its last value (a Python dict
    replays the writes), the block sum is the float64 sum of the row."""
    leaves = make_levels(45, kdev, gen, integer=False)[0]  # block 8
    got, want = fresh_state(leaves), fresh_state(leaves)
    running_max = None
    for call in range(2):
        index = torch.randint(0, 8, (n,), generator=gen)
        prio = torch.rand(n, generator=gen) * 5
        index[n - 1], prio[n - 1] = 3, float("nan")  # the last write of slot 3
        index, prio = index.to(kdev), prio.to(kdev)
        update._launch_write(*_launch_state(got), index, prio, 45, 45, None, 0.7, 1e-6)
        reference.write_priorities(want._replace(capacity=45, alpha=0.7, eps=1e-6), index, prio, 45)
        for key in ("raw", "leaves", "block_min", "max_raw", "n_clamped"):
            torch.testing.assert_close(getattr(got, key), getattr(want, key), rtol=1e-6, atol=0)
        torch.testing.assert_close(got.block_sum, want.block_sum, rtol=1e-12, atol=0)
        last = dict(zip(index.tolist(), prio.tolist()))  # later pairs overwrite earlier ones
        for slot, value in last.items():
            expected = (1.0 if call == 0 else running_max) if value != value else value
            assert got.raw[slot].item() == pytest.approx(expected, rel=1e-6), (call, slot)
        assert got.block_sum[0].item() == pytest.approx(got.leaves[0].double().sum().item(), rel=1e-12)
        assert got.n_clamped.item() == call + 1
        running_max = got.max_raw.item()


def test_sampler_makes_the_write_counters_when_it_allocates(kdev):
    """The compiled backend's sampler makes the write's persistent tensors (the one-launch kernel's counters, the
    O(B) path's scratch and flags) with its state (outside any CUDA-graph capture that may record its first
    write), and makes new ones when it reallocates; the reference backend's state holds none in the parallel
    layout, and in the serial one (a CPU's default) the last-writer scratch its write uses, left at -1."""
    from lightning_per import GPUPrioritizedSampler

    s = GPUPrioritizedSampler(100, 0.6, 0.4, backend="kernels", device=kdev)
    assert "write_priorities" in s.core.ops.COMPILED
    counters, scratch, flags = s.core.state.scratch
    assert counters.shape == (s.core.n_blocks + 1,) and not counters.any()
    assert scratch.shape == (s.core.state.leaves.numel(),) and bool((scratch == -1).all()) and not flags.any()
    s.core.reset()  # a reallocation (e.g. empty())
    assert s.core.state.scratch is not None and s.core.state.scratch.tickets is not counters
    assert s.core.state.scratch.last_writer.shape == (s.core.state.leaves.numel(),)
    assert GPUPrioritizedSampler(100, 0.6, 0.4, backend="reference", device=kdev,
                                 serial=False).core.state.scratch is None
    serial = GPUPrioritizedSampler(100, 0.6, 0.4, backend="reference", device="cpu", serial=True)
    serial.update_priority(torch.tensor([3, 5, 3]), torch.tensor([1.0, 2.0, 4.0]))
    assert torch.equal(serial.core.state.raw[[3, 5]], torch.tensor([4.0, 2.0]))  # the last write of slot 3 wins
    assert bool((serial.core.state.scratch.last_writer == -1).all())


def test_write_priorities_public_op_and_validation(kdev, gen):
    leaves = make_levels(20, kdev, gen)[0]
    st = fresh_state(leaves)
    index = torch.tensor([3, 3, 5], device=kdev)
    prio = torch.tensor([1.0, 2.0, 4.0], device=kdev)
    update.write_priorities(st._replace(capacity=20, alpha=1.0, eps=0.0), index, prio, 20)
    assert st.raw[3].item() == 2.0 and st.leaves.view(-1)[5].item() == 4.0
    assert st.max_raw.item() == 4.0  # max over every accepted value, the overwritten 1.0 included
    with pytest.raises(ValueError, match="priority must have 3 elements"):
        update.write_priorities(st._replace(capacity=20, alpha=1.0, eps=0.0), index, torch.ones(2, device=kdev), 20)
    with pytest.raises(ValueError, match="n_valid"):
        update.write_priorities(st._replace(capacity=20, alpha=1.0, eps=0.0), index, torch.ones(3, device=kdev), 21)
    before = st.raw.clone()
    with pytest.raises(ValueError, match="tree.scratch must be the write's WriteScratch"):
        update.write_priorities(st._replace(capacity=20, scratch=None), index, prio * 3, 20)
    assert torch.equal(st.raw, before)  # refused: nothing written


# ------------------------------------------------------------------------------- per-op kernels
def test_priority_ops_match_reference(kdev, gen):
    raw = torch.tensor([0.5, float("nan"), float("inf"), -float("inf"), -2.0, 0.0, 3.0], device=kdev)
    mp = torch.tensor(7.0, device=kdev)
    clean, n_bad = priority.sanitize_priority(raw, mp)
    want_clean, want_bad = reference.sanitize_priority(raw, mp)
    torch.testing.assert_close(clean, want_clean)
    assert n_bad.item() == want_bad.item() == 4
    c = torch.rand(50, generator=gen).to(kdev) * 3
    for alpha in (0.0, 0.6, torch.tensor(0.8, dtype=torch.float64, device=kdev)):
        torch.testing.assert_close(priority.transform_priority(c, alpha, 1e-8),
                                   reference.transform_priority(c, alpha, 1e-8), rtol=1e-6, atol=0)


@pytest.mark.parametrize("max_chunk", [4096, 4])
def test_reduce_blocks_matches_reference(kdev, gen, max_chunk):
    rows = make_levels(150, kdev, gen, integer=False)[0]  # block 16, zeros and padding
    total, low = blocks._launch_reduce(rows, max_chunk=max_chunk)
    want_total, want_low = reference.reduce_blocks(rows)
    torch.testing.assert_close(total, want_total, rtol=1e-12, atol=0)
    torch.testing.assert_close(low, want_low, rtol=0, atol=0)


def test_last_writer_and_last_write_wins(kdev, gen):
    index = torch.randint(0, 9, (100,), generator=gen).to(kdev)  # two programs of 64
    values = torch.rand(100, generator=gen, dtype=torch.float64).to(kdev)
    torch.testing.assert_close(blocks.last_write_wins(index, values),
                               reference.last_write_wins(index, values))
    pos = torch.arange(100, dtype=torch.int32, device=kdev)
    got = blocks.last_writer(index, torch.zeros(9, dtype=torch.int32, device=kdev), pos)
    assert got.dtype == torch.int64
    torch.testing.assert_close(got, reference.last_write_wins(index, pos.long()))


def test_is_weights_matches_reference(kdev, gen):
    p = torch.rand(40, generator=gen).to(kdev) + 0.1
    for beta in (0.5, torch.tensor(0.4, dtype=torch.float64, device=kdev)):
        for normalize in ("buffer", "batch"):
            torch.testing.assert_close(sample.is_weights(p, p.min(), beta, normalize),
                                       reference.is_weights(p, p.min(), beta, normalize), rtol=1e-6, atol=0)


@pytest.mark.parametrize("normalize", ["buffer", "batch"])
def test_rank_sample_matches_reference(kdev, gen, normalize):
    _, cdf = reference.rank_weights(300, 0.7, kdev)
    order = torch.randperm(300, generator=gen).to(kdev)
    u = torch.cat([torch.rand(40, generator=gen, dtype=torch.float64), torch.tensor([0.0, 0.5])]).to(kdev)
    alpha, beta = (torch.tensor(v, dtype=torch.float64, device=kdev) for v in (0.7, 0.5))
    for n in (1, 257, 300):
        index, w = rank.rank_sample(RankTable(cdf, order, alpha, beta), u, n, True, normalize)
        want_index, want_w = reference.rank_sample(RankTable(cdf, order, alpha, beta), u, n, True, normalize)
        torch.testing.assert_close(index, want_index, rtol=0, atol=0)
        torch.testing.assert_close(w, want_w, rtol=1e-6, atol=0)


def test_launchers_raise_with_the_limit(kdev):
    u = torch.rand(4, dtype=torch.float64, device=kdev)
    wide = torch.zeros(1, _common.MAX_BLOCK + 1, device=kdev)
    with pytest.raises(ValueError, match=f"block in \\[1, {_common.MAX_BLOCK}\\]"):
        sample.two_level_search(wide, torch.zeros(1, dtype=torch.float64, device=kdev), u)
    leaves = torch.ones(2, 4, device=kdev)
    with pytest.raises(TypeError, match="block_sum must be torch.float64"):
        sample.two_level_search(leaves, torch.ones(2, device=kdev), u)
    with pytest.raises(ValueError, match="block_sum must have 2 elements"):
        sample.two_level_search(leaves, torch.ones(3, dtype=torch.float64, device=kdev), u)
    with pytest.raises(ValueError, match="B >= 1"):
        sample.two_level_search(leaves, torch.ones(2, dtype=torch.float64, device=kdev), u[:0])
    with pytest.raises(ValueError, match="n must lie in"):
        table = RankTable(torch.ones(3, dtype=torch.float64, device=kdev), torch.arange(3, device=kdev), 0.5, 0.5)
        rank.rank_sample(table, u, 4)


# ------------------------------------------------------------------------- backend and samplers
def test_kernel_ops_expose_reference_names_and_pass_self_check(kdev):
    backend = dispatch.select_backend(kdev, "kernels")  # make_kernel_ops + self-check, cached per device
    for name in reference.__all__:
        assert callable(getattr(backend, name)), name
    assert backend.two_level_search_with_values is sample.two_level_search_with_values
    assert backend.block_size_for is reference.block_size_for  # delegated
    assert set(ext.FUSED_OPS) <= set(backend.COMPILED)
    assert set(ext.STORAGE_OPS) <= set(backend.COMPILED)
    assert backend.gather_stacks is gather.gather_stacks and backend.scatter_rows is gather.scatter_rows


@pytest.mark.parametrize("name", ["gather_rows", "scatter_rows", "gather_stacks"])
def test_self_check_refuses_a_wrong_storage_op(kdev, name):
    """The storages' copies are part of the backend's self-check: one that loses the first row is refused."""
    from lightning_per.ops.kernels import KernelOps
    from lightning_per.ops.selfcheck import self_check

    def wrong_gather(src, index):
        out = gather.gather_rows(src, index)
        out[0] = 0
        return out

    def wrong_scatter(dst, index, src):
        gather.scatter_rows(dst, index[1:], src[1:])

    def wrong_stacks(ring, positions, index):
        return gather.gather_stacks(ring, positions, torch.flip(index, [0]))

    wrong = {"gather_rows": wrong_gather, "scatter_rows": wrong_scatter, "gather_stacks": wrong_stacks}[name]
    broken = type("BrokenOps", (KernelOps,), {name: staticmethod(wrong)})(kdev)
    with pytest.raises(RuntimeError, match=f"self-check failed: {name}"):
        self_check(broken, torch.device(kdev))


@pytest.mark.parametrize("cls", [GPUPrioritizedSampler, GPURankBasedSampler])
def test_sampler_with_kernel_backend_draws_like_reference(kdev, cls, monkeypatch):
    """Same slots, weights and stored state as the reference sampler given the same uniforms: the rank
    sampler's come from the same seeded generator; the proportional kernels draw theirs from the device RNG,
    whose documented Philox stream (tests/support/_philox.py) the reference sampler is fed."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback allowed here
        fast = cls(45, 0.6, 0.4, device=kdev, backend="kernels", seed=3, shuffle_strata=False)  # device RNG
    slow = cls(45, 0.6, 0.4, device=kdev, backend="reference", seed=3, eager_graphs=False,
               shuffle_strata=False, serial=False)  # (host uniforms; the kernels' layout)
    assert fast.core.ops is not reference and "two_level_search_with_values" in fast.core.ops.COMPILED
    assert (fast.core.state.rng is not None) == (cls is GPUPrioritizedSampler)
    if fast.core.state.rng is not None:
        assert int(fast.core.state.rng[0]) == 3  # seeded from the generator's seed

        def philox_uniforms(batch_size):
            counts = fast.core.state.rng[1:1 + batch_size].cpu().numpy().copy()
            return torch.from_numpy(expected_uniforms(3, counts)).to(kdev)

        monkeypatch.setattr(slow.core, "rand", lambda shape: philox_uniforms(shape[0]))
    storage = _Len(40)
    for s in (fast, slow):
        s.mark_update(torch.arange(40), storage=storage)
    for _ in range(2):
        i_slow, info_slow = slow.sample(storage, 8)  # first: it reads the counters before the kernel counts
        i_fast, info_fast = fast.sample(storage, 8)
        torch.testing.assert_close(i_fast, i_slow, rtol=0, atol=0)
        torch.testing.assert_close(info_fast["priority_weight"], info_slow["priority_weight"], rtol=1e-6,
                                   atol=0)
        td = torch.rand(8, generator=torch.Generator().manual_seed(int(i_fast[0]))).to(kdev) * 3
        fast.update_priority(i_fast, td, storage=storage)
        slow.update_priority(i_slow, td, storage=storage)
    torch.testing.assert_close(fast.core.state.leaves, slow.core.state.leaves, rtol=1e-6, atol=0)
    torch.testing.assert_close(fast.core.state.block_sum, slow.core.state.block_sum, rtol=1e-12, atol=0)


# ------------------------------------------------------------------------------------- fallback
def _select_with_failure(monkeypatch, device):
    def boom(device):
        raise RuntimeError("forced self-check failure")

    monkeypatch.setattr(dispatch, "_CHECKED", {})
    monkeypatch.setattr(dispatch, "_WARNED", set())
    monkeypatch.setattr(dispatch, "make_kernel_ops", boom)
    monkeypatch.setattr(dispatch, "load_ext", lambda: ext)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = dispatch.select_backend(device, "kernels")
        second = dispatch.select_backend(device, "kernels")
    runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    return first, second, runtime


def test_forced_failure_falls_back_to_reference_with_one_warning(monkeypatch):
    """CPU-only check of the dispatcher path: select_backend(cuda, 'kernels') with a failing build."""
    first, second, runtime = _select_with_failure(monkeypatch, torch.device("cuda"))
    assert first is reference and second is reference
    assert len(runtime) == 1 and "forced self-check failure" in str(runtime[0].message)


def test_missing_ext_falls_back_with_one_warning(monkeypatch):
    monkeypatch.setattr(dispatch, "_CHECKED", {})
    monkeypatch.setattr(dispatch, "_WARNED", set())
    monkeypatch.setattr(dispatch, "load_ext", lambda: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backends = [dispatch.select_backend(torch.device("cuda:0"), "kernels") for _ in range(2)]
    assert backends == [reference, reference]
    assert sum(issubclass(w.category, RuntimeWarning) for w in caught) == 1


# ------------------------------------------------------------------------ fused sample + row gather
def _ring(n_rows: int, width: int, gen: torch.Generator, device) -> torch.Tensor:
    """A packed ring ``(n_rows, width) int64`` of random bit patterns (every word distinct in practice)."""
    return torch.randint(-2**62, 2**62, (n_rows, width), generator=gen, dtype=torch.int64).to(device)


@pytest.mark.parametrize("capacity,width,max_gather_chunk,stratified,normalize", [
    (7, 1, 4096, True, "buffer"),      # one word per row, one-block buffer
    (45, 54, 4096, False, "buffer"),   # CartPole-sized rows, one pass
    (33, 54, 16, True, "batch"),       # several passes, W not a multiple of the chunk
    (61, 37, 32, False, "batch"),      # odd capacity, W < 2 chunks
    (5, 7060, 4096, True, "buffer"),   # Pong-sized rows: two passes, the second partial
    (5, 7060, 4096, False, "batch"),
])
def test_sample_proportional_gather_equals_sample_then_indexing(kdev, gen, capacity, width, max_gather_chunk,
                                                                stratified, normalize):
    """Same slots and weights as the unfused kernel (bit for bit) and the reference, rows = rows[index]."""
    leaves, bs, bm = make_levels(capacity, kdev, gen)  # integer masses: exact sums, boundary draws included
    rows = _ring(capacity, width, gen, kdev)
    u = boundary_uniforms(bs, 5, gen, n_bound=6)
    beta = torch.tensor(0.6, dtype=torch.float64, device=kdev) if stratified else 0.4
    beta_t, beta_v = _common.scalar_arg(beta, "beta", kdev)
    index, w, got_rows = sample._launch_sample_gather(leaves, bs, bm, u, beta_t, beta_v, stratified, rows,
                                                      max_gather_chunk=max_gather_chunk)
    if normalize == "batch":
        w = w / w.max()
    plain_index, plain_w = sample.sample_proportional(PriorityTree(leaves, bs, bm, beta=beta), u, stratified, normalize)
    assert torch.equal(index, plain_index) and torch.equal(w, plain_w)
    tree = PriorityTree(leaves, bs, bm, beta=beta)
    want_index, want_w = reference.sample_proportional(tree, u, stratified, normalize)
    torch.testing.assert_close(index, want_index, rtol=0, atol=0)
    torch.testing.assert_close(w, want_w, rtol=1e-6, atol=0)
    assert got_rows.dtype == torch.int64 and got_rows.shape == (u.numel(), width) and got_rows.is_contiguous()
    assert torch.equal(got_rows, rows[want_index])


@pytest.mark.parametrize("normalize", ["buffer", "batch"])
def test_sample_proportional_gather_public_op_and_backend(kdev, gen, normalize):
    leaves, bs, bm = make_levels(30, kdev, gen, integer=False)
    rows = _ring(30, 9, gen, kdev)
    u = torch.rand(6, generator=gen, dtype=torch.float64).to(kdev)
    backend = dispatch.select_backend(kdev, "kernels")
    assert backend.sample_proportional_gather is sample.sample_proportional_gather
    assert "sample_proportional_gather" in backend.COMPILED
    for _ in range(2):  # the second call takes the validated fast path
        tree = PriorityTree(leaves, bs, bm, beta=0.5)
        index, w, got = backend.sample_proportional_gather(tree, u, rows, True, normalize)
        tree = PriorityTree(leaves, bs, bm, beta=0.5)
        want_index, want_w, want_rows = reference.sample_proportional_gather(tree, u, rows, True, normalize)
        torch.testing.assert_close(index, want_index, rtol=0, atol=0)
        torch.testing.assert_close(w, want_w, rtol=1e-6, atol=0)
        assert torch.equal(got, want_rows) and torch.equal(got, rows[index])
    # the registered custom op (what torch.compile and the fake-tensor shapes go through)
    op_index, op_w, op_rows = torch.ops.lightning_per.sample_proportional_gather(leaves, bs, bm, u, None, 0.5, True,
                                                                                rows)
    plain_index, plain_w = sample.sample_proportional(PriorityTree(leaves, bs, bm, beta=0.5), u, True)
    assert torch.equal(op_index, plain_index) and torch.equal(op_w, plain_w)
    assert torch.equal(op_rows, rows[plain_index])


def test_sample_proportional_gather_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        leaves, bs = torch.empty(4, 8), torch.empty(4, dtype=torch.float64)
        bm, u = torch.empty(4), torch.empty(16, dtype=torch.float64)
        rows = torch.empty(30, 11, dtype=torch.int64)
        index, w, out = torch.ops.lightning_per.sample_proportional_gather(leaves, bs, bm, u, None, 0.4, True, rows)
    assert (index.shape, index.dtype) == ((16,), torch.int64)
    assert (w.shape, w.dtype) == ((16,), torch.float32)
    assert (out.shape, out.dtype) == ((16, 11), torch.int64)


def test_sample_proportional_gather_slot_beyond_the_ring_reads_zeros(kdev):
    """All-zero priorities give the last slot of the padded array (11 here), past a 10-row ring: the
    kernel writes a zero row instead of reading outside the ring."""
    leaves = torch.zeros(3, 4, device=kdev)
    bs = torch.zeros(3, dtype=torch.float64, device=kdev)
    bm = torch.full((3,), float("inf"), device=kdev)
    rows = torch.arange(1, 51, dtype=torch.int64, device=kdev).view(10, 5)
    u = torch.tensor([0.0, 0.5], dtype=torch.float64, device=kdev)
    index, _, got = sample.sample_proportional_gather(PriorityTree(leaves, bs, bm, beta=0.4), u, rows)
    assert index.tolist() == [11, 11]
    assert torch.equal(got, torch.zeros(2, 5, dtype=torch.int64, device=kdev))


def test_sample_proportional_gather_validates_rows(kdev, gen):
    leaves, bs, bm = make_levels(10, kdev, gen)
    u = torch.rand(4, dtype=torch.float64, device=kdev)
    with pytest.raises(TypeError, match="rows must be torch.int64"):
        sample.sample_proportional_gather(PriorityTree(leaves, bs, bm, beta=0.4), u, torch.zeros(10, 3, device=kdev))
    with pytest.raises(ValueError, match="rows must be 2-D"):
        tree = PriorityTree(leaves, bs, bm, beta=0.4)
        sample.sample_proportional_gather(tree, u, torch.zeros(10, dtype=torch.int64, device=kdev))
    with pytest.raises(ValueError, match="stride 1"):
        tree = PriorityTree(leaves, bs, bm, beta=0.4)
        sample.sample_proportional_gather(tree, u, torch.zeros(3, 10, dtype=torch.int64, device=kdev).t())
    with pytest.raises(ValueError, match="non-empty"):
        tree = PriorityTree(leaves, bs, bm, beta=0.4)
        sample.sample_proportional_gather(tree, u, torch.zeros(10, 0, dtype=torch.int64, device=kdev))
    with pytest.raises(ValueError, match="normalize"):
        tree = PriorityTree(leaves, bs, bm, beta=0.4)
        sample.sample_proportional_gather(tree, u, torch.zeros(10, 2, dtype=torch.int64, device=kdev), normalize="max")


# ----------------------------------------------------------------------- large-batch torch paths
@pytest.mark.parametrize("n", [1, 2, 37, 5000])
def test_large_batch_torch_paths_equal_the_reference(gen, n):
    """The plain-torch paths the launchers take above MAX_QUADRATIC (ext/torch_paths.py, written without the
    reference so that ext/ imports nothing of lightning_per) give the reference's result, clashes included."""
    from lightning_per.ext import torch_paths

    index = torch.randint(0, max(n // 3, 1), (n,), generator=gen)
    values = torch.rand(n, generator=gen, dtype=torch.float64)
    assert torch.equal(torch_paths.sorted_last_write_wins(index, values), reference.last_write_wins(index, values))
    positions = torch.arange(n, dtype=torch.int32)
    scratch = torch.zeros(n + 1, dtype=torch.int32)
    assert torch.equal(torch_paths.scatter_last_writer(index, scratch.clone(), positions),
                       reference.last_writer(index, scratch, positions))


def test_every_op_of_the_protocol_takes_at_most_six_parameters():
    """The ops take their state as one value (``ext.state``) plus the call's own arguments: at most 6 parameters."""
    import inspect

    from lightning_per.ops.protocol import CompiledReplayOps, ReplayOps

    for proto in (ReplayOps, CompiledReplayOps):
        for name, fn in vars(proto).items():
            if callable(fn) and not name.startswith("_"):
                params = [p for p in inspect.signature(fn).parameters if p != "self"]
                assert len(params) <= 6, (name, params)
                assert len(inspect.signature(getattr(reference, name, fn)).parameters) <= 6, name
