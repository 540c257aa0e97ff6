"""Whole-update CUDA-graph capture for a user's own training loop: :func:`capture`.

A DQN-style update of a small network is ~100 kernel launches; on a GPU its rate is bound by the host
launching them. :func:`capture` records the user's whole update (sample from our buffer, loss, backward,
optimizer step, target-network update, priority update), ``updates_per_replay`` times over, in one
``torch.cuda.CUDAGraph``, so that each call is one graph replay: one launch on the host, no host
synchronisation. The recipe is torch's (side-stream warm-up, then capture); what it adds is the rollback of
the warm-up (the first replay is the first update, as if the warm-up never ran), the registration of the
generators the step draws from, checks that name what cannot be captured (on a CPU too, where the step runs
eagerly), and that eager fallback. The DQN and GA3C modules' graph modes are built on it too, and
:func:`count_optimizer_step` reports the in-graph optimizer steps to Lightning.
``docs/graphs.md`` describes the limits and how TorchRL's pieces fit.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import Tensor, nn

from lightning_per.graphs.capturing import cuda_graph_capture, no_recompiles
from lightning_per.graphs.check import StepWatch, describe_site, host_syncs_raise
from lightning_per.graphs.eager import eager_graphs_paused
from lightning_per.graphs.errors import CaptureError
from lightning_per.graphs.state import CaptureState

__all__ = ["CaptureError", "CapturedStep", "capture", "count_optimizer_step"]

_SYNC_MESSAGE = "synchronizing CUDA operation"  # torch's message under set_sync_debug_mode("error")


def capture(step: Callable[..., Any], *, state: Sequence[Any], updates_per_replay: int = 1, warmup: int = 3,
            enabled: bool | None = None, device: torch.device | str | None = None, pool: Any = None,
            check: bool = True, check_syncs: bool = True, capture_error_mode: str = "global",
            capture_guard: Callable[[], contextlib.AbstractContextManager] | None = no_recompiles) -> CapturedStep:
    """Turn ``step`` (one whole training update) into a callable that runs ``updates_per_replay`` updates
    per call as one CUDA-graph replay (on CUDA), or plainly (on CPU).

    The first call captures: ``warmup`` eager iterations on a side stream (allocator, cuBLAS, and
    ``torch.compile``'s first compilation run outside the graph), then everything ``state`` lists is put back
    as it was before them (parameters, buffers, optimizer state, the replay buffer's priorities and
    sampler RNG, generators, the device's default CUDA generator), then ``updates_per_replay`` calls of
    ``step`` are recorded and replayed once. So a call, first or later, is exactly ``updates_per_replay``
    eager calls of ``step`` from the state it finds (on the device; see ``docs/graphs.md`` for the tests
    that check it).

    On a CPU (``enabled=None``) no graph is captured and the calls run the updates eagerly, with the same checks
    (``check``): what a GPU capture would refuse is refused here, so a step tested on a laptop captures on the GPU.
    ``state`` is checked at construction; the first call runs its updates watched (host reads, the objects the step
    uses) and, when it finds a problem, puts ``state`` back and raises. An optimizer built with ``capturable=True``
    (what the GPU needs) steps as ``capturable=False`` in the eager calls on a CPU, where torch has no capturable
    path: the same update.

    Args:
        step: ``step(*inputs) -> outputs``: one update. It must be capturable: static shapes, no host reads of
            device values (``.item()``, ``.cpu()``, ``.tolist()``, a Python ``if`` on a tensor), device tensors
            only, capturable optimizers, and everything it changes listed in ``state``. ``inputs``: tensors,
            TensorDicts or dicts of tensors. ``outputs``: a tensor, a dict / tuple of tensors, a TensorDict or None.
        state: everything ``step`` changes that the warm-up must leave untouched: ``nn.Module`` (parameters
            and buffers, e.g. TorchRL's ``DQNLoss`` with its target network, an ``EGreedyModule``),
            ``torch.optim.Optimizer`` (or Lightning's wrapper of one), replay buffers and samplers (ours:
            priorities, sampler RNG), target updaters (TorchRL's ``SoftUpdate``;
            :class:`~lightning_per.graphs.HardUpdate`), ``torch.Generator`` and plain tensors.
        updates_per_replay: K >= 1 calls of ``step`` per call (one graph; the outputs are the last call's).
        warmup: eager iterations (of all K updates) before the capture, >= 1. With ``check_syncs`` the
            second and later ones run under ``torch.cuda.set_sync_debug_mode("error")``: use >= 2 to have a
            host synchronisation named before the capture.
        enabled: capture (True), run eagerly (False: unchecked) or decide from the device (None: capture on
            CUDA, checked eager calls on a CPU).
        device: the CUDA device of the graph (default: that of the first tensor found in ``state``).
        pool: a memory-pool handle (``torch.cuda.graph_pool_handle()`` or another graph's ``pool()``) to
            share with other graphs; default a private pool.
        check: refuse what a graph cannot hold (False: no check, on any device): optimizers without
            ``capturable=True`` (or of a kind that has no capturable step: Adagrad, LBFGS, SparseAdam), host samplers,
            TorchRL's ``HardUpdate`` (in ``state`` or called by the step), a replay buffer, sampler or optimizer the
            step uses but ``state`` does not list, and on a CPU the step's host reads (``.item()``, ``.cpu()``,
            ``.tolist()``, ``.numpy()``, ``float(t)``, a Python ``if`` on a tensor, ``nonzero``, boolean-mask
            indexing, ...; reads inside ``torch.optim`` and inside this package are not the step's).
        check_syncs: name a host synchronisation found in the warm-up on CUDA (``set_sync_debug_mode`` is
            process-wide: turn it off when other threads use the device during the first call); only with ``check``.
        capture_error_mode: ``torch.cuda.graph``'s ``capture_error_mode`` (``"thread_local"`` when other threads
            use the device during the capture).
        capture_guard: a context-manager factory entered around the capture alone (default
            :func:`~lightning_per.graphs.capturing.no_recompiles`: a ``torch.compile``'d function that recompiles
            there raises; None: no guard).

    Returns:
        A :class:`CapturedStep`; call it with the step's inputs (same shapes every call).

    Raises:
        TypeError: ``step`` is not callable, or an entry of ``state`` is of an unsupported kind (named).
        ValueError: ``updates_per_replay`` or ``warmup`` < 1, ``enabled=True`` without a CUDA device, or (at the
            first call) a CUDA ``device`` where CUDA is not available.
        CaptureError: (here or at the first call; with ``check``, on a CPU too) a part cannot live in a graph: an
            optimizer built with ``capturable=False``, a sampler that draws on the host (TorchRL's
            ``PrioritizedSampler``, our rank-based one) or from a host length, TorchRL's ``HardUpdate``; at the
            first call a replay buffer, sampler or optimizer the step uses that ``state`` does not list, a host
            read or synchronisation in the step (the line is named) or a failed capture (the cause is named).
            ``state`` is put back as it was.

    Example:
        >>> import torch
        >>> from lightning_per import graphs
        >>> net = torch.nn.Linear(4, 1)
        >>> opt = torch.optim.Adam(net.parameters(), lr=0.1, capturable=True)  # a CPU steps it non-capturable
        >>> x = torch.ones(8, 4)
        >>> def step():
        ...     opt.zero_grad()
        ...     loss = net(x).square().mean()
        ...     loss.backward()
        ...     opt.step()
        ...     return loss.detach()
        >>> update = graphs.capture(step, state=[net, opt], updates_per_replay=4)  # eager on CPU, checked
        >>> loss = update()  # four updates
        >>> def logging_step():
        ...     return step().item()  # a host read: a graph cannot hold it
        >>> graphs.capture(logging_step, state=[net, opt])()
        Traceback (most recent call last):
        ...
        lightning_per.graphs.errors.CaptureError: the step cannot be captured in a CUDA graph: ...
    """
    return CapturedStep(step, state=state, updates_per_replay=updates_per_replay, warmup=warmup, enabled=enabled,
                        device=device, pool=pool, check=check, check_syncs=check_syncs,
                        capture_error_mode=capture_error_mode, capture_guard=capture_guard)


class CapturedStep:
    """``updates_per_replay`` calls of a step per call: one CUDA-graph replay, or eager calls (see :func:`capture`).

    Attributes:
        graphed: whether calls replay a graph (False: eager fallback).
        checked: whether the step is checked (a graph, or the eager calls that stand in for one on a CPU).
        graph: the ``torch.cuda.CUDAGraph`` once captured (first call), else None.
        calls: calls so far (host int); ``calls * updates_per_replay`` updates ran.
    """

    def __init__(self, step: Callable[..., Any], *, state: Sequence[Any], updates_per_replay: int = 1,
                 warmup: int = 3, enabled: bool | None = None, device: torch.device | str | None = None,
                 pool: Any = None, check: bool = True, check_syncs: bool = True,
                 capture_error_mode: str = "global",
                 capture_guard: Callable[[], contextlib.AbstractContextManager] | None = no_recompiles) -> None:
        if not callable(step):
            raise TypeError(f"step must be a callable (one update), got {type(step).__name__}")
        for name, value in (("updates_per_replay", updates_per_replay), ("warmup", warmup)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if isinstance(state, (Tensor, nn.Module)) or not isinstance(state, Sequence):
            raise TypeError(f"state must be a list of the objects the step changes, got {type(state).__name__}")
        self.step, self.updates_per_replay, self.warmup = step, updates_per_replay, warmup
        self._parts = CaptureState(state)
        self.device = torch.device(device) if device is not None else self._parts.device()
        if enabled and self.device.type != "cuda":
            raise ValueError(f"enabled=True needs a CUDA device, got {self.device} (pass device= or CUDA state)")
        self.graphed = self.device.type == "cuda" if enabled is None else bool(enabled)
        self.checked = bool(check) and (self.graphed or enabled is None)
        if self.checked:
            self._parts.check_capturable()
        self._pool, self._check_syncs, self._error_mode = pool, self.checked and check_syncs, capture_error_mode
        self._guard = capture_guard or contextlib.nullcontext
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_inputs: tuple[Any, ...] = ()
        self.static_outputs: Any = None
        self.calls = 0

    def __call__(self, *inputs: Any) -> Any:
        """Run ``updates_per_replay`` updates on ``inputs`` (tensors, TensorDicts or dicts of tensors, the shapes of
        the first call).

        Graph mode copies ``inputs`` into the static inputs (non-blocking) and replays; the returned outputs
        are the graph's static tensors, overwritten by the next call (clone what you keep). No host sync.

        Raises:
            ValueError: ``inputs`` differ in number or shape from the first call's, or the first call of a graph
                on a CUDA device where CUDA is not available.
            CaptureError: the first call could not capture the step (see :func:`capture`).
        """
        if not self.graphed:
            out = self._checked_updates(inputs) if self.checked and self.calls == 0 else self._eager_updates(inputs)
            self.calls += 1
            return out
        if self.graph is None:
            if not torch.cuda.is_available():
                raise ValueError(f"device={self.device}: CUDA is not available here (build the capture with "
                                 f"enabled=False, or CPU state, to run the updates eagerly)")
            self._capture(inputs)
        else:
            self._copy_inputs(inputs)
        self.graph.replay()
        self.calls += 1
        return self.static_outputs

    def _updates(self, inputs: tuple[Any, ...]) -> Any:
        out = None
        for _ in range(self.updates_per_replay):
            out = self.step(*inputs)
        return out

    def _eager_updates(self, inputs: tuple[Any, ...]) -> Any:
        with self._parts.host_optimizers():
            return self._updates(inputs)

    def _checked_updates(self, inputs: tuple[Any, ...]) -> Any:
        """The first eager call, watched: CaptureError (``state`` put back) for what a graph would refuse."""
        self._parts.check_ready()
        saved = self._parts.snapshot(self.device)
        watch = StepWatch()
        try:
            with watch:
                out = self._eager_updates(inputs)
        except Exception as exc:  # e.g. torch refusing a capturable optimizer on a CPU that state does not list
            problem = self._parts.use_problem(watch.used.values(), self.step)
            if problem is None:
                raise
            self._parts.restore(saved)
            raise CaptureError(problem) from exc
        problem = _read_problem(watch) or self._parts.use_problem(watch.used.values(), self.step)
        if problem is not None:
            self._parts.restore(saved)
            raise CaptureError(problem)
        return out

    def _copy_inputs(self, inputs: tuple[Any, ...]) -> None:
        if len(inputs) != len(self.static_inputs):
            raise ValueError(f"the step was captured with {len(self.static_inputs)} inputs, got {len(inputs)}")
        for i, (static, value) in enumerate(zip(self.static_inputs, inputs)):
            pairs = [(f"{i}[{k!r}]", static[k], value[k]) for k in static] if isinstance(static, dict) else [
                (f"{i}", static, value)]
            for name, to, source in pairs:
                if tuple(to.shape) != tuple(source.shape):
                    raise ValueError(f"input {name} must have the captured shape {tuple(to.shape)}, got "
                                     f"{tuple(source.shape)}")
                to.copy_(source, non_blocking=True)

    def _capture(self, inputs: tuple[Any, ...]) -> None:
        for i, value in enumerate(inputs):
            parts = value.values() if isinstance(value, dict) else (value,)
            if not all(isinstance(v, (Tensor, TensorDictBase)) for v in parts):
                raise TypeError(f"input {i} must be a tensor, a TensorDict or a dict of tensors, got "
                                f"{type(value).__name__}")
        self._parts.check_ready()
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        device = self.device
        self.static_inputs = tuple(_static_copy(x, device) for x in inputs)
        saved = self._parts.snapshot(device)
        try:
            self._warm_up(device)
        except BaseException:
            self._parts.restore(saved)
            raise
        self._parts.restore(saved)
        self._parts.drop_grads()
        graph = torch.cuda.CUDAGraph()
        kwargs = {"capture_error_mode": self._error_mode} | ({"pool": self._pool} if self._pool is not None else {})
        try:
            with self._guard(), cuda_graph_capture(graph, self._parts.generators(), **kwargs):
                out = self._updates(self.static_inputs)
        except Exception as exc:
            self._parts.restore(saved)
            raise CaptureError(_capture_failure(exc)) from exc
        self.graph, self.static_outputs = graph, _detached(out)

    def _warm_up(self, device: torch.device) -> None:
        """``warmup`` runs of the K updates on a side stream, the second and later ones checked for syncs."""
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        try:
            with torch.cuda.stream(stream), eager_graphs_paused():
                for i in range(self.warmup):
                    # the objects the step uses, watched in the last run (compiled by then: fewer calls to watch)
                    watch = StepWatch(reads=False) if self.checked and i == self.warmup - 1 else None
                    with host_syncs_raise(self._check_syncs and i > 0), watch or contextlib.nullcontext():
                        try:
                            self._updates(self.static_inputs)
                        except RuntimeError as exc:
                            if _SYNC_MESSAGE not in str(exc):
                                raise
                            raise CaptureError(_sync_failure(exc)) from exc
                    problem = None if watch is None else self._parts.use_problem(watch.used.values(), self.step)
                    if problem is not None:
                        raise CaptureError(problem)
        finally:  # also on failure: the rollback that follows runs after the warm-up's work
            torch.cuda.current_stream(device).wait_stream(stream)

    def pool(self) -> Any:
        """The graph's memory-pool handle (to share it with another capture's ``pool=``); None before capture."""
        return None if self.graph is None else self.graph.pool()

    def release(self) -> None:
        """Wait for the device and free the graph (its pool goes once the outputs are dropped too). Eager: no-op."""
        if self.graph is not None:
            torch.cuda.synchronize(self.device)  # sync-ok: end of a run; no replay may be in flight
            self.graph.reset()
            self.graph = None


def count_optimizer_step(opt: Any, n: int = 1) -> None:
    """Report ``n`` optimizer steps taken inside a CUDA graph to Lightning's progress tracking.

    A captured update steps the raw optimizer inside the graph, past Lightning's optimizer wrapper (``opt``, a
    ``LightningOptimizer`` from ``self.optimizers()`` under manual optimization): this runs the wrapper's step
    hooks, which is all that ``LightningOptimizer.step`` adds around ``optimizer.step``, so
    ``trainer.global_step`` (and ``max_steps``) counts the step. An object without those hooks (a plain
    ``torch.optim.Optimizer``) is left alone."""
    for _ in range(n):
        for hook in ("_on_before_step", "_on_after_step"):
            fn = getattr(opt, hook, None)
            if fn is not None:
                fn()


def _static_copy(x: Any, device: torch.device) -> Any:
    """A copy of an input on ``device``: the graph's static input (a dict's values copied one by one)."""
    if isinstance(x, dict):
        return {k: v.to(device, non_blocking=True).clone() for k, v in x.items()}
    return x.to(device, non_blocking=True).clone()


def _detached(out: Any) -> Any:
    """The step's outputs without their autograd history (same storage)."""
    if isinstance(out, Tensor):
        return out.detach()
    if isinstance(out, TensorDictBase):
        return out.detach()
    if isinstance(out, dict):
        return {k: _detached(v) for k, v in out.items()}
    if isinstance(out, (tuple, list)):
        return type(out)(_detached(v) for v in out)
    return out


def _frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """The traceback's frames outside torch and this file, innermost last."""
    torch_dir = os.path.dirname(torch.__file__) + os.sep
    return [f for f in traceback.extract_tb(exc.__traceback__)
            if not f.filename.startswith(torch_dir) and os.path.abspath(f.filename) != os.path.abspath(__file__)]


_NO_HOST_READS = ("A graph cannot read device values on the host: .item(), .cpu(), .tolist(), float(t), print(t), a "
                  "Python if/while on a tensor, torch.nonzero or boolean-mask indexing. Keep the value on the device "
                  "(torch.where, masks, device counters) or move the read out of the step.")


def _sync_failure(exc: BaseException) -> str:
    return (f"the step cannot be captured in a CUDA graph: {describe_site(_frames(exc))} synchronises with the host. "
            f"{_NO_HOST_READS}")


def _read_problem(watch: StepWatch) -> str | None:
    """The CaptureError message for the first host read a CPU run of the step made, or None."""
    if watch.read is None:
        return None
    what, frames = watch.read
    return (f"the step cannot be captured in a CUDA graph: {describe_site(frames)} reads on the host: {what}. "
            f"{_NO_HOST_READS} (check=False turns the check off.)")


def _capture_failure(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    frames = _frames(exc)
    where = f" at `{frames[-1].line}` ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    if "capturable" in str(exc):
        hint = "build the optimizer with capturable=True (and list it in state=)"
    elif "recompil" in str(exc).lower():
        hint = "a torch.compile'd function recompiled during the capture: raise warmup (it compiles in the warm-up)"
    else:
        hint = ("usual causes: a host synchronisation (run with warmup >= 2 and check_syncs=True to have it named), "
                "a copy from pageable host memory (keep the step's tensors on the device), a custom generator the "
                "step draws from that is not in state=, another thread using the device "
                "(capture_error_mode='thread_local')")
    return f"capturing the step in a CUDA graph failed{where}: {type(exc).__name__}: {text}; {hint}"
