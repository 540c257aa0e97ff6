"""Run ``lightning-per fit`` (args from the command line) under a host-read counter, as a plain script that
Lightning's ``ddp`` launcher re-runs for rank 1; each rank writes ``<default_root_dir>/reads{rank}.json``.
Used by ``tests/cli/test_lightning_workarounds.py``.

The counter is a ``TorchDispatchMode`` around the whole fit: every ``aten._local_scalar_dense`` (what
``.item()``, ``int(t)`` and ``bool(t)`` dispatch to: a read of a tensor's value by the host, a synchronisation
on CUDA) is counted, and those made inside Lightning's ``_TrainingEpochLoop._broadcast_sigterm_tensor`` (the
per-step SIGTERM check, Lightning PR #21640) separately, by the frames on the Python stack at that moment.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lightning_per import cli


class HostReads(TorchDispatchMode):
    """Counts host reads of tensor values: ``total``, and ``sigterm``, those of Lightning's SIGTERM check."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        self.sigterm = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.total += 1
            frame = sys._getframe()
            while frame is not None:
                if frame.f_code.co_name == "_broadcast_sigterm_tensor" and "lightning" in frame.f_code.co_filename:
                    self.sigterm += 1
                    break
                frame = frame.f_back
        return func(*args, **(kwargs or {}))


if __name__ == "__main__":
    reads = HostReads()
    with reads:
        run = cli.cli_main(sys.argv[1:])  # sys.argv itself stays whole: Lightning's launcher re-runs it for rank 1
    trainer = run.trainer
    out = os.path.join(trainer.default_root_dir, f"reads{trainer.global_rank}.json")
    with open(out, "w") as f:
        json.dump({"sigterm_reads": reads.sigterm, "total_reads": reads.total, "global_step": trainer.global_step,
                   "epochs": trainer.current_epoch, "world_size": trainer.world_size}, f)
