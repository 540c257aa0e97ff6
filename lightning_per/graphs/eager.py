"""Cached CUDA graphs that stand in for the kernel launches of an eager sampler call.

An eager sample or priority update on the GPU is bound by the host: each kernel launch costs Python and
driver work (a Triton kernel through its Python launcher more), often more than the device work of the
whole step (docs/kernels.md, "Host cost of eager calls"). :class:`EagerGraphs` records the launches of one call shape
(e.g. "draw B = 256 slots and gather their rows") in a ``torch.cuda.CUDAGraph`` the second time that
shape is called, and replays it from then on: one launch instead of several, the same device work, the
same results.

The contract that makes this transparent to callers:

* **Fresh outputs.** A graph writes its outputs into memory it owns; the outputs of every call are
  copied, in the graph, into one flat buffer per dtype and :meth:`EagerGraphs.run` returns views of *one
  clone* of each: a caller may keep them across calls, as with eager ops. One call's outputs of one dtype
  share an allocation (one kept alive keeps the others alive); outputs of different dtypes never do, so
  ``torch.save`` of them works as for eager outputs.
* **Inputs by value.** Tensor arguments are copied into the graph's static inputs (``copy_``, which also
  converts dtypes to the capturing call's) before the replay.
* **No trace of the capture.** The first call of a shape runs eagerly (it compiles and warms the
  kernels); the second captures without a warm-up, so the capture runs nothing, and the generators the
  call draws from are registered with its graph (each replay draws new numbers, exactly those the eager
  call would draw) with their states restored after the capture. Only graphs that draw register them:
  a registered generator costs every replay two small host-to-device updates (its seed and offset).
* **Stale graphs are never replayed.** An entry remembers (weakly) the state tensors the caller names
  (``state``: what the call reads and writes besides its arguments); if any was freed or replaced, the
  entry is dropped and the call is captured again. Generators are not checked: the caller keeps the same
  generator objects (seeding and ``set_state`` act in place). The owner calls :meth:`EagerGraphs.clear`
  when it reallocates its state.
* **Only plain eager calls.** Nothing is cached while ``torch.compile`` traces, while the current
  stream is being captured (an outer CUDA graph records the launches itself) or inside
  :func:`eager_graphs_paused` (the warm-up before such a capture).

The capture synchronises the device once and empties the caching allocator (``torch.cuda.graph`` does,
before it records): a one-time cost per call shape, exempt from ``torch.cuda.set_sync_debug_mode`` while it
runs. A call shape whose capture fails runs eagerly from then on, with one warning. Not thread-safe by
itself: callers serialise calls on one sampler (the replay buffer's locks do).
"""

from __future__ import annotations

import contextlib
import threading
import warnings
import weakref
from collections.abc import Callable, Hashable, Iterator, Sequence

import torch
from torch import Tensor

from lightning_per.graphs.capturing import cuda_graph_capture

__all__ = ["EagerGraphs", "eager_graphs_are_paused", "eager_graphs_paused"]

_EAGER_GRAPHS_PAUSED = threading.local()


@contextlib.contextmanager
def eager_graphs_paused() -> Iterator[None]:
    """Within (this thread only): the samplers' cached CUDA graphs (:class:`EagerGraphs`) neither record nor
    replay; eager calls launch their kernels. :func:`~lightning_per.graphs.streams.warm_up_on_side_stream`
    uses it: a warm-up before a capture is about to record those calls itself, so caching them would only
    cost a sync and memory.

    Example:
        >>> from lightning_per.graphs.eager import eager_graphs_are_paused, eager_graphs_paused
        >>> with eager_graphs_paused():
        ...     eager_graphs_are_paused()
        True
    """
    _EAGER_GRAPHS_PAUSED.depth = getattr(_EAGER_GRAPHS_PAUSED, "depth", 0) + 1
    try:
        yield
    finally:
        _EAGER_GRAPHS_PAUSED.depth -= 1


def eager_graphs_are_paused() -> bool:
    """Whether this thread is inside :func:`eager_graphs_paused`."""
    return getattr(_EAGER_GRAPHS_PAUSED, "depth", 0) > 0


class _Entry:
    """One captured call: static inputs, the graph, its outputs' flat buffers (one per dtype) and where each
    output lies in them (``layout``: ``(buffer number, shape, strides, offset)``)."""

    __slots__ = ("graph", "inputs", "flats", "layout", "refs")

    def __init__(self, graph, inputs: tuple[Tensor, ...], flats: tuple[Tensor, ...], layout: tuple, refs: tuple):
        self.graph, self.inputs, self.flats, self.layout, self.refs = graph, inputs, flats, layout, refs

    def alive(self, tensors: Sequence[Tensor]) -> bool:
        refs = self.refs
        if len(refs) != len(tensors):
            return False
        for ref, t in zip(refs, tensors):
            if ref() is not t:
                return False
        return True

    def __call__(self, args: Sequence[Tensor]) -> tuple[Tensor, ...]:
        for static, value in zip(self.inputs, args):
            static.copy_(value)
        self.graph.replay()
        fresh = [flat.clone() for flat in self.flats]  # one copy per dtype: the caller owns the outputs
        return tuple([fresh[i].as_strided(shape, strides, offset) for i, shape, strides, offset in self.layout])


class EagerGraphs:
    """Per-call-shape CUDA graphs for a sampler's eager calls (see the module docstring).

    Args:
        max_entries: call shapes kept; the oldest is dropped beyond it.
    """

    def __init__(self, max_entries: int = 16) -> None:
        self.max_entries = max_entries
        self._entries: dict[Hashable, _Entry] = {}
        self._seen: set[Hashable] = set()
        self._failed: set[Hashable] = set()  # call shapes whose capture failed: eager from then on
        self._pool = None

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every graph (call when the tensors they read or write are reallocated)."""
        self._entries.clear()
        self._seen.clear()
        self._failed.clear()

    @staticmethod
    def active() -> bool:
        """True when a call may be served by a graph: a plain eager call (not traced by ``torch.compile``,
        not on a stream being captured, not inside :func:`eager_graphs_paused`)."""
        return (not eager_graphs_are_paused() and not torch.compiler.is_compiling()
                and not torch.cuda.is_current_stream_capturing())

    def run(self, key: Hashable, fn: Callable[..., Sequence[Tensor] | None], args: Sequence[Tensor] = (),
            state: Sequence[Tensor] = (), generators: Sequence[torch.Generator] = ()) -> tuple[Tensor, ...]:
        """``fn(*args)``, served by the graph of ``key`` from the second call of ``key`` on.

        Args:
            key: the call shape (hashable; everything ``fn`` bakes in: sizes, flags, host scalars).
            fn: the eager call; returns its output tensors (or None). Capturable: no host reads, no
                allocation whose size depends on device values, CUDA tensors only.
            args: CUDA input tensors, copied by value into the graph's static inputs (same shapes on every
                call of ``key``; dtypes are converted to those of the capturing call).
            state: the other tensors ``fn`` reads or writes (checked for identity before each replay).
            generators: the CUDA generators ``fn`` draws from (registered with its graph).

        Returns:
            ``fn``'s outputs: fresh tensors (eager results on the first call of a key; from the second on,
            views of one new buffer, with ``fn``'s dtypes and shapes, contiguous).
        """
        entry = self._entries.get(key)
        if entry is not None and not entry.alive(state):
            del self._entries[key]
            entry = None
        if entry is None:
            if key not in self._seen or key in self._failed:  # first call: eager (compiles, warms up)
                self._seen.add(key)
                out = fn(*args)
                return tuple(out) if out is not None else ()
            try:
                entry = self._capture(fn, args, state, generators)
            except Exception as err:  # noqa: BLE001 - any capture failure means: launch this shape eagerly
                self._failed.add(key)
                warnings.warn(f"could not capture the eager call {key!r} in a CUDA graph ({err!r}); it runs "
                              f"eagerly from now on", RuntimeWarning, stacklevel=3)
                out = fn(*args)
                return tuple(out) if out is not None else ()
            if len(self._entries) >= self.max_entries:
                self._entries.pop(next(iter(self._entries)))
            self._entries[key] = entry
        return entry(args)

    def _capture(self, fn, args: Sequence[Tensor], state: Sequence[Tensor],
                 generators: Sequence[torch.Generator]) -> _Entry:
        inputs = tuple(torch.empty_like(a, memory_format=torch.contiguous_format) for a in args)
        for static, value in zip(inputs, args):
            static.copy_(value)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        saved = [g.get_state() for g in generators]  # CPU byte tensors: no device sync
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(0)  # sync-ok: torch.cuda.graph synchronises once before it records
        try:
            with cuda_graph_capture(graph, generators, pool=self._pool, capture_error_mode="thread_local"):
                out = fn(*inputs)
                flats, layout = _pack(tuple(out) if out is not None else ())
        finally:
            torch.cuda.set_sync_debug_mode(mode)
            for g, s in zip(generators, saved):
                g.set_state(s)
        return _Entry(graph, inputs, flats, layout, tuple(weakref.ref(t) for t in state))


def _pack(outputs: tuple[Tensor, ...]) -> tuple[tuple[Tensor, ...], tuple]:
    """Copy ``outputs`` into one flat buffer per dtype (recorded in the graph being captured); return the
    buffers and, per output, ``(buffer number, shape, contiguous strides, offset in elements)``."""
    sizes: dict[torch.dtype, int] = {}
    spans = []
    for t in outputs:
        start = sizes.get(t.dtype, 0)
        spans.append((list(sizes).index(t.dtype) if t.dtype in sizes else len(sizes), start))
        sizes[t.dtype] = start + t.numel()
    device = outputs[0].device if outputs else None
    flats = tuple(torch.empty(n, dtype=dtype, device=device) for dtype, n in sizes.items())
    layout = []
    for t, (i, start) in zip(outputs, spans):
        strides = torch.empty(t.shape, device="meta").stride()  # contiguous strides of the shape
        flats[i].as_strided(t.shape, strides, start).copy_(t)
        layout.append((i, tuple(t.shape), strides, start))
    return flats, tuple(layout)
