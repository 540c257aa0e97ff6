"""How many device kernels does one DQN update launch, and how long do they run? Eager vs Inductor.

The update of ``benchmarks/dqn.py``'s replay rows (net 51-256-256-45, N = 1e5, B = 256, proportional PER:
sample -> gather -> learner step -> priority update), in up to four modes:

  eager            the plain update, one launch per kernel
  eager-inductor   the learner's forwards, target, loss, backward and clip compiled by Inductor
                   (``lightning_per.dqn.compiled.InductorUpdate``, as ``DQN(inductor=True)``)
  graph, graph-inductor   (``--graph``) the same two captured in a CUDA graph and replayed; the kernels
                   inside a replay are listed as CUPTI reports them

For each mode: ``--warmup`` updates (compilation, autotuning, lazy module loading), then ``--steps``
updates under ``torch.profiler`` (``ProfilerActivity.CUDA``). Reported per update: device kernels
(memcpy/memset counted apart), the sum of their device durations (us; a lower bound of the update's
device time: gaps between kernels excluded), kernel-launch API calls on the host, and the kernels grouped
by name (count and us per update, largest first). Printed and written to ``--out`` (JSON).

    python -m benchmarks.profile_dqn --out benchmarks/results/profile_dqn.json            # GPU
    python -m benchmarks.profile_dqn --graph --out benchmarks/results/profile_dqn.json    # + graph modes
    python -m benchmarks.profile_dqn --tiny --device cpu --out /tmp/p.json                # CPU smoke test

On the CPU there are no device kernels: the counts are aten operators (``aten::*`` CPU events, nested
ones included), which only checks that the script runs.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.dqn import add_net_args, fill, graph_body, make_net  # noqa: E402

_LAUNCH_APIS = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC",
                "cudaGraphLaunch")
_MODES = ("eager", "eager-inductor", "graph", "graph-inductor")


def kernel_stats(prof, steps: int, device: torch.device) -> dict:
    """Per-update kernel counts and device time from a finished ``torch.profiler.profile``."""
    from torch.autograd import DeviceType

    kernels: dict[str, list[float]] = {}
    copies = launches = 0
    for e in prof.events():
        if device.type == "cuda":
            if e.device_type == DeviceType.CUDA:
                if e.name.startswith(("Memcpy", "Memset")):
                    copies += 1
                    continue
                kernels.setdefault(e.name, []).append(e.time_range.elapsed_us())
            elif e.name in _LAUNCH_APIS:
                launches += 1
        elif e.name.startswith("aten::"):
            kernels.setdefault(e.name, []).append(e.time_range.elapsed_us())
    by_name = sorted(({"name": k, "per_update": len(v) / steps, "us_per_update": sum(v) / steps}
                      for k, v in kernels.items()), key=lambda r: -r["us_per_update"])
    return {"kernels_per_update": sum(len(v) for v in kernels.values()) / steps,
            "kernel_us_per_update": sum(sum(v) for v in kernels.values()) / steps,
            "memcpy_memset_per_update": copies / steps, "launch_calls_per_update": launches / steps,
            "by_name": by_name}


def profile_mode(mode: str, rb, a, device: torch.device) -> dict:
    """Build a fresh network for ``mode``, warm it up, then profile ``a.steps`` updates."""
    from lightning_per import graphs
    from lightning_per.dqn.compiled import CompiledStep, InductorUpdate
    from lightning_per.dqn.learner import learner_step
    from lightning_per.graphs.capturing import no_recompiles

    torch.manual_seed(0)
    q = make_net(a.obs, a.hidden, a.actions).to(device)
    tgt = copy.deepcopy(q).requires_grad_(False)
    inductor = mode.endswith("inductor")
    # as DQN: fused Adam, or with inductor a foreach Adam whose step is compiled too (dqn/compiled.py)
    opt = torch.optim.Adam(q.parameters(), lr=1e-4, fused=not inductor, foreach=True if inductor else None,
                           capturable=device.type == "cuda")
    fast, stepper = None, opt
    if inductor:
        fast = InductorUpdate(q, tgt, double_dqn=True, huber_delta=1.0, grad_clip_norm=10.0, backend=a.backend,
                              mode=a.inductor_mode)
        stepper = CompiledStep(opt, backend=a.backend, clip=(list(q.parameters()), 10.0))  # as DQN's graph mode
    body = graph_body(rb.sampler, rb.storage, learner_step, q, tgt, stepper, a.batch, fast, clip_in_step=inductor)

    def eager():
        opt.zero_grad(set_to_none=True)
        body()

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    eager()  # the first call compiles in the inductor modes (the second recompiles the optimizer step)
    eager()
    sync()
    first_s = time.perf_counter() - t0
    fn = eager
    if mode.startswith("graph"):
        fn = graphs.capture(eager, state=[q, opt, rb.sampler], check_syncs=False)  # Inductor recompiles in warm-up
    with no_recompiles():
        for _ in range(a.warmup):
            fn()
        sync()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            for _ in range(a.steps):
                fn()
            sync()
    return {"mode": mode, "first_call_s": first_s, **kernel_stats(prof, a.steps, device)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_net_args(ap)
    ap.add_argument("--warmup", type=int, default=10, help="updates before profiling (after the first call)")
    ap.add_argument("--steps", type=int, default=10, help="profiled updates")
    ap.add_argument("--graph", action="store_true", help="also profile the CUDA-graph modes")
    ap.add_argument("--backend", default="inductor", help="torch.compile backend of the inductor modes")
    ap.add_argument("--top", type=int, default=25, help="kernel names printed per mode")
    ap.add_argument("--modes", nargs="+", choices=_MODES, default=None,
                    help="modes to profile (default: eager, eager-inductor; with --graph all four)")
    ap.add_argument("--inductor-mode", default="default", choices=["default", "max-autotune-no-cudagraphs"],
                    help="torch.compile mode of the inductor modes")
    ap.add_argument("--tf32", action="store_true", help="TF32 tensor cores for float32 matmuls")
    ap.add_argument("--tiny", action="store_true", help="tiny sizes: a smoke test")
    ap.add_argument("--out", required=True, help="JSON file to write")
    a = ap.parse_args(argv)
    if a.tiny:
        a.capacity, a.batch, a.hidden, a.obs, a.actions, a.warmup, a.steps = 2048, 32, [32, 32], 8, 4, 2, 2
    device = torch.device(a.device)
    if a.graph and device.type != "cuda":
        raise SystemExit("--graph needs a CUDA device")
    from lightning_per import make_replay_buffer

    torch.set_num_threads(1)
    rb = make_replay_buffer(a.capacity, a.batch, sampler="proportional", device=device, packed=True)  # as DQN
    fill(rb, a.capacity, a.obs, a.actions, device)
    results = []
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    modes = a.modes or (_MODES if a.graph else _MODES[:2])
    if any(m.startswith("graph") for m in modes) and device.type != "cuda":
        raise SystemExit("the graph modes need a CUDA device")
    for mode in modes:
        r = profile_mode(mode, rb, a, device)
        results.append(r)
        unit = "kernels" if device.type == "cuda" else "aten ops"
        print(f"== {mode}: {r['kernels_per_update']:.1f} {unit}/update, {r['kernel_us_per_update']:.1f} us/update "
              f"(sum of durations), {r['memcpy_memset_per_update']:.1f} memcpy/memset, "
              f"{r['launch_calls_per_update']:.1f} launch calls; first call {r['first_call_s']:.1f} s")
        for k in r["by_name"][:a.top]:
            print(f"   {k['per_update']:6.1f} x {k['us_per_update']:8.1f} us  {k['name'][:110]}")
    meta = {"device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
            else "cpu", "torch": torch.__version__, "args": vars(a)}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "modes": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
