"""The A3C / GA3C actor-critic loss (GA3C section 3.2, NVlabs/GA3C ``NetworkVP._create_graph``), the APPO-style
clipped loss (PPO's clipped surrogate over V-trace advantages) and V-trace's off-policy targets for both
(Espeholt et al. 2018, IMPALA)."""

from __future__ import annotations

import torch
from torch import Tensor
from torchrl.objectives.value.functional import vtrace_advantage_estimate

__all__ = ["a3c_loss", "appo_loss", "lag_weights", "normalize_advantage", "vtrace_targets"]


def a3c_loss(logits: Tensor, value: Tensor, action: Tensor, ret: Tensor, beta: float | Tensor = 0.01,
             value_coef: float = 1.0, log_epsilon: float = 1e-6, reduction: str = "mean",
             advantage: Tensor | None = None, weight: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """Policy-gradient + value + entropy loss of a batch of N transitions.

    With pi = softmax(logits), A = R - V (V detached: the advantage carries no value gradient) and
    log clamped at ``log_epsilon`` (probabilities that underflow under policy lag would give
    log 0 = -inf, section 4.4)::

        L_pi = -log(max(pi(a|s), eps)) * A - beta * H(pi),   H = -sum_a pi log(max(pi, eps))
        L_V  = 0.5 * (R - V)^2
        L    = reduce(L_pi) + value_coef * reduce(L_V)

    ``reduce`` is the batch mean (default) or the sum (the reference's choice, which makes the
    step size grow with the batch size). With V-trace (:func:`vtrace_targets`), R is its target v_s and
    ``advantage`` its rho_s (r_s + gamma v_{s+1} - V(s_s)) (IMPALA section 4.2). With ``weight`` w (the policy-lag
    bound, :func:`lag_weights`) each transition's L_pi and L_V are multiplied by w_i and the mean divides by the
    number of transitions with w_i > 0 (at least 1), so a transition of weight 0 adds nothing to the gradient
    and the others keep their step size; all on the device, no host read.

    Args:
        logits: (N, A) float, policy logits.
        value: (N,) float, V(s).
        action: (N,) int64, actions taken.
        ret: (N,) float, n-step returns R (or V-trace targets).
        beta: entropy weight (>= 0): a float, or a 0-d float tensor on the logits' device (a schedule that
            changes it in place without a new capture).
        value_coef: weight of the value loss (>= 0).
        log_epsilon: lower clamp of probabilities inside the log, in (0, 0.5].
        reduction: ``"mean"`` or ``"sum"``.
        advantage: (N,) float, the policy gradient's advantage (detached here); None: R - V.
        weight: (N,) float in [0, 1], each transition's weight (detached here); None: all 1.

    Returns:
        ``(loss, parts)``: 0-d loss on the logits' device, and 0-d detached tensors
        ``policy_loss``, ``value_loss`` (weighted like the loss), ``entropy`` (batch mean), ``advantage`` (mean over
        the kept transitions: weight > 0).

    Raises:
        ValueError: mismatched shapes or an unknown reduction.

    Example::

        >>> import torch
        >>> loss, parts = a3c_loss(torch.zeros(2, 3), torch.zeros(2), torch.tensor([0, 2]), torch.ones(2))
        >>> round(float(parts["entropy"]), 4)  # ln 3: the uniform policy
        1.0986
    """
    named = (("value", value), ("action", action), ("ret", ret), ("advantage", advantage), ("weight", weight))
    _check_batch(logits, named, reduction)
    probs = torch.softmax(logits, dim=-1)  # [N, A]
    log_probs = torch.log(probs.clamp_min(log_epsilon))  # [N, A]
    log_pi_a = log_probs.gather(1, action.long().unsqueeze(1)).squeeze(1)  # [N]
    ret = ret.to(value.dtype)
    advantage = ret - value.detach() if advantage is None else advantage.detach().to(value.dtype)  # [N]
    entropy = -(probs * log_probs).sum(dim=-1)  # [N]
    policy_terms = -log_pi_a * advantage - beta * entropy  # [N]
    return _reduce(policy_terms, 0.5 * (ret - value).square(), entropy, advantage, value_coef, reduction, weight)


def appo_loss(logits: Tensor, value: Tensor, action: Tensor, ret: Tensor, advantage: Tensor, log_mu: Tensor,
              clip: float = 0.2, log_target: Tensor | None = None, beta: float | Tensor = 0.01,
              value_coef: float = 1.0, log_epsilon: float = 1e-6, reduction: str = "mean",
              weight: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """APPO's loss: PPO's clipped surrogate over V-trace advantages, plus the value and entropy terms of A3C.

    The policy term is PPO's clipped objective (Schulman et al. 2017, arXiv:1707.06347, eq. 7), negated for
    minimisation, with the V-trace advantage A_s and targets v_s (IMPALA, eq. 1 and section 4.2;
    :func:`vtrace_targets`), as APPO pairs them (RLlib's APPO; Sample Factory's APPO learner)::

        r   = pi(a|s) / mu(a|s)                                      (no target network)
        r   = clip(mu(a|s) / pi_target(a|s), 0, 2) * pi(a|s) / mu(a|s)  (with ``log_target``: RLlib's APPO)
        L_pi = -min(r A, clip(r, 1 - clip, 1 + clip) A) - beta * H(pi)
        L_V  = 0.5 * (v_s - V)^2
        L    = reduce(L_pi) + value_coef * reduce(L_V)

    mu is the policy that acted (the predictor's, stamped on the rollout); pi_target a lagging copy of the
    learner's network, which makes the ratio's baseline move slowly (RLlib's ``use_kl_loss=False`` path). The
    log of the ratio uses ``log_softmax`` (exact); H clamps probabilities at ``log_epsilon`` as
    :func:`a3c_loss` does. ``weight`` and ``reduction`` act as in :func:`a3c_loss`. No host read.

    Args:
        logits: (N, A) float, the learner's policy logits (with gradient).
        value: (N,) float, the learner's V(s).
        action: (N,) int64, actions taken.
        ret: (N,) float, V-trace targets v_s.
        advantage: (N,) float, V-trace advantages (detached here; normalise them first if wanted:
            :func:`normalize_advantage`).
        log_mu: (N,) float, log mu(a|s) of the acting policy.
        clip: PPO's epsilon, in (0, 1).
        log_target: (N,) float, log pi_target(a|s) of the target network (detached here); None: no target.
        beta: entropy weight (>= 0), a float or a 0-d tensor.
        value_coef, log_epsilon, reduction, weight: as in :func:`a3c_loss`.

    Returns:
        ``(loss, parts)``: 0-d loss, and 0-d detached ``policy_loss``, ``value_loss``, ``entropy``, ``advantage``
        (batch means, the two losses weighted like the loss, ``advantage`` over weight > 0) and ``clip_frac`` (PPO's
        diagnostic: the fraction of transitions whose ratio lies outside [1 - clip, 1 + clip], over those of
        weight > 0 when ``weight`` is given, i.e. those that reach the gradient).

    Raises:
        ValueError: mismatched shapes, an unknown reduction or ``clip`` outside (0, 1).

    Example::

        >>> import torch
        >>> logits = torch.log(torch.tensor([[0.6, 0.4]]))   # pi(a=0) = 0.6
        >>> loss, parts = appo_loss(logits, torch.zeros(1), torch.tensor([0]), torch.zeros(1),
        ...                         torch.ones(1), torch.log(torch.tensor([0.4])), clip=0.2, beta=0.0)
        >>> round(float(parts["policy_loss"]), 4)  # r = 1.5 clipped at 1.2, A = 1: -1.2
        -1.2
    """
    if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not 0.0 < clip < 1.0:
        raise ValueError(f"clip must be a number in (0, 1), got {clip!r}")
    named = (("value", value), ("action", action), ("ret", ret), ("advantage", advantage), ("log_mu", log_mu),
             ("log_target", log_target), ("weight", weight))
    _check_batch(logits, named, reduction)
    action = action.long().unsqueeze(1)  # [N, 1]
    log_pi_a = torch.log_softmax(logits, dim=-1).gather(1, action).squeeze(1)  # [N]
    log_mu = log_mu.detach().to(log_pi_a.dtype)  # [N]
    ratio = torch.exp(log_pi_a - log_mu)  # [N]: pi / mu
    if log_target is not None:  # RLlib's APPO: the behaviour ratio's baseline is the target network
        ratio = ratio * torch.exp(log_mu - log_target.detach().to(log_mu.dtype)).clamp(0.0, 2.0)  # [N]
    advantage = advantage.detach().to(value.dtype)  # [N]
    surrogate = torch.minimum(ratio * advantage, ratio.clamp(1.0 - clip, 1.0 + clip) * advantage)  # [N], PPO eq. 7
    probs = torch.softmax(logits, dim=-1)  # [N, A]
    entropy = -(probs * torch.log(probs.clamp_min(log_epsilon))).sum(dim=-1)  # [N]
    policy_terms = -surrogate - beta * entropy  # [N]
    value_terms = 0.5 * (ret.to(value.dtype) - value).square()  # [N]
    loss, parts = _reduce(policy_terms, value_terms, entropy, advantage, value_coef, reduction, weight)
    clipped = ((ratio - 1.0).abs() > clip).to(value.dtype).detach()  # [N]
    if weight is None:
        parts["clip_frac"] = clipped.mean()
    else:
        kept = (weight.detach() > 0).to(value.dtype)  # [N]
        parts["clip_frac"] = (clipped * kept).sum() / kept.sum().clamp_min(1.0)
    return loss, parts


def normalize_advantage(advantage: Tensor, weight: Tensor | None = None, eps: float = 1e-8) -> Tensor:
    """Advantages shifted to mean 0 and scaled to standard deviation 1 over the batch (PPO's and Sample Factory's
    ``normalize_advantage``; OpenAI baselines' ppo2): ``(A - mean) / (std + eps)``, the population std.

    With ``weight`` (the lag bound's, :func:`lag_weights`) the mean and std are over the transitions of weight
    > 0 only, so dropped transitions do not shift the others. No host read.

    Args:
        advantage: (N,) float.
        weight: (N,) float in [0, 1] or None.
        eps: added to the std (> 0).

    Returns:
        (N,) float, detached, on ``advantage``'s device.

    Raises:
        ValueError: ``weight`` of another shape.

    Example::

        >>> import torch
        >>> normalize_advantage(torch.tensor([1.0, 3.0])).tolist()
        [-1.0, 1.0]
    """
    advantage = advantage.detach()
    if weight is None:
        mask = torch.ones_like(advantage)
    elif tuple(weight.shape) != tuple(advantage.shape):
        raise ValueError(f"weight must have shape {tuple(advantage.shape)} like advantage, got {tuple(weight.shape)}")
    else:
        mask = (weight.detach() > 0).to(advantage.dtype)  # [N]
    kept = mask.sum().clamp_min(1.0)
    mean = (advantage * mask).sum() / kept
    std = (((advantage - mean) * mask).square().sum() / kept).sqrt()
    return (advantage - mean) / (std + eps)


def _check_batch(logits: Tensor, named: tuple, reduction: str) -> None:
    """Shapes: logits (N, A), every named tensor that is not None (N,); ``reduction`` mean or sum."""
    if logits.ndim != 2:
        raise ValueError(f"logits must have shape (N, A), got {tuple(logits.shape)}")
    n = logits.shape[0]
    for name, t in named:
        if t is not None and tuple(t.shape) != (n,):
            raise ValueError(f"{name} must have shape ({n},) like logits' batch, got {tuple(t.shape)}")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")


def _reduce(policy_terms: Tensor, value_terms: Tensor, entropy: Tensor, advantage: Tensor, value_coef: float,
            reduction: str, weight: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss from per-transition (N,) terms: weighted (``weight``, mean over weight > 0) and reduced. The logged
    ``advantage`` is the mean over the transitions the loss keeps (weight > 0): a dropped one's normalised advantage
    can be any size (its batch's mean and std are the kept ones'), and it trains nothing."""
    if weight is None:
        reduce = torch.mean if reduction == "mean" else torch.sum
        advantage_mean = advantage.mean()
    else:
        weight = weight.detach().to(value_terms.dtype)  # [N]
        policy_terms, value_terms = policy_terms * weight, value_terms * weight
        kept_mask = weight > 0  # [N]
        kept = kept_mask.sum().clamp_min(1)  # 0-d int64 on the device: no host read
        reduce = (lambda t: t.sum() / kept) if reduction == "mean" else torch.sum
        advantage_mean = torch.where(kept_mask, advantage, torch.zeros_like(advantage)).sum() / kept
    policy_loss = reduce(policy_terms)
    value_loss = reduce(value_terms)
    loss = policy_loss + value_coef * value_loss
    parts = {"policy_loss": policy_loss.detach(), "value_loss": value_loss.detach(),
             "entropy": entropy.detach().mean(), "advantage": advantage_mean}
    return loss, parts


def lag_weights(lag: Tensor, max_lag: int, policy: str = "drop") -> Tensor:
    """Each transition's loss weight under the policy-lag bound ``max_lag`` = L (``GA3CConfig.max_policy_lag``).

    ``drop`` (Sample Factory's rule: samples older than ``max_policy_lag`` are not trained on)::

        w = 1 if lag <= L else 0

    ``downweight`` (ours): full weight up to L, then a linear fall to 0 at 2L::

        w = clip(2 - lag / L, 0, 1)

    A pure tensor op (no host read), so graph mode captures it; the learner applies it on the device and the
    host counts the same weights from its copy of the lags.

    Args:
        lag: (N,) int64, updates between the prediction that acted and the update (any device).
        max_lag: L, an int >= 1.
        policy: ``"drop"`` or ``"downweight"``.

    Returns:
        (N,) float32 in [0, 1], on ``lag``'s device.

    Raises:
        ValueError: ``max_lag`` < 1 or an unknown ``policy``.

    Example::

        >>> import torch
        >>> lag_weights(torch.tensor([0, 4, 5, 6, 10]), 4).tolist()
        [1.0, 1.0, 0.0, 0.0, 0.0]
        >>> lag_weights(torch.tensor([0, 4, 5, 6, 10]), 4, "downweight").tolist()
        [1.0, 1.0, 0.75, 0.5, 0.0]
    """
    if isinstance(max_lag, bool) or not isinstance(max_lag, int) or max_lag < 1:
        raise ValueError(f"max_lag must be an int >= 1, got {max_lag!r}")
    if policy == "drop":
        return (lag <= max_lag).to(torch.float32)
    if policy == "downweight":
        return (2.0 - lag.to(torch.float32) / max_lag).clamp(0.0, 1.0)
    raise ValueError(f"policy must be 'drop' or 'downweight', got {policy!r}")


def vtrace_targets(log_pi: Tensor, log_mu: Tensor, value: Tensor, bootstrap: Tensor, reward: Tensor,
                   terminated: Tensor, truncated: Tensor, gamma: float, rho_clip: Tensor | float = 1.0,
                   c_clip: Tensor | float = 1.0) -> tuple[Tensor, Tensor]:
    """V-trace value targets v_s and policy-gradient advantages of R rollouts of T steps of E envs.

    IMPALA (Espeholt et al. 2018), eq. 1 and section 4.2, with rho_t = min(rho_bar, pi/mu), c_t = min(c_bar, pi/mu)
    and gamma_t = 0 after an episode end::

        delta_t = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t))
        v_s     = V(x_s) + sum_{t>=s} (prod_{i=s}^{t-1} gamma_i c_i) delta_t
        A_s     = rho_s (r_s + gamma_s v_{s+1} - V(x_s)),   v_T = V(x_T) (``bootstrap``)

    An episode end cuts the traces. At a time-limit truncation the state after it is not observed (the
    env has reset), so V(x_{t+1}) is approximated by V(x_t), as :func:`~lightning_per.actors.returns.nstep_returns`
    does: the step's reward becomes r_t + gamma V(x_t) and the step ends its trace. With pi = mu
    (on-policy) and both clips >= 1, v_s is the n-step return of ``nstep_returns``. The recursion is
    TorchRL's ``vtrace_advantage_estimate``; no host synchronisation (capturable, given the clips as
    device tensors: TorchRL turns a float into a tensor with a host copy).

    Args:
        log_pi: (R, T, E) float, log pi(a_t|x_t) of the learner's policy (detached here).
        log_mu: (R, T, E) float, log mu(a_t|x_t) of the policy that acted.
        value: (R, T, E) float, the learner's V(x_t) (detached here).
        bootstrap: (R, E) float, the learner's V(x_T) after each rollout.
        reward: (R, T, E) float, rewards r_t (clipped if configured).
        terminated: (R, T, E) bool, the episode ended in a terminal state at step t.
        truncated: (R, T, E) bool, the episode was cut by a time limit at step t (ignored where terminated).
        gamma: discount in (0, 1].
        rho_clip, c_clip: rho-bar and c-bar, 0-d tensors on the values' device or floats.

    Returns:
        ``(v, advantage)``: (R, T, E) float tensors, no gradient.

    Raises:
        ValueError: shapes that do not match.

    Example::

        >>> import torch
        >>> z = torch.zeros(1, 2, 1)
        >>> v, adv = vtrace_targets(z, z, z, torch.ones(1, 1), torch.ones(1, 2, 1), z.bool(), z.bool(), 0.5)
        >>> v.flatten().tolist()  # 1 + 0.5 * (1 + 0.5 * 1), 1 + 0.5 * 1
        [1.75, 1.5]
    """
    shape = tuple(value.shape)
    if len(shape) != 3:
        raise ValueError(f"value must have shape (R, T, E), got {shape}")
    for name, t in (("log_pi", log_pi), ("log_mu", log_mu), ("reward", reward), ("terminated", terminated),
                    ("truncated", truncated)):
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} like value, got {tuple(t.shape)}")
    if tuple(bootstrap.shape) != (shape[0], shape[2]):
        raise ValueError(f"bootstrap must have shape {(shape[0], shape[2])} (R, E), got {tuple(bootstrap.shape)}")
    with torch.no_grad():
        value = value.detach()
        next_value = torch.cat([value[:, 1:], bootstrap.detach().to(value.dtype).unsqueeze(1)], dim=1)  # [R, T, E]
        cut = truncated & ~terminated
        reward = reward.to(value.dtype) + gamma * cut * value  # r_t + gamma V(x_t) at a time limit
        ended = terminated | cut  # gamma_t = 0 and no trace beyond: the folded reward holds the bootstrap
        advantage, v = vtrace_advantage_estimate(gamma, log_pi.detach().to(value.dtype), log_mu.to(value.dtype),
                                                 value, next_value, reward, ended, ended,
                                                 rho_thresh=rho_clip, c_thresh=c_clip, time_dim=-2)
    return v, advantage
