"""Warps per program of the two kernels of a replay step, tried one kernel at a time (CUDA only).

The fused sample + gather kernel and the one-launch priority write run one program per draw / entry, and
each program scans a row of ``sqrt(N)`` values (float64) held in registers: the number of warps sets how many
values each thread holds and how many steps the cross-warp part of the scans takes. The launchers pick it
from the chunk size (``ext._common.warps_for``). This script times the ``graph-x16`` step of
``benchmarks/replay.py`` (16 x sample + gather + new priorities + update in one CUDA graph; us per step) with
the default and with each of ``--warps`` for one kernel, the other left at its default, by wrapping the
kernel's launch (no knob in the package). Results: a table, and JSON with ``--out``.

    python -m benchmarks.tune_warps --sizes 1e6,1e7 --out benchmarks/results/tune_warps.json
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import torch

from benchmarks._harness import REPEAT, timed  # noqa: E402
from benchmarks.replay import fill, graph_step  # noqa: E402

#: (module, kernel attribute) of each tuned kernel
KERNELS = {"sample_gather": ("sample", "_sample_gather_kernel"), "write": ("update", "_write_one_kernel")}


class _Warps:
    """Stands in for a Triton kernel: ``kernel[grid](...)`` launches with ``num_warps`` replaced."""

    def __init__(self, kernel, warps: int) -> None:
        self.kernel, self.warps = kernel, warps

    def __getitem__(self, grid):
        launch = self.kernel[grid]
        return lambda *args, **kwargs: launch(*args, **{**kwargs, "num_warps": self.warps})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1e6,1e7")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--warps", default="2,4,8,16")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("tune_warps.py times CUDA kernels: it needs a GPU", file=sys.stderr)
        return 2
    from lightning_per import make_replay_buffer
    from lightning_per.ops.dispatch import load_ext

    ext = load_ext()  # lightning_per.ext (the top-level ext/ of a source checkout or an install)

    dev, B = torch.device("cuda"), args.batch
    rows = []
    for N in (int(float(s)) for s in args.sizes.split(",")):
        gc.collect()
        torch.cuda.empty_cache()
        rb = make_replay_buffer(N, B, device=dev, packed=True, backend="kernels",
                                generator=torch.Generator().manual_seed(0))
        fill(rb, N, dev)
        configs = [("default", None)] + [(name, int(w)) for name in KERNELS for w in args.warps.split(",")]
        for name, warps in configs:
            module = original = None
            if warps is not None:
                mod_name, attr = KERNELS[name]
                module = getattr(ext, mod_name)
                original = getattr(module, attr)
                setattr(module, attr, _Warps(original, warps))
            try:
                replay = graph_step(rb, B, dev, REPEAT)
                us = timed(replay, args.iters, dev) / REPEAT * 1e6
            except Exception as err:  # noqa: BLE001 - a config that does not compile is reported, not fatal
                us = float("nan")
                print(f"N={N:.0e} {name} warps={warps}: {err!r}", file=sys.stderr)
            finally:
                if module is not None:
                    setattr(module, KERNELS[name][1], original)
            rows.append({"N": N, "B": B, "kernel": name, "warps": warps, "graph_x16_us": us})
            print(f"N={N:.0e} B={B} {name:<13} warps={str(warps):<7} {us:7.2f} us/step", flush=True)
        del rb
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
