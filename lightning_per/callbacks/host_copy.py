"""One epoch's metrics on their way from the device to the host: :func:`copy_to_host` and :class:`HostCopy`.

On CUDA the copy goes to pinned host memory on a side stream that first waits for the current stream (where
the values were computed); an event marks its end, and the device sources are held until then (the caching
allocator could otherwise hand their memory to new work while the side stream reads it). On the CPU the copy
is plain. No host synchronisation either way: :meth:`HostCopy.ready` polls, :meth:`HostCopy.wait` blocks.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["HostCopy", "copy_to_host"]


class HostCopy:
    """One snapshot in flight: the host buffer, its completion event (None: already complete) and the device
    sources it is copied from (held until published).

    Attributes:
        names: the ``M`` metric names; host: ``(M,) float64`` host values (valid once :meth:`ready`).
        info: host facts of the snapshot (epoch, step, times). episodes: host copies of
            ``(episode_log (R, 3) float64, episode_log_count () int64)``, or None.

    Example:
        >>> import torch
        >>> from lightning_per.callbacks.host_copy import copy_to_host
        >>> item = copy_to_host(["loss"], torch.tensor([0.5], dtype=torch.float64), {"epoch": 0})
        >>> item.ready(), item.host.tolist()
        (True, [0.5])
    """

    __slots__ = ("names", "host", "event", "source", "info", "episodes")

    def __init__(self, names: list[str], host: Tensor, event: Any, source: Any,
                 info: dict[str, float], episodes: tuple[Tensor, Tensor] | None = None) -> None:
        self.names, self.host, self.event, self.source, self.info = names, host, event, source, info
        self.episodes = episodes  # host copies of (episode_log, episode_log_count), or None

    def ready(self) -> bool:
        """Whether the copy has landed (never blocks)."""
        return self.event is None or self.event.query()

    def wait(self) -> None:
        """Block until the copy has landed."""
        if self.event is not None:
            self.event.synchronize()


def copy_to_host(names: list[str], values: Tensor, info: dict[str, float],
                 episodes: tuple[Tensor, Tensor] | None = None, stream: Any = None) -> HostCopy:
    """Enqueue the copy of ``values`` (and ``episodes``) to the host; no host sync on CUDA.

    Args:
        names: the metric names of ``values``' entries.
        values: ``(M,) float64`` metrics on their device.
        info: host facts stored with the snapshot.
        episodes: the module's ``(episode_log, episode_log_count)`` on the same device (still being written:
            cloned on the current stream first), or None.
        stream: the side ``torch.cuda.Stream`` of ``values``' device (required on CUDA; ignored on the CPU).

    Returns:
        The :class:`HostCopy` in flight.

    Raises:
        ValueError: ``values`` is on CUDA and ``stream`` is None.
    """
    if values.device.type != "cuda":
        copies = None if episodes is None else tuple(t.detach().to("cpu", copy=True) for t in episodes)
        return HostCopy(names, values.to("cpu", copy=True), None, None, info, copies)
    if stream is None:
        raise ValueError(f"a copy from {values.device} needs a side stream of that device, got stream=None")
    if episodes is not None:  # the module keeps writing its log: copy it on this stream first, in order
        episodes = tuple(t.detach().clone() for t in episodes)
    sources = [values, *(episodes or ())]
    hosts = [torch.empty(t.shape, dtype=t.dtype, pin_memory=t.device.type == "cuda") for t in sources]
    stream.wait_stream(torch.cuda.current_stream(values.device))  # the values are computed there
    with torch.cuda.stream(stream):
        for host, src in zip(hosts, sources):
            host.copy_(src.detach(), non_blocking=src.device.type == "cuda")
        event = torch.cuda.Event()
        event.record(stream)
    # ``values`` was allocated on the current stream: holding it until the event completes stops
    # the caching allocator from handing its memory to new work while the side stream reads it.
    copies = (hosts[1], hosts[2]) if episodes is not None else None
    return HostCopy(names, hosts[0], event, sources, info, copies)
