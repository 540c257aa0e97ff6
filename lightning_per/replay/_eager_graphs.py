"""Cached CUDA graphs that stand in for the kernel launches of an eager sampler call.

An eager sample or priority update on the GPU is bound by the host: each kernel launch costs ~10 us of
Python and driver work (a Triton kernel through its Python launcher ~25 us), while the device work of a
whole step at N = 1e6, B = 256 takes ~20 us. :class:`EagerGraphs` records the launches of one call shape
(e.g. "draw B = 256 slots and gather their rows") in a ``torch.cuda.CUDAGraph`` the second time that
shape is called, and replays it from then on: one launch instead of several, the same device work, the
same results.

The contract that makes this transparent to callers:

* **Fresh outputs.** A graph writes its outputs into memory it owns; the outputs of every call are
  copied, in the graph, into one flat buffer and :meth:`EagerGraphs.run` returns views of *one clone*
  of it: a caller may keep them across calls, as with eager ops.
* **Inputs by value.** Tensor arguments are copied into the graph's static inputs (``copy_``, which also
  converts dtypes) before the replay.
* **No trace of the capture.** The first call of a shape runs eagerly (it compiles and warms the
  kernels); the second captures without a warm-up, so the capture runs nothing, and the generators the
  call draws from are registered with its graph (each replay draws new numbers, exactly those the eager
  call would draw) with their states restored after the capture. Only graphs that draw register them:
  a registered generator costs every replay two small host-to-device updates (its seed and offset).
* **Stale graphs are never replayed.** An entry remembers (weakly) the tensors it reads and writes; if
  any was freed or replaced, the entry is dropped and the call runs eagerly again. The owner calls
  :meth:`EagerGraphs.clear` when it reallocates its state.
* **Only plain eager calls.** Nothing is cached while ``torch.compile`` traces or while the current
  stream is being captured (an outer CUDA graph records the launches itself).

The capture synchronises the device once (``torch.cuda.graph`` does, before it records): a one-time cost
per call shape, exempt from ``torch.cuda.set_sync_debug_mode`` while it runs. Not thread-safe by itself:
callers serialise calls on one sampler (the replay buffer's locks do).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable, Sequence

import torch
from torch import Tensor

from lightning_per.utils import gc_paused

__all__ = ["EagerGraphs"]

_WORD = 8  # bytes: outputs start at multiples of 8 bytes in the flat int64 buffer


class _Entry:
    """One captured call: static inputs, the graph, and the layout of its outputs in ``flat``."""

    __slots__ = ("graph", "inputs", "flat", "layout", "refs")

    def __init__(self, graph, inputs: tuple[Tensor, ...], flat: Tensor | None, layout: tuple, refs: tuple):
        self.graph, self.inputs, self.flat, self.layout, self.refs = graph, inputs, flat, layout, refs

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
        if self.flat is None:
            return ()
        fresh = self.flat.clone()  # one copy for all outputs: the caller owns them
        bases = {torch.int64: fresh}
        out = []
        for dtype, shape, strides, offset in self.layout:  # one view op per output (+1 per other dtype)
            base = bases.get(dtype)
            if base is None:
                base = bases[dtype] = fresh.view(dtype)
            out.append(base.as_strided(shape, strides, offset))
        return tuple(out)


class EagerGraphs:
    """Per-call-shape CUDA graphs for a sampler's eager calls (see the module docstring).

    Args:
        max_entries: call shapes kept; the oldest is dropped beyond it.
    """

    def __init__(self, max_entries: int = 16) -> None:
        self.max_entries = max_entries
        self._entries: dict[Hashable, _Entry] = {}
        self._seen: set[Hashable] = set()
        self._pool = None

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every graph (call when the tensors they read or write are reallocated)."""
        self._entries.clear()
        self._seen.clear()

    @staticmethod
    def active() -> bool:
        """True when a call may be served by a graph: a plain eager call (not traced by ``torch.compile``,
        not on a stream being captured)."""
        return not torch.compiler.is_compiling() and not torch.cuda.is_current_stream_capturing()

    def run(self, key: Hashable, fn: Callable[..., Sequence[Tensor] | None], args: Sequence[Tensor] = (),
            state: Sequence[Tensor] = (), generators: Sequence[torch.Generator] = ()) -> tuple[Tensor, ...]:
        """``fn(*args)``, served by the graph of ``key`` from the second call of ``key`` on.

        Args:
            key: the call shape (hashable; everything ``fn`` bakes in: sizes, flags, host scalars).
            fn: the eager call; returns its output tensors (or None). Capturable: no host reads, no
                allocation whose size depends on device values, CUDA tensors only.
            args: input tensors, copied by value into the graph's static inputs (same shapes on every
                call of ``key``; dtypes are converted to the first call's).
            state: the other tensors ``fn`` reads or writes (checked for identity before each replay).
            generators: the CUDA generators ``fn`` draws from (registered with its graph).

        Returns:
            ``fn``'s outputs: fresh tensors (eager results on the first call of a key).
        """
        entry = self._entries.get(key)
        if entry is not None and not entry.alive(state):
            del self._entries[key]
            entry = None
        if entry is None:
            if key not in self._seen:  # first call: eager, which compiles and warms up the kernels
                self._seen.add(key)
                out = fn(*args)
                return tuple(out) if out is not None else ()
            entry = self._capture(fn, args, state, generators)
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
        for g in generators:
            graph.register_generator_state(g)
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(0)  # sync-ok: torch.cuda.graph synchronises once before it records
        try:
            with gc_paused(), torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                out = fn(*inputs)
                flat, layout = _pack(tuple(out) if out is not None else ())
        finally:
            torch.cuda.set_sync_debug_mode(mode)
            for g, s in zip(generators, saved):
                g.set_state(s)
        return _Entry(graph, inputs, flat, layout, tuple(weakref.ref(t) for t in state))


def _pack(outputs: tuple[Tensor, ...]) -> tuple[Tensor | None, tuple]:
    """Copy ``outputs`` into one flat ``int64`` buffer (recorded in the graph being captured); return it and
    each output's ``(dtype, shape, strides, offset)`` as a contiguous view of that buffer viewed as its dtype
    (offset in elements of that dtype). None for no outputs. Element sizes of 1 to 8 bytes."""
    if not outputs:
        return None, ()
    spans, words = [], 0
    for t in outputs:
        size = t.element_size()
        if size > _WORD or _WORD % size:
            raise TypeError(f"eager graphs pack outputs of 1 to 8 bytes per element, got {t.dtype}")
        spans.append((words, size))
        words += -(-t.numel() * size // _WORD)
    flat = torch.empty(words, dtype=torch.int64, device=outputs[0].device)
    layout = []
    for t, (start, size) in zip(outputs, spans):
        offset = start * (_WORD // size)
        strides = torch.empty(t.shape, device="meta").stride()  # contiguous strides of the shape
        flat.view(t.dtype).as_strided(t.shape, strides, offset).copy_(t)
        layout.append((t.dtype, tuple(t.shape), strides, offset))
    return flat, tuple(layout)
