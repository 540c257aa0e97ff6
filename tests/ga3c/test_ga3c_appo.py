"""The APPO-style learner (``loss: appo``): PPO's clipped objective over V-trace advantages against a NumPy model
and hand-checked clipping cases, the target network's ratio, advantage normalisation, the schedules (lr by torch's
LambdaLR, entropy weight on the device), Adam's epsilon and the logged clip fraction in a real run, bad settings refused
naming the field.
About 15 s on 2 cores (one short real run with agent processes)."""

import math

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from test_ga3c_vtrace import _random_rollouts, _vtrace_model

from lightning_per.actors.envs import TOY_ENV_ID
from lightning_per.ga3c.config import GA3CConfig
from lightning_per.ga3c.loss import a3c_loss, appo_loss, normalize_advantage, vtrace_targets
from lightning_per.ga3c.module import GA3C

GAMMA = 0.9


def _ppo_clip_np(log_pi, log_mu, adv, eps, log_target=None):
    """PPO eq. 7's per-sample objective min(r A, clip(r, 1-eps, 1+eps) A), r = pi/mu; with a target network RLlib's
    APPO ratio r = clip(mu/pi_target, 0, 2) pi/mu. Float64 NumPy."""
    r = np.exp(log_pi - log_mu)
    if log_target is not None:
        r = r * np.clip(np.exp(log_mu - log_target), 0.0, 2.0)
    return np.minimum(r * adv, np.clip(r, 1.0 - eps, 1.0 + eps) * adv), r


def _entropy_np(logits, log_epsilon=1e-6):
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    return -(p * np.log(np.maximum(p, log_epsilon))).sum(axis=1), np.log(p)


@pytest.mark.parametrize("with_target", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_clipped_loss_with_vtrace_advantages_matches_numpy(seed, with_target):
    R, T, E, A = 3, 6, 4, 3
    ro = _random_rollouts(seed, R, T, E)
    g = torch.Generator().manual_seed(100 + seed)
    n = R * T * E
    logits = torch.randn(n, A, generator=g, dtype=torch.float64, requires_grad=True)
    action = torch.randint(0, A, (n,), generator=g)
    value = ro["value"].double()
    log_pi = torch.log_softmax(logits.detach(), -1).gather(1, action[:, None]).squeeze(1)  # time-major rows
    log_mu = log_pi + 0.6 * torch.randn(n, generator=g, dtype=torch.float64)  # ratios on both sides of the clip
    log_target = log_mu + 0.8 * torch.randn(n, generator=g, dtype=torch.float64) if with_target else None

    def rtte(t):
        return t.reshape(R, T, E)

    v, adv = vtrace_targets(rtte(log_pi), rtte(log_mu), value, ro["bootstrap"].double(), ro["reward"].double(),
                            ro["terminated"], ro["truncated"], GAMMA, 1.0, 1.0)
    v_np, adv_np = _vtrace_model(rtte(log_pi), rtte(log_mu), value, ro["bootstrap"], ro["reward"], ro["terminated"],
                                 ro["truncated"], GAMMA, 1.0, 1.0)
    # IMPALA eq. 1, independently (TorchRL's recursion keeps float32 constants: agreement to ~1e-7)
    np.testing.assert_allclose(adv.numpy(), adv_np, rtol=1e-6, atol=1e-6)
    beta, clip = 0.05, 0.2
    loss, parts = appo_loss(logits, value.flatten(), action, v.flatten(), adv.flatten(), log_mu, clip=clip,
                            log_target=log_target, beta=beta, value_coef=0.5)
    surrogate, r = _ppo_clip_np(log_pi.numpy(), log_mu.numpy(), adv_np.flatten(), clip,
                                None if log_target is None else log_target.numpy())
    entropy, _ = _entropy_np(logits.detach().numpy())
    policy = np.mean(-surrogate - beta * entropy)
    value_loss = np.mean(0.5 * (v_np.flatten() - value.flatten().numpy()) ** 2)
    assert float(parts["policy_loss"]) == pytest.approx(policy, rel=1e-6, abs=1e-9)
    assert float(parts["value_loss"]) == pytest.approx(value_loss, rel=1e-6)
    assert float(loss.detach()) == pytest.approx(policy + 0.5 * value_loss, rel=1e-6)
    assert float(parts["clip_frac"]) == pytest.approx(np.mean(np.abs(r - 1.0) > clip))
    assert 0.0 < float(parts["clip_frac"]) < 1.0  # the batch had clipped and unclipped samples


def test_hand_checked_clipping_cases():
    # action 0 in every row; pi(0) and mu(0) give r = 1.5, 0.5, 1.5, 0.5, 1.0; eps = 0.2
    pi = torch.tensor([0.6, 0.3, 0.6, 0.3, 0.5], dtype=torch.float64)
    mu = torch.tensor([0.4, 0.6, 0.4, 0.6, 0.5], dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, 2.0], dtype=torch.float64)
    logits = torch.stack([pi.log(), (1 - pi).log()], 1).requires_grad_(True)
    zeros, action = torch.zeros(5, dtype=torch.float64), torch.zeros(5, dtype=torch.long)
    loss, parts = appo_loss(logits, zeros, action, zeros, adv, mu.log(), clip=0.2, beta=0.0)
    # min(rA, clip(r)A): 1.5 -> 1.2 (clipped), 0.5 (not), min(-1.5, -1.2) = -1.5 (not), min(-0.5, -0.8) = -0.8
    # (clipped), 1.0 * 2 = 2 (inside the band): policy loss -(1.2 + 0.5 - 1.5 - 0.8 + 2) / 5
    assert float(parts["policy_loss"]) == pytest.approx(-0.28, abs=1e-12)
    assert float(parts["clip_frac"]) == pytest.approx(0.8)
    (grad,) = torch.autograd.grad(loss, logits)
    # d(-r A)/d logit_0 = -A r (1 - pi0) per unclipped row (then / 5); clipped rows: no gradient
    want0 = torch.tensor([0.0, -0.5 * 0.7, 1.5 * 0.4, 0.0, -2.0 * 1.0 * 0.5], dtype=torch.float64) / 5
    torch.testing.assert_close(grad[:, 0], want0, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad[:, 1], -want0, rtol=0, atol=1e-12)


def test_target_network_ratio_is_clamped_at_two():
    # pi = mu: r = clip(mu / pi_target, 0, 2); mu / pi_target = 3 -> 2, = 0.5 -> 0.5
    pi = torch.tensor([0.6, 0.6], dtype=torch.float64)
    logits = torch.stack([pi.log(), (1 - pi).log()], 1)
    target = torch.tensor([0.2, 1.2], dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0], dtype=torch.float64)
    zeros, action = torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.long)
    _, parts = appo_loss(logits, zeros, action, zeros, adv, pi.log(), clip=0.2, log_target=target.log(), beta=0.0)
    # r = 2 -> min(2, 1.2) = 1.2; r = 0.5 -> min(0.5, 0.8) = 0.5
    assert float(parts["policy_loss"]) == pytest.approx(-(1.2 + 0.5) / 2, abs=1e-12)


def test_clip_frac_counts_only_the_transitions_the_lag_bound_keeps():
    rng = np.random.default_rng(3)
    n, clip = 64, 0.2
    log_pi, log_mu = rng.normal(-1.0, 0.3, n), rng.normal(-1.0, 0.3, n)
    w = (rng.random(n) > 0.4) * rng.random(n)  # about 40% dropped (weight 0), the rest down-weighted
    logits = torch.from_numpy(np.stack([log_pi, np.log1p(-np.exp(log_pi))], 1))  # pi(a=0) = exp(log_pi)
    zeros, action = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.long)
    _, parts = appo_loss(logits, zeros, action, zeros, torch.ones(n, dtype=torch.float64), torch.from_numpy(log_mu),
                         clip=clip, beta=0.0, weight=torch.from_numpy(w))
    clipped = np.abs(np.exp(log_pi - log_mu) - 1.0) > clip  # NumPy's count, over the kept transitions
    assert float(parts["clip_frac"]) == pytest.approx(clipped[w > 0].sum() / (w > 0).sum(), abs=1e-12)
    assert clipped[w > 0].mean() != pytest.approx(clipped.mean())  # the test tells the two counts apart


def test_logged_advantage_is_the_mean_over_the_transitions_the_lag_bound_keeps():
    """A dropped transition's normalised advantage can be any size (its batch's mean and std are the kept ones');
    the logged mean is NumPy's over weight > 0, for both losses."""
    rng = np.random.default_rng(5)
    n = 32
    adv = rng.normal(0.0, 1.0, n)
    w = (rng.random(n) > 0.3) * rng.uniform(0.5, 1.0, n)  # about 30% dropped, the rest down-weighted
    adv[w == 0] = 1e6  # what a dropped transition can carry
    logits = torch.from_numpy(rng.normal(size=(n, 3)))
    zeros, action = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.long)
    a, weight = torch.from_numpy(adv), torch.from_numpy(w)
    _, parts = appo_loss(logits, zeros, action, zeros, a, torch.full((n,), -1.0, dtype=torch.float64), clip=0.2,
                         beta=0.0, weight=weight)
    assert float(parts["advantage"]) == pytest.approx(adv[w > 0].mean(), abs=1e-12)
    _, parts = a3c_loss(logits, zeros, action, zeros, advantage=a, weight=weight)
    assert float(parts["advantage"]) == pytest.approx(adv[w > 0].mean(), abs=1e-12)
    _, parts = a3c_loss(logits, zeros, action, zeros, advantage=a)  # no bound: every transition
    assert float(parts["advantage"]) == pytest.approx(adv.mean(), rel=1e-12)


@pytest.mark.parametrize("weighted", [False, True])
def test_normalized_advantages_match_numpy(weighted):
    rng = np.random.default_rng(0)
    adv = rng.normal(3.0, 2.0, size=40)
    w = (rng.random(40) > 0.3) * rng.random(40) if weighted else np.ones(40)
    got = normalize_advantage(torch.from_numpy(adv), torch.from_numpy(w) if weighted else None).numpy()
    kept = adv[w > 0]
    want = (adv - kept.mean()) / (kept.std() + 1e-8)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert got[w > 0].mean() == pytest.approx(0.0, abs=1e-12) and got[w > 0].std() == pytest.approx(1.0, rel=1e-6)


# ---- config ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, message", [
    (dict(loss="appo"), r"^loss='appo' needs vtrace: true"),
    (dict(loss="ppo"), r"^loss must be one of \('a3c', 'appo'\), got 'ppo'$"),
    (dict(loss="appo", vtrace=True, ppo_clip=1.0), r"^ppo_clip must be in \(0.0, 1.0\), got 1.0$"),
    (dict(appo_target_update=4), r"^appo_target_update=4 is an option of loss: appo"),
    (dict(loss="appo", vtrace=True, appo_target_update=0), r"^appo_target_update must be an int >= 1"),
    (dict(lr_final=0.0), r"^lr_final / beta_final need anneal_updates"),
    (dict(anneal_updates=10, beta_final=-0.1), r"^beta_final must be >= 0.0"),
    (dict(adam_eps=0.0), r"^adam_eps must be > 0.0"),
    (dict(normalize_advantage=1), r"^normalize_advantage must be true or false"),
])
def test_bad_appo_settings_are_refused_naming_the_field(kw, message):
    with pytest.raises(ValueError, match=message) as err:
        GA3CConfig(**kw).validate()
    assert "\n" not in str(err.value)


# ---- a real run: target network refreshed, schedules followed, Adam's eps --------------------------------

class _Recording(GA3C):
    """Records at each update: the policy version, the optimizer's lr, the entropy weight on the device, the network
    and the target network as the update sees them."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.records = []

    def training_step(self, batch, batch_idx):
        with torch.no_grad():  # PPO's clipped count of this update, in NumPy (float64), from the nets' outputs
            log_pi, log_target = (np.log(torch.softmax(net(batch["obs"])[0].double(), -1).gather(
                1, batch["action"][:, None]).squeeze(1).numpy()) for net in (self.net, self.target_net))
        log_mu = batch["log_prob"].double().numpy()
        ratio = np.exp(log_pi - log_mu) * np.clip(np.exp(log_mu - log_target), 0.0, 2.0)
        self.records.append({
            "u": self.policy_version, "lr": self.optimizers().param_groups[0]["lr"], "beta": float(self.beta_now),
            "net": [p.detach().clone() for p in self.net.parameters()],
            "target": [p.detach().clone() for p in self.target_net.parameters()],
            "clip_frac": np.mean(np.abs(ratio - 1.0) > self.cfg.ppo_clip)})
        return super().training_step(batch, batch_idx)


def test_a_run_refreshes_the_target_network_and_follows_the_schedules():
    K, N, LR, BETA = 3, 10, 1e-3, 0.02
    cfg = GA3CConfig(env=TOY_ENV_ID, agents=2, envs_per_agent=2, t_max=3, train_min_batch_size=12, hidden_sizes=[16],
                     vtrace=True, loss="appo", appo_target_update=K, normalize_advantage=True, optimizer="adam",
                     adam_eps=1e-5, lr=LR, anneal_updates=N, lr_final=0.0, beta=BETA, beta_final=0.0, max_updates=14,
                     updates_per_epoch=7, max_time_s=60, status_interval_s=0, device="cpu", ppo_clip=1e-4)
    model = _Recording(cfg)
    pl.Trainer(accelerator="cpu", devices=1, max_epochs=-1, logger=False, enable_progress_bar=False,
               enable_checkpointing=False, enable_model_summary=False).fit(model)
    assert [r["u"] for r in model.records] == list(range(14))
    nets = {r["u"]: r["net"] for r in model.records}
    for r in model.records:
        u = r["u"]
        frac = min(u, N) / N
        assert r["lr"] == pytest.approx(LR * (1 - frac), abs=1e-15)
        assert r["beta"] == pytest.approx(BETA * (1 - frac), abs=1e-9)
        refreshed = nets[u - u % K]  # the network as it was after the last multiple of K updates
        assert all(torch.equal(t, n) for t, n in zip(r["target"], refreshed)), u
    # the target lags: at update 4 it is the network after 3 updates, which the 4th (lr > 0) moved
    assert not all(torch.equal(t, n) for t, n in zip(model.records[4]["target"], model.records[4]["net"]))
    assert all(torch.equal(a, b) for a, b in zip(nets[12], nets[13]))  # lr 0 after N updates: nothing moves
    opt = model.trainer.optimizers[0]
    assert isinstance(opt, torch.optim.Adam) and opt.param_groups[0]["eps"] == 1e-5
    assert {id(p) for p in opt.param_groups[0]["params"]} == {id(p) for p in model.net.parameters()}
    assert math.isfinite(model.system_summary["updates"])
    # clip_frac is logged with the loss metrics: the mean over the updates of each one's NumPy count (no callback
    # here resets the metrics between epochs)
    want = np.mean([r["clip_frac"] for r in model.records])
    # ppo_clip 1e-4, whatever the agents' timing: at updates 0, 3, 6, 9, 12, 13 the target is the network, so every
    # ratio is pi / mu * mu / pi = 1 up to float32 rounding (inside the band); at updates 1 and 2 it is pi / target,
    # which one or two Adam steps of lr 1e-3 moved far more than 1e-4
    assert 0.0 < want < 1.0
    assert float(model.metrics.compute()["clip_frac"]) == pytest.approx(want, abs=1e-6)
