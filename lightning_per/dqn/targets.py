"""Stateless DQN math: n-step returns, (double) DQN targets, IS-weighted Huber loss, target updates.

Every function takes explicit tensors and returns new ones; none reads a tensor on the host, so
all of them run inside a CUDA graph. References: Mnih et al. 2015 (Nature 518, "Human-level
control through deep reinforcement learning": target network, Huber loss), van Hasselt et al.
2016 (arXiv:1509.06461, double DQN), Sutton & Barto 2018 sec. 7.1 (n-step returns), Schaul et al.
2016 (arXiv:1511.05952, importance-sampling weights in the loss).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["n_step_return", "dqn_target", "weighted_huber_loss", "polyak_update", "hard_update",
           "linear_schedule"]


def n_step_return(reward: Tensor, done: Tensor, terminated: Tensor, gamma: float
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """Truncated n-step returns of the transition at the start of a window (Sutton & Barto 7.1).

    For a window of ``n`` consecutive steps ``s, ..., s+n-1`` of each environment, with
    ``alive_k = prod_{j<k} (1 - done_{s+j})`` (the episode has not ended before step ``k``):

    - ``G = sum_{k<n} gamma^k * r_{s+k} * alive_k``  (rewards after the episode's end are dropped),
    - ``last = sum_k alive_k - 1``: index of the last step that belongs to the episode,
    - ``discount = gamma^(last+1) * (1 - terminated_{s+last})``: the bootstrap factor, 0 after a
      true termination, ``gamma^(last+1)`` after a time-limit truncation or mid-episode.

    The target is then ``G + discount * max_a Q(next_obs_{s+last}, a)``.

    Args:
        reward: ``(n, E)`` float, rewards in time order (oldest first), any device.
        done: ``(n, E)`` bool, episode ended at that step (terminated or truncated).
        terminated: ``(n, E)`` bool, true termination at that step (no bootstrap).
        gamma: discount factor in [0, 1].

    Returns:
        ``(G, discount, last)``: ``(E,) float32``, ``(E,) float32``, ``(E,) int64``, on the input device.
    """
    n = reward.shape[0]
    not_done = (~done).to(torch.float32)  # [n, E]
    alive = torch.cat((torch.ones_like(not_done[:1]), torch.cumprod(not_done[:-1], 0)), 0)  # [n, E]
    powers = gamma ** torch.arange(n, dtype=torch.float32, device=reward.device)  # [n]
    ret = (powers[:, None] * reward.to(torch.float32) * alive).sum(0)  # [E]
    last = alive.sum(0).to(torch.int64) - 1  # [E]
    term_last = terminated.gather(0, last[None]).squeeze(0).to(torch.float32)  # [E]
    discount = torch.pow(torch.full_like(ret, gamma), (last + 1).to(torch.float32)) * (1.0 - term_last)
    return ret, discount, last


def dqn_target(next_q_target: Tensor, ret: Tensor, discount: Tensor, next_q_online: Tensor | None = None
               ) -> Tensor:
    """Bootstrapped target ``y = G + discount * Q_target(s', a*)``.

    ``a* = argmax_a Q_online(s', a)`` for double DQN (van Hasselt et al. 2016, eq. 4) when
    ``next_q_online`` is given, else ``a* = argmax_a Q_target(s', a)`` (Mnih et al. 2015).

    Args:
        next_q_target: ``(B, A)`` float, target-network values at the bootstrap observation.
        ret: ``(B,)`` float, (n-step) return ``G``.
        discount: ``(B,)`` float, bootstrap factor (0 at termination).
        next_q_online: ``(B, A)`` float or None, online-network values at the same observation.

    Returns:
        ``(B,) float32`` targets on the input device, detached from the graph.
    """
    with torch.no_grad():
        if next_q_online is None:
            boot = next_q_target.max(-1).values  # [B]
        else:
            a_star = next_q_online.argmax(-1, keepdim=True)  # [B, 1]
            boot = next_q_target.gather(-1, a_star).squeeze(-1)  # [B]
        return (ret + discount * boot).to(torch.float32)


def weighted_huber_loss(q_taken: Tensor, target: Tensor, weight: Tensor, delta: float = 1.0
                        ) -> tuple[Tensor, Tensor]:
    """Importance-weighted Huber loss ``mean_i w_i * huber_delta(y_i - Q(s_i, a_i))`` (Schaul et al. 2016).

    Args:
        q_taken: ``(B,)`` float, online values of the taken actions (carries the graph).
        target: ``(B,)`` float, targets (no graph).
        weight: ``(B,)`` float, IS weights (ones for uniform replay).
        delta: Huber threshold (1.0 = Mnih et al.'s error clipping).

    Returns:
        ``(loss, td_error)``: 0-d float32 loss and ``(B,) float32`` TD errors ``y - Q`` (detached).
    """
    elementwise = F.huber_loss(q_taken, target, reduction="none", delta=delta)  # [B]
    loss = (weight * elementwise).mean()
    return loss, (target - q_taken).detach()


@torch.no_grad()
def polyak_update(target: Iterable[Tensor], online: Iterable[Tensor], tau: float) -> None:
    """In place ``theta_target <- (1 - tau) * theta_target + tau * theta_online`` (Lillicrap et al. 2016)."""
    torch._foreach_lerp_(list(target), list(online), tau)


@torch.no_grad()
def hard_update(target: Iterable[Tensor], online: Iterable[Tensor]) -> None:
    """In place ``theta_target <- theta_online`` (Mnih et al. 2015's periodic copy)."""
    torch._foreach_copy_(list(target), list(online))


def linear_schedule(start: float, end: float, duration: int, t: int) -> float:
    """Host float: ``start`` at ``t = 0``, linear to ``end`` at ``t = duration``, ``end`` afterwards."""
    if duration <= 0:
        return end
    frac = min(max(t / duration, 0.0), 1.0)
    return start + frac * (end - start)
