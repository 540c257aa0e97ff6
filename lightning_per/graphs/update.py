"""One training update captured once in a CUDA graph and replayed: :class:`CapturedUpdate`.

The building block of the DQN module's graph mode (``DQN(compile=True)``, see :mod:`lightning_per.dqn.module`)
and of GA3C's (``cuda_graph: true``); :func:`lightning_per.graphs.capture` shares its rollback helpers. A
side-stream eager warm-up, the rollback of everything the warm-up changed (parameters, optimizer state,
listed device state, generators), the capture with the drawn-from generators registered, and a replay per
call. One replay costs one CPU launch instead of the ~100 kernel launches of a small network's update.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor

from lightning_per.graphs.capturing import cuda_graph_capture
from lightning_per.graphs.streams import warm_up_on_side_stream

__all__ = ["CapturedUpdate", "count_optimizer_step", "no_recompiles"]


class CapturedUpdate:
    """Capture ``body`` (one full update) in a CUDA graph and replay it.

    Args:
        body: ``inputs -> outputs``: one update reading only ``inputs`` (static tensors, possibly
            empty) and device state; capturable (no host reads, static shapes). Its results must be
            in the returned tensors.
        inputs: static input tensors (``(B, ...)`` on the CUDA device) that fix shapes and dtypes;
            ``{}`` when the body samples by itself.
        optimizer: the optimizer stepped inside ``body``.
        params: the parameters it updates; they and the optimizer state are restored after the
            eager warm-up.
        generators: CUDA generators drawn from inside ``body`` (registered with the graph); their
            states are restored after the warm-up, so the first replay draws what the first warm-up did.
        state: other device tensors ``body`` writes (e.g. a sampler's priorities,
            :meth:`~lightning_per.GPUPrioritizedSampler.device_state`), restored in place after the
            warm-up. With params, optimizer, generators and state restored, the warm-up leaves no trace
            and the first replay is the first update.
        warmup: eager iterations on a side stream before capture (allocator and cuBLAS warm-up; with
            ``torch.compile``'d pieces in ``body``, also their compilations and guard-driven recompilations,
            e.g. a compiled optimizer step recompiles once its state exists).
        capture_guard: a context-manager factory entered around the capture alone (e.g.
            :func:`no_recompiles`: a compilation inside a capture is an error).
        capture_error_mode: ``torch.cuda.graph``'s ``capture_error_mode``. ``"global"`` (default): while
            capturing, a potentially unsafe CUDA call (``cudaMalloc``, ``cudaHostAlloc``, a synchronisation,
            an event query, ...) from *any* thread of the process invalidates the capture. ``"thread_local"``:
            only the capturing thread's calls do, so other threads may keep using the device meanwhile (the
            GA3C predictor and trainer threads); they must not draw from a generator the graph registers
            (the device's default CUDA generator always is).

    Raises:
        ValueError: the parameters are not on a CUDA device.
    """

    def __init__(self, body: Callable[[dict[str, Tensor]], dict[str, Tensor]], inputs: dict[str, Tensor],
                 optimizer: torch.optim.Optimizer, params: Sequence[Tensor],
                 generators: Sequence[torch.Generator] = (), warmup: int = 3,
                 capture_guard: Callable[[], contextlib.AbstractContextManager] | None = None,
                 state: Sequence[Tensor] = (), capture_error_mode: str = "global") -> None:
        device = params[0].device
        if device.type != "cuda":
            raise ValueError(f"CapturedUpdate needs params on a CUDA device, got parameters on {device}")
        self.device = device
        self.static_in = {k: v.detach().clone() for k, v in inputs.items()}
        saved = _snapshot(params, optimizer)
        saved_state = [t.clone() for t in state]
        saved_rng = [gen.get_state() for gen in generators]  # CPU byte tensors (no device sync)

        def warm_update() -> None:
            optimizer.zero_grad(set_to_none=True)
            body(self.static_in)

        warm_up_on_side_stream(warm_update, warmup, device)
        _restore(params, optimizer, saved)
        with torch.no_grad():
            for t, v in zip(state, saved_state):
                t.copy_(v)
        for gen, rng in zip(generators, saved_rng):
            gen.set_state(rng)
        self.graph = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)
        with capture_guard() if capture_guard else contextlib.nullcontext(), cuda_graph_capture(
                self.graph, generators, capture_error_mode=capture_error_mode):
            self.static_out = body(self.static_in)

    def __call__(self, inputs: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
        """Copy ``inputs`` into the static tensors and replay; the returned tensors are reused."""
        for key, value in (inputs or {}).items():
            self.static_in[key].copy_(value, non_blocking=True)
        self.graph.replay()
        return self.static_out

    def release(self) -> None:
        """Wait for the device, then free the graph (its memory pool is released once the static tensors
        are gone too). Call it at the end of a run; the object cannot replay afterwards."""
        torch.cuda.synchronize(self.device)  # sync-ok: end of a run; no replay may be in flight
        self.graph.reset()


def count_optimizer_step(opt, n: int = 1) -> None:
    """Report ``n`` optimizer steps taken inside a CUDA graph to Lightning's progress tracking.

    Graph mode steps the raw optimizer inside the graph, past Lightning's optimizer wrapper
    (``opt``, a ``LightningOptimizer`` from ``self.optimizers()`` under manual optimization): this runs
    the wrapper's step hooks, which is all that ``LightningOptimizer.step`` adds around ``optimizer.step``,
    so ``trainer.global_step`` (and ``max_steps``) counts the step. An object without those hooks (a plain
    ``torch.optim.Optimizer``) is left alone."""
    for _ in range(n):
        for hook in ("_on_before_step", "_on_after_step"):
            fn = getattr(opt, hook, None)
            if fn is not None:
                fn()


@contextlib.contextmanager
def no_recompiles() -> Iterator[None]:
    """Inside: a ``torch.compile``'d function that was compiled before raises instead of recompiling
    (first compilations still happen). Wrap warm-ups after the first and CUDA-graph captures with it: a
    compilation inside a capture would record its own benchmarking and allocations."""
    with torch._dynamo.config.patch(error_on_recompile=True):
        yield


@torch.no_grad()
def _snapshot(params: Sequence[Tensor], optimizer: torch.optim.Optimizer):
    """Copies of the parameters and of the optimizer's existing state tensors."""
    state = {id(p): {k: v.clone() for k, v in s.items() if isinstance(v, Tensor)}
             for p, s in optimizer.state.items()}
    return [p.detach().clone() for p in params], state


@torch.no_grad()
def _restore(params: Sequence[Tensor], optimizer: torch.optim.Optimizer, saved) -> None:
    """Put parameters and optimizer state back in place (state created since the snapshot is zeroed)."""
    values, state = saved
    for p, v in zip(params, values):
        p.copy_(v)
    for p, s in optimizer.state.items():
        before = state.get(id(p), {})
        for k, v in s.items():
            if isinstance(v, Tensor):
                v.copy_(before[k]) if k in before else v.zero_()
