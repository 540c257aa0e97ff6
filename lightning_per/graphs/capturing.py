"""The primitives every CUDA-graph capture of the package goes through: :func:`cuda_graph_capture`,
:func:`gc_paused` and the capture guard :func:`no_recompiles`.

Import-light on purpose (torch is imported on first use): :mod:`lightning_per.graphs.eager`,
:mod:`lightning_per.graphs.streams` and the captured updates build on it.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["cuda_graph_capture", "gc_paused", "no_recompiles"]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's garbage collector off for the block (its previous state restored after). Around CUDA-graph
    captures (:func:`cuda_graph_capture`): a collection inside one can run finalizers that free CUDA or pinned
    memory of unrelated objects, calls a capture forbids from its own thread ("operation failed due to a
    previous error during capture"). Collections are only deferred to the end of the block. The switch is
    process-wide: do not nest it across threads (the first thread to leave would turn collection back on).

    Example:
        >>> import gc
        >>> from lightning_per.graphs.capturing import gc_paused
        >>> with gc_paused():
        ...     gc.isenabled()
        False
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def cuda_graph_capture(graph: Any, generators: Sequence[Any] = (), **graph_kwargs: Any) -> Iterator[None]:
    """Record the block's CUDA work into ``graph`` (a ``torch.cuda.CUDAGraph``): ``generators`` (CUDA
    ``torch.Generator`` objects the block draws from) are registered with it first, so each replay draws new
    numbers; the block runs under ``torch.cuda.graph(graph, **graph_kwargs)`` (e.g. ``pool``,
    ``capture_error_mode``) with Python's GC paused (:func:`gc_paused`). ``torch.cuda.graph`` synchronises the
    device and empties the caching allocator before it records.

    Raises:
        RuntimeError: torch's, when the block does something a capture forbids (a host sync, a CPU tensor op).

    Example::

        graph = torch.cuda.CUDAGraph()
        with cuda_graph_capture(graph, [sampler.generator]):
            out = step()
        graph.replay()  # reruns step()'s kernels, new draws from the generator
    """
    import torch

    for gen in generators:
        graph.register_generator_state(gen)
    with gc_paused(), torch.cuda.graph(graph, **graph_kwargs):
        yield


@contextlib.contextmanager
def no_recompiles() -> Iterator[None]:
    """Inside: a ``torch.compile``'d function that was compiled before raises instead of recompiling
    (first compilations still happen). Wrap warm-ups after the first and CUDA-graph captures with it: a
    compilation inside a capture would record its own benchmarking and allocations."""
    import torch

    with torch._dynamo.config.patch(error_on_recompile=True):
        yield
