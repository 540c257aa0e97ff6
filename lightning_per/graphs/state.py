"""The state a whole-update capture rolls back after its warm-up: :class:`CaptureState`.

:func:`lightning_per.graphs.capture` sorts the user's ``state`` list by kind (tensors, modules, optimizers,
generators, replay buffers and samplers, target updaters), checks that each part can live in a CUDA graph,
snapshots them before the side-stream warm-up and restores them after it, so the first replay is the first
update. A sampler tells the capture what it needs as one value (:class:`~lightning_per.graphs.protocol.SamplerCapture`),
when its class is a :class:`~lightning_per.graphs.protocol.CapturableSampler` (a type check; any other sampler is
refused): this layer imports nothing of :mod:`lightning_per.replay`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import Tensor, nn

from lightning_per.graphs.check import HARD_UPDATE_PROBLEM
from lightning_per.graphs.errors import CaptureError
from lightning_per.graphs.protocol import CapturableSampler, SamplerCapture

__all__ = ["CaptureState", "default_cuda_generator", "sampler_view"]


class CaptureState:
    """What :func:`~lightning_per.graphs.capture` rolls back after its warm-up, sorted by kind from the user's
    ``state`` list.

    Args:
        state: the objects the step changes (see :func:`~lightning_per.graphs.capture`).

    Raises:
        TypeError: an entry of ``state`` is of an unsupported kind (named by its position).

    Example:
        >>> import torch
        >>> from lightning_per.graphs.state import CaptureState
        >>> net = torch.nn.Linear(2, 1)
        >>> parts = CaptureState([net, torch.optim.SGD(net.parameters(), lr=0.1)])
        >>> len(parts.tensors), len(parts.optimizers), parts.device()
        (2, 1, device(type='cpu'))
    """

    def __init__(self, state: Sequence[Any]) -> None:
        from torchrl.data import ReplayBuffer
        from torchrl.data.replay_buffers.samplers import Sampler
        from torchrl.objectives.utils import TargetNetUpdater

        from lightning_per.graphs.targets import HardUpdate

        self.tensors: dict[int, Tensor] = {}
        self.optimizers: list[torch.optim.Optimizer] = []
        self.samplers: list[tuple[Any, Any]] = []  # (sampler, storage or None)
        self._owners: list[Any] = []  # the replay buffer of each sampler, or None
        self.user_generators: list[torch.Generator] = []
        self.updaters: list[Any] = []
        for i, obj in enumerate(state):
            if isinstance(obj, Tensor):
                self._add(obj)
            elif isinstance(obj, nn.Module):
                for t in (*obj.parameters(), *obj.buffers()):
                    self._add(t)
            elif isinstance(obj, torch.optim.Optimizer) or isinstance(getattr(obj, "optimizer", None),
                                                                      torch.optim.Optimizer):
                opt = obj if isinstance(obj, torch.optim.Optimizer) else obj.optimizer  # Lightning's wrapper
                self.optimizers.append(opt)
                for group in opt.param_groups:
                    for p in group["params"]:
                        self._add(p)
            elif isinstance(obj, torch.Generator):
                self.user_generators.append(obj)
            elif isinstance(obj, ReplayBuffer):
                self.samplers.append((obj.sampler, obj.storage))
                self._owners.append(obj)
            elif isinstance(obj, Sampler):
                self.samplers.append((obj, None))
                self._owners.append(None)
            elif isinstance(obj, TargetNetUpdater):
                self.updaters.append(obj)
                for t in obj._targets.values(True, True):
                    self._add(t)
                if isinstance(obj, HardUpdate):  # ours: its schedule's counter lives on the device too
                    self._add(obj.step_count)
            elif isinstance(obj, TensorDictBase):
                for t in obj.values(True, True):
                    self._add(t)
            else:
                raise TypeError(f"state[{i}] must be a tensor, nn.Module, optimizer, generator, replay buffer, "
                                f"sampler or target updater, got {type(obj).__name__}")
        for view in self._views():
            for t in view.tensors:
                self._add(t)

    def _add(self, t: Tensor) -> None:
        self.tensors.setdefault(id(t), t)

    def _views(self, with_storage: bool = False) -> list[SamplerCapture]:
        """Each sampler's :class:`~lightning_per.graphs.protocol.SamplerCapture` for its buffer's batch size (None:
        a bare sampler, or a buffer without one), with its buffer's storage when ``with_storage``."""
        return [sampler_view(s, storage if with_storage else None, None if owner is None else owner.batch_size)
                for (s, storage), owner in zip(self.samplers, self._owners)]

    def device(self) -> torch.device:
        """The first CUDA device among the tensors (samplers' included), else CPU."""
        for t in self.tensors.values():
            if t.device.type == "cuda":
                return t.device
        for view in self._views():
            if view.device is not None and view.device.type == "cuda":
                return view.device
        return torch.device("cpu")

    def check_capturable(self) -> None:
        """CaptureError for a part that cannot live in a graph, whatever the step does with it (read from the
        objects, nothing run: the same verdict on a CPU as on CUDA)."""
        from torchrl.objectives.utils import HardUpdate as TorchRLHardUpdate

        for opt in self.optimizers:
            problem = _optimizer_problem(opt)
            if problem is not None:
                raise CaptureError(problem)
        for view in self._views():
            if view.problem is not None:
                raise CaptureError(view.problem)
        for updater in self.updaters:
            if isinstance(updater, TorchRLHardUpdate):
                raise CaptureError(HARD_UPDATE_PROBLEM)

    def use_problem(self, used: Iterable[Any], step: Callable[..., Any]) -> str | None:
        """Why the objects a run of ``step`` used (:class:`~lightning_per.graphs.check.StepWatch`) cannot be
        captured with this state, or None: TorchRL's ``HardUpdate``, or a replay buffer, sampler or optimizer
        that ``state`` does not list (the warm-up would not be rolled back on it, and a sampler's generator
        would not be registered)."""
        from torchrl.data import ReplayBuffer
        from torchrl.data.replay_buffers.samplers import Sampler
        from torchrl.objectives.utils import HardUpdate as TorchRLHardUpdate

        samplers = {id(s) for s, _ in self.samplers}
        optimizers = {id(opt) for opt in self.optimizers}
        for obj in used:
            if isinstance(obj, TorchRLHardUpdate):
                return f"the step calls {_named(obj, step)}: {HARD_UPDATE_PROBLEM}"
            if isinstance(obj, (ReplayBuffer, Sampler)):
                if id(obj.sampler if isinstance(obj, ReplayBuffer) else obj) not in samplers:
                    return (f"the step uses {_named(obj, step)}, which state does not list: the capture would not "
                            f"roll the warm-up's draws and priority updates back, nor check and register its "
                            f"sampler's random generators; add it to state=[...]")
            elif isinstance(obj, torch.optim.Optimizer) and id(obj) not in optimizers:
                also = _optimizer_problem(obj)
                return (f"the step steps {_named(obj, step)}, which state does not list: the capture would not roll "
                        f"the warm-up's steps back (moments, step count), nor check that it is capturable; add it "
                        f"to state=[...]" + (f"; and {also}" if also else ""))
        return None

    @contextlib.contextmanager
    def host_optimizers(self) -> Iterator[None]:
        """Inside: the param groups built with ``capturable=True`` whose parameters are on the CPU step as
        ``capturable=False`` (torch has capturable steps on accelerators only; the update is the same)."""
        groups = [g for opt in self.optimizers for g in opt.param_groups
                  if g.get("capturable") and any(p.device.type == "cpu" for p in g["params"])]
        for group in groups:
            group["capturable"] = False
        try:
            yield
        finally:
            for group in groups:
                group["capturable"] = True

    def check_ready(self) -> None:
        """CaptureError for a buffer that cannot be captured yet (empty; a sampler not ready for its fill level)."""
        for (_, storage), view in zip(self.samplers, self._views(with_storage=True)):
            if storage is None:
                continue
            if len(storage) == 0:
                raise CaptureError("the replay buffer is empty: extend it before the first call (the graph records "
                                   "reads of its storage)")
            if view.problem is not None:
                raise CaptureError(view.problem)

    def generators(self) -> list[torch.Generator]:
        """The CUDA generators to register with the graph (the device's default one is always registered)."""
        gens: dict[int, torch.Generator] = {}
        # a sampler's: none when the compiled kernels draw from counters in device memory (a registered generator
        # costs every replay two small host-to-device writes)
        drawn = [gen for view in self._views() for gen in view.generators]
        for gen in [*self.user_generators, *drawn]:
            if isinstance(gen, torch.Generator) and gen.device.type == "cuda":
                gens.setdefault(id(gen), gen)
        return [g for g in gens.values() if g is not default_cuda_generator(g.device)]

    @torch.no_grad()
    def snapshot(self, device: torch.device) -> dict[str, Any]:
        """Copies of every tensor, optimizer state, sampler RNG (through its view's ``get_rng_state``: device counters
        too) and generator state (no host sync)."""
        all_gens = list(self.user_generators)
        if device.type == "cuda":
            all_gens.append(default_cuda_generator(device))
        return {"tensors": [(t, t.detach().clone()) for t in self.tensors.values()],
                "optimizers": [(opt, _optimizer_snapshot(opt)) for opt in self.optimizers],
                "samplers": [(view.set_rng_state, view.get_rng_state()) for view in self._views()],
                "generators": [(g, g.get_state()) for g in all_gens]}

    @torch.no_grad()
    def restore(self, saved: dict[str, Any]) -> None:
        """Put back a :meth:`snapshot` in place (optimizer state created since is zeroed)."""
        for t, value in saved["tensors"]:
            t.detach().copy_(value)
        for opt, value in saved["optimizers"]:
            _optimizer_restore(opt, value)
        for set_rng_state, value in saved["samplers"]:
            set_rng_state(value)
        for gen, value in saved["generators"]:
            gen.set_state(value)

    def drop_grads(self) -> None:
        """The optimizers' gradients set to None: the captured backward allocates them in the graph's pool."""
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)


def default_cuda_generator(device: torch.device) -> torch.Generator:
    """The default CUDA generator of ``device`` (the current device when it has no index)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.default_generators[index]


def _optimizer_snapshot(opt: torch.optim.Optimizer) -> dict[int, dict[str, Tensor]]:
    """Copies of the optimizer's existing state tensors, by parameter ``id``."""
    return {id(p): {k: v.clone() for k, v in s.items() if isinstance(v, Tensor)} for p, s in opt.state.items()}


def _optimizer_restore(opt: torch.optim.Optimizer, saved: dict[int, dict[str, Tensor]]) -> None:
    """Put an :func:`_optimizer_snapshot` back in place (state created since the snapshot is zeroed)."""
    for p, s in opt.state.items():
        before = saved.get(id(p), {})
        for k, v in s.items():
            if isinstance(v, Tensor):
                v.copy_(before[k]) if k in before else v.zero_()


#: torch's optimizers without a capturable step (they read their step count or a closure's loss on the host)
_NEVER_CAPTURABLE = (torch.optim.Adagrad, torch.optim.LBFGS, torch.optim.SparseAdam)


def _optimizer_problem(opt: torch.optim.Optimizer) -> str | None:
    """Why ``opt`` cannot step in a CUDA graph, from its kind and its ``capturable`` flags, or None."""
    name = type(opt).__name__
    if isinstance(opt, _NEVER_CAPTURABLE):
        return (f"optimizer {name} has no capturable step (it reads its state on the host), so a CUDA graph cannot "
                f"run it; use one with capturable=True (Adam, AdamW, RMSprop, ...) or SGD")
    if any(group.get("capturable") is False for group in opt.param_groups):
        return (f"optimizer {name} was built with capturable=False: its step count lives on the host, which a CUDA "
                f"graph cannot advance; build it with {name}(..., capturable=True) (on a CPU too: capture steps it "
                f"there as capturable=False)")
    return None


def _named(obj: Any, step: Callable[..., Any]) -> str:
    """``obj`` as the step's code names it (a closure variable or a global of the step), with its type."""
    from torchrl.data import ReplayBuffer

    code = getattr(step, "__code__", None)
    names: dict[str, Any] = {}
    if code is not None:
        names.update({n: getattr(step, "__globals__", {}).get(n) for n in code.co_names})
        cells = getattr(step, "__closure__", None) or ()
        for n, cell in zip(code.co_freevars, cells):
            with contextlib.suppress(ValueError):  # an empty cell
                names[n] = cell.cell_contents
    for n, value in names.items():
        if value is obj:
            return f"`{n}` ({type(obj).__name__})"
        if isinstance(value, ReplayBuffer) and value.sampler is obj:
            return f"`{n}.sampler` ({type(obj).__name__})"
    return type(obj).__name__


def sampler_view(sampler: Any, storage: Any | None, batch_size: int | None) -> SamplerCapture:
    """What a capture needs of ``sampler`` (with ``storage``, or by its kind when None, and the buffer's
    ``batch_size`` or None): its :meth:`~lightning_per.graphs.protocol.CapturableSampler.capture_view` when its class
    is a :class:`~lightning_per.graphs.protocol.CapturableSampler`; any other sampler (TorchRL's, which draw on the
    host from the buffer's generator) contributes nothing and is refused.

    Example:
        >>> from torchrl.data.replay_buffers.samplers import RandomSampler
        >>> from lightning_per.graphs.state import sampler_view
        >>> sampler_view(RandomSampler(), None, 8).problem.split(" (")[0]
        'sampler RandomSampler cannot be captured'
    """
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler

    if isinstance(sampler, CapturableSampler):
        return sampler.capture_view(storage, batch_size)
    # TorchRL's prioritized sampler says where its tree lives (its public ``device``); it still draws on the host
    device = torch.device(sampler.device) if isinstance(sampler, PrioritizedSampler) else None
    return SamplerCapture(f"sampler {type(sampler).__name__} cannot be captured (TorchRL's samplers draw on the "
                          f"host); use lightning_per's GPUPrioritizedReplayBuffer / make_replay_buffer, or capture the "
                          f"learner alone (pass the batch as the step's input)", device=device)
