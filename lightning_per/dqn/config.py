"""Typed, validated configuration pieces of the DQN (parsed by LightningCLI from YAML)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from lightning_per.dqn.compiled import INDUCTOR_MODES
from lightning_per.replay.errors import check_eps
from lightning_per.utils import MAX_SEED

__all__ = ["ReplayConfig", "check_range", "validate_dqn_arguments"]


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
        check_eps(self.eps, self.alpha, name="replay.eps")  # (0, min(FLOAT32_MAX, FLOAT32_MAX**(1/alpha) - 1)]
        if self.frame_dedup and self.sampler != "proportional":
            raise ValueError(f"replay.frame_dedup needs replay.sampler 'proportional', got {self.sampler!r}")
        if self.weight_normalization not in ("buffer", "batch"):
            raise ValueError("replay.weight_normalization must be 'buffer' or 'batch', "
                             f"got {self.weight_normalization!r}")


def validate_dqn_arguments(a: dict[str, Any]) -> None:
    """Range checks of :class:`~lightning_per.dqn.DQN`'s arguments ``a`` (its ``locals()``, ``replay`` a
    :class:`ReplayConfig`).

    Raises:
        ValueError: naming the first argument out of range.
    """
    check_range("gamma", a["gamma"], low=0.0, high=1.0)
    check_range("seed", a["seed"], low=0, high=MAX_SEED)
    check_range("n_step", a["n_step"], low=1)
    check_range("lr", a["lr"], low=0.0, low_open=True)
    check_range("adam_eps", a["adam_eps"], low=0.0, low_open=True)
    check_range("huber_delta", a["huber_delta"], low=0.0, low_open=True)
    check_range("grad_clip_norm", a["grad_clip_norm"], low=0.0, low_open=True, allow_none=True)
    check_range("target_update_interval", a["target_update_interval"], low=1)
    check_range("target_tau", a["target_tau"], low=0.0, high=1.0, low_open=True, allow_none=True)
    check_range("epsilon_start", a["epsilon_start"], low=0.0, high=1.0)
    check_range("epsilon_end", a["epsilon_end"], low=0.0, high=1.0)
    check_range("epsilon_decay_steps", a["epsilon_decay_steps"], low=0)
    check_range("warmup_steps", a["warmup_steps"], low=0)
    check_range("replay_ratio", a["replay_ratio"], low=0.0, low_open=True)
    check_range("updates_per_epoch", a["updates_per_epoch"], low=1)
    check_range("updates_per_step", a["updates_per_step"], low=1)
    if a["updates_per_epoch"] % a["updates_per_step"]:
        raise ValueError(f"updates_per_step must divide updates_per_epoch, got updates_per_step="
                         f"{a['updates_per_step']} and updates_per_epoch={a['updates_per_epoch']}")
    check_range("updates_per_graph", a["updates_per_graph"], low=1)
    if a["updates_per_step"] % a["updates_per_graph"]:
        raise ValueError(f"updates_per_graph must divide updates_per_step, got updates_per_graph="
                         f"{a['updates_per_graph']} and updates_per_step={a['updates_per_step']}")
    if a["updates_per_graph"] > 1 and not (a["compile"] and a["replay"].sampler == "proportional"):
        raise ValueError(f"updates_per_graph={a['updates_per_graph']} needs graph mode with the whole update "
                         f"captured: compile=True and replay.sampler='proportional' (got compile={a['compile']}, "
                         f"sampler={a['replay'].sampler!r}); use updates_per_graph=1")
    check_range("max_env_steps", a["max_env_steps"], low=1, allow_none=True)
    check_range("sigterm_check_interval", a["sigterm_check_interval"], low=0)
    if a["inductor_mode"] not in INDUCTOR_MODES:
        raise ValueError(f"inductor_mode must be one of {INDUCTOR_MODES}, got {a['inductor_mode']!r}")
    if a["network"] not in ("mlp", "nature_cnn"):
        raise ValueError(f"network must be 'mlp' or 'nature_cnn', got {a['network']!r}")
    if len(a["hidden_sizes"]) == 0 or any(int(w) < 1 for w in a["hidden_sizes"]):
        raise ValueError(f"hidden_sizes must be a non-empty list of positive widths, "
                         f"got {list(a['hidden_sizes'])}")
