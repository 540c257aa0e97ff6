"""n-step transitions of E lockstep environments, in NumPy: what an Ape-X agent emits (torch-free).

The same rules as the DQN's in-process :class:`lightning_per.dqn.collector.NStepCollector` (which this package
must not import): after the first ``n - 1`` steps every vector step emits exactly E transitions, the one that
started ``n - 1`` steps ago, with ``alive_k = prod_{j<k} (1 - done_{s+j})`` (Sutton & Barto 2018, section 7.1):

- ``reward = G = sum_{k<n} gamma^k * r_{s+k} * alive_k`` (rewards after the episode's end are dropped),
- ``last = sum_k alive_k - 1`` (the last step of the window in the transition's episode),
- ``discount = gamma^(last+1) * (1 - terminated_{s+last})``: 0 after a true termination, ``gamma^(last+1)``
  after a time-limit truncation or mid-episode,
- ``next_observation`` = the observation after step ``s+last`` (the true final one where an episode ended).

Sums run in float32 in time order, oldest first.
"""

from __future__ import annotations

import numpy as np

__all__ = ["NStepWindow"]


class NStepWindow:
    """The last ``n`` vector steps of E environments and the transition each new step completes.

    Args:
        n_step: horizon n >= 1.
        gamma: discount in [0, 1].
        num_envs: E >= 1.
        obs_shape: one observation's shape; obs_dtype: its NumPy dtype.

    Raises:
        ValueError: ``n_step`` < 1, ``gamma`` outside [0, 1] or ``num_envs`` < 1.

    Example:
        >>> w = NStepWindow(2, 0.5, 1, (1,), np.float32)
        >>> w.push(np.zeros((1, 1)), np.array([0]), np.ones((1, 1)), np.array([1.0]), np.array([False]),
        ...        np.array([False])) is None
        True
        >>> out = w.push(np.ones((1, 1)), np.array([1]), np.full((1, 1), 2.0), np.array([2.0]), np.array([True]),
        ...              np.array([True]))
        >>> out["reward"].tolist(), out["discount"].tolist(), out["next_observation"].tolist()
        ([2.0], [0.0], [[2.0]])
    """

    def __init__(self, n_step: int, gamma: float, num_envs: int, obs_shape: tuple[int, ...], obs_dtype) -> None:
        if n_step < 1:
            raise ValueError(f"n_step must be >= 1, got {n_step}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        n, e = n_step, num_envs
        self.n, self.gamma, self.num_envs = n, gamma, e
        self.steps = 0
        self.observation = np.zeros((n, e, *obs_shape), dtype=obs_dtype)
        self.next_observation = np.zeros((n, e, *obs_shape), dtype=obs_dtype)
        self.action = np.zeros((n, e), dtype=np.int64)
        self.reward = np.zeros((n, e), dtype=np.float32)
        self.done = np.zeros((n, e), dtype=bool)
        self.terminated = np.zeros((n, e), dtype=bool)
        self._powers = np.float32(gamma) ** np.arange(n, dtype=np.float32)  # [n]

    def push(self, observation: np.ndarray, action: np.ndarray, next_observation: np.ndarray, reward: np.ndarray,
             done: np.ndarray, terminated: np.ndarray) -> dict[str, np.ndarray] | None:
        """Record one vector step; return the transition it completes, or None while the window fills.

        Args:
            observation: (E, *obs) the observation acted on; action: (E,) int64.
            next_observation: (E, *obs) the observation after the step (the true final one at an episode end).
            reward: (E,) float32; done: (E,) bool (terminated or truncated); terminated: (E,) bool.

        Returns:
            ``{"observation": (E, *obs), "action": (E,) int64, "reward": (E,) float32 (n-step return G),
            "discount": (E,) float32, "next_observation": (E, *obs)}`` (new arrays), or None.
        """
        slot = self.steps % self.n
        self.observation[slot] = observation
        self.next_observation[slot] = next_observation
        self.action[slot] = action
        self.reward[slot] = reward
        self.done[slot] = done
        self.terminated[slot] = terminated
        self.steps += 1
        if self.steps < self.n:
            return None
        start = self.steps % self.n  # the oldest slot
        order = np.roll(np.arange(self.n), -start)  # [n] window slots, oldest first
        not_done = (~self.done[order]).astype(np.float32)  # [n, E]
        alive = np.concatenate((np.ones_like(not_done[:1]), np.cumprod(not_done[:-1], 0, dtype=np.float32)))
        ret = np.zeros(self.num_envs, dtype=np.float32)
        for k in range(self.n):  # float32, oldest first
            ret += self._powers[k] * self.reward[order[k]] * alive[k]
        last = alive.sum(0).astype(np.int64) - 1  # [E]
        envs = np.arange(self.num_envs)
        last_slot = order[last]  # [E]
        term_last = self.terminated[last_slot, envs].astype(np.float32)
        discount = (np.float32(self.gamma) ** (last + 1).astype(np.float32)) * (np.float32(1.0) - term_last)
        return {"observation": self.observation[start].copy(), "action": self.action[start].copy(),
                "reward": ret, "discount": discount.astype(np.float32),
                "next_observation": self.next_observation[last_slot, envs].copy()}
