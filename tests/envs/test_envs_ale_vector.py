"""``env.backend="ale_vector"``: ale-py's C++ vector env behind TorchRL's EnvBase contract.

Independent checks: TorchRL's own ``check_env_specs``; the final observation of a truncated episode
equals ale-py's ``final_obs`` for the same seed and actions (a second, bare ``AtariVectorEnv``), and the
next root observation is that env's post-reset observation.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

ale_py = pytest.importorskip("ale_py")

from torchrl.envs.utils import check_env_specs  # noqa: E402

from lightning_per.envs import EnvConfig, make_env  # noqa: E402

STEPS = 6  # a truncation every 6 agent steps (24 frames)


def _config(**kw) -> EnvConfig:
    base = dict(id="ALE/Pong-v5", backend="ale_vector", num_envs=3, max_episode_steps=STEPS, noop_max=0,
                repeat_action_probability=0.0)
    return EnvConfig(**{**base, **kw})


def test_specs_follow_torchrl_contract():
    env = make_env(_config(), seed=3)
    try:
        check_env_specs(env, seed=3)
        td = env.reset()
        assert td["observation"].shape == (3, 4, 84, 84) and td["observation"].dtype == torch.uint8
        assert env.action_spec.space.n == 6
    finally:
        env.close()


def test_final_observation_and_reset_match_ale_py():
    from ale_py.vector_env import AtariVectorEnv

    env = make_env(_config(), seed=7)
    bare = AtariVectorEnv("pong", 3, num_threads=1, autoreset_mode="SameStep", max_num_frames_per_episode=4 * STEPS,
                          noop_max=0, repeat_action_probability=0.0, reward_clipping=False)
    try:
        td = env.reset()
        obs_ref, _ = bare.reset(seed=7)
        np.testing.assert_array_equal(td["observation"].numpy(), obs_ref)
        rng = np.random.default_rng(0)
        saw_end = False
        for _ in range(2 * STEPS + 1):
            action = rng.integers(0, 6, 3)
            td["action"] = torch.from_numpy(action)
            out, td = env.step_and_maybe_reset(td)
            obs_ref, reward, term, trunc, info = bare.step(action.astype(np.int64))
            done = term | trunc
            np.testing.assert_array_equal(out["next", "reward"].squeeze(-1).numpy(), reward)
            np.testing.assert_array_equal(out["next", "done"].squeeze(-1).numpy(), done)
            expect_next = np.where(done[:, None, None, None], info.get("final_obs", obs_ref), obs_ref)
            np.testing.assert_array_equal(out["next", "observation"].numpy(), expect_next)
            np.testing.assert_array_equal(td["observation"].numpy(), obs_ref)  # post-reset for finished ones
            saw_end |= bool(done.any())
        assert saw_end, "no episode ended: the truncation limit was not applied"
    finally:
        env.close()
        bare.close()


def test_step_async_and_step_wait_match_ale_py():
    """The two halves of a step (the collector's overlapped path) give what a bare ale-py env's step gives."""
    from ale_py.vector_env import AtariVectorEnv

    env = make_env(_config(), seed=5)
    bare = AtariVectorEnv("pong", 3, num_threads=1, autoreset_mode="SameStep", max_num_frames_per_episode=4 * STEPS,
                          noop_max=0, repeat_action_probability=0.0, reward_clipping=False)
    try:
        env.reset()
        bare.reset(seed=5)
        rng = np.random.default_rng(1)
        saw_end = False
        for _ in range(2 * STEPS + 1):
            action = rng.integers(0, 6, 3)
            env.step_async(torch.from_numpy(action))
            nxt, root = env.step_wait()
            obs_ref, reward, term, trunc, info = bare.step(action.astype(np.int64))
            done = term | trunc
            np.testing.assert_array_equal(nxt["reward"].squeeze(-1).numpy(), reward)
            np.testing.assert_array_equal(nxt["terminated"].squeeze(-1).numpy(), term)
            np.testing.assert_array_equal(nxt["done"].squeeze(-1).numpy(), done)
            expect_next = np.where(done[:, None, None, None], info.get("final_obs", obs_ref), obs_ref)
            np.testing.assert_array_equal(nxt["observation"].numpy(), expect_next)
            np.testing.assert_array_equal(root["observation"].numpy(), obs_ref)
            saw_end |= bool(done.any())
        assert saw_end
    finally:
        env.close()
        bare.close()


def test_bad_backend_is_named():
    with pytest.raises(ValueError, match="env.backend"):
        _config(backend="ale_vec").validate()
