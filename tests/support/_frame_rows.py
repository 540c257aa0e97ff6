"""Stacked-frame transitions whose every field is a function of their id, for the writer tests of a
frame-deduplicated buffer (``make_replay_buffer(frame_stack=4)``).

Transition ``id`` holds the frames ``id .. id + 4`` of one stream: its observation frames ``id .. id + 3``, its next
observation frames ``id + 1 .. id + 4``, so consecutive ids share three frames (as an Atari env's stacks) and the
buffer deduplicates them. Frame ``k`` is the 8 bytes of the int64 ``k`` as a ``(2, 4) uint8`` image: distinct
serials are distinct frames, and a stored stack is checked against its id without the code under test.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

#: frames a stack
STACK = 4


def frame_rows(ids: torch.Tensor) -> TensorDict:
    """Transitions ``[n]`` of int64 ``ids`` ``(n,)``: ``"id"``, ``"observation"`` and ``"next_observation"``
    ``(n, 4, 2, 4) uint8``, all on the CPU."""
    n = ids.shape[0]
    serials = ids[:, None] + torch.arange(STACK + 1)  # [n, S + 1] int64
    frames = serials.contiguous().view(torch.uint8).view(n, STACK + 1, 2, 4)  # [n, S + 1, 2, 4]
    return TensorDict({"id": ids, "observation": frames[:, :STACK].clone(),
                       "next_observation": frames[:, 1:].clone()}, [n])


def assert_frames_agree(stored: TensorDict) -> None:
    """Every row of ``stored`` (a TensorDict ``[m]`` read back from a buffer) holds the stacks of its id."""
    expected = frame_rows(stored["id"].cpu())
    for key in ("observation", "next_observation"):
        assert torch.equal(stored[key].cpu(), expected[key]), f"a torn row: {key!r} disagrees with its id"
