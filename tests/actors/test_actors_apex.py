"""Ape-X acting on the shared actor system: the epsilon ladder, n-step transitions written by real agent processes
against the in-process NStepCollector and an independent oracle, and an agent killed with SIGKILL."""

from __future__ import annotations

import itertools
import math
import os
import signal
import threading
import time

import _apex_probe_env as probe  # tests/support: on sys.path here and in the spawned agents
import numpy as np
import pytest

from lightning_per.actors.apex import ApexActors, ApexConfig
from lightning_per.actors.ladder import annealed_epsilon, epsilon_ladder
from lightning_per.actors.nstep import NStepWindow

SPEC = {"env": probe.ENV_ID, "backend": "gym", "kwargs": {}}
GAMMA, N = 0.5, 3  # powers of 1/2 and integer rewards: every sum is exact in float32


def _greedy_policy(obs):
    q = probe.q_values(obs)  # [N, A]
    return q.argmax(-1), q.max(-1).values.float()


# ---------------------------------------------------------------------------------------------- ladder
def test_epsilon_ladder_values_are_the_papers():
    # Horgan et al. 2018, section 4.1: epsilon_i = epsilon ** (1 + alpha * i / (N - 1)), epsilon 0.4, alpha 7
    got = epsilon_ladder(4)
    want = [0.4 ** 1.0, 0.4 ** (1 + 7 / 3), 0.4 ** (1 + 14 / 3), 0.4 ** 8.0]
    assert got == pytest.approx(want, rel=1e-12)
    assert got[0] == 0.4 and got[-1] == pytest.approx(0.00065536, rel=1e-12)
    assert epsilon_ladder(1, 0.3, 7.0) == [0.3]
    assert epsilon_ladder(3, 0.5, 2.0) == pytest.approx([0.5, 0.25, 0.125], rel=1e-12)


@pytest.mark.parametrize("kwargs, match", [({"num_actors": 0}, "num_actors"), ({"num_actors": 2, "epsilon": 1.5},
                                           "epsilon"), ({"num_actors": 2, "alpha": -1.0}, "alpha")])
def test_epsilon_ladder_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        epsilon_ladder(**kwargs)
    with pytest.raises(TypeError, match="num_actors"):
        epsilon_ladder(2.0)


def test_annealed_epsilon_is_linear_in_learner_updates_then_constant():
    # start + (end - start) * min(1, u / U): the DQN's linear schedule on the learner's update count
    assert [annealed_epsilon(1.0, 0.02, u, 200) for u in (0, 50, 100, 150, 200, 10_000)] == pytest.approx(
        [1.0, 1.0 - 0.98 / 4, 1.0 - 0.98 / 2, 1.0 - 0.98 * 3 / 4, 0.02, 0.02], rel=1e-12)
    assert annealed_epsilon(0.4, 0.1, 7, 0) == 0.1  # no annealing: the end value at once
    # the ladder of both ends, rung by rung (what an agent of the annealed ladder moves between)
    cfg = ApexConfig(agents=3, epsilon=0.1, epsilon_alpha=2.0, epsilon_start=0.5, epsilon_anneal_updates=10)
    assert cfg.validate().start_epsilons() == pytest.approx([0.5, 0.25, 0.125], rel=1e-12)
    assert cfg.epsilons() == pytest.approx([0.1, 0.01, 0.001], rel=1e-12)
    assert ApexConfig(agents=2, epsilon=0.3).start_epsilons() == ApexConfig(agents=2, epsilon=0.3).epsilons()


@pytest.mark.parametrize("kwargs, match", [
    ({"epsilon_start": 1.5, "epsilon_anneal_updates": 10}, "actors.epsilon_start"),
    ({"epsilon_start": 1.0, "epsilon_anneal_updates": 0}, "actors.epsilon_anneal_updates"),
    ({"epsilon_anneal_updates": -1}, "actors.epsilon_anneal_updates"),
    ({"epsilon_start": 1.0, "epsilon_anneal_updates": 2.5}, "actors.epsilon_anneal_updates")])
def test_config_refuses_bad_annealing(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ApexConfig(**kwargs).validate()


def test_config_refuses_bad_fields_and_backends():
    with pytest.raises(ValueError, match="actors.slots"):
        ApexConfig(slots=1).validate()
    with pytest.raises(ValueError, match="actors.agents"):
        ApexConfig(agents=0).validate()
    with pytest.raises(ValueError, match="backend"):
        ApexActors(ApexConfig(), {**SPEC, "backend": "ale"}, (3,), "float32", N, GAMMA, _greedy_policy,
                   lambda: 0, "cpu", lambda b: None)


# ---------------------------------------------------------------------------------------------- the window
def test_window_matches_the_oracle_on_the_probe_env():
    env = probe.ApexProbe(uid=7)
    obs = env.reset()[0]
    w = NStepWindow(N, GAMMA, 1, (3,), np.float32)
    seen = 0
    for _ in range(60):
        a = probe.greedy(*obs.astype(int))
        nxt, r, te, tr, _ = env.step(a)
        final = nxt
        if te or tr:
            nxt = env.reset()[0]
        out = w.push(obs[None], np.array([a]), final[None], np.array([r], np.float32), np.array([te or tr]),
                     np.array([te]))
        obs = nxt
        if out is None:
            continue
        uid, ep, t = out["observation"][0].astype(int)
        action, ret, discount, nxt_obs = probe.expected_transition(uid, ep, t, N, GAMMA)
        assert (out["action"][0], out["reward"][0], out["discount"][0]) == (action, ret, discount)
        assert tuple(out["next_observation"][0].astype(int)) == nxt_obs
        seen += 1
    assert seen == 58


# ---------------------------------------------------------------------------------------------- real agents
def _collect(actors_kwargs, until, timeout=60.0):
    batches, lock = [], threading.Lock()

    def sink(batch):
        with lock:
            batches.append(batch)

    actors = ApexActors(sink=sink, **actors_kwargs)
    return actors, batches, lock


def _rows(batches):
    """{(uid, ep, t): (action, reward, discount, next obs, version)} of every delivered transition."""
    out = {}
    for b in batches:
        for i in range(b["action"].shape[0]):
            key = tuple(int(x) for x in b["observation"][i].tolist())
            out[key] = (int(b["action"][i]), float(b["reward"][i]), float(b["discount"][i]),
                        tuple(int(x) for x in b["next_observation"][i].tolist()), int(b["version"][i]))
    return out


def _wait(cond, timeout, actors=None):
    t0 = time.monotonic()
    while not cond():
        assert actors is None or actors.error is None, actors.error
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.02)


def test_agent_transitions_equal_nstep_collectors_for_the_same_envs_and_actions():
    from torchrl.envs import GymEnv, SerialEnv

    from lightning_per.dqn.collector import NStepCollector

    e, seed, steps = 2, 100, 40
    cfg = ApexConfig(agents=1, envs_per_agent=e, epsilon=0.0, slot_steps=4, slots=3)
    actors, batches, lock = _collect(dict(cfg=cfg, env_spec=SPEC, obs_shape=(3,), obs_dtype="float32", n_step=N,
                                          gamma=GAMMA, policy=_greedy_policy, version_fn=lambda: 5, device="cpu",
                                          seed=seed), until=None)
    with actors:
        _wait(lambda: actors.ingested >= steps * e, 60, actors)
    got = _rows(batches)

    uids = [seed + 10_007 + k for k in range(e)]  # agent incarnation 1 resets env k with its seed + k
    env = SerialEnv(e, [lambda u=u: GymEnv(probe.ENV_ID, categorical_action_encoding=True, uid=u) for u in uids])
    collector = NStepCollector(env, N, GAMMA, probe.N_ACTIONS, "cpu", seed=0)
    want = {}
    for _ in range(steps + N):
        out = collector.step(lambda o: probe.q_values(o), 0.0)
        if out.transitions is not None:
            td = out.transitions
            for i in range(e):
                key = tuple(int(x) for x in td["observation"][i].tolist())
                want[key] = (int(td["action"][i]), float(td["reward"][i]), float(td["discount"][i]),
                             tuple(int(x) for x in td["next_observation"][i].tolist()))
    env.close()
    common = sorted(set(got) & set(want))
    assert len(common) >= steps * e - e  # the actor delivered whole slots of the same stream
    assert {uid for uid, _, _ in common} == set(uids)
    for key in common:
        assert got[key][:4] == want[key], key
        assert got[key][4] == 5  # the weights' version that chose it
    # terminations (0), full windows (gamma^n) and truncations inside the window (gamma^k, k < n) all occur
    discounts = {got[k][2] for k in common}
    assert {0.0, GAMMA ** N} < discounts and discounts <= {0.0, GAMMA, GAMMA ** 2, GAMMA ** 3}


def test_sigkill_of_an_agent_replaces_it_and_nothing_torn_is_delivered():
    cfg = ApexConfig(agents=2, envs_per_agent=2, epsilon=0.0, slot_steps=8, slots=2)
    actors, batches, lock = _collect(dict(cfg=cfg, env_spec=SPEC, obs_shape=(3,), obs_dtype="float32", n_step=N,
                                          gamma=GAMMA, policy=_greedy_policy, version_fn=lambda: 0, device="cpu",
                                          seed=3), until=None)
    with actors:
        _wait(lambda: actors.ingested >= 200, 60, actors)
        victim = actors.pool.agents[0]
        os.kill(victim.process.pid, signal.SIGKILL)
        _wait(lambda: actors.pool.replaced >= 1 and actors.pool.agents[0] is not victim, 30)
        assert actors.pool.agents[0].incarnation != victim.incarnation
        before = actors.ingested
        successor_uids = {actors.seed + 10_007 * actors.pool.agents[0].incarnation + k for k in range(2)}
        def successor_delivered():
            with lock:
                return successor_uids & {u for u, _, _ in _rows(list(batches))}

        _wait(lambda: actors.ingested >= before + 200 and successor_delivered(), 60, actors)
        assert actors.error is None
    with lock:
        rows = _rows(batches)
    assert len(rows) >= 400
    for (uid, ep, t), (action, ret, discount, nxt, _) in rows.items():  # every row is a whole, true transition
        assert (action, ret, discount, nxt) == probe.expected_transition(uid, ep, t, N, GAMMA)
    assert math.isfinite(actors.stats.mean_return(20))


def test_agents_explore_on_the_annealed_epsilon_of_the_weights_version_that_answered():
    """One agent, greedy action 0 always, epsilon 1 -> 0 over 100 updates, the version one higher at every answer:
    a transition chosen under version v < 100 is random with probability (1 - v / 100) * 2/3 (a uniform draw of 3
    actions is not 0 in 2 of 3); from v = 100 on every action is 0. The count of non-greedy actions is checked
    against the sum of those Bernoulli probabilities within 5 standard deviations."""
    import torch

    counter = itertools.count()  # next() is atomic under the GIL: the predictor thread's versions 0, 1, 2, ...

    def always_zero(obs):
        return torch.zeros(obs.shape[0], dtype=torch.int64), torch.zeros(obs.shape[0])

    cfg = ApexConfig(agents=1, envs_per_agent=2, epsilon=0.0, epsilon_start=1.0, epsilon_anneal_updates=100,
                     slot_steps=8, slots=2)
    actors, batches, lock = _collect(dict(cfg=cfg, env_spec=SPEC, obs_shape=(3,), obs_dtype="float32", n_step=N,
                                          gamma=GAMMA, policy=always_zero, version_fn=lambda: next(counter),
                                          device="cpu", seed=3), until=None)
    with actors:
        _wait(lambda: actors.ingested >= 2 * 260, 60, actors)
    with lock:
        action = np.concatenate([b["action"].numpy() for b in batches])
        version = np.concatenate([b["version"].numpy() for b in batches])
    late = version >= 100
    assert late.sum() >= 100 and (action[late] == 0).all()
    p = (1.0 - version[~late] / 100.0) * (2.0 / 3.0)  # [n] P(action != 0) of each early transition
    got, want, sd = int((action[~late] != 0).sum()), float(p.sum()), float(np.sqrt((p * (1 - p)).sum()))
    assert abs(got - want) <= 5 * sd, (got, want, sd)


@pytest.mark.parametrize("bound", ["answers", "slots"])
def test_agent_time_names_what_the_agents_wait_for(bound):
    """Two agents whose predictor takes 30 ms an answer (the probe env steps in microseconds), or whose learner
    stops taking slots after the first: once each agent has run 1 s, the waiting share of that bound is most of
    their time (> 0.7), the others are small, and no agent counts more running time than the wall clock gave it."""
    import torch

    from lightning_per.actors.shared import AGENT_TIME
    from lightning_per.actors.stats import agent_time_shares

    release = threading.Event()

    def slow_policy(obs):
        time.sleep(0.03)  # the predictor the agents wait for
        return _greedy_policy(obs)

    def blocking_sink(batch):
        release.wait()  # the learner that takes no more slots: the agents fill theirs, then wait for one

    cfg = ApexConfig(agents=2, envs_per_agent=2, epsilon=0.0, slot_steps=4, slots=2)
    actors = ApexActors(cfg=cfg, env_spec=SPEC, obs_shape=(3,), obs_dtype="float32", n_step=N, gamma=GAMMA,
                        policy=slow_policy if bound == "answers" else _greedy_policy, version_fn=lambda: 0,
                        device="cpu", sink=blocking_sink if bound == "slots" else lambda b: None, seed=3)
    assert AGENT_TIME == ("running", "env", "answer_wait", "slot_wait")
    with actors:
        t_start = time.monotonic()
        try:
            _wait(lambda: (actors.shared.agent_time[:, 0] >= 1.0).all(), 60, actors)
            spent = actors.shared.agent_time.copy()  # [2, 4] seconds
            elapsed = time.monotonic() - t_start
        finally:
            release.set()
    assert (spent[:, 0] <= elapsed).all() and (spent[:, 1:].sum(axis=1) <= spent[:, 0] + 1e-6).all(), spent
    shares = agent_time_shares(np.zeros_like(spent), spent)
    waited = "agent_answer_wait_share" if bound == "answers" else "agent_slot_wait_share"
    other = "agent_slot_wait_share" if bound == "answers" else "agent_answer_wait_share"
    assert shares[waited] > 0.7 and shares[other] < 0.2 and shares["agent_env_share"] < 0.2, shares
    assert torch.tensor(list(shares.values())).sum() <= 1.0 + 1e-9
