"""Atari through ``ale_py``: grey frames resized to ``screen_size`` in torch, with no-op starts.

The preprocessing follows Mnih et al. 2015 (Nature, "Human-level control through deep RL"):
frame skip (done by the emulator, ``frameskip=k``), grey levels, 84x84 frames, up to 30 random
no-ops at the start of an episode; the frame stack is a TorchRL ``CatFrames`` added by
:func:`lightning_per.envs.make_env`. No OpenCV: the resize is ``torch.nn.functional.interpolate``
with ``mode="area"``.
"""

from __future__ import annotations

import os
import re
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torchrl.data import Bounded, Categorical, Composite, Unbounded
from torchrl.envs import EnvBase

__all__ = ["AleVectorEnv", "AtariObservation", "ale_game", "make_ale_thunk"]


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


class AleVectorEnv(EnvBase):
    """ale-py's C++ ``AtariVectorEnv`` as a batched TorchRL env: preprocessing and stepping in C++ threads.

    The emulator does what :class:`AtariObservation` + ``CatFrames`` do in Python, natively and in
    parallel (``num_threads`` C++ threads, no worker processes): frame skip, grey 84x84 frames (max-pool
    of the last two frames), ``frame_stack`` frames stacked oldest first, up to ``noop_max`` no-op
    starts, FIRE at reset for games that need it. Rewards are not clipped (raw returns are reported).
    Sub-environments reset in the same step that ends them (``autoreset_mode="SameStep"``): the true
    final observation goes to ``("next", "observation")`` and the first observation of the new episode
    is what :meth:`_reset` returns for the finished members, so TorchRL's ``step_and_maybe_reset``
    works as with any env.

    Specs (``E = num_envs``): ``observation (E, frame_stack, size, size) uint8``, ``action (E,) int64``
    categorical over the minimal action set, ``reward (E, 1) float32``, ``done``/``terminated``/
    ``truncated (E, 1) bool``. CPU tensors. Episodes are truncated after ``max_episode_steps`` agent
    steps (``max_episode_steps * frame_skip`` frames; ale-py's default of 108,000 frames if None).

    Raises:
        ImportError: ``ale_py`` is not installed.
    """

    def __init__(self, env_id: str, num_envs: int, *, frame_skip: int = 4, size: int = 84,
                 frame_stack: int = 4, noop_max: int = 30, repeat_action_probability: float = 0.25,
                 max_episode_steps: int | None = None, num_threads: int | None = None) -> None:
        try:
            from ale_py.vector_env import AtariVectorEnv
        except ImportError as err:  # pragma: no cover - depends on the install
            raise ImportError("env.backend='ale_vector' needs ale_py: pip install ale-py") from err
        super().__init__(batch_size=torch.Size([num_envs]), device="cpu")
        kwargs = {} if max_episode_steps is None else {"max_num_frames_per_episode": max_episode_steps * frame_skip}
        threads = num_threads or max(1, min(num_envs, os.cpu_count() or 1))
        self._venv = AtariVectorEnv(ale_game(env_id), num_envs, num_threads=threads, autoreset_mode="SameStep",
                                    frameskip=frame_skip, img_height=size, img_width=size, stack_num=frame_stack,
                                    noop_max=noop_max, repeat_action_probability=repeat_action_probability,
                                    reward_clipping=False, **kwargs)
        n_actions = int(self._venv.single_action_space.n)
        shape = (num_envs, frame_stack, size, size)
        self.observation_spec = Composite(
            observation=Bounded(0, 255, shape, dtype=torch.uint8), shape=(num_envs,))
        self.action_spec = Categorical(n_actions, shape=(num_envs,), dtype=torch.int64)
        self.reward_spec = Unbounded(shape=(num_envs, 1), dtype=torch.float32)
        self.done_spec = Composite(
            done=Categorical(2, shape=(num_envs, 1), dtype=torch.bool),
            terminated=Categorical(2, shape=(num_envs, 1), dtype=torch.bool),
            truncated=Categorical(2, shape=(num_envs, 1), dtype=torch.bool), shape=(num_envs,))
        self._seed: int | None = None
        self._current: np.ndarray | None = None  # each member's observation after the last step/reset

    def _set_seed(self, seed: int | None) -> None:
        self._seed = seed  # used by the next full reset (member i gets seed + i)

    def _reset(self, tensordict=None, **kwargs):
        mask = None if tensordict is None else tensordict.get("_reset", None)
        if self._current is None or mask is None:
            obs, _ = self._venv.reset(seed=self._seed)
            self._seed = None
            self._current = obs
        # else: finished members were already reset by the step that ended them (SameStep)
        obs = torch.from_numpy(np.array(self._current))
        false = torch.zeros(self.batch_size + (1,), dtype=torch.bool)
        return TensorDict({"observation": obs, "done": false, "terminated": false.clone(),
                           "truncated": false.clone()}, batch_size=self.batch_size)

    def _step(self, tensordict):
        self._venv.send(tensordict.get("action").numpy().astype(np.int64, copy=False))
        return self._received()

    def step_async(self, action: torch.Tensor) -> None:
        """Start one vector step with ``action`` ``(E,) int64`` (CPU); the C++ threads step the members
        while the caller goes on. :meth:`step_wait` returns the step's results.

        With :meth:`step_wait` this is ``step_and_maybe_reset`` in two halves (TorchRL's
        ``EnvBase.step`` checks are left out: the collector hands in actions of the action spec).

        Raises:
            AssertionError: from ale-py, for an action of another length than E.
        """
        self._venv.send(action.numpy().astype(np.int64, copy=False))

    def step_wait(self) -> tuple[TensorDict, TensorDict]:
        """Wait for the step :meth:`step_async` started: ``(next, root)`` as ``step_and_maybe_reset``
        returns them, both TensorDicts ``[E]`` on the CPU: ``next`` is its ``out["next"]``
        (``observation (E, stack, size, size) uint8``, the true final one where an episode ended;
        ``reward (E, 1) float32``; ``done``, ``terminated``, ``truncated`` ``(E, 1) bool``) and ``root`` holds
        the ``observation`` to act on next (a new episode's first where one ended). Call it once per
        :meth:`step_async`, after it."""
        nxt = self._received()
        root = TensorDict({"observation": torch.from_numpy(np.array(self._current))}, batch_size=self.batch_size)
        return nxt, root

    def _received(self) -> TensorDict:
        obs, reward, terminated, truncated, info = self._venv.recv()
        self._current = obs
        done = np.logical_or(terminated, truncated)
        final = np.where(done[:, None, None, None], info["final_obs"], obs) if "final_obs" in info else obs
        term = torch.from_numpy(terminated.astype(bool)).unsqueeze(-1)
        trunc = torch.from_numpy(truncated.astype(bool)).unsqueeze(-1)
        return TensorDict({"observation": torch.from_numpy(np.array(final)),
                           "reward": torch.from_numpy(reward.astype(np.float32)).unsqueeze(-1),
                           "done": term | trunc, "terminated": term, "truncated": trunc},
                          batch_size=self.batch_size)

    def close(self, *, raise_if_closed: bool = True) -> None:  # noqa: D102 - EnvBase API
        venv, self._venv = getattr(self, "_venv", None), None
        if venv is not None:
            venv.close()
        try:
            super().close(raise_if_closed=raise_if_closed)
        except TypeError:  # torchrl < 0.12: close() takes no argument
            super().close()


def ale_game(env_id: str) -> str:
    """ale-py ROM name of a Gymnasium ALE id: ``ALE/MsPacman-v5`` -> ``ms_pacman``.

    (``lightning_per.actors.envs`` has its own copy: GA3C's agent processes import NumPy-only modules.)"""
    name = env_id.split("/", 1)[-1].split("-", 1)[0]
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
