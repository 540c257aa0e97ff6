"""Kernel rows for ``benchmarks/replay.py``: the compiled ``ext/`` replay ops, eager and in CUDA-graph
replay, with a roofline column.

``kernel_rows(N, B, device)`` returns one dict per row (keys of ``replay.py``'s table plus
``bytes_per_step``, ``GBps`` and ``roofline``):

  kernels-fused-{eager,graph}         sample_proportional + write_priorities on a sampler's state
                                      (3 launches: torch.rand, sample, scatter + refresh = 4 with graph)
  kernels-fused-sample-graph          sample_proportional alone (torch.rand + 1 launch)
  kernels-fused-update-graph          write_priorities alone (2 launches)
  kernels-sampler-{eager,graph}       GPUPrioritizedSampler(backend="kernels").sample + update_priority,
                                      i.e. the per-op path the sampler takes today
  kernels-rank-fused-{eager,graph}    rank_sample alone (the sort refresh is not included)
  *-graph-x16                         the same with 16 calls captured per graph: one host launch per 16
                                      calls, so the row is the device time per call; the one-call graph
                                      rows include the host's graph-launch cost
  graph-launch-floor                  one graph of one tiny kernel: that host cost alone

Bytes moved per step (a lower bound of HBM traffic; scattered accesses count one 32-byte sector):
sample = ``12 nb`` (block sums + minima) ``+ 4 block R`` (the ``R = min(B, nb)`` rows scanned)
``+ 8 B`` (uniforms) ``+ 12 B`` (index, weight); update = ``12 B`` (index, priority) ``+ 64 B``
(two scattered 4-byte writes) ``+ 4 block R`` (rows re-read) ``+ 64 R`` (scattered sum/min writes);
``roofline = bytes / time / peak`` with the peak HBM bandwidth of the device (``PEAK_GBPS``).

    python -m benchmarks.replay_kernels --sizes 1e6,1e7 --batches 256
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings

import torch

from benchmarks._harness import REPEAT, capture, timed

#: Peak HBM bandwidth in GB/s by device-name substring (vendor figures).
PEAK_GBPS = {"H200": 4800.0, "H100": 3350.0, "A100": 2039.0}
SECTOR = 32


class _Len:
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n


def bytes_per_step(N: int, B: int, block: int, n_blocks: int) -> dict[str, int]:
    """Modelled HBM bytes of one sample and one update of ``B`` items over ``N`` slots (module docstring)."""
    rows = min(B, n_blocks)
    sample = 12 * n_blocks + 4 * block * rows + 8 * B + 12 * B
    update = 12 * B + 2 * SECTOR * B + 4 * block * rows + 2 * SECTOR * rows
    return {"sample": sample, "update": update, "step": sample + update}


def peak_gbps(device: torch.device) -> float:
    if device.type != "cuda":
        return float("nan")
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_GBPS.items() if k in name), float("nan"))


def timed_us(fn, iters: int, device: torch.device) -> float:
    """Mean microseconds per call (see _harness.timed)."""
    return timed(fn, iters, device) * 1e6


def _filled_sampler(cls, N: int, device: torch.device, backend: str):
    """A sampler with every slot written (varied priorities), filled through the fused
    ``write_priorities`` (its O(B) large-batch path: no ``(B, block)`` gather)."""
    sampler = cls(N, 0.6, 0.4, device=device, backend=backend, seed=0)
    s, chunk = sampler, 1 << 22
    tree = s.core.state.tree()
    for start in range(0, N, chunk):
        index = torch.arange(start, min(N, start + chunk), device=device)
        s.core.ops.write_priorities(tree, index, torch.rand(index.numel(), device=device) * 10, N)
    return sampler, _Len(N)


def _fused_steps(sampler, N: int, B: int, ops):
    """Closures for one fused sample, one fused update and both, over ``sampler``'s tensors."""
    s, dev = sampler, sampler.device
    tree = s.core.state.tree()
    last = {"index": torch.zeros(B, dtype=torch.int64, device=dev), "w": torch.ones(B, device=dev)}

    def sample():
        u = torch.rand(B, generator=s.generator, device=dev, dtype=torch.float64)
        last["index"], last["w"] = ops.sample_proportional(tree, u)

    def update():
        ops.write_priorities(tree, last["index"], last["w"] + 0.01, N)

    def step():
        sample()
        update()

    return sample, update, step


def kernel_rows(N: int, B: int, device: torch.device | str, iters: int = 200) -> list[dict]:
    """Time the compiled replay ops for capacity ``N`` and batch ``B`` on ``device`` (module docstring).

    Returns ``[]`` (with a warning) when the kernels do not load or fail their self-check; CUDA-graph
    rows only on CUDA (a CPU device needs ``TRITON_INTERPRET=1``: a smoke test, not a measurement).
    """
    from lightning_per.ext.state import RankTable

    from lightning_per import GPUPrioritizedSampler
    from lightning_per.ops import reference, select_backend

    device = torch.device(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ops = select_backend(device, "kernels")
    if not hasattr(ops, "write_priorities"):
        msgs = [str(w.message) for w in caught]
        warnings.warn(f"kernel rows skipped: {msgs}", RuntimeWarning, stacklevel=2)
        return []
    cuda, peak, rows = device.type == "cuda", peak_gbps(device), []

    def add(impl: str, fn, nbytes: int, graph: bool = False, gens=(), repeat: int = 1) -> None:
        """One row; ``repeat`` > 1 captures that many calls per graph (host launch cost amortised)."""
        if graph and not cuda:
            return
        body = fn if repeat == 1 else (lambda: [fn() for _ in range(repeat)])
        us = timed_us(capture(body, gens) if graph else fn, iters * 4 if graph else iters, device) / repeat
        gbps = nbytes / (us * 1e-6) / 1e9
        rows.append({"impl": impl, "N": N, "B": B, "step_us": us, "bytes_per_step": nbytes, "GBps": gbps,
                     "roofline": gbps / peak})

    sampler, storage = _filled_sampler(GPUPrioritizedSampler, N, device, "kernels")
    model = bytes_per_step(N, B, sampler.core.block, sampler.core.n_blocks)
    sample, update, step = _fused_steps(sampler, N, B, ops)
    gens = (sampler.generator,)
    add("kernels-fused-eager", step, model["step"])
    add("kernels-fused-graph", step, model["step"], graph=True, gens=gens)
    add("kernels-fused-sample-graph", sample, model["sample"], graph=True, gens=gens)
    add("kernels-fused-update-graph", update, model["update"], graph=True)
    add(f"kernels-fused-graph-x{REPEAT}", step, model["step"], graph=True, gens=gens, repeat=REPEAT)
    add(f"kernels-fused-sample-graph-x{REPEAT}", sample, model["sample"], graph=True, gens=gens, repeat=REPEAT)
    add(f"kernels-fused-update-graph-x{REPEAT}", update, model["update"], graph=True, repeat=REPEAT)

    def sampler_step():
        index, info = sampler.sample(storage, B)
        sampler.update_priority(index, info["priority_weight"] + 0.01, storage=storage)

    add("kernels-sampler-eager", sampler_step, model["step"])
    add("kernels-sampler-graph", sampler_step, model["step"], graph=True, gens=gens)

    _, cdf = reference.rank_weights(N, 0.6, device)
    order = torch.randperm(N, device=device)
    alpha, beta = (torch.tensor(v, dtype=torch.float64, device=device) for v in (0.6, 0.4))
    gen = torch.Generator(device=device).manual_seed(0)
    table = RankTable(cdf, order, alpha, beta)

    def rank_draw():
        u = torch.rand(B, generator=gen, device=device, dtype=torch.float64)
        ops.rank_sample(table, u, N)

    rank_bytes = B * (8 + 8 * max(1, N.bit_length()) // 4 + 8 + 4)  # u, ~1/4 of search reads miss L2, out
    add("kernels-rank-fused-eager", rank_draw, rank_bytes)
    add("kernels-rank-fused-graph", rank_draw, rank_bytes, graph=True, gens=(gen,))
    add(f"kernels-rank-fused-graph-x{REPEAT}", rank_draw, rank_bytes, graph=True, gens=(gen,), repeat=REPEAT)
    if cuda:
        tick = torch.zeros(1, device=device)
        add("graph-launch-floor", lambda: tick.add_(1), 4, graph=True)  # what one graph launch costs the host
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| impl | N | B | step (us) | bytes/step | GB/s | roofline |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['impl']} | {r['N']:.0e} | {r['B']} | {r['step_us']:.1f} "
                     f"| {r['bytes_per_step']:,} | {r['GBps']:.1f} | {r['roofline']:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sizes", default="1e6,1e7")
    ap.add_argument("--batches", default="256")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    rows = []
    for N in (int(float(s)) for s in args.sizes.split(",")):
        for B in (int(b) for b in args.batches.split(",")):
            rows += kernel_rows(N, B, torch.device(args.device), args.iters)
    print(table(rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
