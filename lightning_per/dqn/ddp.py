"""DDP plumbing of the DQN module: per-rank replay shards, the per-rank epoch, graph mode's own all-reduce.

Under Lightning's DDP strategy every rank keeps its own env, collector and replay buffer (seeded by global
rank) and runs ``updates_per_epoch`` updates an epoch; the gradients are averaged over the ranks (by DDP's
reducer in eager mode, by :func:`all_reduce_mean_grads_` inside the captured update in graph mode). This
file holds what that needs beyond Lightning's public API; the Lightning privates it touches are functions of
:mod:`lightning_per.lightning_compat` (pinned by tests/cli/test_lightning_compat.py):

- :func:`keep_buffers_per_rank`: the kwargs Lightning passes to DDP (``lightning_compat.ddp_kwargs``);
- :func:`write_shards_with_checkpoints`: the strategy's public ``save_checkpoint``/``remove_checkpoint``
  wrapped on the instance;
- :func:`bound_sigterm_broadcast`: the epoch loop's SIGTERM broadcast (``lightning_compat.wrap_sigterm_broadcast``);
- :func:`bypass_ddp_reducer`: DDP's public ``require_backward_grad_sync`` flag.

docs/ddp.md describes the behaviour; tests/dqn/test_ddp_cpu.py runs it on two gloo ranks.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.strategies import DDPStrategy
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset, DistributedSampler

from lightning_per.integrity import IntegrityError, load_torch_file, save_torch_file
from lightning_per.lightning_compat import ddp_kwargs, wrap_sigterm_broadcast

if TYPE_CHECKING:
    from lightning_per.dqn.module import DQN

__all__ = ["SHARD_KIND", "WholeEpochPerRank", "all_reduce_mean_grads_", "all_ranks_reached", "bound_sigterm_broadcast",
           "bypass_ddp_reducer", "graph_backward", "keep_buffers_per_rank", "load_replay_shard", "replay_shard_path",
           "prune_replay_shards", "setup_ddp", "write_shards_with_checkpoints"]

#: The manifest kind of a DDP rank's replay shard.
SHARD_KIND = "replay_shard"

_SHARDS_MARK = "_lightning_per_shards"  # set on a strategy whose checkpoint hooks write the shards
_GENERATION = re.compile(r"[A-Za-z0-9_-]{1,96}")


def replay_shard_path(ckpt_path: str | os.PathLike[str], rank: int, generation: str) -> str:
    """Where global rank ``rank`` keeps its replay shard (and per-rank state) of the DDP checkpoint ``ckpt_path``
    saved as ``generation`` (with its manifest ``<shard>.manifest.json``, :mod:`lightning_per.integrity`).

    The generation is in the name, so a rank's shard of the previous save stays until the checkpoint of the
    new save is complete: a crash between the shards and the checkpoint leaves the previous set whole.

    Raises:
        IntegrityError: ``generation`` is not a plain id (letters, digits, ``-``, ``_``; it comes from a
            checkpoint and becomes part of a file name).
    """
    if not isinstance(generation, str) or not _GENERATION.fullmatch(generation):
        raise IntegrityError(f"{os.fspath(ckpt_path)}: its generation id {generation!r} is not a plain id "
                             f"(letters, digits, '-', '_'; at most 96 characters)")
    return f"{os.fspath(ckpt_path)}.rank{rank}.{generation}.replay.pt"


def prune_replay_shards(ckpt_path: str | os.PathLike[str], rank: int | None = None,
                        keep: Iterable[str] = ()) -> list[Path]:
    """Remove the shard files of the checkpoint ``ckpt_path`` (of global rank ``rank``, or of every rank), their
    manifests and the temporary files of interrupted shard saves, except those of the generations in ``keep``;
    returns what was removed."""
    ckpt = Path(ckpt_path)
    if not ckpt.parent.is_dir():
        return []
    ranks = r"\d+" if rank is None else str(int(rank))
    pattern = re.compile(rf"^\.?{re.escape(ckpt.name)}\.rank{ranks}\.([A-Za-z0-9_-]+)\.replay\.pt"
                         rf"(?:\.manifest\.json)?(?:\.[A-Za-z0-9_]{{8}}\.tmp)?$")
    keep, removed = set(keep), []
    for path in sorted(ckpt.parent.iterdir()):
        match = pattern.match(path.name)
        if match and match.group(1) not in keep and (path.name.startswith(".") == path.name.endswith(".tmp")):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            removed.append(path)
    return removed


def load_replay_shard(ckpt_path: str | os.PathLike[str], rank: int, state: dict[str, Any]) -> dict[str, Any]:
    """Global rank ``rank``'s shard of the DDP checkpoint at ``ckpt_path`` whose ``dqn_state`` is ``state``,
    verified against its manifest, loaded with ``weights_only=True``, and of the same save as the checkpoint
    (the same generation id, in its name and in its content).

    Raises:
        FileNotFoundError: the shard is missing. IntegrityError: damaged, truncated, or from another save.
    """
    path = replay_shard_path(ckpt_path, rank, state.get("generation"))
    shard, _ = load_torch_file(path, SHARD_KIND)
    if not isinstance(shard, dict) or shard.get("generation") != state.get("generation"):
        got = shard.get("generation") if isinstance(shard, dict) else None
        raise IntegrityError(f"{path}: from another save than {os.fspath(ckpt_path)} (shard generation {got!r}, "
                             f"checkpoint {state.get('generation')!r}); resume from a complete checkpoint")
    return shard


class WholeEpochPerRank(DistributedSampler):
    """``0 .. n-1`` in order on *every* rank. Being a ``DistributedSampler``, Lightning does not replace it
    with one that splits the indices across ranks: under DDP each rank runs ``updates_per_epoch`` updates
    an epoch (equal counts on every rank; the global batch is ``world_size * batch_size``)."""

    def __init__(self, dataset: Dataset) -> None:
        super().__init__(dataset, num_replicas=1, rank=0, shuffle=False)


def setup_ddp(module: DQN) -> None:
    """Per-rank runtime under DDP (``module.setup`` with ``world_size > 1``, before Lightning wraps the module).

    - The episode ring is a registered buffer (checkpointed) but per rank: :func:`keep_buffers_per_rank`.
    - Every rank writes its own state (replay shard, collector, RNG) next to each checkpoint
      (:func:`write_shards_with_checkpoints`); one generation id per save on every rank (rank 0's).
    - Lightning's per-step SIGTERM broadcast runs every ``sigterm_check_interval`` steps only
      (:func:`bound_sigterm_broadcast`).
    - Graph mode (``compile=True``) needs a DDP strategy: it averages the gradients itself inside the
      captured update (:func:`bypass_ddp_reducer`), which other strategies (FSDP, ...) would break.

    Raises:
        ValueError: ``compile=True`` with a strategy that is not DDP.
    """
    h, strategy = module.hparams, module.trainer.strategy
    if h.compile and not isinstance(strategy, DDPStrategy):
        raise ValueError(f"compile=True with world_size > 1 supports DDP strategies only (strategy='ddp'), "
                         f"got {type(strategy).__name__}. Set model.compile=false or use strategy='ddp'.")
    if isinstance(strategy, DDPStrategy):
        keep_buffers_per_rank(strategy)
    module._run_id = strategy.broadcast(module._run_id, src=0)
    write_shards_with_checkpoints(strategy, module)
    every = h.sigterm_check_interval or h.updates_per_epoch // h.updates_per_step
    bound_sigterm_broadcast(module.trainer.fit_loop.epoch_loop, every)


def keep_buffers_per_rank(strategy: DDPStrategy) -> None:
    """DDP's default ``broadcast_buffers=True`` would overwrite every rank's registered buffers (the episode
    ring) with rank 0's at every step (a broadcast per step, too): turn it off, unless the strategy was
    given that argument explicitly."""
    ddp_kwargs(strategy).setdefault("broadcast_buffers", False)


def write_shards_with_checkpoints(strategy, module: DQN) -> None:
    """Make ``strategy`` write every rank's ``module._shard_state`` (set by ``on_save_checkpoint`` under DDP)
    to :func:`replay_shard_path` before the checkpoint itself, and remove the shards with the checkpoint.

    ``strategy.save_checkpoint`` runs on every rank (only rank 0 writes the checkpoint file), so each rank
    writes its own shard there. Done once per strategy (a second ``fit`` with the same Trainer keeps it)."""
    if getattr(strategy, _SHARDS_MARK, False):
        return
    # the strategy's bound methods, replaced on this instance (the class and other strategies are unchanged):
    # Lightning has no hook that runs on every rank at each save with the checkpoint's path
    save, remove = strategy.save_checkpoint, strategy.remove_checkpoint

    written: dict[str, str] = {}  # checkpoint path -> the generation of this rank's last shard written there

    def save_checkpoint(checkpoint: dict[str, Any], filepath, storage_options=None) -> None:
        if module._shard_state is not None and "dqn_state" in checkpoint:
            shard, rank = module._shard_state, module.global_rank
            path = replay_shard_path(filepath, rank, shard["generation"])
            save_torch_file(shard, path, SHARD_KIND, shard["generation"], {"rank": rank, "updates": shard["updates"]})
            module._shard_state = None
            # keep the shard of this rank's previous save (its checkpoint is complete: Lightning's save ends in a
            # barrier of every rank after rank 0 wrote it) until this save's checkpoint is; remove older ones
            previous = written.get(os.fspath(filepath))
            written[os.fspath(filepath)] = shard["generation"]
            if previous is not None:
                prune_replay_shards(filepath, rank, keep=(previous, shard["generation"]))
        save(checkpoint, filepath, storage_options=storage_options)

    def remove_checkpoint(filepath) -> None:
        remove(filepath)
        if strategy.is_global_zero:
            prune_replay_shards(filepath)

    strategy.save_checkpoint, strategy.remove_checkpoint = save_checkpoint, remove_checkpoint
    setattr(strategy, _SHARDS_MARK, True)


def bound_sigterm_broadcast(loop, every: int) -> None:
    """Run Lightning's per-step SIGTERM broadcast (a host sync: a copy, a broadcast and an ``.item()``) only
    every ``every`` steps of the training epoch loop ``loop`` (1: every step, Lightning's behaviour). Every
    rank calls it once per step, so all ranks broadcast on the same steps; a SIGTERM is acted on up to
    ``every`` steps late. Skipped when Lightning has no such method (then its own behaviour stays)."""
    if every == 1:
        return

    def bounded_by(original: Callable[[], None]) -> Callable[[], None]:
        calls = [0]

        def bounded() -> None:
            if calls[0] % every == 0:
                original()
            calls[0] += 1

        return bounded

    wrap_sigterm_broadcast(loop, bounded_by)


def bypass_ddp_reducer(model: nn.Module) -> None:
    """Graph mode under DDP: keep DDP's reducer out of the captured update (we average gradients ourselves).

    DDP reduces gradients from autograd hooks on the parameters, once ``reducer.prepare_for_backward``
    armed them (DDP's forward does when ``require_backward_grad_sync`` is True; Lightning's
    ``manual_backward`` does too). That reduction is driven from the host bucket by bucket: it does not
    belong in a capture, and graph replays run no autograd hooks, so later steps would not be reduced at
    all. Graph mode therefore never calls ``manual_backward``, and this clears the flag before the first
    training step, which runs the eager warm-up and the capture: DDP's forward then leaves the reducer
    unarmed and its hooks return without reducing. (In manual optimization Lightning's DDP forward
    redirection also clears the flag before DDP's post-forward at every step, and sets it True after it;
    neither arms the reducer.) :func:`graph_backward` averages the gradients inside the graph instead.

    Args:
        model: the strategy's wrapped model (``trainer.strategy.model``); anything but DDP is left alone.
    """
    if isinstance(model, DistributedDataParallel):
        # the flag DDP's no_sync() toggles; set directly because the captured update outlives any context
        model.require_backward_grad_sync = False


def graph_backward(params: Callable[[], Iterable[Tensor]], world_size: int) -> Callable[[Tensor], None] | None:
    """The ``backward`` of a captured update: ``loss.backward()`` then :func:`all_reduce_mean_grads_` of
    ``params()`` over ``world_size`` ranks (no host read: it is captured; NCCL >= 2.9.6 collectives are),
    or None on one rank (the default ``loss.backward()``)."""
    if world_size <= 1:
        return None

    def backward_all_reduce(loss: Tensor) -> None:
        loss.backward()
        all_reduce_mean_grads_(params(), world_size)

    return backward_all_reduce


def all_reduce_mean_grads_(params: Iterable[Tensor], world_size: int, group=None) -> None:
    """Average the gradients of ``params`` over the ranks of ``group`` in place, as one flat buffer.

    One ``torch.distributed.all_reduce`` (SUM) of the concatenated gradients, a division by
    ``world_size``, and a copy back: no host read and no branch on tensor values, so it can run inside a
    CUDA graph (NCCL collectives are capturable from NCCL 2.9.6). Every rank must call it with the same
    parameters in the same order (same shapes; parameters without a gradient are skipped).

    Args:
        params: the parameters whose ``.grad`` is averaged (e.g. ``q_net.parameters()``).
        world_size: the number of ranks in ``group`` (the divisor).
        group: the process group (None: the default group, e.g. the one Lightning created).
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])  # [sum of numels], a new buffer
    torch.distributed.all_reduce(flat, group=group)
    flat.div_(world_size)
    parts = flat.split([g.numel() for g in grads])
    torch._foreach_copy_(grads, [part.view_as(g) for part, g in zip(parts, grads)])


def all_ranks_reached(strategy, mean: float | None, count: int, target: float, world_size: int,
                      device: torch.device) -> tuple[bool, float]:
    """Whether the run reached ``target_return`` on every rank's behalf: the mean over ranks of each rank's
    last-20 mean ``mean`` once every rank has 20 episodes (``count``); every rank takes the same decision (a
    rank that stops alone hangs the others). One all-reduce of two float64 numbers and one host read, at an
    epoch end. Returns ``(solved, mean over ranks)``."""
    ok = mean is not None and count >= 20
    local = torch.tensor([mean if ok else 0.0, float(ok)], dtype=torch.float64, device=device)
    total = strategy.reduce(local, reduce_op="sum").tolist()  # sync-ok: once an epoch, the stop decision
    return total[1] == world_size and total[0] / world_size >= target, total[0] / world_size
