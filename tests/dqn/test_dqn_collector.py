"""NStepCollector: emitted n-step transitions equal a brute-force computation over the recorded trajectory."""

from __future__ import annotations

import pytest
import torch

from lightning_per.dqn.collector import NStepCollector
from lightning_per.envs import TorchCartPoleEnv

GAMMA = 0.9


def _record(collector: NStepCollector, steps: int):
    """Step with random actions; record per-step raw data and the emitted transitions."""
    raw, emitted, stats = [], [], []
    for _ in range(steps):
        obs = collector._td.get("observation").clone() if collector._td is not None else None
        out = collector.step(None, 1.0)
        w, slot = collector._win, (collector.steps - 1) % collector.n
        raw.append({k: v[slot].clone() for k, v in w.items()})
        if obs is not None:
            torch.testing.assert_close(raw[-1]["observation"], obs)
        emitted.append(out.transitions)
        stats.append(out)
    return raw, emitted, stats


def _brute_force(raw, s: int, e: int, n: int):
    """n-step transition that starts at step s in env e, by a plain Python loop."""
    ret, k = 0.0, 0
    while True:
        step = raw[s + k]
        ret += GAMMA ** k * step["reward"][e].item()
        if step["done"][e] or k == n - 1:
            break
        k += 1
    last = raw[s + k]
    disc = 0.0 if last["terminated"][e] else GAMMA ** (k + 1)
    return ret, disc, last["next_observation"][e]


@pytest.mark.parametrize("n", [1, 3, 5])
def test_collector_emits_brute_force_n_step_transitions(n):
    env = TorchCartPoleEnv(num_envs=4, max_steps=14, seed=3)  # short time limit: truncations happen
    col = NStepCollector(env, n_step=n, gamma=GAMMA, n_actions=2, device="cpu", seed=0)
    raw, emitted, _ = _record(col, 60)
    assert all(t is None for t in emitted[: n - 1])
    n_trunc = sum(int((r["done"] & ~r["terminated"]).sum()) for r in raw)
    n_term = sum(int(r["terminated"].sum()) for r in raw)
    assert n_trunc > 0 and n_term > 0  # both kinds of episode end are exercised
    for t in range(n - 1, 60):
        td, s = emitted[t], t - n + 1
        assert td.batch_size == torch.Size([4])
        for e in range(4):
            ret, disc, next_obs = _brute_force(raw, s, e, n)
            assert td["reward"][e].item() == pytest.approx(ret, rel=1e-6)
            assert td["discount"][e].item() == pytest.approx(disc, rel=1e-6)
            torch.testing.assert_close(td["next_observation"][e], next_obs)
            torch.testing.assert_close(td["observation"][e], raw[s]["observation"][e])
            assert td["action"][e].item() == raw[s]["action"][e].item()


def test_collector_episode_statistics():
    env = TorchCartPoleEnv(num_envs=2, max_steps=5, seed=0)
    col = NStepCollector(env, n_step=2, gamma=GAMMA, n_actions=2, device="cpu", seed=0)
    _, _, stats = _record(col, 30)
    lengths = torch.cat([s.episode_length[s.done] for s in stats])
    returns = torch.cat([s.episode_return[s.done] for s in stats])
    assert lengths.numel() >= 10
    assert (lengths <= 5).all() and (lengths >= 1).all()
    torch.testing.assert_close(returns, lengths)  # CartPole pays 1 per step


def test_epsilon_greedy_actions():
    env = TorchCartPoleEnv(num_envs=512, seed=0)
    col = NStepCollector(env, n_step=1, gamma=GAMMA, n_actions=2, device="cpu", seed=0)
    obs = torch.zeros(512, 4)
    always_one = lambda o: torch.tensor([[0.0, 1.0]]).expand(o.shape[0], 2)  # noqa: E731
    assert (col.act(obs, always_one, 0.0) == 1).all()
    frac_zero = (col.act(obs, always_one, 0.5) == 0).float().mean().item()
    assert 0.15 < frac_zero < 0.35  # P(random and 0) = 0.25
    random_actions = col.act(obs, None, 1.0)
    assert set(random_actions.tolist()) == {0, 1}


def test_collector_state_round_trip_reproduces_the_future():
    def make():
        env = TorchCartPoleEnv(num_envs=2, max_steps=9, seed=1)
        return NStepCollector(env, n_step=3, gamma=GAMMA, n_actions=2, device="cpu", seed=5)

    a = make()
    _record(a, 11)
    state = a.state_dict()
    _, future_a, _ = _record(a, 10)
    b = make()
    b.load_state_dict(state)
    _, future_b, _ = _record(b, 10)
    for ta, tb in zip(future_a, future_b):
        for key in ta.keys(True, True):
            torch.testing.assert_close(ta[key], tb[key])


class _StepInOneCall(NStepCollector):
    """The same collector without the env's step_async/step_wait: TorchRL's step_and_maybe_reset."""

    overlaps = False


def test_overlapped_steps_record_what_step_and_maybe_reset_gives():
    """A step started before the previous one is recorded (the DQN module's order with an env that steps in
    its own threads) emits the transitions of plain sequential TorchRL ``step_and_maybe_reset`` steps, also
    across a checkpoint taken while a step is in flight; episodes end within the run (truncation at 5 agent
    steps)."""
    pytest.importorskip("ale_py")
    from lightning_per.envs import EnvConfig, make_env

    def make(cls):
        cfg = EnvConfig(id="ALE/Pong-v5", backend="ale_vector", num_envs=3, max_episode_steps=5, noop_max=0,
                        repeat_action_probability=0.0)
        return cls(make_env(cfg, seed=11), n_step=3, gamma=GAMMA, n_actions=6, device="cpu", seed=4)

    steps = 14
    plain = make(_StepInOneCall)
    assert not plain.overlaps
    reference = [plain.step(None, 1.0) for _ in range(steps)]
    overlapped = make(NStepCollector)
    assert overlapped.overlaps
    got = []
    for i in range(steps):
        received = overlapped.wait() if overlapped.in_flight else None
        overlapped.start(None, 1.0)
        if i == 7:
            overlapped.state_dict()  # waits for the step in flight; record() still gets its results
        if received is not None:
            got.append(overlapped.record(received))
    got.append(overlapped.record(overlapped.wait()))
    assert not overlapped.in_flight
    assert any(bool(out.done.any()) for out in reference)
    for ref, out in zip(reference, got, strict=True):
        torch.testing.assert_close(out.done, ref.done)
        torch.testing.assert_close(out.episode_return, ref.episode_return)
        assert (ref.transitions is None) == (out.transitions is None)
        if ref.transitions is not None:
            for key in ref.transitions.keys(True, True):
                torch.testing.assert_close(out.transitions[key], ref.transitions[key])
    plain.env.close()
    overlapped.env.close()


def test_start_twice_or_wait_without_start_is_refused():
    env = TorchCartPoleEnv(num_envs=2, max_steps=9, seed=1)
    c = NStepCollector(env, n_step=3, gamma=GAMMA, n_actions=2, device="cpu", seed=5)
    with pytest.raises(RuntimeError, match="no step was started"):
        c.wait()
    c.start(None, 1.0)
    with pytest.raises(RuntimeError, match="not waited for"):
        c.start(None, 1.0)


def test_a_start_after_a_checkpoint_drained_the_step_is_refused():
    """state_dict() waits for a step in flight and keeps its results for record(): starting another before
    wait() hands them over would overwrite them."""
    env = TorchCartPoleEnv(num_envs=2, max_steps=9, seed=1)
    c = NStepCollector(env, n_step=3, gamma=GAMMA, n_actions=2, device="cpu", seed=5)
    c.start(None, 1.0)
    c.state_dict()
    with pytest.raises(RuntimeError, match="not waited for"):
        c.start(None, 1.0)
    c.record(c.wait())
    c.start(None, 1.0)


def test_a_wrapped_gymnasium_async_vector_env_is_stepped_in_start():
    """TorchRL's GymWrapper forwards unknown attributes to the env it wraps, and Gymnasium's AsyncVectorEnv has
    its own step_async/step_wait (numpy actions, a 5-tuple back): such an env is not taken for one that steps
    in its own threads, and steps as any other. CartPole pays 1 per step and no episode ends within its first
    8 steps (the pole needs more to fall), so each 2-step transition has return 1 + gamma, discount gamma^2."""
    from lightning_per.envs import EnvConfig, make_env

    cfg = EnvConfig(id="CartPole-v1", backend="gymnasium", num_envs=2, vectorization="async")
    c = NStepCollector(make_env(cfg, seed=3), n_step=2, gamma=GAMMA, n_actions=2, device="cpu", seed=4)
    try:
        assert hasattr(c.env, "step_async") and not c.overlaps
        outs = [c.step(None, 1.0) for _ in range(4)]
    finally:
        c.env.close()
    assert outs[0].transitions is None
    for out in outs[1:]:
        torch.testing.assert_close(out.transitions["reward"], torch.full((2,), 1 + GAMMA))
        torch.testing.assert_close(out.transitions["discount"], torch.full((2,), GAMMA**2))
        assert not out.done.any()
