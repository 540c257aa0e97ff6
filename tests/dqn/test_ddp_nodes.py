"""``--trainer.num_nodes 2``: the DQN under Lightning DDP across two "nodes" of one process each, on localhost
over gloo. Each node's process is started by hand with the environment Lightning's ``LightningEnvironment``
reads on a cluster (``NODE_RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), as a job scheduler would;
global rank = node rank here. Checks the replay shards are keyed by global rank, and checkpoint + resume."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_per.callbacks import AtomicCheckpointIO
from lightning_per.dqn.ddp import load_replay_shard, replay_shard_path

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
TINY = ["--model.env.num_envs=4", "--model.replay.capacity=1000", "--model.replay.batch_size=16",
        "--model.hidden_sizes=[16, 16]", "--model.warmup_steps=64", "--model.updates_per_epoch=20",
        "--trainer.enable_progress_bar=false", "--trainer.logger=false"]
NODES = ["--trainer.strategy=ddp", "--trainer.devices=1", "--trainer.num_nodes=2", "--trainer.accelerator=cpu"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fit_two_nodes(run_dir: Path, *extra: str, epochs: int) -> dict[int, dict]:
    args = [sys.executable, str(ROOT / "tests" / "support" / "_ddp_dqn_script.py"), "fit",
            "--config", str(ROOT / "configs" / "dqn_cartpole.yaml"), *TINY, *NODES,
            f"--trainer.default_root_dir={run_dir}", f"--trainer.max_epochs={epochs}", *extra]
    port = _free_port()
    procs = []
    for node in range(2):
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "NODE_RANK": str(node), "LOCAL_RANK": "0",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen(args, cwd=run_dir.parent, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=240)[0] for p in procs]
    for node, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"node {node}:\n{out[-4000:]}"
    return {r: torch.load(run_dir / f"rank{r}.pt", weights_only=True) for r in range(2)}


def test_two_nodes_train_checkpoint_per_global_rank_and_resume(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    ranks = _fit_two_nodes(run, epochs=2)
    assert [ranks[r]["world_size"] for r in range(2)] == [2, 2]
    assert ranks[0]["updates"] == ranks[1]["updates"] == 40
    for name, p in ranks[0]["params"].items():  # DDP all-reduced the gradients across the nodes
        torch.testing.assert_close(p, ranks[1]["params"][name], rtol=0, atol=0, msg=name)
    ckpt = run / "checkpoints" / "last.ckpt"
    state = AtomicCheckpointIO().load_checkpoint(ckpt)["dqn_state"]
    assert state["shards"] == 2 and "replay" not in state
    shards = [load_replay_shard(ckpt, r, state) for r in range(2)]  # verified, of the checkpoint's save
    assert all("replay" in s and s["updates"] == 40 for s in shards)
    paths = [Path(replay_shard_path(ckpt, r, state["generation"])) for r in range(2)]
    assert paths[1].read_bytes() != paths[0].read_bytes()
    resumed = _fit_two_nodes(run, f"--ckpt_path={ckpt}", epochs=3)
    assert resumed[0]["updates"] == resumed[1]["updates"] == 60
    for r in range(2):  # each node continued from its own global rank's shard: 1 epoch x 20 updates x 4 steps
        assert resumed[r]["env_steps"] == shards[r]["env_steps"] + 20 * 4
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["epochs"] == 3


def test_two_node_ga3c_trains_with_one_run_directory(tmp_path):
    run = tmp_path / "ga3c-run"
    args = [sys.executable, str(ROOT / "tests" / "support" / "_ga3c_ddp_script.py"),
            "--config", str(ROOT / "configs" / "ga3c_cartpole.yaml"), "--model.devices", "1", "--model.num_nodes", "2",
            "--model.device", "cpu", "--model.agents", "2", "--model.envs_per_agent", "2",
            "--model.train_min_batch_size", "20",
            "--model.max_updates", "20", "--model.updates_per_epoch", "10", "--model.max_time_s", "150",
            "--model.target_return", "null",
            "--model.dynamic_adjustment", "false", "--model.wandb_mode", "disabled", "--model.status_interval_s", "0"]
    port = _free_port()
    procs = []
    for node in range(2):
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "NODE_RANK": str(node), "LOCAL_RANK": "0",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
               "LIGHTNING_PER_GA3C_RUN_DIR": str(run)}
        procs.append(subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=280)[0] for p in procs]
    for node, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"node {node}:\n{out[-4000:]}"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["updates"] == 20
    ranks = [torch.load(run / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert [r["agents"] for r in ranks] == [1, 1] and all(r["world_size"] == 2 for r in ranks)
    for name, p in ranks[0]["params"].items():  # gradients all-reduced across the nodes
        torch.testing.assert_close(p, ranks[1]["params"][name], rtol=0, atol=0, msg=name)
