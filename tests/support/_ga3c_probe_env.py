"""A probe environment for the GA3C data path: every observation names itself, every reward and episode
end is a known function of what was observed and done.

The observation encodes (uid, episode, t, n): a per-instance id, the episode number, the step within
the episode and the instance's total step count (never reset; the agent steps its envs in lockstep
from creation, so the rollout of step n ends at the next multiple of t_max). :func:`policy` picks the
action and V from the observation alone, and :func:`expected_return` recomputes the n-step return of
any observed step by a forward sum over the episode, independent of ``nstep_returns`` and of how rows
are laid out in shared memory and in batches. Imported by agent processes through
``gym.make("_ga3c_probe_env:GA3CProbe-v0")`` (the spawned agents inherit ``sys.path``).
"""

import itertools
import os

import gymnasium as gym
import numpy as np

ENV_ID = "_ga3c_probe_env:GA3CProbe-v0"
N_ACTIONS = 6
_COUNTER = itertools.count()


def action_of(uid, ep, t, n):
    return (uid + ep + 2 * t + n) % N_ACTIONS


def value_of(uid, ep, t, n):
    return ((uid * 7 + ep * 13 + t * 3 + n * 5) % 17) / 4.0 - 2.0


def raw_reward(uid, ep, t, action):
    return float((uid * 3 + ep * 5 + t * 7 + action * 11) % 9 - 4)  # in [-4, 4]: clipping matters


def episode_len(uid, ep):
    return 2 + (uid + 3 * ep) % 7  # 2..8 steps: ends before, at and after rollout ends


def truncates(uid, ep):
    return (uid + ep) % 3 == 0  # else the last step terminates


class ProbeEnv(gym.Env):
    """Discrete(6); obs float32 (4,) = (uid, ep, t, n), or with ``image=True`` (4, 84, 84) uint8 with
    the four fields as little-endian uint32 in the first 16 bytes of the newest frame (index 3)."""

    metadata: dict = {"render_modes": []}

    def __init__(self, image: bool = False) -> None:
        self.image = image
        self.uid = (os.getpid() % 4096) * 64 + next(_COUNTER) % 64  # distinct per instance, < 2**18
        self.ep, self.t, self.n = -1, 0, 0
        self.action_space = gym.spaces.Discrete(N_ACTIONS)
        if image:
            self.observation_space = gym.spaces.Box(0, 255, shape=(4, 84, 84), dtype=np.uint8)
        else:
            self.observation_space = gym.spaces.Box(0.0, 2.0**24, shape=(4,), dtype=np.float32)

    def _obs(self):
        fields = np.array([self.uid, self.ep, self.t, self.n], dtype="<u4")
        if not self.image:
            return fields.astype(np.float32)
        obs = np.zeros((4, 84, 84), dtype=np.uint8)
        obs[3, 0, :16] = fields.view(np.uint8)
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.ep += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        reward = raw_reward(self.uid, self.ep, self.t, int(action))
        self.t += 1
        self.n += 1
        done = self.t >= episode_len(self.uid, self.ep)
        trunc = done and truncates(self.uid, self.ep)
        return self._obs(), reward, done and not trunc, trunc, {}


if ENV_ID.split(":")[1] not in gym.registry:
    gym.register(ENV_ID.split(":")[1], entry_point=f"{__name__}:ProbeEnv")


def decode(obs: np.ndarray) -> np.ndarray:
    """(N, *obs_shape) observations -> (N, 4) int64 (uid, ep, t, n)."""
    obs = np.ascontiguousarray(obs)
    if obs.dtype == np.uint8:
        return obs[:, 3, 0, :16].copy().view("<u4").astype(np.int64)
    return obs.astype(np.int64)


def policy(obs):
    """The predictors' policy: action and V from the observation alone (torch in, torch out)."""
    import torch

    f = decode(obs.cpu().numpy())
    action = torch.tensor([action_of(*row) for row in f.tolist()], dtype=torch.int64)
    value = torch.tensor([value_of(*row) for row in f.tolist()], dtype=torch.float32)
    return action.to(obs.device), value.to(obs.device)


def expected_return(uid, ep, t, n, t_max, gamma, clip):
    """n-step return of the step observed as (uid, ep, t, n), summed forward to the end of its rollout
    (bootstrap V of the next observation) or of its episode (nothing at a terminal, V(s_t) of the last
    step at a truncation)."""
    total, disc = 0.0, 1.0
    while True:
        r = raw_reward(uid, ep, t, action_of(uid, ep, t, n))
        total += disc * min(max(r, -clip), clip)
        disc *= gamma
        if t + 1 == episode_len(uid, ep):
            return total + (disc * value_of(uid, ep, t, n) if truncates(uid, ep) else 0.0)
        if (n + 1) % t_max == 0:
            return total + disc * value_of(uid, ep, t + 1, n + 1)
        t, n = t + 1, n + 1


def episode_result(uid, ep, n0):
    """(unclipped return, length) of episode ``ep`` of instance ``uid`` whose first step was step ``n0``."""
    length = episode_len(uid, ep)
    ret = sum(raw_reward(uid, ep, t, action_of(uid, ep, t, n0 + t)) for t in range(length))
    return ret, length
