"""Graph mode (``compile=True``, the CUDA-graph-captured update) under Lightning DDP on 2 GPUs (NCCL).

The captured update all-reduces one flat gradient buffer itself (DDP's reducer is bypassed); the
independent check is that both ranks end with bit-identical Q-network weights although each rank trains
on its own experience. Launched like ``tests/dqn/test_ddp_cpu.py``: the CLI in a subprocess
(``tests/support/_ddp_dqn_script.py``), Lightning's ``ddp`` launcher re-running it for rank 1.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")]

ROOT = Path(__file__).parents[2]
EPOCHS, UPDATES_PER_EPOCH = 3, 20
ARGS = ["--model.env.backend=torch", "--model.env.num_envs=8", "--model.replay.capacity=4096",
        "--model.replay.batch_size=64", "--model.hidden_sizes=[64, 64]", "--model.warmup_steps=256",
        f"--model.updates_per_epoch={UPDATES_PER_EPOCH}", "--model.compile=true",
        "--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.accelerator=gpu",
        f"--trainer.max_epochs={EPOCHS}", "--trainer.enable_progress_bar=false", "--trainer.logger=false"]


# A captured CUDA graph still holding its NCCL all-reduce at exit hangs torch.distributed.destroy_process_group
# (Lightning's atexit hook); DQN.teardown releases the graph (docs/ddp.md), which this run also checks.
@pytest.mark.parametrize("sampler", ["proportional", "uniform"])  # graph scope "full" / "learner"
def test_two_gpu_graph_mode_fit_keeps_ranks_identical(tmp_path, sampler):
    run = tmp_path / "run"
    args = [sys.executable, str(ROOT / "tests" / "support" / "_ddp_dqn_script.py"), "fit",
            "--config", str(ROOT / "configs" / "dqn_cartpole.yaml"), *ARGS,
            f"--model.replay.sampler={sampler}", f"--trainer.default_root_dir={run}"]
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONWARNINGS": "ignore"}
    env.pop("WANDB_API_KEY", None)
    env.setdefault("LIGHTNING_PER_DUMP_AFTER_S", "90")  # a hung rank dumps its threads' stacks to stderr
    limit = float(os.environ.get("LIGHTNING_PER_DDP_TIMEOUT_S", "200"))
    try:
        proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired as err:
        out = (err.stdout or b"").decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
        errs = (err.stderr or b"").decode(errors="replace") if isinstance(err.stderr, bytes) else (err.stderr or "")
        pytest.fail(f"the 2-rank run did not finish in {limit:.0f} s; stdout tail:\n{out[-3000:]}\nstderr tail "
                    f"(stack dumps):\n{errs[-12000:]}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]

    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "done" and summary["world_size"] == 2
    assert summary["updates"] == EPOCHS * UPDATES_PER_EPOCH and math.isfinite(summary["metrics"]["loss"])

    ranks = {r: torch.load(run / f"rank{r}.pt", weights_only=False) for r in range(2)}
    for r in range(2):
        assert ranks[r]["world_size"] == 2 and ranks[r]["grad_world_size"] == 2
        assert ranks[r]["graph_mode"]  # the update was captured (not the eager fallback)
        assert ranks[r]["updates"] == ranks[r]["global_step"] == EPOCHS * UPDATES_PER_EPOCH
    # distinct experience on each rank (own env and replay seeds) ...
    assert not torch.equal(ranks[0]["ring"].nan_to_num(), ranks[1]["ring"].nan_to_num())
    # ... yet identical weights: only true if every update averaged the gradients over both ranks
    for name, p in ranks[0]["params"].items():
        assert torch.isfinite(p).all(), name
        torch.testing.assert_close(p, ranks[1]["params"][name], rtol=0, atol=0, msg=name)
