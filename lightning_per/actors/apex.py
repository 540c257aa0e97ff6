"""Ape-X acting (Horgan et al. 2018, arXiv:1803.00933) on the shared actor system: torch-free agent processes
step their environments epsilon-greedily on a per-actor ladder, predictor threads compute Q(s) for all of them in
batches on the learner's device, and an ingest thread hands finished n-step transitions to the learner.

Data path of one transition: agent i (:mod:`lightning_per.actors.agent` holding a
:class:`~lightning_per.actors.writers.TransitionWriter`) asks for Q(s) (shared ``obs[i]`` + ``pending[i]`` + a
semaphore) -> a :class:`~lightning_per.actors.predictor.PredictorThread` writes argmax_a Q and max_a Q -> the agent
acts epsilon-greedily, pushes the step into its :class:`~lightning_per.actors.nstep.NStepWindow` and writes the
transition that completes into its slot -> a full slot is published (``ready`` set last) -> the ingest thread
copies it out (once; a slot of an agent replaced meanwhile is dropped and counted, never delivered torn), frees the
slot and calls ``sink(batch)``. The learner's ``sink`` (the DQN: extend its replay) may block to throttle the
actors: agents then wait for free slots, as writers through a handle with ``backpressure="block"`` do.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from lightning_per.actors.envs import ENV_BACKENDS
from lightning_per.actors.ladder import annealed_epsilon, epsilon_ladder
from lightning_per.actors.predictor import PredictorThread
from lightning_per.actors.shared import SharedRollouts, make_transition_layout
from lightning_per.actors.spawn import AgentHandle
from lightning_per.actors.stats import Stats
from lightning_per.actors.supervisor import AgentPool
from lightning_per.actors.threads import WorkerThread

__all__ = ["ApexActors", "ApexConfig", "TRANSITION_KEYS"]

log = logging.getLogger(__name__)
_POLL_S = 0.05

#: keys of a batch handed to ``sink``: observation, action, n-step reward, discount, next_observation, version
TRANSITION_KEYS = ("observation", "action", "reward", "discount", "next_observation", "version")


@dataclass
class ApexConfig:
    """How many actors, how they explore and how their transitions are cut into slots."""

    agents: int = 4
    """Agent processes N (each steps ``envs_per_agent`` environments)."""
    envs_per_agent: int = 1
    """Environments E stepped in lockstep by one agent."""
    predictors: int = 1
    """Predictor threads (batched Q(s) on the learner's device)."""
    predict_batch_size: int = 64
    """Most agent requests one predictor answers in one forward pass."""
    epsilon: float = 0.4
    """Ape-X's base exploration rate: agent i uses epsilon ** (1 + epsilon_alpha * i / (N - 1))."""
    epsilon_alpha: float = 7.0
    """Ape-X's ladder exponent (the paper's alpha)."""
    epsilon_start: float | None = None
    """Base epsilon at learner update 0, annealed linearly to ``epsilon`` over ``epsilon_anneal_updates`` updates;
    agent i's rung is the ladder of each base, and it moves linearly between them
    (:func:`~lightning_per.actors.ladder.annealed_epsilon`). None: Ape-X's fixed ladder."""
    epsilon_anneal_updates: int = 0
    """Learner updates over which the ladder goes from ``epsilon_start``'s to ``epsilon``'s (>= 1 with
    ``epsilon_start``)."""
    slot_steps: int = 16
    """Vector steps T of transitions per published slot (the ingest granularity: T * E transitions)."""
    slots: int = 4
    """Slots per agent: how far an agent may run ahead of the ingest before it blocks."""
    agent_stall_timeout_s: float = 60.0
    """Seconds without a heartbeat before an agent is killed and replaced."""

    def validate(self) -> ApexConfig:
        """Returns self. Raises: ValueError naming the field and what was expected."""
        for name in ("agents", "envs_per_agent", "predictors", "predict_batch_size", "slot_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"actors.{name} must be an int >= 1, got {value!r}")
        if isinstance(self.slots, bool) or not isinstance(self.slots, int) or self.slots < 2:
            raise ValueError(f"actors.slots must be an int >= 2 (one filling, one waiting), got {self.slots!r}")
        if not 0.0 <= self.epsilon <= 1.0:
            raise ValueError(f"actors.epsilon must be in [0, 1], got {self.epsilon!r}")
        if not self.epsilon_alpha >= 0.0:
            raise ValueError(f"actors.epsilon_alpha must be >= 0, got {self.epsilon_alpha!r}")
        if self.epsilon_start is not None and not 0.0 <= self.epsilon_start <= 1.0:
            raise ValueError(f"actors.epsilon_start must be None or in [0, 1], got {self.epsilon_start!r}")
        n = self.epsilon_anneal_updates
        if isinstance(n, bool) or not isinstance(n, int) or n < (0 if self.epsilon_start is None else 1):
            raise ValueError(f"actors.epsilon_anneal_updates must be an int >= "
                             f"{0 if self.epsilon_start is None else 1} (with epsilon_start={self.epsilon_start!r}), "
                             f"got {n!r}")
        if not self.agent_stall_timeout_s > 0.0:
            raise ValueError(f"actors.agent_stall_timeout_s must be > 0, got {self.agent_stall_timeout_s!r}")
        return self

    def epsilons(self) -> list[float]:
        """Each agent's epsilon once annealed (:func:`~lightning_per.actors.ladder.epsilon_ladder` of ``epsilon``)."""
        return epsilon_ladder(self.agents, self.epsilon, self.epsilon_alpha)

    def start_epsilons(self) -> list[float]:
        """Each agent's epsilon at learner update 0: the ladder of ``epsilon_start`` (of ``epsilon`` when None)."""
        base = self.epsilon if self.epsilon_start is None else self.epsilon_start
        return epsilon_ladder(self.agents, base, self.epsilon_alpha)

    def epsilons_at(self, updates: int) -> list[float]:
        """Each agent's epsilon after ``updates`` learner updates: its rung annealed from :meth:`start_epsilons` to
        :meth:`epsilons` (:func:`~lightning_per.actors.ladder.annealed_epsilon`, the rule the agents act by)."""
        return [annealed_epsilon(start, end, updates, self.epsilon_anneal_updates)
                for start, end in zip(self.start_epsilons(), self.epsilons())]


class ApexActors:
    """Ape-X's actor side around one Q-network (see the module docstring).

    Args:
        cfg: the actors' configuration.
        env_spec: environment spec (:func:`~lightning_per.actors.envs.make_env_group`); every group keeps the true
            final observation, which n-step transitions bootstrap from.
        obs_shape: one observation's shape; obs_dtype: ``"uint8"`` or ``"float32"``.
        n_step: horizon n >= 1; gamma: discount in [0, 1] (the learner's).
        policy: ``policy(obs) -> (greedy_action, max_q)``: obs (N, *obs_shape) on ``device``; returns (N,) int64
            argmax_a Q(s, a) and (N,) float max_a Q(s, a) on ``device``; called from predictor threads under
            ``torch.no_grad``.
        version_fn: the learner's update count of the weights ``policy`` uses now (host int).
        device: the learner's device.
        sink: ``sink(batch)`` takes a dict of host tensors, ``TRANSITION_KEYS``, (T*E,) rows of one slot:
            ``observation``/``next_observation`` (T*E, *obs), ``action`` and ``version`` int64, ``reward`` and
            ``discount`` float32; called from the ingest thread (slots of one agent may come out of order); it may
            block.
        seed: base seed (agent i of incarnation k seeds its envs with ``seed + 10_007 * k``).

    Raises:
        ValueError: an invalid ``cfg``, an env backend outside ``ENV_BACKENDS``, ``n_step`` < 1.
    """

    def __init__(self, cfg: ApexConfig, env_spec: dict, obs_shape: tuple[int, ...], obs_dtype: str, n_step: int,
                 gamma: float, policy: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
                 version_fn: Callable[[], int], device: torch.device | str,
                 sink: Callable[[dict[str, torch.Tensor]], None], seed: int = 0) -> None:
        self.cfg = dataclasses.replace(cfg).validate()
        if env_spec.get("backend") not in ENV_BACKENDS:
            raise ValueError(f"env_spec['backend'] must be one of {list(ENV_BACKENDS)}, "
                             f"got {env_spec.get('backend')!r}")
        if n_step < 1:
            raise ValueError(f"n_step must be >= 1, got {n_step}")
        self.env_spec = dict(env_spec, num_envs=cfg.envs_per_agent)
        self.obs_shape, self.obs_dtype = tuple(obs_shape), str(np.dtype(obs_dtype))
        self.n_step, self.gamma, self.seed = n_step, gamma, seed
        self.policy, self.version_fn, self.device, self.sink = policy, version_fn, torch.device(device), sink
        self.predict_batch_size = cfg.predict_batch_size  # what a PredictorThread claims at most
        self.records_log_prob = False  # Q-learning needs no log mu(a|s)
        self.epsilons, self.start_epsilons = self.cfg.epsilons(), self.cfg.start_epsilons()
        self.stats = Stats()
        self.ctx = mp.get_context("spawn")
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.ingested = 0  # transitions handed to the sink
        #: (agents, 2) float64 host: each agent's finished episodes, [sum of returns, count] (ingest thread writes)
        self.agent_returns = np.zeros((cfg.agents, 2))
        self.dropped = 0  # transitions of slots whose agent was replaced before they were copied out
        self._lock = threading.RLock()
        self._claim_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self.shared: SharedRollouts | None = None
        self.pool: AgentPool | None = None
        self.pred_sem = self.ready_sem = None

    # ---- what PredictorThread reads -----------------------------------------------------------
    def claim_requests(self, limit: int) -> tuple[torch.Tensor, list[AgentHandle]]:
        """Take up to ``limit`` pending requests: (B,) int64 agent indices (the rows of ``obs_rows``) and the
        handles to answer (B may be 0); requests of vacated indices are dropped."""
        sh = self.shared
        with self._claim_lock:
            idx = np.flatnonzero(sh.pending.copy())[:limit]  # copy: agents write concurrently
            sh.pending[idx] = 0
        agents, rows = [], []
        for i in idx.tolist():
            agent = self.pool.agents[i]
            if agent is not None:
                agents.append(agent)
                rows.append(i)
        return torch.tensor(rows, dtype=torch.int64), agents

    # ---- the ingest thread -----------------------------------------------------------------------
    def take_slot(self) -> dict[str, torch.Tensor] | None:
        """Copy one ready slot out (a dict of ``TRANSITION_KEYS``, (T*E,) rows) and free it; None when no slot is
        ready, or when its agent was replaced meanwhile (the copy may be torn: dropped and counted)."""
        sh = self.shared
        with self._claim_lock:
            ii, ss = np.nonzero(sh.ready.copy())
            if ii.size == 0:
                return None
            index, slot = int(ii[0]), int(ss[0])
            sh.ready[index, slot] = 0
        agent = self.pool.agents[index]
        if agent is None:
            return None
        e = self.cfg.envs_per_agent
        src = {"observation": sh.t_obs, "action": sh.t_action, "reward": sh.t_reward, "discount": sh.t_discount,
               "next_observation": sh.t_next_obs}
        batch = {key: torch.from_numpy(arr[index, slot].reshape(-1, *arr.shape[4:]).copy())
                 for key, arr in src.items()}  # [T*E, ...]
        batch["version"] = torch.from_numpy(np.repeat(sh.t_version[index, slot], e))  # [T*E]
        n_ep = int(sh.ep_count[index, slot])
        episodes = list(zip(sh.ep_return[index, slot, :n_ep].tolist(), sh.ep_length[index, slot, :n_ep].tolist()))
        rows = batch["action"].shape[0]
        if self.pool.agents[index] is not agent:  # replaced meanwhile: the copy may be torn
            self.dropped += rows
            return None
        sh.busy[index, slot] = 0
        agent.free_sem.release()
        self.stats.add_rollout(rows, episodes)
        self.agent_returns[index] += (sum(ret for ret, _ in episodes), n_ep)
        return batch

    # ---- lifecycle -------------------------------------------------------------------------------
    def _kwargs_for(self, index: int, incarnation: int, response_sem, free_sem) -> dict:
        return dict(index=index, env_spec=self.env_spec, layout=self.shared.layout, shm_name=self.shared.name,
                    pred_sem=self.pred_sem, ready_sem=self.ready_sem, response_sem=response_sem, free_sem=free_sem,
                    parent_pid=os.getpid(), seed=self.seed + 10_007 * incarnation,
                    writer={"kind": "transitions", "n_step": self.n_step, "gamma": self.gamma,
                            "epsilon": self.epsilons[index], "epsilon_start": self.start_epsilons[index],
                            "anneal_updates": self.cfg.epsilon_anneal_updates})

    def fail(self, error: BaseException) -> None:
        """Record a fatal error and stop (the learner reads ``error``)."""
        if self.error is None:
            self.error = error
        self.stopping.set()

    def start(self) -> ApexActors:
        """Allocate the shared buffers, start predictors, the ingest thread, the supervisor and the agents."""
        c = self.cfg
        layout = make_transition_layout(c.agents, c.slots, c.slot_steps, c.envs_per_agent, self.obs_shape,
                                        self.obs_dtype, self.n_step)
        self.shared = sh = SharedRollouts.create(layout)
        self.obs_rows = torch.from_numpy(sh.obs)  # [A, E, *obs] host, shared
        self.action_rows = torch.from_numpy(sh.actions)  # [A, E] int64
        self.value_rows = torch.from_numpy(sh.values)  # [A, E] float32
        self.version_rows = torch.from_numpy(sh.versions)  # [A] int64
        self.pred_sem, self.ready_sem = self.ctx.Semaphore(0), self.ctx.Semaphore(0)
        self.pool = AgentPool(self.ctx, sh, self._kwargs_for, c.slots, c.agent_stall_timeout_s, "Ape-X",
                              self.env_spec["env"], log, self.fail, self.stopping)
        atexit.register(self.close)
        self.pool.install_sigterm()
        self._threads = [PredictorThread(self, name=f"apex-predictor-{k}") for k in range(c.predictors)]
        self._threads.append(_IngestThread(self, name="apex-ingest"))
        self._threads.append(threading.Thread(target=self.pool.watch, args=(self._lock,), name="apex-supervisor",
                                              daemon=True))
        for th in self._threads:
            th.start()
        with self._lock:
            self.pool.set_count(c.agents)
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop agents and threads within ``timeout`` seconds and free the shared memory. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.stopping.set()
        t0 = time.monotonic()
        procs, booting = self.pool.close(t0 + timeout, self._threads) if self.pool is not None else ([], 0)
        self.pred_sem = self.ready_sem = None
        for name in ("obs_rows", "action_rows", "value_rows", "version_rows"):
            self.__dict__.pop(name, None)
        if self.shared is not None:
            self.shared.close()
        atexit.unregister(self.close)
        log.info("Ape-X actors stopped in %.2f s (%d agent processes, %d of them while starting)",
                 time.monotonic() - t0, len(procs), booting)

    def __enter__(self) -> ApexActors:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


class _IngestThread(WorkerThread):
    """Copies ready slots out of shared memory and hands them to the learner's ``sink``."""

    def loop(self) -> None:
        sys_ = self.system
        while not self.stopped():
            sys_.ready_sem.acquire(timeout=_POLL_S)  # a wake-up call; we rescan on timeout anyway
            while not self.stopped():
                batch = sys_.take_slot()
                if batch is None:
                    break
                sys_.sink(batch)
                sys_.ingested += batch["action"].shape[0]
