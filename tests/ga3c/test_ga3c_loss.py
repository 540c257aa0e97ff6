"""GA3C loss (section 3.2, LOG_EPSILON), RMSProp with TF semantics, and the networks."""

import math

import numpy as np
import pytest
import torch

from lightning_per.ga3c.loss import a3c_loss
from lightning_per.ga3c.networks import A3CConvNet, MinAtarConvNet, MLPActorCritic, make_network
from lightning_per.ga3c.optim import RMSpropTF


def test_loss_matches_formula():
    torch.manual_seed(0)
    logits = torch.randn(4, 3, requires_grad=True)
    value = torch.randn(4, requires_grad=True)
    action = torch.tensor([0, 2, 1, 2])
    ret = torch.randn(4)
    loss, parts = a3c_loss(logits, value, action, ret, beta=0.1, value_coef=0.5)
    p = torch.softmax(logits, -1)
    adv = ret - value.detach()
    ent = -(p * p.log()).sum(-1)
    policy = (-(p[torch.arange(4), action].log() * adv) - 0.1 * ent).mean()
    expected = policy + 0.5 * (0.5 * (ret - value) ** 2).mean()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(parts["entropy"], ent.mean().detach())
    loss_sum, _ = a3c_loss(logits, value, action, ret, beta=0.1, value_coef=0.5, reduction="sum")
    torch.testing.assert_close(loss_sum, loss * 4)


def test_value_is_detached_in_the_advantage():
    logits = torch.zeros(2, 2, requires_grad=True)
    value = torch.tensor([1.0, 2.0], requires_grad=True)
    ret = torch.tensor([3.0, 3.0])
    loss, _ = a3c_loss(logits, value, torch.tensor([0, 1]), ret, beta=0.0, value_coef=0.0)
    loss.backward()
    assert value.grad is None or torch.all(value.grad == 0)


def test_log_epsilon_keeps_underflowed_probabilities_finite():
    logits = torch.tensor([[200.0, -200.0]], requires_grad=True)  # pi(a=1) underflows to 0
    loss, _ = a3c_loss(logits, torch.zeros(1), torch.tensor([1]), torch.ones(1), beta=0.01, log_epsilon=1e-6)
    loss.backward()
    assert torch.isfinite(loss)
    assert math.isclose(loss.item(), -math.log(1e-6) * 1.0 - 0.01 * 0.0 + 0.5, rel_tol=1e-4)
    assert torch.isfinite(logits.grad).all()


@pytest.mark.parametrize("kw, name", [(dict(reduction="max"), "reduction"),
                                      (dict(ret=torch.zeros(3)), "ret")])
def test_loss_bad_inputs(kw, name):
    args = dict(logits=torch.zeros(2, 2), value=torch.zeros(2), action=torch.zeros(2, dtype=torch.long),
                ret=torch.zeros(2))
    args.update(kw)
    with pytest.raises(ValueError, match=name):
        a3c_loss(**args)


def test_rmsprop_tf_matches_hand_computed_steps():
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = RMSpropTF([p], lr=0.1, alpha=0.9, eps=0.1)
    ms = torch.ones(2)
    expected = p.detach().clone()
    for g in (torch.tensor([0.5, -1.0]), torch.tensor([2.0, 0.1])):
        p.grad = g.clone()
        opt.step()
        ms = 0.9 * ms + 0.1 * g * g
        expected = expected - 0.1 * g / torch.sqrt(ms + 0.1)
        torch.testing.assert_close(p.detach(), expected)
    # torch's RMSprop (square avg from 0, eps outside the sqrt) takes a different first step
    q = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    torch_opt = torch.optim.RMSprop([q], lr=0.1, alpha=0.9, eps=0.1)
    q.grad = torch.tensor([0.5, -1.0])
    torch_opt.step()
    first_tf = torch.tensor([1.0, -2.0]) - 0.1 * torch.tensor([0.5, -1.0]) / torch.sqrt(
        0.9 + 0.1 * torch.tensor([0.25, 1.0]) + 0.1)
    assert not torch.allclose(q.detach(), first_tf)


def test_rmsprop_tf_momentum_and_centered_run():
    p = torch.nn.Parameter(torch.ones(3))
    opt = RMSpropTF([p], lr=0.01, momentum=0.9, centered=True)
    for _ in range(3):
        p.grad = torch.ones(3)
        opt.step()
    assert torch.all(p < 1.0)


@pytest.mark.parametrize("kw, name", [(dict(lr=0.0), "lr"), (dict(alpha=1.0), "alpha"),
                                      (dict(eps=0.0), "eps"), (dict(momentum=-1.0), "momentum")])
def test_rmsprop_tf_bad_args(kw, name):
    with pytest.raises(ValueError, match=name):
        RMSpropTF([torch.nn.Parameter(torch.ones(1))], **kw)


def test_networks_shapes():
    mlp = make_network("auto", (4,), 2, [16])
    assert isinstance(mlp, MLPActorCritic)
    logits, v = mlp(torch.zeros(5, 4))
    assert logits.shape == (5, 2) and v.shape == (5,)
    conv = make_network("auto", (4, 84, 84), 6)
    assert isinstance(conv, A3CConvNet)
    logits, v = conv(torch.zeros(2, 4, 84, 84, dtype=torch.uint8))
    assert logits.shape == (2, 6) and v.shape == (2,)
    with pytest.raises(ValueError, match="conv"):
        make_network("conv", (4,), 2)


def test_minatar_net_is_the_papers_network_on_channels_last_frames():
    """Young & Tian 2019 (section 4): conv 16 x 3x3 stride 1 (valid), ReLU, FC 128, ReLU; heads. The forward is
    checked against a NumPy model that reads MinAtar's (H, W, C) bool frame directly."""
    torch.manual_seed(0)
    net = make_network("auto", (10, 10, 4), 3)  # MinAtar Breakout's observation: auto picks the paper's net
    assert isinstance(net, MinAtarConvNet)
    # parameters of that architecture, counted by hand: conv 4*16*9+16, FC (16*8*8)*128+128, heads 128*3+3, 128+1
    assert sum(p.numel() for p in net.parameters()) == 592 + 131_200 + 387 + 129
    frames = torch.rand(5, 10, 10, 4) < 0.2  # [N, H, W, C] bool
    logits, value = net(frames)
    assert logits.shape == (5, 3) and value.shape == (5,) and logits.dtype == torch.float32
    w = {k: v.detach().double().numpy() for k, v in net.state_dict().items()}
    x = frames.double().numpy()
    conv = np.zeros((5, 16, 8, 8))  # [N, 16, H-2, W-2]
    for i in range(8):
        for j in range(8):
            patch = x[:, i:i + 3, j:j + 3, :]  # [N, 3, 3, C]
            conv[:, :, i, j] = np.einsum("nhwc,ochw->no", patch, w["conv.weight"]) + w["conv.bias"]
    h = np.maximum(np.maximum(conv, 0).reshape(5, -1) @ w["fc.weight"].T + w["fc.bias"], 0)  # [N, 128]
    np.testing.assert_allclose(logits.detach().numpy(), h @ w["policy.weight"].T + w["policy.bias"], atol=1e-5)
    np.testing.assert_allclose(value.detach().numpy(), (h @ w["value.weight"].T + w["value.bias"])[:, 0], atol=1e-5)
    with pytest.raises(ValueError, match="minatar"):
        make_network("minatar", (4, 10, 12), 3)
    with pytest.raises(ValueError, match="n_actions"):
        MinAtarConvNet(4, 0)
