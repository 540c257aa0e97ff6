"""Run ``lightning-per fit`` (args from the command line) as a plain script, so that Lightning's ``ddp``
launcher can start rank 1 by re-running this file; afterwards each rank saves what the tests compare to
``<default_root_dir>/rank{r}.pt``. Used by ``tests/test_ddp_cpu.py``."""

from __future__ import annotations

import os
import sys

import torch

from lightning_per import cli

if __name__ == "__main__":
    run = cli.cli_main(sys.argv[1:])
    m = run.model
    out = os.path.join(run.trainer.default_root_dir, f"rank{m.global_rank}.pt")
    torch.save({"params": {k: v.detach().cpu() for k, v in m.q_net.state_dict().items()},
                "env_steps": m.env_steps, "updates": m.updates, "replay_len": len(m.rb),
                "global_step": run.trainer.global_step, "world_size": run.trainer.world_size,
                "ring": m.episode_returns_ring.cpu(), "ring_count": int(m.episode_returns_count)}, out)
