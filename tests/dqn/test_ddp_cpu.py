"""The DQN under Lightning DDP on the CPU: 2 processes, gloo, launched by ``--trainer.strategy=ddp``
(tiny sizes; each run ~30 s on 2 cores, most of it process start-up). See ``docs/ddp.md``."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_per.dqn import ddp as dqn_ddp
from lightning_per.dqn.ddp import all_reduce_mean_grads_

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
TINY = ["--model.env.num_envs=4", "--model.replay.capacity=1000", "--model.replay.batch_size=16",
        "--model.hidden_sizes=[16, 16]", "--model.warmup_steps=64", "--model.updates_per_epoch=20",
        "--trainer.enable_progress_bar=false", "--trainer.logger=false"]
DDP = ["--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.accelerator=cpu"]


def _fit(run_dir: Path, *extra: str, epochs: int) -> dict[int, dict]:
    args = [sys.executable, str(ROOT / "tests" / "support" / "_ddp_dqn_script.py"), "fit",
            "--config", str(ROOT / "configs" / "dqn_cartpole.yaml"), *TINY, *DDP,
            f"--trainer.default_root_dir={run_dir}", f"--trainer.max_epochs={epochs}", *extra]
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONWARNINGS": "ignore"}
    env.pop("WANDB_API_KEY", None)
    proc = subprocess.run(args, cwd=run_dir.parent, env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return {r: torch.load(run_dir / f"rank{r}.pt", weights_only=False) for r in range(2)}


def _assert_ranks_consistent(ranks: dict[int, dict], updates: int) -> None:
    # equal update counts, identical weights (DDP all-reduced the gradients), distinct experience
    assert ranks[0]["updates"] == ranks[1]["updates"] == ranks[0]["global_step"] == updates
    assert ranks[0]["env_steps"] == ranks[1]["env_steps"]
    for name, p in ranks[0]["params"].items():
        torch.testing.assert_close(p, ranks[1]["params"][name], rtol=0, atol=0, msg=name)
    assert not torch.equal(ranks[0]["ring"].nan_to_num(), ranks[1]["ring"].nan_to_num())


@pytest.fixture(scope="module")
def two_epoch_run(tmp_path_factory) -> tuple[Path, dict[int, dict]]:
    """One 2-rank fit of 2 epochs (~10 s, most of it the two processes' start-up) and what its ranks saved: read
    by the test of the fit, copied by those that resume or spoil its checkpoint."""
    run = tmp_path_factory.mktemp("ddp") / "run"
    return run, _fit(run, epochs=2)


def _copy(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


def test_two_rank_gloo_fit_through_the_cli(two_epoch_run):
    run, ranks = two_epoch_run
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "done" and summary["world_size"] == 2
    assert summary["updates"] == 40 and summary["epochs"] == 2  # 20 updates per epoch on *each* rank
    assert math.isfinite(summary["metrics"]["loss"])
    _assert_ranks_consistent(ranks, updates=40)


def _mean_grads_worker(rank: int, store_path: str, out_dir: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    try:
        params = [torch.nn.Parameter(torch.zeros(3, 2)), torch.nn.Parameter(torch.zeros(5)),
                  torch.nn.Parameter(torch.zeros(1))]
        for i, p in enumerate(params[:2]):  # the last one has no gradient: skipped on every rank
            p.grad = torch.full_like(p, float(rank + 1)) * (i + 1)
        all_reduce_mean_grads_(params, 2)
        torch.save([p.grad for p in params], os.path.join(out_dir, f"grads{rank}.pt"))
    finally:
        torch.distributed.destroy_process_group()


def test_all_reduce_mean_grads_averages_in_place_over_two_ranks(tmp_path):
    torch.multiprocessing.spawn(_mean_grads_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    for r in range(2):
        g = torch.load(tmp_path / f"grads{r}.pt")
        torch.testing.assert_close(g[0], torch.full((3, 2), 1.5), rtol=0, atol=0)  # (1 + 2) / 2
        torch.testing.assert_close(g[1], torch.full((5,), 3.0), rtol=0, atol=0)  # (2 + 4) / 2
        assert g[2] is None


def test_two_rank_graph_mode_code_path_all_reduces_itself(tmp_path):
    # graph mode's code path under DDP, run eagerly on gloo (the helper's --eager-graph-path lifts the GPU
    # checks; graphs.capture runs the update eagerly on a CPU): no manual_backward, so DDP's reducer never
    # reduces; only our flat-buffer all-reduce in the update's backward keeps the ranks' weights identical
    run = tmp_path / "run"
    ranks = _fit(run, "--model.compile=true", "--eager-graph-path", epochs=2)
    assert all(ranks[r]["graph_mode"] and ranks[r]["grad_world_size"] == 2 for r in range(2))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "done" and summary["world_size"] == 2 and math.isfinite(summary["metrics"]["loss"])
    _assert_ranks_consistent(ranks, updates=40)


def test_two_rank_checkpoint_holds_every_shard_and_resumes_per_rank(two_epoch_run, tmp_path):
    run = _copy(two_epoch_run[0], tmp_path)
    ckpt = run / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, weights_only=False)["dqn_state"]
    assert state["shards"] == 2 and "replay" not in state
    paths = [Path(dqn_ddp.replay_shard_path(ckpt, r, state["generation"])) for r in range(2)]
    shards = [torch.load(path, weights_only=False) for path in paths]
    assert all("replay" in s and s["updates"] == 40 for s in shards)
    # each rank keeps its shard of the previous save (epoch 1) until this save's checkpoint is complete; no older
    for r in range(2):
        kept = sorted(p.name for p in ckpt.parent.iterdir() if p.name.startswith(f"last.ckpt.rank{r}.")
                      and p.name.endswith(".replay.pt"))
        assert len(kept) == 2 and paths[r].name in kept, kept
    assert paths[0].read_bytes() != paths[1].read_bytes()  # each rank's own experience (seeds + 1000 r)
    ranks = _fit(run, f"--ckpt_path={ckpt}", epochs=4)
    _assert_ranks_consistent(ranks, updates=80)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["epochs"] == 4 and math.isfinite(summary["metrics"]["loss"])
    # each rank continued from its own shard: counters from it, and no second warm-up (which an empty
    # replay would need before its first sample): exactly 2 epochs x 20 updates x 4 env steps more
    for r in range(2):
        assert ranks[r]["env_steps"] == shards[r]["env_steps"] + 2 * 20 * 4
        assert ranks[r]["replay_len"] > 0


@pytest.mark.parametrize("damage", ["missing", "damaged"])
def test_a_missing_or_damaged_shard_is_one_error_before_any_other_rank_starts(two_epoch_run, tmp_path, damage):
    """The launching process verifies its node's shards before Lightning starts rank 1: a missing or damaged
    shard was found by rank 1 after its start, and Lightning's launcher then killed every process (exit 137).
    The checkpoint is the shared run's (2 epochs: the previous save's shards are still beside the current ones,
    and do not stand in for the spoilt one); the resume asks for a third epoch, so that it would train."""
    run = _copy(two_epoch_run[0], tmp_path)
    ckpt = run / "checkpoints" / "last.ckpt"
    generation = torch.load(ckpt, weights_only=False)["dqn_state"]["generation"]
    shard = Path(dqn_ddp.replay_shard_path(ckpt, 1, generation))
    if damage == "missing":
        shard.unlink()
        expected = f"{shard}: missing (checkpoint {ckpt} was written by 2 DDP ranks"
    else:
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
        expected = f"{shard}: damaged (SHA-256"
    before = sorted(p.name for p in run.rglob("*"))
    args = [sys.executable, str(ROOT / "tests" / "support" / "_ddp_dqn_script.py"), "fit",
            "--config", str(ROOT / "configs" / "dqn_cartpole.yaml"), *TINY, *DDP,
            f"--trainer.default_root_dir={run}", "--trainer.max_epochs=3", f"--ckpt_path={ckpt}"]
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(args, cwd=run.parent, env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])  # the error, not a SIGKILL (-9)
    assert expected in proc.stderr  # (this script runs cli_main without the console's one-line errors)
    assert "[rank: 1]" not in proc.stdout + proc.stderr  # rank 1 never started
    assert sorted(p.name for p in run.rglob("*")) == before  # nothing written
