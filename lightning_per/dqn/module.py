"""The DQN LightningModule: prioritized replay on the learner's device, no host sync per step.

One training step = collect ``1 / replay_ratio`` env steps (on average) -> extend the buffer ->
sample -> double-DQN n-step target -> IS-weighted Huber loss -> backward -> clip -> Adam step ->
priority update -> target-network update -> in-place metric accumulation. An epoch is
``updates_per_epoch`` such steps, fed by a *sized* dataset of step indices (an unsized iterable
would make Lightning prefetch, i.e. sample from stale priorities).

Graph mode (``compile=True``): the update captured once in a CUDA graph
(:class:`~lightning_per.graphs.CapturedUpdate`) and replayed; scopes, blocks and DDP in docs/dqn.md.
"""

from __future__ import annotations

import copy
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from lightning_per import make_replay_buffer
from lightning_per.callbacks.checkpoint_io import GENERATION_KEY
from lightning_per.dqn.collector import NStepCollector
from lightning_per.dqn.compiled import INDUCTOR_MODES, CompiledStep, InductorUpdate, no_recompiles
from lightning_per.dqn.config import ReplayConfig, check_range
from lightning_per.dqn.learner import (
    MetricSlots,
    SideStream,
    all_reduce_mean_grads_,
    finish_update_,
    learner_step,
    pipelined_updates,
)
from lightning_per.dqn.networks import make_q_network
from lightning_per.dqn.targets import hard_update, linear_schedule
from lightning_per.envs import EnvConfig, make_env
from lightning_per.graphs import CapturedUpdate, count_optimizer_step
from lightning_per.integrity import IntegrityError, load_torch_file, new_generation, save_torch_file
from lightning_per.metrics.accumulator import MetricAccumulator
from lightning_per.metrics.episodes import (
    new_episode_log,
    new_episode_ring,
    push_episode_log,
    push_episode_returns,
    recent_mean_return,
)
from lightning_per.replay.buffer import _checked_state

__all__ = ["DQN", "StepIndices", "replay_shard_path"]

_STATE_VERSION = 1
_RING = 100  # episode returns kept for RunArtifactsCallback (it reads the last 20)
_EPISODE_LOG = 4096  # per-episode rows (env steps, time, return) kept between two epoch-end reads
_METRICS = {"loss": "mean", "td_abs_mean": "mean", "td_abs_max": "max", "q_mean": "mean",
            "is_weight_mean": "mean", "episode_return": "mean", "episode_length": "mean",
            "env_steps": "last", "updates": "last", "clamped_priorities": "last", "epsilon": "last",
            "beta": "last"}


class StepIndices(Dataset):
    """A sized dataset ``0 .. n-1``: one item per gradient update of an epoch."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def replay_shard_path(ckpt_path: str | os.PathLike[str], rank: int) -> str:
    """Where global rank ``rank`` keeps its replay shard (and per-rank state) of a DDP checkpoint (with its
    manifest ``<shard>.manifest.json``, :mod:`lightning_per.integrity`)."""
    return f"{os.fspath(ckpt_path)}.rank{rank}.replay.pt"


#: The manifest kind of a DDP rank's replay shard.
SHARD_KIND = "replay_shard"


def load_replay_shard(ckpt_path: str | os.PathLike[str], rank: int, state: dict[str, Any]) -> dict[str, Any]:
    """Global rank ``rank``'s shard of the DDP checkpoint at ``ckpt_path`` whose ``dqn_state`` is ``state``,
    verified against its manifest, loaded with ``weights_only=True``, and of the same save as the checkpoint
    (the same generation id: a save interrupted between the shards and the checkpoint leaves them apart).

    Raises:
        FileNotFoundError: the shard is missing. IntegrityError: damaged, truncated, or from another save.
    """
    path = replay_shard_path(ckpt_path, rank)
    shard, _ = load_torch_file(path, SHARD_KIND)
    if not isinstance(shard, dict) or shard.get("generation") != state.get("generation"):
        got = shard.get("generation") if isinstance(shard, dict) else None
        raise IntegrityError(f"{path}: from another save than {os.fspath(ckpt_path)} (shard generation {got!r}, "
                             f"checkpoint {state.get('generation')!r}: a save was interrupted between them); "
                             f"resume from a complete checkpoint")
    return shard


class _WholeEpochPerRank(DistributedSampler):
    """``0 .. n-1`` in order on *every* rank. Being a ``DistributedSampler``, Lightning does not replace it
    with one that splits the indices across ranks: under DDP each rank runs ``updates_per_epoch`` updates
    an epoch (equal counts on every rank; the global batch is ``world_size * batch_size``)."""

    def __init__(self, dataset: Dataset) -> None:
        super().__init__(dataset, num_replicas=1, rank=0, shuffle=False)


class DQN(LightningModule):
    """Deep Q-learning with prioritized replay on the learner's device.

    DQN (Mnih et al. 2015) with double-DQN targets (van Hasselt et al. 2016, arXiv:1509.06461), n-step
    returns, a dueling head option (Wang et al. 2016, arXiv:1511.06581) and prioritized replay (Schaul
    et al. 2016, arXiv:1511.05952) kept on the learner's device.

    Args:
        env: environment (see :class:`lightning_per.envs.EnvConfig`).
        replay: replay buffer and IS-exponent schedule (see :class:`lightning_per.dqn.ReplayConfig`).
        network: ``mlp`` for state vectors, ``nature_cnn`` for stacked frames (Mnih et al. 2015).
        hidden_sizes: MLP widths (for ``nature_cnn``, the last one is the fully connected width).
        dueling: dueling head ``Q = V + A - mean A``.
        gamma: discount factor in [0, 1].
        n_step: return horizon n >= 1 (targets bootstrap after n steps).
        double_dqn: choose the bootstrap action with the online network (double DQN).
        lr: Adam learning rate.
        adam_eps: Adam epsilon.
        huber_delta: Huber loss threshold (1 = error clipping of Mnih et al.).
        grad_clip_norm: clip the global gradient L2 norm to this value; None disables.
        target_update_interval: hard copy online -> target every this many updates (``target_tau`` None).
        target_tau: Polyak factor tau in (0, 1]: ``target <- (1-tau) target + tau online`` every update.
        epsilon_start: exploration probability at env step 0.
        epsilon_end: exploration probability after ``epsilon_decay_steps`` env steps.
        epsilon_decay_steps: env steps of the linear epsilon decay.
        warmup_steps: env steps with uniformly random actions before the first update.
        replay_ratio: gradient updates per env step (0.25 = one update per 4 env steps).
        updates_per_epoch: gradient updates per Lightning epoch (metrics are logged once per epoch).
        updates_per_step: gradient updates per Lightning training step (a divisor of
            ``updates_per_epoch``): amortises Lightning's per-step host work; env collection still
            interleaves per update at ``replay_ratio``; ``trainer.global_step`` counts updates.
        updates_per_graph: graph mode with our proportional sampler on CUDA: consecutive updates captured
            in one CUDA graph (a divisor of ``updates_per_step``); beta is annealed once per block and a
            hard target copy due inside a block runs after it (docs/dqn.md, "Graph mode").
        overlap_replay: graph mode: each update's priority update and the next update's draw run on a
            second stream, concurrent with its backward and optimizer step (same draws and priorities as
            one stream); False keeps them on the update's stream.
        max_env_steps: stop training once this many env steps were taken (None: no limit).
        target_return: stop at an epoch end once the mean return of the last 20 episodes reaches
            this value (None: never); one host read per epoch.
        seed: seeds the envs, the exploration RNG and the replay RNG (rank r adds 1000 r).
        compile: capture the learner update in a CUDA graph (CUDA only; docs/dqn.md); under DDP
            (``strategy="ddp"``, NCCL) the captured update all-reduces the gradients itself (docs/ddp.md).
        inductor: run the update's pure-tensor parts through ``torch.compile`` (``dqn/compiled.py``; with
            ``compile=True`` the Adam step too). CUDA or CPU (needs a C++ compiler); compiles at the first
            update; the same math up to float rounding (docs/dqn.md, "Inductor").
        inductor_mode: ``default`` or ``max-autotune-no-cudagraphs`` (every GEMM shape autotuned at the
            first update, which takes minutes).
        checkpoint_replay: put the replay buffer (storage + sampler) in checkpoints, so a resumed
            run draws the same samples; False keeps checkpoints small (resume warms up again).
            Under DDP each rank writes its own shard next to the checkpoint (see docs/ddp.md).
        sigterm_check_interval: under DDP, run Lightning's per-step SIGTERM broadcast (a host sync) only
            every this many steps (0: once per epoch, at its first step; 1: Lightning's default).

    Raises:
        ValueError: any argument out of range, naming it.

    Example::

        >>> from lightning.pytorch import Trainer
        >>> from lightning_per.dqn import DQN, ReplayConfig
        >>> from lightning_per.envs import EnvConfig
        >>> model = DQN(env=EnvConfig(backend="torch", num_envs=4), replay=ReplayConfig(capacity=256, batch_size=16),
        ...             hidden_sizes=[32], warmup_steps=32, updates_per_epoch=8, seed=0)
        >>> trainer = Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
        ...                   enable_progress_bar=False, enable_model_summary=False)
        >>> trainer.fit(model)
        >>> trainer.global_step, model.env_steps  # 2 x 8 updates; 32 warm-up + 16 / replay_ratio env steps
        (16, 96)
    """

    def __init__(self, env: EnvConfig | None = None, replay: ReplayConfig | None = None,
                 network: Literal["mlp", "nature_cnn"] = "mlp", hidden_sizes: Sequence[int] = (256, 256),
                 dueling: bool = False, gamma: float = 0.99, n_step: int = 3, double_dqn: bool = True,
                 lr: float = 5e-4, adam_eps: float = 1e-8, huber_delta: float = 1.0,
                 grad_clip_norm: float | None = 10.0, target_update_interval: int = 500,
                 target_tau: float | None = None, epsilon_start: float = 1.0, epsilon_end: float = 0.01,
                 epsilon_decay_steps: int = 10_000, warmup_steps: int = 1_000, replay_ratio: float = 0.25,
                 updates_per_epoch: int = 500, updates_per_step: int = 1, updates_per_graph: int = 1,
                 overlap_replay: bool = True, max_env_steps: int | None = None,
                 target_return: float | None = None, seed: int = 0, compile: bool = False,
                 inductor: bool = False, inductor_mode: Literal["default", "max-autotune-no-cudagraphs"] = "default",
                 checkpoint_replay: bool = True, sigterm_check_interval: int = 0) -> None:
        super().__init__()
        env = EnvConfig(**env) if isinstance(env, dict) else (env or EnvConfig())
        replay = ReplayConfig(**replay) if isinstance(replay, dict) else (replay or ReplayConfig())
        env.validate()
        replay.validate()
        _validate(locals())
        self.save_hyperparameters(ignore=["env", "replay"])
        self.hparams["env"], self.hparams["replay"] = asdict(env), asdict(replay)
        self.env_config, self.replay_config = env, replay
        self.automatic_optimization = False

        obs_shape, self.n_actions = _probe_env(env)
        if replay.frame_dedup and len(obs_shape) < 2:
            raise ValueError(f"replay.frame_dedup needs stacked frames (frame_stack, *frame) as observations, "
                             f"got observation shape {tuple(obs_shape)}")
        self._frame_stack = int(obs_shape[0]) if replay.frame_dedup else None
        self.q_net = make_q_network(network, obs_shape, self.n_actions, list(hidden_sizes), dueling)
        self.target_net = copy.deepcopy(self.q_net).requires_grad_(False)
        # the same Parameter objects for the whole run (.to() moves their data in place)
        self._params = (list(self.target_net.parameters()), list(self.q_net.parameters()))
        self.metrics = MetricAccumulator(_METRICS, persistent=("env_steps", "updates"))
        ring, count = new_episode_ring(_RING)  # (100,) float32 NaN / () int64, see callbacks.episodes
        self.register_buffer("episode_returns_ring", ring)
        self.register_buffer("episode_returns_count", count)
        # the learning curves' per-episode series (callbacks.episodes), read once an epoch; not checkpointed
        log, log_count = new_episode_log(max(_EPISODE_LOG, 2 * env.num_envs))
        self.register_buffer("episode_log", log, persistent=False)
        self.register_buffer("episode_log_count", log_count, persistent=False)
        self.collector: NStepCollector | None = None
        self.rb = None
        self._replay_rng: torch.Generator | None = None
        self._captured: CapturedUpdate | None = None
        self.graph_captures = 0  # CUDA-graph captures of the update (graph mode); one per fit
        self._inductor: InductorUpdate | None = None  # built with the runtime when ``inductor=True``
        self._compiled_step: CompiledStep | None = None  # graph mode + inductor: the compiled Adam step
        self._side: SideStream | None = None  # graph mode, scope "full": priority updates and next draws
        self._metric_slots: MetricSlots | None = None
        self._grad_world_size = 1  # > 1: graph mode under DDP all-reduces the gradients itself
        self._pending_state: dict[str, Any] | None = None
        self._shard_state: dict[str, Any] | None = None  # this rank's state, written next to a DDP checkpoint
        self.fit_started = False  # on_train_start ran: a failure before is a bad setting (the CLI's one-line error)
        self._host_recorded = False  # host counters recorded in the current step
        self.env_steps = 0  # host counters: deterministic, never read from the device
        self.updates = 0
        self._credit = 0.0
        self._epsilon: float | None = None  # exploration probability of the last collection (host)

    # ------------------------------------------------------------------ setup
    def setup(self, stage: str) -> None:
        if self.collector is not None:
            return
        device = self.trainer.strategy.root_device if self._trainer is not None else self.device
        if self.hparams.compile and device.type != "cuda":
            raise ValueError(f"compile=True captures the update in a CUDA graph and needs a CUDA device; "
                             f"this run is on {device}. Set model.compile=false (or use a GPU).")
        self._run_id = new_generation()
        if self._trainer is not None and self.trainer.world_size > 1:
            self._setup_ddp()
        self.build_runtime(device)
        if self.hparams.updates_per_graph > 1 and not (self.hparams.compile and self._graph_scope() == "full"):
            raise ValueError(f"updates_per_graph={self.hparams.updates_per_graph} needs graph mode with the "
                             f"whole update captured: compile=True and replay.sampler='proportional' on CUDA "
                             f"(got compile={self.hparams.compile}, sampler={self.replay_config.sampler!r}, "
                             f"device {device}); use updates_per_graph=1")

    def _setup_ddp(self) -> None:
        """Per-rank runtime under DDP (called from :meth:`setup`, before Lightning wraps the module).

        - The episode ring is a registered buffer (checkpointed) but per rank: DDP's default
          ``broadcast_buffers=True`` would overwrite it with rank 0's copy at every step (a broadcast
          per step, too), so it is turned off unless the strategy was given that argument explicitly.
        - Every rank writes its own state (replay shard, collector, RNG) next to each checkpoint:
          ``strategy.save_checkpoint`` runs on every rank (only rank 0 writes the checkpoint itself).
        - Lightning's per-step SIGTERM broadcast is bounded to every ``sigterm_check_interval`` steps.
        - Graph mode (``compile=True``) needs a DDP strategy: it averages the gradients itself inside the
          captured update (see :meth:`_bypass_ddp_reducer`), which other strategies (FSDP, ...) would break.
        """
        h, strategy = self.hparams, self.trainer.strategy
        if h.compile and not isinstance(strategy, DDPStrategy):
            raise ValueError(f"compile=True with world_size > 1 supports DDP strategies only (strategy='ddp'), "
                             f"got {type(strategy).__name__}. Set model.compile=false or use strategy='ddp'.")
        if isinstance(strategy, DDPStrategy):
            strategy._ddp_kwargs.setdefault("broadcast_buffers", False)
        self._run_id = strategy.broadcast(self._run_id, src=0)  # one generation id per save on every rank
        if not getattr(strategy, "_lightning_per_shards", False):
            save, remove = strategy.save_checkpoint, strategy.remove_checkpoint

            def save_checkpoint(checkpoint: dict[str, Any], filepath, storage_options=None) -> None:
                if self._shard_state is not None and "dqn_state" in checkpoint:
                    shard = self._shard_state
                    save_torch_file(shard, replay_shard_path(filepath, self.global_rank), SHARD_KIND,
                                    shard["generation"], {"rank": self.global_rank, "updates": shard["updates"]})
                    self._shard_state = None
                save(checkpoint, filepath, storage_options=storage_options)

            def remove_checkpoint(filepath) -> None:
                remove(filepath)
                if strategy.is_global_zero:
                    for r in range(self.trainer.world_size):
                        for path in (replay_shard_path(filepath, r), f"{replay_shard_path(filepath, r)}.manifest.json"):
                            try:
                                os.remove(path)
                            except (FileNotFoundError, TypeError):
                                pass

            strategy.save_checkpoint, strategy.remove_checkpoint = save_checkpoint, remove_checkpoint
            strategy._lightning_per_shards = True
        self._bound_sigterm_broadcast()

    def _bound_sigterm_broadcast(self) -> None:
        every = self.hparams.sigterm_check_interval or self._steps_per_epoch
        loop = self.trainer.fit_loop.epoch_loop
        original = getattr(type(loop), "_broadcast_sigterm_tensor", None)
        if every == 1 or original is None or "_broadcast_sigterm_tensor" in vars(loop):
            return
        calls = [0]  # every rank calls it once per step, so all ranks broadcast on the same steps

        def bounded() -> None:
            if calls[0] % every == 0:
                original(loop)
            calls[0] += 1

        loop._broadcast_sigterm_tensor = bounded

    def build_runtime(self, device: torch.device | str) -> None:
        """Create the env, collector, replay buffer and device-side metrics on ``device``."""
        device = torch.device(device)
        seed = self.hparams.seed + 1000 * self.global_rank
        env_device = device if self.env_config.backend == "torch" else torch.device("cpu")
        env = make_env(self.env_config, env_device, seed=seed)
        self.collector = NStepCollector(env, self.hparams.n_step, self.hparams.gamma, self.n_actions, device,
                                        seed=seed + 1)
        self._replay_rng = torch.Generator()  # the buffer derives its device generator from this one
        self._replay_rng.manual_seed(seed + 2)
        r = self.replay_config
        # a full-batch loss does not see the batch order: strata in order (the kernels draw their own uniforms)
        extra = {} if r.sampler == "uniform" else {"weight_normalization": r.weight_normalization,
                                                   "shuffle_strata": False}
        self.rb = make_replay_buffer(r.capacity, r.batch_size, sampler=r.sampler, device=device,
                                     alpha=r.alpha, beta=r.beta, eps=r.eps, generator=self._replay_rng,
                                     packed=r.packed, frame_stack=self._frame_stack, **extra)
        self.metrics.to(device)
        self._metric_slots = MetricSlots.of(list(_METRICS), device)
        if self.hparams.inductor:
            h = self.hparams
            self._inductor = InductorUpdate(self.q_net, self.target_net, double_dqn=h.double_dqn,
                                            huber_delta=h.huber_delta, grad_clip_norm=h.grad_clip_norm,
                                            slots=self._metric_slots, target_tau=h.target_tau,
                                            mode=h.inductor_mode)
        if self._pending_state is not None:
            self._load_dqn_state(self._pending_state)
            self._pending_state = None

    def train_dataloader(self) -> DataLoader:
        steps = StepIndices(self._steps_per_epoch)
        return DataLoader(steps, batch_size=None, sampler=_WholeEpochPerRank(steps))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # fused: one kernel for all parameters (CPU and CUDA); capturable: step counters on the device.
        # Graph mode with inductor=True compiles the step instead (see dqn/compiled.py, CompiledStep):
        # that needs the foreach implementation, which torch.compile traces.
        h = self.hparams
        compiled_step = bool(h.inductor and h.compile)
        return torch.optim.Adam(self.q_net.parameters(), lr=h.lr, eps=h.adam_eps, fused=not compiled_step,
                                foreach=True if compiled_step else None, capturable=bool(h.compile))

    def forward(self, observation: Tensor) -> Tensor:
        """Action values ``(B, A) float32`` of ``observation (B, *obs_shape)`` (online network)."""
        return self.q_net(observation)

    def _bypass_ddp_reducer(self) -> None:
        """Graph mode under DDP: keep DDP's reducer out of the captured update; we average gradients ourselves.

        DDP reduces gradients from autograd hooks on the parameters, once ``reducer.prepare_for_backward``
        armed them (DDP's forward does when ``require_backward_grad_sync`` is True; Lightning's
        ``manual_backward`` does too). That reduction is driven from the host bucket by bucket: it does
        not belong in a capture, and graph replays run no autograd hooks, so later steps would not be
        reduced at all. Graph mode therefore never calls ``manual_backward``, and this sets
        ``require_backward_grad_sync = False`` (the flag DDP's ``no_sync()`` toggles) before the first
        training step, which runs the eager warm-up and the capture: DDP's forward then leaves the reducer
        unarmed and its hooks return without reducing. (In manual optimization Lightning's DDP forward
        redirection also clears the flag before DDP's post-forward at every step, and sets it True after
        it; neither arms the reducer.) :meth:`_backward_all_reduce`, the ``backward`` of the captured
        update, averages the gradients inside the graph instead.
        """
        model = self.trainer.strategy.model
        if isinstance(model, DistributedDataParallel):
            model.require_backward_grad_sync = False
        self._grad_world_size = self.trainer.world_size

    def _backward_all_reduce(self, loss: Tensor) -> None:
        """Graph mode under DDP: back-propagate, then average ``q_net``'s gradients over the ranks (one
        all-reduce of one flat buffer, no host read: it is captured; NCCL >= 2.9.6 collectives are)."""
        loss.backward()
        all_reduce_mean_grads_(self.q_net.parameters(), self._grad_world_size)

    def _graph_backward(self):
        """The ``backward`` of a captured update: ours with the gradient all-reduce under DDP, else the
        default ``loss.backward()`` (single device: unchanged)."""
        return self._backward_all_reduce if self._grad_world_size > 1 else None

    # ------------------------------------------------------------------ collection
    def on_train_start(self) -> None:
        self.fit_started = True
        if self.hparams.compile and self._trainer is not None and self.trainer.world_size > 1:
            self._bypass_ddp_reducer()  # before the first training_step, which captures the update
        batch = self.replay_config.batch_size
        while self.env_steps < self.hparams.warmup_steps or len(self.rb) < batch:
            self._collect(random=True)

    def _collect(self, random: bool = False) -> None:
        """One vector step: ``num_envs`` env steps into the buffer, episode stats into the metrics."""
        h = self.hparams
        eps = 1.0 if random else linear_schedule(h.epsilon_start, h.epsilon_end, h.epsilon_decay_steps,
                                                 self.env_steps)
        out = self.collector.step(None if random else self.q_net, eps)
        self.env_steps += self.collector.num_envs
        if out.transitions is not None:
            self.rb.extend(out.transitions)
        n_done = out.done.sum()
        self.metrics.add("episode_return", out.episode_return.sum(), count=n_done)
        self.metrics.add("episode_length", out.episode_length.sum(), count=n_done)
        self._epsilon = eps
        ring, count = self.episode_returns_ring, self.episode_returns_count
        push_episode_returns(ring, count, out.episode_return.to(ring.device), out.done.to(ring.device))
        push_episode_log(self.episode_log, self.episode_log_count, out.episode_return.to(ring.device),
                         out.done.to(ring.device), env_steps=self.env_steps, time_s=time.monotonic())

    # ------------------------------------------------------------------ learning
    def _learner_step(self, b: dict[str, Tensor], backward=None, optimizer=None,
                      after_forward=None) -> dict[str, Tensor]:
        """:func:`~lightning_per.dqn.learner.learner_step` with this module's networks and settings."""
        h, fast = self.hparams, self._inductor
        clip = None if getattr(optimizer, "clips", False) else h.grad_clip_norm  # the compiled step clips itself
        return learner_step(self.q_net, self.target_net, optimizer, b, double_dqn=h.double_dqn,
                            huber_delta=h.huber_delta, grad_clip_norm=clip, backward=backward,
                            loss_fn=None if fast is None else fast.loss, clip_fn=None if fast is None else fast.clip,
                            after_forward=after_forward)

    @property
    def _steps_per_epoch(self) -> int:
        return self.hparams.updates_per_epoch // self.hparams.updates_per_step

    def training_step(self, step: int, batch_idx: int) -> Tensor:
        per_block = self.hparams.updates_per_graph
        for _ in range(self.hparams.updates_per_step // per_block):
            loss = self._update_block(per_block)
            if self._stopping():
                break
        self._host_recorded = batch_idx == self._steps_per_epoch - 1 or self._stopping()
        if self._host_recorded:
            self._record_host_metrics()
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        # A stop decided after the step (Lightning's Timer for max_time runs before this hook) ends the
        # epoch early: record the host counters now, so the last epoch's row is current.
        if self._trainer is not None and self.trainer.should_stop and not self._host_recorded:
            self._record_host_metrics()
            self._host_recorded = True

    def _stopping(self) -> bool:
        return self._trainer is not None and self._trainer.should_stop

    def _update_block(self, n: int) -> Tensor:
        """Collect the env steps owed for ``n`` updates at ``replay_ratio``, then ``n`` gradient updates
        (+ priorities, target): one graph replay in graph mode's full scope, else ``n == 1`` eager or
        learner-graph update. Returns the last update's loss ``() float32`` (on the device)."""
        self._credit += n / self.hparams.replay_ratio
        while self._credit >= self.collector.num_envs:
            self._collect()
            self._credit -= self.collector.num_envs
        r = self.replay_config
        if r.sampler != "uniform":  # this block's beta: a device scalar, read by the (captured) sampler
            self.rb.sampler.beta = linear_schedule(r.beta, r.beta_end, r.beta_anneal_updates, self.updates)
        if self.hparams.compile and self._graph_scope() == "full":
            if self._captured is None:
                self._capture_full_update(n)
            out = self._captured()  # metrics and the Polyak target update ran inside the graph
            for _ in range(n):
                count_optimizer_step(self.optimizers())
            self._after_update(out, in_graph=True, n=n)
        else:
            batch = self.rb.sample()
            out = self._update(_batch_inputs(batch, batch.get("priority_weight", None)))
            if r.sampler != "uniform":
                self.rb.update_priority(batch["index"], out["td_abs"])
            self._after_update(out, in_graph=False)
        return out["loss"]

    def _capture_full_update(self, n: int = 1) -> None:
        """Capture :meth:`_full_updates` ``(n)`` in one graph. The warm-up leaves no trace (parameters,
        optimizer state, target network, priorities, the sampler's generator and the metric sums are rolled
        back), so the first replay is the first update."""
        target, online = self._params
        self._captured = CapturedUpdate(self._full_updates(n), {}, self.optimizers().optimizer, online + target,
                                        generators=self._graph_generators(), capture_guard=self._capture_guard,
                                        state=[*self.rb.sampler.device_state(), self.metrics.values,
                                               self.metrics.counts])
        self.graph_captures += 1

    def _graph_generators(self) -> list[torch.Generator]:
        """The generators the captured update draws from: the sampler's, unless its compiled kernels draw their
        uniforms themselves (then none: no per-replay seed/offset update)."""
        sampler = self.rb.sampler
        draw_generators = getattr(sampler, "draw_generators", None)
        if draw_generators is None:  # e.g. the uniform sampler
            return [sampler.generator]
        return list(draw_generators(self.replay_config.batch_size))

    def _full_updates(self, n: int):
        """The captured body: ``n`` consecutive updates, each sample -> batch -> learner step -> priority update
        -> metrics, on the device; with ``overlap_replay`` (the default) each update's priority update and the
        next update's sample run on a second stream, concurrent with its backward and optimizer step
        (:func:`~lightning_per.dqn.learner.pipelined_updates`), else one after the other. Returns
        ``body(inputs) -> out`` (the last update's outputs; ``inputs`` is ignored: the body samples by itself)."""
        rb, batch_size = self.rb, self.replay_config.batch_size
        optimizer = self.optimizers().optimizer
        backward, stepper = self._graph_backward(), self._graph_optimizer()

        def draw():  # sample + gather: one fused op with the packed storage (the replay config's default)
            return rb.sampler.sample_gather(rb.storage, batch_size)  # ([B], {[B]}, [B])

        def learn(i: int, sample, after_forward) -> dict[str, Tensor]:
            if i:  # each update's backward starts from no gradient (as before the capture), never sums
                optimizer.zero_grad(set_to_none=True)
            _, info, batch = sample
            return self._learner_step(_batch_inputs(batch, info["priority_weight"]), backward=backward,
                                      optimizer=stepper, after_forward=after_forward)

        def write(sample, td_abs: Tensor) -> None:  # indices come from the sampler: storage=None
            rb.sampler.update_priority(sample[0], td_abs, storage=None)

        if self.hparams.overlap_replay:
            if self._side is None:
                self._side = SideStream(self.device)
            return lambda _: pipelined_updates(n, draw, learn, write, self._side, finish=self._finish_update)

        def serial(_):  # every update's replay work on the update's stream, after its step
            for i in range(n):
                sample = draw()
                out = learn(i, sample, None)
                write(sample, out["td_abs"])
                self._finish_update(out)
            return out
        return serial

    def _graph_scope(self) -> str:
        """``full`` when the sampler can be captured with the update (ours, proportional, on CUDA)."""
        gen = getattr(self.rb.sampler, "generator", None)
        on_cuda = isinstance(gen, torch.Generator) and gen.device.type == "cuda"
        return "full" if self.replay_config.sampler == "proportional" and on_cuda else "learner"

    def _update(self, b: dict[str, Tensor]) -> dict[str, Tensor]:
        opt = self.optimizers()
        if not self.hparams.compile:
            opt.zero_grad(set_to_none=True)
            return self._learner_step(b, backward=self.manual_backward, optimizer=opt)
        if self._captured is None:
            raw, backward, stepper = opt.optimizer, self._graph_backward(), self._graph_optimizer()
            self._captured = CapturedUpdate(lambda x: self._learner_step(x, backward=backward, optimizer=stepper),
                                            b, raw, list(self.q_net.parameters()), capture_guard=self._capture_guard)
            self.graph_captures += 1
        out = self._captured(b)
        count_optimizer_step(opt)
        return out

    def _after_update(self, out: dict[str, Tensor], in_graph: bool, n: int = 1) -> None:
        """Host bookkeeping after ``n`` updates (one graph replay, or one eager update); the hard target
        copy when an interval boundary was reached; the Polyak update and metrics unless the graph did them."""
        h = self.hparams
        self.updates += n
        interval = h.target_update_interval
        if h.target_tau is None and self.updates // interval > (self.updates - n) // interval:
            hard_update(*self._params)
        if not in_graph:
            self._finish_update(out)
        if h.max_env_steps is not None and self.env_steps >= h.max_env_steps:
            self.trainer.should_stop = True

    @property
    def _capture_guard(self):
        """Entered around a capture with ``inductor=True``: a recompilation there raises (see ``dqn/compiled.py``)."""
        return no_recompiles if self._inductor is not None else None

    def _graph_optimizer(self):
        """What graph mode steps: the raw optimizer, or with ``inductor=True`` its compiled step (built once)."""
        raw = self.optimizers().optimizer
        if self._inductor is None:
            return raw
        if self._compiled_step is None or self._compiled_step.optimizer is not raw:
            clip = None if self.hparams.grad_clip_norm is None else (list(self.q_net.parameters()),
                                                                     self.hparams.grad_clip_norm)
            self._compiled_step = CompiledStep(raw, clip=clip)  # clip + Adam: one compiled function
        return self._compiled_step

    def _finish_update(self, out: dict[str, Tensor]) -> None:
        """Polyak target update (``target_tau`` set) and the update's metrics, in place on the device
        (captured in graph mode, compiled with ``inductor=True``)."""
        m = self.metrics
        clamped = getattr(self.rb.sampler, "clamped_priority_count", None)
        clamped = clamped if isinstance(clamped, Tensor) else None
        if self._inductor is not None:
            self._inductor.finish(m.values, m.counts, out, clamped)
        else:
            finish_update_(m.values, m.counts, out, clamped, slots=self._metric_slots, target=self._params[0],
                           online=self._params[1], tau=self.hparams.target_tau)

    def _record_host_metrics(self) -> None:
        """Host counters and schedules, written once per epoch (their last value is what is logged)."""
        m = self.metrics
        m.add("env_steps", self.env_steps)
        m.add("updates", self.updates)
        if self._epsilon is not None:
            m.add("epsilon", self._epsilon)
        if self.replay_config.sampler != "uniform":
            m.add("beta", self.rb.sampler.beta)

    def teardown(self, stage: str) -> None:
        """End of fit (also after an exception): release the captured CUDA graph. Under DDP it holds NCCL
        collectives, and while such a graph exists ``torch.distributed.destroy_process_group`` (run at exit
        by Lightning) never returns. A later
        ``fit`` captures again (:attr:`graph_captures` counts the captures)."""
        if self._captured is not None:
            self._captured.release()
            self._captured = None

    def on_train_epoch_end(self) -> None:
        target = self.hparams.target_return
        if target is None:
            return
        ring, count = self.episode_returns_ring, self.episode_returns_count
        mean = recent_mean_return(ring, count, 20)  # one host read
        if self.trainer.world_size > 1:
            # every rank must take the same decision (a rank that stops alone hangs the others): the mean
            # over ranks of each rank's last-20 mean, once every rank has 20 episodes (one all_reduce)
            ok = mean is not None and int(count) >= 20
            local = torch.tensor([mean if ok else 0.0, float(ok)], dtype=torch.float64, device=ring.device)
            total = self.trainer.strategy.reduce(local, reduce_op="sum").tolist()
            solved = total[1] == self.trainer.world_size and total[0] / self.trainer.world_size >= target
            mean = total[0] / self.trainer.world_size
        else:
            solved = mean is not None and int(count) >= 20 and mean >= target
        if solved:
            rank_zero_info(f"target_return={target} reached (mean of the last 20 episodes) after "
                           f"{self.env_steps} env steps and {self.updates} updates: stopping.")
            self.trainer.should_stop = True

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = {
            "version": _STATE_VERSION, "env_steps": self.env_steps, "updates": self.updates,
            "credit": self._credit,
            "metrics": self.metrics.state_dict(), "torch_rng": torch.get_rng_state(),
            "collector": self.collector.state_dict() if self.collector is not None else None,
        }
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
            # _setup_ddp); the checkpoint keeps rank 0's state without the replay (load_from_checkpoint)
            self._shard_state = state
            state = {k: v for k, v in state.items() if k not in ("replay", "replay_rng")}
            state["shards"] = world_size
        checkpoint["dqn_state"] = state

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("dqn_state")
        if state is None:
            warnings.warn("checkpoint has no 'dqn_state': replay, counters and RNG start fresh", stacklevel=2)
            return
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"dqn_state version {state.get('version')!r} is not supported "
                             f"(this code reads version {_STATE_VERSION})")
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
                     global_rank: int) -> None:
        """Raise what resuming from ``checkpoint`` (read from ``ckpt_path``) would refuse part-way, before
        anything is built or written (the command line calls it before ``Trainer.fit``): another ``dqn_state``
        version, a DDP checkpoint of another world size, this rank's shard missing, damaged or from another
        save, and a replay state this model's buffer refuses (checked against a CPU buffer of the configured
        capacity: priorities are 8 bytes a slot, transitions are not allocated).

        Raises:
            FileNotFoundError, IntegrityError, TypeError, ValueError: naming the file or the part.
        """
        state = checkpoint.get("dqn_state")
        if state is None:
            return
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            version = state.get("version") if isinstance(state, dict) else None
            raise ValueError(f"{os.fspath(ckpt_path)}: dqn_state version {version!r} is not supported (this code "
                             f"reads version {_STATE_VERSION})")
        shards = state.get("shards")
        if shards is not None:
            if world_size != shards and world_size > 1:
                raise ValueError(f"checkpoint {os.fspath(ckpt_path)} was written by {shards} DDP ranks (one replay "
                                 f"shard each); resume it with {shards} processes, not {world_size}")
            if world_size == shards:
                state = load_replay_shard(ckpt_path, global_rank, state)
        if "replay" in state and self.hparams.checkpoint_replay:
            r = self.replay_config
            extra = {} if r.sampler == "uniform" else {"weight_normalization": r.weight_normalization}
            probe = make_replay_buffer(r.capacity, r.batch_size, sampler=r.sampler, device="cpu", alpha=r.alpha,
                                       beta=r.beta, eps=r.eps, packed=r.packed, eager_graphs=False, seed=0, **extra)
            try:
                _checked_state(probe, state["replay"])
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


def _batch_inputs(batch, weight: Tensor | None) -> dict[str, Tensor]:
    """The learner's inputs from a replay TensorDict ``[B]`` (IS weights default to ones)."""
    reward = batch["reward"]
    return {"observation": batch["observation"], "next_observation": batch["next_observation"],
            "action": batch["action"], "reward": reward, "discount": batch["discount"],
            "weight": torch.ones_like(reward) if weight is None else weight.to(torch.float32)}


def _probe_env(env: EnvConfig) -> tuple[tuple[int, ...], int]:
    """(observation shape without batch dims, number of actions) from a one-member env on the CPU."""
    import gymnasium.error

    try:
        probe = make_env(replace(env, num_envs=1, vectorization="sync"), "cpu")
    except gymnasium.error.Error as err:  # e.g. NameNotFound for a misspelt id
        raise ValueError(f"env.id {env.id!r} cannot be made: {err}") from err
    try:
        obs_shape = tuple(probe.observation_spec["observation"].shape[1:])
        n_actions = int(probe.action_spec.space.n)
    finally:
        probe.close()
    return obs_shape, n_actions


def _validate(a: dict[str, Any]) -> None:
    """Range checks of the DQN arguments (ValueError naming the argument)."""
    check_range("gamma", a["gamma"], low=0.0, high=1.0)
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
