"""What :func:`~lightning_per.graphs.capture` checks by watching the step run: :class:`StepWatch`.

On a CPU no graph is captured, so nothing refuses a step that a GPU capture would: the first call of a checked
capture runs its updates under a :class:`StepWatch`, which records

- host reads of tensor values (a ``TorchDispatchMode``: ``aten._local_scalar_dense`` is ``.item()``, ``float(t)``,
  ``int(t)``, a Python ``if`` on a tensor; ``nonzero``, boolean-mask indexing, ``masked_select``, ``unique``,
  ``bincount``, ``equal`` and ``repeat_interleave`` without ``output_size`` read a size or a value on the host),
  and calls of ``Tensor.item`` / ``.tolist`` / ``.cpu`` / ``.numpy`` (a profile hook: on a CPU tensor ``.cpu()``
  dispatches nothing, yet on the device it is a copy to the host);
- the replay buffers, samplers, optimizers and target updaters whose methods the step calls (the same profile
  hook), to compare with what ``state`` lists.

Reads made inside ``torch.optim`` (an optimizer's CPU path: its ``capturable`` flag is checked instead) and inside
this package or its kernels (our CPU paths; the GPU tests check the device paths make none) are not the step's.
On CUDA the warm-up watches the objects only (``set_sync_debug_mode`` names the host reads there).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HARD_UPDATE_PROBLEM", "StepWatch", "describe_site"]

HARD_UPDATE_PROBLEM = ("TorchRL's HardUpdate counts steps in a Python int, which a CUDA graph freezes (it would copy "
                       "at every replay or never); use lightning_per.graphs.HardUpdate, the same schedule on a device "
                       "counter")

_aten = torch.ops.aten
#: ops whose CUDA kernels read a value or an output size on the host, with how a step usually spells them
_READS = {
    _aten._local_scalar_dense: "a tensor's value read on the host (.item(), float(t), int(t), a Python if/while on "
                               "a tensor)",
    _aten.nonzero: "torch.nonzero (its output size is read on the host)",
    _aten.masked_select: "masked_select (its output size is read on the host)",
    _aten._unique: "unique (its output size is read on the host)",
    _aten._unique2: "unique (its output size is read on the host)",
    _aten.unique_dim: "unique (its output size is read on the host)",
    _aten.unique_consecutive: "unique_consecutive (its output size is read on the host)",
    _aten.unique_dim_consecutive: "unique_consecutive (its output size is read on the host)",
    _aten.bincount: "bincount (its output size is read on the host)",
    _aten.equal: "torch.equal (a host bool)",
}
_MASK_INDEXING = {_aten.index, _aten.index_put, _aten.index_put_, _aten._index_put_impl_}
_HOST_METHODS = frozenset({"item", "tolist", "cpu", "numpy"})

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OPTIM_DIR = os.path.join(_TORCH_DIR, "optim") + os.sep
_THIS_FILE = os.path.abspath(__file__)
#: the frames between the op's caller and :class:`_HostReads` (the mode's dispatch, dynamo's disable wrapper)
_MACHINERY = tuple(os.path.join(_TORCH_DIR, *p) for p in (("utils", "_python_dispatch"), ("_compile.py",),
                                                          ("_dynamo",)))


def _our_dirs() -> tuple[str, ...]:
    """This package's folder and its kernels' (``ext/``, installed as ``lightning_per.ext``)."""
    package = os.path.dirname(os.path.dirname(_THIS_FILE)) + os.sep
    spec = importlib.util.find_spec("lightning_per.ext")
    kernels = [os.path.abspath(p) + os.sep for p in (spec.submodule_search_locations or [])] if spec else []
    return (package, *kernels)


_OURS = _our_dirs()


def describe_site(frames: list[traceback.FrameSummary]) -> str:
    """```line``` (file:lineno) of the innermost frame outside torch, plus the user's line that called it when that
    frame is in an installed library; "an operation of the step" when there is none."""
    frames = [f for f in frames if not f.filename.startswith(_TORCH_DIR)]
    if not frames:
        return "an operation of the step"
    inner = frames[-1]
    where = f"`{inner.line}` ({inner.filename}:{inner.lineno})"
    outer = [f for f in frames if "site-packages" not in f.filename and f is not inner]
    if "site-packages" in inner.filename and outer:
        where += f", called from `{outer[-1].line}` ({outer[-1].filename}:{outer[-1].lineno})"
    return where


class StepWatch:
    """While active on this thread: the first host read the step makes (``reads=True``) and the replay buffers,
    samplers, optimizers and target updaters whose methods it calls.

    Args:
        reads: record host reads too (on a CPU; on CUDA the sync debug mode names them).

    Attributes:
        read: ``(what, frames)`` of the first host read of the step, or None.
        used: the objects of those kinds whose methods ran, by ``id``, in call order.
        blind: True when another profile function was set (a profiler): the calls were not watched.

    Example:
        >>> import torch
        >>> from lightning_per.graphs.check import StepWatch
        >>> with StepWatch() as watch:
        ...     n = int(torch.ones(3).sum())
        >>> watch.read[0]
        "a tensor's value read on the host (.item(), float(t), int(t), a Python if/while on a tensor)"
    """

    def __init__(self, *, reads: bool = True) -> None:
        from torchrl.data import ReplayBuffer
        from torchrl.data.replay_buffers.samplers import Sampler
        from torchrl.objectives.utils import TargetNetUpdater

        self._reads = reads
        self._kinds = (ReplayBuffer, Sampler, TargetNetUpdater, torch.optim.Optimizer)
        self.read: tuple[str, list[traceback.FrameSummary]] | None = None
        self.used: dict[int, Any] = {}
        self.blind = False
        self._mode: TorchDispatchMode | None = None
        self._before: Callable[..., Any] | None = None

    def __enter__(self) -> StepWatch:
        self._before = sys.getprofile()
        self.blind = self._before is not None
        if not self.blind:
            sys.setprofile(self._profile)
        if self._reads:
            self._mode = _HostReads(self)
            self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._mode is not None:
            self._mode.__exit__(*exc)
            self._mode = None
        if not self.blind:
            sys.setprofile(self._before)

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            if code.co_argcount and code.co_varnames[0] == "self":
                obj = frame.f_locals.get("self")
                # the class's MRO, not isinstance: a metaclass's __instancecheck__ would run code on any object,
                # half-built ones included
                if any(kind in type(obj).__mro__ for kind in self._kinds):
                    self.used.setdefault(id(obj), obj)
        elif event == "c_call" and self._reads and self.read is None:
            name = getattr(arg, "__name__", None)
            if name in _HOST_METHODS and isinstance(getattr(arg, "__self__", None), Tensor):
                self.note(f"Tensor.{name}() (a copy to the host)", traceback.extract_stack(frame))

    def note(self, what: str, frames: list[traceback.FrameSummary]) -> None:
        """Record a host read made at ``frames`` (innermost last) unless it is not the step's (see the module)."""
        if self.read is not None:
            return
        while frames and (os.path.abspath(frames[-1].filename) == _THIS_FILE
                          or frames[-1].filename.startswith(_MACHINERY)):
            frames = frames[:-1]
        if frames and frames[-1].filename.startswith(_OPTIM_DIR):
            return  # the optimizer's own step (torch's CPU path reads its step count)
        outside = [f for f in frames if not f.filename.startswith(_TORCH_DIR)]
        if outside and any(os.path.abspath(outside[-1].filename).startswith(d) for d in _OURS):
            return  # our CPU path (the device path is checked to make none)
        self.read = (what, frames)


class _HostReads(TorchDispatchMode):
    """Notes the ops whose CUDA kernels read on the host (``_READS``, boolean-mask indexing,
    ``repeat_interleave`` without ``output_size``) to its :class:`StepWatch`."""

    def __init__(self, watch: StepWatch) -> None:
        super().__init__()
        self._watch = watch

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._watch.read is None:
            what = _READS.get(func.overloadpacket)
            if what is None and func.overloadpacket in _MASK_INDEXING and _has_mask(args[1] if len(args) > 1 else ()):
                what = "boolean-mask indexing (its output size is read on the host)"
            if what is None and func is _aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
                what = "repeat_interleave without output_size (its output size is read on the host)"
            if what is not None:
                self._watch.note(what, traceback.extract_stack())
        return func(*args, **kwargs)


def _has_mask(indices: Any) -> bool:
    return any(isinstance(t, Tensor) and t.dtype in (torch.bool, torch.uint8) for t in indices or ())


@contextlib.contextmanager
def host_syncs_raise(on: bool = True) -> Iterator[None]:
    """Inside (when ``on``): a host synchronisation on CUDA raises a ``RuntimeError``
    (``torch.cuda.set_sync_debug_mode("error")``); the mode before is put back on exit.

    Example:
        >>> from lightning_per.graphs.check import host_syncs_raise
        >>> with host_syncs_raise(on=False):  # on=True needs CUDA
        ...     pass
    """
    if not on:
        yield
        return
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(before)
