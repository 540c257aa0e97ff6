"""Replay work overlapped with the learner on a second CUDA stream: :class:`SideStream` (fork, join) and
:func:`pipelined_updates` (each update's priority write and the next draw forked after its forward)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["SideStream", "pipelined_updates"]


class SideStream:
    """Work forked onto a second CUDA stream, joined later: independent parts of an update run concurrently.

    The priority update of a DQN step needs only the TD errors of the forward pass; forked after the forward
    (the learner step's ``after_forward`` hook), its kernels run while the backward and the optimizer step run
    on the current stream, and :meth:`join` (before the next sample reads the priorities) makes the current
    stream wait for them. Inside a CUDA-graph capture the fork and the join become parallel branches of the
    graph. On the CPU (``device`` not CUDA) :meth:`fork` just calls.

    Tensors that the forked work reads must stay referenced until :meth:`join` (the caching allocator could
    otherwise hand their memory to the current stream while the side stream still reads it). Tensors that the
    forked work allocates and the current stream reads later are safe as long as all work on the side stream
    goes through :meth:`fork`: each fork first waits for the current stream, so freed memory the side stream
    reuses is never still being read.

    Args:
        device: the device of the update.
    """

    def __init__(self, device: torch.device | str) -> None:
        device = torch.device(device)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._device = self.stream.device if self.stream is not None else device  # with its index

    def fork(self, fn: Callable[..., None], *args, **kwargs) -> None:
        """``fn(*args, **kwargs)`` on the side stream, after everything already queued on the current one."""
        if self.stream is None:
            fn(*args, **kwargs)
            return
        self.stream.wait_stream(torch.cuda.current_stream(self._device))
        with torch.cuda.stream(self.stream):
            fn(*args, **kwargs)

    def join(self) -> None:
        """The current stream waits for the forked work (no host synchronisation)."""
        if self.stream is not None:
            torch.cuda.current_stream(self._device).wait_stream(self.stream)


def pipelined_updates(n: int, draw: Callable[[], Any],
                      learn: Callable[[int, Any, Callable[[Tensor], None]], dict[str, Tensor]],
                      write: Callable[[Any, Tensor], None], side: SideStream,
                      finish: Callable[[dict[str, Tensor]], None] | None = None) -> dict[str, Tensor]:
    """``n`` consecutive prioritized updates (draw -> learn -> priority write), the replay work overlapped.

    After update ``i``'s forward, its priority write and then update ``i + 1``'s draw are forked onto
    ``side`` (in that order), so they run while update ``i``'s backward and optimizer step run on the
    current stream; the join before update ``i + 1`` keeps the results of the serial loop: each draw sees
    the priorities of every earlier update, each update reads its own draw. In a CUDA graph (DQN graph
    mode, ``updates_per_graph`` = ``n``) the forks become parallel branches.

    Args:
        n: updates (>= 1).
        draw: ``() -> sample`` (e.g. ``(index, info, batch)``); the first runs on the current stream.
        learn: ``(i, sample, after_forward) -> out``: update ``i``'s learner step; it calls
            ``after_forward(td_abs)`` after its forward (as ``lightning_per.dqn.learner.learner_step`` does).
        write: ``(sample, td_abs) -> None``: the priority update of ``sample``'s slots.
        side: the second stream.
        finish: ``(out) -> None`` after each update's join (e.g. metrics that read the new priorities).

    Returns:
        The last update's ``out``.

    Raises:
        RuntimeError: ``learn`` returned without calling ``after_forward`` (its priority write never ran).
    """
    pending = [draw()]  # the next update's sample, drawn on the side stream after the previous write
    forked = [False]

    def replay_work(sample, td_abs: Tensor, last: bool) -> None:
        write(sample, td_abs)
        if not last:
            pending[0] = draw()

    def fork(td_abs: Tensor, sample, last: bool) -> None:
        forked[0] = True
        side.fork(replay_work, sample, td_abs, last)

    out: dict[str, Tensor] = {}
    for i in range(n):
        sample = pending[0]  # referenced until the join: the side stream reads it
        forked[0] = False
        out = learn(i, sample, lambda td_abs, sample=sample, last=i == n - 1: fork(td_abs, sample, last))
        if not forked[0]:
            raise RuntimeError(f"pipelined_updates: learn returned from update {i} without calling "
                               "after_forward(td_abs), so its priority write never ran")
        side.join()
        if finish is not None:
            finish(out)
    return out
