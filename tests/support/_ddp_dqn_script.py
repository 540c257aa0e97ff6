"""Run ``lightning-per fit`` (args from the command line) as a plain script, so that Lightning's ``ddp``
launcher can start rank 1 by re-running this file; afterwards each rank saves what the tests compare to
``<default_root_dir>/rank{r}.pt``. Used by ``tests/dqn/test_ddp_cpu.py`` and ``tests/dqn/test_ddp_gpu.py``.

``--eager-graph-path`` (taken out before the CLI sees the arguments; CPU tests only): run graph mode's
code path (``compile=True``: no ``manual_backward``, DDP's reducer bypassed, our own gradient all-reduce
as the update's ``backward``) on the CPU under gloo, where ``lightning_per.graphs.capture`` runs the update
eagerly (checked) instead of capturing it. Only the device checks that refuse ``compile=True`` on a CPU are
lifted; everything else is the module's own code.
"""

from __future__ import annotations

import os
import sys

import torch

from lightning_per import cli
from lightning_per.dqn import module as dqn_module


def _eager_graph_path() -> None:
    cli.LightningPerCLI._preflight = lambda self: None  # the CLI's "compile needs a GPU" check
    dqn_module.DQN._check_device = lambda self, device: None  # and the module's: graph mode's path on the CPU


if __name__ == "__main__":
    dump_after = os.environ.get("LIGHTNING_PER_DUMP_AFTER_S")
    if dump_after:  # a hung rank prints every thread's stack to stderr (the test shows it on failure)
        import faulthandler

        faulthandler.dump_traceback_later(float(dump_after), repeat=True)
    args = sys.argv[1:]  # sys.argv itself stays whole: Lightning's launcher re-runs it for rank 1
    if "--eager-graph-path" in args:
        args = [a for a in args if a != "--eager-graph-path"]
        _eager_graph_path()
    run = cli.cli_main(args)
    m = run.model
    out = os.path.join(run.trainer.default_root_dir, f"rank{m.global_rank}.pt")
    torch.save({"params": {k: v.detach().cpu() for k, v in m.q_net.state_dict().items()},
                "env_steps": m.env_steps, "updates": m.updates, "replay_len": len(m.rb),
                "global_step": run.trainer.global_step, "world_size": run.trainer.world_size,
                "grad_world_size": m._grad_world_size, "graph_mode": m.graph_captures > 0,
                "ring": m.episode_returns_ring.cpu(), "ring_count": int(m.episode_returns_count)}, out)
