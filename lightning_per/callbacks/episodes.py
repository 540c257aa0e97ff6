r"""The episode-return ring: recent finished-episode returns kept on the device, written without syncs.

Definition (what :class:`~lightning_per.callbacks.RunArtifactsCallback` reads from a LightningModule):

- ``pl_module.episode_returns_ring``: ``(R,) float32`` tensor on the module's device (``R = 100`` by
  convention, any ``R >= 1`` works). Slot ``k % R`` holds the return of the ``k``-th finished episode
  (0-based, counting every episode since training began); never-written slots are NaN.
- ``pl_module.episode_returns_count``: ``() int64`` tensor on the same device: the number of episodes
  finished so far (the write cursor is ``count % R``; the newest return sits at ``(count - 1) % R``).

Register both as buffers (``self.register_buffer(...)``) so they follow ``.to(device)`` and are saved in
checkpoints. :func:`new_episode_ring` makes them, :func:`push_episode_returns` writes a batch of
finished episodes in place with fixed shapes (no host sync, CUDA-graph capturable), and
:func:`recent_mean_return` reads the mean of the newest ``window`` returns on the host.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["new_episode_ring", "push_episode_returns", "recent_mean_return"]


def new_episode_ring(capacity: int = 100, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """An empty ring: ``((capacity,) float32 NaN, () int64 zero)`` on ``device``.

    Raises:
        ValueError: ``capacity < 1``.
    """
    if int(capacity) < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    ring = torch.full((int(capacity),), float("nan"), dtype=torch.float32, device=device)
    return ring, torch.zeros((), dtype=torch.int64, device=device)


def push_episode_returns(ring: Tensor, count: Tensor, returns: Tensor, done: Tensor) -> None:
    """Append the returns of the environments that finished an episode this step, in place.

    Environments are taken in index order: env ``i`` with ``done[i]`` gets episode number
    ``count + (number of done envs before i)``. If more than ``R`` episodes finish at once, the
    newest ``R`` are kept (the ring then holds exactly those).

    Args:
        ring: ``(R,) float32`` episode-return ring (updated in place).
        count: ``() int64`` episodes finished so far (updated in place).
        returns: ``(N,)`` float, the return of each environment's episode (read where ``done``).
        done: ``(N,) bool``, which environments finished an episode this step.

    Raises:
        ValueError: shapes or dtypes differ from the above.
    """
    if ring.dim() != 1 or ring.dtype != torch.float32:
        raise ValueError(f"ring must be (R,) float32, got {tuple(ring.shape)} {ring.dtype}")
    if count.dim() != 0 or count.dtype != torch.int64:
        raise ValueError(f"count must be a 0-d int64 tensor, got {tuple(count.shape)} {count.dtype}")
    if done.dim() != 1 or done.dtype != torch.bool or returns.shape != done.shape:
        raise ValueError(f"returns and done must both be (N,), done bool; got {tuple(returns.shape)} "
                         f"and {tuple(done.shape)} {done.dtype}")
    cap = ring.shape[0]
    d = done.to(torch.int64)  # [N]
    cum = torch.cumsum(d, 0)  # [N] episodes finished up to and including env i
    pos = count + cum - 1  # [N] episode number (valid where done)
    slot = torch.remainder(pos, cap)  # [N]
    # Newest episode number landing in each slot this step (-1: none), then the env that wrote it.
    latest = torch.full((cap,), -1, dtype=torch.int64, device=ring.device)
    latest.scatter_reduce_(0, slot, torch.where(done, pos, -1), reduce="amax")  # [R]
    src = torch.searchsorted(cum, (latest - count + 1).clamp_min(1))  # [R] first env with that cum
    src = src.clamp_max(done.shape[0] - 1)
    new = returns.to(torch.float32)[src]  # [R]
    ring.copy_(torch.where(latest >= 0, new, ring))
    count.add_(cum[-1] if done.numel() else 0)


def recent_mean_return(ring: Tensor, count: Tensor | int, window: int = 20) -> float | None:
    """Mean of the newest ``min(window, count, R)`` returns (host float), ``None`` before any episode.

    Reads the tensors to the host (one sync on CUDA): call it at the end of training, not per step.

    Raises:
        ValueError: ``window < 1`` or ``ring`` not 1-D.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if ring.dim() != 1:
        raise ValueError(f"ring must be 1-D, got shape {tuple(ring.shape)}")
    n = int(count)
    m = min(window, n, ring.shape[0])
    if m == 0:
        return None
    host = ring.detach().to("cpu", torch.float64)
    slots = [(n - 1 - k) % ring.shape[0] for k in range(m)]
    vals = host[slots]
    vals = vals[~torch.isnan(vals)]
    return float(vals.mean()) if vals.numel() else None
