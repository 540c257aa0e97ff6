"""GA3C runtime without Lightning: shutdown within 5 s with nothing left behind, dead agents replaced,
agents that never load torch/CUDA."""

import os
import signal
import time

import pytest
import torch

from lightning_per.actors.envs import probe_env
from lightning_per.actors.stats import Stats
from lightning_per.ga3c.config import GA3CConfig
from lightning_per.ga3c.system import GA3CSystem

SPEC = {"env": "CartPole-v1", "backend": "gym", "kwargs": {}, "frame_stack": 4}


def _random_policy(obs):
    n = obs.shape[0]
    return torch.randint(0, 2, (n,)), torch.zeros(n)


def _system(**kw):
    cfg = GA3CConfig(**{"agents": 2, "envs_per_agent": 2, "status_interval_s": 0, **kw})
    shape, dtype, _ = probe_env({**SPEC, "num_envs": 1})
    return GA3CSystem(cfg, SPEC, shape, str(dtype), _random_policy, lambda: 0, torch.device("cpu"))


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _sem_names(system):
    sems = [system.pred_sem, system.ready_sem]
    for agent in system.pool.agents:
        if agent is not None:
            sems += [agent.response_sem, agent.free_sem]
    return [s._semlock.name for s in sems if getattr(s._semlock, "name", None)]


def _wait_batches(system, n, timeout=20.0):
    deadline = time.monotonic() + timeout
    got = 0
    while got < n and time.monotonic() < deadline:
        got += system.get_batch(timeout=max(0.0, deadline - time.monotonic())) is not None
    return got


def test_batches_have_the_documented_layout():
    system = _system(train_min_batch_size=20, t_max=5).start()
    try:
        assert _wait_batches(system, 1) == 1
        batch = system.get_batch()
        n = batch["size"]
        assert n >= 20 and n % 10 == 0  # whole rollouts of T=5 steps x E=2 envs
        assert batch["obs"].shape == (n, 4) and batch["obs"].dtype == torch.float32
        assert batch["action"].shape == (n,) and batch["action"].dtype == torch.int64
        assert batch["ret"].shape == (n,) and batch["version"].shape == (n,)
        assert batch["ret"].abs().max() <= 1.0 / (1 - 0.99) + 1e-3  # CartPole rewards are 1, V = 0 here
    finally:
        system.close()


def test_recent_returns_are_the_newest_in_order():
    stats = Stats(history=5)
    assert stats.recent_returns(3) == [] and stats.episodes == 0
    stats.add_rollout(10, [(1.0, 3), (2.0, 4)])
    stats.add_rollout(10, [(3.0, 5), (4.0, 6), (5.0, 7), (6.0, 8)])
    assert stats.recent_returns(3) == [4.0, 5.0, 6.0]
    assert stats.recent_returns(10) == [2.0, 3.0, 4.0, 5.0, 6.0]  # the history keeps 5
    assert stats.recent_returns(0) == [] and stats.episodes == 6


def test_close_stops_everything_within_5_s_and_frees_shared_memory():
    system = _system(agents=3, predictors=2, trainers=2).start()
    assert _wait_batches(system, 2) == 2
    pids = [a.process.pid for a in system.pool.agents if a is not None]
    assert len(pids) == 3 and all(_alive(p) for p in pids)
    shm_path = f"/dev/shm/{system.shared.name}"
    sems = _sem_names(system)
    assert os.path.exists(shm_path) and sems
    threads = [*system._predictors, *system._trainers]
    t0 = time.monotonic()
    system.close()
    assert time.monotonic() - t0 < 5.0
    assert not any(_alive(p) for p in pids)
    assert not any(th.is_alive() for th in threads)
    assert not os.path.exists(shm_path)
    import gc

    gc.collect()
    assert not [s for s in sems if os.path.exists(f"/dev/shm/sem.{s.lstrip('/')}")]
    system.close()  # idempotent


@pytest.mark.parametrize("delay", [0.0, 0.013, 0.031])  # kill at different moments of the agent loop
def test_dead_agent_is_replaced_and_training_data_keeps_flowing(delay):
    system = _system(agents=2).start()
    try:
        assert _wait_batches(system, 1) == 1
        time.sleep(delay)
        victim = system.pool.agents[0]
        os.kill(victim.process.pid, signal.SIGKILL)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10 and (system.pool.agents[0] is victim or system.pool.replaced == 0):
            time.sleep(0.05)
        assert system.pool.replaced == 1
        assert system.pool.agents[0].incarnation != victim.incarnation
        assert system.counts().agents == 2
        survivor_steps = system.stats.snapshot().steps
        assert _wait_batches(system, 5) == 5  # a kill at any moment must not stall the other agent
        assert system.stats.snapshot().steps > survivor_steps
    finally:
        system.close()


def test_killed_agents_never_stall_the_survivors():
    """Repeated kills at random moments (the reference's queues could deadlock on this)."""
    import random

    rng = random.Random(0)
    system = _system(agents=3).start()
    try:
        assert _wait_batches(system, 1) == 1
        for _ in range(4):
            victim = system.pool.agents[rng.randrange(3)]
            time.sleep(rng.random() * 0.05)
            try:  # the victim may be one killed a moment ago and not yet replaced
                os.kill(victim.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            assert _wait_batches(system, 2, timeout=15.0) == 2
        t0 = time.monotonic()
        while system.pool.replaced < 1 and time.monotonic() - t0 < 5:
            time.sleep(0.05)
        assert system.pool.replaced >= 1
    finally:
        system.close()


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc")
def test_agents_never_load_torch():
    system = _system(agents=1).start()
    try:
        assert _wait_batches(system, 1) == 1
        pid = system.pool.agents[0].process.pid
        with open(f"/proc/{pid}/maps") as fh:
            maps = fh.read()
        assert "numpy" in maps  # sanity: we are looking at a live agent
        assert "libtorch" not in maps and "libcuda" not in maps and "libcudart" not in maps
    finally:
        system.close()


def test_counts_change_at_run_time():
    from lightning_per.actors.adjust import Counts

    system = _system(agents=1, max_agents=4).start()
    try:
        system.set_counts(Counts(3, 2, 2))
        assert system.counts() == Counts(3, 2, 2)
        assert _wait_batches(system, 2) == 2
        system.set_counts(Counts(1, 1, 1))
        assert system.counts() == Counts(1, 1, 1)
        assert _wait_batches(system, 2) == 2  # the remaining agent still feeds the trainers
    finally:
        system.close()


def _wait(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


def test_agent_terminated_alone_is_replaced():
    """SIGTERM to one agent (not to the learner) is a death like any other: replaced, after the grace."""
    system = _system(agents=2).start()
    try:
        assert _wait_batches(system, 1) == 1
        victim = system.pool.agents[1]
        os.kill(victim.process.pid, signal.SIGTERM)
        assert _wait(lambda: system.pool.replaced == 1)
        assert system.pool.agents[1].incarnation != victim.incarnation and not system.stopping.is_set()
        assert _wait_batches(system, 2) == 2
    finally:
        system.close()


def test_sigterm_to_learner_and_agents_stops_the_system_without_replacements():
    """The group signal seen from inside: agents die of SIGTERM, the learner's handler (here a recorder, in the
    CLI one that raises KeyboardInterrupt) still runs, the system stops and starts no agent, and close() puts
    the handler back."""
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        system = _system(agents=2).start()
        try:
            assert _wait_batches(system, 1) == 1
            pids = [a.process.pid for a in system.pool.agents if a is not None]
            for pid in pids:
                os.kill(pid, signal.SIGTERM)
            signal.raise_signal(signal.SIGTERM)
            assert seen == [signal.SIGTERM]
            assert _wait(system.stopping.is_set)
            assert system.get_batch(timeout=1.0) is None
            assert system.pool.replaced == 0
            assert [a.process.pid for a in system.pool.agents if a is not None] == pids  # nothing new started
        finally:
            system.close()
        assert signal.getsignal(signal.SIGTERM) is not None and seen == [signal.SIGTERM]
        signal.raise_signal(signal.SIGTERM)  # the recorder is the handler again
        assert seen == [signal.SIGTERM] * 2
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_lag_aware_adjustment_measures_tps_and_the_lag_of_the_real_system():
    """The adjuster of a running system gets its windows from the system's counters: TPS of the updates counted and
    the p95 of their per-transition lags (here all 0: the policy version stays 0), each decision with its reason."""
    system = _system(dynamic_adjustment=True, adjust_warmup_s=0.0, adjust_window_s=0.3, adjust_max_lag_p95=5.0,
                     max_agents=3, train_min_batch_size=4, t_max=2)
    system.start()
    try:
        deadline = time.monotonic() + 60.0
        # windows before the agents have started measure no update (TPS 0, no lag): wait for two that do
        while sum(h["tps"] > 0 for h in list(system.adjuster.history)) < 2 and time.monotonic() < deadline:
            batch = system.get_batch(timeout=1.0)
            if batch is not None:  # what the learner counts at each update
                system.stats.add_update(batch["size"], 0.0 - batch["version_mean"], 0 - batch["version"].numpy())
        history = list(system.adjuster.history)
    finally:
        system.close()
    measured = [h for h in history if h["tps"] > 0]
    assert len(measured) >= 2 and all(h["lag_p95"] == 0.0 for h in measured)  # lag 0 for every transition
    assert all(isinstance(h["reason"], str) and h["reason"] for h in history)
    assert system.adjuster.max_lag_p95 == 5.0
