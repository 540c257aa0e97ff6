"""Agent indices, their incarnations and their supervision: start, retire, replace the dead, kill the stalled, stop
on SIGTERM. Both learners' actor systems (GA3C's :class:`~lightning_per.ga3c.system.GA3CSystem`, Ape-X's
:class:`~lightning_per.actors.apex.ApexActors`) hold one :class:`AgentPool` and run :meth:`AgentPool.watch` in their
supervisor thread.

Liveness is watched by progress, not only by ``is_alive()``: an agent counts a ``heartbeat`` in shared memory at
every step and every 0.1 s it waits. At each pass the supervisor adds the time since its previous pass, at most
``max_pass_s``, to the silence of each started agent whose heartbeat has not changed; one silent for
``stall_timeout_s`` is reported in one line naming it and its pid, killed (SIGKILL ends a stopped process too)
and then handled as a dead agent. An agent that died of a stop signal (SIGTERM, SIGINT, SIGHUP, SIGQUIT) is
replaced only after it has stayed dead for ``stop_signal_grace_s`` without the system stopping; any other death
(a crash, SIGKILL) is replaced at once. More than ``max(10, 2 * max_agents)`` deaths within 30 s fail the run.

Signals: agents share the learner's process group, so a SIGTERM to the group kills them at the moment the learner
itself is told to stop. :meth:`AgentPool.install_sigterm` (main thread) chains a handler in front of the installed
one (:class:`~lightning_per.actors.sigterm.SigtermRecorder`) that only records the signal; the supervisor turns the
record into a stop (``stopping`` set, the all-stop flag raised) before it looks at any agent, and a stopping pool
starts no agent.

Agent indices have *incarnations*: a replaced agent gets the same rows of the shared buffers (flags cleared), a
new incarnation number and fresh semaphores; work claimed from the previous incarnation is answered on the old
semaphores or dropped (its consumers compare handles), so a dead agent cannot wake or corrupt its successor.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from lightning_per.actors.shared import SharedRollouts
from lightning_per.actors.sigterm import SigtermRecorder
from lightning_per.actors.spawn import AgentHandle, agent_process, start_process

__all__ = ["AgentPool"]

_SUPERVISE_S = 0.2  # supervisor period: how fast a dead agent is noticed
_MAX_PASS_S = 1.0  # most seconds of silence one supervisor pass counts (see "Liveness" above)
_KILL_JOIN_S = 1.0  # wait for a stalled agent killed by the supervisor to exit (else seen dead at a later pass)
_STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})


class AgentPool:
    """The agent processes of one system, by index (see the module docstring).

    Args:
        ctx: a ``spawn`` multiprocessing context.
        shared: the shared buffers (rows ``pending``, ``started``, ``ready``, ``busy``, ``heartbeat``, ``flags``).
        kwargs_for: ``(index, incarnation, response_sem, free_sem) -> kwargs`` of
            :func:`~lightning_per.actors.agent.agent_main` (its ``writer`` says what the agent writes).
        slots: slots per agent (the free-slot semaphore's initial count).
        stall_timeout_s: seconds without a heartbeat before an agent is killed as stalled (> 0).
        label: how log lines and process names call the agents (``"GA3C"``, ``"Ape-X"``); env_id: named when agents
            keep dying.
        log: the logger of the pool's lines (the learner's: its CLI shows them).
        fail: ``fail(error)`` records a fatal error and stops the run.
        stopping: the system's stop event (set by the system, by :meth:`watch` on a recorded SIGTERM, by ``fail``).
        stop_signal_grace_s: seconds an agent killed by a stop signal stays dead before it is replaced.

    Example::

        pool = AgentPool(ctx, shared, kwargs_for, 2, 30.0, "GA3C", "CartPole-v1", log, fail, stopping)
        pool.install_sigterm()          # main thread
        pool.set_count(4)               # 4 agents
        threading.Thread(target=pool.watch, args=(lock,), daemon=True).start()
        ...
        pool.close(time.monotonic() + 5.0)
    """

    def __init__(self, ctx: Any, shared: SharedRollouts, kwargs_for: Callable[[int, int, Any, Any], dict],
                 slots: int, stall_timeout_s: float, label: str, env_id: str, log: logging.Logger,
                 fail: Callable[[BaseException], None], stopping: threading.Event,
                 stop_signal_grace_s: float = 1.0) -> None:
        self.ctx, self.shared, self.kwargs_for = ctx, shared, kwargs_for
        self.slots, self.stall_timeout_s, self.label, self.env_id = slots, stall_timeout_s, label, env_id
        self.log, self.fail, self.stopping, self.stop_signal_grace_s = log, fail, stopping, stop_signal_grace_s
        self.max_agents = int(shared.flags.shape[0]) - 1
        self.agents: list[AgentHandle | None] = [None] * self.max_agents
        self.replaced = 0
        self.stop_signal: int | None = None  # the signal that stopped the run (SIGTERM), if one did
        self._incarnations = 0
        self._deaths: deque[float] = deque()
        self._closed = False
        self._sigterm = SigtermRecorder(self._record_signal, lambda: not self._closed)

    def __repr__(self) -> str:
        return (f"AgentPool(label={self.label!r}, active={len(self.active())}, max_agents={self.max_agents}, "
                f"replaced={self.replaced}, stall_timeout_s={self.stall_timeout_s})")

    # ---- stop requests ---------------------------------------------------------------------------------------------
    def install_sigterm(self) -> None:
        """Chain the SIGTERM recorder in front of the installed handler (main thread; a no-op elsewhere)."""
        self._sigterm.install()

    def _record_signal(self, signum: int) -> None:
        self.stop_signal = signum  # a plain store: the supervisor acts on it

    def stop_requested(self) -> bool:
        """True once the system stops or a stop signal was recorded: no agent is started from then on."""
        return self.stopping.is_set() or self.stop_signal is not None

    def _stop_on_signal(self) -> bool:
        """Turn a recorded signal into a stop (here, not in the handler: setting an Event takes a lock the interrupted
        main thread may hold). True if the system is stopping."""
        if self.stop_signal is not None and not self.stopping.is_set():
            self.log.info("%s system: %s received; stopping (no agent is replaced)", self.label,
                          signal.Signals(self.stop_signal).name)
            self.stopping.set()
            self.shared.flags[-1] = 1  # every agent leaves its loop
        return self.stopping.is_set()

    def watch(self, lock: Any, after_pass: Callable[[], None] | None = None) -> None:
        """The supervisor thread's loop: every 0.2 s, under ``lock``, stop on a recorded signal or run one
        :meth:`supervise` pass (at most 1 s of silence counted a pass), then ``after_pass()`` outside the lock
        (GA3C's status line). Returns once the system stops."""
        last = time.monotonic()
        while not self.stopping.wait(_SUPERVISE_S):
            with lock:
                if self._stop_on_signal():
                    return
                now = time.monotonic()
                watched, last = min(now - last, _MAX_PASS_S), now
                if not self.supervise(watched):
                    self._stop_on_signal()
                    return
            if after_pass is not None:
                after_pass()

    def spawn(self, index: int) -> bool:
        """Start an agent at ``index`` (its rows cleared); False, starting nothing, once stopping."""
        if self.stop_requested():
            return False
        self._incarnations += 1
        inc = self._incarnations
        sh = self.shared
        sh.pending[index] = 0
        sh.started[index] = 0
        sh.ready[index] = 0
        sh.busy[index] = 0
        sh.flags[index] = 0
        resp, free = self.ctx.Semaphore(0), self.ctx.Semaphore(self.slots)
        proc = agent_process(self.ctx, index, self.kwargs_for(index, inc, resp, free),
                             self.label.lower())
        self.agents[index] = AgentHandle(inc, proc, resp, free)
        start_process(proc)
        return True

    def active(self) -> list[int]:
        """Indices of live, not retiring agents."""
        return [i for i, a in enumerate(self.agents) if a is not None and not a.retiring]

    def set_count(self, n: int) -> None:
        """Start agents at free indices or retire the highest ones until ``n`` are active."""
        active = self.active()
        for index in range(self.max_agents):
            if len(active) >= n:
                break
            if self.agents[index] is None:
                if not self.spawn(index):
                    break
                active.append(index)
        for index in sorted(active, reverse=True)[: max(0, len(active) - n)]:
            self.agents[index].retiring = True
            self.shared.flags[index] = 1

    def supervise(self, watched: float) -> bool:
        """One pass: reap retired agents, kill stalled ones, replace dead ones. ``watched``: seconds since the
        previous pass (capped by the caller). False once the system stops (nothing more to do)."""
        now = time.monotonic()
        for index, agent in enumerate(self.agents):
            if agent is None or (agent.process.is_alive() and not self._stalled(index, agent, watched)):
                continue
            agent.process.join(0)
            if agent.process.exitcode is None:
                continue  # killed as stalled but not gone yet: seen dead at a later pass
            if agent.retiring:
                self.agents[index] = None
                continue
            if agent.dead_since is None:
                agent.dead_since = now
            code = agent.process.exitcode
            if not agent.stalled and code < 0 and -code in _STOP_SIGNALS and \
                    now - agent.dead_since < self.stop_signal_grace_s:
                continue  # killed by a stop signal: the learner may be getting it too
            report = None if agent.stalled else f"died (exit code {code})"  # a stalled one was reported already
            if not self.replace(index, code, report):
                return False
        return True

    def _stalled(self, index: int, agent: AgentHandle, watched: float) -> bool:
        if agent.stalled:
            return True
        if not self.shared.started[index]:  # still starting: it beats from its first step on
            return False
        beat = int(self.shared.heartbeat[index])
        if beat != agent.beat:
            agent.beat, agent.silent_s = beat, 0.0
            return False
        agent.silent_s += watched
        if agent.silent_s < self.stall_timeout_s:
            return False
        agent.stalled = True
        self.log.warning("%s agent %d (pid %s) made no progress for %.1f s (agent_stall_timeout_s=%g: stopped or "
                         "hung); killing it and %s", self.label, index, agent.process.pid, agent.silent_s,
                         self.stall_timeout_s,
                         "dropping it (it was retiring)" if agent.retiring else "starting a replacement")
        agent.process.kill()  # SIGKILL: delivered to a stopped process too
        agent.process.join(_KILL_JOIN_S)
        return True

    def replace(self, index: int, exitcode: int | None, report: str | None) -> bool:
        """Start a new incarnation at ``index`` (logging ``"<label> agent <index> (pid <pid>) <report>; starting a
        replacement"`` unless ``report`` is None); False (nothing started) when stopping or failed."""
        if self.stop_requested():
            return False
        now = time.monotonic()
        self._deaths.append(now)
        while self._deaths and now - self._deaths[0] > 30.0:
            self._deaths.popleft()
        if len(self._deaths) > max(10, 2 * self.max_agents):
            self.fail(RuntimeError(f"{len(self._deaths)} {self.label} agents died or stalled within 30 s (last exit "
                                   f"code {exitcode}); check the environment ({self.env_id!r})"))
            return False
        if report is not None:
            self.log.warning("%s agent %d (pid %s) %s; starting a replacement", self.label, index,
                        self.agents[index].process.pid, report)
        if not self.spawn(index):
            return False
        self.replaced += 1  # after the new handle is in place: a reader seeing the count sees the handle
        return True

    def close(self, deadline: float, threads: Sequence[threading.Thread | None] = ()) -> tuple[list[Any], int]:
        """Stop every agent by ``deadline`` (``time.monotonic()``): the all-stop flag, then ``threads`` (the system's
        supervisor, predictors, consumers, already told to stop) joined for at most 0.5 s each while 1.5 s remain,
        then the agents joined, terminated, killed; then put the SIGTERM handler found at :meth:`install_sigterm`
        back. Returns the processes and how many were still starting (terminated at once: an agent importing,
        making or resetting its envs polls no flag yet)."""
        self._closed = True
        self.shared.flags[-1] = 1
        for th in threads:
            if th is not None:
                th.join(max(0.0, min(0.5, deadline - time.monotonic() - 1.5)))
        live = [(i, a.process) for i, a in enumerate(self.agents) if a is not None and a.process.pid is not None]
        procs = [p for _, p in live]
        booting = [p for i, p in live if not self.shared.started[i]]
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
        self.agents = [None] * self.max_agents
        self._sigterm.restore()
        return procs, len(booting)

