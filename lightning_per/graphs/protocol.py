"""What :func:`lightning_per.graphs.capture` asks of a sampler: :class:`CapturableSampler`.

The graph layer sits below the replay package and imports nothing of it: it finds a sampler's capture
support by duck typing. Every member is optional; a sampler lacking :meth:`CapturableSampler.capture_problem`
is taken to draw on the host (TorchRL's samplers) and refused with a :class:`~lightning_per.graphs.CaptureError`.
``lightning_per.replay``'s proportional, rank-based and uniform samplers implement the protocol.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

__all__ = ["CapturableSampler"]


@runtime_checkable
class CapturableSampler(Protocol):
    """A sampler whose draws a CUDA graph can record (members looked up with ``getattr``; all optional).

    Attributes:
        device: where the sampler draws (``torch.device`` or str); gives the capture its device when no
            listed tensor does.
        generator: the sampler's own ``torch.Generator``; registered with the graph unless
            :meth:`draw_generators` says otherwise, restored after the warm-up unless :meth:`get_rng_state`
            covers it.

    Example::

        class MySampler(torchrl.data.replay_buffers.samplers.Sampler):
            def capture_problem(self, storage):
                return None  # draws on the device from device state only: capturable
    """

    device: torch.device | str
    generator: torch.Generator

    def capture_problem(self, storage: Any | None) -> str | None:
        """Why draws of this sampler cannot be recorded in a CUDA graph, or None when they can.

        Args:
            storage: the buffer's storage at the first call (its fill level is known then), or None for the
                check at construction (the sampler's kind alone).

        Returns:
            None, or the reason and the way out as one sentence (it becomes a ``CaptureError`` message).
        """

    def draw_generators(self, batch_size: int) -> tuple[torch.Generator, ...]:
        """The generators a draw of ``batch_size`` consumes (registered with the graph; a registered generator
        costs every replay two small host-to-device writes)."""

    def device_state(self) -> list[Tensor]:
        """Device tensors the draws read and priority updates write, in place (restored after the warm-up)."""

    def get_rng_state(self) -> Any:
        """The state of every random stream the draws use (device counters included), no host sync."""

    def set_rng_state(self, state: Any) -> None:
        """Restore a :meth:`get_rng_state` result in place."""
