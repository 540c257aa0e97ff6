"""The device work of one slice draw (``sampler.sample(storage, B)``: starts drawn and expanded into slices with
their markers), counted op by op with a ``TorchDispatchMode`` on the CPU: what a CUDA graph of the draw records
(roughly one kernel an op), without a GPU.

The bounds are the counts of the replay package before it was rebuilt by composition (commit 8811eeb), measured
with this same recording (non-view aten ops of the second draw, a buffer built by ``make_replay_buffer``, flat
storage, ``slice_len`` T, ``strict_length=True``, no span): 79 for the uniform slice draw, 44 for the prioritized
one (``slice_priority="start"``). Neither count depends on N or B (both trees give the same count at the two sizes
below and at the benchmark's N = 20,000, B = 1,024): the draw's searches are two-level searches of fixed depth, and
the prioritized draw's strata permutation keeps one form up to ``RANK_PERMUTATION_MAX`` slices (1,024).
"""

from __future__ import annotations

import collections

import pytest
import torch
from tensordict import TensorDict
from torch.utils._python_dispatch import TorchDispatchMode

from lightning_per import make_replay_buffer

#: non-view aten ops of one draw at 8811eeb (see the module docstring)
OLD_UNIFORM, OLD_PRIORITIZED = 79, 44
SIZES = [(2048, 8, 16), (6000, 16, 64)]  # (N, T, S): B = S * T


class _Ops(TorchDispatchMode):
    """Records the name of every non-view aten op."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _draw_ops(kind: str, N: int, T: int, S: int) -> collections.Counter:
    """The non-view ops of one ``sampler.sample(storage, S * T)`` of a full buffer of episodes of 20..120 steps
    (the first draw, outside the recording, builds the start mask for T, as the benchmark's warm-up does)."""
    extra = {"alpha": 0.6, "beta": 0.4} if kind == "prioritized_slice" else {}
    rb = make_replay_buffer(N, S * T, sampler=kind, device="cpu", slice_len=T,
                            generator=torch.Generator().manual_seed(0), **extra)
    g = torch.Generator().manual_seed(1)
    ends = torch.cumsum(torch.randint(20, 121, (N // 20 + 1,), generator=g), 0)
    done = torch.zeros(N, 1, dtype=torch.bool)
    done[ends[ends <= N] - 1] = True
    rb.extend(TensorDict({"observation": torch.randn(N, 4, generator=g), ("next", "done"): done}, [N]))
    sampler, storage = rb.sampler, rb.storage
    sampler.sample(storage, S * T)
    with _Ops() as mode:
        sampler.sample(storage, S * T)
    return collections.Counter(mode.ops)


@pytest.mark.parametrize("N,T,S", SIZES)
def test_uniform_slice_draw_does_no_more_device_work_than_before_the_rebuild(N, T, S):
    ops = _draw_ops("slice", N, T, S)
    assert sum(ops.values()) <= OLD_UNIFORM, ops


@pytest.mark.parametrize("N,T,S", SIZES)
def test_prioritized_slice_draw_does_no_more_device_work_than_before_the_rebuild(N, T, S):
    ops = _draw_ops("prioritized_slice", N, T, S)
    assert sum(ops.values()) <= OLD_PRIORITIZED, ops
