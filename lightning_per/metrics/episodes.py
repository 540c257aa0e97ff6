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

The episode log: the per-episode series the learning curves plot (what
:class:`~lightning_per.callbacks.AsyncMetricsCallback` reads back once an epoch, when a module has it):

- ``pl_module.episode_log``: ``(R, 3) float64`` on the module's device; row ``k % R`` holds episode
  ``k`` as ``(env_steps, time, return)``: the env steps taken in total when it ended, the
  ``time.monotonic()`` of its end (seconds), its return. Never-written rows are NaN.
- ``pl_module.episode_log_count``: ``() int64``, episodes logged so far.

:func:`new_episode_log` makes them, :func:`push_episode_log` appends in place (no host sync; O(N) per
call), :func:`episode_log_rows` reads the rows of episodes ``[since, count)`` from host copies.

The episode table: :func:`episode_table` turns host records ``(env_steps, time_s, return)`` into the rows of
``episodes.csv`` (``episode, env_steps, time_s, return, return_mean``), the columns
:class:`~lightning_per.callbacks.AsyncMetricsCallback` gives its episode rows.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import torch
from torch import Tensor

__all__ = ["new_episode_ring", "push_episode_returns", "recent_mean_return", "new_episode_log", "push_episode_log",
           "episode_log_rows", "episode_table"]


def _check_step(count: Tensor, returns: Tensor, done: Tensor) -> None:
    """Raise ValueError unless ``count`` is a 0-d int64 tensor and ``returns``, ``done`` are ``(N,)``, done bool."""
    if count.dim() != 0 or count.dtype != torch.int64:
        raise ValueError(f"count must be a 0-d int64 tensor, got {tuple(count.shape)} {count.dtype}")
    if done.dim() != 1 or done.dtype != torch.bool or returns.shape != done.shape:
        raise ValueError(f"returns and done must both be (N,), done bool; got {tuple(returns.shape)} "
                         f"and {tuple(done.shape)} {done.dtype}")


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
    _check_step(count, returns, done)
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


def new_episode_log(capacity: int = 4096, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """An empty episode log: ``((capacity, 3) float64 NaN, () int64 zero)`` on ``device``.

    Raises:
        ValueError: ``capacity < 1``.
    """
    if int(capacity) < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    log = torch.full((int(capacity), 3), float("nan"), dtype=torch.float64, device=device)
    return log, torch.zeros((), dtype=torch.int64, device=device)


def push_episode_log(log: Tensor, count: Tensor, returns: Tensor, done: Tensor, env_steps: int | float | Tensor,
                     time_s: float | Tensor) -> None:
    """Append ``(env_steps, time_s, return)`` for each environment that finished an episode, in place.

    Environments are taken in index order (as :func:`push_episode_returns`). Every environment writes
    one row with distinct slots: a finished one its new row, the others the row already in their slot
    (unchanged), so shapes are fixed and nothing is read back to the host.

    Args:
        log: ``(R, 3) float64`` episode log (updated in place), ``R >= N``.
        count: ``() int64`` episodes logged so far (updated in place).
        returns: ``(N,)`` float, each environment's episode return (read where ``done``).
        done: ``(N,) bool``.
        env_steps: env steps taken in total at these episode ends: a number, or ``(N,)`` / 0-d tensor.
        time_s: ``time.monotonic()`` of the episode ends (seconds): a number or a 0-d / ``(N,)`` tensor.

    Raises:
        ValueError: shapes or dtypes differ from the above, or ``R < N``.

    Example:
        >>> import torch
        >>> from lightning_per.metrics import new_episode_log, push_episode_log
        >>> log, count = new_episode_log(4)
        >>> push_episode_log(log, count, torch.tensor([1.0, 2.0, 3.0]), torch.tensor([True, False, True]),
        ...                  env_steps=30, time_s=1.5)
        >>> int(count), log[:2].tolist()
        (2, [[30.0, 1.5, 1.0], [30.0, 1.5, 3.0]])
    """
    if log.dim() != 2 or log.shape[1] != 3 or log.dtype != torch.float64:
        raise ValueError(f"log must be (R, 3) float64, got {tuple(log.shape)} {log.dtype}")
    _check_step(count, returns, done)
    n, cap = done.shape[0], log.shape[0]
    if n > cap:
        raise ValueError(f"log must have at least as many rows as environments: {cap} < {n}")
    if n == 0:
        return
    d = done.to(torch.int64)  # [N]
    cum = torch.cumsum(d, 0)  # [N]
    rank = torch.arange(n, device=log.device)  # [N]
    # finished envs take count + 0..D-1, the others count + D.. (past the new end): distinct slots
    pos = count + torch.where(done, cum - 1, cum[-1] + rank - cum)  # [N]
    slot = torch.remainder(pos, cap)  # [N]

    def column(x) -> Tensor:
        if isinstance(x, Tensor):
            return x.to(log.device, torch.float64).expand(n)
        return torch.full((n,), float(x), dtype=torch.float64, device=log.device)  # a fill: no host-to-device copy

    new = torch.stack([column(env_steps), column(time_s), returns.to(log.device, torch.float64)], 1)  # [N, 3]
    log.index_copy_(0, slot, torch.where(done.unsqueeze(1), new, log.index_select(0, slot)))
    count.add_(cum[-1])


def episode_log_rows(log: Tensor, count: int, since: int = 0) -> tuple[list[tuple[float, float, float]], int]:
    """The rows ``(env_steps, time, return)`` of episodes ``since .. count - 1`` still in the log, oldest
    first, and how many of those were overwritten before this read (more than ``R`` since ``since``).

    Args:
        log: ``(R, 3)`` host copy of the episode log; count: its episode count (host int).
        since: first episode wanted (the count at the previous read).

    Raises:
        ValueError: ``since > count`` or ``log`` not ``(R, 3)``.
    """
    if log.dim() != 2 or log.shape[1] != 3:
        raise ValueError(f"log must be (R, 3), got shape {tuple(log.shape)}")
    if since > count:
        raise ValueError(f"since ({since}) is past the episode count ({count})")
    cap = log.shape[0]
    first = max(since, count - cap)
    host = log.detach().to("cpu", torch.float64)
    slots = [k % cap for k in range(first, count)]
    rows = [tuple(r) for r in host[slots].tolist()] if slots else []  # sync-ok: a host copy
    return rows, first - since


def episode_table(records: Iterable[tuple[float, float, float]], window: int = 20,
                  first: int = 0) -> list[dict[str, float]]:
    """Rows of finished episodes, oldest first: ``{"episode", "env_steps", "time_s", "return", "return_mean"}``.

    Args:
        records: ``(env_steps, time_s, return)`` per episode, oldest first (host numbers): the env steps
            taken in total when it ended, its end in seconds on the run's clock, its return.
        window: ``return_mean`` is the mean of the newest ``window`` returns up to and including the row's.
        first: the number of the first record's episode (0-based; earlier ones are not in ``records``).

    Raises:
        ValueError: ``window < 1`` or ``first < 0``.

    Example:
        >>> from lightning_per.metrics.episodes import episode_table
        >>> [(r["episode"], r["return_mean"]) for r in episode_table([(10, 0.5, 2.0), (30, 1.0, 4.0), (35, 1.2, 9.0)],
        ...                                                        window=2)]
        [(0, 2.0), (1, 3.0), (2, 6.5)]
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an int >= 1, got {window!r}")
    if isinstance(first, bool) or not isinstance(first, int) or first < 0:
        raise ValueError(f"first must be an int >= 0, got {first!r}")
    rows: list[dict[str, float]] = []
    recent: deque[float] = deque()
    total = 0.0  # sum of `recent`, kept running: O(1) a row
    for k, (env_steps, time_s, ret) in enumerate(records):
        recent.append(float(ret))
        total += recent[-1]
        if len(recent) > window:
            total -= recent.popleft()
        rows.append({"episode": first + k, "env_steps": env_steps, "time_s": time_s, "return": recent[-1],
                     "return_mean": total / len(recent)})
    return rows
