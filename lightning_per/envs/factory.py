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

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torchrl.envs import EnvBase, GymWrapper, TransformedEnv
from torchrl.envs.transforms import CatFrames, UnsqueezeTransform

from lightning_per.envs.atari import AleVectorEnv, make_ale_thunk
from lightning_per.envs.torch_cartpole import TorchCartPoleEnv

__all__ = ["EnvConfig", "check_checkpoint_env_id", "env_id_module", "make_env"]

_TORCH_ENVS = {"CartPole-v1": TorchCartPoleEnv}


@dataclass
class EnvConfig:
    """Which environment to train on and how many copies to step together.

    Raises:
        ValueError: (from :meth:`validate`) a value out of range, naming the field.
    """

    id: str = "CartPole-v1"
    """Environment id: a Gymnasium id (``CartPole-v1``), an ALE id (``ALE/Pong-v5``), or for
    ``backend="torch"`` one of the torch environments (``CartPole-v1``). Gymnasium's ``module:Id`` imports
    ``module`` first: allowed in your own settings, refused when read from a checkpoint
    (:func:`check_checkpoint_env_id`)."""
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
        """Raise ``ValueError`` naming the first field out of range (before anything is made or imported)."""
        env_id_module(self.id)
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


def env_id_module(env_id: Any) -> str | None:
    """The module ``gymnasium.make(env_id)`` imports first: ``"module"`` of Gymnasium's ``"module:Id"`` form (to
    run the module's env registrations), None for an id that names no module (``CartPole-v1``, ``ALE/Pong-v5``).

    Raises:
        ValueError: ``env_id`` is not a non-empty string, has more than one ``:``, or its module part is not a
            dotted Python name.
    """
    if not isinstance(env_id, str) or not env_id.strip():
        raise ValueError(f"env.id must be a non-empty string, got {env_id!r}")
    if ":" not in env_id:
        return None
    module, _, name = env_id.partition(":")
    if ":" in name or not name or not all(part.isidentifier() for part in module.split(".")):
        raise ValueError(f"env.id {env_id!r}: expected an id or Gymnasium's 'module:Id' (a dotted module name, "
                         f"one ':', then the id)")
    return module


def check_checkpoint_env_id(checkpoint_id: Any, own_id: Any) -> None:
    """Refuse an ``env.id`` read from a checkpoint that would make Gymnasium import a module.

    ``gymnasium.make("module:Id")`` imports ``module`` before it looks ``Id`` up, so such an id runs code. An
    id from the user's own settings (config file, command line, Python) may name a module: it is the user's own
    code. An id read from a checkpoint is data: accepted only where it names no module, or is exactly the id
    the user's own settings name (``own_id``: the user asked for that import). Call it before anything is
    built: a refused id imports nothing.

    Args:
        checkpoint_id: the ``env.id`` a checkpoint holds (None: it holds none, nothing to check).
        own_id: the ``env.id`` of the user's settings (config, command line, defaults), or None.

    Raises:
        ValueError: ``checkpoint_id`` names a module that ``own_id`` does not name, or is not an env id.
    """
    if checkpoint_id is None:
        return
    module = env_id_module(checkpoint_id)
    if module is not None and checkpoint_id != own_id:
        raise ValueError(f"the checkpoint's env.id {checkpoint_id!r} names a module to import ({module!r}); a "
                         f"checkpoint's values never import code: give --model.env.id {checkpoint_id} yourself "
                         f"if you trust that module")


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
