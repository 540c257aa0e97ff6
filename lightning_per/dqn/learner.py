"""One DQN learner update on a batch: the code shared by the LightningModule, graph mode and benchmarks."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

from lightning_per.dqn.targets import dqn_target, weighted_huber_loss

__all__ = ["all_reduce_mean_grads_", "learner_step"]


def learner_step(q_net: nn.Module, target_net: nn.Module, optimizer, b: dict[str, Tensor], *,
                 double_dqn: bool = True, huber_delta: float = 1.0, grad_clip_norm: float | None = 10.0,
                 backward: Callable[[Tensor], None] | None = None) -> dict[str, Tensor]:
    """Double-DQN n-step target, IS-weighted Huber loss, backward, clip, optimizer step (no host reads).

    Args:
        q_net: online network ``(B, *obs) -> (B, A)``.
        target_net: target network, same shapes (not updated here).
        optimizer: steps ``q_net``'s parameters (gradients are expected to be zero or None on entry).
        b: ``observation``, ``next_observation`` ``(B, *obs)``; ``action (B,) int64``;
            ``reward (B,) float32`` (n-step return G); ``discount (B,) float32`` (gamma^k, 0 at
            termination); ``weight (B,) float32`` (IS weights). All on the networks' device.
        double_dqn: select the bootstrap action with ``q_net`` (van Hasselt et al. 2016).
        huber_delta: Huber threshold.
        grad_clip_norm: clip the global gradient L2 norm (None: no clipping).
        backward: how to back-propagate (Lightning's ``manual_backward``); default ``loss.backward()``.

    Returns:
        ``loss`` (0-d), ``td`` (``y - Q``), ``q`` (``Q(s, a)``), ``weight``: float32, detached, on the device.
    """
    batch_size = b["action"].shape[0]
    # one forward for s and s': the s' half gives the double-DQN action choice (no gradient used)
    q_both = q_net(torch.cat((b["observation"], b["next_observation"])))  # [2B, A]
    q_taken = q_both[:batch_size].gather(1, b["action"].long().unsqueeze(1)).squeeze(1)  # [B]
    with torch.no_grad():
        next_target = target_net(b["next_observation"])  # [B, A]
    next_online = q_both[batch_size:].detach() if double_dqn else None
    y = dqn_target(next_target, b["reward"], b["discount"], next_online)  # [B]
    loss, td = weighted_huber_loss(q_taken, y, b["weight"], huber_delta)
    (backward or Tensor.backward)(loss)
    if grad_clip_norm is not None:
        torch.nn.utils.clip_grad_norm_(q_net.parameters(), grad_clip_norm, foreach=True)
    optimizer.step()
    return {"loss": loss.detach(), "td": td, "q": q_taken.detach(), "weight": b["weight"]}


def all_reduce_mean_grads_(params: Iterable[Tensor], world_size: int, group=None) -> None:
    """Average the gradients of ``params`` over the ranks of ``group`` in place, as one flat buffer.

    One ``torch.distributed.all_reduce`` (SUM) of the concatenated gradients, a division by
    ``world_size``, and a copy back: no host read and no branch on tensor values, so it can run inside a
    CUDA graph (NCCL collectives are capturable from NCCL 2.9.6). Every rank must call it with the same
    parameters in the same order (same shapes; parameters without a gradient are skipped).

    Args:
        params: the parameters whose ``.grad`` is averaged (e.g. ``q_net.parameters()``).
        world_size: the number of ranks in ``group`` (the divisor).
        group: the process group (None: the default group, e.g. the one Lightning created).
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])  # [sum of numels], a new buffer
    torch.distributed.all_reduce(flat, group=group)
    flat.div_(world_size)
    parts = flat.split([g.numel() for g in grads])
    torch._foreach_copy_(grads, [part.view_as(g) for part, g in zip(parts, grads)])
