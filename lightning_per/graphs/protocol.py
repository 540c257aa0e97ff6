"""What :func:`lightning_per.graphs.capture` asks of a sampler: :class:`CapturableSampler` and the value it hands
over, :class:`SamplerCapture`.

The graph layer sits below the replay package and imports nothing of it. A sampler is capturable when its class is
a :class:`CapturableSampler` (``lightning_per.replay``'s samplers are registered with it; a user's sampler
registers the same way) and tells the capture everything from one method, :meth:`CapturableSampler.capture_view`,
as one value. Any other sampler (TorchRL's own draw on the host) is refused with a
:class:`~lightning_per.graphs.CaptureError`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

__all__ = ["CapturableSampler", "SamplerCapture"]


def _no_rng_state() -> None:
    """The RNG state of a sampler without random streams of its own: nothing."""
    return None


def _restore_nothing(state: Any) -> None:
    """Restore the RNG state of a sampler without random streams of its own: nothing to do."""
    return None


@dataclass(frozen=True)
class SamplerCapture:
    """What a capture needs to know of one sampler, for one storage and batch size, as one value.

    Attributes:
        problem: why its draws from that storage cannot be recorded in a CUDA graph, as one sentence with the way
            out (it becomes a ``CaptureError`` message), or None when they can.
        tensors: the device tensors its draws read and its priority updates write, in place (copied before the
            warm-up and copied back after it).
        device: where it draws (``torch.device``), or None; gives the capture its device when no listed tensor
            does.
        generators: the ``torch.Generator`` objects a draw of the batch size consumes; the CUDA ones are registered
            with the graph (each costs a replay two small host-to-device writes).
        get_rng_state: ``() -> state``: the state of every random stream its draws use (device counters included),
            no host sync; taken before the warm-up.
        set_rng_state: ``(state) -> None``: puts a ``get_rng_state()`` result back in place after the warm-up.

    Example:
        >>> import torch
        >>> from lightning_per.graphs.protocol import SamplerCapture
        >>> gen = torch.Generator()
        >>> view = SamplerCapture(None, generators=(gen,), get_rng_state=gen.get_state, set_rng_state=gen.set_state)
        >>> view.problem is None, view.tensors, view.device
        (True, (), None)
        >>> SamplerCapture("draws on the host").problem
        'draws on the host'
    """

    problem: str | None
    tensors: tuple[Tensor, ...] = field(default=(), repr=False)
    device: torch.device | None = None
    generators: tuple[torch.Generator, ...] = field(default=(), repr=False)
    get_rng_state: Callable[[], Any] = field(default=_no_rng_state, repr=False)
    set_rng_state: Callable[[Any], None] = field(default=_restore_nothing, repr=False)


class CapturableSampler(abc.ABC):
    """A sampler whose draws a CUDA graph can record: its class is registered with this one (or subclasses it),
    so ``isinstance(sampler, CapturableSampler)`` answers, and it implements :meth:`capture_view`.

    ``lightning_per.replay`` registers its proportional, rank-based, prioritized-slice and uniform samplers
    (``CapturableSampler.register(GPUPrioritizedSampler)``): a registration adds nothing to a class's MRO.

    Example::

        @CapturableSampler.register
        class MySampler(torchrl.data.replay_buffers.samplers.Sampler):
            def capture_view(self, storage, batch_size):
                # draws on the device from device state only, from the default CUDA generator: capturable
                return SamplerCapture(None, tensors=(self.weights,), device=self.weights.device)
    """

    @abc.abstractmethod
    def capture_view(self, storage: Any | None, batch_size: int | None) -> SamplerCapture:
        """What a capture of this sampler's draws needs to know, as one value.

        Args:
            storage: the buffer's storage at the first call (its fill level is known then), or None for the check
                at construction (the sampler's kind alone) and for the parts that do not depend on it.
            batch_size: the buffer's batch size, or None (a bare sampler, or a buffer without one): the
                generators are then every generator the sampler may draw from.

        Returns:
            A :class:`SamplerCapture`; its ``problem`` is None when draws from ``storage`` can be recorded.
        """
