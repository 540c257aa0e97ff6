"""DQN math against hand-computed values: n-step returns, (double) DQN targets, weighted Huber loss."""

from __future__ import annotations

import pytest
import torch

from lightning_per.dqn.targets import (
    dqn_target,
    hard_update,
    linear_schedule,
    n_step_return,
    polyak_update,
    weighted_huber_loss,
)

G = 0.9


def _col(*values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)[:, None]  # [n, 1]: one environment


def test_n_step_return_mid_episode_bootstraps_after_n_steps():
    ret, disc, last = n_step_return(_col(1.0, 2.0, 3.0), _col(0, 0, 0, dtype=torch.bool),
                                    _col(0, 0, 0, dtype=torch.bool), G)
    assert ret.item() == pytest.approx(1.0 + 0.9 * 2.0 + 0.81 * 3.0)  # 5.23
    assert disc.item() == pytest.approx(0.9 ** 3)  # 0.729
    assert last.item() == 2


def test_n_step_return_stops_at_termination_without_bootstrap():
    # episode terminates at the 2nd step: the 3rd reward belongs to the next episode
    ret, disc, last = n_step_return(_col(1.0, 2.0, 100.0), _col(0, 1, 0, dtype=torch.bool),
                                    _col(0, 1, 0, dtype=torch.bool), G)
    assert ret.item() == pytest.approx(1.0 + 0.9 * 2.0)  # 2.8
    assert disc.item() == 0.0
    assert last.item() == 1


def test_n_step_return_truncation_bootstraps_from_the_final_observation():
    # time limit at the 1st step: done but not terminated -> bootstrap with gamma^1
    ret, disc, last = n_step_return(_col(4.0, 50.0, 60.0), _col(1, 0, 0, dtype=torch.bool),
                                    _col(0, 0, 0, dtype=torch.bool), G)
    assert ret.item() == pytest.approx(4.0)
    assert disc.item() == pytest.approx(0.9)
    assert last.item() == 0


def test_n_step_return_batched_and_n_equal_one():
    reward = torch.tensor([[1.0, 2.0], [10.0, 20.0]])  # [n=2, E=2]
    done = torch.tensor([[False, True], [False, False]])
    term = torch.tensor([[False, True], [False, False]])
    ret, disc, last = n_step_return(reward, done, term, 0.5)
    torch.testing.assert_close(ret, torch.tensor([1.0 + 0.5 * 10.0, 2.0]))
    torch.testing.assert_close(disc, torch.tensor([0.25, 0.0]))
    torch.testing.assert_close(last, torch.tensor([1, 0]))
    ret1, disc1, _ = n_step_return(reward[:1], done[:1], term[:1], 0.5)  # 1-step TD
    torch.testing.assert_close(ret1, torch.tensor([1.0, 2.0]))
    torch.testing.assert_close(disc1, torch.tensor([0.5, 0.0]))


def test_double_dqn_target_uses_online_argmax_and_target_value():
    next_q_online = torch.tensor([[1.0, 5.0, 2.0], [3.0, 0.0, 1.0]])  # argmax: 1, 0
    next_q_target = torch.tensor([[10.0, 20.0, 30.0], [7.0, 8.0, 9.0]])
    ret = torch.tensor([1.0, 2.0])
    disc = torch.tensor([0.5, 0.0])
    y = dqn_target(next_q_target, ret, disc, next_q_online)
    torch.testing.assert_close(y, torch.tensor([1.0 + 0.5 * 20.0, 2.0]))  # 11, 2 (terminal)
    y_vanilla = dqn_target(next_q_target, ret, disc)  # max over the target network
    torch.testing.assert_close(y_vanilla, torch.tensor([1.0 + 0.5 * 30.0, 2.0]))


def test_weighted_huber_loss_hand_computed_and_gradient():
    q = torch.tensor([0.0, 0.0, 1.0], requires_grad=True)
    y = torch.tensor([0.5, 3.0, 1.0])  # td 0.5 (quadratic), 3.0 (linear), 0
    w = torch.tensor([1.0, 0.5, 2.0])
    loss, td = weighted_huber_loss(q, y, w, delta=1.0)
    expected = (1.0 * 0.5 * 0.25 + 0.5 * (3.0 - 0.5) + 2.0 * 0.0) / 3
    assert loss.item() == pytest.approx(expected)
    torch.testing.assert_close(td, torch.tensor([0.5, 3.0, 0.0]))
    loss.backward()
    # d/dq of w * huber(y - q) / B = -w * clip(td, -1, 1) / B
    torch.testing.assert_close(q.grad, torch.tensor([-0.5, -0.5, 0.0]) / 3)


def test_target_updates_and_schedule():
    target, online = [torch.zeros(3)], [torch.ones(3) * 2]
    polyak_update(target, online, 0.25)
    torch.testing.assert_close(target[0], torch.full((3,), 0.5))
    hard_update(target, online)
    torch.testing.assert_close(target[0], online[0])
    assert linear_schedule(1.0, 0.1, 100, 0) == 1.0
    assert linear_schedule(1.0, 0.1, 100, 50) == pytest.approx(0.55)
    assert linear_schedule(1.0, 0.1, 100, 1000) == pytest.approx(0.1)
    assert linear_schedule(1.0, 0.1, 0, 0) == pytest.approx(0.1)
