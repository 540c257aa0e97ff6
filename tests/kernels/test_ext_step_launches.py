"""The device work of one replay step with the compiled kernels, counted launch by launch: what a CUDA graph of the
benchmark's ``ours-kernels-graph`` rows records (``benchmarks/replay.py``: sample B + read the batch + update B
priorities), without a GPU.

On CPU tensors through Triton's interpreter, one step of a filled packed buffer (``sampler.sample_gather`` then
``sampler.update_priority`` of ``reward.abs() + 0.01``) is recorded twice: every Triton launch (kernel name, grid,
launch options) by a wrapper of the interpreter's ``run``, and every ATen op dispatched outside the launches by a
``TorchDispatchMode``. The reference is the replay package before it was rebuilt by composition, commit 8811eeb,
measured with this same recording (its ``sample_gather`` took no ``contiguous``; its fields were views of the
gathered rows): the learner's step (``contiguous=False``, what the DQN's graph mode draws) must do exactly that
device work, and the step whose fields are contiguous tensors of their own (``contiguous=True``, the default, what
``rb.sample()`` returns) exactly that plus the one copy that cuts them (six ``empty`` and one
``split_with_sizes_copy``): any launch, memset, copy or scalar tensor a change adds fails here before it costs the
GPU step time. The counts do not depend on N and B (8811eeb: the same at N = 4096, B = 256 and N = 512, B = 32).

Counted on the CPU only: a CUDA index skips the host-side range check of ``update_priority`` (its ``aminmax``
and two ``_local_scalar_dense``, in the counts below), and the generator comparison of a draw (one ``detach``
of its CPU state) is host work on every device.
"""

from __future__ import annotations

import collections

import pytest
import torch
from _kernel_devices import CUDA, KDEVS  # noqa: E402  (sets TRITON_INTERPRET on CPU, as conftest.py)
from tensordict import TensorDict  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from lightning_per import make_replay_buffer  # noqa: E402

pytestmark = pytest.mark.skipif(CUDA or KDEVS != ["cpu"], reason="counted on CPU tensors under Triton's interpreter")

N, B = 512, 32

#: One step's Triton launches: (kernel, grid, options), as measured on 8811eeb.
LAUNCHES = {
    "ordered": [("_sample_gather_kernel", (B,), 4), ("_write_one_kernel", (B,), 4)],
    "shuffled": [("_shuffled_uniforms_kernel", (1,), 4), ("_sample_gather_kernel", (B,), 4),
                 ("_write_one_kernel", (B,), 4)],
}

#: One step's non-view ATen ops outside the launches, as measured on 8811eeb: ``empty`` x 3 ordered (index, weights,
#: gathered rows), 4 shuffled (the shuffled draw allocates its uniforms' buffer); ``abs`` and ``add`` (the new
#: priorities); ``aminmax`` + 2 ``_local_scalar_dense`` (the CPU index check).
NON_VIEW = {
    "ordered": collections.Counter({"empty": 3, "abs": 1, "add": 1, "aminmax": 1, "_local_scalar_dense": 2}),
    "shuffled": collections.Counter({"empty": 4, "abs": 1, "add": 1, "aminmax": 1, "_local_scalar_dense": 2}),
}
#: What ``contiguous=True`` adds: the six byte columns the five fields (and the row's padding) are copied into by
#: one ``split_with_sizes_copy`` (``lightning_per.replay.rows.batch_views``).
COPY_NON_VIEW = collections.Counter({"empty": 6, "split_with_sizes_copy": 1})
#: All ATen ops, views included (host-side metadata, no device work), as measured here: 8811eeb made 18 ordered and
#: 19 shuffled, cutting only the fields the step read; the rebuilt storage cuts every field of the batch (a slice and
#: two views each, ``lightning_per.replay.rows.field_views``), and the copy of ``contiguous=True`` replaces them.
ATEN_OPS = {("ordered", False): 31, ("shuffled", False): 32, ("ordered", True): 33, ("shuffled", True): 34}


class _Record(TorchDispatchMode):
    """Records ``(op name, is_view)`` of every ATen op dispatched while no Triton launch runs."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, bool]] = []
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            self.ops.append((func.overloadpacket.__name__, func.is_view))
        return func(*args, **(kwargs or {}))


def _step_record(shuffle: bool, contiguous: bool,
                 monkeypatch) -> tuple[list[tuple[str, tuple, int]], list[tuple[str, bool]]]:
    from triton.runtime.interpreter import InterpretedFunction

    rb = make_replay_buffer(N, B, sampler="proportional", device="cpu", backend="kernels", packed=True,
                            generator=torch.Generator().manual_seed(0), shuffle_strata=shuffle)
    assert rb.sampler.core.compiled
    rb.extend(TensorDict({"observation": torch.randn(N, 51), "next_observation": torch.randn(N, 51),
                          "action": torch.randint(0, 45, (N,)), "reward": torch.randn(N),
                          "done": torch.zeros(N, dtype=torch.bool)}, [N]))
    sampler, storage = rb.sampler, rb.storage

    def step():  # what the benchmark's ours-kernels-graph rows capture
        index, info, data = sampler.sample_gather(storage, B, contiguous=contiguous)
        sampler.update_priority(index, data["reward"].abs() + 0.01, storage=storage)

    step()
    launches: list[tuple[str, tuple, int]] = []
    mode = _Record()
    run = InterpretedFunction.run

    def counted(self, *args, grid, warmup, **kwargs):
        launches.append((self.fn.__name__, tuple(grid(kwargs) if callable(grid) else grid),
                         kwargs.get("num_warps", 4)))
        mode.paused = True  # the interpreter's own tensor work is not the step's
        try:
            return run(self, *args, grid=grid, warmup=warmup, **kwargs)
        finally:
            mode.paused = False

    monkeypatch.setattr(InterpretedFunction, "run", counted)
    with mode:
        step()
    return launches, mode.ops


@pytest.mark.parametrize("contiguous", [False, True])
@pytest.mark.parametrize("order", ["ordered", "shuffled"])
def test_kernel_step_launches_and_ops_are_those_of_8811eeb(order, contiguous, monkeypatch):
    launches, ops = _step_record(order == "shuffled", contiguous, monkeypatch)
    assert launches == LAUNCHES[order]
    assert len(ops) == ATEN_OPS[order, contiguous], ops
    assert collections.Counter(name for name, view in ops if not view) == (
        NON_VIEW[order] + COPY_NON_VIEW if contiguous else NON_VIEW[order]), ops
