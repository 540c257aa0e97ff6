"""Opt-in Inductor path (``DQN(inductor=True)``): the pure-tensor parts of an update through ``torch.compile``.

An update is ~100 small kernels; in a CUDA graph each still costs device time and a launch gap,
so their number bounds a small network's update rate. Inductor fuses the element-wise work between the
matrix products (bias, ReLU, gathers, target, Huber, their backward, the norm and scaling of the
clip, the metric sums) into few Triton kernels. Three functions are compiled (default mode,
``fullgraph=True``, ``dynamic=False``), each a pure function of tensors and of constants fixed at
construction:

- :attr:`InductorUpdate.loss`: :func:`~lightning_per.dqn.learner.td_loss`, the forwards of the online
  network on ``[s; s']`` and of the target network on ``s'``, the double-DQN n-step target and the
  IS-weighted Huber loss; AOTAutograd compiles its backward too (``loss.backward()`` stays a plain call);
- :attr:`InductorUpdate.clip`: the global-norm gradient clip (:func:`clip_grad_norm_sumsq_`) (in graph
  mode the module compiles the clip into the Adam step instead: :class:`CompiledStep` ``clip=``);
- :attr:`InductorUpdate.finish`: :func:`~lightning_per.dqn.learner.finish_update_`, the Polyak target
  update (``target_tau`` set) and the metric accumulation.

What stays as it is: the replay ops (sampling, gathering the batch, the priority update: our custom
ops), DDP's gradient all-reduce and the hard target copy. In graph mode (``compile=True``) the Adam
step is compiled too (:class:`CompiledStep`, foreach implementation): torch's fused Adam runs one
multi-tensor kernel whose 65,536-element chunks leave a ~90k-parameter net on a handful of thread
blocks (``python -m benchmarks.profile_dqn`` shows the kernels of each mode).

Shapes are static (``dynamic=False``): one compilation per function for the run's batch size B,
observation shape and network. The first update pays the compilation (seconds to minutes; Triton
autotuning of reductions included on CUDA; the C++ compiler on the CPU). In graph mode
(``compile=True``) that first update is the first eager warm-up iteration of
:func:`~lightning_per.graphs.capture`, so Inductor has compiled and tuned every kernel before
the capture. The capture runs under :func:`~lightning_per.graphs.capturing.no_recompiles`: a guard failure in the
capture raises instead of recompiling there (warm-ups may recompile: the compiled optimizer step does
once, after its first call created the optimizer state). A replay runs no Python, so no
guard is evaluated after the capture. Nothing a run changes between updates (beta, step counters, epsilon) is
read by a compiled function: beta lives in the sampler's device scalar and is read by the replay op.
Works on CUDA and on the CPU (Inductor's C++ backend needs a C++ compiler).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from lightning_per.dqn.learner import MetricSlots, finish_update_, td_loss

__all__ = ["INDUCTOR_MODES", "CompiledStep", "InductorUpdate", "clip_grad_norm_sumsq_"]

INDUCTOR_MODES = ("default", "max-autotune-no-cudagraphs")
"""``torch.compile`` modes :class:`InductorUpdate` accepts (no ``reduce-overhead``: the CUDA graph is ours)."""


class InductorUpdate:
    """The compiled pieces of one DQN update for fixed networks and settings.

    Args:
        q_net: online network (its parameters are read at each call, so in-place updates are seen).
        target_net: target network.
        double_dqn, huber_delta: as in :func:`~lightning_per.dqn.learner.learner_step`.
        grad_clip_norm: the clip threshold, or None (then :attr:`clip` is None).
        slots: where :attr:`finish` writes the metrics.
        target_tau: Polyak factor of :attr:`finish`, or None (no Polyak update there).
        backend: ``torch.compile`` backend: ``"inductor"`` (the point) or e.g. ``"aot_eager"`` (tests).
        mode: ``torch.compile`` mode: ``"default"``, or ``"max-autotune-no-cudagraphs"`` (Inductor benchmarks
            Triton matrix-product templates against cuBLAS for every GEMM shape and may fuse the bias and
            ReLU into them; minutes of autotuning at the first update; the CUDA graph stays ours).

    Attributes:
        loss: ``b -> (loss, td, td_abs, q_taken)`` as :func:`~lightning_per.dqn.learner.td_loss`.
        clip: ``() -> None``, clips ``q_net``'s gradients in place; None without clipping.
        finish: ``(values, counts, out, clamped) -> None`` as
            :func:`~lightning_per.dqn.learner.finish_update_` with this object's slots, networks and tau.
    """

    def __init__(self, q_net: nn.Module, target_net: nn.Module, *, double_dqn: bool, huber_delta: float,
                 grad_clip_norm: float | None, slots: MetricSlots | None = None,
                 target_tau: float | None = None, backend: str = "inductor", mode: str = "default") -> None:
        if mode not in INDUCTOR_MODES:
            raise ValueError(f"mode must be one of {INDUCTOR_MODES}, got {mode!r}")
        options = {"backend": backend, "fullgraph": True, "dynamic": False}
        if mode != "default":
            options["mode"] = mode
        self.loss = torch.compile(functools.partial(td_loss, q_net, target_net, double_dqn=double_dqn,
                                                    huber_delta=float(huber_delta)), **options)
        params = list(q_net.parameters())
        self.clip = None
        if grad_clip_norm is not None:
            self.clip = torch.compile(functools.partial(_clip_grads_, params, float(grad_clip_norm)), **options)
        self.finish = None
        if slots is not None:
            tau = None if target_tau is None else float(target_tau)
            self.finish = torch.compile(functools.partial(
                finish_update_, slots=slots, target=list(target_net.parameters()), online=params, tau=tau),
                **options)


class CompiledStep:
    """``optimizer.step()`` through ``torch.compile`` (default mode, graph breaks allowed), optionally
    preceded by the gradient clip in the same compiled function.

    Inductor turns the foreach Adam update of all parameters into a few fused kernels spread over the
    whole GPU. Give it a ``foreach`` (not ``fused``) optimizer, ``capturable=True`` for CUDA graphs. The
    first call compiles; the second recompiles once (the optimizer state exists then); later calls reuse.

    Args:
        optimizer: the optimizer to step (its ``state_dict`` and checkpointing are unchanged).
        backend: ``torch.compile`` backend.
        clip: ``(params, max_norm)``: clip the global L2 norm of ``params``' gradients to ``max_norm``
            (:func:`clip_grad_norm_sumsq_`: torch's ``clip_grad_norm_`` formula) inside the compiled step,
            so Inductor fuses the scaling into the Adam kernels (fewer
            launches per update); None: no clipping here. Callers then skip their own clip
            (:attr:`clips` is True).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, backend: str = "inductor",
                 clip: tuple[list[Tensor], float] | None = None) -> None:
        self.optimizer = optimizer
        self.clips = clip is not None
        if clip is not None:
            params, max_norm = list(clip[0]), float(clip[1])
            if not (max_norm > 0):
                raise ValueError(f"clip max_norm must be > 0, got {max_norm!r}")

            def step() -> None:
                clip_grad_norm_sumsq_(params, max_norm)
                optimizer.step()
        else:
            def step() -> None:
                optimizer.step()

        self._step = torch.compile(step, backend=backend)

    def step(self) -> None:
        """One optimizer step (the clip first when :attr:`clips`); no host read."""
        self._step()


def _clip_grads_(params: list[Tensor], max_norm: float) -> None:
    clip_grad_norm_sumsq_(params, max_norm)


def clip_grad_norm_sumsq_(params: list[Tensor], max_norm: float) -> Tensor:
    """Scale the gradients of ``params`` in place so that their global L2 norm is at most ``max_norm``.

    The formula of ``torch.nn.utils.clip_grad_norm_``: ``coef = min(max_norm / (norm + 1e-6), 1)``, every
    gradient multiplied by ``coef`` (Pascanu et al. 2013, "On the difficulty of training recurrent neural
    networks", sec. 3.2), with ``norm = sqrt(sum_g sum(g^2))`` written in plain tensor ops (equal to torch's
    norm of the per-tensor norms up to float rounding). For the compiled functions only: there Inductor fuses
    the squares and sums into its own reduction kernels, while torch's ``_foreach_norm`` stays an ATen kernel
    that Inductor does not lower (``python -m benchmarks.profile_dqn`` lists it).

    Args:
        params: parameters whose ``.grad`` (any float dtype; all on one device) is clipped; those without one
            are skipped. The squares are summed in float32 (float64 gradients lose precision there; torch's
            clip keeps their dtype).
        max_norm: the norm bound (> 0; not checked here: :class:`CompiledStep` checks it).

    Returns:
        The norm before clipping, a 0-d float32 tensor on the gradients' device (a CPU ``0.`` without
        gradients).
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    total = torch.stack([g.detach().float().square().sum() for g in grads]).sum().sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.detach().mul_(coef.to(g.dtype))
    return total


