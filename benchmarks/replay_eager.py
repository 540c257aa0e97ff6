"""Where the eager replay step's host time goes on the GPU, piece by piece (CUDA only).

``benchmarks/replay.py``'s eager step (``rb.sample(B)``, ``data["reward"].abs() + 0.01``,
``rb.update_priority``) is bound by the host. This times each piece of it alone, on one filled
``make_replay_buffer(N, B, packed=True, backend="kernels")`` buffer, as host-bound calls timed with CUDA
events over ``--iters`` calls (the device is idle most of the time, so each row is the host cost):

  rand            torch.rand(B) from the sampler's device generator (the draw preamble's one op)
  sample-kernel   the fused sample + gather op on prepared uniforms (1 Triton launch + 3 output allocations)
  rows-to-batch   the batch TensorDict built from the gathered rows (views; no kernel)
  priority-op     ``data["reward"].abs() + 0.01``
  write-kernel    the fused priority write on prepared tensors (2 Triton launches)
  sample          ``rb.sample(B)``
  update          ``rb.update_priority(index, priority)``
  step            the whole step
  *-launches      the same on a buffer with ``eager_graphs=False`` (sample, update, step above replay the
                  sampler's cached CUDA graphs, the default)
  graph-replay    one CUDA graph of the sample kernel's work, replayed (what a cached graph costs the host)
  clone-rows      one clone of the (B, W) gathered rows

    python -m benchmarks.replay_eager --out benchmarks/results/replay_eager.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from benchmarks._harness import capture, timed
from benchmarks.replay import fill


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=float, default=1e6)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("CUDA is not available: this benchmark times the GPU host path", file=sys.stderr)
        return 2
    from lightning_per import make_replay_buffer

    device, N, B = torch.device("cuda"), int(a.capacity), a.batch
    rb, rb_launches = (make_replay_buffer(N, B, sampler="proportional", device=device, backend="kernels",
                                          packed=True, eager_graphs=graphs, generator=torch.Generator().manual_seed(0))
                       for graphs in (True, False))
    fill(rb, N, device)
    fill(rb_launches, N, device)
    sampler, storage, ops = rb.sampler, rb.storage, rb.sampler.core.ops
    rows = storage.gather_rows
    u = torch.rand(B, device=device, dtype=torch.float64)
    tree = sampler.core.state.tree()
    index, w, block = ops.sample_proportional_gather(tree, u, rows)
    data = rb.sample(B)
    prio = data["reward"].abs() + 0.01
    gen = sampler.generator

    def sample_kernel():
        return ops.sample_proportional_gather(tree, u, rows)

    def step(rb=rb):
        d = rb.sample(B)
        rb.update_priority(d["index"], d["reward"].abs() + 0.01)

    # what a cached "gather" graph records
    replay = capture(lambda: sampler.core.rule.draw(sampler.core, B, N, (), rows), [gen])
    pieces = {
        "rand": lambda: torch.rand(B, generator=gen, device=device, dtype=torch.float64),
        "sample-kernel": sample_kernel,
        "rows-to-batch": lambda: storage.rows_to_batch(block, {"index": index, "priority_weight": w}),
        "priority-op": lambda: data["reward"].abs() + 0.01,
        "write-kernel": lambda: sampler.core.write_eager(index, prio, N),  # the op a cached "write" graph records
        "sample": lambda: rb.sample(B),
        "update": lambda: rb.update_priority(index, prio),
        "step": step,
        "sample-launches": lambda: rb_launches.sample(B),
        "update-launches": lambda: rb_launches.update_priority(index, prio),
        "step-launches": lambda: step(rb_launches),
        "graph-replay": replay,
        "clone-rows": lambda: block.clone(),
    }
    rows_out = [{"piece": name, "host_us": timed(fn, a.iters, device) * 1e6} for name, fn in pieces.items()]
    meta = {"N": N, "B": B, "width_words": rows.shape[1], "device_name": torch.cuda.get_device_name(),
            "torch": torch.__version__, "triton": __import__("triton").__version__}
    for r in rows_out:
        print(f"{r['piece']:<14} {r['host_us']:8.1f} us")
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.iters):
        step()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    print(text.getvalue())
    if a.out:
        Path(a.out).write_text(json.dumps({"meta": meta, "rows": rows_out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
