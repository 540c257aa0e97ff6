"""n-step discounted returns of one rollout (A3C, Mnih et al. 2016, Algorithm S3; GA3C section 3.2).

NumPy only: this runs inside the agent processes, which import neither torch nor CUDA.
"""

from __future__ import annotations

import numpy as np

__all__ = ["nstep_returns", "clip_rewards"]


def nstep_returns(rewards: np.ndarray, values: np.ndarray, bootstrap: np.ndarray,
                  terminated: np.ndarray, truncated: np.ndarray, gamma: float,
                  out: np.ndarray | None = None) -> np.ndarray:
    """Returns R_t = r_t + gamma * R_{t+1} of a rollout of T steps of E environments.

    Backwards from the rollout end: R_T = V(s_T) (``bootstrap``); at a step whose episode
    *terminated*, the return is the reward alone, R_t = r_t — the terminal reward is kept (the
    reference NVlabs/GA3C drops it, issue #31); at a step whose episode was *truncated* (time
    limit), the unobserved V(s_{t+1}) is approximated by V(s_t): R_t = r_t + gamma * V(s_t). A done
    step also cuts the recursion, so no return crosses an episode boundary.

    Args:
        rewards: (T, E) float32, rewards r_t (already clipped if configured).
        values: (T, E) float32, V(s_t) from the predictor (used at truncations only).
        bootstrap: (E,) float32, V(s_T) of the observation after the last step.
        terminated: (T, E) bool, episode ended in a terminal state at step t.
        truncated: (T, E) bool, episode cut by a time limit at step t (ignored where terminated).
        gamma: discount in (0, 1].
        out: optional (T, E) float32 array to write into (e.g. a shared-memory slot).

    Returns:
        (T, E) float32 returns (``out`` if given).
    """
    rewards = np.asarray(rewards, dtype=np.float32)
    if rewards.ndim != 2:
        raise ValueError(f"rewards must have shape (T, E), got {rewards.shape}")
    for name, arr in (("values", values), ("terminated", terminated), ("truncated", truncated)):
        if np.shape(arr) != rewards.shape:
            raise ValueError(f"{name} must have shape {rewards.shape} like rewards, got {np.shape(arr)}")
    if np.shape(bootstrap) != rewards.shape[1:]:
        raise ValueError(f"bootstrap must have shape {rewards.shape[1:]}, got {np.shape(bootstrap)}")
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")
    if out is None:
        out = np.empty(rewards.shape, dtype=np.float32)
    running = np.asarray(bootstrap, dtype=np.float32).copy()  # (E,)
    for t in range(rewards.shape[0] - 1, -1, -1):
        nxt = np.where(truncated[t], values[t], running)  # (E,)
        nxt = np.where(terminated[t], np.float32(0.0), nxt)
        running = rewards[t] + np.float32(gamma) * nxt
        out[t] = running
    return out


def clip_rewards(rewards: np.ndarray, clip: float | None) -> np.ndarray:
    """Rewards clipped to [-clip, clip] (float32, same shape); ``clip=None`` returns them unchanged."""
    rewards = np.asarray(rewards, dtype=np.float32)
    return rewards if clip is None else np.clip(rewards, -clip, clip)
