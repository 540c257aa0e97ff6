"""Environment groups stepped by one GA3C agent, and the terminal-reward toy environment.

NumPy + Gymnasium (+ ale-py) only: agent processes import this module and never torch/CUDA.
An environment is described by a plain ``dict`` spec (picklable without importing this package):
``{"env": id, "backend": "gym" | "ale_vector", "num_envs": E, "kwargs": {...}, "frame_stack": 4}``.

Every group auto-resets in the same step: where an episode ended, ``step`` returns the first
observation of the next episode (GA3C never needs the terminal observation: terminal steps do not
bootstrap, truncated steps bootstrap from V(s_t), see :mod:`lightning_per.actors.returns`). Ape-X's n-step
transitions do: every group keeps it in ``final_obs``.
"""

from __future__ import annotations

import re
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["ENV_BACKENDS", "EnvGroup", "GymEnvGroup", "AleVectorGroup", "TerminalRewardEnv", "make_env_group",
           "mean_observation", "probe_env", "TOY_ENV_ID"]

TOY_ENV_ID = "GA3CTerminalReward-v0"
ENV_BACKENDS = ("gym", "ale_vector")  # the spec's "backend": GymEnvGroup, AleVectorGroup


class TerminalRewardEnv(gym.Env):
    """Toy task whose only reward comes at the terminal step (the NVlabs/GA3C#31 regression test).

    Each episode lasts ``episode_len`` steps. The observation is (cue one-hot (2,), t / episode_len)
    float32, or with ``image=True`` a (4, 84, 84) uint8 frame stack whose left or right half is lit
    (the conv-net / uint8 path); the cue is drawn at reset. The last step pays +1 if the action
    equals the cue, else 0, and terminates; every other step pays 0. An agent that drops the terminal
    transition's reward sees only zeros and cannot beat 0.5; one that trains on it reaches 1.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, episode_len: int = 3, image: bool = False) -> None:
        if episode_len < 1:
            raise ValueError(f"episode_len must be >= 1, got {episode_len}")
        self.episode_len = episode_len
        self.image = image
        if image:  # Atari-like (4, 84, 84) uint8: the cue lights the left or the right half
            self.observation_space = gym.spaces.Box(0, 255, shape=(4, 84, 84), dtype=np.uint8)
        else:
            self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(3,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0
        self._cue = 0

    def _obs(self) -> np.ndarray:
        if self.image:
            obs = np.zeros((4, 84, 84), dtype=np.uint8)
            obs[:, :, self._cue * 42:(self._cue + 1) * 42] = 200
            obs[:, : 84 * self._t // self.episode_len, :] //= 2  # time: darker rows from the top
            return obs
        obs = np.zeros(3, dtype=np.float32)
        obs[self._cue] = 1.0
        obs[2] = self._t / self.episode_len
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._t = 0
        self._cue = int(self.np_random.integers(2))
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        terminated = self._t >= self.episode_len
        reward = float(int(action) == self._cue) if terminated else 0.0
        return self._obs(), reward, terminated, False, {}


if TOY_ENV_ID not in gym.registry:
    gym.register(TOY_ENV_ID, entry_point=f"{__name__}:TerminalRewardEnv")


class EnvGroup:
    """E environments stepped together. Attributes: ``num_envs``, ``obs_shape``, ``obs_dtype``,
    ``n_actions``, ``final_obs`` ``(E, *obs_shape)``: the observation each env's last step ended in, the true
    final one where an episode ended (both groups here keep it; None for a group that does not).

    ``reset(seed) -> obs (E, *obs_shape)``;
    ``step(actions (E,) int64) -> (obs (E, *obs_shape), reward (E,) float32, terminated (E,) bool,
    truncated (E,) bool)``, auto-reset in the same step; ``close()``.
    """

    num_envs: int
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    n_actions: int
    final_obs: np.ndarray | None = None

    def reset(self, seed: int | None = None) -> np.ndarray:
        raise NotImplementedError

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError

    def close(self) -> None:
        pass


_VECTOR_ONLY_KWARGS = ("num_threads", "thread_affinity_offset")  # AtariVectorEnv threading: no meaning here


def _make_gym(env_id: str, kwargs: dict, frame_stack: int) -> gym.Env:
    """One env; ``ALE/`` ids get AtariPreprocessing (``frameskip`` and ``noop_max`` from ``kwargs`` go
    to it, the vector env's threading knobs are dropped: an ``ale_vector`` config runs unchanged) and a
    frame stack (oldest first, newest last, like ``ale_vector``). ``MinAtar/`` ids (Young & Tian 2019: 10x10x4
    boolean observations, trained as float32) need the optional ``minatar`` package."""
    if env_id.startswith("ALE/"):
        import ale_py

        gym.register_envs(ale_py)
        kw = {k: v for k, v in kwargs.items() if k not in _VECTOR_ONLY_KWARGS}
        skip = int(kw.pop("frameskip", 4))
        noop_max = int(kw.pop("noop_max", 30))
        env = gym.make(env_id, frameskip=1, **kw)
        env = gym.wrappers.AtariPreprocessing(env, noop_max=noop_max, frame_skip=skip, screen_size=84,
                                              grayscale_obs=True, scale_obs=False)
        return gym.wrappers.FrameStackObservation(env, frame_stack)
    if env_id.startswith("MinAtar/") and env_id not in gym.registry:
        import minatar.gym  # the optional minatar package registers its ids on request (once: again, it warns)

        minatar.gym.register_envs()
    return gym.make(env_id, **kwargs)


class GymEnvGroup(EnvGroup):
    """``num_envs`` separate ``gym.make`` environments stepped one after the other."""

    def __init__(self, env_id: str, num_envs: int, kwargs: dict | None = None, frame_stack: int = 4) -> None:
        self.envs = [_make_gym(env_id, kwargs or {}, frame_stack) for _ in range(num_envs)]
        space = self.envs[0].observation_space
        if not isinstance(self.envs[0].action_space, gym.spaces.Discrete):
            raise ValueError(f"env {env_id!r}: GA3C needs a Discrete action space, "
                             f"got {self.envs[0].action_space}")
        self.num_envs = num_envs
        self.obs_shape = tuple(space.shape)
        self.obs_dtype = np.dtype(np.uint8) if space.dtype == np.uint8 else np.dtype(np.float32)
        self.n_actions = int(self.envs[0].action_space.n)
        self._obs = np.zeros((num_envs, *self.obs_shape), dtype=self.obs_dtype)
        #: (E, *obs): the observation each env's last step ended in, the true final one where an episode ended
        #: (``step`` returns the next episode's first there); what Ape-X's n-step transitions bootstrap from
        self.final_obs = np.zeros_like(self._obs)

    def reset(self, seed: int | None = None) -> np.ndarray:
        for k, env in enumerate(self.envs):
            self._obs[k] = env.reset(seed=None if seed is None else seed + k)[0]
        return self._obs.copy()

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        e = self.num_envs
        reward = np.zeros(e, dtype=np.float32)
        term = np.zeros(e, dtype=bool)
        trunc = np.zeros(e, dtype=bool)
        for k, env in enumerate(self.envs):
            obs, r, te, tr, _ = env.step(int(actions[k]))
            reward[k], term[k], trunc[k] = r, te, tr
            self.final_obs[k] = obs
            self._obs[k] = env.reset()[0] if (te or tr) else obs
        return self._obs.copy(), reward, term, trunc

    def close(self) -> None:
        for env in self.envs:
            env.close()


def _ale_game(env_id: str) -> str:
    """``ALE/MsPacman-v5`` -> ``ms_pacman`` (ale-py ROM name)."""
    name = env_id.split("/", 1)[-1].split("-", 1)[0]
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class AleVectorGroup(EnvGroup):
    """ale-py's C++ ``AtariVectorEnv`` (grayscale 84x84, frame stack, frame skip done natively).

    Rewards come back unclipped (``reward_clipping=False``): GA3C clips them itself for training and
    reports raw returns. ``kwargs`` go to ``AtariVectorEnv`` (``frameskip``, ``repeat_action_probability``,
    ``noop_max``, ``num_threads`` (default 1: one agent process per core), ...).
    """

    def __init__(self, env_id: str, num_envs: int, kwargs: dict | None = None, frame_stack: int = 4) -> None:
        from ale_py.vector_env import AtariVectorEnv

        kw = {"num_threads": 1, **(kwargs or {})}
        self.env = AtariVectorEnv(_ale_game(env_id), num_envs, autoreset_mode="SameStep",
                                  reward_clipping=False, stack_num=frame_stack, **kw)
        self.num_envs = num_envs
        self.obs_shape = tuple(self.env.single_observation_space.shape)
        self.obs_dtype = np.dtype(np.uint8)
        self.n_actions = int(self.env.single_action_space.n)
        self.final_obs = np.zeros((num_envs, *self.obs_shape), dtype=self.obs_dtype)

    def reset(self, seed: int | None = None) -> np.ndarray:
        return self.env.reset(seed=seed)[0]

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        obs, reward, term, trunc, info = self.env.step(np.asarray(actions, dtype=np.int64))
        done = term | trunc
        # SameStep autoreset: the ended members' true final frames come in info["final_obs"] (ale-py >= 0.10)
        self.final_obs = np.where(done[:, None, None, None], info["final_obs"], obs) if done.any() else obs
        return obs, reward.astype(np.float32), term.astype(bool), trunc.astype(bool)

    def close(self) -> None:
        self.env.close()


def make_env_group(spec: dict) -> EnvGroup:
    """Build the group described by a spec dict (see the module docstring)."""
    if spec["backend"] not in ENV_BACKENDS:
        raise ValueError(f"env_backend must be one of {list(ENV_BACKENDS)}, got {spec['backend']!r}")
    cls = GymEnvGroup if spec["backend"] == "gym" else AleVectorGroup
    return cls(spec["env"], int(spec["num_envs"]), dict(spec.get("kwargs") or {}),
               int(spec.get("frame_stack", 4)))


def probe_env(spec: dict) -> tuple[tuple[int, ...], np.dtype, int]:
    """(obs_shape, obs_dtype (uint8 or float32), n_actions) of one environment of ``spec``."""
    group = make_env_group({**spec, "num_envs": 1})
    try:
        return group.obs_shape, group.obs_dtype, group.n_actions
    finally:
        group.close()


def mean_observation(spec: dict, steps: int, seed: int = 0) -> np.ndarray:
    """The mean of ``steps`` observations of uniformly random play per env of the group ``spec`` describes: the
    reset's and those of ``steps - 1`` random vector steps.

    The location of TorchRL's ``ObservationNorm`` as its ``init_stats`` estimates it (the mean over a random
    rollout's observations), for a GA3C network's ``obs_loc``: on Atari most of a frame is background that every
    observation shares, and subtracting this mean leaves what moves. The group is reset with ``seed`` and the
    actions drawn from ``numpy.random.default_rng(seed)``, so the same spec, steps and seed give the same mean.

    Args:
        spec: an environment spec (the module docstring), with its ``num_envs`` E.
        steps: observations per env (>= 1), the reset's included: E x steps in all. A reset's frame stack is
            zero-padded, which darkens the older frames of those observations (a 1/steps share of the mean).
        seed: the reset's and the actions' seed.

    Returns:
        (*obs_shape) float32 array in the observation's units (pixels 0-255 for uint8 frames).

    Raises:
        ValueError: ``steps`` below 1.

    Example::

        >>> spec = {"env": "CartPole-v1", "backend": "gym", "num_envs": 2, "kwargs": {}}
        >>> mean_observation(spec, 10).shape
        (4,)
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    group = make_env_group(spec)
    try:
        rng = np.random.default_rng(seed)
        total = group.reset(seed=seed).astype(np.float64).sum(axis=0)  # [*obs_shape]
        for _ in range(steps - 1):
            obs, _, _, _ = group.step(rng.integers(0, group.n_actions, group.num_envs))
            total += obs.sum(axis=0, dtype=np.float64)
        return (total / (steps * group.num_envs)).astype(np.float32)
    finally:
        group.close()
