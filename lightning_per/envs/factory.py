"""Environment factories: every environment is a batched TorchRL ``EnvBase``.

``backend="gymnasium"``: ``num_envs`` copies of a Gymnasium environment in one
``gymnasium.vector.SyncVectorEnv`` (in process: on a 2-core machine worker processes cost more
than they give; ``vectorization="async"`` uses ``AsyncVectorEnv``) with ``autoreset_mode=DISABLED``,
wrapped by TorchRL's ``GymWrapper``, so that
``step_and_maybe_reset`` returns the true final observation of a finished episode and resets only
the finished members. ``backend="torch"``: :class:`~lightning_per.envs.TorchCartPoleEnv` on any
device. ``backend="ale"``: Atari through ``ale_py`` (emulator frame skip, grey frames resized to
84x84, no-op starts: :mod:`lightning_per.envs.atari`, after Mnih et al. 2015) and a TorchRL
``CatFrames`` frame stack, observation ``(num_envs, frame_stack, 84, 84) uint8``.
``backend="ale_vector"``: the same observations from ale-py's C++ vector env
(:class:`~lightning_per.envs.atari.AleVectorEnv`: preprocessing and stepping in C++ threads; the fast
choice on a many-core machine).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torchrl.envs import EnvBase, GymWrapper, TransformedEnv
from torchrl.envs.transforms import CatFrames, UnsqueezeTransform

from lightning_per.envs.atari import AleVectorEnv, make_ale_thunk
from lightning_per.envs.torch_cartpole import TorchCartPoleEnv

__all__ = ["EnvConfig", "make_env", "snapshot_env", "restore_env"]

_TORCH_ENVS = {"CartPole-v1": TorchCartPoleEnv}


@dataclass
class EnvConfig:
    """Which environment to train on and how many copies to step together.

    Raises:
        ValueError: (from :meth:`validate`) a value out of range, naming the field.
    """

    id: str = "CartPole-v1"
    """Environment id: a Gymnasium id (``CartPole-v1``), an ALE id (``ALE/Pong-v5``), or for
    ``backend="torch"`` one of the torch environments (``CartPole-v1``)."""
    backend: Literal["gymnasium", "torch", "ale", "ale_vector"] = "gymnasium"
    """``gymnasium`` (CPU, through TorchRL's GymWrapper), ``torch`` (pure-torch env on the module's
    device), ``ale`` (Atari through ale_py, CPU, preprocessing in Python) or ``ale_vector`` (ale_py's C++
    vector env: preprocessing and stepping in C++ threads, one per env up to the core count)."""
    num_envs: int = 8
    """Environments stepped together; each vector step is ``num_envs`` environment steps."""
    vectorization: Literal["sync", "async"] = "sync"
    """Gymnasium/ALE only: ``sync`` steps the copies in this process; ``async`` runs each in a worker
    process (``AsyncVectorEnv``; pays off for emulators on many cores; env state is then not
    checkpointed)."""
    max_episode_steps: int | None = None
    """Time limit in steps (truncation); None keeps the environment's own (500 for CartPole-v1)."""
    frame_stack: int = 4
    """ALE only: frames stacked along the channel axis (TorchRL ``CatFrames``)."""
    frame_skip: int = 4
    """ALE only: emulator frames per agent step (the action repeats; the last frame is observed)."""
    screen_size: int = 84
    """ALE only: side of the square grey observation in pixels."""
    noop_max: int = 30
    """ALE only: at most this many random no-op actions at the start of an episode."""
    repeat_action_probability: float = 0.25
    """ALE only: sticky-action probability (0.25 is the v5 default, Machado et al. 2018)."""

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field out of range."""
        if self.backend not in ("gymnasium", "torch", "ale", "ale_vector"):
            raise ValueError(f"env.backend must be 'gymnasium', 'torch', 'ale' or 'ale_vector', "
                             f"got {self.backend!r}")
        if self.vectorization not in ("sync", "async"):
            raise ValueError(f"env.vectorization must be 'sync' or 'async', got {self.vectorization!r}")
        if self.num_envs < 1:
            raise ValueError(f"env.num_envs must be >= 1, got {self.num_envs}")
        if self.max_episode_steps is not None and self.max_episode_steps < 1:
            raise ValueError(f"env.max_episode_steps must be None or >= 1, got {self.max_episode_steps}")
        for name in ("frame_stack", "frame_skip", "screen_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"env.{name} must be >= 1, got {getattr(self, name)}")
        if self.noop_max < 0:
            raise ValueError(f"env.noop_max must be >= 0, got {self.noop_max}")
        if not 0.0 <= self.repeat_action_probability <= 1.0:
            raise ValueError(f"env.repeat_action_probability must be in [0, 1], "
                             f"got {self.repeat_action_probability}")
        if self.backend == "torch" and self.id not in _TORCH_ENVS:
            raise ValueError(f"env.id {self.id!r} has no torch implementation; choose one of "
                             f"{sorted(_TORCH_ENVS)} or backend='gymnasium'")


def make_env(config: EnvConfig, device: torch.device | str = "cpu", seed: int = 0) -> EnvBase:
    """Build the batched environment described by ``config``, seeded with ``seed``.

    Args:
        config: the environment description (validated here).
        device: where a ``torch`` backend env lives; Gymnasium and ALE envs always run on the CPU.
        seed: member ``i`` of a Gymnasium vector env is seeded with ``seed + i``.

    Returns:
        a TorchRL ``EnvBase`` with ``batch_size == (num_envs,)``, a categorical ``action``
        (``(num_envs,) int64``), ``observation``, ``reward (num_envs, 1) float32`` and the
        ``done``/``terminated``/``truncated`` flags ``(num_envs, 1) bool``.

    Raises:
        ValueError: invalid ``config``. ImportError: ``backend="ale"`` without ``ale_py``.
    """
    config.validate()
    if config.backend == "torch":
        kwargs = {} if config.max_episode_steps is None else {"max_steps": config.max_episode_steps}
        return _TORCH_ENVS[config.id](num_envs=config.num_envs, device=device, seed=seed, **kwargs)
    if config.backend == "ale_vector":
        env = AleVectorEnv(config.id, config.num_envs, frame_skip=config.frame_skip, size=config.screen_size,
                           frame_stack=config.frame_stack, noop_max=config.noop_max,
                           repeat_action_probability=config.repeat_action_probability,
                           max_episode_steps=config.max_episode_steps)
        env.set_seed(seed)
        return env
    import gymnasium as gym

    if config.backend == "ale":
        fns = [make_ale_thunk(config.id, frame_skip=config.frame_skip, size=config.screen_size,
                              noop_max=config.noop_max, max_episode_steps=config.max_episode_steps,
                              repeat_action_probability=config.repeat_action_probability)] * config.num_envs
    else:
        kwargs = {} if config.max_episode_steps is None else {"max_episode_steps": config.max_episode_steps}
        fns = [lambda: gym.make(config.id, **kwargs)] * config.num_envs
    cls = gym.vector.SyncVectorEnv if config.vectorization == "sync" else gym.vector.AsyncVectorEnv
    venv = cls(fns, autoreset_mode=gym.vector.AutoresetMode.DISABLED)
    env: EnvBase = GymWrapper(venv, categorical_action_encoding=True)
    env.set_seed(seed)
    if config.backend == "ale":
        env = TransformedEnv(env, UnsqueezeTransform(-3, in_keys=["observation"]))
        env.append_transform(CatFrames(N=config.frame_stack, dim=-3, in_keys=["observation"]))
    return env


def snapshot_env(env: EnvBase) -> dict[str, Any] | None:
    """The environment's state for a checkpoint, or None where it cannot be captured.

    Supported exactly: :class:`TorchCartPoleEnv` (tensors), and Gymnasium vector envs whose members keep
    their state in plain attributes (classic control: the physics state array, the time-limit counter, the
    ``np_random`` bit-generator state), stored as one JSON text (numbers, strings, arrays as lists with their
    dtype): loading it never runs code. Members holding anything else (ALE emulators, transformed envs)
    return None: a resumed run then starts fresh episodes.
    """
    if isinstance(env, TorchCartPoleEnv):
        return {"kind": "torch", "state": env.snapshot()}
    venv = getattr(env, "_env", None)
    members = getattr(venv, "envs", None)
    if isinstance(env, GymWrapper) and members is not None:
        try:
            layers = [[_plain_attributes(layer) for layer in _layers(member)] for member in members]
        except _NotPlain:
            return None
        return {"kind": "gym_vector_json", "state": json.dumps(layers)}
    return None


def restore_env(env: EnvBase, snapshot: dict[str, Any] | None) -> bool:
    """Restore a :func:`snapshot_env` result; returns False (with a warning) where it cannot (another env
    kind or structure, or a snapshot of an older format). Only attributes the env already has are set, each
    from plain data of the same kind."""
    if isinstance(snapshot, dict) and snapshot.get("kind") == "torch" and isinstance(env, TorchCartPoleEnv):
        env.restore(snapshot["state"])
        return True
    if (isinstance(snapshot, dict) and snapshot.get("kind") == "gym_vector_json" and isinstance(env, GymWrapper)
            and isinstance(snapshot.get("state"), str)):
        members = getattr(getattr(env, "_env", None), "envs", None)
        try:
            saved = json.loads(snapshot["state"])
            targets = [_layers(member) for member in members or ()]
            if not (isinstance(saved, list) and len(saved) == len(targets)
                    and all(isinstance(s, list) and len(s) == len(t) for s, t in zip(saved, targets))):
                raise _NotPlain("structure")
            plans = [(layer, _decoded(layer, attrs)) for member, layers in zip(saved, targets)
                     for attrs, layer in zip(member, layers)]  # every value decoded before any is set
        except (ValueError, TypeError, KeyError, _NotPlain):
            plans = None
        if plans is not None:
            for layer, values in plans:
                for name, value in values.items():
                    if isinstance(value, _RNGState):
                        getattr(layer, name).bit_generator.state = value.state
                    else:
                        setattr(layer, name, value)
            return True
    warnings.warn("the environment state is not in the checkpoint (or does not fit this env): the "
                  "resumed run starts new episodes, so its transitions differ from an uninterrupted run",
                  stacklevel=2)
    return False


class _NotPlain(Exception):
    """An env attribute that is not plain data (the env's state is then not captured)."""


class _RNGState:
    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state


#: Attributes that are configuration, links or caches, not state (the wrapped env, spaces, spec, the last step's
#: data kept by Gymnasium's env checker).
_SKIPPED = {"env", "_previous_data", "metadata", "spec", "render_mode", "observation_space", "action_space",
            "_observation_space", "_action_space", "_metadata", "_cached_spec", "_ezpickle_args", "_ezpickle_kwargs",
            "_saved_kwargs", "_disable_render_order_enforcing"}


def _layers(member) -> list[Any]:
    """A Gymnasium env's wrapper chain, outermost first, down to the unwrapped env."""
    layers = [member]
    while hasattr(layers[-1], "env") and len(layers) < 64:
        layers.append(layers[-1].env)
    return layers


def _plain_attributes(layer) -> dict[str, Any]:
    """The layer's own attributes as JSON-ready plain data (``_SKIPPED`` configuration and links left out).

    Raises:
        _NotPlain: an attribute holds anything else (e.g. an emulator handle, a screen surface).
    """
    out = {}
    for name, value in vars(layer).items():
        if name in _SKIPPED or callable(value) and not isinstance(value, np.random.Generator):
            continue
        out[name] = _encode(value)
    return out


def _encode(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        if isinstance(value, float) and not np.isfinite(value):
            return {"__float__": repr(value)}
        return value
    if isinstance(value, np.random.Generator):
        return {"__rng__": value.bit_generator.state}
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        return {"__scalar__": value.item(), "dtype": value.dtype.str}
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return {"__ndarray__": value.tolist(), "dtype": value.dtype.str, "shape": list(value.shape)}
    if isinstance(value, (tuple, list)):
        return {"__seq__": [_encode(v) for v in value], "tuple": isinstance(value, tuple)}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"__map__": {k: _encode(v) for k, v in value.items()}}
    raise _NotPlain(type(value).__name__)


def _decoded(layer, attrs: dict[str, Any]) -> dict[str, Any]:
    """The values to set on ``layer``: ``attrs`` decoded, each only for an attribute ``layer`` already has and
    of the same kind.

    Raises:
        _NotPlain, ValueError, TypeError, KeyError: the snapshot does not fit ``layer``.
    """
    if not isinstance(attrs, dict):
        raise _NotPlain("layer")
    have = vars(layer)
    out: dict[str, Any] = {}
    for name, encoded in attrs.items():
        if name not in have:
            raise _NotPlain(name)
        current = have[name]
        if isinstance(encoded, dict) and "__rng__" in encoded:
            if not (isinstance(current, np.random.Generator)
                    and encoded["__rng__"].get("bit_generator") == type(current.bit_generator).__name__):
                raise _NotPlain(name)
            out[name] = _RNGState(encoded["__rng__"])
        else:
            out[name] = _decode(encoded)
    return out


def _decode(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if not isinstance(value, dict):
        raise _NotPlain("value")
    if "__float__" in value:
        return float(value["__float__"])
    if "__scalar__" in value:
        return np.dtype(_numeric_dtype(value["dtype"])).type(value["__scalar__"])
    if "__ndarray__" in value:
        return np.asarray(value["__ndarray__"], dtype=_numeric_dtype(value["dtype"])).reshape(value["shape"])
    if "__seq__" in value:
        items = [_decode(v) for v in value["__seq__"]]
        return tuple(items) if value.get("tuple") else items
    if "__map__" in value and isinstance(value["__map__"], dict):
        return {str(k): _decode(v) for k, v in value["__map__"].items()}
    raise _NotPlain("value")


def _numeric_dtype(name) -> np.dtype:
    dtype = np.dtype(str(name))
    if dtype.kind not in "biuf":
        raise _NotPlain(f"dtype {name}")
    return dtype
