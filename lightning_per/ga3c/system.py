"""The GA3C runtime of the learner process: shared buffers, agents, predictors, trainers.

Lifecycle: :meth:`GA3CSystem.start` allocates the shared rollout buffers, starts NP predictor
threads, NT trainer threads, NA agent processes (``spawn``, see :mod:`lightning_per.actors._agent_boot`), a supervisor
thread (replaces dead agents, prints the status line) and, if configured, the dynamic adjustment.
:meth:`GA3CSystem.close` (idempotent; also registered with ``atexit``) stops everything within
``timeout`` seconds: it raises the stop flag that agents poll every step and every 0.1 s of
waiting, joins threads, joins agents and terminates/kills those that did not exit in time (an agent
still starting up, i.e. importing, making or resetting its environments, does not poll the flag: it is
terminated at once rather than waited for), drops the named semaphores and unlinks the shared memory.

A stopping system never starts an agent. Agents share the learner's process group, so a SIGTERM to
the group (``kill -TERM -PGID``, a job scheduler, a container runtime) kills them at the moment the
learner itself is told to stop. :meth:`GA3CSystem.start`, in the main thread, therefore chains a SIGTERM
handler in front of the one installed (which still runs: the CLI's raises ``KeyboardInterrupt``): it
only records the signal, and the supervisor turns that into a stop before it looks at any agent. An
agent that died of a stop signal (SIGTERM, SIGINT, SIGHUP, SIGQUIT) is replaced only after it has
stayed dead for ``_STOP_SIGNAL_GRACE_S`` without the system stopping, which covers the moment between
the signal and the learner's handler; any other death (a crash, SIGKILL) is replaced at once.

Liveness is watched by progress, not only by ``is_alive()``: an agent counts a ``heartbeat`` in shared memory
at every step and every 0.1 s it waits (:mod:`lightning_per.actors.agent`). At each pass (every ``_SUPERVISE_S``)
the supervisor adds the time since its previous pass, at most ``_MAX_PASS_S``, to the silence of each started agent
whose heartbeat has not changed; one silent for ``agent_stall_timeout_s`` (SIGSTOPped, hung in its environment) is
reported in one line naming it and its pid, killed (SIGKILL ends a stopped process too) and then handled as
a dead agent: replaced, or reaped if it was retiring, and counted with the deaths. The cap per pass keeps
time the supervisor did not watch (the whole process group stopped with Ctrl-Z, a starved learner) from
counting as silence.

Agent indices have *incarnations*: a replaced agent gets the same rows of the shared buffers
(flags cleared), a new incarnation number and fresh semaphores; work claimed from the previous
incarnation is answered on the old semaphores or dropped, so a dead agent cannot wake or corrupt its
successor. Agents hold no lock shared with anyone (see :mod:`lightning_per.actors.shared`), so killing one at any
moment cannot stall the others.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np
import torch

from lightning_per.actors.adjust import Counts, DynamicAdjuster, Window
from lightning_per.actors.predictor import PredictorThread
from lightning_per.actors.shared import SharedRollouts, make_layout
from lightning_per.actors.sigterm import SigtermRecorder
from lightning_per.actors.spawn import AgentHandle, agent_process, start_process
from lightning_per.actors.stats import Stats, rates
from lightning_per.ga3c.config import GA3CConfig
from lightning_per.ga3c.workers import TrainerThread

__all__ = ["GA3CSystem"]

_Agent = AgentHandle  # the name benchmarks/ga3c_learner.py builds stand-in agents with

log = logging.getLogger("lightning_per.ga3c")
_GET_POLL_S = 0.1  # longest single wait of get_batch on the batch queue (how fast it notices a stop)
_SUPERVISE_S = 0.2  # supervisor period: how fast a dead agent is noticed
_MAX_PASS_S = 1.0  # most seconds of silence one supervisor pass counts (see "Liveness" above)
_KILL_JOIN_S = 1.0  # wait for a stalled agent killed by the supervisor to exit (else seen dead at a later pass)
_STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})
_STOP_SIGNAL_GRACE_S = 1.0  # an agent killed by a stop signal stays dead this long before it is replaced


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
        self.replaced = 0
        self._lock = threading.RLock()
        self._agents: list[AgentHandle | None] = [None] * cfg.max_agents
        self._incarnations = 0
        self._predictors: list[PredictorThread] = []
        self._trainers: list[TrainerThread] = []
        self._deaths: deque[float] = deque()
        self._claim_requests_lock = threading.Lock()
        self._claim_rollouts_lock = threading.Lock()
        self.adjuster: DynamicAdjuster | None = None
        self.shared: SharedRollouts | None = None
        self._supervisor: threading.Thread | None = None
        self.pred_sem = self.train_sem = None
        self._closed = False
        self.stop_signal: int | None = None  # the signal that stopped the run (SIGTERM), if one did
        self._sigterm = SigtermRecorder(self._record_signal, lambda: not self._closed)

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
            agent = self._agents[i]
            if agent is not None:
                agents.append(agent)
                rows.append(self.row(i, slot, t))
        return torch.tensor(rows, dtype=torch.int64), agents

    def claim_rollouts(self, limit: int) -> list[tuple[int, AgentHandle, int]]:
        """Take up to ``limit`` finished rollouts: ``[(agent index, agent handle, slot)]``."""
        sh = self.shared
        with self._claim_rollouts_lock:
            ii, ss = np.nonzero(sh.ready.copy())  # copy: agents write concurrently
            ii, ss = ii[:limit], ss[:limit]
            sh.ready[ii, ss] = 0
        pairs = zip(ii.tolist(), ss.tolist())
        return [(i, self._agents[i], s) for i, s in pairs if self._agents[i] is not None]

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
        if self._agents[index] is not agent:  # replaced meanwhile: the copy may be torn
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
    def _stop_requested(self) -> bool:
        return self.stopping.is_set() or self.stop_signal is not None

    def _spawn_agent(self, index: int) -> bool:
        """Start an agent at ``index`` (its rows cleared); False, starting nothing, once stopping."""
        if self._stop_requested():
            return False
        c = self.cfg
        self._incarnations += 1
        inc = self._incarnations
        sh = self.shared
        sh.pending[index] = 0
        sh.started[index] = 0
        sh.ready[index] = 0
        sh.busy[index] = 0
        sh.flags[index] = 0
        resp, free = self.ctx.Semaphore(0), self.ctx.Semaphore(c.rollout_slots)
        kwargs = dict(index=index, env_spec=self.env_spec, layout=sh.layout, shm_name=sh.name,
                      pred_sem=self.pred_sem, train_sem=self.train_sem, response_sem=resp, free_sem=free,
                      gamma=c.gamma, reward_clip=c.reward_clip, parent_pid=os.getpid(),
                      seed=c.seed + 10_007 * inc)
        proc = agent_process(self.ctx, index, kwargs)
        self._agents[index] = AgentHandle(inc, proc, resp, free)
        start_process(proc)
        return True

    def _active_agents(self) -> list[int]:
        return [i for i, a in enumerate(self._agents) if a is not None and not a.retiring]

    def _set_agents(self, n: int) -> None:
        active = self._active_agents()
        for index in range(self.cfg.max_agents):
            if len(active) >= n:
                break
            if self._agents[index] is None:
                if not self._spawn_agent(index):
                    break
                active.append(index)
        for index in sorted(active, reverse=True)[: max(0, len(active) - n)]:
            self._agents[index].retiring = True
            self.shared.flags[index] = 1

    def _supervise(self) -> None:
        """Reap retired agents, kill stalled ones, replace dead ones, print the status line; stop on a recorded
        signal."""
        last_status, snap = time.monotonic(), self.stats.snapshot()
        last_pass = time.monotonic()
        while not self.stopping.wait(_SUPERVISE_S):
            with self._lock:
                if self._stop_on_signal():
                    return
                now = time.monotonic()
                watched, last_pass = min(now - last_pass, _MAX_PASS_S), now
                for index, agent in enumerate(self._agents):
                    if agent is None or (agent.process.is_alive() and not self._stalled(index, agent, watched)):
                        continue
                    agent.process.join(0)
                    if agent.process.exitcode is None:
                        continue  # killed as stalled but not gone yet: seen dead at a later pass
                    if agent.retiring:
                        self._agents[index] = None
                        continue
                    if agent.dead_since is None:
                        agent.dead_since = now
                    code = agent.process.exitcode
                    if not agent.stalled and code < 0 and -code in _STOP_SIGNALS and \
                            now - agent.dead_since < _STOP_SIGNAL_GRACE_S:
                        continue  # killed by a stop signal: the learner may be getting it too
                    # a stalled agent was reported when it was killed: one line for it
                    report = None if agent.stalled else f"died (exit code {code})"
                    if self._stop_on_signal() or not self._replace(index, code, report):
                        return
            every = self.cfg.status_interval_s
            if every > 0 and time.monotonic() - last_status >= every:
                new = self.stats.snapshot()
                log.info(self.status_line(snap, new))
                last_status, snap = time.monotonic(), new

    def _stop_on_signal(self) -> bool:
        """Turn a signal recorded by the handler into a stop (here, not in the handler: setting an Event
        takes a lock the interrupted main thread may hold). True if the system is stopping."""
        if self.stop_signal is not None and not self.stopping.is_set():
            log.info("GA3C system: %s received; stopping (no agent is replaced)",
                     signal.Signals(self.stop_signal).name)
            self.stopping.set()
            if self.shared is not None:
                self.shared.flags[-1] = 1  # every agent leaves its loop
        return self.stopping.is_set()

    def _stalled(self, index: int, agent: AgentHandle, watched: float) -> bool:
        """Add ``watched`` seconds to the silence of a started agent whose heartbeat has not moved since the last
        pass; once it reaches ``agent_stall_timeout_s``, report the agent (one line), kill it and wait up to
        ``_KILL_JOIN_S`` for it to exit. True for an agent killed as stalled (now or at an earlier pass)."""
        if agent.stalled:
            return True
        if not self.shared.started[index]:  # still starting: it beats from its first step on
            return False
        beat = int(self.shared.heartbeat[index])
        if beat != agent.beat:
            agent.beat, agent.silent_s = beat, 0.0
            return False
        agent.silent_s += watched
        timeout = self.cfg.agent_stall_timeout_s
        if agent.silent_s < timeout:
            return False
        agent.stalled = True
        log.warning("GA3C agent %d (pid %s) made no progress for %.1f s (agent_stall_timeout_s=%g: stopped or hung); "
                    "killing it and %s", index, agent.process.pid, agent.silent_s, timeout,
                    "dropping it (it was retiring)" if agent.retiring else "starting a replacement")
        agent.process.kill()  # SIGKILL: delivered to a stopped process too
        agent.process.join(_KILL_JOIN_S)
        return True

    def _replace(self, index: int, exitcode: int | None, report: str | None) -> bool:
        """Start a new incarnation at ``index`` (logging ``"GA3C agent <index> (pid <pid>) <report>; starting a
        replacement"`` unless ``report`` is None); False (nothing started) when stopping or failed."""
        if self._stop_requested():
            return False
        now = time.monotonic()
        self._deaths.append(now)
        while self._deaths and now - self._deaths[0] > 30.0:
            self._deaths.popleft()
        if len(self._deaths) > max(10, 2 * self.cfg.max_agents):
            self.fail(RuntimeError(f"{len(self._deaths)} GA3C agents died or stalled within 30 s (last exit code "
                                   f"{exitcode}); check the environment ({self.env_spec['env']!r})"))
            return False
        if report is not None:
            log.warning("GA3C agent %d (pid %s) %s; starting a replacement", index, self._agents[index].process.pid,
                        report)
        if not self._spawn_agent(index):
            return False
        self.replaced += 1  # after the new handle is in place: a reader seeing the count sees the handle
        return True

    # ---- signals (see :mod:`lightning_per.actors.sigterm`) ----------------------------------------------------------
    def _record_signal(self, signum: int) -> None:
        self.stop_signal = signum

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
            return Counts(len(self._active_agents()), len(self._predictors), len(self._trainers))

    def set_counts(self, counts: Counts) -> None:
        """Start or stop agents/threads to reach ``counts`` (bounded by the configured maxima)."""
        with self._lock:
            if self._stop_requested():
                return
            self._set_threads(self._predictors, counts.predictors, PredictorThread, "predictor")
            self._set_threads(self._trainers, counts.trainers, TrainerThread, "trainer")
            self._set_agents(counts.agents)

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
        self.pred_sem, self.train_sem = self.ctx.Semaphore(0), self.ctx.Semaphore(0)
        self.batch_q: queue.Queue = queue.Queue(maxsize=c.batch_queue_size)
        atexit.register(self.close)
        self._sigterm.install()
        self.set_counts(Counts(c.agents, c.predictors, c.trainers))
        self._supervisor = threading.Thread(target=self._supervise, name="ga3c-supervisor", daemon=True)
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
        deadline = t0 + timeout
        if self.shared is not None:
            self.shared.flags[-1] = 1
        if self.adjuster is not None:
            self.adjuster.stop(timeout=0.5)
        for th in [self._supervisor, *self._predictors, *self._trainers]:
            if th is not None:
                th.join(max(0.0, min(0.5, deadline - time.monotonic() - 1.5)))
        live = [(i, a.process) for i, a in enumerate(self._agents) if a is not None and a.process.pid is not None]
        procs = [p for _, p in live]
        # an agent still starting (importing, making and resetting its envs) sees the stop flag only once it
        # runs its loop: on a loaded machine that can be many seconds away
        booting = [p for i, p in live if self.shared is not None and not self.shared.started[i]]
        for p in booting:
            p.terminate()
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic() - 1.0))
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(max(0.0, min(0.3, deadline - time.monotonic() - 0.5)))
            if p.is_alive():
                p.kill()
                p.join(0.2)
        self.pred_sem = self.train_sem = None  # drop the last references: named semaphores unlink now
        self._agents = [None] * self.cfg.max_agents
        for name in ("obs_rows", "action_rows", "value_rows", "log_prob_rows", "version_rows", "_returns",
                     "_rewards", "_terminated", "_truncated", "_next_obs"):
            self.__dict__.pop(name, None)
        if self.shared is not None:
            self.shared.close()
        atexit.unregister(self.close)
        self._sigterm.restore()
        killed = sum(p.exitcode is not None and p.exitcode < 0 for p in procs)
        log.info("GA3C system stopped in %.2f s (%d agent processes, %d terminated, %d of them while starting)",
                 time.monotonic() - t0, len(procs), killed, len(booting))

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
