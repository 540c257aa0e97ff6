"""The DQN module's checkpointed state (``checkpoint["dqn_state"]``): what is saved, loaded and checked.

``dqn_state`` (version :data:`STATE_VERSION`) holds the host counters (env steps, updates, the collection
credit), the metric accumulator, torch's CPU (and CUDA) RNG states, the collector, a generation id, and
with ``checkpoint_replay=True`` the replay buffer (storage + sampler) and its generator. Under DDP each
rank's state goes to its shard next to the checkpoint (:mod:`lightning_per.dqn.ddp`), and the checkpoint
keeps rank 0's state without the replay plus ``shards: world_size``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from lightning_per import make_replay_buffer
from lightning_per.callbacks.checkpoint_io import GENERATION_KEY
from lightning_per.dqn.ddp import load_replay_shard, replay_shard_path
from lightning_per.integrity import file_manifest_path, new_generation
from lightning_per.replay.buffer_checkpoint import checked_state
from lightning_per.schema import check, stamp

__all__ = ["STATE_VERSION", "CheckpointHooks"]

STATE_VERSION = 1
"""The ``dqn_state`` version this code writes and reads."""
_SCHEMA = {"legacy_keys": ("version",), "label": "dqn_state version"}  # lightning_per.schema.check; no default


class CheckpointHooks:
    """The DQN module's checkpoint hooks (a mixin of :class:`~lightning_per.dqn.DQN`; it reads the module's
    ``env_steps``, ``updates``, ``metrics``, ``collector``, ``rb`` and ``hparams``)."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = stamp({
            "env_steps": self.env_steps, "updates": self.updates, "credit": self._credit,
            "metrics": self.metrics.state_dict(), "torch_rng": torch.get_rng_state(),
            "collector": self.collector.state_dict() if self.collector is not None else None,
        }, "dqn_state", STATE_VERSION)
        if torch.cuda.is_available():
            state["cuda_rng"] = torch.cuda.get_rng_state_all()
        if self.hparams.checkpoint_replay and self.rb is not None:
            state["replay"] = self.rb.state_dict()
            state["replay_rng"] = self._replay_rng.get_state()
        run_id = getattr(self, "_run_id", None) or new_generation()
        state["generation"] = f"{run_id}-step{checkpoint.get('global_step', self.updates)}"
        checkpoint[GENERATION_KEY] = state["generation"]  # the checkpoint's manifest carries it too
        world_size = self.trainer.world_size if self._trainer is not None else 1
        if world_size > 1:
            # each rank's state goes to <ckpt>.rank{r}.replay.pt (written by the strategy hook of
            # ddp.write_shards_with_checkpoints); the checkpoint keeps rank 0's state without the replay
            self._shard_state = state
            state = {k: v for k, v in state.items() if k not in ("replay", "replay_rng")}
            state["shards"] = world_size
        checkpoint["dqn_state"] = state

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("dqn_state")
        if state is None:
            warnings.warn("checkpoint has no 'dqn_state': replay, counters and RNG start fresh", stacklevel=2)
            return
        state = check(state, "dqn_state", STATE_VERSION, **_SCHEMA)
        shards = state.get("shards")
        if shards is not None:
            world_size = self.trainer.world_size if self._trainer is not None else 1
            path = self.trainer.ckpt_path if self._trainer is not None else None
            if path is not None and world_size == shards:
                state = load_replay_shard(path, self.global_rank, state)
            elif path is not None and world_size > 1:
                raise ValueError(f"checkpoint {path} was written by {shards} DDP ranks (one replay shard "
                                 f"each); resume it with {shards} devices, not {world_size}")
            else:
                warnings.warn(f"checkpoint holds {shards} DDP replay shards next to it; using rank 0's "
                              "counters and RNG without a replay buffer", stacklevel=2)
        if self.collector is None:  # e.g. DQN.load_from_checkpoint: applied by build_runtime()
            self._pending_state = state
            return
        self._load_dqn_state(state)

    def check_resume(self, checkpoint: dict[str, Any], ckpt_path: str | os.PathLike[str], world_size: int,
                     global_rank: int, node_ranks: Sequence[int] = ()) -> None:
        """Raise what resuming from ``checkpoint`` (read from ``ckpt_path``) would refuse part-way, before
        anything is built or written (the command line calls it before ``Trainer.fit``): another ``dqn_state``
        version, a DDP checkpoint of another world size, this rank's shard missing, damaged or from another
        save, and a replay state this model's buffer refuses (checked against a CPU buffer of the configured
        capacity: priorities are 8 bytes a slot, transitions are not allocated).

        ``node_ranks``: the global ranks of this node, whose shards and manifests must exist too. The launching
        process checks them before it starts the others: a rank that found its shard missing after the start
        would make Lightning's launcher kill every process (exit 137) instead of one error.

        Raises:
            FileNotFoundError, IntegrityError, TypeError, ValueError: naming the file or the part.
        """
        state = checkpoint.get("dqn_state")
        if state is None:
            return
        try:
            state = check(state if isinstance(state, dict) else {}, "dqn_state", STATE_VERSION, **_SCHEMA)
        except ValueError as err:
            raise ValueError(f"{os.fspath(ckpt_path)}: {err}") from None
        shards = state.get("shards")
        if shards is not None:
            if world_size != shards:  # one process too: training on would drop every rank's replay
                raise ValueError(f"checkpoint {os.fspath(ckpt_path)} was written by {shards} DDP ranks (one replay "
                                 f"shard each); resume it with {shards} processes, not {world_size}")
            missing = [path for rank in node_ranks for path in (replay_shard_path(ckpt_path, rank),)
                       if not (os.path.isfile(path) and os.path.isfile(file_manifest_path(path)))]
            if missing:
                raise FileNotFoundError(f"checkpoint {os.fspath(ckpt_path)} was written by {shards} DDP ranks, and the "
                                        f"replay shards (or manifests) of ranks on this node are missing: "
                                        f"{', '.join(missing)}; resume from a checkpoint with every shard")
            state = load_replay_shard(ckpt_path, global_rank, state)
        if "replay" in state and self.hparams.checkpoint_replay:
            r = self.replay_config
            extra = {} if r.sampler == "uniform" else {"weight_normalization": r.weight_normalization}
            probe = make_replay_buffer(r.capacity, r.batch_size, sampler=r.sampler, device="cpu", alpha=r.alpha,
                                       beta=r.beta, eps=r.eps, packed=r.packed, eager_graphs=False, seed=0, **extra)
            try:
                checked_state(probe, state["replay"])
            except (TypeError, ValueError) as err:
                raise type(err)(f"{os.fspath(ckpt_path)}: the replay buffer refuses it: {err}") from None

    def _load_dqn_state(self, state: dict[str, Any]) -> None:
        self.env_steps, self.updates, self._credit = state["env_steps"], state["updates"], state["credit"]
        self.metrics.load_state_dict(state["metrics"])
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        if state["collector"] is not None:
            self.collector.load_state_dict(state["collector"])
        if "replay" in state:
            self.rb.load_state_dict(state["replay"])
            self._replay_rng.set_state(state["replay_rng"])
        elif "shards" in state:
            # rank 0's state of a DDP checkpoint loaded by a different number of processes: its replay
            # (if checkpoint_replay was on) is in the shard files, and on_load_checkpoint already said so
            pass
        elif self.hparams.warmup_steps > 0:
            warnings.warn("checkpoint has no replay buffer (checkpoint_replay=False): it refills during a "
                          "new warm-up", stacklevel=2)
