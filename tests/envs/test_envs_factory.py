"""make_env / EnvConfig: the three backends, validation, and env snapshots for exact resume."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from lightning_per.envs import EnvConfig, TorchCartPoleEnv, make_env, restore_env, snapshot_env


def _steps(env, td, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = []
    for _ in range(n):
        td["action"] = torch.randint(int(env.action_spec.space.n), td.batch_size, generator=g)
        out, td = env.step_and_maybe_reset(td)
        obs.append(out["next", "observation"].clone())
    return torch.stack(obs), td


def test_gymnasium_backend_is_a_batched_torchrl_env():
    env = make_env(EnvConfig(num_envs=3), seed=0)
    td = env.reset()
    assert env.batch_size == torch.Size([3])
    assert td["observation"].shape == (3, 4) and td["observation"].dtype == torch.float32
    assert env.action_spec.dtype == torch.int64 and env.action_spec.shape == (3,)
    obs, _ = _steps(env, td, 60)
    assert obs.shape == (60, 3, 4)
    env.close()


def test_gymnasium_seed_and_snapshot_give_identical_futures():
    a, b = make_env(EnvConfig(num_envs=2), seed=5), make_env(EnvConfig(num_envs=2), seed=5)
    torch.testing.assert_close(_steps(a, a.reset(), 30)[0], _steps(b, b.reset(), 30)[0])
    _, td = _steps(a, a.reset(), 17)
    snap, td_copy = snapshot_env(a), td.clone()
    assert snap is not None
    fut, _ = _steps(a, td, 40, seed=1)
    c = make_env(EnvConfig(num_envs=2), seed=123)
    c.reset()
    assert restore_env(c, snap)
    fut_c, _ = _steps(c, td_copy, 40, seed=1)
    torch.testing.assert_close(fut, fut_c)


def test_torch_backend_and_time_limit():
    env = make_env(EnvConfig(backend="torch", num_envs=4, max_episode_steps=5), seed=0)
    assert isinstance(env, TorchCartPoleEnv) and env.max_steps == 5
    assert snapshot_env(env)["kind"] == "torch"
    with pytest.warns(UserWarning, match="not in the checkpoint"):
        assert not restore_env(env, None)


@pytest.mark.parametrize("field, value, match", [
    ("num_envs", 0, "env.num_envs"),
    ("backend", "mujoco", "env.backend"),
    ("max_episode_steps", 0, "env.max_episode_steps"),
    ("frame_stack", 0, "env.frame_stack"),
    ("repeat_action_probability", 1.5, "env.repeat_action_probability"),
    ("noop_max", -1, "env.noop_max"),
])
def test_env_config_rejects_bad_values(field, value, match):
    with pytest.raises(ValueError, match=match):
        make_env(EnvConfig(**{field: value}))


def test_torch_backend_rejects_unknown_ids():
    with pytest.raises(ValueError, match="no torch implementation"):
        EnvConfig(id="Acrobot-v1", backend="torch").validate()


@pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="needs ale_py")
def test_ale_backend_stacks_grey_frames():
    env = make_env(EnvConfig(id="ALE/Pong-v5", backend="ale", num_envs=2, noop_max=2), seed=0)
    td = env.reset()
    assert td["observation"].shape == (2, 4, 84, 84) and td["observation"].dtype == torch.uint8
    assert env.action_spec.space.n == 6
    obs, td = _steps(env, td, 6)
    assert obs.shape == (6, 2, 4, 84, 84)
    # the stack shifts by one frame per step: frame k of step t+1 == frame k+1 of step t
    torch.testing.assert_close(obs[5][:, :3], obs[4][:, 1:])
    env.close()
