"""Host-side cost of the eager replay paths, measured on the CPU in a way that carries over to the GPU.

An eager replay step on the GPU is bound by the host: Python work plus one launch per device op
(microseconds per torch op, more per Triton kernel through its Python launcher). This script runs the eager
paths of ``benchmarks/replay.py`` on the CPU with a small capacity (so the ops' own work is tiny) and
reports, per call:

* ``us``: mean time per call, the minimum over ``--repeats`` runs of ``--iters`` calls, as CPU time of this
  process (``time.process_time``, one torch thread by default: the wall time of an unloaded machine, robust to
  other jobs on a shared one; with ``--threads`` above 1 the CPU time of every thread, spinning included);
* ``aten``: ATen ops dispatched (a ``TorchDispatchMode`` counter: what reaches the kernels, after
  composite ops decompose), and ``kern``: those that are not views / allocations (``empty``), i.e. the
  ops that launch a device kernel on the GPU; ``triton``: Triton kernel launches (``--backend kernels``);
* ``py calls``: Python and builtin function calls (cProfile's count): a proxy of the host work that,
  unlike the times, does not move with the load of a shared machine;
* a cProfile top-15 (by tottime) of the Python functions on the path (``--cprofile``).

Paths (``make_replay_buffer(N, B, sampler="proportional", packed=...)``, the replay benchmark's buffer):
``sample`` = ``rb.sample(B)``; ``update`` = ``rb.update_priority(index, priority)`` with ``(B,)`` tensors
prepared once; ``step`` = ``benchmarks/replay.py``'s step (sample, then update with
``data["reward"].abs() + 0.01``); ``extend64`` = ``rb.extend(td)`` of 64 transitions.

Rows: ours packed and not, in the CPU's serial layout (the default there), and ``ours packed=False parallel``:
the parallel layout (``serial=False``, a GPU's blocks of ~sqrt(N) leaves) that a CPU sampler ran before.

Backends: ``reference`` (plain torch, the CPU path) and ``kernels``: the compiled ``ext/`` wrappers under
``TRITON_INTERPRET=1`` with every Triton launch replaced by a no-op stub, so the wrappers' own host work
is timed while the Triton launcher's is not (count it per launch from the ``triton`` column). The stub of
the sample kernels writes index 0 (the batch read needs valid slots); its ``zero_`` is not in the op counts.

On the CPU every index is a host tensor, so ``update``/``extend64`` also run the host-side range check of
``update_priority``/``mark_update`` (``aminmax`` + two ``item``): three ops that device indices skip on the GPU.
TorchRL's buffers run alongside (``torchrl-per``: C++ sum tree, ``torchrl-uniform``) as a yardstick.

    python -m benchmarks.replay_host                       # table, both packings, reference ops
    python -m benchmarks.replay_host --backend kernels --cprofile --json /tmp/host.json
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import time
from collections import Counter
from pathlib import Path


def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--extend", type=int, default=64, help="transitions per extend call")
    ap.add_argument("--obs", type=int, default=4,
                    help="observation width (replay.py's transition: 51; small keeps the CPU kernels' own work small)")
    ap.add_argument("--iters", type=int, default=300, help="timed calls per repeat")
    ap.add_argument("--repeats", type=int, default=15, help="timing repeats; the minimum mean is reported")
    ap.add_argument("--backend", choices=["reference", "kernels"], default="reference")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (CPU time then counts every thread's, spinning included)")
    ap.add_argument("--no-torchrl", action="store_true", help="skip TorchRL's buffers")
    ap.add_argument("--cprofile", action="store_true", help="print a cProfile top-15 (tottime) per path")
    ap.add_argument("--ops", action="store_true", help="list the ATen ops of each path")
    ap.add_argument("--json", default=None, help="write the rows (and the op lists) as JSON here")
    return ap.parse_args(argv)


ARGS = _parse(sys.argv[1:]) if __name__ == "__main__" else None
if ARGS is not None and ARGS.backend == "kernels":
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported (torchrl imports it)

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from benchmarks._harness import host_profile  # noqa: E402

_NO_KERNEL = {"empty", "empty_strided", "empty_like", "lift_fresh", "detach", "alias", "_unsafe_view",
              "view", "as_strided", "expand", "slice", "select", "unsqueeze", "squeeze", "t", "transpose",
              "permute", "_reshape_alias", "unbind", "split", "view_as_real", "view_as_complex"}


class OpCounter(TorchDispatchMode):
    """Counts the ATen ops dispatched while active (``paused`` skips ops, e.g. those of launch stubs)."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    @staticmethod
    def kernel_ops(ops: Counter) -> int:
        return sum(n for name, n in ops.items() if name.rstrip("_") not in _NO_KERNEL)


COUNTER: OpCounter | None = None


class _LaunchStub:
    """Stands in for a ``@triton.jit`` function: ``stub[grid](*args, **meta)`` launches nothing and counts.

    ``zero``: argument positions of int64 outputs to fill with 0 (indices the caller reads back)."""

    launches = 0

    def __init__(self, zero=()):
        self.zero = zero

    def __getitem__(self, grid):
        def launch(*args, **meta):
            _LaunchStub.launches += 1
            if COUNTER is not None:
                COUNTER.paused = True
            try:
                for i in self.zero:
                    args[i].zero_()
            finally:
                if COUNTER is not None:
                    COUNTER.paused = False
        return launch


def _stub_kernels() -> None:
    from lightning_per.ops.dispatch import select_backend

    select_backend(torch.device("cpu"), "kernels")  # built and self-checked with the real (interpreted) kernels
    from lightning_per.ext import blocks, priority, rank, sample, update
    from triton.runtime.jit import KernelInterface

    for module in (blocks, priority, rank, sample, update):
        for name, obj in list(vars(module).items()):
            if name.endswith("_kernel") and isinstance(obj, KernelInterface):
                # the sample kernels' index output (argument 6) must hold valid slots for the batch read
                setattr(module, name, _LaunchStub(zero=(6,) if name.startswith("_sample") else ()))


def batch(n: int, obs: int):
    """``benchmarks/replay.py``'s transitions (5 keys) with ``obs``-wide observations, on the CPU."""
    from tensordict import TensorDict

    return TensorDict({"observation": torch.randn(n, obs), "next_observation": torch.randn(n, obs),
                       "action": torch.randint(0, 45, (n,)), "reward": torch.randn(n),
                       "done": torch.zeros(n, dtype=torch.bool)}, [n])


def measure(fn, iters: int, repeats: int) -> dict:
    """Mean us per call (min over repeats), ATen ops and Triton launches per call."""
    global COUNTER
    for _ in range(20):
        fn()
    best = float("inf")
    for _ in range(repeats):  # CPU time of this process: robust to other jobs on a shared machine
        t0 = time.process_time()
        for _ in range(iters):
            fn()
        best = min(best, (time.process_time() - t0) / iters)
    calls = 20
    COUNTER = OpCounter()
    launches0 = _LaunchStub.launches
    with COUNTER:
        for _ in range(calls):
            fn()
    ops, COUNTER = COUNTER.ops, None
    launches = (_LaunchStub.launches - launches0) / calls
    per_call = Counter({k: v / calls for k, v in ops.items()})
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    py_calls = pstats.Stats(pr).total_calls / calls
    return {"us": best * 1e6, "aten": sum(ops.values()) / calls, "kern": OpCounter.kernel_ops(ops) / calls,
            "triton": launches, "py_calls": py_calls,
            "ops": dict(sorted(per_call.items(), key=lambda kv: -kv[1]))}


def profile_text(fn, calls: int = 2000, top: int = 15) -> str:
    """:func:`_harness.host_profile` from its column header on, paths relative to the working directory."""
    lines = host_profile(fn, calls, top).splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls")), 0)
    return "\n".join(line.replace(str(Path.cwd()) + "/", "") for line in lines[start:] if line.strip())


def paths(rb, a) -> dict:
    """The callables to measure on one filled buffer."""
    B = a.batch
    td = batch(a.extend, a.obs)
    data = rb.sample(B)
    index, priority = data["index"].clone(), (data["reward"].abs() + 0.01).clone()

    def step():
        d = rb.sample(B)
        rb.update_priority(d["index"], d["reward"].abs() + 0.01)

    out = {"sample": lambda: rb.sample(B)}
    if hasattr(rb, "update_priority"):
        out["update"] = lambda: rb.update_priority(index, priority)
        out["step"] = step
    out["extend64"] = lambda: rb.extend(td)
    return out


def buffers(a):
    from lightning_per import make_replay_buffer

    N, B = a.capacity, a.batch
    for packed in (False, True):
        yield (f"ours packed={packed}",
               make_replay_buffer(N, B, sampler="proportional", device="cpu", backend=a.backend, packed=packed,
                                  generator=torch.Generator().manual_seed(0)))
    if a.backend == "reference":  # the parallel layout a CPU sampler had before its serial one (a GPU's blocks)
        yield ("ours packed=False parallel",
               make_replay_buffer(N, B, sampler="proportional", device="cpu", backend=a.backend, packed=False,
                                  generator=torch.Generator().manual_seed(0), serial=False))
    if a.no_torchrl:
        return
    from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer, TensorDictReplayBuffer

    yield ("torchrl-per", TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(N),
                                                            batch_size=B))
    yield "torchrl-uniform", TensorDictReplayBuffer(storage=LazyTensorStorage(N), batch_size=B)


def main(a) -> int:
    torch.set_num_threads(a.threads)
    if a.backend == "kernels":
        _stub_kernels()
    rows, profiles = [], {}
    for name, rb in buffers(a):
        for start in range(0, a.capacity, 1024):
            rb.extend(batch(min(1024, a.capacity - start), a.obs))
        for path, fn in paths(rb, a).items():
            r = measure(fn, a.iters, a.repeats)
            rows.append({"buffer": name, "path": path, **r})
            print(f"{name:22s} {path:9s} {r['us']:8.1f} us  aten {r['aten']:5.1f}  kern {r['kern']:5.1f}"
                  f"  triton {r['triton']:.1f}  py calls {r['py_calls']:.0f}", flush=True)
            if a.ops:
                print("    " + ", ".join(f"{k} {v:g}" for k, v in r["ops"].items()))
            if a.cprofile and name.startswith("ours"):
                profiles[f"{name} {path}"] = profile_text(fn)
    print()
    print(table(rows, a))
    for key, text in profiles.items():
        print(f"\n== cProfile, top 15 by tottime: {key} (2000 calls)\n{text}")
    if a.json:
        meta = {"torch": torch.__version__, "capacity": a.capacity, "batch": a.batch, "extend": a.extend,
                "obs": a.obs, "backend": a.backend}
        Path(a.json).write_text(json.dumps({"meta": meta, "rows": rows, "cprofile": profiles}, indent=1))
    return 0


def table(rows, a) -> str:
    lines = [f"N={a.capacity}, B={a.batch}, extend {a.extend}, obs {a.obs}, backend={a.backend}, CPU, "
             f"{a.threads} thread{'s' * (a.threads > 1)}",
             "| buffer | path | us / call | ATen ops | kernel ops | Triton launches | py calls |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['buffer']} | {r['path']} | {r['us']:.1f} | {r['aten']:.0f} | {r['kern']:.0f} "
                     f"| {r['triton']:.0f} | {r['py_calls']:.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(ARGS))
