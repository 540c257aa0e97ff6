"""The DQN module's checkpointed state (``checkpoint["dqn_state"]``): what is saved, loaded and checked.

``dqn_state`` (version :data:`STATE_VERSION`) holds the host counters (env steps, updates, the collection
credit), the metric accumulator, torch's CPU (and CUDA) RNG states, the collector, a generation id, and
with ``checkpoint_replay=True`` the replay buffer (storage + sampler) and its generator. Under DDP each
rank's state goes to its shard next to the checkpoint (:mod:`lightning_per.dqn.ddp`), and the checkpoint
keeps rank 0's state without the replay plus ``shards: world_size``.

The module's checkpoint hooks hand these functions the values they need: :func:`saved_state` builds the state
to save, :func:`loaded_state` checks a checkpoint's state (and reads this rank's DDP shard),
:func:`restore_state` restores the checked state into the module's parts, and :func:`check_resume_state` runs the
command line's checks before anything is built.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from lightning_per import make_replay_buffer
from lightning_per.dqn.ddp import SHARD_KIND, load_replay_shard, replay_shard_path
from lightning_per.envs import check_env_state
from lightning_per.integrity import IntegrityError, verify_file
from lightning_per.replay.buffer_checkpoint import checked_state
from lightning_per.schema import check, stamp

if TYPE_CHECKING:
    from torchrl.envs import EnvBase

    from lightning_per.dqn.collector import NStepCollector
    from lightning_per.dqn.config import ReplayConfig
    from lightning_per.metrics.accumulator import MetricAccumulator
    from lightning_per.replay.buffer import GPUPrioritizedReplayBuffer, GPUReplayBuffer

__all__ = ["STATE_VERSION", "check_resume_state", "check_state_types", "describe", "loaded_state", "restore_state",
           "saved_state"]

STATE_VERSION = 1
"""The ``dqn_state`` version this code writes and reads."""
_SCHEMA = {"legacy_keys": ("version",), "label": "dqn_state version"}  # lightning_per.schema.check; no default


def describe(value: Any) -> str:
    """How an error names a checkpoint value: a tensor by dtype and shape, anything else by its short repr."""
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {tuple(value.shape)}"
    text = repr(value)
    return f"{text[:60]}..." if len(text) > 63 else text


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _rng_state(value: Any, numel: int | None) -> bool:
    """A generator state as ``torch.Generator.get_state`` returns it: a 1-D uint8 tensor (of ``numel`` bytes)."""
    return (isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 1
            and value.numel() > 0 and (numel is None or value.numel() == numel))


def check_state_types(state: Mapping[str, Any], metrics: Mapping[str, torch.Tensor],
                      collector_rng_bytes: int | None = None) -> None:
    """Refuse a ``dqn_state`` (its version already checked) whose values are not of the types this code writes,
    before any of it is restored: the host counters, the metric accumulator's tensors (``metrics``: the live
    accumulator's ``state_dict()``, whose keys, shapes and dtypes they must have), torch's RNG states, the
    collector's counters, tensors and RNG (``collector_rng_bytes``: its generator's state size, None: any), the
    replay generator, the generation id and the DDP shard count. The replay buffer's own state is checked by
    :func:`lightning_per.replay.buffer_checkpoint.checked_state`; the env's by the collector.

    Raises:
        ValueError: one line naming the key (``dqn_state.env_steps``) and what was expected.
    """
    def refuse(key: str, expected: str, value: Any) -> None:
        raise ValueError(f"dqn_state.{key} must be {expected}, got {describe(value)}")

    cpu_rng_bytes = torch.get_rng_state().numel()
    for key in ("env_steps", "updates", "credit", "metrics", "torch_rng", "collector"):
        if key not in state:
            raise ValueError(f"dqn_state has no {key!r} (a checkpoint this code writes has env_steps, updates, "
                             f"credit, metrics, torch_rng, collector)")
    for key in ("env_steps", "updates"):
        if not _count(state[key]):
            refuse(key, "an int >= 0", state[key])
    credit = state["credit"]
    if isinstance(credit, bool) or not isinstance(credit, (int, float)) or not math.isfinite(credit) or credit < 0:
        refuse("credit", "a finite number >= 0", credit)
    saved = state["metrics"]
    if not isinstance(saved, Mapping) or set(saved) != set(metrics):
        refuse("metrics", f"a dict with keys {sorted(metrics)}", saved)
    for key, live in metrics.items():
        value = saved[key]
        if not isinstance(value, torch.Tensor) or value.dtype != live.dtype or value.shape != live.shape:
            refuse(f"metrics.{key}", describe(live), value)
    if not _rng_state(state["torch_rng"], cpu_rng_bytes):
        refuse("torch_rng", f"a uint8 tensor of shape ({cpu_rng_bytes},) (torch.get_rng_state())", state["torch_rng"])
    cuda_rng = state.get("cuda_rng")
    if cuda_rng is not None and not (isinstance(cuda_rng, (list, tuple))
                                     and all(_rng_state(s, None) for s in cuda_rng)):
        refuse("cuda_rng", "a list of 1-D uint8 tensors (torch.cuda.get_rng_state_all())", cuda_rng)
    collector = state["collector"]
    if collector is not None:
        if not isinstance(collector, Mapping):
            refuse("collector", "a dict (the collector's state_dict()) or None", collector)
        for key in ("steps", "window", "ep_return", "ep_length", "rng", "td", "env"):
            if key not in collector:
                raise ValueError(f"dqn_state.collector has no {key!r}")
        if not _count(collector["steps"]):
            refuse("collector.steps", "an int >= 0", collector["steps"])
        for key in ("window", "received", "td"):
            value = collector.get(key)
            if value is None and key != "window":
                continue
            if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
                refuse(f"collector.{key}", "a dict of named tensors" + ("" if key == "window" else " or None"), value)
        for key in ("window", "received"):
            for name, value in (collector.get(key) or {}).items():
                if not isinstance(value, torch.Tensor):
                    refuse(f"collector.{key}.{name}", "a tensor", value)
        for key in ("ep_return", "ep_length"):
            if not isinstance(collector[key], torch.Tensor) or collector[key].dim() != 1:
                refuse(f"collector.{key}", "a 1-D tensor (one value per env)", collector[key])
        if not _rng_state(collector["rng"], collector_rng_bytes):
            size = "" if collector_rng_bytes is None else f" of shape ({collector_rng_bytes},)"
            refuse("collector.rng", f"a uint8 tensor{size} (the exploration generator's get_state())",
                   collector["rng"])
    if "replay" in state:
        if not isinstance(state["replay"], Mapping):
            refuse("replay", "a dict (the replay buffer's state_dict())", state["replay"])
        if not _rng_state(state.get("replay_rng"), cpu_rng_bytes):
            refuse("replay_rng", f"a uint8 tensor of shape ({cpu_rng_bytes},) (torch.Generator().get_state())",
                   state.get("replay_rng"))
    if "generation" in state and not isinstance(state["generation"], str):
        refuse("generation", "a str", state["generation"])
    if "shards" in state and not (_count(state["shards"]) and state["shards"] >= 1):
        refuse("shards", "an int >= 1 (the DDP world size that wrote it)", state["shards"])


def saved_state(*, env_steps: int, updates: int, credit: float, metrics: dict[str, torch.Tensor],
                collector: dict[str, Any] | None, replay: dict[str, Any] | None, replay_rng: torch.Tensor | None,
                generation: str, world_size: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The ``dqn_state`` a checkpoint keeps and, under DDP, this rank's whole state for its replay shard.

    torch's CPU RNG state (and with CUDA every device's) is read here, after the arguments.

    Args:
        env_steps: env steps taken (host int >= 0).
        updates: gradient updates made (host int >= 0).
        credit: env steps the updates still owe (host float >= 0).
        metrics: the metric accumulator's ``state_dict()`` (tensors on the learner's device).
        collector: the collector's ``state_dict()``; None without one (``collector="actors"``).
        replay: the replay buffer's ``state_dict()`` (storage + sampler, on its device); None: not checkpointed.
        replay_rng: the replay generator's ``get_state()`` (``(n,) uint8``, CPU), given with ``replay``.
        generation: this save's id (``<run id>-step<global step>``).
        world_size: the number of processes saving (1: no DDP).

    Returns:
        ``(state, shard)``: with ``world_size > 1`` the state without ``replay`` / ``replay_rng`` plus
        ``shards: world_size``, and the whole state for ``<ckpt>.rank{r}.replay.pt`` (written by the strategy hook
        of :func:`lightning_per.dqn.ddp.write_shards_with_checkpoints`); else the whole state and None.
    """
    state = stamp({
        "env_steps": env_steps, "updates": updates, "credit": credit, "metrics": metrics,
        "torch_rng": torch.get_rng_state(), "collector": collector,
    }, "dqn_state", STATE_VERSION)
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    if replay is not None:
        state["replay"] = replay
        state["replay_rng"] = replay_rng
    state["generation"] = generation
    if world_size <= 1:
        return state, None
    # the checkpoint keeps rank 0's state without the replay; each rank's whole state goes to its shard
    kept = {k: v for k, v in state.items() if k not in ("replay", "replay_rng")}
    kept["shards"] = world_size
    return kept, state


def loaded_state(dqn_state: Any, *, ckpt_path: str | os.PathLike[str] | None, world_size: int, global_rank: int,
                 metrics: Mapping[str, torch.Tensor], collector_rng_bytes: int | None) -> dict[str, Any] | None:
    """A checkpoint's ``dqn_state`` checked before any of it is restored: its version, a DDP checkpoint's shard
    for this rank in its place, every value's type (:func:`check_state_types`).

    Nothing is unpickled here: the checkpoint was loaded by Lightning's checkpoint IO, a shard by
    :func:`lightning_per.dqn.ddp.load_replay_shard` (``weights_only=True``, checked against its manifest).

    Args:
        dqn_state: ``checkpoint.get("dqn_state")``: None warns and returns None (replay, counters and RNG start
            fresh).
        ckpt_path: the checkpoint's path (the Trainer's ``ckpt_path``), named in errors; None: not known (no
            Trainer, or ``load_from_checkpoint``): a DDP checkpoint then gives rank 0's counters without a replay.
        world_size: the number of processes resuming (1 without a Trainer).
        global_rank: this process's global rank, whose shard is read.
        metrics: the live metric accumulator's ``state_dict()`` (keys, shapes and dtypes the saved one must have).
        collector_rng_bytes: the exploration generator's state size; None: any (no collector).

    Returns:
        The checked state (this rank's shard's under DDP) for :func:`restore_state`, or None.

    Raises:
        ValueError: not a dict, another version, a DDP checkpoint resumed by another number of processes, or a
            value of another type (naming ``dqn_state.<key>`` and, where known, the checkpoint).
        FileNotFoundError, IntegrityError: this rank's shard is missing, damaged or from another save.
    """
    state = dqn_state
    if state is None:
        warnings.warn("checkpoint has no 'dqn_state': replay, counters and RNG start fresh", stacklevel=3)
        return None
    where = f"checkpoint {ckpt_path}: " if ckpt_path else ""
    if not isinstance(state, dict):
        raise ValueError(f"{where}dqn_state must be a dict (the DQN module's state), got {describe(state)}")
    state = check(state, "dqn_state", STATE_VERSION, **_SCHEMA)
    shards = state.get("shards")
    if shards is not None:
        if ckpt_path is not None and world_size == shards:
            state = load_replay_shard(ckpt_path, global_rank, state)
        elif ckpt_path is not None and world_size > 1:
            raise ValueError(f"checkpoint {ckpt_path} was written by {shards} DDP ranks (one replay shard "
                             f"each); resume it with {shards} devices, not {world_size}")
        else:
            warnings.warn(f"checkpoint holds {shards} DDP replay shards next to it; using rank 0's "
                          "counters and RNG without a replay buffer", stacklevel=3)
    try:  # every value's type before any is restored
        check_state_types(state, metrics, collector_rng_bytes)
    except ValueError as err:
        raise ValueError(f"{where}{err}") from None
    return state


def restore_state(state: Mapping[str, Any], *, metrics: MetricAccumulator, collector: NStepCollector | None,
                  rb: GPUPrioritizedReplayBuffer | GPUReplayBuffer | None, replay_rng: torch.Generator | None,
                  warmup: bool) -> None:
    """Restore a :func:`loaded_state` result into the module's parts (its host counters are the module's to set).

    Sets torch's CPU RNG state (and every CUDA device's, where saved and CUDA is available).

    Args:
        state: the checked ``dqn_state``.
        metrics: the metric accumulator (on the learner's device).
        collector: the n-step collector; None without one (then the state's ``collector`` must be None).
        rb: the replay buffer (on the learner's device; used where the state holds ``replay``).
        replay_rng: the replay generator (CPU; the buffer derives its device generator from it).
        warmup: the run warms up (``warmup_steps > 0``): a state without its replay warns that the buffer refills.

    Raises:
        ValueError, TypeError: a part refuses its state (the replay buffer's and the env's checks).
    """
    metrics.load_state_dict(state["metrics"])
    torch.set_rng_state(state["torch_rng"])
    if "cuda_rng" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    if state["collector"] is not None:
        collector.load_state_dict(state["collector"])
    if "replay" in state:
        rb.load_state_dict(state["replay"])
        replay_rng.set_state(state["replay_rng"])
    elif "shards" in state:
        # rank 0's state of a DDP checkpoint loaded by a different number of processes: its replay
        # (if checkpoint_replay was on) is in the shard files, and loaded_state already said so
        pass
    elif warmup:
        warnings.warn("checkpoint has no replay buffer (checkpoint_replay=False): it refills during a "
                      "new warm-up", stacklevel=3)


def check_resume_state(checkpoint: Mapping[str, Any], ckpt_path: str | os.PathLike[str], world_size: int,
                       global_rank: int, *, metrics: Mapping[str, torch.Tensor], make_env: Callable[[], EnvBase],
                       env_owned: bool, replay: ReplayConfig | None, node_ranks: Sequence[int] = (),
                       collector_rng_bytes: int | None = None) -> None:
    """Raise what resuming from ``checkpoint`` (read from ``ckpt_path``) would refuse part-way, before
    anything is built or written (the command line calls it before ``Trainer.fit``): another ``dqn_state``
    version, a DDP checkpoint of another world size, this rank's shard missing, damaged or from another
    save, and a replay state this model's buffer refuses (checked against a CPU buffer of the configured
    capacity: priorities are 8 bytes a slot, transitions are not allocated).

    Every value of the ``dqn_state`` (this rank's shard under DDP) must have the type this code writes
    (:func:`check_state_types`). The env state is checked against an env ``make_env()`` makes
    (:func:`lightning_per.envs.check_env_state`: dynamic state only, constants never restored).

    Args:
        checkpoint: the checkpoint, loaded by the checkpoint IO (its manifest verified).
        ckpt_path: where it was read from (named in errors; its DDP shards lie next to it).
        world_size: the number of processes resuming.
        global_rank: this process's global rank, whose shard is read.
        metrics: the live metric accumulator's ``state_dict()``.
        make_env: makes an env of this run's config (called only where the state holds an env state).
        env_owned: the env ``make_env`` returns is ours to close (False: a user's own env instance stays open).
        replay: the model's replay configuration where it checkpoints its replay (``checkpoint_replay=True``),
            else None (a saved replay is not checked).
        node_ranks: the global ranks of this node, whose shards must match their manifests too. The launching
            process checks them before it starts the others: a rank that found its shard missing or damaged after
            the start would make Lightning's launcher kill every process (exit 137) instead of one error.
        collector_rng_bytes: the state size of the exploration generator on the run's device; None: not checked.

    Raises:
        FileNotFoundError, IntegrityError, TypeError, ValueError: naming the file or the part.
    """
    state = checkpoint.get("dqn_state")
    if state is None:
        return
    if not isinstance(state, dict):
        raise ValueError(f"{os.fspath(ckpt_path)}: dqn_state must be a dict (the DQN module's state), got "
                         f"{describe(state)}")
    try:
        state = check(state, "dqn_state", STATE_VERSION, **_SCHEMA)
    except ValueError as err:
        raise ValueError(f"{os.fspath(ckpt_path)}: {err}") from None
    shards = state.get("shards")
    if shards is not None:
        if world_size != shards:  # one process too: training on would drop every rank's replay
            raise ValueError(f"checkpoint {os.fspath(ckpt_path)} was written by {shards} DDP ranks (one replay "
                             f"shard each); resume it with {shards} processes, not {world_size}")
        for rank in node_ranks:  # the launching process reads each shard's manifest before the others start
            path = replay_shard_path(ckpt_path, rank, state.get("generation"))
            try:
                manifest = verify_file(path, SHARD_KIND)
            except FileNotFoundError:
                raise FileNotFoundError(f"{path}: missing (checkpoint {os.fspath(ckpt_path)} was written by "
                                        f"{shards} DDP ranks, one replay shard each); resume from a "
                                        f"checkpoint with every shard") from None
            if manifest["generation"] != state.get("generation"):
                raise IntegrityError(f"{path}: from another save than {os.fspath(ckpt_path)} (shard generation "
                                     f"{manifest['generation']!r}, checkpoint {state.get('generation')!r})")
        state = load_replay_shard(ckpt_path, global_rank, state)
    try:
        check_state_types(state, metrics, collector_rng_bytes)
    except ValueError as err:
        raise ValueError(f"{os.fspath(ckpt_path)}: {err}") from None
    env_state = state["collector"].get("env") if isinstance(state.get("collector"), Mapping) else None
    if env_state is not None:  # against an env of this run's config, before anything is built
        env = make_env()
        try:
            check_env_state(env, env_state)
        except ValueError as err:
            raise ValueError(f"{os.fspath(ckpt_path)}: {err}") from None
        finally:
            if env_owned:  # a user's own env instance stays open
                env.close()
    if "replay" in state and replay is not None:
        r = replay
        extra = {} if r.sampler == "uniform" else {"weight_normalization": r.weight_normalization}
        probe = make_replay_buffer(r.capacity, r.batch_size, sampler=r.sampler, device="cpu", alpha=r.alpha,
                                   beta=r.beta, eps=r.eps, packed=r.packed, eager_graphs=False, seed=0, **extra)
        try:
            checked_state(probe, state["replay"])
        except (TypeError, ValueError) as err:
            raise type(err)(f"{os.fspath(ckpt_path)}: the replay buffer refuses it: {err}") from None
