"""Ape-X agents: CPU processes that step environments epsilon-greedily and emit n-step transitions
(Horgan et al. 2018, arXiv:1803.00933, Algorithm 1 "Actor").

Like GA3C's agents (:mod:`lightning_per.actors.agent`) they never import torch: started through
:mod:`lightning_per.actors._agent_boot`, they talk to the learner through one shared-memory segment
(:func:`~lightning_per.actors.shared.make_transition_layout`) and semaphores:

- per vector step: the agent writes its E observations to ``obs[i]``, sets ``pending[i]``, releases the
  prediction semaphore and waits on its response semaphore; a predictor writes argmax_a Q(s, a) and the weights'
  version. The agent takes a uniformly random action instead with probability ``epsilon`` (its rung of the ladder,
  :func:`~lightning_per.actors.ladder.epsilon_ladder`), from its own NumPy generator;
- the step goes into an :class:`~lightning_per.actors.nstep.NStepWindow` (the in-process collector's n-step rules);
  each completed transition is written to row t of the agent's current slot, with the version of the weights that
  chose its first action;
- a slot of T vector steps is published by setting ``ready`` last and releasing the ready semaphore; the learner's
  ingest thread copies it out and frees it (the free-slot semaphore). An agent whose slots are all taken waits:
  backpressure by blocking, as a writer handle's ``"block"``;
- every step and every 0.1 s of waiting it counts its ``heartbeat`` and polls its stop flags.
"""

from __future__ import annotations

import os
import signal
from collections import deque

import numpy as np

from lightning_per.actors.envs import make_env_group
from lightning_per.actors.nstep import NStepWindow
from lightning_per.actors.shared import SharedRollouts

__all__ = ["apex_agent_main"]

_POLL_S = 0.1


class _Stopped(Exception):
    """Raised inside the agent loop when it must exit (flag set or parent gone)."""


def apex_agent_main(index: int, env_spec: dict, layout: dict, shm_name: str, pred_sem, ready_sem, response_sem,
                    free_sem, n_step: int, gamma: float, epsilon: float, parent_pid: int, seed: int) -> None:
    """Run one Ape-X agent until asked to stop (flag), or until the learner process is gone.

    Args:
        index: agent index i in [0, max_agents) (its rows of the shared buffers).
        env_spec: environment spec dict (:func:`~lightning_per.actors.envs.make_env_group`).
        layout: :func:`~lightning_per.actors.shared.make_transition_layout`; shm_name: the segment's name.
        pred_sem, ready_sem: the learner's wake-up semaphores (prediction requests, finished slots).
        response_sem: released by a predictor when this agent's greedy actions are written.
        free_sem: counts this agent's slots that the learner has released.
        n_step: horizon n >= 1; gamma: discount in [0, 1].
        epsilon: probability of a uniformly random action, in [0, 1].
        parent_pid: pid of the learner; the agent exits when its parent changes (learner died).
        seed: environment seed (env k resets with ``seed + k``) and, with it, the exploration generator's.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the learner's to handle: it sets our flag
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    shared = SharedRollouts.attach(shm_name, layout)
    env = None
    try:
        env = make_env_group(env_spec)
        _run(index, env, shared, pred_sem, ready_sem, response_sem, free_sem, n_step, gamma, epsilon, parent_pid,
             seed)
    except _Stopped:
        pass
    finally:
        if env is not None:
            env.close()
        shared.close()


def _run(index, env, shared, pred_sem, ready_sem, response_sem, free_sem, n_step, gamma, epsilon, parent_pid,
         seed) -> None:
    flags = shared.flags
    stop_all = flags.shape[0] - 1
    busy, ready, pending = shared.busy[index], shared.ready[index], shared.pending
    ep_count, ep_return, ep_length = shared.ep_count[index], shared.ep_return[index], shared.ep_length[index]
    heartbeat = shared.heartbeat[index:index + 1]  # a view: the supervisor reads it
    out = {key: getattr(shared, f"t_{key}")[index] for key in
           ("obs", "action", "reward", "discount", "next_obs", "version")}  # (S, T, E, ...) each
    steps = out["action"].shape[1]
    rng = np.random.default_rng([seed, 0x41_50_45_58])  # "APEX": exploration, apart from the envs' seeds

    def check() -> None:
        heartbeat[0] += 1  # progress: every step and every _POLL_S of waiting
        if flags[index] or flags[stop_all] or os.getppid() != parent_pid:
            raise _Stopped

    def wait(sem) -> None:
        while not sem.acquire(timeout=_POLL_S):
            check()

    def take_slot() -> int:
        wait(free_sem)
        slot = int(np.flatnonzero(busy == 0)[0])
        busy[slot] = 1
        ep_count[slot] = 0
        return slot

    window = NStepWindow(n_step, gamma, env.num_envs, env.obs_shape, env.obs_dtype)
    versions: deque[int] = deque(maxlen=n_step)  # weights version of each step in the window
    ep_ret = np.zeros(env.num_envs, dtype=np.float64)
    ep_len = np.zeros(env.num_envs, dtype=np.int64)
    obs = env.reset(seed=seed)
    shared.started[index] = 1  # from here on it polls its flags and beats
    slot, t = take_slot(), 0
    while True:
        shared.obs[index] = obs
        pending[index] = 1  # after the data it describes; the semaphore below is a memory barrier
        pred_sem.release()
        wait(response_sem)
        greedy = shared.actions[index].copy()  # [E]
        versions.append(int(shared.versions[index]))
        explore = rng.random(env.num_envs) < epsilon  # [E]
        action = np.where(explore, rng.integers(env.n_actions, size=env.num_envs), greedy)  # [E] int64
        next_obs, reward, terminated, truncated = env.step(action)
        done = terminated | truncated
        ep_ret += reward
        ep_len += 1
        for k in np.flatnonzero(done):
            n = ep_count[slot]
            ep_return[slot, n], ep_length[slot, n] = ep_ret[k], ep_len[k]
            ep_count[slot] = n + 1
            ep_ret[k], ep_len[k] = 0.0, 0
        tr = window.push(obs, action, env.final_obs, reward, done, terminated)
        obs = next_obs
        if tr is not None:
            out["obs"][slot, t], out["action"][slot, t] = tr["observation"], tr["action"]
            out["reward"][slot, t], out["discount"][slot, t] = tr["reward"], tr["discount"]
            out["next_obs"][slot, t], out["version"][slot, t] = tr["next_observation"], versions[0]
            t += 1
            if t == steps:
                ready[slot] = 1  # last: the slot is visible only now
                ready_sem.release()
                slot, t = take_slot(), 0
        check()
