"""A deterministic probe environment for Ape-X's transitions: every observation names itself (uid, episode, t),
episode lengths, terminations, truncations and rewards are known functions of it, and :func:`q_values` is a
deterministic Q-function (distinct values: one greedy action per observation).

The uid comes from the ``uid`` keyword, else from the first seeded reset (an agent resets env k with ``seed + k``);
a reset before any step of the episode does not start a new one (TorchRL's wrappers may reset more than once).
Imported by agent processes through ``gym.make("_apex_probe_env:ApexProbe-v0")`` (spawned agents inherit
``sys.path``).
"""

import gymnasium as gym
import numpy as np

ENV_ID = "_apex_probe_env:ApexProbe-v0"
N_ACTIONS = 3


def episode_len(uid, ep):
    return 1 + (uid + 2 * ep) % 5  # 1..5 steps: shorter, equal to and longer than n


def truncates(uid, ep):
    return (uid + ep) % 3 == 0  # else the episode terminates


def reward_of(uid, ep, t, action):
    return float((uid + 3 * ep + 5 * t + 7 * action) % 9 - 4)


def q_values(obs):
    """(N, 3) float Q(s, .) of (N, 3) observations, as NumPy or torch (small integers: exact in float32)."""
    base = obs[..., 0] * 3 + obs[..., 1] * 5 + obs[..., 2] * 7
    return np.stack([(base + 11 * a) % 13 for a in range(N_ACTIONS)], -1) if isinstance(obs, np.ndarray) else \
        __import__("torch").stack([(base + 11 * a) % 13 for a in range(N_ACTIONS)], -1)


def greedy(uid, ep, t):
    return int(np.argmax(q_values(np.array([uid, ep, t], dtype=np.float64))))


def expected_transition(uid, ep, t, n, gamma):
    """The greedy n-step transition that starts at observation (uid, ep, t): an oracle by a forward sum,
    independent of any window: (action, G, discount, next observation)."""
    length = episode_len(uid, ep)
    action = greedy(uid, ep, t)
    ret, k, step = 0.0, 0, t
    a = action
    while True:
        ret += gamma ** k * reward_of(uid, ep, step, a)
        step += 1
        k += 1
        if step == length:  # the episode ends at this step
            discount = gamma ** k if truncates(uid, ep) else 0.0
            return action, ret, discount, (uid, ep, step)
        if k == n:
            return action, ret, gamma ** k, (uid, ep, step)
        a = greedy(uid, ep, step)


class ApexProbe(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, uid=None):
        self.observation_space = gym.spaces.Box(0.0, 1e6, shape=(3,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(N_ACTIONS)
        self.uid, self.ep, self.t = uid, 0, 0

    def _obs(self):
        return np.array([self.uid, self.ep, self.t], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.uid is None:
            self.uid = 0 if seed is None else int(seed)
        if self.t > 0:
            self.ep, self.t = self.ep + 1, 0
        return self._obs(), {}

    def step(self, action):
        r = reward_of(self.uid, self.ep, self.t, int(action))
        self.t += 1
        end = self.t >= episode_len(self.uid, self.ep)
        trunc = end and truncates(self.uid, self.ep)
        return self._obs(), r, end and not trunc, trunc, {}


if "ApexProbe-v0" not in gym.registry:
    gym.register("ApexProbe-v0", entry_point=f"{__name__}:ApexProbe")
