"""Atari through ``ale_py``: grey frames resized to ``screen_size`` in torch, with no-op starts.

The preprocessing follows Mnih et al. 2015 (Nature, "Human-level control through deep RL"):
frame skip (done by the emulator, ``frameskip=k``), grey levels, 84x84 frames, up to 30 random
no-ops at the start of an episode; the frame stack is a TorchRL ``CatFrames`` added by
:func:`lightning_per.envs.make_env`. No OpenCV: the resize is ``torch.nn.functional.interpolate``
with ``mode="area"``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["AtariObservation", "make_ale_thunk"]


class AtariObservation(gym.Wrapper):
    """Resize the grey ``(210, 160) uint8`` frame to ``(size, size) uint8``; random no-op starts.

    Args:
        env: an ALE env made with ``obs_type="grayscale"``.
        size: side of the output frame in pixels.
        noop_max: at reset, take ``U{0..noop_max}`` NOOP actions (action 0), drawn from the env's
            ``np_random``; 0 disables.
    """

    def __init__(self, env: gym.Env, size: int = 84, noop_max: int = 30) -> None:
        super().__init__(env)
        self.size, self.noop_max = size, noop_max
        self.observation_space = gym.spaces.Box(0, 255, (size, size), np.uint8)

    def _resize(self, frame: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(np.ascontiguousarray(frame)).float()[None, None]  # [1, 1, H, W]
        y = F.interpolate(x, size=(self.size, self.size), mode="area")
        return y[0, 0].round_().clamp_(0, 255).to(torch.uint8).numpy()

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        n = int(self.env.unwrapped.np_random.integers(0, self.noop_max + 1)) if self.noop_max else 0
        for _ in range(n):
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset()
        return self._resize(obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._resize(obs), reward, terminated, truncated, info


def make_ale_thunk(env_id: str, *, frame_skip: int, size: int, noop_max: int,
                   repeat_action_probability: float, max_episode_steps: int | None):
    """A no-argument constructor of one preprocessed ALE env (for ``SyncVectorEnv``)."""
    try:
        import ale_py
    except ImportError as err:  # pragma: no cover - depends on the install
        raise ImportError("env.backend='ale' needs ale_py: pip install ale-py") from err
    gym.register_envs(ale_py)

    def thunk() -> gym.Env:
        import ale_py  # again here: AsyncVectorEnv calls the thunk in a fresh worker process

        gym.register_envs(ale_py)
        kwargs = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
        env = gym.make(env_id, frameskip=frame_skip, obs_type="grayscale", full_action_space=False,
                       repeat_action_probability=repeat_action_probability, **kwargs)
        return AtariObservation(env, size=size, noop_max=noop_max)

    return thunk
