"""Run ``lightning-per ga3c`` (args from the command line) as a plain script, so that Lightning's ``ddp``
launcher can start rank 1 by re-running this file; at the end of training each rank saves its network
weights and counters to ``<run_dir>/rank{r}.pt`` for ``tests/ga3c/test_ga3c_ddp.py`` to compare."""

from __future__ import annotations

import sys

import torch

from lightning_per.cli import ga3c_main
from lightning_per.ga3c.module import GA3C

_on_train_end = GA3C.on_train_end


def _save_then_end(self: GA3C) -> None:
    run_dir = self.trainer.default_root_dir
    torch.save({"params": {k: v.detach().cpu() for k, v in self.net.state_dict().items()},
                "updates": self.policy_version, "global_step": self.trainer.global_step,
                "world_size": self.trainer.world_size, "agents": self.system.counts().agents,
                "env_steps": self.stats.snapshot().steps}, f"{run_dir}/rank{self.global_rank}.pt")
    _on_train_end(self)


GA3C.on_train_end = _save_then_end

if __name__ == "__main__":
    sys.exit(ga3c_main(sys.argv[1:]))
