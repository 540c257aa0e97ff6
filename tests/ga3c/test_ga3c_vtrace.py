"""V-trace for GA3C (``vtrace: true``): the targets against a NumPy model of IMPALA's definition (Espeholt et al.
2018, eq. 1, written as the explicit sum, not the recursion), the on-policy case against the agents' n-step
returns, the loss's advantage input, the module's forward over whole rollouts, and the data path's V-trace keys
against the probe environment's own definition (tests/support/_ga3c_probe_env.py)."""

import math
import time
import warnings
from unittest import mock

import _ga3c_probe_env as probe
import numpy as np
import pytest
import torch

from lightning_per.actors.envs import probe_env
from lightning_per.actors.returns import nstep_returns
from lightning_per.ga3c import module as ga3c_module
from lightning_per.ga3c.config import GA3CConfig
from lightning_per.ga3c.loss import a3c_loss, vtrace_targets
from lightning_per.ga3c.module import GA3C
from lightning_per.ga3c.system import GA3CSystem

GAMMA = 0.9


def _vtrace_model(log_pi, log_mu, value, bootstrap, reward, term, trunc, gamma, rho_bar, c_bar):
    """IMPALA eq. 1 term by term, per rollout and env, in float64: v_s = V_s + sum_t (prod_{i<t} gamma_i c_i)
    delta_t with gamma_i = 0 after an episode end, and A_s = rho_s (r_s + gamma_s v_{s+1} - V_s). A time-limit
    step bootstraps from its own V (the next state is not observed)."""
    R, T, E = value.shape
    v_out, a_out = np.zeros((R, T, E)), np.zeros((R, T, E))
    for r in range(R):
        for e in range(E):
            V = [float(x) for x in value[r, :, e]] + [float(bootstrap[r, e])]
            ratio = [math.exp(float(log_pi[r, t, e]) - float(log_mu[r, t, e])) for t in range(T)]
            rho = [min(rho_bar, x) for x in ratio]
            c = [min(c_bar, x) for x in ratio]
            ended = [bool(term[r, t, e]) or bool(trunc[r, t, e]) for t in range(T)]
            delta = [rho[t] * (_one_step(float(reward[r, t, e]), term[r, t, e], trunc[r, t, e], V[t], V[t + 1],
                                         gamma) - V[t]) for t in range(T)]
            v = []
            for s in range(T):
                total, coef = V[s], 1.0
                for t in range(s, T):
                    total += coef * delta[t]
                    if ended[t]:
                        break
                    coef *= gamma * c[t]
                v.append(total)
            v.append(V[T])
            for s in range(T):
                q = _one_step(float(reward[r, s, e]), term[r, s, e], trunc[r, s, e], V[s], v[s + 1], gamma)
                a_out[r, s, e] = rho[s] * (q - V[s])
                v_out[r, s, e] = v[s]
    return v_out, a_out


def _one_step(reward, terminated, truncated, value, next_value, gamma):
    """r_t + gamma_t * next: nothing after a terminal, V(x_t) itself after a time limit."""
    if terminated:
        return reward
    return reward + gamma * (value if truncated else next_value)


def _random_rollouts(seed, R=3, T=6, E=4, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    value = torch.randn(R, T, E, generator=g)
    log_mu = -torch.rand(R, T, E, generator=g) * 2
    log_pi = log_mu + spread * torch.randn(R, T, E, generator=g)  # ratios on both sides of the clips
    ends = torch.rand(R, T, E, generator=g)
    term, trunc = ends < 0.12, (ends >= 0.12) & (ends < 0.2)
    return dict(log_pi=log_pi, log_mu=log_mu, value=value, bootstrap=torch.randn(R, E, generator=g),
                reward=torch.randn(R, T, E, generator=g), terminated=term, truncated=trunc)


@pytest.mark.parametrize("rho_bar, c_bar", [(1.0, 1.0), (2.0, 0.5), (0.7, 0.7)])
@pytest.mark.parametrize("seed", [0, 1])
def test_targets_match_impala_eq1(seed, rho_bar, c_bar):
    x = _random_rollouts(seed)
    assert x["terminated"].any() and x["truncated"].any()
    v, adv = vtrace_targets(**x, gamma=GAMMA, rho_clip=torch.tensor(rho_bar), c_clip=torch.tensor(c_bar))
    ref_v, ref_adv = _vtrace_model(*(x[k].double().numpy() for k in ("log_pi", "log_mu", "value", "bootstrap",
                                                                     "reward", "terminated", "truncated")),
                                   GAMMA, rho_bar, c_bar)
    np.testing.assert_allclose(v.numpy(), ref_v, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=1e-5, atol=1e-5)
    assert not v.requires_grad and not adv.requires_grad


def test_on_policy_targets_are_the_agents_nstep_returns():
    """pi = mu and clips >= 1: v_s is the n-step return (IMPALA section 4.1), here the agents' own
    nstep_returns, terminations and time limits included."""
    x = _random_rollouts(3, spread=0.0)
    v, adv = vtrace_targets(**x, gamma=GAMMA)
    for r in range(v.shape[0]):
        ret = nstep_returns(x["reward"][r].numpy(), x["value"][r].numpy(), x["bootstrap"][r].numpy(),
                            x["terminated"][r].numpy(), x["truncated"][r].numpy(), GAMMA)
        np.testing.assert_allclose(v[r].numpy(), ret, rtol=1e-5, atol=1e-5)
        # on-policy, A_s = r_s + gamma v_{s+1} - V_s = v_s - V_s at every step
        np.testing.assert_allclose(adv[r].numpy(), ret - x["value"][r].numpy(), rtol=1e-5, atol=1e-5)


def test_targets_are_differentiable_inputs_but_carry_no_gradient():
    x = _random_rollouts(4)
    x["value"].requires_grad_(True)
    x["log_pi"].requires_grad_(True)
    v, adv = vtrace_targets(**x, gamma=GAMMA)
    assert v.grad_fn is None and adv.grad_fn is None


@pytest.mark.parametrize("kw, name", [({"value": torch.zeros(2, 3)}, "value"), ({"reward": torch.zeros(3, 6, 3)},
                                      "reward"), ({"bootstrap": torch.zeros(3, 6)}, "bootstrap")])
def test_bad_shapes_name_the_argument(kw, name):
    x = {**_random_rollouts(0), **kw}
    with pytest.raises(ValueError, match=name):
        vtrace_targets(**x, gamma=GAMMA)


def test_loss_takes_the_given_advantage_for_the_policy_and_ret_for_the_value():
    g = torch.Generator().manual_seed(0)
    logits, value = torch.randn(5, 3, generator=g, requires_grad=True), torch.randn(5, generator=g)
    action, ret, adv = torch.tensor([0, 1, 2, 1, 0]), torch.randn(5, generator=g), torch.randn(5, generator=g)
    loss, parts = a3c_loss(logits, value, action, ret, beta=0.1, value_coef=0.5, advantage=adv)
    p = torch.softmax(logits.detach(), -1)
    entropy = -(p * p.log()).sum(-1)
    policy = (-(p[torch.arange(5), action].log() * adv) - 0.1 * entropy).mean()
    expected = policy + 0.5 * (0.5 * (ret - value) ** 2).mean()
    torch.testing.assert_close(loss.detach(), expected)
    torch.testing.assert_close(parts["advantage"], adv.mean())
    with pytest.raises(ValueError, match="advantage"):
        a3c_loss(logits, value, action, ret, advantage=torch.zeros(4))


def test_module_forward_scores_whole_rollouts_and_their_bootstrap_states():
    """GA3C._vtrace_forward: one forward of the rows and of each rollout's s_T; rows are whole rollouts, time
    major, so V-trace sees (R, T, E); the result equals the model above run on the net's own outputs."""
    T, E, R, obs = 3, 2, 2, (4, 36, 36)
    with mock.patch.object(ga3c_module, "probe_env", lambda spec: (obs, np.dtype("uint8"), 6)):
        m = GA3C(GA3CConfig(network="conv", vtrace=True, t_max=T, envs_per_agent=E, gamma=GAMMA,
                            vtrace_rho_clip=1.5, vtrace_c_clip=0.8, status_interval_s=0))
    g = torch.Generator().manual_seed(1)
    n = R * T * E
    b = {"obs": torch.randint(0, 256, (n, *obs), generator=g, dtype=torch.uint8),
         "next_obs": torch.randint(0, 256, (R * E, *obs), generator=g, dtype=torch.uint8),
         "action": torch.randint(0, 6, (n,), generator=g), "log_prob": -torch.rand(n, generator=g) * 2,
         "reward": torch.randn(n, generator=g), "terminated": torch.tensor([0, 0, 1, 0, 0, 0] * R).bool(),
         "truncated": torch.tensor([0, 0, 0, 0, 1, 0] * R).bool()}
    logits, value, v, adv, h = m._vtrace_forward(b)
    with torch.no_grad():
        ref_logits, ref_value = m.net(b["obs"])
        _, boot = m.net(b["next_obs"])
        ref_h = m.net.features(b["obs"])
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h, ref_h, rtol=1e-5, atol=1e-5)  # the features of the rows alone, not of s_T
    log_pi = torch.log_softmax(ref_logits, -1).gather(1, b["action"][:, None]).squeeze(1)

    def tte(t):  # rows (r, t, e) in that order -> (R, T, E)
        return t.double().reshape(R, T, E).numpy()

    ref_v, ref_adv = _vtrace_model(tte(log_pi), tte(b["log_prob"]), tte(ref_value), boot.double().reshape(R, E).numpy(),
                                   tte(b["reward"]), tte(b["terminated"]), tte(b["truncated"]), GAMMA, 1.5, 0.8)
    np.testing.assert_allclose(v.reshape(R, T, E).numpy(), ref_v, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(adv.reshape(R, T, E).numpy(), ref_adv, rtol=1e-4, atol=1e-5)
    loss = m._loss_and_metrics(b)
    loss.backward()  # gradients reach the net through logits and V, not through the targets
    assert all(p.grad is not None for p in m.net.parameters())


def _log_prob_of(uid, ep, t, n):
    return -((uid + 3 * ep + 5 * t + 7 * n) % 11) / 4.0 - 0.25


def _probe_policy(obs):
    action, value = probe.policy(obs)
    f = probe.decode(obs.cpu().numpy())
    return action, value, torch.tensor([_log_prob_of(*row) for row in f.tolist()], dtype=torch.float32)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_batches_carry_what_vtrace_recomputes_its_targets_from(device):
    """Every row's log mu, clipped reward and episode-end flags are the probe's, rows are whole rollouts in
    (rollout, step, env) order, and each rollout's s_T is the observation after its last step."""
    T, E, clip = 4, 3, 2.0
    spec = {"env": probe.ENV_ID, "backend": "gym", "kwargs": {"image": True}, "frame_stack": 4}
    cfg = GA3CConfig(env=probe.ENV_ID, env_kwargs={"image": True}, agents=2, envs_per_agent=E, t_max=T,
                     predictors=2, trainers=2, predict_batch_size=2, train_min_batch_size=2 * T * E,
                     rollout_slots=3, gamma=GAMMA, reward_clip=clip, vtrace=True, status_interval_s=0)
    shape, dtype, _ = probe_env({**spec, "num_envs": 1})
    system = GA3CSystem(cfg, spec, shape, str(dtype), _probe_policy, lambda: 0, torch.device(device)).start()
    batches = []
    try:
        deadline = time.monotonic() + 120  # a guard for a loaded machine, not a wait
        while len(batches) < 40 and time.monotonic() < deadline:
            batch = system.get_batch(timeout=5)
            if batch is not None:
                batches.append(batch)
    finally:
        system.close()
    assert len(batches) >= 40, "the system did not deliver enough batches"
    ends = 0
    for batch in batches:
        n = batch["size"]
        assert batch["next_obs"].shape == (n // T, *shape) and batch["next_obs"].is_pinned() == (device == "cuda")
        f = probe.decode(batch["obs"].numpy()).reshape(n // (T * E), T, E, 4)  # (uid, ep, t, n)
        nxt = probe.decode(batch["next_obs"].numpy()).reshape(n // (T * E), E, 4)
        fields = {k: batch[k].reshape(n // (T * E), T, E) for k in ("log_prob", "reward", "terminated", "truncated")}
        for r, tt, e in np.ndindex(f.shape[:3]):
            uid, ep, t, step = f[r, tt, e].tolist()
            assert uid == f[r, 0, e, 0] and step == f[r, 0, e, 3] + tt  # one env's consecutive steps
            assert fields["log_prob"][r, tt, e] == pytest.approx(_log_prob_of(uid, ep, t, step))
            raw = probe.raw_reward(uid, ep, t, probe.action_of(uid, ep, t, step))
            assert fields["reward"][r, tt, e] == pytest.approx(min(max(raw, -clip), clip))
            last = t + 1 == probe.episode_len(uid, ep)
            assert bool(fields["terminated"][r, tt, e]) == (last and not probe.truncates(uid, ep))
            assert bool(fields["truncated"][r, tt, e]) == (last and probe.truncates(uid, ep))
            ends += last
        for r, e in np.ndindex(nxt.shape[:2]):
            assert nxt[r, e, 0] == f[r, -1, e, 0] and nxt[r, e, 3] == f[r, -1, e, 3] + 1  # s_T follows step T-1
    assert ends > 20  # episode ends inside rollouts were seen


@pytest.mark.parametrize("reuse, per_epoch, epochs", [
    (1, 5, [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]),
    (3, 7, [[0, 0, 0, 1, 1, 1, 2], [2, 2, 3, 3, 3, 4, 4], [4, 5, 5, 5, 6, 6, 6]]),
    (2, 4, [[0, 0, 1, 1], [2, 2, 3, 3]]),
    (5, 2, [[0, 0], [0, 0], [0, 1]]),
])
def test_each_batch_is_trained_on_updates_per_batch_times_in_a_row(reuse, per_epoch, epochs):
    """``updates_per_batch``: the stream hands each trainer batch over that many times, one after the other (an
    epoch's end in between included), and every epoch counts ``updates_per_epoch`` optimizer steps."""
    from types import SimpleNamespace

    from lightning_per.ga3c.batches import BatchStream

    fetched = iter(range(100))
    m = SimpleNamespace(cfg=GA3CConfig(updates_per_batch=reuse, updates_per_epoch=per_epoch, max_time_s=60),
                        system=SimpleNamespace(get_batch=lambda timeout: {"id": next(fetched)}),
                        stats=SimpleNamespace(t0=time.monotonic()), trainer=SimpleNamespace(world_size=1))
    stream = BatchStream(m)
    assert [[b["id"] for b in stream] for _ in epochs] == epochs
    assert next(fetched) == epochs[-1][-1] + 1  # no batch was fetched and dropped


def test_updates_per_batch_below_one_names_the_field():
    with pytest.raises(ValueError, match="updates_per_batch"):
        GA3CConfig(updates_per_batch=0).validate()


def test_vtrace_with_a_policy_that_gives_no_log_prob_fails_loudly():
    """A policy returning (action, value) would leave log mu at 0 (pi/mu = pi): the system stops with an error
    naming what is missing instead of training on it."""
    spec = {"env": "CartPole-v1", "backend": "gym", "kwargs": {}, "frame_stack": 4}
    cfg = GA3CConfig(agents=1, envs_per_agent=2, vtrace=True, status_interval_s=0)
    shape, dtype, _ = probe_env({**spec, "num_envs": 1})

    def two_tensors(obs):
        return torch.zeros(obs.shape[0], dtype=torch.int64), torch.zeros(obs.shape[0])

    system = GA3CSystem(cfg, spec, shape, str(dtype), two_tensors, lambda: 0, torch.device("cpu")).start()
    try:
        assert system.get_batch(timeout=60) is None  # stopped, not a batch with log mu = 0
    finally:
        system.close()
    assert isinstance(system.error, ValueError) and "log_prob" in str(system.error)


def test_clip_errors_state_the_open_bound():
    with pytest.raises(ValueError, match=r"vtrace_rho_clip must be > 0.0, got 0"):
        GA3CConfig(vtrace_rho_clip=0).validate()
    with pytest.raises(ValueError, match=r"vtrace_c_clip must be > 0.0, got -1"):
        GA3CConfig(vtrace_c_clip=-1).validate()


def test_policy_lag_quantiles_count_every_transition():
    """Stats' histogram of per-transition lags: its quantiles are NumPy's lower (inverted-CDF) quantiles of the
    lags themselves, over the whole run and over a snapshot window; lags past the histogram land in its last bin."""
    from lightning_per.actors.stats import LAG_BINS, Stats, lag_quantile, rates

    rng = np.random.default_rng(0)
    batches = [rng.geometric(0.1, size=160) - 1 for _ in range(50)]  # lags 0, 1, 2, ... (updates)
    stats = Stats()
    for lags in batches[:20]:
        stats.add_update(lags.size, float(lags.mean()), lags)
    a = stats.snapshot()
    for lags in batches[20:]:
        stats.add_update(lags.size, float(lags.mean()), lags)
    b = stats.snapshot()
    everything, window = np.concatenate(batches), np.concatenate(batches[20:])
    for q in (0.5, 0.95, 0.99):
        assert lag_quantile(b.lag_hist, q) == np.quantile(everything, q, method="inverted_cdf")
    assert rates(a, b)["policy_lag_p95"] == np.quantile(window, 0.95, method="inverted_cdf")
    assert rates(a, b)["policy_lag"] == pytest.approx(window.mean())
    stats.add_update(2, 1e6, np.array([10**6, 10**6]))
    assert stats.snapshot().lag_hist[-1] == 2 and lag_quantile(np.zeros(LAG_BINS, np.int64), 0.95) != 0.0


def test_batch_reuse_without_vtrace_warns():
    obs = (4, 36, 36)
    with mock.patch.object(ga3c_module, "probe_env", lambda spec: (obs, np.dtype("uint8"), 6)):
        with pytest.warns(UserWarning, match="updates_per_batch=2 without vtrace"):
            GA3C(GA3CConfig(network="conv", updates_per_batch=2, status_interval_s=0))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            GA3C(GA3CConfig(network="conv", updates_per_batch=2, vtrace=True, status_interval_s=0))
