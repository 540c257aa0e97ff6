"""How the DQN module runs its gradient updates: one strategy object, chosen once when the runtime is built.

A strategy runs one block of ``n`` updates (sample -> double-DQN target and IS-weighted Huber loss ->
backward -> clip -> Adam step -> priority update -> Polyak target update and metrics, all on the device)
and returns the last update's outputs; the module does the host bookkeeping around it (env collection,
beta, counters, the hard target copy). :func:`choose_update` picks one from the module's settings:

============================  ============================================================================
:class:`EagerUpdate`          ``compile=False``: plain calls, Lightning's ``manual_backward`` (DDP's reducer
                              averages the gradients); ``n == 1``.
:class:`LearnerGraphUpdate`   ``compile=True`` with a sampler that is not captured (``rank``, ``uniform``):
                              the batch is sampled eagerly into the static inputs of a captured learner step;
                              priorities and metrics are updated eagerly; ``n == 1``.
:class:`ReplayGraphUpdate`    ``compile=True`` with our proportional sampler on CUDA: ``n`` whole updates in
                              one CUDA graph, each update's priority write and the next draw forked onto a
                              second stream (:func:`~lightning_per.graphs.pipeline.pipelined_updates`).
============================  ============================================================================

The math of one update is a :class:`Learner`, shared by the three: plain torch, or with ``inductor=True``
the pieces :class:`~lightning_per.dqn.compiled.InductorUpdate` compiled (and in graph mode the compiled Adam
step, :class:`~lightning_per.dqn.compiled.CompiledStep`). Graph mode: docs/dqn.md, "Graph mode".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from lightning_per.dqn.compiled import CompiledStep, InductorUpdate
from lightning_per.dqn.ddp import graph_backward
from lightning_per.dqn.learner import MetricSlots, finish_update_, learner_step
from lightning_per.graphs import CapturedStep, capture, count_optimizer_step
from lightning_per.graphs.capturing import no_recompiles
from lightning_per.graphs.pipeline import SideStream, pipelined_updates
from lightning_per.replay import GPUPrioritizedSampler

if TYPE_CHECKING:
    from lightning_per.dqn.module import DQN

__all__ = ["EagerUpdate", "Learner", "LearnerGraphUpdate", "ReplayGraphUpdate", "UpdateStrategy", "batch_inputs",
           "choose_update"]


def batch_inputs(batch, weight: Tensor | None) -> dict[str, Tensor]:
    """The learner's inputs from a replay TensorDict ``[B]`` (IS weights ``(B,) float32``, ones if None)."""
    reward = batch["reward"]
    return {"observation": batch["observation"], "next_observation": batch["next_observation"],
            "action": batch["action"], "reward": reward, "discount": batch["discount"],
            "weight": torch.ones_like(reward) if weight is None else weight.to(torch.float32)}


class Learner:
    """One update's math on the module's networks: :func:`~lightning_per.dqn.learner.learner_step` and the
    device-side end of an update (:func:`~lightning_per.dqn.learner.finish_update_`), plain or compiled.

    Args:
        q_net, target_net: the online and target networks.
        metrics: the module's ``MetricAccumulator`` (its ``values``/``counts`` are updated in place).
        sampler: the prioritized replay sampler, whose ``clamped_priority_count`` each update records, or None
            (uniform replay: no priorities to clamp).
        double_dqn, huber_delta, grad_clip_norm, target_tau: the module's arguments of those names.
        inductor: the compiled pieces (``DQN(inductor=True)``), or None for plain torch.

    Attributes:
        slots: where one update's metrics go in ``metrics`` (:class:`~lightning_per.dqn.learner.MetricSlots`).
    """

    def __init__(self, q_net: nn.Module, target_net: nn.Module, metrics, sampler, *, double_dqn: bool,
                 huber_delta: float, grad_clip_norm: float | None, target_tau: float | None,
                 inductor_mode: str | None = None) -> None:
        self.q_net, self.target_net, self.metrics, self.sampler = q_net, target_net, metrics, sampler
        self.double_dqn, self.huber_delta, self.grad_clip_norm = double_dqn, huber_delta, grad_clip_norm
        self.target_tau = target_tau
        self.online, self.target = list(q_net.parameters()), list(target_net.parameters())
        self.slots = MetricSlots.of(list(metrics.kinds), metrics.device)
        self.inductor: InductorUpdate | None = None
        if inductor_mode is not None:
            self.inductor = InductorUpdate(q_net, target_net, double_dqn=double_dqn, huber_delta=huber_delta,
                                           grad_clip_norm=grad_clip_norm, slots=self.slots, target_tau=target_tau,
                                           mode=inductor_mode)
        self._compiled_step: CompiledStep | None = None

    def step(self, b: dict[str, Tensor], backward=None, optimizer=None, after_forward=None) -> dict[str, Tensor]:
        """:func:`~lightning_per.dqn.learner.learner_step` on ``b`` with these networks and settings."""
        fast = self.inductor
        # a compiled step that clips (ours, built by graph_optimizer) clips itself; any other optimizer is stepped
        # after learner_step's clip
        clip = None if isinstance(optimizer, CompiledStep) and optimizer.clips else self.grad_clip_norm
        return learner_step(self.q_net, self.target_net, optimizer, b, double_dqn=self.double_dqn,
                            huber_delta=self.huber_delta, grad_clip_norm=clip, backward=backward,
                            loss_fn=None if fast is None else fast.loss, clip_fn=None if fast is None else fast.clip,
                            after_forward=after_forward)

    def finish(self, out: dict[str, Tensor]) -> None:
        """Polyak target update (``target_tau`` set) and the update's metrics, in place on the device."""
        m = self.metrics
        clamped = None if self.sampler is None else self.sampler.clamped_priority_count
        if self.inductor is not None:
            self.inductor.finish(m.values, m.counts, out, clamped)
        else:
            finish_update_(m.values, m.counts, out, clamped, slots=self.slots, target=self.target,
                           online=self.online, tau=self.target_tau)

    def graph_optimizer(self, raw: torch.optim.Optimizer):
        """What a captured update steps: ``raw``, or with Inductor its compiled clip + Adam step (built once)."""
        if self.inductor is None:
            return raw
        if self._compiled_step is None or self._compiled_step.optimizer is not raw:
            clip = None if self.grad_clip_norm is None else (self.online, self.grad_clip_norm)
            self._compiled_step = CompiledStep(raw, clip=clip)  # clip + Adam: one compiled function
        return self._compiled_step

    @property
    def capture_guard(self):
        """The ``capture_guard`` of the module's captures: with Inductor, a recompilation in the capture raises
        (see ``dqn/compiled.py``); None without (nothing is compiled)."""
        return no_recompiles if self.inductor is not None else None


def choose_update(module: DQN, device: torch.device) -> UpdateStrategy:
    """The update strategy for ``module``'s settings and its runtime built on ``device`` (the table above).

    Raises:
        ValueError: ``updates_per_graph > 1`` without the whole update captured.

    Example::

        >>> import torch
        >>> from lightning_per.dqn import DQN, ReplayConfig
        >>> from lightning_per.dqn.updates import choose_update
        >>> from lightning_per.envs import EnvConfig
        >>> m = DQN(env=EnvConfig(backend="torch", num_envs=4), replay=ReplayConfig(capacity=256, batch_size=16),
        ...         hidden_sizes=[16])
        >>> m.build_runtime("cpu")  # calls choose_update(m, device)
        >>> type(m.updater).__name__, type(choose_update(m, torch.device("cpu"))).__name__
        ('EagerUpdate', 'EagerUpdate')
    """
    h = module.hparams
    if not h.compile:
        chosen = EagerUpdate(module)
    elif ReplayGraphUpdate.captures(module.rb.sampler, module.replay_config.sampler):
        chosen = ReplayGraphUpdate(module)
    else:
        chosen = LearnerGraphUpdate(module)
    if h.updates_per_graph > 1 and not isinstance(chosen, ReplayGraphUpdate):
        raise ValueError(f"updates_per_graph={h.updates_per_graph} needs graph mode with the "
                         f"whole update captured: compile=True and replay.sampler='proportional' on CUDA "
                         f"(got compile={h.compile}, sampler={module.replay_config.sampler!r}, "
                         f"device {device}); use updates_per_graph=1")
    return chosen


class UpdateStrategy:
    """How a block of updates runs; ``strategy(n)`` runs ``n`` updates and returns the last one's outputs
    (those of :func:`~lightning_per.dqn.learner.learner_step`: ``loss`` 0-d, ``td``, ``td_abs``, ``q``,
    ``weight`` ``(B,)`` float32 on the device).

    Args:
        module: the DQN module (its ``rb``, ``learner``, ``optimizers()`` and ``manual_backward`` are read at
            each call: a Trainer sets the optimizer up after the strategy is chosen).
    """

    in_graph = False
    """Whether the Polyak update and the metrics run inside a CUDA graph (else eagerly, still on the device)."""

    def __init__(self, module: DQN) -> None:
        self.module = module
        self.captured: CapturedStep | None = None

    def __call__(self, n: int = 1) -> dict[str, Tensor]:
        raise NotImplementedError

    def release(self) -> None:
        """Release the captured graph, if any (under DDP it holds NCCL collectives); the next call captures
        again."""
        if self.captured is not None:
            self.captured.release()
            self.captured = None


class EagerUpdate(UpdateStrategy):
    """``compile=False``: one update of plain calls; the backward is Lightning's ``manual_backward``."""

    def __call__(self, n: int = 1) -> dict[str, Tensor]:
        m = self.module
        opt = m.optimizers()
        batch = m.rb.sample()  # [B]
        opt.zero_grad(set_to_none=True)
        out = m.learner.step(batch_inputs(batch, batch.get("priority_weight", None)), backward=m.manual_backward,
                             optimizer=opt)
        if m.replay_config.sampler != "uniform":
            m.rb.update_priority(batch["index"], out["td_abs"])
        m.learner.finish(out)
        return out


class LearnerGraphUpdate(UpdateStrategy):
    """``compile=True`` with a sampler that is not captured: the learner step is one CUDA graph
    (:func:`~lightning_per.graphs.capture`), captured at the first call with that call's batch as its static
    inputs; sampling, the priority update, the Polyak update and the metrics run eagerly around it. On a CPU
    the capture runs the step eagerly (checked): graph mode's code path without the graph."""

    def __call__(self, n: int = 1) -> dict[str, Tensor]:
        m = self.module
        opt = m.optimizers()
        batch = m.rb.sample()  # [B]
        b = batch_inputs(batch, batch.get("priority_weight", None))
        if self.captured is None:
            learner, raw = m.learner, opt.optimizer
            backward = graph_backward(m.q_net.parameters, m._grad_world_size)
            stepper = learner.graph_optimizer(raw)

            def step(x: dict[str, Tensor]) -> dict[str, Tensor]:
                raw.zero_grad(set_to_none=True)  # a fresh gradient each update (in a graph: allocated in its pool)
                return learner.step(x, backward=backward, optimizer=stepper)

            # check_syncs off: the warm-up's guard-driven recompilation (Inductor) may synchronise outside the step
            self.captured = capture(step, state=[m.q_net, raw], capture_guard=learner.capture_guard,
                                    check_syncs=learner.inductor is None)
            m.graph_captures += 1
        out = self.captured(b)
        count_optimizer_step(opt)
        if m.replay_config.sampler != "uniform":
            m.rb.update_priority(batch["index"], out["td_abs"])
        m.learner.finish(out)
        return out


class ReplayGraphUpdate(UpdateStrategy):
    """``compile=True`` with our proportional sampler on CUDA: ``n`` whole updates (:meth:`body`) in one CUDA
    graph (:func:`~lightning_per.graphs.capture`), captured at the first call. The warm-up leaves no trace
    (parameters, optimizer state, target network, priorities, the sampler's RNG and the metric sums are rolled
    back), so the first replay is the first update. The Polyak update and the metrics run inside the graph."""

    in_graph = True

    def __init__(self, module: DQN) -> None:
        super().__init__(module)
        self.side: SideStream | None = None

    @staticmethod
    def captures(sampler, name: str) -> bool:
        """Whether the whole update can be captured with ``sampler`` (config name ``name``): ours,
        proportional, drawing from a CUDA generator."""
        return (name == "proportional" and isinstance(sampler, GPUPrioritizedSampler)
                and sampler.generator.device.type == "cuda")

    def __call__(self, n: int = 1) -> dict[str, Tensor]:
        m = self.module
        if self.captured is None:
            learner = m.learner
            # rolled back after the warm-up; the buffer's sampler gives the generators its draws consume
            state = [m.q_net, m.target_net, m.optimizers().optimizer, m.rb, m.metrics.values, m.metrics.counts]
            self.captured = capture(self.body(n), state=state, capture_guard=learner.capture_guard,
                                    check_syncs=learner.inductor is None)  # see LearnerGraphUpdate
            m.graph_captures += 1
        out = self.captured()
        count_optimizer_step(m.optimizers(), n)
        return out

    def body(self, n: int):
        """The captured body: ``n`` consecutive updates, each sample -> batch -> learner step -> priority update
        -> Polyak update and metrics, on the device, each update's priority update and the next update's sample
        forked onto a second stream, concurrent with its backward and optimizer step
        (:func:`~lightning_per.graphs.pipeline.pipelined_updates`). Returns ``body() -> out`` (the last update's
        outputs; the body samples by itself). Runs eagerly too (on the CPU)."""
        m = self.module
        rb, batch_size, learner = m.rb, m.replay_config.batch_size, m.learner
        optimizer = m.optimizers().optimizer
        backward = graph_backward(m.q_net.parameters, m._grad_world_size)
        stepper = learner.graph_optimizer(optimizer)
        if self.side is None:
            self.side = SideStream(m.device)

        def draw() -> tuple[Tensor, dict[str, Any], Any]:  # sample + gather: one fused op with packed storage
            # the fields as views of the gathered rows: the update consumes them at once (no copy kernel)
            return rb.sampler.sample_gather(rb.storage, batch_size, contiguous=False)  # ([B], {[B]}, [B])

        def learn(i: int, sample, after_forward) -> dict[str, Tensor]:
            optimizer.zero_grad(set_to_none=True)  # each update's backward starts from no gradient, never sums
            _, info, batch = sample
            return learner.step(batch_inputs(batch, info["priority_weight"]), backward=backward, optimizer=stepper,
                                after_forward=after_forward)

        def write(sample, td_abs: Tensor) -> None:  # indices come from the sampler: storage=None
            rb.sampler.update_priority(sample[0], td_abs, storage=None)

        return lambda: pipelined_updates(n, draw, learn, write, self.side, finish=learner.finish)
