"""RMSProp with TensorFlow 1 semantics, as GA3C trains with it (``tf.train.RMSPropOptimizer``).

torch.optim.RMSprop differs in two ways that matter with GA3C's large eps = 0.1
(pytorch/pytorch#23796): torch adds eps *outside* the square root and starts the square average at
0; TF adds it inside and starts at 1, so the first steps are small rather than ~lr/sqrt(1-alpha).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

__all__ = ["RMSpropTF"]


class RMSpropTF(torch.optim.Optimizer):
    """RMSProp as TF1 computes it (the GA3C paper's "non-centered RMSProp", section 3.2)::

        ms  <- alpha * ms + (1 - alpha) * g^2          (ms starts at 1)
        mg  <- alpha * mg + (1 - alpha) * g            (centered only; starts at 0)
        mom <- momentum * mom + lr * g / sqrt(ms - mg^2 + eps)
        p   <- p - mom

    Args:
        params: parameters or parameter groups.
        lr: learning rate (> 0).
        alpha: decay of the square average, in [0, 1).
        eps: added *inside* the square root (> 0); GA3C uses 0.1.
        momentum: momentum (>= 0).
        centered: subtract the squared running mean of g (TF ``centered=True``).
        weight_decay: L2 penalty added to the gradient (>= 0).

    Raises:
        ValueError: an argument out of range (named in the message).
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], lr: float = 3e-4, alpha: float = 0.99,
                 eps: float = 0.1, momentum: float = 0.0, centered: bool = False,
                 weight_decay: float = 0.0) -> None:
        if not lr > 0.0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if not 0.0 <= alpha < 1.0:
            raise ValueError(f"alpha must be in [0, 1), got {alpha}")
        if not eps > 0.0:
            raise ValueError(f"eps must be > 0, got {eps}")
        if not momentum >= 0.0:
            raise ValueError(f"momentum must be >= 0, got {momentum}")
        if not weight_decay >= 0.0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        defaults = dict(lr=lr, alpha=alpha, eps=eps, momentum=momentum, centered=centered,
                        weight_decay=weight_decay)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102 - torch.optim.Optimizer API
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, alpha, eps = group["lr"], group["alpha"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if group["weight_decay"]:
                    g = g.add(p, alpha=group["weight_decay"])
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["square_avg"] = torch.ones_like(p, memory_format=torch.preserve_format)
                    if group["centered"]:
                        state["grad_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    if group["momentum"] > 0:
                        state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                square_avg = state["square_avg"]
                square_avg.mul_(alpha).addcmul_(g, g, value=1.0 - alpha)
                if group["centered"]:
                    grad_avg = state["grad_avg"]
                    grad_avg.mul_(alpha).add_(g, alpha=1.0 - alpha)
                    denom = square_avg.addcmul(grad_avg, grad_avg, value=-1.0).add_(eps).sqrt_()
                else:
                    denom = square_avg.add(eps).sqrt_()
                if group["momentum"] > 0:
                    buf = state["momentum_buffer"]
                    buf.mul_(group["momentum"]).addcdiv_(g, denom, value=lr)
                    p.sub_(buf)
                else:
                    p.addcdiv_(g, denom, value=-lr)
        return loss
