"""RMSProp with TensorFlow 1 semantics, as GA3C trains with it (``tf.train.RMSPropOptimizer``).

torch.optim.RMSprop differs in two ways that matter with GA3C's large eps = 0.1
(pytorch/pytorch#23796): torch adds eps *outside* the square root and starts the square average at
0; TF adds it inside and starts at 1, so the first steps are small rather than ~lr/sqrt(1-alpha).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

__all__ = ["RMSpropTF", "linear_schedule"]


def linear_schedule(start: float, end: float, steps: int, t: int) -> float:
    """The value at step ``t`` of a linear ramp from ``start`` (t = 0) to ``end`` (t >= ``steps``), then constant.

    Raises:
        ValueError: ``steps`` < 1.

    Example::

        >>> linear_schedule(1e-3, 0.0, 100, 25), linear_schedule(1e-3, 0.0, 100, 500)
        (0.00075, 0.0)
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}")
    return start + (end - start) * min(max(t, 0), steps) / steps


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
        capturable: keep the step count on the parameters' device (a 0-d float32 tensor, as torch's
            optimizers do with ``capturable=True``), so that :meth:`step` can be captured in a CUDA graph;
            otherwise it is a Python int. The update itself is tensor ops only (no host reads) either way.
            Before a capture, call :meth:`init_state`.

    Raises:
        ValueError: an argument out of range (named in the message).
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], lr: float = 3e-4, alpha: float = 0.99,
                 eps: float = 0.1, momentum: float = 0.0, centered: bool = False,
                 weight_decay: float = 0.0, capturable: bool = False) -> None:
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
                        weight_decay=weight_decay, capturable=capturable)
        super().__init__(params, defaults)

    def __setstate__(self, state: dict) -> None:  # also run by load_state_dict
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("capturable", False)  # state dicts saved before the option existed

    def init_state(self) -> None:
        """Create the state of every parameter that has none yet, as its first :meth:`step` would.

        For a CUDA-graph capture: :func:`~lightning_per.graphs.capture` snapshots the
        optimizer state before its eager warm-up and zeroes the state created during it, but the square
        average starts at 1 here, so it must exist before the snapshot."""
        for group in self.param_groups:
            for p in group["params"]:
                if not self.state[p]:
                    self._init_param_state(p, group)

    def _init_param_state(self, p: Tensor, group: dict) -> None:
        state = self.state[p]
        state["step"] = torch.zeros((), dtype=torch.float32, device=p.device) if group["capturable"] else 0
        state["square_avg"] = torch.ones_like(p, memory_format=torch.preserve_format)
        if group["centered"]:
            state["grad_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        if group["momentum"] > 0:
            state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102 - torch.optim.Optimizer API
        if (not all(group["capturable"] for group in self.param_groups) and torch.cuda.is_available()
                and torch.cuda.is_current_stream_capturing()):  # a frozen Python step count otherwise
            raise RuntimeError("RMSpropTF.step() is being captured in a CUDA graph: build it with capturable=True")
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
                    self._init_param_state(p, group)
                state["step"] += 1  # in place on the device when capturable
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
