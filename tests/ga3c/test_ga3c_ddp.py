"""GA3C under Lightning DDP, 2 ranks (CPU: gloo; 2 GPUs: NCCL, `gpu` marker): one GA3C system per rank,
agents split across the ranks, gradients all-reduced by DDP. Independent check: both ranks end with
bit-identical network weights although each trains on its own agents' experience (true only if every update averaged the
gradients), and every rank took the same number of optimizer steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow
_TWO_GPUS = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")]

ROOT = Path(__file__).parents[2]
UPDATES = 30


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=_TWO_GPUS)])
def test_two_rank_ga3c_splits_agents_and_keeps_weights_identical(tmp_path, device):
    args = [sys.executable, str(ROOT / "tests" / "support" / "_ga3c_ddp_script.py"),
            "--config", str(ROOT / "configs" / "ga3c_cartpole.yaml"), "--model.devices", "2", "--model.device", device,
            "--model.agents", "3", "--model.envs_per_agent", "2", "--model.train_min_batch_size", "20",
            "--model.max_updates", str(UPDATES), "--model.updates_per_epoch", "15", "--model.max_time_s", "150",
            "--model.target_return", "null", "--model.dynamic_adjustment", "false", "--model.wandb_mode", "disabled",
            "--model.status_interval_s", "0", "--model.run_dir", str(tmp_path), "--model.run_name", "ddp"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("LIGHTNING_PER_GA3C_RUN_DIR", None)
    proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]

    (run,) = [p for p in tmp_path.iterdir() if p.is_dir() and p.name.startswith("ddp-")]  # one shared dir
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["updates"] == UPDATES
    ranks = [torch.load(run / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert [r["agents"] for r in ranks] == [2, 1]  # 3 agents split, the first rank takes the remainder
    assert all(r["updates"] == r["global_step"] == UPDATES and r["world_size"] == 2 for r in ranks)
    assert summary["env_steps_total"] == sum(r["env_steps"] for r in ranks) > 0
    for name, p in ranks[0]["params"].items():
        torch.testing.assert_close(p, ranks[1]["params"][name], rtol=0, atol=0, msg=name)
