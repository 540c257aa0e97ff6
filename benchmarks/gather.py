"""Gather of a sampled batch from a replay storage: advanced indexing ``x[idx]`` vs ``torch.index_select``.

Rows (CUDA, one process, both in CUDA-graph replay of 32 gathers per launch so that the host's launch
cost is amortised): ``(N, D)`` float32 storage rows, ``B`` int64 indices from ``torch.randint``;
microseconds per gather and the ratio. This decided ``GPUTensorStorage.get``'s kernel.

    python -m benchmarks.gather --out /tmp/gather.json
"""

from __future__ import annotations

import argparse
import json

import torch

from benchmarks._harness import capture, timed

REPEAT = 32


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e5,1e6")
    ap.add_argument("--dims", default="51,1")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs CUDA")
        return 0
    dev = torch.device("cuda")
    rows = []
    for n in (int(float(s)) for s in a.sizes.split(",")):
        for d in (int(s) for s in a.dims.split(",")):
            x = torch.randn(n, d, device=dev)
            idx = torch.randint(0, n, (a.batch,), device=dev)
            assert torch.equal(x[idx], torch.index_select(x, 0, idx))
            row = {"N": n, "D": d, "B": a.batch}
            for name, fn in (("advanced_index_us", lambda x=x, idx=idx: x[idx]),
                             ("index_select_us", lambda x=x, idx=idx: torch.index_select(x, 0, idx))):
                graph = capture(lambda fn=fn: [fn() for _ in range(REPEAT)])
                row[name] = timed(graph, 50, dev) / REPEAT * 1e6
            row["ratio"] = row["advanced_index_us"] / row["index_select_us"]
            rows.append(row)
            print(row)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(dev), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
