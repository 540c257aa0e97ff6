"""The A3C / GA3C actor-critic loss (GA3C section 3.2, NVlabs/GA3C ``NetworkVP._create_graph``)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["a3c_loss"]


def a3c_loss(logits: Tensor, value: Tensor, action: Tensor, ret: Tensor, beta: float = 0.01,
             value_coef: float = 1.0, log_epsilon: float = 1e-6,
             reduction: str = "mean") -> tuple[Tensor, dict[str, Tensor]]:
    """Policy-gradient + value + entropy loss of a batch of N transitions.

    With pi = softmax(logits), A = R - V (V detached: the advantage carries no value gradient) and
    log clamped at ``log_epsilon`` (probabilities that underflow under policy lag would give
    log 0 = -inf, section 4.4)::

        L_pi = -log(max(pi(a|s), eps)) * A - beta * H(pi),   H = -sum_a pi log(max(pi, eps))
        L_V  = 0.5 * (R - V)^2
        L    = reduce(L_pi) + value_coef * reduce(L_V)

    ``reduce`` is the batch mean (default) or the sum (the reference's choice, which makes the
    step size grow with the batch size).

    Args:
        logits: (N, A) float, policy logits.
        value: (N,) float, V(s).
        action: (N,) int64, actions taken.
        ret: (N,) float, n-step returns R.
        beta: entropy weight (>= 0).
        value_coef: weight of the value loss (>= 0).
        log_epsilon: lower clamp of probabilities inside the log, in (0, 0.5].
        reduction: ``"mean"`` or ``"sum"``.

    Returns:
        ``(loss, parts)``: 0-d loss on the logits' device, and 0-d detached tensors
        ``policy_loss``, ``value_loss``, ``entropy`` (batch mean), ``advantage`` (batch mean).

    Raises:
        ValueError: mismatched shapes or an unknown reduction.
    """
    if logits.ndim != 2:
        raise ValueError(f"logits must have shape (N, A), got {tuple(logits.shape)}")
    n = logits.shape[0]
    for name, t in (("value", value), ("action", action), ("ret", ret)):
        if tuple(t.shape) != (n,):
            raise ValueError(f"{name} must have shape ({n},) like logits' batch, got {tuple(t.shape)}")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    probs = torch.softmax(logits, dim=-1)  # [N, A]
    log_probs = torch.log(probs.clamp_min(log_epsilon))  # [N, A]
    log_pi_a = log_probs.gather(1, action.long().unsqueeze(1)).squeeze(1)  # [N]
    ret = ret.to(value.dtype)
    advantage = ret - value.detach()  # [N]
    entropy = -(probs * log_probs).sum(dim=-1)  # [N]
    policy_terms = -log_pi_a * advantage - beta * entropy  # [N]
    value_terms = 0.5 * (ret - value).square()  # [N]
    reduce = torch.mean if reduction == "mean" else torch.sum
    policy_loss = reduce(policy_terms)
    value_loss = reduce(value_terms)
    loss = policy_loss + value_coef * value_loss
    parts = {"policy_loss": policy_loss.detach(), "value_loss": value_loss.detach(),
             "entropy": entropy.detach().mean(), "advantage": advantage.mean()}
    return loss, parts
