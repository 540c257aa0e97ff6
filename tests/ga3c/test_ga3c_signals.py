"""GA3C's conv net and loss checked against independent sources: layer shapes computed by hand from the
A3C architecture, the forward pass recomputed with torch.nn.functional on pixels / 255, the init's
defining properties (orthogonality, gains), and the loss's effect on the policy and value after one
gradient step (what the policy-gradient theorem asks of it), not its formula."""

import math

import pytest
import torch
import torch.nn.functional as F

from lightning_per.ga3c.loss import a3c_loss
from lightning_per.ga3c.networks import A3CConvNet


def test_conv_net_is_the_a3c_architecture():
    net = A3CConvNet(4, 6)
    conv1, conv2, fc = net.trunk[0], net.trunk[2], net.fc[0]
    assert conv1.weight.shape == (16, 4, 8, 8) and conv1.stride == (4, 4)
    assert conv2.weight.shape == (32, 16, 4, 4) and conv2.stride == (2, 2)
    side = ((84 - 8) // 4 + 1 - 4) // 2 + 1  # 84 -> 20 -> 9
    assert fc.weight.shape == (256, 32 * side * side) == (256, 2592)
    assert net.policy.weight.shape == (6, 256) and net.value.weight.shape == (1, 256)


def test_pixels_are_scaled_by_1_over_255_exactly_once():
    torch.manual_seed(0)
    net = A3CConvNet(4, 6)
    pixels = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    x = pixels.double() / 255.0  # by hand, in float64
    w = {k: v.double() for k, v in net.state_dict().items()}
    h = F.relu(F.conv2d(x, w["trunk.0.weight"], w["trunk.0.bias"], stride=4))
    h = F.relu(F.conv2d(h, w["trunk.2.weight"], w["trunk.2.bias"], stride=2))
    h = F.relu(F.linear(h.flatten(1), w["fc.0.weight"], w["fc.0.bias"]))
    logits, value = net(pixels)
    torch.testing.assert_close(logits.double(), F.linear(h, w["policy.weight"], w["policy.bias"]),
                               rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(value.double(), F.linear(h, w["value.weight"], w["value.bias"]).squeeze(1),
                               rtol=1e-4, atol=1e-6)
    logits_f, _ = net(pixels.float() / 255.0)  # float input in [0, 1] is taken as is
    torch.testing.assert_close(logits_f, logits)


def test_conv_net_init_is_orthogonal_with_a2c_gains_and_a_uniform_policy():
    torch.manual_seed(0)
    net = A3CConvNet(4, 6)
    for layer, gain in ((net.trunk[0], math.sqrt(2)), (net.trunk[2], math.sqrt(2)), (net.fc[0], math.sqrt(2)),
                        (net.policy, 0.01), (net.value, 1.0)):
        w = layer.weight.detach().flatten(1).double()  # (out, in), out <= in: orthonormal rows x gain
        torch.testing.assert_close(w @ w.T, gain**2 * torch.eye(w.shape[0], dtype=torch.float64), atol=1e-5 * gain**2,
                                   rtol=1e-5)
        assert torch.all(layer.bias == 0)
    logits, _ = net(torch.randint(0, 256, (64, 4, 84, 84), dtype=torch.uint8))
    p = torch.softmax(logits, -1)
    entropy = -(p * p.log()).sum(-1)
    assert entropy.min() > math.log(6) - 1e-3  # near-uniform initial policy on any frame


def _one_step(advantage, beta=0.0, lr=0.1):
    """One SGD step of the loss on free logits/value for a single transition (action 1 of 3)."""
    torch.manual_seed(0)
    logits = torch.randn(1, 3, requires_grad=True)
    value = torch.tensor([0.5], requires_grad=True)
    ret = value.detach() + advantage
    loss, _ = a3c_loss(logits, value, torch.tensor([1]), ret, beta=beta, value_coef=1.0)
    loss.backward()
    with torch.no_grad():
        new_logits, new_value = logits - lr * logits.grad, value - lr * value.grad
    return torch.softmax(logits.detach(), -1), torch.softmax(new_logits, -1), value.detach(), new_value, ret


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_policy_step_follows_the_sign_of_the_advantage(advantage):
    before, after, *_ = _one_step(advantage)
    assert (after[0, 1] - before[0, 1]) * advantage > 0  # better than expected: more likely, and vice versa


def test_entropy_bonus_increases_entropy_and_value_moves_towards_the_return():
    def entropy(p):
        return float(-(p * p.log()).sum())

    before, after, v0, v1, ret = _one_step(0.0, beta=0.5)
    assert entropy(after) > entropy(before)
    _, _, v0, v1, ret = _one_step(2.0)
    assert abs(float(ret - v1)) < abs(float(ret - v0))
