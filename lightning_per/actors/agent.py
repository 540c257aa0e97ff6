"""GA3C agents: CPU processes that step environments and emit n-step experience (section 4.1).

An agent never imports torch, let alone CUDA: it is started with the ``spawn`` method through
:mod:`lightning_per.actors._agent_boot`, imports only NumPy, Gymnasium (ale-py) and the NumPy
modules of this package, and talks to the learner only through shared memory and semaphores
(:mod:`lightning_per.actors.shared`):

- per step: it writes the observations of its E envs into its rollout slot, sets
  ``req_slot/req_t`` and ``pending``, releases the learner's prediction semaphore and waits on its
  own response semaphore, which a predictor releases once actions, values and the policy version
  of that step are written;
- per step and per 0.1 s of waiting (for an answer or a free slot): it counts its ``heartbeat`` up and polls its
  stop flags; the learner's supervisor takes an agent whose heartbeat stands still for ``agent_stall_timeout_s``
  as stopped or hung (:mod:`lightning_per.actors.supervisor`);
- per finished rollout: it writes the n-step returns, the observation after its last step s_T when the
  layout has ``next_obs`` (V-trace), and the episodes that ended in it
  (``ep_count/ep_return/ep_length``), sets ``ready`` and releases the learner's training
  semaphore; a trainer copies the rollout out, clears ``busy`` and releases the agent's free-slot
  semaphore.

Rollouts have a fixed length T = t_max for all E environments (lockstep); an episode that ends
inside a rollout cuts the return recursion there (see :func:`~lightning_per.actors.returns.nstep_returns`),
which gives every transition the same target as emitting "at episode end" in the reference. The
return of a rollout is computed when the prediction for the first step of the next rollout brings
V(s_T), the bootstrap value; so an agent holds two slots at a time (``rollout_slots >= 2``).
"""

from __future__ import annotations

import os
import signal

import numpy as np

from lightning_per.actors.envs import make_env_group
from lightning_per.actors.returns import clip_rewards, nstep_returns
from lightning_per.actors.shared import SharedRollouts

__all__ = ["agent_main"]

_POLL_S = 0.1


class _Stopped(Exception):
    """Raised inside the agent loop when it must exit (flag set or parent gone)."""


def agent_main(index: int, env_spec: dict, layout: dict, shm_name: str, pred_sem, train_sem, response_sem,
               free_sem, gamma: float, reward_clip: float | None, parent_pid: int, seed: int) -> None:
    """Run one agent until asked to stop (flag), or until the learner process is gone.

    Args:
        index: agent index i in [0, max_agents) (its rows of the shared buffers).
        env_spec: environment spec dict (:func:`~lightning_per.actors.envs.make_env_group`).
        layout: shared buffer layout (:func:`~lightning_per.actors.shared.make_layout`).
        shm_name: name of the shared-memory segment.
        pred_sem, train_sem: the learner's wake-up semaphores (prediction requests, rollouts).
        response_sem: released by a predictor when this agent's actions are ready.
        free_sem: counts this agent's rollout slots that trainers have released.
        gamma: discount in (0, 1].
        reward_clip: clip training rewards to [-c, c]; None: no clipping.
        parent_pid: pid of the learner; the agent exits when its parent changes (learner died).
        seed: environment seed.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the learner's to handle: it sets our flag
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    shared = SharedRollouts.attach(shm_name, layout)
    env = None
    try:
        env = make_env_group(env_spec)
        _run(index, env, shared, pred_sem, train_sem, response_sem, free_sem, gamma, reward_clip, parent_pid,
             seed)
    except _Stopped:
        pass
    finally:
        if env is not None:
            env.close()
        shared.close()


def _run(index, env, shared, pred_sem, train_sem, response_sem, free_sem, gamma, reward_clip, parent_pid,
         seed) -> None:
    flags = shared.flags
    stop_all = flags.shape[0] - 1
    obs_buf, act_buf, val_buf = shared.obs[index], shared.actions[index], shared.values[index]
    rew_buf, term_buf, trunc_buf = shared.rewards[index], shared.terminated[index], shared.truncated[index]
    ret_buf, busy, ready = shared.returns[index], shared.busy[index], shared.ready[index]
    next_buf = shared.next_obs[index] if "next_obs" in shared.layout else None  # (S, E, *obs): V-trace's s_T
    ep_count, ep_return, ep_length = shared.ep_count[index], shared.ep_return[index], shared.ep_length[index]
    req_slot, req_t, pending = shared.req_slot, shared.req_t, shared.pending
    heartbeat = shared.heartbeat[index:index + 1]  # a view: the supervisor reads it
    t_max = obs_buf.shape[1]

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

    ep_ret = np.zeros(env.num_envs, dtype=np.float64)
    ep_len = np.zeros(env.num_envs, dtype=np.int64)
    obs = env.reset(seed=seed)  # (ALE: seconds on a busy machine, with make_env_group; no flag polls)
    shared.started[index] = 1  # from here on it polls its flags and beats: close() waits for it to exit
    slot, t, prev = take_slot(), 0, None
    obs_buf[slot, 0] = obs
    while True:
        req_slot[index], req_t[index] = slot, t
        pending[index] = 1  # after the data it describes; the semaphore below is a memory barrier
        pred_sem.release()
        wait(response_sem)
        if prev is not None:  # t == 0: V(s_T) of the previous rollout is now known
            nstep_returns(rew_buf[prev], val_buf[prev], val_buf[slot, 0], term_buf[prev], trunc_buf[prev],
                          gamma, out=ret_buf[prev])
            ready[prev] = 1
            train_sem.release()
            prev = None
        obs, reward, terminated, truncated = env.step(act_buf[slot, t])
        ep_ret += reward
        ep_len += 1
        rew_buf[slot, t] = clip_rewards(reward, reward_clip)
        term_buf[slot, t] = terminated
        trunc_buf[slot, t] = truncated & ~terminated
        for k in np.flatnonzero(terminated | truncated):
            n = ep_count[slot]
            ep_return[slot, n], ep_length[slot, n] = ep_ret[k], ep_len[k]
            ep_count[slot] = n + 1
            ep_ret[k], ep_len[k] = 0.0, 0
        t += 1
        if t == t_max:
            if next_buf is not None:
                next_buf[slot] = obs  # s_T of this rollout, before its trainer may claim it (ready, below)
            prev, slot, t = slot, take_slot(), 0
        obs_buf[slot, t] = obs
        check()
