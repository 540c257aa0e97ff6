"""GA3C end to end under Trainer.fit: a short CartPole run through the CLI, the terminal-reward toy task
(NVlabs/GA3C#31) learned, and Ctrl-C stopping every agent with nothing left behind."""

import csv
import json
import os
import signal
import threading
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest

from lightning_per.actors.envs import TOY_ENV_ID
from lightning_per.cli import ga3c_main
from lightning_per.ga3c.config import GA3CConfig
from lightning_per.ga3c.module import GA3C

ROOT = Path(__file__).resolve().parents[2]
GA3C_KEYS = ("mean_return", "tps", "pps", "steps_per_s", "fps", "policy_lag_mean", "policy_lag_p95", "wall_time_s")


def _trainer(cfg, **kw):
    return pl.Trainer(accelerator="cpu", devices=1, max_epochs=-1, max_time={"seconds": cfg.max_time_s},
                      logger=False, enable_progress_bar=False, enable_checkpointing=False,
                      enable_model_summary=False, **kw)


def test_short_cartpole_run_writes_summary_and_curve(tmp_path, ga3c_info):
    # cuda_graph true on the CPU: the run trains eagerly (configs are shared between machines)
    assert ga3c_main(["--config", str(ROOT / "configs/ga3c_cartpole.yaml"), "--model.max_time_s", "8",
                      "--model.updates_per_epoch", "50", "--model.agents", "2", "--model.run_dir", str(tmp_path),
                      "--model.target_return", "null", "--model.cuda_graph", "true"]) == 0
    (run_dir,) = list(tmp_path.iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in GA3C_KEYS:
        assert summary[key] is not None, key
    assert summary["tps"] > 0 and summary["steps_per_s"] > 0 and summary["updates"] > 0
    assert summary["fps"] == pytest.approx(summary["steps_per_s"])  # frame_skip 1
    assert summary["episodes"] > 0 and summary["status"] == "done"
    # the last epoch's shares of the agents' time: fractions of their running time, together at most all of it
    shares = [summary["metrics"][k] for k in ("agent_env_share", "agent_answer_wait_share", "agent_slot_wait_share")]
    assert all(0.0 <= x <= 1.0 for x in shares) and sum(shares) <= 1.0 + 1e-9, shares
    assert (run_dir / "learning_curve.png").stat().st_size > 0
    assert (run_dir / "config.yaml").exists()
    # every episode the agents finished is a row of episodes.csv; a CartPole return is the episode's length
    with open(run_dir / "episodes.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert summary["episodes_csv"] == str(run_dir / "episodes.csv")
    returns = [float(r["return"]) for r in rows]
    assert all(r == int(r) and 1 <= r <= 500 for r in returns)
    steps = [float(r["env_steps"]) for r in rows]
    assert steps == sorted(steps) and steps[-1] <= summary["env_steps"]
    # the newest of them are the episodes Stats averaged into mean_return (all of them, when fewer)
    assert len(rows) >= summary["mean_return_episodes"]
    tail = returns[-summary["mean_return_episodes"]:]
    assert sum(tail) / len(tail) == pytest.approx(summary["mean_return"])
    # the "done: ..." line prints summary.json's numbers (written after the shutdown), not those of an earlier moment
    done = [line for line in ga3c_info if line.startswith("done: ")]
    assert len(done) == 1, done
    assert (f"{summary['epochs']} epochs, {summary['env_steps']:,} env steps, mean return {summary['mean_return']:.1f} "
            f"(last {summary['mean_return_episodes']})") in done[0]
    assert f"{summary['tps']:,.0f} updates/s -> {run_dir / 'summary.json'}" in done[0]
    # one clock for every rate of the file: updates_per_s is TPS, updates over wall_time_s
    assert summary["updates_per_s"] == summary["tps"] == pytest.approx(summary["updates"] / summary["wall_time_s"],
                                                                       rel=1e-6)
    assert summary["train_loop_updates_per_s"] == pytest.approx(summary["updates"] / summary["train_loop_time_s"],
                                                                rel=1e-6)
    # each epoch's rates cover the epoch (the last one too, which the stop cuts short): its env steps over its time
    with open(run_dir / "history.csv") as fh:
        epochs = list(csv.DictReader(fh))
    assert len(epochs) >= 3
    for before, row in zip(epochs[1:], epochs[2:]):  # the first epoch also holds the agents' start
        grown = float(row["env_steps"]) - float(before["env_steps"])
        assert float(row["steps_per_s"]) == pytest.approx(grown / float(row["epoch_time_s"]), rel=0.25), row["epoch"]


def test_episode_log_copies_the_stats_episodes_in_order():
    import torch

    from lightning_per.metrics import episode_log_rows, new_episode_log

    model = GA3C(GA3CConfig())
    model.episode_log, model.episode_log_count = new_episode_log(4)  # small: the copy wraps around
    stats = model.stats
    stats.add_rollout(10, [(1.0, 3), (2.0, 4)])
    model.bookkeeping.sync_log(stats.episodes, model.episode_buffers)
    stats.add_rollout(10, [(3.0, 5)])
    stats.add_rollout(10, [(4.0, 6), (5.0, 7), (6.0, 8)])
    model.bookkeeping.sync_log(stats.episodes, model.episode_buffers)
    t0 = stats.t0
    expected = [(float(steps), t0 + t, ret) for t, steps, ret, _ in stats.episode_log]
    assert [(s, r) for s, _, r in expected] == [(10.0, 1.0), (10.0, 2.0), (20.0, 3.0), (30.0, 4.0), (30.0, 5.0),
                                                (30.0, 6.0)]
    rows, dropped = episode_log_rows(model.episode_log, int(model.episode_log_count), 2)
    assert dropped == 0 and rows == expected[2:]  # float64 all the way: exact
    assert int(model.episode_log_count) == 6 and model.episode_log.dtype == torch.float64


def test_episode_log_takes_the_episodes_the_count_names_when_more_end_meanwhile():
    from lightning_per.metrics import episode_log_rows, new_episode_log

    model = GA3C(GA3CConfig())
    model.episode_log, model.episode_log_count = new_episode_log(16)
    stats = model.stats
    stats.add_rollout(10, [(1.0, 3), (2.0, 4)])
    counted = stats.episodes  # the epoch's snapshot counts 2 episodes ...
    stats.add_rollout(10, [(3.0, 5)])  # ... and an agent's rollout ends a third before the copy
    model.bookkeeping.sync_log(counted, model.episode_buffers)
    model.bookkeeping.sync_log(stats.episodes, model.episode_buffers)
    # each episode once, in the order they ended: (env steps, return) from the rollouts above
    rows, dropped = episode_log_rows(model.episode_log, int(model.episode_log_count))
    assert dropped == 0 and [(s, r) for s, _, r in rows] == [(10.0, 1.0), (10.0, 2.0), (20.0, 3.0)]


@pytest.mark.parametrize("vtrace", [False, True], ids=["nstep", "vtrace"])
def test_terminal_reward_toy_task_is_learned(vtrace):
    cfg = GA3CConfig(env=TOY_ENV_ID, agents=2, envs_per_agent=8, t_max=3, train_min_batch_size=48,
                     hidden_sizes=[32], optimizer="adam", lr=3e-3, beta=0.001, gamma=0.99,
                     updates_per_epoch=50, vtrace=vtrace,
                     target_return=0.95, return_window=100, max_time_s=25, status_interval_s=0, device="cpu")
    model = GA3C(cfg)
    _trainer(cfg).fit(model)
    # every reward of this task comes at a terminal step: without it the return stays at chance (0.5)
    assert model.system_summary["mean_return"] >= 0.9, model.system_summary


def test_ctrl_c_stops_all_agents_and_frees_shared_memory():
    cfg = GA3CConfig(agents=2, envs_per_agent=2, max_time_s=60, status_interval_s=0, device="cpu",
                     updates_per_epoch=20)
    model = GA3C(cfg)
    seen = {}

    def interrupt():
        t0 = time.monotonic()
        while time.monotonic() - t0 < 20 and (model.system is None or model.policy_version < 10):
            time.sleep(0.05)
        system = model.system
        seen["pids"] = [a.process.pid for a in system.pool.agents if a is not None]
        seen["shm"] = f"/dev/shm/{system.shared.name}"
        seen["t"] = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=interrupt, daemon=True).start()
    try:
        with pytest.raises(SystemExit):  # Lightning: graceful shutdown, then sys.exit(1)
            _trainer(cfg).fit(model)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - seen["t"] < 5.0 + 1.0  # agents stopped within 5 s (plus Lightning's hooks)
    assert len(seen["pids"]) == 2
    assert not any(os.path.exists(f"/proc/{p}") and "Z" not in open(f"/proc/{p}/stat").read().split()[2]
                   for p in seen["pids"])
    assert not os.path.exists(seen["shm"])
    assert model.system is None
