"""DQN with ``collector: actors`` (Ape-X): trains through ``Trainer.fit`` on actor processes' transitions, holds
its samples-per-insert target, and goes on when an actor is killed with SIGKILL. CPU, a few seconds each."""

from __future__ import annotations

import os
import signal

import lightning.pytorch as pl
import pytest
import torch

from lightning_per.actors.apex import ApexConfig
from lightning_per.callbacks import AsyncMetricsCallback
from lightning_per.dqn import DQN

ACTORS = dict(agents=2, envs_per_agent=1, slot_steps=4, slots=2, epsilon=0.4)


def _dqn(**kw):
    args = dict(env={"id": "CartPole-v1", "backend": "gymnasium", "num_envs": 1},
                replay={"capacity": 5000, "batch_size": 32}, hidden_sizes=[32], warmup_steps=64,
                updates_per_epoch=50, replay_ratio=0.25, collector="actors", actors=ACTORS, seed=0)
    args.update(kw)
    return DQN(**args)


def _trainer(tmp_path, **kw):
    return pl.Trainer(default_root_dir=str(tmp_path), accelerator="cpu", devices=1, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False, **kw)


@pytest.mark.parametrize("initial_priority", ["max", "td"])
def test_fit_on_actor_transitions_holds_the_samples_per_insert_target(tmp_path, initial_priority):
    model = _dqn(initial_priority=initial_priority)
    trainer = _trainer(tmp_path, max_steps=200)
    trainer.fit(model)
    c = model.feed.counters
    assert model.updates == 200
    inserted = c.inserted - model._inserted0  # after the warm-up fill
    # 0.25 updates per transition: 800 transitions owed; whole slots of 4 overshoot by less than one slot
    assert 800 <= inserted < 800 + 4
    assert abs(model.updates / inserted - 0.25) / 0.25 < 0.05
    assert model.env_steps == c.inserted and len(model.rb) == c.inserted
    assert model.feed.actors.error is None
    assert model.feed.actors.shared is None or model.feed.actors.stopping.is_set()  # closed at teardown


def test_config_refuses_actors_on_a_non_gymnasium_backend_and_bad_fields():
    with pytest.raises(ValueError, match="env.backend"):
        _dqn(env={"id": "CartPole-v1", "backend": "torch", "num_envs": 1})
    with pytest.raises(ValueError, match="actors.agents"):
        _dqn(actors={**ACTORS, "agents": 0})
    with pytest.raises(ValueError, match="collector"):
        _dqn(collector="remote")
    assert _dqn(collector="in_process").feed is None


class _KillAnActor(pl.Callback):
    def __init__(self, at: int) -> None:
        self.at, self.victim = at, None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.at:
            self.victim = module.feed.actors.pool.agents[0]
            os.kill(self.victim.process.pid, signal.SIGKILL)


def test_sigkill_of_an_actor_replaces_it_and_training_goes_on(tmp_path):
    model = _dqn(actors={**ACTORS, "agents": 2})
    kill = _KillAnActor(at=20)
    trainer = _trainer(tmp_path, max_steps=600, callbacks=[kill])
    trainer.fit(model)
    pool = model.feed.actors.pool
    assert kill.victim is not None and model.updates == 600
    assert pool.replaced >= 1  # the supervisor started a new incarnation
    assert model.feed.actors.error is None
    # the learner went on taking the transitions it owed after the kill
    assert abs((model.updates - model._updates0) / (model.feed.counters.inserted - model._inserted0) - 0.25) < 0.0125


def test_actors_config_is_a_dataclass_the_cli_parses():
    model = _dqn(actors=ApexConfig(agents=3))
    assert model.actors_config.agents == 3 and model.hparams["actors"]["agents"] == 3


def test_a_checkpoint_resumes_learner_replay_and_counters_and_the_actors_restart(tmp_path):
    model = _dqn()
    trainer = _trainer(tmp_path, max_steps=100)
    trainer.fit(model)
    ckpt = tmp_path / "a.ckpt"
    trainer.save_checkpoint(ckpt)
    steps, stored = model.env_steps, len(model.rb)
    resumed = _dqn()
    trainer = _trainer(tmp_path, max_steps=200)
    trainer.fit(resumed, ckpt_path=str(ckpt))
    assert resumed.updates == 200
    # the counters go on from the checkpoint, the replay kept its transitions and received 400 more (0.25 ratio)
    assert resumed.env_steps >= steps + 400 and len(resumed.rb) == stored + (resumed.env_steps - steps)
    assert resumed.feed.actors.error is None


def test_sigterm_to_the_process_group_stops_the_run_with_status_143_and_its_checkpoint_resumes(tmp_path):
    import json
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    run = tmp_path / "run"
    base = [sys.executable, "-m", "lightning_per.console", "fit",
            "--config", str(root / "configs/dqn_cartpole_apex.yaml"), "--model.updates_per_epoch=20",
            "--model.warmup_steps=64", "--model.actors.agents=2",
            "--model.target_return=null", "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={run}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(root)}
    proc = subprocess.Popen(base, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # its own process group, agents included
    ckpt = run / "checkpoints" / "last.ckpt"
    try:
        deadline = time.monotonic() + 120
        while not ckpt.exists():  # the first epoch's checkpoint
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not finish an epoch"
            time.sleep(0.1)
        first = ckpt.stat().st_mtime_ns
        while ckpt.stat().st_mtime_ns == first:  # rewritten at the second epoch's end
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not finish two epochs"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)  # a hang (an agent or the feed never joined) fails here
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # the CLI's graceful path (128 + SIGTERM), not the signal's default action (-SIGTERM) nor a crash
    assert proc.returncode == 128 + signal.SIGTERM, proc.returncode
    assert json.loads((run / "summary.json").read_text())["status"] == "interrupted"
    done = subprocess.run([*base, "--trainer.max_epochs=4", f"--ckpt_path={ckpt}"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "done" and summary["epochs"] == 4 and summary["updates"] == 4 * 20


def test_atari_frames_reach_the_replay_as_uint8_stacks_with_true_final_frames(tmp_path):
    """``env.backend: ale_vector`` (configs/dqn_pong_apex.yaml): the agents step ale-py's vector env; with 1-step
    transitions every stored next observation is its observation shifted by one frame (frame stack order: oldest
    first), also where the episode was cut (``max_episode_steps`` 20): there the agents must keep the true final
    frames, not the next episode's first stack."""
    pytest.importorskip("ale_py")
    model = _dqn(env={"id": "ALE/Pong-v5", "backend": "ale_vector", "num_envs": 1, "noop_max": 0,
                      "repeat_action_probability": 0.0, "max_episode_steps": 20},
                 network="nature_cnn", hidden_sizes=[32], n_step=1, warmup_steps=160, updates_per_epoch=5,
                 replay={"capacity": 1000, "batch_size": 8})
    _trainer(tmp_path, max_steps=5).fit(model)
    n = len(model.rb)
    stored = model.rb.storage[:n]
    obs, nxt = stored["observation"], stored["next_observation"]
    assert obs.dtype == nxt.dtype == torch.uint8 and obs.shape[1:] == (4, 84, 84)
    assert n >= 160 and n // 20 >= 6  # at least six cut episodes among the rows
    assert torch.equal(nxt[:, :3], obs[:, 1:]), "a next observation is not its observation one frame on"
    moving = (nxt[:, 3] != obs[:, 3]).flatten(1).any(1)
    # the frames are the game's, not a constant. Pong holds the screen still before each serve, which takes a large
    # share of these 20-step episodes: 48-81% of the rows moved over repeated runs, so the bound leaves room
    assert moving.float().mean() > 0.2


def test_each_actor_logs_its_return_and_its_rung_of_the_annealed_ladder(tmp_path):
    """Per-actor curves: ``actor{i}_epsilon`` is agent i's rung, linear from the start ladder to the end ladder
    (Ape-X's epsilon_i = base ** (1 + alpha * i / (N - 1)), written out here), and ``actor{i}_return`` the mean of
    the episodes agent i finished in the epoch: over the run, their counts add up to every episode the actors
    reported."""
    actors = {**ACTORS, "epsilon": 0.4, "epsilon_start": 0.9, "epsilon_anneal_updates": 100}
    model = _dqn(actors=actors, updates_per_epoch=40)
    cb = AsyncMetricsCallback(prefix="")
    _trainer(tmp_path, max_steps=120, callbacks=[cb]).fit(model)
    rows = cb.history
    assert len(rows) == 3
    for row in rows:
        u = row["updates"]
        frac = min(1.0, u / 100)
        for i in range(2):  # N = 2: rungs base ** 1 and base ** 8
            start, end = 0.9 ** (1 + 7 * i), 0.4 ** (1 + 7 * i)
            assert row[f"actor{i}_epsilon"] == pytest.approx(start + (end - start) * frac, rel=1e-6)
    sums = model.feed.actors.agent_returns
    assert sums[:, 1].sum() == model.feed.actors.stats.snapshot().episodes > 0
    finished = [r for row in rows for r in (row.get("actor0_return"), row.get("actor1_return")) if r == r and r]
    assert finished and all(8.0 <= r <= 500.0 for r in finished)  # CartPole-v1's returns
    for row in rows:  # each epoch's shares of the agents' time: fractions of their running time, at most all of it
        shares = [row[k] for k in ("agent_env_share", "agent_answer_wait_share", "agent_slot_wait_share")]
        assert all(0.0 <= x <= 1.0 for x in shares) and sum(shares) <= 1.0 + 1e-9, shares
