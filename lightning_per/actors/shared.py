"""The rollout buffers every agent writes and predictors/trainers read: one shared-memory segment.

NumPy + stdlib only (agent processes import it). Layout, for A = ``max_agents`` agent indices,
S = ``rollout_slots`` rollouts per agent, T = ``t_max`` steps, E = ``envs_per_agent``::

    obs        (A, S, T, E, *obs_shape)  uint8 or float32   written by the agent, read by predictors/trainers
    actions    (A, S, T, E)              int64              written by predictors
    values     (A, S, T, E)              float32            V(s_t), written by predictors
    log_probs  (A, S, T, E)              float32            log mu(a_t|s_t) of the acting policy, by predictors
                                                            (``vtrace=True`` only, as ``next_obs``)
    versions   (A, S, T)                 int64              policy version that predicted step t
    rewards    (A, S, T, E)              float32            clipped rewards, written by the agent
    terminated (A, S, T, E)              bool
    truncated  (A, S, T, E)              bool
    returns    (A, S, T, E)              float32            n-step returns, written by the agent
    ep_count   (A, S)                    int64              episodes that ended in the rollout
    ep_return  (A, S, T*E)               float64            their unclipped returns
    ep_length  (A, S, T*E)               int64              their lengths (agent steps)
    busy       (A, S)                    uint8              1 while a slot is filled or awaits a trainer
    ready      (A, S)                    uint8              1: rollout finished, waiting for a trainer
    req_slot   (A,)                      int64              slot and step of agent i's pending request
    req_t      (A,)                      int64
    pending    (A,)                      uint8              1: agent i waits for a prediction
    started    (A,)                      uint8              1: agent i reset its envs and polls its flags
    heartbeat  (A,)                      int64              agent i's count of steps and 0.1 s waits (liveness)
    agent_time (A, 4)                    float64            seconds agent index i spent (all its incarnations, from
                                                            its envs' first reset): running, stepping its envs,
                                                            waiting for an answer, waiting for a free slot
                                                            (``AGENT_TIME``)
    flags      (A + 1,)                  uint8              flags[i] = 1: agent i exits; flags[A] = 1: all
    next_obs   (A, S, E, *obs_shape)     as obs             s_T, the observation after the rollout's last step
                                                            (``vtrace=True`` only: V-trace's bootstrap state)

A prediction request is a flag plus (slot, t): the observation is read in place, never pickled, and
the trainer reads the finished rollout from the same memory. Agents announce requests and rollouts
by releasing a counting semaphore after setting the flag (a wake-up call; predictors and trainers
also rescan every 50 ms): there is no queue, so no lock shared with agents that an agent killed at
the wrong moment could leave held (a ``multiprocessing.Queue`` writer killed inside its feeder
thread blocks every other writer forever).

Leaks: only the creating process unlinks the segment (``close(unlink=True)``); attaching processes
do not register it with the resource tracker (Python < 3.13 would otherwise unlink or warn), so if
the creator is killed the tracker it started still unlinks the segment.
"""

from __future__ import annotations

import os
import secrets
from multiprocessing import resource_tracker, shared_memory

import numpy as np

__all__ = ["AGENT_TIME", "SharedRollouts", "make_layout", "make_transition_layout"]

#: the columns of ``agent_time``: seconds an agent ran, and of those, stepped its envs, waited for a predictor's
#: answer and waited for a free slot (the learner's backpressure); the rest is its own work (the writer)
AGENT_TIME = ("running", "env", "answer_wait", "slot_wait")

_ALIGN = 64
_STILL_MAPPED: list = []  # segments closed while views were alive: unmapped at process exit


def make_layout(max_agents: int, slots: int, t_max: int, num_envs: int, obs_shape: tuple[int, ...],
                obs_dtype: str, vtrace: bool = False) -> dict:
    """Plain-dict layout (picklable without this package): ``name -> (shape, dtype str)``; ``vtrace``: also
    what V-trace reads that n-step returns do not, the acting policy's log-probabilities and the rollouts'
    bootstrap observations s_T."""
    a, s, t, e = max_agents, slots, t_max, num_envs
    layout = {
        "obs": ((a, s, t, e, *obs_shape), str(np.dtype(obs_dtype))),
        "actions": ((a, s, t, e), "int64"),
        "values": ((a, s, t, e), "float32"),
        "versions": ((a, s, t), "int64"),
        "rewards": ((a, s, t, e), "float32"),
        "terminated": ((a, s, t, e), "bool"),
        "truncated": ((a, s, t, e), "bool"),
        "returns": ((a, s, t, e), "float32"),
        "ep_count": ((a, s), "int64"),
        "ep_return": ((a, s, t * e), "float64"),
        "ep_length": ((a, s, t * e), "int64"),
        "busy": ((a, s), "uint8"),
        "ready": ((a, s), "uint8"),
        "req_slot": ((a,), "int64"),
        "req_t": ((a,), "int64"),
        "pending": ((a,), "uint8"),
        "started": ((a,), "uint8"),
        "heartbeat": ((a,), "int64"),
        "agent_time": ((a, len(AGENT_TIME)), "float64"),
        "flags": ((a + 1,), "uint8"),
    }
    if vtrace:
        layout["log_probs"] = ((a, s, t, e), "float32")
        layout["next_obs"] = ((a, s, e, *obs_shape), str(np.dtype(obs_dtype)))
    return layout


def make_transition_layout(max_agents: int, slots: int, steps: int, num_envs: int, obs_shape: tuple[int, ...],
                           obs_dtype: str, n_step: int) -> dict:
    """Plain-dict layout of Ape-X's agents (n-step transitions instead of rollouts), ``name -> (shape, dtype)``.

    For A agents, S slots of T vector steps of E envs::

        obs         (A, E, *obs)         the observations agent i asks Q(s) for (its pending request)
        actions     (A, E)     int64     argmax_a Q(s, a), written by predictors
        values      (A, E)     float32   max_a Q(s, a), written by predictors
        versions    (A,)       int64     learner updates of the weights that answered
        t_obs       (A, S, T, E, *obs)   n-step transitions (:class:`~lightning_per.actors.nstep.NStepWindow`)
        t_action    (A, S, T, E)  int64  the action taken (epsilon-greedy)
        t_reward    (A, S, T, E)  float32  n-step return G
        t_discount  (A, S, T, E)  float32  bootstrap factor
        t_next_obs  (A, S, T, E, *obs)   bootstrap observation
        t_version   (A, S, T)  int64     weights version that chose the transition's first action

    plus ``ep_count``, ``ep_return``, ``ep_length`` (room for (T + n_step) * E episodes a slot: an agent's first
    slot also sees the n - 1 steps that fill its window), ``busy``, ``ready``, ``pending``, ``started``,
    ``heartbeat``, ``agent_time`` and ``flags`` as in :func:`make_layout`.
    """
    a, s, t, e = max_agents, slots, steps, num_envs
    dt = str(np.dtype(obs_dtype))
    return {
        "obs": ((a, e, *obs_shape), dt),
        "actions": ((a, e), "int64"),
        "values": ((a, e), "float32"),
        "versions": ((a,), "int64"),
        "t_obs": ((a, s, t, e, *obs_shape), dt),
        "t_action": ((a, s, t, e), "int64"),
        "t_reward": ((a, s, t, e), "float32"),
        "t_discount": ((a, s, t, e), "float32"),
        "t_next_obs": ((a, s, t, e, *obs_shape), dt),
        "t_version": ((a, s, t), "int64"),
        "ep_count": ((a, s), "int64"),
        "ep_return": ((a, s, (t + n_step) * e), "float64"),
        "ep_length": ((a, s, (t + n_step) * e), "int64"),
        "busy": ((a, s), "uint8"),
        "ready": ((a, s), "uint8"),
        "pending": ((a,), "uint8"),
        "started": ((a,), "uint8"),
        "heartbeat": ((a,), "int64"),
        "agent_time": ((a, len(AGENT_TIME)), "float64"),
        "flags": ((a + 1,), "uint8"),
    }


def _offsets(layout: dict) -> tuple[dict[str, int], int]:
    offsets, total = {}, 0
    for name, (shape, dtype) in layout.items():
        offsets[name] = total
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        total += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
    return offsets, max(total, _ALIGN)


class SharedRollouts:
    """Numpy views (attributes named as in the layout) over one shared-memory segment.

    Use :meth:`create` in the learner process and :meth:`attach` in agents.
    """

    def __init__(self, shm: shared_memory.SharedMemory, layout: dict, owner: bool) -> None:
        self.shm = shm
        self.layout = layout
        self.owner = owner
        self.name = shm.name
        offsets, _ = _offsets(layout)
        self._names = list(layout)
        for name, (shape, dtype) in layout.items():
            # frombuffer keeps a buffer export on the mapping: unmapping fails (BufferError) while any
            # view is alive, instead of leaving dangling views (np.ndarray(buffer=...) does not).
            count = int(np.prod(shape, dtype=np.int64))
            arr = np.frombuffer(shm.buf, dtype=np.dtype(dtype), count=count, offset=offsets[name])
            setattr(self, name, arr.reshape(shape))

    @classmethod
    def create(cls, layout: dict) -> SharedRollouts:
        """Allocate and zero a new segment named ``ga3c_<pid>_<random>`` (in /dev/shm on Linux).

        Raises:
            MemoryError: the segment does not fit (e.g. a small /dev/shm in a container); the
                message gives the size asked for.
        """
        _, total = _offsets(layout)
        name = f"ga3c_{os.getpid()}_{secrets.token_hex(4)}"
        try:
            shm = shared_memory.SharedMemory(name=name, create=True, size=total)
        except OSError as err:
            raise MemoryError(f"cannot allocate {total / 2**20:.1f} MiB of shared memory for the GA3C "
                              f"rollouts ({err}); lower max_agents, envs_per_agent or t_max") from err
        out = cls(shm, layout, owner=True)
        try:
            np.frombuffer(shm.buf, dtype=np.uint8)[:] = 0  # touch every page now: SIGBUS here, not later
        except BaseException:
            out.close()
            raise
        return out

    @classmethod
    def attach(cls, name: str, layout: dict) -> SharedRollouts:
        """Map an existing segment without registering it with the resource tracker."""
        register = resource_tracker.register
        resource_tracker.register = lambda n, rtype: None if rtype == "shared_memory" else register(n, rtype)
        try:
            shm = shared_memory.SharedMemory(name=name, create=False)
        finally:
            resource_tracker.register = register
        return cls(shm, layout, owner=False)

    def close(self) -> None:
        """Drop the views, unmap, and (creator only) unlink the segment. Idempotent.

        Torch tensors made with ``torch.from_numpy`` on the views should be released first; if some
        view is still alive the mapping is kept (never a dangling view) until the process exits, and
        the segment is unlinked all the same, so nothing outlives the process.
        """
        for name in self._names:
            self.__dict__.pop(name, None)
        try:
            self.shm.close()
        except BufferError:  # views still alive somewhere (e.g. a traceback): keep the mapping
            _STILL_MAPPED.append(self.shm)
        if self.owner:
            self.owner = False
            try:
                self.shm.unlink()
            except FileNotFoundError:
                pass
