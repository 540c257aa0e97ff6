"""The DQN LightningModule: prioritized replay on the learner's device, no host sync per step.

One training step = collect ``1 / replay_ratio`` env steps (on average) -> extend the buffer ->
sample -> double-DQN n-step target -> IS-weighted Huber loss -> backward -> clip -> Adam step ->
priority update -> target-network update -> in-place metric accumulation. An epoch is
``updates_per_epoch`` such steps, fed by a *sized* dataset of step indices (an unsized iterable
would make Lightning prefetch, i.e. sample from stale priorities).

How the updates run (eager, one CUDA graph of the learner step, or whole updates in one graph; plain torch
or Inductor's kernels) is an update strategy chosen once when the runtime is built
(:mod:`lightning_per.dqn.updates`); the DDP plumbing is :mod:`lightning_per.dqn.ddp`, the checkpointed
state :mod:`lightning_per.dqn.state`. Graph mode, blocks and DDP: docs/dqn.md, docs/ddp.md.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset
from torchrl.envs import EnvBase

from lightning_per import make_replay_buffer
from lightning_per.actors.apex import ApexConfig
from lightning_per.actors.stats import agent_time_shares
from lightning_per.callbacks.checkpoint_io import GENERATION_KEY
from lightning_per.dqn.apex import ApexFeed, actor_env_spec
from lightning_per.dqn.collector import NStepCollector
from lightning_per.dqn.config import ReplayConfig, validate_dqn_arguments
from lightning_per.dqn.ddp import WholeEpochPerRank, all_ranks_reached, bypass_ddp_reducer, setup_ddp
from lightning_per.dqn.networks import make_q_network
from lightning_per.dqn.state import check_resume_state, loaded_state, restore_state, saved_state
from lightning_per.dqn.targets import hard_update, linear_schedule
from lightning_per.dqn.updates import Learner, UpdateStrategy, choose_update
from lightning_per.dqn.user import UserEnv, check_user_env, check_user_objects, user_q_network
from lightning_per.envs import EnvConfig, make_env
from lightning_per.integrity import new_generation
from lightning_per.metrics.accumulator import MetricAccumulator
from lightning_per.metrics.episodes import (
    new_episode_log,
    new_episode_ring,
    push_episode_log,
    push_episode_returns,
    recent_mean_return,
)

__all__ = ["DQN", "StepIndices"]

_RING = 100  # episode returns kept for RunArtifactsCallback (it reads the last 20)
_EPISODE_LOG = 4096  # per-episode rows (env steps, time, return) kept between two epoch-end reads
_METRICS = {"loss": "mean", "td_abs_mean": "mean", "td_abs_max": "max", "q_mean": "mean",
            "is_weight_mean": "mean", "episode_return": "mean", "episode_length": "mean",
            "env_steps": "last", "updates": "last", "clamped_priorities": "last", "epsilon": "last",
            "beta": "last"}
#: with ``collector: actors``: mean actor weight lag (updates), updates per inserted transition, throughput
_ACTOR_METRICS = {"actor_weight_lag": "mean", "replay_ratio_achieved": "last", "env_steps_per_s": "last",
                  "updates_per_s": "last", "learner_wait_s": "last", "actor_queue_full": "last",
                  # the epoch's shares of the agents' time (lightning_per.actors.stats.agent_time_shares)
                  "agent_env_share": "last", "agent_answer_wait_share": "last", "agent_slot_wait_share": "last"}


class StepIndices(Dataset):
    """A sized dataset ``0 .. n-1``: one item per gradient update of an epoch."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class DQN(LightningModule):
    """Deep Q-learning with prioritized replay on the learner's device.

    DQN (Mnih et al. 2015) with double-DQN targets (van Hasselt et al. 2016, arXiv:1509.06461), n-step
    returns, a dueling head option (Wang et al. 2016, arXiv:1511.06581) and prioritized replay (Schaul
    et al. 2016, arXiv:1511.05952) kept on the learner's device.

    Args:
        env: environment (see :class:`lightning_per.envs.EnvConfig`); unused with ``env_factory``.
        replay: replay buffer and IS-exponent schedule (see :class:`lightning_per.dqn.ReplayConfig`).
        env_factory: a TorchRL env of your own instead of ``env``: an ``EnvBase`` (used as it is), or a callable
            returning one (in YAML a ``class_path`` to an ``EnvBase`` class or a function; called once to read
            the specs and once per fit). Contract (:func:`lightning_per.dqn.user.check_user_env`):
            ``batch_size == (E,)``, an ``observation`` entry, a categorical ``action``; seeded with
            ``set_seed(seed + 1000 rank)``; it may live on any device. Never stored in checkpoints: a resume
            takes it from your settings again.
        network: ``mlp`` for state vectors, ``nature_cnn`` for stacked frames (Mnih et al. 2015).
        q_network: a Q-network of your own instead of ``network``: ``q_network(obs_shape, n_actions) ->
            nn.Module`` (in YAML a ``class_path`` to a module class whose first two arguments are those, the
            others in ``init_args``), mapping ``(B, *obs_shape)`` observations to ``(B, n_actions)`` float32;
            checked on a zero batch (:func:`lightning_per.dqn.user.user_q_network`). ``hidden_sizes``
            and ``dueling`` then do nothing. Never stored in checkpoints (its ``state_dict`` is).
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
        max_env_steps: stop training at the first update after this many env steps were taken (the
            ``warmup_steps`` of random play run in full before it; None: no limit).
        target_return: stop at an epoch end once the mean return of the last 20 episodes reaches
            this value (None: never); one host read per epoch.
        seed: seeds the envs, the exploration RNG and the replay RNG (rank r adds 1000 r); in [0, 2**31 - 1].
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

    def __init__(self, env: EnvConfig = EnvConfig(), replay: ReplayConfig = ReplayConfig(),  # noqa: B008
                 env_factory: EnvBase | Callable[[], EnvBase] | None = None,
                 network: Literal["mlp", "nature_cnn"] = "mlp",
                 q_network: Callable[[tuple[int, ...], int], nn.Module] | None = None,
                 hidden_sizes: Sequence[int] = (256, 256),
                 dueling: bool = False, gamma: float = 0.99, n_step: int = 3, double_dqn: bool = True,
                 lr: float = 5e-4, adam_eps: float = 1e-8, huber_delta: float = 1.0,
                 grad_clip_norm: float | None = 10.0, target_update_interval: int = 500,
                 target_tau: float | None = None, epsilon_start: float = 1.0, epsilon_end: float = 0.01,
                 epsilon_decay_steps: int = 10_000, warmup_steps: int = 1_000, replay_ratio: float = 0.25,
                 updates_per_epoch: int = 500, updates_per_step: int = 1, updates_per_graph: int = 1,
                 max_env_steps: int | None = None,
                 target_return: float | None = None, seed: int = 0, compile: bool = False,
                 inductor: bool = False, inductor_mode: Literal["default", "max-autotune-no-cudagraphs"] = "default",
                 checkpoint_replay: bool = True, sigterm_check_interval: int = 0,
                 collector: Literal["in_process", "actors"] = "in_process", actors: ApexConfig = ApexConfig(),  # noqa: B008 (copied below)
                 initial_priority: Literal["max", "td"] = "max", actor_sync_interval: int = 8) -> None:
        super().__init__()
        env = EnvConfig(**env) if isinstance(env, dict) else replace(env)  # a copy: the default is shared
        replay = ReplayConfig(**replay) if isinstance(replay, dict) else replace(replay)
        env.validate()
        replay.validate()
        validate_dqn_arguments(locals())
        check_user_objects(env_factory, q_network)
        actors = ApexConfig(**actors) if isinstance(actors, dict) else replace(actors)  # a copy, as env
        if collector not in ("in_process", "actors"):
            raise ValueError(f"collector must be 'in_process' or 'actors', got {collector!r}")
        if collector == "actors":
            actors.validate()
            if env_factory is not None:
                raise ValueError("collector='actors' steps the env that env= describes in agent processes: leave "
                                 "env_factory unset (a TorchRL env object cannot cross into the torch-free agents)")
            if env.backend not in ("gymnasium", "ale_vector"):
                raise ValueError(f"collector='actors' steps Gymnasium or ale-py vector envs in agent processes: "
                                 f"env.backend must be 'gymnasium' or 'ale_vector', got {env.backend!r}")
        self.actors_config = actors
        # the flat arguments (and LightningCLI's keys), then with the nested configs as plain dicts: the second
        # call sets hparams_initial, what Lightning logs (the W&B run config, `env.*`, `replay.*` and `actors.*`
        # included). The user's env factory and Q-network are code, never checkpoint data: a resume takes them
        # from the user's own settings again (nothing read from a checkpoint is imported)
        self.save_hyperparameters(ignore=["env", "replay", "actors", "env_factory", "q_network"], logger=False)
        self.save_hyperparameters({**self.hparams, "env": asdict(env), "replay": asdict(replay),
                                   "actors": asdict(actors)})
        self.env_config, self.replay_config = env, replay
        self.user_env = None if env_factory is None else UserEnv(env_factory)  # a holder: no submodule
        self.automatic_optimization = False

        if env_factory is None:
            obs_shape, self.n_actions = _probe_config_env(env)
        else:
            probe = self.user_env.make(seed)
            try:
                obs_shape, self.n_actions = check_user_env(probe)
                observation = probe.observation_spec["observation"].zero().cpu()  # (E, *obs), the env's dtype
            finally:
                if self.user_env.owned:
                    probe.close()
        self.q_net_obs_shape = tuple(obs_shape)
        #: the Q-network is the user's (``q_network``), not one of ``network``'s
        self.custom_q_network = q_network is not None
        if replay.frame_dedup and len(obs_shape) < 2:
            raise ValueError(f"replay.frame_dedup needs stacked frames (frame_stack, *frame) as observations, "
                             f"got observation shape {tuple(obs_shape)}")
        self._frame_stack = int(obs_shape[0]) if replay.frame_dedup else None
        if q_network is None:
            self.q_net = make_q_network(network, obs_shape, self.n_actions, list(hidden_sizes), dueling)
        else:
            sample = observation if env_factory is not None else torch.zeros((1, *obs_shape))
            self.q_net = user_q_network(q_network, obs_shape, self.n_actions, sample)
        self.target_net = copy.deepcopy(self.q_net).requires_grad_(False)
        per_actor = {f"actor{i}_{name}": kind for i in range(actors.agents)
                     for name, kind in (("return", "mean"), ("epsilon", "last"))}  # each rung of the ladder
        self.metrics = MetricAccumulator(_METRICS | _ACTOR_METRICS | per_actor if collector == "actors" else _METRICS,
                                         persistent=("env_steps", "updates"))
        ring, count = new_episode_ring(_RING)  # (100,) float32 NaN / () int64, see metrics.episodes
        self.register_buffer("episode_returns_ring", ring)
        self.register_buffer("episode_returns_count", count)
        # the learning curves' per-episode series (metrics.episodes), read once an epoch; not checkpointed
        log, log_count = new_episode_log(max(_EPISODE_LOG, 2 * env.num_envs))
        self.register_buffer("episode_log", log, persistent=False)
        self.register_buffer("episode_log_count", log_count, persistent=False)
        self.collector: NStepCollector | None = None
        self.feed: ApexFeed | None = None  # collector="actors": Ape-X actor processes (dqn/apex.py)
        self.rb = None
        self._replay_rng: torch.Generator | None = None
        self.learner: Learner | None = None  # one update's math (plain or Inductor), built with the runtime
        self.updater: UpdateStrategy | None = None  # how the updates run (dqn/updates.py), chosen with the runtime
        self.graph_captures = 0  # CUDA-graph captures of the update (graph mode); one per fit
        self._grad_world_size = 1  # > 1: graph mode under DDP all-reduces the gradients itself
        self._pending_state: dict[str, Any] | None = None
        self._shard_state: dict[str, Any] | None = None  # this rank's state, written next to a DDP checkpoint
        self._run_id: str | None = None  # the generation ids' prefix, set at setup (one on every DDP rank)
        self.fit_started = False  # on_train_start ran: a failure before is a bad setting (the CLI's one-line error)
        self._host_recorded = False  # host counters recorded in the current step
        self.env_steps = 0  # host counters: deterministic, never read from the device
        self.updates = 0
        self._credit = 0.0
        self._epsilon: float | None = None  # exploration probability of the last collection (host)

    # ------------------------------------------------------------------ setup
    def setup(self, stage: str) -> None:
        if self.collector is not None or self.feed is not None:
            return
        device = self.trainer.strategy.root_device if self._trainer is not None else self.device
        self._check_device(device)
        self._run_id = new_generation()
        if self._trainer is not None and self.trainer.world_size > 1:
            setup_ddp(self)  # one run id on every rank, per-rank buffers and shards, bounded SIGTERM checks
        self.build_runtime(device)

    def _check_device(self, device: torch.device) -> None:
        if self.hparams.compile and device.type != "cuda":
            raise ValueError(f"compile=True captures the update in a CUDA graph and needs a CUDA device; "
                             f"this run is on {device}. Set model.compile=false (or use a GPU).")

    def make_env(self, device: torch.device | str, seed: int) -> EnvBase:
        """The training env: the user's ``env_factory`` (an ``EnvBase`` used as it is, or a new one from the
        factory), seeded with ``env.set_seed(seed)``; otherwise the env ``env`` describes
        (:func:`lightning_per.envs.make_env`, on ``device`` for the ``torch`` backend, else on the CPU).

        Raises:
            ValueError: the factory returned something other than a TorchRL ``EnvBase``.
        """
        if self.user_env is None:
            env_device = torch.device(device) if self.env_config.backend == "torch" else torch.device("cpu")
            return make_env(self.env_config, env_device, seed=seed)
        return self.user_env.make(seed)

    def build_runtime(self, device: torch.device | str) -> None:
        """Create the env, collector, replay buffer, device-side metrics and the update strategy on ``device``.

        Raises:
            ValueError: ``updates_per_graph > 1`` where the whole update is not captured.
        """
        device, h, r = torch.device(device), self.hparams, self.replay_config
        seed = h.seed + 1000 * self.global_rank
        if h.collector == "in_process":
            env = self.make_env(device, seed)
            self.collector = NStepCollector(env, h.n_step, h.gamma, self.n_actions, device, seed=seed + 1)
        self._replay_rng = torch.Generator()  # the buffer derives its device generator from this one
        self._replay_rng.manual_seed(seed + 2)
        # a full-batch loss does not see the batch order: strata in order (the kernels draw their own uniforms)
        extra = {} if r.sampler == "uniform" else {"weight_normalization": r.weight_normalization,
                                                   "shuffle_strata": False}
        self.rb = make_replay_buffer(r.capacity, r.batch_size, sampler=r.sampler, device=device,
                                     alpha=r.alpha, beta=r.beta, eps=r.eps, generator=self._replay_rng,
                                     packed=r.packed, frame_stack=self._frame_stack, **extra)
        self.metrics.to(device)
        if device.type == "cuda" and h.network == "nature_cnn" and not self.custom_q_network:
            # NHWC convolutions: cuDNN's tensor-core kernels without a layout conversion around each one
            for net in (self.q_net, self.target_net):
                net.to(memory_format=torch.channels_last)
        prioritized = None if r.sampler == "uniform" else self.rb.sampler
        self.learner = Learner(self.q_net, self.target_net, self.metrics, prioritized, double_dqn=h.double_dqn,
                               huber_delta=h.huber_delta, grad_clip_norm=h.grad_clip_norm, target_tau=h.target_tau,
                               inductor_mode=h.inductor_mode if h.inductor else None)
        self.updater = choose_update(self, device)
        if h.collector == "actors":
            self.feed = ApexFeed(self.q_net, self.target_net, self.rb, self.actors_config,
                                 actor_env_spec(self.env_config), tuple(self.q_net_obs_shape), h.n_step, h.gamma,
                                 h.double_dqn, h.initial_priority, h.actor_sync_interval, device, seed=seed + 1)
        if self._pending_state is not None:
            self._load_dqn_state(self._pending_state)
            self._pending_state = None

    # ------------------------------------------------------------------ checkpoints (dqn/state.py)
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Put this module's ``dqn_state`` (:func:`lightning_per.dqn.state.saved_state`) and its generation id
        in ``checkpoint``; under DDP this rank's whole state waits in ``_shard_state`` for its shard file."""
        keep_replay = self.hparams.checkpoint_replay and self.rb is not None
        run_id = self._run_id or new_generation()
        state, shard = saved_state(
            env_steps=self.env_steps, updates=self.updates, credit=self._credit,
            metrics=self.metrics.state_dict(),
            collector=self.collector.state_dict() if self.collector is not None else None,
            replay=self.rb.state_dict() if keep_replay else None,
            replay_rng=self._replay_rng.get_state() if keep_replay else None,
            generation=f"{run_id}-step{checkpoint.get('global_step', self.updates)}",
            world_size=self.trainer.world_size if self._trainer is not None else 1)
        checkpoint[GENERATION_KEY] = state["generation"]  # the checkpoint's manifest carries it too
        if shard is not None:  # written by the strategy hook of ddp.write_shards_with_checkpoints
            self._shard_state = shard
        checkpoint["dqn_state"] = state

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Check ``checkpoint``'s ``dqn_state`` (:func:`lightning_per.dqn.state.loaded_state`) and restore it, or
        keep it for :meth:`build_runtime` where the runtime is not built yet (``DQN.load_from_checkpoint``).

        Raises:
            ValueError, FileNotFoundError, IntegrityError: see :func:`lightning_per.dqn.state.loaded_state`.
        """
        trainer = self._trainer
        state = loaded_state(
            checkpoint.get("dqn_state"), ckpt_path=trainer.ckpt_path if trainer is not None else None,
            world_size=trainer.world_size if trainer is not None else 1, global_rank=self.global_rank,
            metrics=self.metrics.state_dict(),
            collector_rng_bytes=self.collector.rng.get_state().numel() if self.collector is not None else None)
        if state is None:
            return
        if self.learner is None:  # runtime not built (e.g. DQN.load_from_checkpoint): applied by build_runtime()
            self._pending_state = state
            return
        self._load_dqn_state(state)

    def _load_dqn_state(self, state: dict[str, Any]) -> None:
        """Restore a checked ``dqn_state`` into the built runtime: the host counters here, the metrics, RNGs,
        collector and replay by :func:`lightning_per.dqn.state.restore_state`."""
        self.env_steps, self.updates, self._credit = state["env_steps"], state["updates"], state["credit"]
        restore_state(state, metrics=self.metrics, collector=self.collector, rb=self.rb, replay_rng=self._replay_rng,
                      warmup=self.hparams.warmup_steps > 0)

    def check_resume(self, checkpoint: dict[str, Any], ckpt_path: str | os.PathLike[str], world_size: int,
                     global_rank: int, node_ranks: Sequence[int] = (), collector_rng_bytes: int | None = None,
                     env_device: torch.device | str = "cpu") -> None:
        """Raise what resuming this model from ``checkpoint`` (read from ``ckpt_path``) would refuse part-way,
        before anything is built or written (the command line calls it before ``Trainer.fit``):
        :func:`lightning_per.dqn.state.check_resume_state` with this model's metrics, an env of its config on
        ``env_device`` and its replay configuration (where ``checkpoint_replay``).

        Raises:
            FileNotFoundError, IntegrityError, TypeError, ValueError: naming the file or the part.
        """
        check_resume_state(checkpoint, ckpt_path, world_size, global_rank, metrics=self.metrics.state_dict(),
                           make_env=functools.partial(self.make_env, env_device, seed=0),
                           env_owned=self.user_env is None or self.user_env.owned,
                           replay=self.replay_config if self.hparams.checkpoint_replay else None,
                           node_ranks=node_ranks, collector_rng_bytes=collector_rng_bytes)

    def train_dataloader(self) -> DataLoader:
        steps = StepIndices(self._steps_per_epoch)
        return DataLoader(steps, batch_size=None, sampler=WholeEpochPerRank(steps))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # fused: one kernel for all parameters (CPU and CUDA); capturable: step counters on the device.
        # Graph mode with inductor=True compiles the step instead (see dqn/compiled.py, CompiledStep):
        # that needs the foreach implementation, which torch.compile traces.
        h = self.hparams
        compiled_step = bool(h.inductor and h.compile)
        opt = torch.optim.Adam(self.q_net.parameters(), lr=h.lr, eps=h.adam_eps, fused=not compiled_step,
                               foreach=True if compiled_step else None, capturable=bool(h.compile))
        opt.register_load_state_dict_post_hook(_state_in_param_layout)
        return opt

    def forward(self, observation: Tensor) -> Tensor:
        """Action values ``(B, A) float32`` of ``observation (B, *obs_shape)`` (online network)."""
        return self.q_net(observation)

    # ------------------------------------------------------------------ collection
    def on_train_start(self) -> None:
        self.fit_started = True
        if self._trainer is not None and self.trainer.ckpt_path is not None:  # a resumed run that had already
            self._stop_if_solved(" (restored from the checkpoint)")  # reached its target trains no further
            if self.trainer.should_stop:
                return
        if self.hparams.compile and self._trainer is not None and self.trainer.world_size > 1:
            bypass_ddp_reducer(self.trainer.strategy.model)  # before the first training_step, which captures
            self._grad_world_size = self.trainer.world_size
        batch = self.replay_config.batch_size
        if self.feed is not None:  # Ape-X: the actors explore on their ladder from the first step
            self._t0, self._updates0 = time.monotonic(), self.updates
            self.feed.counters.inserted = self.env_steps  # a resumed run's count goes on (0 on a fresh one)
            self.feed.sync(self.updates, force=True)
            self.feed.start()
            self.feed.fill(max(self.hparams.warmup_steps, self.feed.counters.inserted + max(0, batch - len(self.rb))))
            self._record_actor_steps()
            self._inserted0 = self.feed.counters.inserted  # the replay ratio counts from here
            self._actor_returns_read = self.feed.actors.agent_returns.copy()  # (agents, 2): [sum, count] logged
            self._agent_time_read = self.feed.actors.shared.agent_time.copy()  # (agents, 4) seconds (AGENT_TIME)
            return
        while self.env_steps < self.hparams.warmup_steps or len(self.rb) < batch:
            self._collect(random=True)

    def _collect(self, random: bool = False) -> None:
        """One vector step: ``num_envs`` env steps into the buffer, episode stats into the metrics (after the
        step in flight, if any)."""
        if self.collector.in_flight:
            self._record(self.collector.wait(), self.env_steps)
        self._start_collect(random)
        self._record(self.collector.wait(), self.env_steps)

    def _start_collect(self, random: bool = False) -> None:
        """Act (epsilon-greedy, at this env step's epsilon) and start one vector step."""
        h = self.hparams
        eps = 1.0 if random else linear_schedule(h.epsilon_start, h.epsilon_end, h.epsilon_decay_steps,
                                                 self.env_steps)
        self.collector.start(None if random else self.q_net, eps)
        self.env_steps += self.collector.num_envs
        self._epsilon = eps

    def _record(self, received, env_steps: int) -> None:
        """A vector step's results into the n-step window, its transitions into the buffer, episode stats
        (``env_steps``: the env steps taken when that step ended)."""
        out = self.collector.record(received)
        if out.transitions is not None:
            self.rb.extend(out.transitions)
        n_done = out.done.sum()
        self.metrics.add("episode_return", out.episode_return.sum(), count=n_done)
        self.metrics.add("episode_length", out.episode_length.sum(), count=n_done)
        ring, count = self.episode_returns_ring, self.episode_returns_count
        push_episode_returns(ring, count, out.episode_return.to(ring.device), out.done.to(ring.device))
        push_episode_log(self.episode_log, self.episode_log_count, out.episode_return.to(ring.device),
                         out.done.to(ring.device), env_steps=env_steps, time_s=time.monotonic())

    def _record_actor_steps(self) -> None:
        """Ape-X: env steps = transitions inserted; the episodes the actors finished into the metrics."""
        self.env_steps = self.feed.counters.inserted
        episodes = self.feed.episodes()
        if not episodes:
            return
        ret = torch.tensor([r for _, _, r, _ in episodes], dtype=torch.float32, device=self.metrics.device)
        length = torch.tensor([n for _, _, _, n in episodes], dtype=torch.float32, device=ret.device)
        done = torch.ones_like(ret, dtype=torch.bool)
        self.metrics.add("episode_return", ret.sum(), count=len(episodes))
        self.metrics.add("episode_length", length.sum(), count=len(episodes))
        ring, count = self.episode_returns_ring, self.episode_returns_count
        push_episode_returns(ring, count, ret.to(ring.device), done.to(ring.device))
        push_episode_log(self.episode_log, self.episode_log_count, ret.to(ring.device), done.to(ring.device),
                         env_steps=self.env_steps, time_s=time.monotonic())

    # ------------------------------------------------------------------ learning
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

    def _update_block(self, n: int) -> Tensor:
        """``n`` gradient updates (one graph replay, or ``n == 1`` eager or learner-graph update) after the env
        steps they owe at ``replay_ratio``. Returns the last update's loss ``() float32`` (on the device)."""
        h, r = self.hparams, self.replay_config
        # collect: the env steps owed for n updates, num_envs at a time. An env that steps in its own
        # threads (collector.overlaps) steps while the host records the previous step and launches these
        # updates: each vector step is started here and recorded at the next one (docs/dqn.md, "The loop").
        self._credit += n / h.replay_ratio
        c = self.collector
        if self.feed is not None:  # Ape-X: the learner takes the transitions it owes, waiting if the actors lag;
            before = self.feed.counters.inserted  # whole slots come in: the surplus is credit for later blocks
            self.feed.fill(before + math.ceil(self._credit))
            self._credit -= self.feed.counters.inserted - before
            self._record_actor_steps()
        while c is not None and self._credit >= c.num_envs:
            if c.overlaps:
                received = c.wait() if c.in_flight else None
                self._start_collect()
                if received is not None:
                    self._record(received, self.env_steps - c.num_envs)
            else:
                self._collect()
            self._credit -= c.num_envs
        # anneal beta: this block's value, a device scalar read by the (captured) sampler
        if r.sampler != "uniform":
            self.rb.sampler.beta = linear_schedule(r.beta, r.beta_end, r.beta_anneal_updates, self.updates)
        # learn: sample -> TD target and loss -> backward -> Adam -> priorities -> Polyak target, metrics
        out = self.updater(n)
        # update the target network: the hard copy when an interval boundary was passed (host counter)
        self.updates, interval = self.updates + n, h.target_update_interval
        if self.feed is not None:
            self.feed.sync(self.updates)
        if h.target_tau is None and self.updates // interval > (self.updates - n) // interval:
            hard_update(self.learner.target, self.learner.online)
        if h.max_env_steps is not None and self.env_steps >= h.max_env_steps:
            self.trainer.should_stop = True
        return out["loss"]

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        # A stop decided after the step (Lightning's Timer for max_time runs before this hook) ends the
        # epoch early: record the host counters now, so the last epoch's row is current.
        if self._trainer is not None and self.trainer.should_stop and not self._host_recorded:
            self._record_host_metrics()
            self._host_recorded = True

    def _stopping(self) -> bool:
        return self._trainer is not None and self._trainer.should_stop

    def _record_host_metrics(self) -> None:
        """Host counters and schedules, written once per epoch (their last value is what is logged)."""
        m = self.metrics
        m.add("env_steps", self.env_steps)
        m.add("updates", self.updates)
        if self._epsilon is not None:
            m.add("epsilon", self._epsilon)
        if self.replay_config.sampler != "uniform":
            m.add("beta", self.rb.sampler.beta)
        if self.feed is not None:
            f, wall = self.feed.counters, max(time.monotonic() - self._t0, 1e-9)
            m.add("actor_weight_lag", f.lag_sum / max(f.inserted, 1))
            m.add("replay_ratio_achieved", (self.updates - self._updates0) / max(f.inserted - self._inserted0, 1))
            m.add("env_steps_per_s", f.inserted / wall)
            m.add("updates_per_s", (self.updates - self._updates0) / wall)
            m.add("learner_wait_s", f.learner_wait_s)
            m.add("actor_queue_full", f.queue_full)
            totals = self.feed.actors.agent_returns.copy()  # the episodes each agent finished this epoch
            for i, (ret_sum, n) in enumerate(totals - self._actor_returns_read):
                if n:
                    m.add(f"actor{i}_return", ret_sum, count=n)
            self._actor_returns_read = totals
            spent = self.feed.actors.shared.agent_time.copy()  # where the agents' time went this epoch
            for name, share in agent_time_shares(self._agent_time_read, spent).items():
                m.add(name, share)
            self._agent_time_read = spent
            for i, eps in enumerate(self.actors_config.epsilons_at(self.updates)):
                m.add(f"actor{i}_epsilon", eps)

    def teardown(self, stage: str) -> None:
        """End of fit (also after an exception): release the captured CUDA graph. Under DDP it holds NCCL
        collectives, and while such a graph exists ``torch.distributed.destroy_process_group`` (run at exit
        by Lightning) never returns. A later
        ``fit`` captures again (:attr:`graph_captures` counts the captures)."""
        if self.updater is not None:
            self.updater.release()
        if self.feed is not None:
            self.feed.close()

    def on_train_epoch_end(self) -> None:
        self._stop_if_solved("")

    def _stop_if_solved(self, when: str) -> None:
        """Stop the fit once the mean return of the last 20 episodes reaches ``target_return`` (one host read)."""
        target = self.hparams.target_return
        if target is None:
            return
        ring, count = self.episode_returns_ring, self.episode_returns_count
        mean = recent_mean_return(ring, count, 20)  # one host read
        if self.trainer.world_size > 1:  # every rank takes the same decision (one all-reduce)
            solved, mean = all_ranks_reached(self.trainer.strategy, mean, int(count), target, self.trainer.world_size,
                                             ring.device)
        else:
            solved = mean is not None and int(count) >= 20 and mean >= target
        if solved:
            rank_zero_info(f"target_return={target} reached (mean of the last 20 episodes) after "
                           f"{self.env_steps} env steps and {self.updates} updates{when}: stopping.")
            self.trainer.should_stop = True


def _state_in_param_layout(optimizer: torch.optim.Optimizer) -> None:
    """After ``optimizer.load_state_dict``: give each per-parameter state tensor (Adam's moments) its
    parameter's strides. A checkpoint's moments keep the layout they were saved in (NCHW before the Nature
    CNN ran channels-last), and the fused Adam kernel pairs the elements of a parameter and its moments by
    storage order, so mismatched strides would update the wrong elements."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            for key, value in state.items():
                if torch.is_tensor(value) and value.shape == p.shape and value.stride() != p.stride():
                    state[key] = torch.empty_like(p, dtype=value.dtype).copy_(value)


def _probe_config_env(env: EnvConfig) -> tuple[tuple[int, ...], int]:
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
