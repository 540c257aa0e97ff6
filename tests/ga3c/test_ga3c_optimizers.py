"""GA3C's optimizers against NumPy models of their published updates: torch's RMSprop (square average started at 0)
and Adam with ``adam_betas: [0.0, alpha]``, which is RMSProp with a bias-corrected square average (Kingma & Ba 2015,
algorithm 1); the first step of the one is 1 / sqrt(1 - alpha) times the other's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_per.actors.envs import TOY_ENV_ID
from lightning_per.ga3c.config import GA3CConfig
from lightning_per.ga3c.module import GA3C

LR, ALPHA, EPS = 7e-4, 0.99, 1e-5


def _rmsprop_numpy(p, grads, bias_corrected: bool):
    """Non-centred RMSProp without momentum: v <- alpha v + (1 - alpha) g^2 (v_0 = 0), p <- p - lr g / (sqrt(v') + eps)
    with v' = v (torch's RMSprop) or v / (1 - alpha^t) (Adam with beta1 = 0, beta2 = alpha)."""
    p, v, out = p.copy(), np.zeros_like(p), []
    for t, g in enumerate(grads, start=1):
        v = ALPHA * v + (1 - ALPHA) * g * g
        vhat = v / (1 - ALPHA**t) if bias_corrected else v
        p = p - LR * g / (np.sqrt(vhat) + EPS)
        out.append(p.copy())
    return out


def _steps(module, grads):
    opt = module.make_optimizer()
    params = list(module.net.parameters())
    out = []
    for g in grads:  # g: the gradient of the parameters concatenated in order
        start = 0
        for q in params:
            q.grad = torch.from_numpy(g[start:start + q.numel()].reshape(q.shape)).to(q.dtype)
            start += q.numel()
        opt.step()
        out.append(np.concatenate([q.detach().double().numpy().ravel() for q in params]))
    return opt, out


@pytest.mark.parametrize("optimizer, betas, bias_corrected", [("rmsprop", None, False), ("adam", [0.0, ALPHA], True)])
def test_the_optimizers_follow_their_numpy_model(optimizer, betas, bias_corrected):
    cfg = dict(env=TOY_ENV_ID, hidden_sizes=[8], optimizer=optimizer, lr=LR, rmsprop_alpha=ALPHA, rmsprop_eps=EPS,
               adam_eps=EPS, device="cpu")
    if betas is not None:
        cfg["adam_betas"] = betas
    module = GA3C(GA3CConfig(**cfg))
    p0 = np.concatenate([q.detach().double().numpy().ravel() for q in module.net.parameters()])
    rng = np.random.default_rng(0)
    grads = [rng.normal(scale=1e-2, size=p0.size) for _ in range(6)]
    opt, got = _steps(module, grads)
    if optimizer == "adam":
        assert isinstance(opt, torch.optim.Adam) and opt.param_groups[0]["betas"] == (0.0, ALPHA)
    want = _rmsprop_numpy(p0, grads, bias_corrected)
    for t, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-6, err_msg=f"step {t + 1}")


def test_torch_rmsprops_first_step_is_ten_times_the_bias_corrected_one():
    rng = np.random.default_rng(1)
    p0, g = rng.normal(size=1000), [rng.normal(size=1000)]
    big = np.abs(g[0]) > 1e4 * EPS  # where eps is negligible beside |g| and 0.1 |g|: a sign step
    plain = np.abs(_rmsprop_numpy(p0, g, False)[0] - p0)[big]
    corrected = np.abs(_rmsprop_numpy(p0, g, True)[0] - p0)[big]
    assert big.mean() > 0.8
    np.testing.assert_allclose(corrected, LR, rtol=1e-2)  # lr |g| / (|g| + eps)
    np.testing.assert_allclose(plain / corrected, 1 / np.sqrt(1 - ALPHA), rtol=1e-2)  # 10x at alpha 0.99


@pytest.mark.parametrize("betas", [[1.0, 0.5], [0.9], [0.9, -0.1], "0.9,0.99", [True, 0.5], [0.9, float("nan")]])
def test_bad_adam_betas_are_refused_naming_the_field(betas):
    with pytest.raises(ValueError, match=r"^adam_betas must be two numbers in \[0, 1\)") as err:
        GA3CConfig(adam_betas=betas).validate()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("optimizer", ["rmsprop", "rmsprop_tf"])
def test_adam_betas_without_adam_are_refused_naming_both_fields(optimizer):
    GA3CConfig(optimizer=optimizer).validate()  # the default betas: nothing to say
    with pytest.raises(ValueError, match=r"^adam_betas=\[0.0, 0.99\] is an option of optimizer: adam \(optimizer is "
                                         rf"'{optimizer}'\)"):
        GA3CConfig(optimizer=optimizer, adam_betas=[0.0, 0.99]).validate()
