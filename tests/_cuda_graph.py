"""GPU-test helper: capture a function in one CUDA graph after side-stream warm-ups (torch's recipe)."""

import torch


def capture(fn, generators=()) -> torch.cuda.CUDAGraph:
    """Run ``fn`` 3 times on a side stream, then capture one call; ``generators`` are the custom
    ``torch.Generator`` objects ``fn`` draws from (registered with the graph). Returns the graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    for gen in generators:
        graph.register_generator_state(gen)
    with torch.cuda.graph(graph):
        fn()
    return graph
