"""Agents: CPU processes that step environments for either learner (GA3C section 4.1; Ape-X's actors).

An agent never imports torch, let alone CUDA: it is started with the ``spawn`` method through
:mod:`lightning_per.actors._agent_boot`, imports only NumPy, Gymnasium (ale-py) and the NumPy
modules of this package, and talks to the learner only through shared memory and semaphores
(:mod:`lightning_per.actors.shared`). One loop serves both learners; what an agent writes is the value it
holds, a writer (:mod:`lightning_per.actors.writers`: GA3C's rollouts or Ape-X's n-step transitions):

- per step: the writer puts the observations of its E envs where predictors read them, the agent sets
  ``pending``, releases the learner's prediction semaphore and waits on its own response semaphore, which a
  predictor releases once the answer (actions, values, the policy's version) is written; the writer turns the
  answer into the actions to step with, and records the step;
- per step and per 0.1 s of waiting (for an answer or a free slot): it counts its ``heartbeat`` up and polls its
  stop flags; the learner's supervisor takes an agent whose heartbeat stands still for ``agent_stall_timeout_s``
  as stopped or hung (:mod:`lightning_per.actors.supervisor`);
- per step: it adds the seconds it ran, stepped its envs and waited (for the answer, for a free slot) to its row
  of ``agent_time`` (``AGENT_TIME``): what bounds the agents, for the learner's metrics;
- per finished slot: the writer publishes it (``ready`` set last, the learner's ready semaphore released) with the
  episodes that ended in it (``ep_count/ep_return/ep_length``, unclipped returns); the learner copies it out,
  clears ``busy`` and releases the agent's free-slot semaphore. An agent whose slots are all taken waits:
  backpressure by blocking.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np

from lightning_per.actors.envs import make_env_group
from lightning_per.actors.shared import AGENT_TIME, SharedRollouts
from lightning_per.actors.writers import AgentWriter, make_writer

__all__ = ["agent_main"]

_POLL_S = 0.1
_ENV, _ANSWER, _SLOT = (AGENT_TIME.index(k) for k in ("env", "answer_wait", "slot_wait"))  # agent_time columns


class _Stopped(Exception):
    """Raised inside the agent loop when it must exit (flag set or parent gone)."""


def agent_main(index: int, env_spec: dict, layout: dict, shm_name: str, pred_sem, ready_sem, response_sem,
               free_sem, parent_pid: int, seed: int, writer: dict) -> None:
    """Run one agent until asked to stop (flag), or until the learner process is gone.

    Args:
        index: agent index i in [0, max_agents) (its rows of the shared buffers).
        env_spec: environment spec dict (:func:`~lightning_per.actors.envs.make_env_group`).
        layout: shared buffer layout (:mod:`lightning_per.actors.shared`); shm_name: the segment's name.
        pred_sem, ready_sem: the learner's wake-up semaphores (prediction requests, published slots).
        response_sem: released by a predictor when this agent's answer is written.
        free_sem: counts this agent's slots that the learner has released.
        parent_pid: pid of the learner; the agent exits when its parent changes (learner died).
        seed: environment seed (env k resets with ``seed + k``) and the writer's (Ape-X's exploration).
        writer: what the agent writes, a plain spec (:func:`~lightning_per.actors.writers.make_writer`).

    Raises:
        ValueError: an unknown writer kind (before any env is made).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the learner's to handle: it sets our flag
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    shared = SharedRollouts.attach(shm_name, layout)
    env = None
    try:
        env = make_env_group(env_spec)
        slots = _AgentSlots(index, shared, ready_sem, free_sem, parent_pid)
        out = make_writer(writer, shared, index, slots, env.num_envs, env.n_actions, env.obs_shape, env.obs_dtype,
                          seed)
        _run(index, env, shared, slots, out, pred_sem, response_sem, seed)
    except _Stopped:
        pass
    finally:
        if env is not None:
            env.close()
        shared.close()


class _AgentSlots:
    """This agent's liveness, stop polls and slots (the :class:`~lightning_per.actors.writers.Slots` of its
    writer)."""

    def __init__(self, index: int, shared: SharedRollouts, ready_sem, free_sem, parent_pid: int) -> None:
        self.index, self.ready_sem, self.free_sem, self.parent_pid = index, ready_sem, free_sem, parent_pid
        self.flags, self.stop_all = shared.flags, shared.flags.shape[0] - 1
        self.busy, self.ready, self.ep_count = shared.busy[index], shared.ready[index], shared.ep_count[index]
        self.heartbeat = shared.heartbeat[index:index + 1]  # a view: the supervisor reads it
        self.times = shared.agent_time[index]  # [running, env, answer_wait, slot_wait] seconds, learner reads it
        self._mark = time.perf_counter()

    def check(self) -> None:
        """Count a heartbeat (every step and every ``_POLL_S`` of waiting); raise :class:`_Stopped` when asked to
        stop or when the learner is gone."""
        self.heartbeat[0] += 1
        if self.flags[self.index] or self.flags[self.stop_all] or os.getppid() != self.parent_pid:
            raise _Stopped

    def start_clock(self) -> None:
        """Count this agent's time (``agent_time``) from now."""
        self._mark = time.perf_counter()

    def spend(self, column: int = 0) -> None:
        """Add the seconds since the last call to this agent's running time and to ``column`` of ``agent_time``
        (0: running only, the agent's own work)."""
        now = time.perf_counter()
        spent, self._mark = now - self._mark, now
        self.times[0] += spent
        if column:
            self.times[column] += spent

    def wait(self, sem, column: int) -> None:
        """Acquire ``sem``, counting the wait to ``column`` of ``agent_time`` as it goes (each poll), so an agent
        blocked for good shows as waiting."""
        self.spend()
        while not sem.acquire(timeout=_POLL_S):
            self.spend(column)
            self.check()
        self.spend(column)

    def take(self) -> int:
        self.wait(self.free_sem, _SLOT)
        slot = int(np.flatnonzero(self.busy == 0)[0])
        self.busy[slot] = 1
        self.ep_count[slot] = 0
        return slot

    def publish(self, slot: int) -> None:
        self.ready[slot] = 1  # last: the slot is visible only now
        self.ready_sem.release()


def _run(index: int, env, shared: SharedRollouts, slots: _AgentSlots, writer: AgentWriter, pred_sem, response_sem,
         seed: int) -> None:
    pending = shared.pending
    ep_count, ep_return, ep_length = shared.ep_count[index], shared.ep_return[index], shared.ep_length[index]
    ep_ret = np.zeros(env.num_envs, dtype=np.float64)
    ep_len = np.zeros(env.num_envs, dtype=np.int64)
    obs = env.reset(seed=seed)  # (ALE: seconds on a busy machine, with make_env_group; no flag polls)
    shared.started[index] = 1  # from here on it polls its flags and beats: close() waits for it to exit
    slots.start_clock()
    writer.begin()
    while True:
        writer.request(obs)
        pending[index] = 1  # after the data it describes; the semaphore below is a memory barrier
        pred_sem.release()
        slots.wait(response_sem, _ANSWER)
        action = writer.act()  # [E] int64
        slots.spend()
        next_obs, reward, terminated, truncated = env.step(action)
        slots.spend(_ENV)
        ep_ret += reward
        ep_len += 1
        slot = writer.slot  # episodes that end now belong to the slot this step is recorded in
        for k in np.flatnonzero(terminated | truncated):
            n = ep_count[slot]
            ep_return[slot, n], ep_length[slot, n] = ep_ret[k], ep_len[k]
            ep_count[slot] = n + 1
            ep_ret[k], ep_len[k] = 0.0, 0
        writer.record(obs, action, next_obs, env.final_obs, reward, terminated, truncated)  # may wait for a slot
        obs = next_obs
        slots.spend()
        slots.check()
