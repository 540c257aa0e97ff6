"""Timing helpers shared by the benchmarks: CUDA-event timing, host-sync counting, CUDA-graph capture."""

from __future__ import annotations

import time
import warnings

import torch

__all__ = ["timed", "count_syncs", "capture", "host_profile", "REPEAT"]

#: Calls captured per CUDA graph in the benchmarks' ``-x{REPEAT}`` rows: one host launch per REPEAT calls, so
#: those rows show the device time per call; one-call graph rows include the host's graph-launch cost
#: (the ``graph-launch-floor`` rows: one graph of one tiny kernel).
REPEAT = 16


def timed(fn, iters: int, device) -> float:
    """Mean seconds per call of ``fn`` (CUDA events on GPU, perf_counter on CPU), after 10 warm-up calls."""
    device = torch.device(device)
    for _ in range(10):
        fn()
    if device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) / iters
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def count_syncs(fn, steps: int, device) -> float | None:
    """Host synchronisations per call of ``fn`` (``torch.cuda.set_sync_debug_mode("warn")``); None on CPU."""
    if torch.device(device).type != "cuda":
        return None
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in caught) / steps


def capture(fn, generators=()):
    """Capture ``fn`` in one CUDA graph (after 3 side-stream warm-ups); return its ``replay``.

    ``generators``: custom ``torch.Generator`` objects ``fn`` draws from (registered with the graph).
    """
    from lightning_per.graphs.streams import capture_cuda_graph  # lazily: a --family torchrl run may lack it

    return capture_cuda_graph(fn, generators).replay


def host_profile(fn, calls: int, rows: int) -> str:
    """cProfile of ``calls`` calls of ``fn``: the ``rows`` functions with the most host time of their own
    (``tottime``), as text."""
    import cProfile
    import io
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    text = io.StringIO()
    pstats.Stats(pr, stream=text).sort_stats("tottime").print_stats(rows)
    return text.getvalue()
