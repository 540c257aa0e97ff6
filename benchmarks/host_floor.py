"""What the host pays per eager call on this machine: the floor under the eager replay step (CUDA only).

An eager step of ``benchmarks/replay.py`` (``rb.sample``; the benchmark's ``reward.abs() + 0.01``;
``rb.update_priority``) is bound by the host, not the GPU. This script times, on the same machine and in one
process, the pieces such a step cannot avoid and the step's own parts, as host wall time per call (mean of
``--iters`` back-to-back calls after a warm-up; the device work of each is far shorter, so the host's cost is
what is measured):

* ``launch``: one tiny eager kernel (``t.add_(1)``, in place); ``alloc+launch``: one op that returns a new
  tensor (``x.abs()``, B elements); ``copy_``: a B-element device-to-device copy into a fixed tensor;
  ``clone``: a copy into a new tensor; ``graph replay``: ``CUDAGraph.replay()`` of a one-kernel graph;
* ``rb.sample``, ``priority math`` (the benchmark's two ops), ``rb.update_priority``, and the whole step,
  for ``make_replay_buffer(N, B, packed=True)`` with the compiled kernels and cached eager graphs;
* the floors of the step and of ``extend(64)`` built from those rows (:func:`floors_of`), and each measured
  call against its floor; also the step's floor with what returning TorchRL's batch costs at the least (a
  ``view`` op per field, ``batch TensorDict``: building the TensorDict of the sampled batch's fields);
* a cProfile of the step's host functions (``--cprofile``).

    python -m benchmarks.host_floor --capacity 1000000 --batch 256 --out benchmarks/results/host_floor-h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from benchmarks._harness import host_profile  # noqa: E402
from benchmarks.replay import batch, fill, step_fn  # noqa: E402

#: the measured row each floor is compared with
MEASURED = {"step with its batch": "step"}


def per_call_us(fn, iters: int) -> float:
    """Host wall time per call (us): ``iters`` calls back to back, then one synchronisation, after a warm-up."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


def floors_of(rows: dict[str, float], fields: int | None = None) -> dict[str, float]:
    """The host floor of the eager step and of ``extend(64)`` from this run's primitive rows (docs/kernels.md,
    "Host cost of eager calls"): a step that returns fresh tensors needs a graph replay and a clone (sample),
    the benchmark's priority math, two input copies and a replay (update); an extend needs the rows' copy into
    the ring, the returned slots (an allocating launch), their copy into the graph's input and a replay.

    With ``fields`` (the sampled batch's number of keys) and the rows ``view`` and ``batch TensorDict``, also
    ``"step with its batch"``: the step floor plus what returning TorchRL's batch costs at the least, one view
    op per field of the fresh buffer and the TensorDict that holds them."""
    replay, copy = rows["graph replay"], rows["copy_"]
    floors = {"step": replay + rows["clone"] + rows["priority math"] + 2 * copy + replay,
              "rb.extend(64)": copy + rows["alloc+launch"] + copy + replay}
    if fields is not None:
        floors["step with its batch"] = floors["step"] + fields * rows["view"] + rows["batch TensorDict"]
    return floors


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--cprofile", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("host_floor.py measures the host cost of CUDA calls: it needs a GPU", file=sys.stderr)
        return 2
    from lightning_per import make_replay_buffer
    from lightning_per.replay.compat import unsafe_tensordict

    dev, B = torch.device("cuda"), args.batch
    tick, x, dst = torch.zeros(1, device=dev), torch.rand(B, device=dev), torch.empty(B, device=dev)
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        tick.add_(1)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(graph):
        tick.add_(1)
    rows = {"launch": per_call_us(lambda: tick.add_(1), args.iters),
            "alloc+launch": per_call_us(lambda: x.abs(), args.iters),
            "copy_": per_call_us(lambda: dst.copy_(x), args.iters),
            "clone": per_call_us(lambda: x.clone(), args.iters),
            "graph replay": per_call_us(graph.replay, args.iters)}
    rb = make_replay_buffer(args.capacity, B, device=dev, packed=True, backend="kernels",
                            generator=torch.Generator().manual_seed(0))
    fill(rb, args.capacity, dev)
    data = rb.sample(B)
    index, prio = data["index"], data["reward"].abs() + 0.01
    fields = dict(data.items())
    rows["view"] = per_call_us(lambda: x.as_strided((B,), (1,), 0), args.iters)
    rows["batch TensorDict"] = per_call_us(lambda: unsafe_tensordict(fields, data.batch_size, dev), args.iters)
    rows["rb.sample"] = per_call_us(lambda: rb.sample(B), args.iters)
    rows["priority math"] = per_call_us(lambda: data["reward"].abs() + 0.01, args.iters)
    rows["rb.update_priority"] = per_call_us(lambda: rb.update_priority(index, prio), args.iters)
    step = step_fn(rb, B)
    rows["step"] = per_call_us(step, args.iters)
    ext = batch(64, dev)
    rows["rb.extend(64)"] = per_call_us(lambda: rb.extend(ext), args.iters // 4)
    floors = floors_of(rows, len(list(data.keys(True, True))))  # the batch's leaves, nested ones too
    width = max(map(len, rows))
    report = [f"host wall time per call, N={args.capacity}, B={B} ({torch.cuda.get_device_name()}):"]
    report += [f"  {name:<{width}}  {us:7.1f} us" for name, us in rows.items()]
    report += [f"  {name}: floor {floor:.1f} us, measured {rows[measured]:.1f} us = {rows[measured] / floor:.2f}x"
               for name, floor in floors.items() for measured in [MEASURED.get(name, name)]]
    if args.cprofile:
        report += ["", "== cProfile of 500 steps", host_profile(step, 500, 25)]
    print("\n".join(report))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"capacity": args.capacity, "batch": B, "us_per_call": rows,
                                   "floor_us": floors}, indent=1))
        out.with_suffix(".txt").write_text("\n".join(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
