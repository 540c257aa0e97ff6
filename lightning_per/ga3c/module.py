r"""The GA3C actor-critic LightningModule: trainer threads feed ``training_step`` under ``Trainer.fit``.

Agents (processes) fill shared-memory rollouts; NT trainer threads copy them into (pinned) batches of at
least ``train_min_batch_size`` transitions on a bounded queue, which ``train_dataloader`` iterates; predictor
threads call :meth:`GA3C.act` on the live parameters, tagging each prediction with
:attr:`GA3C.policy_version` (optimizer steps so far). With ``cuda_graph: true`` on one CUDA device the whole
update (forward, loss, backward, clip, optimizer step, metrics) is one CUDA-graph replay under manual
optimization; elsewhere training is eager under automatic optimization. ``max_time_s`` counts from
:meth:`GA3C.on_fit_start`. Metrics: device-side :attr:`GA3C.metrics`, logged once an epoch by
:class:`~lightning_per.callbacks.AsyncMetricsCallback`, with host rates (TPS, PPS, steps/s, FPS), NA/NP/NT,
queue sizes and episode returns folded in as Python numbers. Design, graph mode and run length in detail:
docs/ga3c.md.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
import warnings
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from lightning_per.actors.envs import mean_observation, probe_env
from lightning_per.actors.stats import Stats
from lightning_per.ga3c.batches import BatchStream, SystemGuard, identity
from lightning_per.ga3c.bookkeeping import RING, EpisodeBuffers, HostBookkeeping
from lightning_per.ga3c.config import GA3CConfig
from lightning_per.ga3c.loss import a3c_loss, appo_loss, lag_weights, normalize_advantage, vtrace_targets
from lightning_per.ga3c.networks import dead_unit_fraction, make_network
from lightning_per.ga3c.optim import RMSpropTF, linear_schedule
from lightning_per.ga3c.system import GA3CSystem
from lightning_per.graphs import CapturedStep, capture, count_optimizer_step
from lightning_per.metrics import MetricAccumulator, new_episode_log, new_episode_ring

__all__ = ["GA3C"]

log = logging.getLogger("lightning_per.ga3c")
_EPISODE_LOG = 8192  # per-episode rows (env steps, time, return) kept between two epoch-end reads
_METRICS = {
    "loss": "mean", "policy_loss": "mean", "value_loss": "mean", "entropy": "mean", "advantage": "mean",
    "dead_unit_frac": "mean", "clip_frac": "mean",
    "batch_size": "mean", "policy_lag": "mean", "episode_return": "mean", "mean_return": "last",
    "tps": "last", "pps": "last", "steps_per_s": "last", "fps": "last", "predict_batch": "last",
    "na": "last", "np": "last", "nt": "last", "pred_queue": "last", "train_queue": "last",
    "batch_queue": "last", "env_steps": "last", "updates": "last", "episodes": "last",
    "policy_lag_p50": "last", "policy_lag_p95": "last", "policy_lag_max": "last", "lag_dropped_frac": "last",
    # the epoch's shares of the agents' time (lightning_per.actors.stats.agent_time_shares)
    "agent_env_share": "last", "agent_answer_wait_share": "last", "agent_slot_wait_share": "last",
}
_DEVICE_KEYS = ("obs", "action", "ret")  # the batch tensors training_step reads
_VTRACE_KEYS = ("log_prob", "reward", "terminated", "truncated", "next_obs")  # and those of V-trace
# declared consecutively above; dead_unit_frac: the share of the last hidden layer's units that no transition of the
# batch activates (lightning_per.ga3c.networks.dead_unit_fraction)
_STEP_METRICS = ("loss", "policy_loss", "value_loss", "entropy", "advantage", "dead_unit_frac")
_APPO_METRICS = (*_STEP_METRICS, "clip_frac")  # loss: appo adds PPO's clipped fraction (empty for a3c)


class GA3C(pl.LightningModule):
    """GA3C actor-critic (Babaeizadeh et al., ICLR 2017) trained with ``Trainer.fit``.

    Args:
        config: the run configuration (defaults: CartPole).
        **overrides: field values replacing those of ``config``.

    Batches (from the trainer threads): ``obs`` (N, *obs_shape) uint8/float32, ``action`` (N,) int64,
    ``ret`` (N,) float32 n-step returns, on the module's device after Lightning's transfer
    (:meth:`transfer_batch_to_device`; in graph mode they stay in pinned host memory and are copied into
    the graph's static inputs); ``version`` (N,) int64 policy versions, kept on the host, and host
    numbers ``size`` (N) and ``version_mean``. With ``vtrace`` also ``log_prob`` (N,) float32 (log mu of the
    acting policy), ``reward`` (N,) float32, ``terminated``, ``truncated`` (N,) bool and ``next_obs``
    (N / T, *obs_shape): rows are whole rollouts, time-major, and the targets are recomputed each update.
    With ``max_policy_lag`` the versions also go to the device (``lag_version``), where each transition's
    lag (:attr:`lag_clock` minus its version) gives its loss weight
    (:func:`~lightning_per.ga3c.loss.lag_weights`): the bound acts at every update, also on a batch reused by
    ``updates_per_batch`` or left waiting in the batch queue, without a host read. The loss is ``loss``'s:
    :func:`~lightning_per.ga3c.loss.a3c_loss` or, with ``appo``, :func:`~lightning_per.ga3c.loss.appo_loss` (PPO's
    clipped ratio over the V-trace advantages, optionally against :attr:`target_net`).

    Attributes:
        bookkeeping: the host side (:class:`~lightning_per.ga3c.bookkeeping.HostBookkeeping`): host counters into
            :attr:`metrics`, the episode ring and log synced once an epoch, the run's summary.
        graph_captures: CUDA-graph captures of the update (graph mode: one per ``fit``).
        lag_clock: 0-d int64 on the module's device, :attr:`policy_version` kept on the device (set at
            ``on_fit_start``, incremented after each update) for the lag bound's weights.
        target_net: APPO's target network (``appo_target_update``; no gradient, not in the optimizer), the network
            copied every ``appo_target_update`` updates; None without it.
        beta_now: 0-d float32 on the module's device, the entropy weight of this update (``beta``, or its schedule
            towards ``beta_final``), refilled after each update from a host float.

    Raises:
        ValueError: a configuration value out of range (named), or an environment without a
            discrete action space.
    """

    def __init__(self, config: GA3CConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        cfg = dataclasses.replace(config or GA3CConfig(), **overrides).validate()
        if cfg.updates_per_batch > 1 and not cfg.vtrace:
            warnings.warn(f"updates_per_batch={cfg.updates_per_batch} without vtrace: every update after a batch's "
                          "first is off-policy and uncorrected (set vtrace: true to correct it)", UserWarning,
                          stacklevel=2)
        self.cfg = cfg
        self.save_hyperparameters(cfg.to_dict())
        self.env_spec = {"env": cfg.env, "backend": cfg.env_backend, "kwargs": dict(cfg.env_kwargs),
                         "frame_stack": cfg.atari_frame_stack}
        obs_shape, obs_dtype, n_actions = probe_env(self.env_spec)
        self.obs_shape, self.obs_dtype, self.n_actions = obs_shape, str(obs_dtype), n_actions
        with torch.random.fork_rng():
            torch.manual_seed(cfg.seed)
            self.net = make_network(cfg.network, obs_shape, n_actions, cfg.hidden_sizes)
        if cfg.obs_center_steps:  # before Trainer.fit: outside the run's time and env steps
            started = time.monotonic()
            loc = mean_observation({**self.env_spec, "num_envs": cfg.envs_per_agent}, cfg.obs_center_steps, cfg.seed)
            self.net.obs_loc.copy_(torch.from_numpy(loc).reshape(self.net.obs_loc.shape))
            log.info("input centered on the mean of %d x %d random-play observations (%.1f s)", cfg.obs_center_steps,
                     cfg.envs_per_agent, time.monotonic() - started)
        # APPO's target network: a lagging copy (no gradient), refreshed every appo_target_update updates
        self.target_net = None if cfg.appo_target_update is None else copy.deepcopy(self.net).requires_grad_(False)
        self.metrics = MetricAccumulator(_METRICS, persistent=("env_steps", "updates", "episodes"))
        ring, count = new_episode_ring(RING)
        self.register_buffer("episode_returns_ring", ring)
        self.register_buffer("episode_returns_count", count)
        # the learning curves' per-episode series (lightning_per.metrics), filled from Stats once an epoch
        episode_log, log_count = new_episode_log(_EPISODE_LOG)
        self.register_buffer("episode_log", episode_log, persistent=False)
        self.register_buffer("episode_log_count", log_count, persistent=False)
        self.policy_version = 0  # optimizer steps so far (host int, read by predictor threads)
        self.system: GA3CSystem | None = None
        self.bookkeeping = HostBookkeeping(cfg, Stats(), self.metrics)  # holds the fit's host counters (stats)
        self.time_to_target_s: float | None = None
        self._target_checked = -1  # episode count at the last target_return check
        self._epoch_episodes = 0
        self._wall_end: float | None = None
        self._stop_reason: str | None = None  # why training stopped (summary's stop_reason)
        self._stop_time: float | None = None  # time.monotonic() of that decision
        self.system_summary: dict[str, Any] = {}
        # episodes.csv's rows (lightning_per.metrics.episodes.episode_table), from the summary's snapshot
        self.episode_rows: list[dict[str, float]] = []
        self._graph_mode = False  # chosen in setup(): cuda_graph on one CUDA device
        self._captured: CapturedStep | None = None
        self._act_generator: torch.Generator | None = None  # graph mode: act() stays off the default generator
        self.graph_captures = 0
        # with V-trace the agents' returns are not read: its targets replace them
        self._device_keys = ("obs", "action") + _VTRACE_KEYS if cfg.vtrace else _DEVICE_KEYS
        # rho-bar and c-bar as device tensors: a float would be turned into one by a host copy in every update
        self.register_buffer("vtrace_clips", torch.tensor([cfg.vtrace_rho_clip, cfg.vtrace_c_clip]),
                             persistent=False)
        self.register_buffer("lag_clock", torch.zeros((), dtype=torch.int64), persistent=False)
        # the entropy weight as a device scalar: its schedule (beta_final) refills it without a new capture
        self.register_buffer("beta_now", torch.tensor(float(cfg.beta)), persistent=False)
        self._lag_counts = (0, 0)  # this update's (dropped, down-weighted) transitions, counted on the host

    # ---- policy (predictor threads) --------------------------------------------------------
    @torch.no_grad()
    def act(self, obs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Sample a ~ pi(.|s), with V(s) and log pi(a|s).

        obs (N, *obs_shape) on the module device -> (action (N,) int64, value (N,) float, log_prob (N,)
        float32), same device. The draw uses the default generator of the device, or in graph mode one of
        the module's own (see the module docstring).
        """
        logits, value = self.net(obs)  # [N, A], [N]
        probs = torch.softmax(logits.float(), dim=-1)  # [N, A]
        action = torch.multinomial(probs, 1, generator=self._act_generator)  # [N, 1]
        log_prob = torch.log_softmax(logits.float(), dim=-1).gather(1, action).squeeze(1)  # [N]
        return action.squeeze(1), value, log_prob

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        return self.net(obs)

    @property
    def stats(self) -> Stats:
        """This fit's host counters (env steps, episodes, updates, lag), which :attr:`bookkeeping` holds: the
        predictor and trainer threads add to them, the module reads them for its stop decisions."""
        return self.bookkeeping.stats

    @property
    def episode_buffers(self) -> EpisodeBuffers:
        """The episode ring and log buffers as registered now (``.to(device)`` replaces them: read at each call)."""
        return EpisodeBuffers(self.episode_returns_ring, self.episode_returns_count, self.episode_log,
                              self.episode_log_count)

    # ---- host counters read by RunArtifactsCallback ------------------------------------------
    @property
    def env_steps(self) -> int:
        return self.stats.snapshot().steps

    @property
    def updates(self) -> int:
        return self.policy_version

    # ---- Lightning hooks -----------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        """Choose graph mode: ``cuda_graph`` and one CUDA device (a single process). Runs before Lightning
        builds the optimizer (:meth:`configure_optimizers`), so that one can be made capturable."""
        on_trainer = self._trainer is not None
        device = self.trainer.strategy.root_device if on_trainer else self.device
        world_size = self.trainer.world_size if on_trainer else 1
        self._graph_mode = self.cfg.cuda_graph and device.type == "cuda" and world_size == 1
        if self._graph_mode and self.cfg.lr_final is not None:
            raise ValueError("lr_final (a learning-rate schedule) cannot be used with cuda_graph on a CUDA device: the "
                             "captured optimizer step holds the rate as a constant; set lr_final: null or cuda_graph: "
                             "false")
        if self.cfg.cuda_graph and not self._graph_mode:
            log.info("cuda_graph=True needs one CUDA device; this run is on %s with %d process(es): "
                     "training eagerly", device, world_size)
        self.automatic_optimization = not self._graph_mode
        self._act_generator = torch.Generator(device).manual_seed(self.cfg.seed) if self._graph_mode else None

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A checkpoint from before the networks held ``obs_loc`` loads as an uncentered network (``obs_loc`` 0), with
        a warning where this config centers."""
        state, own = checkpoint.get("state_dict", {}), self.state_dict()
        missing = [name for name in own if name.endswith("obs_loc") and name not in state]
        for name in missing:
            state[name] = torch.zeros_like(own[name])
        if missing and self.cfg.obs_center_steps:
            warnings.warn(f"the checkpoint has no {missing[0]} (written before the networks held one): the network "
                          f"loads uncentered although obs_center_steps={self.cfg.obs_center_steps}", UserWarning,
                          stacklevel=2)

    def configure_optimizers(self):
        optimizer = self.make_optimizer(capturable=self._graph_mode)
        c = self.cfg
        if c.lr_final is None:
            return optimizer
        # lr -> lr_final linearly over anneal_updates optimizer steps (torch's LambdaLR, stepped by Lightning)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda u: linear_schedule(1.0, c.lr_final / c.lr, c.anneal_updates, u))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def make_optimizer(self, capturable: bool = False) -> torch.optim.Optimizer:
        """The configured optimizer (``optimizer``, ``lr``, ``rmsprop_*``, ``adam_eps``, ``adam_betas``) over the
        network's parameters (not the target network's); ``capturable=True`` (graph mode) keeps its step counts on
        the device, so its step can be captured."""
        c, params = self.cfg, self.net.parameters()
        if c.optimizer == "rmsprop_tf":
            return RMSpropTF(params, lr=c.lr, alpha=c.rmsprop_alpha, eps=c.rmsprop_eps, capturable=capturable)
        if c.optimizer == "rmsprop":
            return torch.optim.RMSprop(params, lr=c.lr, alpha=c.rmsprop_alpha, eps=c.rmsprop_eps,
                                       capturable=capturable)
        return torch.optim.Adam(params, lr=c.lr, betas=tuple(float(b) for b in c.adam_betas), eps=c.adam_eps,
                                capturable=capturable)

    def configure_callbacks(self):
        return [SystemGuard()]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(BatchStream(self), batch_size=None, collate_fn=identity)

    def on_fit_start(self) -> None:
        torch.set_num_threads(self.cfg.torch_threads)
        self.metrics.to(self.device)
        self.lag_clock.fill_(self.policy_version)  # a fill from a host int: no read
        self._follow_schedules()
        # new host counters: their t0 starts the max_time_s clock (module docstring, "Run length")
        self.bookkeeping.start(Stats(), self.episode_buffers)
        self._target_checked = -1
        self._stop_reason = self._stop_time = None
        self.episode_rows = []
        self.system = self.make_system(self.rank_config(self.trainer.world_size, self.global_rank))
        self.system.start()

    def make_system(self, cfg: GA3CConfig) -> GA3CSystem:
        """The (not yet started) GA3C runtime of this rank: agents, predictors and trainers around
        :meth:`act`. the ``ga3c-learner`` benchmark suite overrides it with synthetic rollouts."""
        return GA3CSystem(cfg, self.env_spec, self.obs_shape, self.obs_dtype, self.act,
                          lambda: self.policy_version, self.device, self.stats)

    def rank_config(self, world_size: int, rank: int) -> GA3CConfig:
        """This rank's share of the run under DDP: ``agents`` and ``max_agents`` split as evenly as
        possible (the first ranks take the remainder), env seeds offset by ``1000 * rank``. The config
        itself when ``world_size == 1``."""
        if world_size == 1:
            return self.cfg

        def share(total: int) -> int:
            return total // world_size + (rank < total % world_size)

        c = self.cfg
        agents = share(c.agents)
        return dataclasses.replace(c, agents=agents, max_agents=max(agents, share(c.max_agents)),
                                   seed=c.seed + 1000 * rank, devices=1, num_nodes=1)

    def transfer_batch_to_device(self, batch: dict, device: torch.device, dataloader_idx: int) -> dict:
        """Copy what :meth:`training_step` reads (``obs``, ``action``, ``ret``) to ``device``, non-blocking
        from the trainers' pinned memory on CUDA; ``version`` and the host numbers stay on the host. In
        graph mode nothing moves here: :meth:`training_step` copies the pinned tensors straight into the
        graph's static inputs. With ``max_policy_lag``, ``version`` is also copied, as ``lag_version``."""
        if self._graph_mode:
            return batch
        non_blocking = device.type == "cuda"
        out = {key: value.to(device, non_blocking=non_blocking) if key in self._device_keys else value
               for key, value in batch.items()}
        if self.cfg.max_policy_lag is not None:
            out["lag_version"] = batch["version"].to(device, non_blocking=non_blocking)
        return out

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        """Eager: the loss (Lightning's automatic optimization does backward, clip and step). Graph mode:
        the whole update as one replay; returns its detached loss (0-d float32, reused by every replay)."""
        self._lag = self.policy_version - batch["version_mean"]  # host float: no device read
        version = batch.get("version")  # host int64 tensor: each transition's lag, for the lag's quantiles
        self._lags = None if version is None else self.policy_version - version.numpy()
        c = self.cfg
        if c.max_policy_lag is not None and self._lags is not None:  # the device's weights, counted on the host
            w = lag_weights(torch.from_numpy(self._lags), c.max_policy_lag, c.lag_policy).numpy()  # [N] host
            self._lag_counts = (int(np.count_nonzero(w == 0)), int(np.count_nonzero((w > 0) & (w < 1))))
        if self._graph_mode:
            return self._graph_update(batch)
        return self._loss_and_metrics(batch)

    def _loss_and_metrics(self, b: dict[str, Tensor]) -> Tensor:
        """Forward and A3C loss of ``b`` (``obs``, ``action``, ``ret`` on the device; with ``vtrace`` its
        targets from the V-trace keys instead of ``ret``), its step metrics folded into :attr:`metrics` in
        place; the 0-d loss, attached to the graph of ``net``."""
        c = self.cfg
        if not c.vtrace:
            h = self.net.features(b["obs"])  # [N, H]
            logits, value = self.net.heads(h)  # [N, A], [N]
            ret, advantage = b["ret"], None
        else:
            logits, value, ret, advantage, h = self._vtrace_forward(b)
        weight = (None if c.max_policy_lag is None else  # [N]: 0 for a transition beyond the lag bound
                  lag_weights(self.lag_clock - b["lag_version"], c.max_policy_lag, c.lag_policy))
        if c.normalize_advantage:
            advantage = normalize_advantage(ret - value.detach() if advantage is None else advantage, weight)  # [N]
        common = dict(beta=self.beta_now, value_coef=c.value_coef, log_epsilon=c.log_epsilon,
                      reduction=c.loss_reduction, weight=weight)
        if c.loss == "appo":
            log_target = None
            if self.target_net is not None:
                with torch.no_grad():
                    target_logits, _ = self.target_net(b["obs"])  # [N, A]
                log_target = torch.log_softmax(target_logits.float(), dim=-1).gather(
                    1, b["action"].unsqueeze(1)).squeeze(1)  # [N]
            loss, parts = appo_loss(logits, value, b["action"], ret, advantage, b["log_prob"], clip=c.ppo_clip,
                                    log_target=log_target, **common)
        else:
            loss, parts = a3c_loss(logits, value, b["action"], ret, advantage=advantage, **common)
        # one stack + 2 in-place adds (not ~3 launches per metric); batch_size and policy_lag are host
        # numbers, folded in once an epoch from self.stats (HostBookkeeping.publish)
        names = _APPO_METRICS if c.loss == "appo" else _STEP_METRICS
        parts = dict(parts, dead_unit_frac=dead_unit_fraction(h.detach()))
        values = torch.stack([loss.detach(), *(parts[k] for k in names[1:])])  # [6] or [7]
        self.metrics.add_vector(names, values)
        return loss

    def _vtrace_forward(self, b: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """One forward of the batch's observations and its rollouts' s_T; V-trace's targets and advantages
        from them (:func:`~lightning_per.ga3c.loss.vtrace_targets`). Rows are whole rollouts, time-major:
        ``obs`` (R*T*E, ...), ``next_obs`` (R*E, ...). Returns logits (N, A), V (N,), v_s (N,), advantages (N,)
        and the features of the N observations (N, H)."""
        c = self.cfg
        n, e = b["obs"].shape[0], c.envs_per_agent
        h = self.net.features(torch.cat([b["obs"], b["next_obs"]]))  # [N + R*E, H]
        logits, value = self.net.heads(h)  # [N + R*E, A], [N + R*E]
        logits, value, bootstrap = logits[:n], value[:n], value[n:]
        log_pi = torch.log_softmax(logits.detach().float(), dim=-1).gather(1, b["action"].unsqueeze(1))  # [N, 1]

        def rollouts(t: Tensor) -> Tensor:
            return t.reshape(-1, c.t_max, e)  # [R, T, E]

        v, advantage = vtrace_targets(rollouts(log_pi), rollouts(b["log_prob"]), rollouts(value),
                                      bootstrap.reshape(-1, e), rollouts(b["reward"]), rollouts(b["terminated"]),
                                      rollouts(b["truncated"]), c.gamma, self.vtrace_clips[0], self.vtrace_clips[1])
        return logits, value, v.reshape(n), advantage.reshape(n), h[:n]

    def _graph_update(self, batch: dict) -> Tensor:
        """Graph mode: copy the pinned tensors the update reads (``obs``, ``action``, ``ret``; with ``vtrace``
        ``obs``, ``action`` and the V-trace keys) into the static inputs (non-blocking, current stream) and
        replay the captured update; the first call captures it.

        Raises:
            ValueError: the batch has another number of transitions than the captured one (a copy would
                broadcast a single row).
        """
        opt = self.optimizers()
        inputs = {key: batch[key] for key in self._device_keys}  # pinned host tensors
        if self.cfg.max_policy_lag is not None:
            inputs["lag_version"] = batch["version"]
        if self._captured is None:
            self._captured = self._capture(opt.optimizer)
        out = self._captured(inputs)
        count_optimizer_step(opt)
        return out["loss"]

    def _capture(self, optimizer: torch.optim.Optimizer) -> CapturedStep:
        """The capture of forward -> loss -> backward -> clip -> ``optimizer`` step -> metrics (see the module
        docstring); its first call, with a batch's tensors, fixes the static inputs' shapes."""
        clip, params = self.cfg.grad_clip, list(self.parameters())

        def update(b: dict[str, Tensor]) -> dict[str, Tensor]:
            optimizer.zero_grad(set_to_none=True)  # a fresh gradient each update (in the graph: in its pool)
            loss = self._loss_and_metrics(b)
            loss.backward()
            if clip is not None:  # no host read (error_if_nonfinite=False)
                torch.nn.utils.clip_grad_norm_(params, clip, foreach=True)
            optimizer.step()
            return {"loss": loss.detach()}

        if isinstance(optimizer, RMSpropTF):
            optimizer.init_state()  # its square average starts at 1: part of the snapshot, not zeroed
        # predictor and trainer threads use the device meanwhile: thread-local capture errors, and no sync
        # check (torch's sync debug mode is process-wide: their host reads would be taken for the update's)
        captured = capture(update, state=[optimizer, self.metrics.values, self.metrics.counts],
                           capture_error_mode="thread_local", check_syncs=False)
        self.graph_captures += 1
        return captured

    def on_train_epoch_start(self) -> None:
        self.bookkeeping.begin_epoch()  # the epoch's metrics window begins where the last one was published

    def on_train_batch_end(self, outputs: Any, batch: dict, batch_idx: int) -> None:
        self.policy_version += 1
        if self.cfg.max_policy_lag is not None:
            self.lag_clock.add_(1)  # in step with policy_version, on the device (graph mode: outside the graph)
        self._follow_schedules()
        self.stats.add_update(batch["size"], self._lag, self._lags, *self._lag_counts)
        c = self.cfg
        world_size = self.trainer.world_size
        if world_size > 1 and c.target_return is not None and batch_idx == c.updates_per_epoch - 1:
            self._check_target_across_ranks(world_size)
        episodes = self.stats.episodes
        if (world_size == 1 and c.target_return is not None and self.time_to_target_s is None
                and episodes != self._target_checked):  # only when episodes ended since the last check
            self._target_checked = episodes
            recent = self.stats.recent_returns(c.return_window)
            if len(recent) >= c.return_window and sum(recent) / len(recent) >= c.target_return:
                self.time_to_target_s = time.monotonic() - self.stats.t0
                log.info("mean return of the last %d episodes reached %.2f after %.1f s and %d updates so far: "
                         "stopping", c.return_window, sum(recent) / len(recent), self.time_to_target_s,
                         self.policy_version)
                self.request_stop("target_return")
        if 0 < c.max_updates <= self.policy_version:
            self.request_stop("max_updates")
        if c.max_env_steps is not None and self.stats.snapshot().steps >= c.max_env_steps:  # host counters
            self.request_stop("max_env_steps")
        if batch_idx == c.updates_per_epoch - 1 or self.trainer.should_stop:
            self.bookkeeping.publish(self.system, self.episode_buffers)

    def _follow_schedules(self) -> None:
        """After ``policy_version`` updates: the entropy weight of the schedule (``beta_final``), filled into
        :attr:`beta_now` from a host float (no read), and APPO's target network refreshed every
        ``appo_target_update`` updates (in place: graph mode's capture reads the same tensors)."""
        c, u = self.cfg, self.policy_version
        if c.beta_final is not None:
            self.beta_now.fill_(linear_schedule(c.beta, c.beta_final, c.anneal_updates, u))
        if self.target_net is not None and u % c.appo_target_update == 0:
            self.target_net.load_state_dict(self.net.state_dict())  # copies into the same tensors

    def _check_target_across_ranks(self, world_size: int) -> None:
        """DDP: stop when the mean over ranks of each rank's last-``return_window`` mean return reaches
        ``target_return``. Every rank takes the decision at the same step (a rank that stopped alone would
        hang the others in the next all-reduce); one small all-reduce per epoch."""
        c = self.cfg
        recent = self.stats.recent_returns(c.return_window)
        ok = len(recent) >= c.return_window
        local = torch.tensor([sum(recent) / len(recent) if ok else 0.0, float(ok)], dtype=torch.float64,
                             device=self.device)
        total = self.trainer.strategy.reduce(local, reduce_op="sum").tolist()  # sync-ok: once per epoch
        mean = total[0] / world_size
        if total[1] == world_size and mean >= c.target_return and self.time_to_target_s is None:
            self.time_to_target_s = time.monotonic() - self.stats.t0
            log.info("mean return over %d ranks reached %.2f after %.1f s and %d updates so far: stopping",
                     world_size, mean, self.time_to_target_s, self.policy_version)
            self.request_stop("target_return")

    def request_stop(self, reason: str) -> None:
        """Ask the Trainer to stop; the first ``reason`` given and its time are the summary's
        ``stop_reason`` and ``stopped_at_s``."""
        if self._stop_reason is None:
            self._stop_reason, self._stop_time = reason, time.monotonic()
            if reason == "max_time_s":
                log.info("max_time_s=%g s reached %.1f s after the GA3C system started, %d updates so far: stopping",
                         self.cfg.max_time_s, self._stop_time - self.stats.t0, self.policy_version)
        self.trainer.should_stop = True

    def on_train_end(self) -> None:
        # Before Lightning's strategy teardown, which moves the model back to the CPU while
        # predictor threads would still be using it (on_fit_end comes after that).
        if self._stop_reason is None and self.system is not None:
            now = time.monotonic()  # stopped by Lightning's Timer (its max_time, checked at batch ends)
            if now - self.stats.t0 >= self.cfg.max_time_s:
                self._stop_reason, self._stop_time = "max_time_s", now
        world_size = self.trainer.world_size
        totals = None
        if world_size > 1 and self.system is not None:  # every rank ends here after the same step
            snap = self.stats.snapshot()
            local = torch.tensor([snap.steps, snap.predictions, snap.episodes], dtype=torch.float64,
                                 device=self.device)
            totals = self.trainer.strategy.reduce(local, reduce_op="sum").tolist()  # sync-ok: end of training
        self.shutdown()
        if totals is not None:
            wall = max(self.system_summary.get("wall_time_s") or 1e-9, 1e-9)
            self.system_summary.update(
                world_size=world_size, env_steps_total=int(totals[0]), predictions_total=int(totals[1]),
                episodes_total=int(totals[2]), steps_per_s_total=totals[0] / wall,
                pps_total=totals[1] / wall, fps_total=totals[0] * self.cfg.frame_skip / wall)

    def on_fit_end(self) -> None:
        self.shutdown()

    def teardown(self, stage: str) -> None:
        self.shutdown()
        if self._captured is not None:  # after the predictors stopped
            self._captured.release()
            self._captured = None

    def shutdown(self) -> None:
        """Stop agents, predictors and trainers (within 5 s) and record the run's host summary. Idempotent."""
        if self.system is None:
            return
        system, self.system = self.system, None
        counts = system.counts()
        t_close = time.monotonic()
        system.close()
        self.system_summary, self.episode_rows = self.bookkeeping.summarise(
            system, counts.as_tuple(), t_close, self._stop_reason, self._stop_time, self.time_to_target_s)
        if system.error is not None:
            raise RuntimeError(f"GA3C system failed: {system.error}") from system.error
