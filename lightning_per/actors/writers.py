"""What an agent writes into its slots: GA3C's rollouts or Ape-X's n-step transitions (NumPy only: agents import it).

One agent loop (:func:`lightning_per.actors.agent.agent_main`) serves both learners; the difference between them is
the writer it holds, a value built once from a plain spec (:func:`make_writer`), chosen by the learner:

- :class:`RolloutWriter` (GA3C, Babaeizadeh et al. 2017, section 4.1): the predictor's sampled action is taken; each
  step's observation, reward and termination go to row t of the current rollout slot; after ``t_max`` steps the
  rollout waits for V(s_T), which the prediction of the next rollout's first step brings, then its n-step returns
  (:func:`~lightning_per.actors.returns.nstep_returns`) are written and it is published;
- :class:`TransitionWriter` (Ape-X, Horgan et al. 2018, Algorithm 1 "Actor"): the predictor's greedy action is
  replaced by a uniformly random one with probability ``epsilon`` (the agent's rung of
  :func:`~lightning_per.actors.ladder.epsilon_ladder`); each step goes into an
  :class:`~lightning_per.actors.nstep.NStepWindow` and the transition it completes to row t of the slot, with the
  version of the weights that chose its first action; a slot of T rows is published at once.

A writer talks to the loop through the :class:`Slots` it is given: ``take()`` waits for a free slot of this agent
(backpressure) and claims it, ``publish(slot)`` sets ``ready`` last and wakes the learner.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

import numpy as np

from lightning_per.actors.ladder import annealed_epsilon
from lightning_per.actors.nstep import NStepWindow
from lightning_per.actors.returns import clip_rewards, nstep_returns
from lightning_per.actors.shared import SharedRollouts

__all__ = ["AgentWriter", "RolloutWriter", "Slots", "TransitionWriter", "WRITER_KINDS", "make_writer"]

#: the writers a spec may name (``spec["kind"]``): a fixed table, nothing named by a user is imported
WRITER_KINDS = ("rollouts", "transitions")


class Slots(Protocol):
    """The agent loop's slot service a writer uses."""

    def take(self) -> int:
        """Wait for a free slot of this agent, claim it (``busy``, its episode count cleared) and return it."""

    def publish(self, slot: int) -> None:
        """Make ``slot`` visible to the learner (``ready`` set last) and wake it."""


class AgentWriter(Protocol):
    """What an agent writes per step; ``slot`` is the slot episodes that end now are recorded in."""

    slot: int

    def begin(self) -> None:
        """Claim the first slot (after the envs' reset)."""

    def request(self, obs: np.ndarray) -> None:
        """Put ``obs`` (E, *obs_shape) where a predictor reads it, before the request is flagged."""

    def act(self) -> np.ndarray:
        """After the predictor's answer: the (E,) int64 actions to step with (publishing what the answer completes)."""

    def record(self, obs: np.ndarray, action: np.ndarray, next_obs: np.ndarray, final_obs: np.ndarray | None,
               reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> None:
        """One vector step: ``obs`` -> ``action`` -> ``reward`` (E,) float32, ``terminated`` / ``truncated`` (E,) bool,
        ``next_obs`` (after auto-reset) and ``final_obs`` (the true last observation where an episode ended, or None
        for env groups that do not keep it)."""


class RolloutWriter:
    """GA3C's rollouts of T = ``t_max`` steps of E envs (see the module docstring).

    Args:
        shared: the agent's view of :func:`~lightning_per.actors.shared.make_layout`'s segment; index: its row.
        slots: the loop's :class:`Slots`.
        gamma: discount in (0, 1]; reward_clip: clip training rewards to [-c, c] (None: no clipping).
    """

    def __init__(self, shared: SharedRollouts, index: int, slots: Slots, gamma: float,
                 reward_clip: float | None) -> None:
        self.index, self.slots, self.gamma, self.reward_clip = index, slots, gamma, reward_clip
        self.obs_buf, self.act_buf, self.val_buf = shared.obs[index], shared.actions[index], shared.values[index]
        self.rew_buf, self.term_buf = shared.rewards[index], shared.terminated[index]
        self.trunc_buf, self.ret_buf = shared.truncated[index], shared.returns[index]
        self.next_buf = shared.next_obs[index] if "next_obs" in shared.layout else None  # (S, E, *obs): V-trace's s_T
        self.req_slot, self.req_t = shared.req_slot, shared.req_t
        self.t_max = self.obs_buf.shape[1]
        self.slot, self.t, self.prev = -1, 0, None

    def __repr__(self) -> str:
        return f"RolloutWriter(t_max={self.t_max}, gamma={self.gamma}, reward_clip={self.reward_clip})"

    def begin(self) -> None:
        self.slot, self.t, self.prev = self.slots.take(), 0, None

    def request(self, obs: np.ndarray) -> None:
        self.obs_buf[self.slot, self.t] = obs
        self.req_slot[self.index], self.req_t[self.index] = self.slot, self.t

    def act(self) -> np.ndarray:
        prev = self.prev
        if prev is not None:  # t == 0: V(s_T) of the previous rollout is now known
            nstep_returns(self.rew_buf[prev], self.val_buf[prev], self.val_buf[self.slot, 0], self.term_buf[prev],
                          self.trunc_buf[prev], self.gamma, out=self.ret_buf[prev])
            self.slots.publish(prev)
            self.prev = None
        return self.act_buf[self.slot, self.t]  # [E] int64, the predictor's sample from pi

    def record(self, obs, action, next_obs, final_obs, reward, terminated, truncated) -> None:
        slot, t = self.slot, self.t
        self.rew_buf[slot, t] = clip_rewards(reward, self.reward_clip)
        self.term_buf[slot, t] = terminated
        self.trunc_buf[slot, t] = truncated & ~terminated
        self.t = t + 1
        if self.t == self.t_max:
            if self.next_buf is not None:
                self.next_buf[slot] = next_obs  # s_T of this rollout, before its trainer may claim it (publish)
            self.prev, self.slot, self.t = slot, self.slots.take(), 0


class TransitionWriter:
    """Ape-X's epsilon-greedy acting and n-step transitions, T vector steps a slot (see the module docstring).

    Args:
        shared: the agent's view of :func:`~lightning_per.actors.shared.make_transition_layout`'s segment; index:
            its row.
        slots: the loop's :class:`Slots`.
        n_step: horizon n >= 1; gamma: discount in [0, 1].
        epsilon: probability of a uniformly random action, in [0, 1], from learner update ``anneal_updates`` on;
        epsilon_start: the probability at update 0; anneal_updates: updates of the linear way between them
            (:func:`~lightning_per.actors.ladder.annealed_epsilon`, on the version of the weights that answered).
        num_envs: E; n_actions: the envs' action count; obs_shape, obs_dtype: one observation's.
        seed: the exploration generator's seed (with a constant of its own, apart from the envs' seeds).
    """

    def __init__(self, shared: SharedRollouts, index: int, slots: Slots, n_step: int, gamma: float, epsilon: float,
                 epsilon_start: float, anneal_updates: int, num_envs: int, n_actions: int, obs_shape: tuple[int, ...],
                 obs_dtype: np.dtype, seed: int) -> None:
        self.slots, self.n_step, self.gamma, self.epsilon = slots, n_step, gamma, epsilon
        self.epsilon_start, self.anneal_updates = epsilon_start, anneal_updates
        self.num_envs, self.n_actions = num_envs, n_actions
        self.obs_req, self.greedy = shared.obs[index], shared.actions[index]  # [E, *obs], [E]
        self.version = shared.versions[index:index + 1]  # a view: the predictor writes it
        self.out = {"obs": shared.t_obs[index], "action": shared.t_action[index], "reward": shared.t_reward[index],
                    "discount": shared.t_discount[index], "next_obs": shared.t_next_obs[index],
                    "version": shared.t_version[index]}  # (S, T, E, ...) each
        self.steps = self.out["action"].shape[1]
        self.rng = np.random.default_rng([seed, 0x41_50_45_58])  # "APEX": exploration, apart from the envs' seeds
        self.window = NStepWindow(n_step, gamma, num_envs, obs_shape, obs_dtype)
        self.versions: deque[int] = deque(maxlen=n_step)  # weights version of each step in the window
        self.slot, self.t = -1, 0

    def __repr__(self) -> str:
        return (f"TransitionWriter(n_step={self.n_step}, gamma={self.gamma}, epsilon_start={self.epsilon_start}, "
                f"epsilon={self.epsilon}, anneal_updates={self.anneal_updates}, steps={self.steps})")

    def begin(self) -> None:
        self.slot, self.t = self.slots.take(), 0

    def request(self, obs: np.ndarray) -> None:
        self.obs_req[:] = obs

    def act(self) -> np.ndarray:
        greedy = self.greedy.copy()  # [E] argmax_a Q(s, a)
        version = int(self.version[0])
        self.versions.append(version)
        epsilon = annealed_epsilon(self.epsilon_start, self.epsilon, version, self.anneal_updates)
        explore = self.rng.random(self.num_envs) < epsilon  # [E]
        return np.where(explore, self.rng.integers(self.n_actions, size=self.num_envs), greedy)  # [E] int64

    def record(self, obs, action, next_obs, final_obs, reward, terminated, truncated) -> None:
        tr = self.window.push(obs, action, final_obs, reward, terminated | truncated, terminated)
        if tr is None:
            return
        out, slot, t = self.out, self.slot, self.t
        out["obs"][slot, t], out["action"][slot, t] = tr["observation"], tr["action"]
        out["reward"][slot, t], out["discount"][slot, t] = tr["reward"], tr["discount"]
        out["next_obs"][slot, t], out["version"][slot, t] = tr["next_observation"], self.versions[0]
        self.t = t + 1
        if self.t == self.steps:
            self.slots.publish(slot)
            self.slot, self.t = self.slots.take(), 0


def make_writer(spec: dict, shared: SharedRollouts, index: int, slots: Slots, num_envs: int, n_actions: int,
                obs_shape: tuple[int, ...], obs_dtype: np.dtype, seed: int) -> AgentWriter:
    """The writer ``spec`` names: ``{"kind": "rollouts", "gamma": g, "reward_clip": c | None}`` (GA3C) or
    ``{"kind": "transitions", "n_step": n, "gamma": g, "epsilon": e, "epsilon_start": s, "anneal_updates": u}``
    (Ape-X); the rest are the agent's.

    Raises:
        ValueError: ``spec["kind"]`` is not one of :data:`WRITER_KINDS`.

    Example:
        >>> make_writer({"kind": "frames"}, None, 0, None, 1, 2, (4,), np.float32, 0)
        Traceback (most recent call last):
        ...
        ValueError: writer spec kind must be one of ('rollouts', 'transitions'), got 'frames'
    """
    kind = spec.get("kind")
    if kind == "rollouts":
        return RolloutWriter(shared, index, slots, spec["gamma"], spec["reward_clip"])
    if kind == "transitions":
        return TransitionWriter(shared, index, slots, spec["n_step"], spec["gamma"], spec["epsilon"],
                                spec["epsilon_start"], spec["anneal_updates"], num_envs, n_actions, obs_shape,
                                obs_dtype, seed)
    raise ValueError(f"writer spec kind must be one of {WRITER_KINDS}, got {kind!r}")
