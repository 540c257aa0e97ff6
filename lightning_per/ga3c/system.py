"""The GA3C runtime of the learner process: shared buffers, agents, predictors, trainers.

Lifecycle: :meth:`GA3CSystem.start` allocates the shared rollout buffers, starts NP predictor
threads, NT trainer threads, NA agent processes (``spawn``, see :mod:`lightning_per.actors._agent_boot`) in an
:class:`~lightning_per.actors.supervisor.AgentPool`, the pool's supervisor thread (replaces dead agents, kills
stalled ones, stops on SIGTERM; it prints the status line after each pass) and, if configured, the dynamic
adjustment. :meth:`GA3CSystem.close` (idempotent; also registered with ``atexit``) stops everything within
``timeout`` seconds: it raises the stop flag that agents poll every step and every 0.1 s of
waiting, joins threads, joins agents and terminates/kills those that did not exit in time (an agent
still starting up, i.e. importing, making or resetting its environments, does not poll the flag: it is
terminated at once rather than waited for), drops the named semaphores and unlinks the shared memory.

Supervision, incarnations, heartbeats, the stop-signal grace and the SIGTERM recorder are the actor package's
(:mod:`lightning_per.actors.supervisor`), shared with Ape-X: a stopping system never starts an agent, an agent
killed by a stop signal is replaced only after it stayed dead for 1 s without the system stopping, one whose
heartbeat stands still for ``agent_stall_timeout_s`` is reported, killed and replaced. A replaced agent keeps
its rows of the shared buffers under a new incarnation; work claimed from the previous incarnation is dropped
(the consumers compare handles). Agents hold no lock shared with anyone (see :mod:`lightning_per.actors.shared`),
so killing one at any moment cannot stall the others.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import os
import queue
import threading
import time
from collections.abc import Callable

import numpy as np
import torch

from lightning_per.actors.adjust import Counts, DynamicAdjuster, Window
from lightning_per.actors.predictor import PredictorThread
from lightning_per.actors.shared import SharedRollouts, make_layout
from lightning_per.actors.spawn import AgentHandle
from lightning_per.actors.stats import Stats, rates
from lightning_per.actors.supervisor import AgentPool
from lightning_per.ga3c.config import GA3CConfig
from lightning_per.ga3c.workers import TrainerThread

__all__ = ["GA3CSystem"]

log = logging.getLogger("lightning_per.ga3c")
_GET_POLL_S = 0.1  # longest single wait of get_batch on the batch queue (how fast it notices a stop)


class GA3CSystem:
    """Agents, predictors and trainers around one policy (see the module docstring).

    Args:
        cfg: validated configuration.
        env_spec: environment spec dict (:func:`~lightning_per.actors.envs.make_env_group`).
        obs_shape: one observation's shape; obs_dtype: ``uint8`` or ``float32``.
        policy: ``policy(obs) -> (action, value[, log_prob])``: obs (N, *obs_shape) on ``device``; action
            (N,) int64 sampled from pi, value (N,) float V(s), log_prob (N,) float log pi(action|s) (what
            V-trace's importance weights divide by: required with ``vtrace``, else unused), all on ``device``.
            Called from predictor threads under ``torch.no_grad``.
        version_fn: returns the current policy version (optimizer steps so far; host int).
        device: the model device.
        stats: counters to update (a new :class:`Stats` if None).
    """

    def __init__(self, cfg: GA3CConfig, env_spec: dict, obs_shape: tuple[int, ...], obs_dtype: str,
                 policy: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
                 version_fn: Callable[[], int], device: torch.device, stats: Stats | None = None) -> None:
        self.cfg = cfg.validate()
        self.env_spec = dict(env_spec, num_envs=cfg.envs_per_agent)
        self.obs_shape, self.obs_dtype = tuple(obs_shape), str(obs_dtype)
        self.policy, self.version_fn, self.device = policy, version_fn, torch.device(device)
        self.stats = stats or Stats()
        self.predict_batch_size = cfg.predict_batch_size  # what a predictor claims at most (PredictorThread)
        self.records_log_prob = cfg.vtrace  # predictors also write log mu(a|s) (V-trace)
        self.ctx = mp.get_context("spawn")
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self._lock = threading.RLock()
        self._predictors: list[PredictorThread] = []
        self._trainers: list[TrainerThread] = []
        self._claim_requests_lock = threading.Lock()
        self._claim_rollouts_lock = threading.Lock()
        self.adjuster: DynamicAdjuster | None = None
        self.shared: SharedRollouts | None = None
        self.pool: AgentPool | None = None  # the agent processes, by index (made at start)
        self._supervisor: threading.Thread | None = None
        self.pred_sem = self.ready_sem = None
        self._closed = False

    # ---- buffers: row arithmetic and the torch views predictors/trainers use -----------------
    def row(self, index: int, slot: int, t: int) -> int:
        """Flat row of (agent, slot, step) in the ``*_rows`` views."""
        return (index * self.cfg.rollout_slots + slot) * self.cfg.t_max + t

    def _map_buffers(self) -> None:
        c, e = self.cfg, self.cfg.envs_per_agent
        layout = make_layout(c.max_agents, c.rollout_slots, c.t_max, e, self.obs_shape, self.obs_dtype,
                             vtrace=c.vtrace)
        self.shared = SharedRollouts.create(layout)
        s = self.shared
        rows = c.max_agents * c.rollout_slots * c.t_max
        self.obs_rows = torch.from_numpy(s.obs).view(rows, e, *self.obs_shape)  # [R, E, *obs] host, shared
        self.action_rows = torch.from_numpy(s.actions).view(rows, e)  # [R, E] int64
        self.value_rows = torch.from_numpy(s.values).view(rows, e)  # [R, E] float32
        self.version_rows = torch.from_numpy(s.versions).view(rows)  # [R] int64
        self._returns = torch.from_numpy(s.returns)  # [A, S, T, E] float32
        if c.vtrace:  # what V-trace recomputes its targets from (take_rollout)
            self.log_prob_rows = torch.from_numpy(s.log_probs).view(rows, e)  # [R, E] float32, by predictors
            self._rewards = torch.from_numpy(s.rewards)  # [A, S, T, E] float32
            self._terminated = torch.from_numpy(s.terminated)  # [A, S, T, E] bool
            self._truncated = torch.from_numpy(s.truncated)  # [A, S, T, E] bool
            self._next_obs = torch.from_numpy(s.next_obs)  # [A, S, E, *obs]

    def _make_pool(self) -> None:
        """The agent pool over the shared buffers (no agent started yet)."""
        c = self.cfg
        self.pool = AgentPool(self.ctx, self.shared, self._agent_kwargs, c.rollout_slots,
                              c.agent_stall_timeout_s, "GA3C", self.env_spec["env"], log, self.fail, self.stopping)

    # ---- called by predictor / trainer threads ---------------------------------------------
    def claim_requests(self, limit: int) -> tuple[torch.Tensor, list[AgentHandle]]:
        """Take up to ``limit`` pending prediction requests.

        Returns ``(rows, agents)``: (B,) int64 flat rows (:meth:`row`) of the requested steps and the
        handles of the agents to answer (B may be 0). Requests of vacated indices are dropped.
        """
        sh = self.shared
        with self._claim_requests_lock:
            idx = np.flatnonzero(sh.pending.copy())[:limit]  # [B]; copy: agents write concurrently
            if idx.size == 0:
                return torch.empty(0, dtype=torch.int64), []
            sh.pending[idx] = 0
            slots, steps = sh.req_slot[idx], sh.req_t[idx]
        agents, rows = [], []
        for i, slot, t in zip(idx.tolist(), slots.tolist(), steps.tolist()):
            agent = self.pool.agents[i]
            if agent is not None:
                agents.append(agent)
                rows.append(self.row(i, slot, t))
        return torch.tensor(rows, dtype=torch.int64), agents

    def claim_rollouts(self, limit: int) -> list[tuple[int, AgentHandle, int]]:
        """Take up to ``limit`` finished rollouts, the oldest first (by the policy version of their first step):
        ``[(agent index, agent handle, slot)]``. In agent-index order, agents of high index would wait while the
        low ones refill: with 48 agents on 2 cores some rollouts were trained on 4,000 updates late."""
        sh = self.shared
        with self._claim_rollouts_lock:
            ii, ss = np.nonzero(sh.ready.copy())  # copy: agents write concurrently
            oldest = np.argsort(sh.versions[ii, ss, 0], kind="stable")[:limit]
            ii, ss = ii[oldest], ss[oldest]
            sh.ready[ii, ss] = 0
        pairs = zip(ii.tolist(), ss.tolist())
        agents = self.pool.agents
        return [(i, agents[i], s) for i, s in pairs if agents[i] is not None]

    def take_rollout(self, index: int, agent: AgentHandle, slot: int,
                     out: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor] | None:
        """Copy a claimed rollout out of shared memory and free its slot.

        Args:
            out: where to copy (the trainer's batch rows, so each observation is copied once): views
                ``{"obs": (T*E, *obs), "action": (T*E,) int64, "ret": (T*E,) float32, "version": (T*E,)
                int64}``, with ``vtrace`` also ``"log_prob"`` (T*E,) float32 (log mu of the acting policy),
                ``"reward"`` (T*E,) float32 (clipped), ``"terminated"``, ``"truncated"`` (T*E,) bool and
                ``"next_obs"`` (E, *obs) (s_T); None: new tensors.

        Returns ``out`` (or the new tensors) filled time-major, or None if the agent was replaced (then
        ``out`` may hold a torn copy: overwrite it).
        """
        c, sh = self.cfg, self.shared
        n_ep = int(sh.ep_count[index, slot])
        episodes = list(zip(sh.ep_return[index, slot, :n_ep].tolist(),
                            sh.ep_length[index, slot, :n_ep].tolist()))
        self.stats.add_rollout(c.t_max * c.envs_per_agent, episodes)
        r0 = self.row(index, slot, 0)
        obs = self.obs_rows[r0:r0 + c.t_max].flatten(0, 1)  # [T*E, *obs] shared
        action = self.action_rows[r0:r0 + c.t_max].flatten()  # [T*E]
        ret = self._returns[index, slot].flatten()  # [T*E]
        version = self.version_rows[r0:r0 + c.t_max, None].expand(c.t_max, c.envs_per_agent)  # [T, E]
        src = {"obs": obs, "action": action, "ret": ret}
        if c.vtrace:
            src.update(log_prob=self.log_prob_rows[r0:r0 + c.t_max].flatten(),
                       reward=self._rewards[index, slot].flatten(), terminated=self._terminated[index, slot].flatten(),
                       truncated=self._truncated[index, slot].flatten(), next_obs=self._next_obs[index, slot])
        if out is None:
            part = {key: value.clone() for key, value in src.items()}
            part["version"] = version.flatten()  # flatten of the expanded view copies
        else:
            part = out
            for key, value in src.items():
                part[key].copy_(value)
            part["version"].view(c.t_max, c.envs_per_agent).copy_(version)
        if self.pool.agents[index] is not agent:  # replaced meanwhile: the copy may be torn
            return None
        sh.busy[index, slot] = 0
        agent.free_sem.release()
        return part

    def get_batch(self, timeout: float | None = None) -> dict | None:
        """Next training batch (see :func:`~lightning_per.ga3c.workers._merge`).

        Returns None once stopping, or after ``timeout`` seconds (None: no limit) without a batch. It
        blocks on the queue in waits of at most 0.1 s (to notice a stop), the last one cut to end at
        ``timeout``: no busy-waiting, and the return comes within milliseconds of the timeout.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.stopping.is_set():
            wait = _GET_POLL_S if deadline is None else min(_GET_POLL_S, max(deadline - time.monotonic(), 0.0))
            try:
                return self.batch_q.get(timeout=wait)
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    return None
        return None

    def fail(self, error: BaseException) -> None:
        """Record a fatal error and stop the run (training sees ``get_batch() is None``)."""
        if self.error is None:
            self.error = error
        self.stopping.set()

    # ---- agents ------------------------------------------------------------------------------
    def _agent_kwargs(self, index: int, incarnation: int, response_sem, free_sem) -> dict:
        """Keyword arguments of agent ``index``'s incarnation (seeds its envs with ``seed + 10_007 * incarnation``)."""
        c, sh = self.cfg, self.shared
        return dict(index=index, env_spec=self.env_spec, layout=sh.layout, shm_name=sh.name, pred_sem=self.pred_sem,
                    ready_sem=self.ready_sem, response_sem=response_sem, free_sem=free_sem, parent_pid=os.getpid(),
                    seed=c.seed + 10_007 * incarnation,
                    writer={"kind": "rollouts", "gamma": c.gamma, "reward_clip": c.reward_clip})

    def _status_pass(self) -> None:
        """After a supervisor pass: log the status line every ``status_interval_s`` (0: never)."""
        every = self.cfg.status_interval_s
        if every > 0 and time.monotonic() - self._last_status >= every:
            new = self.stats.snapshot()
            log.info(self.status_line(self._status_snap, new))
            self._last_status, self._status_snap = time.monotonic(), new

    # ---- predictor / trainer threads ---------------------------------------------------------
    def _set_threads(self, threads: list, n: int, cls, prefix: str) -> None:
        while len(threads) < n:
            th = cls(self, name=f"ga3c-{prefix}-{len(threads)}")
            threads.append(th)
            th.start()
        while len(threads) > n:
            threads.pop().stop_event.set()

    # ---- counts (NA, NP, NT) ------------------------------------------------------------------
    def counts(self) -> Counts:
        with self._lock:
            agents = len(self.pool.active()) if self.pool is not None else 0  # None: start failed before agents
            return Counts(agents, len(self._predictors), len(self._trainers))

    def set_counts(self, counts: Counts) -> None:
        """Start or stop agents/threads to reach ``counts`` (bounded by the configured maxima)."""
        with self._lock:
            if self.pool.stop_requested():
                return
            self._set_threads(self._predictors, counts.predictors, PredictorThread, "predictor")
            self._set_threads(self._trainers, counts.trainers, TrainerThread, "trainer")
            self.pool.set_count(counts.agents)

    def _measure(self) -> Window | None:
        """One adjustment window: TPS and the p95 policy lag over ``adjust_window_s`` (None when stopping)."""
        a = self.stats.snapshot()
        if self.stopping.wait(self.cfg.adjust_window_s):
            return None
        r = rates(a, self.stats.snapshot())
        return Window(r["tps"], r["policy_lag_p95"])

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> GA3CSystem:
        """Allocate buffers and semaphores, start threads and agents. Returns self."""
        c = self.cfg
        self._map_buffers()
        self.pred_sem, self.ready_sem = self.ctx.Semaphore(0), self.ctx.Semaphore(0)
        self.batch_q: queue.Queue = queue.Queue(maxsize=c.batch_queue_size)
        self._make_pool()
        atexit.register(self.close)
        self.pool.install_sigterm()
        self.set_counts(Counts(c.agents, c.predictors, c.trainers))
        self._last_status, self._status_snap = time.monotonic(), self.stats.snapshot()
        self._supervisor = threading.Thread(target=self.pool.watch, args=(self._lock, self._status_pass),
                                            name="ga3c-supervisor", daemon=True)
        self._supervisor.start()
        if c.dynamic_adjustment:
            self.adjuster = DynamicAdjuster(
                self.counts, self.set_counts, self._measure,
                Counts(c.max_agents, c.max_predictors, c.max_trainers), warmup_s=c.adjust_warmup_s,
                wait=lambda s: not self.stopping.wait(s), seed=c.seed, max_lag_p95=c.adjust_max_lag_p95)
            self.adjuster.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop every agent and thread within ``timeout`` seconds and free the shared memory. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.stopping.set()
        t0 = time.monotonic()
        if self.adjuster is not None:
            self.adjuster.stop(timeout=0.5)
        threads = [self._supervisor, *self._predictors, *self._trainers]
        procs, booting = self.pool.close(t0 + timeout, threads) if self.pool is not None else ([], 0)
        self.pred_sem = self.ready_sem = None  # drop the last references: named semaphores unlink now
        for name in ("obs_rows", "action_rows", "value_rows", "log_prob_rows", "version_rows", "_returns",
                     "_rewards", "_terminated", "_truncated", "_next_obs"):
            self.__dict__.pop(name, None)
        if self.shared is not None:
            self.shared.close()
        atexit.unregister(self.close)
        killed = sum(p.exitcode is not None and p.exitcode < 0 for p in procs)
        log.info("GA3C system stopped in %.2f s (%d agent processes, %d terminated, %d of them while starting)",
                 time.monotonic() - t0, len(procs), killed, booting)

    def __enter__(self) -> GA3CSystem:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def status_line(self, a, b) -> str:
        """Console status (like the reference's): rates between snapshots, counts, lag and queue sizes."""
        r = rates(a, b, self.cfg.frame_skip)
        n = self.counts()
        q = self.queue_sizes()
        return (f"[Time {b.t - self.stats.t0:7.1f}s] [Episodes {b.episodes} mean{self.cfg.return_window} "
                f"{self.stats.mean_return(self.cfg.return_window):8.2f}] "
                f"[TPS {r['tps']:6.1f} PPS {r['pps']:8.1f} steps/s {r['steps_per_s']:8.1f}] "
                f"[NA {n.agents} NP {n.predictors} NT {n.trainers}] "
                f"[lag {r['policy_lag']:5.2f} p50 {r['policy_lag_p50']:.0f} p95 {r['policy_lag_p95']:.0f} "
                f"max {r['policy_lag_max']:.0f} dropped {r['lag_dropped_frac']:.1%}] "
                f"[queues P {q['pred_queue']} T {q['train_queue']} "
                f"B {q['batch_queue']}]")

    def queue_sizes(self) -> dict[str, int]:
        """Pending prediction requests, finished rollouts waiting for a trainer, assembled batches."""
        sh = self.shared
        if sh is None or self._closed:
            return {"pred_queue": 0, "train_queue": 0, "batch_queue": 0}
        return {"pred_queue": int(sh.pending.sum()), "train_queue": int(sh.ready.sum()),
                "batch_queue": self.batch_q.qsize()}
