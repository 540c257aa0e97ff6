"""torch's capture recipe around the primitives of :mod:`lightning_per.graphs.capturing`: a side-stream
warm-up (:func:`warm_up_on_side_stream`), then the capture (:func:`capture_cuda_graph`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from lightning_per.graphs.capturing import cuda_graph_capture
from lightning_per.graphs.eager import eager_graphs_paused

__all__ = ["capture_cuda_graph", "warm_up_on_side_stream"]


def warm_up_on_side_stream(fn: Callable[[], Any], iters: int, device: Any = None) -> None:
    """``iters`` calls of ``fn`` on a new side stream of ``device`` (default: the current CUDA device), after
    the work already queued on the current stream and before any queued later: torch's warm-up before a
    capture (allocator, cuBLAS, Triton and ``torch.compile`` first calls run outside the graph). The
    samplers' cached graphs are paused meanwhile (:func:`~lightning_per.graphs.eager.eager_graphs_paused`).

    Example::

        warm_up_on_side_stream(step, 3)  # then capture step() (capture_cuda_graph does both)
    """
    import torch

    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream), eager_graphs_paused():  # the capture that follows records these calls
        for _ in range(iters):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)


def capture_cuda_graph(fn: Callable[[], Any], generators: Sequence[Any] = (), warmup: int = 3) -> Any:
    """Capture one call of ``fn`` in a ``torch.cuda.CUDAGraph`` and return the graph (``graph.replay()``
    reruns it). torch's recipe: ``warmup`` eager calls on a side stream first
    (:func:`warm_up_on_side_stream`), then the capture
    (:func:`~lightning_per.graphs.capturing.cuda_graph_capture`). ``generators``: custom ``torch.Generator``
    objects ``fn`` draws from, registered with the graph so every replay draws new numbers. CUDA only
    (current device).

    Raises:
        RuntimeError: torch's, when ``fn`` cannot be captured.

    Example::

        graph = capture_cuda_graph(lambda: out.copy_(rb.sample()["obs"]), rb.sampler.capture_view(None, 256).generators)
        graph.replay()
    """
    import torch

    warm_up_on_side_stream(fn, warmup)
    graph = torch.cuda.CUDAGraph()
    with cuda_graph_capture(graph, generators):
        fn()
    return graph
