"""Typed, validated configuration pieces of the DQN (parsed by LightningCLI from YAML)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["ReplayConfig", "check_range"]


def check_range(name: str, value: float | int | None, *, low: float | None = None, high: float | None = None,
                low_open: bool = False, allow_none: bool = False) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``low <= value <= high``
    (``low < value`` if ``low_open``; None passes only with ``allow_none``)."""
    if value is None:
        if allow_none:
            return
        raise ValueError(f"{name} must not be None")
    bad_low = low is not None and (value <= low if low_open else value < low)
    bad_high = high is not None and value > high
    if bad_low or bad_high:
        lo = "-inf" if low is None else f"{low}"
        hi = "inf" if high is None else f"{high}"
        bracket = "(" if low_open else "["
        raise ValueError(f"{name} must be in {bracket}{lo}, {hi}], got {value!r}")


@dataclass
class ReplayConfig:
    """The replay buffer (``lightning_per.make_replay_buffer``) and its IS-exponent schedule."""

    capacity: int = 100_000
    """Transitions kept (ring buffer, oldest overwritten)."""
    batch_size: int = 64
    """Transitions per gradient update B."""
    sampler: Literal["proportional", "rank", "uniform"] = "proportional"
    """``proportional``: P(i) = p_i^alpha / sum_k p_k^alpha (Schaul et al. 2016, sec. 3.3);
    ``rank``: P(i) proportional to rank(i)^-alpha; ``uniform``: no prioritisation, IS weights 1."""
    alpha: float = 0.6
    """Priority exponent alpha in [0, 1] (0 = uniform)."""
    beta: float = 0.4
    """Initial IS exponent beta in [0, 1]; annealed linearly to ``beta_end``."""
    beta_end: float = 1.0
    """IS exponent at the end of annealing."""
    beta_anneal_updates: int = 20_000
    """Gradient updates over which beta goes from ``beta`` to ``beta_end``."""
    eps: float = 1e-6
    """Priority floor: p = |td| + eps, so no transition gets probability 0. With ``buffer`` weight
    normalisation it also bounds the IS weights from below, as ``(P(i) / min_j P(j))^-beta``: on Pong a floor
    of 1e-6 let them collapse to a mean of 0.004 (Adam then barely moved); 0.01 kept the mean near 0.6 and
    learned Pong in ~2.5 minutes (``configs/dqn_pong.yaml``)."""
    packed: bool = True
    """Store each transition as one row (``GPUTensorStorage(packed=True)``): one gather kernel per batch
    instead of one per key (the learner consumes the batch at once)."""
    frame_dedup: bool = False
    """Store stacked-frame observations with each distinct frame once (``FrameStackStorage``, stacks of the
    observation's leading dim): a 1M-transition Atari buffer in about 7.3 GB instead of 56 GB. Needs uint8
    frame stacks and ``sampler: proportional``."""
    weight_normalization: Literal["buffer", "batch"] = "buffer"
    """IS weights ``(N P(i))^-beta`` divided by their maximum over the filled buffer (``buffer``: TorchRL's
    and Schaul et al.'s choice, sec. 3.4) or over the sampled batch (``batch``: weights stay near 1
    when a few transitions have near-zero priority). Ignored by ``uniform``."""

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field out of range."""
        check_range("replay.capacity", self.capacity, low=1)
        check_range("replay.batch_size", self.batch_size, low=1)
        if self.batch_size > self.capacity:
            raise ValueError(f"replay.batch_size ({self.batch_size}) must not exceed replay.capacity "
                             f"({self.capacity})")
        if self.sampler not in ("proportional", "rank", "uniform"):
            raise ValueError("replay.sampler must be 'proportional', 'rank' or 'uniform', "
                             f"got {self.sampler!r}")
        check_range("replay.alpha", self.alpha, low=0.0, high=1.0)
        check_range("replay.beta", self.beta, low=0.0, high=1.0)
        check_range("replay.beta_end", self.beta_end, low=0.0, high=1.0)
        check_range("replay.beta_anneal_updates", self.beta_anneal_updates, low=0)
        check_range("replay.eps", self.eps, low=0.0, low_open=True)
        if self.frame_dedup and self.sampler != "proportional":
            raise ValueError(f"replay.frame_dedup needs replay.sampler 'proportional', got {self.sampler!r}")
        if self.weight_normalization not in ("buffer", "batch"):
            raise ValueError("replay.weight_normalization must be 'buffer' or 'batch', "
                             f"got {self.weight_normalization!r}")
