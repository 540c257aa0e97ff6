"""TorchCartPoleEnv: Gymnasium parity, TorchRL spec compliance, partial resets, seeding, snapshots."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from torchrl.envs.utils import check_env_specs

from lightning_per.envs import TorchCartPoleEnv


def test_specs_follow_torchrl_conventions():
    check_env_specs(TorchCartPoleEnv(num_envs=3, seed=0))


def test_dynamics_match_gymnasium_cartpole():
    env = TorchCartPoleEnv(num_envs=1, seed=0)
    td = env.reset()
    ref = gym.make("CartPole-v1").unwrapped
    ref.reset(seed=0)
    ref.state = td["observation"][0].double().numpy()
    rng = np.random.default_rng(0)
    for _ in range(40):
        a = int(rng.integers(2))
        obs_ref, r_ref, term_ref, _, _ = ref.step(a)
        td["action"] = torch.tensor([a])
        out, td = env.step_and_maybe_reset(td)
        np.testing.assert_allclose(out["next", "observation"][0].numpy(), obs_ref, rtol=1e-4, atol=1e-5)
        assert out["next", "reward"].item() == r_ref
        assert bool(out["next", "terminated"].item()) == term_ref
        if term_ref:
            break
        ref.state = out["next", "observation"][0].double().numpy()  # re-sync float32 rounding


def test_time_limit_truncates_and_partial_reset_only_touches_done_members():
    env = TorchCartPoleEnv(num_envs=4, max_steps=3, seed=1)
    td = env.reset()
    env.steps = torch.tensor([0, 0, 1, 0])  # member 2 reaches the limit one step early
    td["action"] = torch.zeros(4, dtype=torch.int64)
    out, td = env.step_and_maybe_reset(td)
    td["action"] = torch.zeros(4, dtype=torch.int64)
    before = env.state.clone()
    out, td = env.step_and_maybe_reset(td)
    done = out["next", "done"].squeeze(-1)
    assert done.tolist() == [False, False, True, False]
    assert out["next", "truncated"].squeeze(-1).tolist() == [False, False, True, False]
    assert not out["next", "terminated"].any()
    assert (td["observation"][~done] == out["next", "observation"][~done]).all()
    assert (td["observation"][2].abs() <= 0.05).all()  # fresh state
    assert env.steps.tolist() == [2, 2, 0, 2]
    assert not td["done"].any()
    del before


def test_seeding_is_reproducible_and_snapshot_restores_the_future():
    def rollout(env, td, n=25):
        obs = []
        for i in range(n):
            td["action"] = torch.tensor([i % 2, 1 - i % 2])
            out, td = env.step_and_maybe_reset(td)
            obs.append(out["next", "observation"].clone())
        return torch.stack(obs), td

    a, b = TorchCartPoleEnv(2, seed=7), TorchCartPoleEnv(2, seed=7)
    torch.testing.assert_close(rollout(a, a.reset())[0], rollout(b, b.reset())[0])
    c = TorchCartPoleEnv(2, seed=8)
    assert not torch.equal(rollout(c, c.reset())[0], rollout(TorchCartPoleEnv(2, seed=7),
                                                              TorchCartPoleEnv(2, seed=7).reset())[0])
    env = TorchCartPoleEnv(2, seed=3)
    _, td = rollout(env, env.reset(), 13)
    snap, td_copy = env.snapshot(), td.clone()
    future, _ = rollout(env, td)
    env2 = TorchCartPoleEnv(2, seed=99)
    env2.restore(snap)
    future2, _ = rollout(env2, td_copy)
    torch.testing.assert_close(future, future2)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="num_envs"):
        TorchCartPoleEnv(num_envs=0)
    with pytest.raises(ValueError, match="max_steps"):
        TorchCartPoleEnv(num_envs=1, max_steps=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_steps_without_host_synchronisation():
    env = TorchCartPoleEnv(num_envs=64, device="cuda", seed=0)
    td = env.reset()
    for _ in range(3):  # warm-up (first calls cache specs)
        td["action"] = torch.zeros(64, dtype=torch.int64, device="cuda")
        _, td = env.step_and_maybe_reset(td)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(50):
            td["action"] = torch.ones(64, dtype=torch.int64, device="cuda")
            _, td = env.step_and_maybe_reset(td)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert td["observation"].device.type == "cuda"
