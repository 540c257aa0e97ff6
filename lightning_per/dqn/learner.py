"""One DQN learner update on a batch: the code shared by the LightningModule, graph mode and benchmarks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from lightning_per.dqn.targets import dqn_target, polyak_update, weighted_huber_loss

__all__ = ["MetricSlots", "finish_update_", "learner_step", "record_update_metrics_", "td_loss"]


def td_loss(q_net: nn.Module, target_net: nn.Module, b: dict[str, Tensor], *, double_dqn: bool = True,
            huber_delta: float = 1.0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The forward half of an update: double-DQN n-step target and IS-weighted Huber loss (pure tensors).

    What :class:`~lightning_per.dqn.compiled.InductorUpdate` hands to ``torch.compile`` (its backward is
    then compiled by AOTAutograd too).

    Args:
        q_net, target_net, b, double_dqn, huber_delta: as in :func:`learner_step`.

    Returns:
        ``(loss, td, td_abs, q_taken)``: 0-d float32 loss (carries the graph to ``q_net``'s parameters);
        ``(B,) float32`` TD errors ``y - Q``, their absolute values and ``Q(s, a)``, detached.
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
    return loss, td, td.abs(), q_taken.detach()


def learner_step(q_net: nn.Module, target_net: nn.Module, optimizer, b: dict[str, Tensor], *,
                 double_dqn: bool = True, huber_delta: float = 1.0, grad_clip_norm: float | None = 10.0,
                 backward: Callable[[Tensor], None] | None = None, loss_fn: Callable | None = None,
                 clip_fn: Callable[[], None] | None = None,
                 after_forward: Callable[[Tensor], None] | None = None) -> dict[str, Tensor]:
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
        loss_fn: ``b -> (loss, td, td_abs, q_taken)`` replacing :func:`td_loss` (e.g. its compiled
            version, :attr:`InductorUpdate.loss <lightning_per.dqn.compiled.InductorUpdate>`); it must
            compute the same thing with this call's ``q_net``, ``target_net`` and settings.
        clip_fn: ``() -> None`` replacing ``clip_grad_norm_(q_net.parameters(), grad_clip_norm,
            foreach=True)`` (e.g. its compiled version); only called when ``grad_clip_norm`` is not None.
        after_forward: called with ``td_abs`` ``(B,)`` as soon as the loss is computed, before the backward
            (e.g. the priority update, forked onto a :class:`SideStream` so that it overlaps the backward
            and the optimizer step).

    Returns:
        ``loss`` (0-d), ``td`` (``y - Q``), ``td_abs`` (``|y - Q|``, the new raw priorities), ``q``
        (``Q(s, a)``), ``weight``: float32, detached, on the device.
    """
    if loss_fn is None:
        loss, td, td_abs, q_taken = td_loss(q_net, target_net, b, double_dqn=double_dqn, huber_delta=huber_delta)
    else:
        loss, td, td_abs, q_taken = loss_fn(b)
    if after_forward is not None:
        after_forward(td_abs)
    (backward or Tensor.backward)(loss)
    if grad_clip_norm is not None:
        if clip_fn is None:
            torch.nn.utils.clip_grad_norm_(q_net.parameters(), grad_clip_norm, foreach=True)
        else:
            clip_fn()
    optimizer.step()
    return {"loss": loss.detach(), "td": td, "td_abs": td_abs, "q": q_taken, "weight": b["weight"]}


class MetricSlots(NamedTuple):
    """Where one update's metrics go in a :class:`~lightning_per.metrics.MetricAccumulator`'s
    ``values``/``counts`` vectors ``(M,) float64`` (see :func:`record_update_metrics_`)."""

    mean: Tensor
    """``(4,) int64`` on the accumulator's device: slots of ``loss``, ``td_abs_mean``, ``q_mean``,
    ``is_weight_mean`` (``mean`` reductions), in this order."""
    td_abs_max: int
    """Slot of ``td_abs_max`` (a ``max`` reduction)."""
    clamped: int
    """Slot of ``clamped_priorities`` (a ``last`` reduction)."""
    counted: Tensor
    """``(6,) int64``: every slot above; each one's count grows by one per update."""
    ones: Tensor
    """``(6,) float64`` ones (the count increments)."""

    @classmethod
    def of(cls, names: Sequence[str], device: torch.device | str) -> MetricSlots:
        """Slots of the metrics named ``loss``, ``td_abs_mean``, ``td_abs_max``, ``q_mean``,
        ``is_weight_mean`` and ``clamped_priorities`` in ``names`` (the accumulator's declaration order).

        Raises:
            ValueError: one of them is not in ``names``.
        """
        wanted = ("loss", "td_abs_mean", "q_mean", "is_weight_mean", "td_abs_max", "clamped_priorities")
        missing = [n for n in wanted if n not in names]
        if missing:
            raise ValueError(f"metrics {missing} are not declared; declared: {list(names)}")
        slot = {n: i for i, n in enumerate(names)}
        counted = torch.tensor([slot[n] for n in wanted], dtype=torch.int64, device=device)
        return cls(counted[:4].clone(), slot["td_abs_max"], slot["clamped_priorities"], counted,
                   torch.ones(len(wanted), dtype=torch.float64, device=device))


def record_update_metrics_(values: Tensor, counts: Tensor, slots: MetricSlots, out: dict[str, Tensor],
                           clamped: Tensor | None = None) -> None:
    """Fold one update's device values into a metric accumulator's vectors, in place (no host read).

    The same result as ``MetricAccumulator.add`` per metric (``loss``, mean ``|td|``, max ``|td|``, mean
    ``Q(s, a)``, mean IS weight, and ``clamped`` as the last value), in a few kernels instead of ~20: the
    four means are stacked and added with one ``index_add_`` (one addend per slot, so the float64 sums are
    bit-identical), and all counts grow with one more.

    Args:
        values, counts: the accumulator's ``(M,) float64`` vectors (``MetricAccumulator.values``/``counts``).
        slots: where each metric lives (:meth:`MetricSlots.of`).
        out: :func:`learner_step`'s result (``loss`` 0-d, ``td_abs``, ``q``, ``weight`` ``(B,)`` float32).
        clamped: 0-d count of clamped priorities (the sampler's ``clamped_priority_count``) or None (then
            that metric and its count are left alone).
    """
    td_abs = out["td_abs"]  # [B]
    means = torch.stack((out["loss"], td_abs.mean(), out["q"].mean(), out["weight"].mean()))  # [4]
    values.index_add_(0, slots.mean, means.to(torch.float64))
    values[slots.td_abs_max].clamp_(min=td_abs.max().to(torch.float64))
    if clamped is None:
        counts.index_add_(0, slots.counted[:5], slots.ones[:5])
    else:
        values[slots.clamped].copy_(clamped)  # int64 -> float64 in the copy
        counts.index_add_(0, slots.counted, slots.ones)


@torch.no_grad()
def finish_update_(values: Tensor, counts: Tensor, out: dict[str, Tensor], clamped: Tensor | None, *,
                   slots: MetricSlots, target: Sequence[Tensor] = (), online: Sequence[Tensor] = (),
                   tau: float | None = None) -> None:
    """The device-side end of an update: Polyak target update (``tau`` not None; see
    :func:`~lightning_per.dqn.targets.polyak_update`) and :func:`record_update_metrics_`. In place."""
    if tau is not None:
        polyak_update(target, online, tau)
    record_update_metrics_(values, counts, slots, out, clamped)
