"""Where does one eager replay step spend its host time? torch.profiler over the replay's hot paths.

For each backend (reference plain-torch ops, compiled ext/ kernels) this profiles, at N transitions and
batch B: ``rb.sample()`` + ``rb.update_priority`` (the training step's replay work), the sampler's
``sample`` + ``update_priority`` alone, and ``rb.extend`` of 64 transitions. It prints the operators
sorted by self CPU time and the number of device kernel launches per call, and writes the tables to
``--out`` (a text file). Use it to find the host overhead that eager steps pay on top of the kernels.

    python -m benchmarks.profile_step --capacity 1000000 --batch 256 --out /tmp/profile.txt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks._harness import host_profile  # noqa: E402
from benchmarks.replay import batch, fill  # noqa: E402


def profiled(fn, reps: int, device) -> tuple[str, int]:
    for _ in range(5):
        fn()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    if device.type == "cuda":
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        for _ in range(reps):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
    events = prof.key_averages()
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx",
                                                        "cudaLaunchKernelExC"))
    return events.table(sort_by="self_cpu_time_total", row_limit=30), launches // reps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=None)
    ap.add_argument("--cprofile", action="store_true",
                    help="also run cProfile over the sampler step (Python time per function, tottime)")
    a = ap.parse_args(argv)
    device = torch.device(a.device)
    backends = ("reference", "kernels") if device.type == "cuda" else ("reference",)
    report = []
    for backend in backends:
        report += profile_backend(backend, a, device)
    if a.out:
        Path(a.out).write_text("\n".join(report) + "\n")
    return 0


def profile_backend(backend: str, a, device) -> list[str]:
    """Profile tables (and optionally a cProfile listing) for one sampler backend."""
    from lightning_per import make_replay_buffer

    report = []
    rb = make_replay_buffer(a.capacity, a.batch, sampler="proportional", device=device, backend=backend)
    fill(rb, a.capacity, device)
    sampler, storage = rb.sampler, rb.storage
    new = batch(64, device)

    def buffer_step():
        data = rb.sample()
        rb.update_priority(data["index"], data["reward"].abs() + 0.01)

    def sampler_step():
        index, info = sampler.sample(storage, a.batch)
        sampler.update_priority(index, info["priority_weight"], storage=storage)

    for name, fn in (("buffer sample+update", buffer_step), ("sampler sample+update", sampler_step),
                     ("extend 64", lambda: rb.extend(new))):
        table, launches = profiled(fn, a.reps, device)
        head = f"== {backend}: {name} (N={a.capacity}, B={a.batch}): {launches} kernel launches per call"
        print(head)
        print(table)
        report += [head, table]
    if a.cprofile:
        report += [f"== {backend}: cProfile of 200 sampler steps", host_profile(sampler_step, 200, 30)]
    return report


if __name__ == "__main__":
    sys.exit(main())
