"""The one-launch priority update and the precomputed block prefix (``block_cdf``, ``p_min``) of the
compiled replay kernels (``ext/``), against independent oracles: the reference ops and NumPy.

Runs on CUDA when available (marked ``gpu``), else on CPU tensors through Triton's interpreter
(``conftest.py`` sets ``TRITON_INTERPRET=1``), which runs the programs of a grid one after another: the
last program to take a ticket is then the last program of the grid.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # effective only if triton is not imported yet

triton = pytest.importorskip("triton")
from lightning_per.ext import _common, blocks, sample, update  # noqa: E402
from lightning_per.ext.selfcheck import boundary_uniforms, fresh_state, make_levels  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from lightning_per import GPUPrioritizedSampler, GPURankBasedSampler  # noqa: E402
from lightning_per.ops import reference  # noqa: E402

if CUDA:
    KDEVS = [pytest.param("cuda", marks=pytest.mark.gpu)]
elif _common.INTERPRET and isinstance(triton.language.cumsum, InterpretedFunction):
    KDEVS = ["cpu"]
else:  # triton imported earlier in this process without the interpreter
    KDEVS = [pytest.param("cpu", marks=pytest.mark.skip(
        reason="triton was imported without TRITON_INTERPRET=1 (see conftest.py)"))]

KERNELS = ("_write_kernel", "_claim_kernel", "_scatter_kernel", "_refresh_kernel")


@pytest.fixture(params=KDEVS)
def kdev(request):
    return torch.device(request.param)


class _Len:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


class _Counting:
    """Stands in for a ``@triton.jit`` kernel: counts ``kernel[grid]`` launches, then launches it."""

    def __init__(self, kernel, name, counts):
        self.kernel, self.name, self.counts = kernel, name, counts

    def __getitem__(self, grid):
        self.counts[self.name] = self.counts.get(self.name, 0) + 1
        return self.kernel[grid]


@pytest.fixture
def launches(monkeypatch):
    counts: dict[str, int] = {}
    for name in KERNELS:
        monkeypatch.setattr(update, name, _Counting(getattr(update, name), name, counts))
    return counts


def _numpy_prefix(leaves: torch.Tensor) -> tuple[np.ndarray, np.float32]:
    """Float64 prefix sums of the row sums, and the minimum positive leaf (``inf`` if none), by NumPy."""
    x = leaves.cpu().numpy()
    cdf = np.cumsum(x.astype(np.float64).sum(axis=1))
    pos = x[x > 0]
    return cdf, np.float32(pos.min() if pos.size else np.inf)


def _assert_prefix_current(leaves, block_cdf, p_min):
    want_cdf, want_min = _numpy_prefix(leaves)
    np.testing.assert_allclose(block_cdf.cpu().numpy(), want_cdf, rtol=1e-12, atol=0)
    assert p_min.item() == want_min


def _random_batch(gen, size, capacity, clash_range=None):
    """Indices in ``[-3, capacity + 3)`` (some out of range) with duplicates, priorities with NaN, +/-Inf
    and negatives."""
    hi = clash_range or capacity
    index = torch.randint(-3, hi + 3, (size,), generator=gen)
    prio = torch.rand(size, generator=gen, dtype=torch.float64) * 5
    bad = torch.randint(0, 6, (size,), generator=gen)
    prio[bad == 0] = float("nan")
    prio[bad == 1] = float("inf")
    prio[(bad == 2) & (torch.arange(size) % 2 == 0)] = -float("inf")
    prio[(bad == 2) & (torch.arange(size) % 2 == 1)] = -0.25
    return index, prio


# ------------------------------------------------------------------------------------ fused update
@pytest.mark.parametrize("max_chunk,max_quadratic", [(4096, None), (4, None), (4096, 8)])
def test_one_launch_update_matches_reference_on_random_batches(kdev, launches, max_chunk, max_quadratic):
    """Random batches with clashing duplicates, NaN/Inf/negatives and out-of-range indices: every piece
    of state equals the reference's, the block prefix equals NumPy's, and the workspace ends zeroed."""
    gen = torch.Generator().manual_seed(7)
    capacity, n_valid = 61, 50
    leaves = make_levels(capacity, kdev, gen, integer=False)[0]
    got, want = fresh_state(leaves), fresh_state(leaves)
    for step in range(6):
        size = int(torch.randint(1, 40, (1,), generator=gen)) if step else 1
        index, prio = _random_batch(gen, size, capacity, clash_range=capacity if step % 2 else 12)
        index, prio = index.to(kdev), prio.to(kdev)
        alpha = 0.6 if step % 2 else torch.tensor(0.5, dtype=torch.float64, device=kdev)
        alpha_t, alpha_v = _common.scalar_arg(alpha, "alpha", kdev)
        before = sum(launches.values())
        update._launch_write(**got, index=index, priority=prio, n_valid=n_valid, trash=capacity, alpha=alpha_t,
                             alpha_value=alpha_v, eps=1e-6, max_chunk=max_chunk, max_quadratic=max_quadratic)
        assert sum(launches.values()) - before == (1 if size <= (max_quadratic or update.MAX_QUADRATIC) else 4)
        reference.write_priorities(**want, index=index, priority=prio, n_valid=n_valid, trash=capacity,
                                   alpha=alpha, eps=1e-6)
        for key in ("raw_store", "leaves", "block_min", "max_raw", "p_min"):
            torch.testing.assert_close(got[key], want[key], rtol=1e-6, atol=0, msg=f"{key} after step {step}")
        for key in ("block_sum", "block_cdf"):
            torch.testing.assert_close(got[key], want[key], rtol=1e-12, atol=0, msg=f"{key} after step {step}")
        for key in ("n_clamped", "n_dropped"):
            assert got[key].item() == want[key].item(), key
        assert got["workspace"].tolist() == [0] * reference.WRITE_WORKSPACE  # ticket back to 0
        _assert_prefix_current(got["leaves"], got["block_cdf"], got["p_min"])
        assert got["leaves"].view(-1)[capacity].item() == 0  # the trash slot stays empty
    assert got["n_clamped"].item() > 0 and got["n_dropped"].item() > 0


def test_last_writer_wins_across_tiles_and_blocks(kdev):
    """One block owner applies clashing writes spread over several 64-entry tiles: the last one wins."""
    st = fresh_state(torch.zeros(4, 16, device=kdev))
    index = torch.tensor([5] * 150 + [17, 5, 17], device=kdev)  # 3 tiles; slots 5 and 17 in blocks 0, 1
    prio = torch.arange(153, dtype=torch.float32, device=kdev)
    update.write_priorities(**st, index=index, priority=prio, n_valid=60, trash=60, alpha=1.0, eps=0.0)
    assert st["raw_store"][5].item() == 151.0 and st["raw_store"][17].item() == 152.0
    assert st["max_raw"].item() == 152.0
    np.testing.assert_array_equal(st["block_sum"].cpu().numpy(), [151.0, 152.0, 0.0, 0.0])
    np.testing.assert_array_equal(st["block_cdf"].cpu().numpy(), [151.0, 303.0, 303.0, 303.0])
    assert st["p_min"].item() == 151.0


def test_ticket_counter_back_to_zero_after_a_call(kdev):
    """The persistent workspace (ticket + accumulators) is zero after each call; without one, a zeroed
    one is made per call and the results are the same."""
    gen = torch.Generator().manual_seed(3)
    leaves = make_levels(40, kdev, gen, integer=False)[0]
    with_ws, without_ws, want = fresh_state(leaves), fresh_state(leaves), fresh_state(leaves)
    without_ws.pop("workspace")
    for _ in range(3):
        index, prio = _random_batch(gen, 9, 40)
        args = dict(index=index.to(kdev), priority=prio.to(kdev), n_valid=40, trash=40, alpha=0.7, eps=1e-6)
        update.write_priorities(**with_ws, **args)
        assert with_ws["workspace"].tolist() == [0, 0, 0, 0]
        update.write_priorities(**without_ws, **args)
        reference.write_priorities(**want, **args)
    for key in ("leaves", "block_sum", "block_cdf", "p_min", "max_raw", "n_clamped", "n_dropped"):
        torch.testing.assert_close(with_ws[key], without_ws[key], rtol=0, atol=0)
        torch.testing.assert_close(with_ws[key], want[key], rtol=1e-6, atol=0)


def test_block_prefix_equals_numpy_after_many_updates(kdev):
    """Many mixed updates (both paths, without and with duplicates): ``block_cdf`` and ``p_min`` always
    equal a float64 NumPy recomputation from the leaves."""
    gen = torch.Generator().manual_seed(11)
    capacity = 200
    st = fresh_state(make_levels(capacity, kdev, gen, integer=False, zero_fraction=0.6)[0])
    alpha = torch.tensor(0.8, dtype=torch.float64, device=kdev)
    for step in range(25):
        size = int(torch.randint(1, 30, (1,), generator=gen))
        index = torch.randint(0, capacity, (size,), generator=gen).to(kdev)
        prio = (torch.rand(size, generator=gen).pow(6) * 1e3).to(kdev)  # 6 orders of magnitude
        update._launch_write(**st, index=index, priority=prio, n_valid=capacity, trash=capacity, alpha=alpha,
                             alpha_value=0.0, eps=1e-6, max_quadratic=8 if step % 5 == 4 else None)
    _assert_prefix_current(st["leaves"], st["block_cdf"], st["p_min"])
    np.testing.assert_allclose(st["block_sum"].cpu().numpy(),
                               st["leaves"].cpu().numpy().astype(np.float64).sum(axis=1), rtol=1e-12, atol=0)


def test_write_validates_prefix_and_workspace(kdev):
    st = fresh_state(torch.zeros(2, 8, device=kdev))
    args = dict(index=torch.tensor([1], device=kdev), priority=torch.ones(1, device=kdev), n_valid=10, trash=10,
                alpha=1.0, eps=0.0)
    with pytest.raises(ValueError, match="both or neither"):
        update.write_priorities(**{**st, "p_min": None}, **args)
    with pytest.raises(TypeError, match="block_cdf must be torch.float64"):
        update.write_priorities(**{**st, "block_cdf": st["block_cdf"].float()}, **args)
    with pytest.raises(ValueError, match="workspace must have 4 elements"):
        update.write_priorities(**{**st, "workspace": torch.zeros(3, dtype=torch.int32, device=kdev)}, **args)


# ---------------------------------------------------------------------------------- sample prefix
@pytest.mark.parametrize("capacity,max_chunk", [(7, 4096), (33, 4), (300, 4)])
def test_sample_with_block_prefix_same_index_as_reference_with_ties(kdev, capacity, max_chunk):
    """Integer masses (exact sums): the block search over the precomputed prefix resolves boundary
    draws exactly as the reference; one chunk and several chunks of block sums."""
    gen = torch.Generator().manual_seed(capacity)
    leaves, bs, bm = make_levels(capacity, kdev, gen)
    cdf = torch.empty_like(bs)
    p_min = torch.empty((), device=kdev)
    blocks.launch_prefix(bs, bm, cdf, p_min, leaves.shape[1], max_chunk=max_chunk)
    _assert_prefix_current(leaves, cdf, p_min)
    u = boundary_uniforms(bs, 8, gen, n_bound=16)
    index, value, _ = sample._launch_sample(leaves, bs, None, u, None, 0.0, False, max_chunk=max_chunk,
                                            block_cdf=cdf, p_min=p_min)
    want_index, want_value = reference.two_level_search_with_values(leaves, bs, u)
    torch.testing.assert_close(index, want_index, rtol=0, atol=0)
    torch.testing.assert_close(value, want_value, rtol=0, atol=0)
    beta = torch.tensor(0.6, dtype=torch.float64, device=kdev)
    for normalize in ("buffer", "batch"):
        got = sample.sample_proportional(leaves, bs, bm, u[:10], beta, True, normalize, cdf, p_min)
        want = reference.sample_proportional(leaves, bs, bm, u[:10], beta, True, normalize)
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
        torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=0)


def test_sample_prefix_validation(kdev):
    leaves, bs, bm = make_levels(10, kdev, torch.Generator().manual_seed(0))
    u = torch.rand(3, dtype=torch.float64, device=kdev)
    with pytest.raises(ValueError, match="both or neither"):
        sample.sample_proportional(leaves, bs, bm, u, 0.4, block_cdf=torch.cumsum(bs, 0))
    with pytest.raises(ValueError, match="p_min must be 0-D"):
        sample.sample_proportional(leaves, bs, bm, u, 0.4, block_cdf=torch.cumsum(bs, 0), p_min=bm[:1])


# ----------------------------------------------------------------------------------------- sampler
def _check_sampler(fast, slow, storage, tag):
    """Block prefix == NumPy; kernel draws == the reference ops on sums recomputed from the leaves, and
    == the reference-backend sampler, for the same uniforms."""
    for s in (fast, slow):
        _assert_prefix_current(s._leaves, s._block_cdf, s._p_min)
    torch.testing.assert_close(fast._leaves, slow._leaves, rtol=1e-6, atol=0, msg=tag)
    if isinstance(fast, GPURankBasedSampler):  # draws by rank: the block prefix is kept, not read
        return
    state = fast.generator.get_state()
    index, info = fast.sample(storage, 12)
    replay = torch.Generator(device=fast.device)
    replay.set_state(state)
    u = torch.rand(12, generator=replay, device=fast.device, dtype=torch.float64)
    bs, bm = reference.reduce_blocks(fast._leaves)
    want_index, want_w = reference.sample_proportional(fast._leaves, bs, bm, u, fast.beta)
    torch.testing.assert_close(index, want_index, rtol=0, atol=0, msg=tag)
    torch.testing.assert_close(info["priority_weight"], want_w, rtol=1e-6, atol=0, msg=tag)
    slow_index, slow_info = slow.sample(storage, 12)
    torch.testing.assert_close(index, slow_index, rtol=0, atol=0, msg=tag)
    torch.testing.assert_close(info["priority_weight"], slow_info["priority_weight"], rtol=1e-6, atol=0, msg=tag)


@pytest.mark.parametrize("cls", [GPUPrioritizedSampler, GPURankBasedSampler])
def test_sampler_block_prefix_current_after_every_mutation(kdev, monkeypatch, tmp_path, cls):
    """extend (mark_update), update_priority (fused and large-batch paths), alpha setter,
    load_state_dict, dumps/loads, _empty: after each, draws read a current block prefix."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback allowed here
        fast = cls(90, 0.6, 0.4, device=kdev, backend="kernels", seed=5)
    slow = cls(90, 0.6, 0.4, device=kdev, backend="reference", seed=5)
    samplers = (fast, slow)
    gen = torch.Generator().manual_seed(9)
    storage = _Len(40)
    for s in samplers:
        s.mark_update(torch.arange(40), storage=storage)  # extend: new items at the max priority
    _check_sampler(fast, slow, storage, "extend")
    td = torch.rand(16, generator=gen) * 4
    idx = torch.randint(0, 40, (16,), generator=gen)
    for s in samplers:
        s.update_priority(idx, td, storage=storage)
    _check_sampler(fast, slow, storage, "update")
    monkeypatch.setattr(update, "MAX_QUADRATIC", 8)  # the large-batch path
    for s in samplers:
        s.update_priority(idx, td * 2 + 1, storage=storage)
    monkeypatch.undo()
    _check_sampler(fast, slow, storage, "large update")
    storage = _Len(70)
    for s in samplers:
        s.mark_update(torch.arange(40, 70), storage=storage)
    _check_sampler(fast, slow, storage, "extend more")
    for s in samplers:
        s.alpha = 0.9
    _check_sampler(fast, slow, storage, "alpha")
    saved = slow.state_dict()  # taken here, loaded after more updates
    for s in samplers:
        s.update_priority(torch.arange(5), torch.full((5,), 50.0), storage=storage)
        s.load_state_dict(saved)
    _check_sampler(fast, slow, storage, "load_state_dict")
    slow.update_priority(torch.arange(10), torch.rand(10, generator=gen) * 9, storage=storage)
    slow.dumps(tmp_path)
    fast.loads(tmp_path)  # a reference-backend checkpoint into a kernels-backend sampler
    slow.loads(tmp_path)
    _check_sampler(fast, slow, storage, "loads")
    storage = _Len(10)
    for s in samplers:
        s._empty()
        _assert_prefix_current(s._leaves, s._block_cdf, s._p_min)
        s.mark_update(torch.arange(10), storage=storage)
    _check_sampler(fast, slow, storage, "empty + extend")
    assert not fast._workspace.any()
