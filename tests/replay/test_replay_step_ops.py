"""The device work of one captured replay step (sample B + read the batch + update B priorities), counted op by
op with a ``TorchDispatchMode`` on the CPU: what a CUDA graph of the step records, without a GPU.

A shuffled stratified draw (``shuffle_strata``, the default) may add only its permutation's few elementwise ops
of ``B`` (or ``B * B``) elements to the step: no sort (for a short row a sort kernel runs in a single thread
block) and no op over the ``N`` slots. These steps are the parallel layout's (``serial=False``, what a CUDA
sampler runs); the serial layout a CPU sampler takes by default is counted against them at the end.
"""

from __future__ import annotations

import collections
import itertools

import pytest
import torch
from scipy import stats
from tensordict import TensorDict
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from lightning_per import make_replay_buffer
from lightning_per.replay.rules import RANK_PERMUTATION_MAX, random_permutation

N, B = 1 << 17, 256  # N > B * B: the permutation's (B, B) comparison is not mistaken for work over the slots
SORTS = ("sort", "argsort", "msort", "randperm", "topk", "kthvalue")
INDEXING = {"index", "index_select", "index_put_", "scatter_reduce_", "index_fill_", "gather", "scatter_"}


class _Ops(TorchDispatchMode):
    """Records ``(op name, largest input or output numel)`` of every non-view aten op."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            sizes = [t.numel() for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
            self.ops.append((func.overloadpacket.__name__, max(sizes, default=0)))
        return out


def _step_ops(serial: bool = False, **sampler_kwargs) -> list[tuple[str, int]]:
    rb = make_replay_buffer(N, B, sampler="proportional", device="cpu", backend="reference", packed=True,
                            generator=torch.Generator().manual_seed(0), serial=serial, **sampler_kwargs)
    rb.extend(TensorDict({"observation": torch.randn(N, 51), "action": torch.randint(0, 4, (N,)),
                          "reward": torch.randn(N)}, [N]))
    sampler, storage = rb.sampler, rb.storage

    def step():  # what the benchmark's ours-*-graph rows capture
        index, info, data = sampler.sample_gather(storage, B)
        sampler.update_priority(index, data["reward"].abs() + 0.01, storage=storage)

    step()
    with _Ops() as mode:
        step()
    return mode.ops


def test_shuffled_strata_add_no_sort_and_no_work_over_the_slots():
    ordered, shuffled = _step_ops(shuffle_strata=False), _step_ops()
    sorts = [n for op, n in shuffled if op in SORTS]
    assert sorts == [n for op, n in ordered if op in SORTS]  # the reference write's own sort of the B slots only
    big = [op for op, n in shuffled if n >= N]
    assert big == [op for op, n in ordered if n >= N]  # the same O(N) ops (the reference search's), no more
    extra = collections.Counter(op for op, _ in shuffled) - collections.Counter(op for op, _ in ordered)
    # the permutation: one (B, B) comparison and its row sum (the keys come from the same rand call)
    assert sum(extra.values()) <= 2, extra
    assert max(n for op, n in shuffled if op in extra) <= B * B


def test_random_permutation_is_uniform():
    """The ranks of 3 uniform keys hit each of the 3! orders with probability 1/6: chi-square over 6000 draws
    (seed 0) at level 1e-3; a permutation with one order at 1/4 instead (the others sharing the rest) is
    rejected with power > 0.999 (noncentrality 6000 * sum((p - 1/6)^2 / (1/6)) = 750)."""
    g = torch.Generator().manual_seed(0)
    counts = collections.Counter(tuple(random_permutation(torch.rand(3, generator=g, dtype=torch.float64)).tolist())
                                 for _ in range(6000))
    assert sorted(counts) == sorted(itertools.permutations(range(3)))
    assert stats.chisquare(list(counts.values())).pvalue > 1e-3


@pytest.mark.parametrize("b", [1, 5, RANK_PERMUTATION_MAX, RANK_PERMUTATION_MAX + 1])
def test_random_permutation_is_a_permutation_of_the_key_order(b):
    keys = torch.rand(b, generator=torch.Generator().manual_seed(b), dtype=torch.float64)
    perm = random_permutation(keys)
    assert perm.dtype == torch.int64 and torch.equal(perm.sort().values, torch.arange(b))
    # ranks (or, beyond the comparison's size, argsort: its inverse) order the keys as NumPy's argsort does
    order = torch.from_numpy(keys.numpy().argsort(kind="stable"))
    assert torch.equal(perm, order if b > RANK_PERMUTATION_MAX else torch.empty_like(order).scatter_(
        0, order, torch.arange(b)))


def test_serial_step_does_less_work_than_the_parallel_step():
    """The CPU's serial layout (the default there): no more ops than the parallel step; the (N,) arrays (leaves,
    raw priorities, the last-writer buffer, the ring) only indexed at the B slots, never scanned; no sort but the
    strata permutation's one of B keys; every other op but the batch read's copies over at most B * 32 elements
    (blocks of 32 leaves at N = 2^17, against 512 in the parallel layout): a quarter of the parallel step's
    elements or less."""
    for shuffle in (False, True):
        parallel, serial = _step_ops(shuffle_strata=shuffle), _step_ops(serial=True, shuffle_strata=shuffle)
        assert len(serial) <= len(parallel)
        assert {op for op, n in serial if n >= N} <= INDEXING
        assert [n for op, n in serial if op in SORTS] == ([B] if shuffle else [])
        big = collections.Counter((op, n) for op, n in serial if op not in INDEXING and n > B * 32)
        assert big <= collections.Counter(parallel)  # only the batch read's copies, which both steps make
        work = [sum(n for op, n in ops if op not in INDEXING) for ops in (serial, parallel)]
        assert work[0] < work[1] / 4, work
