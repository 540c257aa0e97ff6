"""GA3C configuration: one typed, documented, validated dataclass, read from YAML under ``model:``.

The dataclass is the source of the ``lightning-per ga3c`` command's ``--model.*`` options (LightningCLI, as
``lightning-per fit``: :class:`lightning_per.cli.GA3CCLI`) and of the ``model:`` section of its config files: a
new field is a new option. A GA3C run configures processes, threads, queues and shared memory as much as the
LightningModule, and the Trainer's budget and devices follow from these fields
(:func:`lightning_per.ga3c.cli.trainer_settings`). Every knob is named, typed, documented (the attribute docstrings
below) and validated in one place; jsonargparse, the parser under LightningCLI, reads the YAML
(:func:`config_parser`), so YAML, command line and code cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from lightning_per.utils import MAX_SEED

__all__ = ["GA3CConfig", "load_config", "config_parser", "parse_args", "field_docs", "UnknownOption"]

_OPTIMIZERS = ("rmsprop_tf", "rmsprop", "adam")
_NETWORKS = ("auto", "mlp", "conv", "minatar")
_BACKENDS = ("gym", "ale_vector")
_REDUCTIONS = ("mean", "sum")
_DEVICES = ("auto", "cpu", "cuda")
_WANDB = ("auto", "disabled", "offline", "online")
_LAG_POLICIES = ("drop", "downweight")
_LOSSES = ("a3c", "appo")


@dataclass
class GA3CConfig:
    """Every knob of a GA3C run (Babaeizadeh et al., ICLR 2017, arXiv:1611.06256).

    Paper names: NA = ``agents``, NP = ``predictors``, NT = ``trainers`` (section 4.1), t_max =
    ``t_max`` (section 3.2), beta = ``beta`` (entropy weight, eq. of section 3.2).

    Raises (from :meth:`validate`, called by :func:`load_config` and :class:`~lightning_per.ga3c.GA3C`):
        ValueError: a value out of range; the message names the field and the allowed range.
    """

    # --- environment -----------------------------------------------------------------------------
    env: str = "CartPole-v1"
    """Gymnasium id (``ALE/Pong-v5``; ``module:Id`` imports the module first)."""
    env_backend: str = "gym"
    """``gym``: ``envs_per_agent`` ``gym.make`` envs stepped in turn (Atari ids get AtariPreprocessing +
    frame stack); ``ale_vector``: ale-py's C++ vector env (grayscale/resize/stack natively)."""
    env_kwargs: dict = field(default_factory=dict)
    """Extra keyword arguments for ``gym.make`` / ``AtariVectorEnv`` (e.g. ``frameskip: 4``); with the
    ``gym`` backend and an ``ALE/`` id, ``frameskip`` and ``noop_max`` go to AtariPreprocessing and
    ``num_threads`` / ``thread_affinity_offset`` are ignored, so one Atari config runs on both backends."""
    frame_skip: int = 1
    """Frames per agent step, only for reporting FPS = steps/s x frame_skip (paper section 4.2)."""
    atari_frame_stack: int = 4
    """Frames stacked per Atari observation (84x84 grayscale each)."""
    envs_per_agent: int = 1
    """Environments stepped in lockstep by one agent process (one prediction request carries all)."""

    # --- GA3C system (section 4.1) ---------------------------------------------------------------
    agents: int = 4
    """NA: initial number of agent processes."""
    predictors: int = 1
    """NP: initial number of predictor threads."""
    trainers: int = 1
    """NT: initial number of trainer threads (they assemble batches; see module.py)."""
    max_agents: int = 16
    """Upper bound of NA (shared memory is sized for it; also the dynamic adjustment's bound)."""
    max_predictors: int = 4
    """Upper bound of NP under dynamic adjustment."""
    max_trainers: int = 4
    """Upper bound of NT under dynamic adjustment."""
    rollout_slots: int = 2
    """Rollout buffers per agent (>= 2: one being filled, one awaiting its bootstrap value). More
    slots let an agent run ahead of the trainers, i.e. more policy lag."""
    predict_batch_size: int = 128
    """Most prediction requests (agents) merged into one forward pass."""
    train_min_batch_size: int = 40
    """Transitions merged by a trainer before a batch is handed to ``training_step`` (maintainers
    of NVlabs/GA3C recommend 20-40)."""
    train_max_batch_size: int | None = None
    """Whole-round batching (Sample Factory's synchronous mode, its ``batch_size`` taken whole): None: a trainer hands
    over a batch as soon as it holds ``train_min_batch_size`` transitions (GA3C); an int (>= ``train_min_batch_size``):
    it claims every finished rollout ready at that moment, up to this many transitions (rounded down to whole
    rollouts, at least as many as the minimum needs), so one update trains on a whole round of the agents and
    rollouts wait less in the queue (less policy lag, fewer updates per env step). Batches then vary in size, which
    graph mode (``cuda_graph``) cannot replay: the two are refused together."""
    batch_queue_size: int = 2
    """Assembled batches waiting for ``training_step`` (back-pressure on trainers and agents)."""
    agent_stall_timeout_s: float = 30.0
    """Seconds (>= 1) an agent's heartbeat may stand still before the agent is taken as stopped or hung
    (SIGSTOP, a debugger, an environment step that never returns): it is reported in one line with its pid,
    killed and replaced like an agent that died. A running agent beats at every step and every 0.1 s it waits
    for a prediction or a free rollout slot, so only a step (or episode reset) this long, or the agent
    process getting no CPU this long, looks like a stall. Agents still starting (importing, making and
    resetting their environments) are not watched."""

    # --- returns and loss (section 3.2) ----------------------------------------------------------
    t_max: int = 5
    """Steps per rollout; returns are n-step, bootstrapped from V at the rollout end."""
    gamma: float = 0.99
    """Discount factor, in (0, 1]."""
    reward_clip: float | None = None
    """Rewards used for training are clipped to [-reward_clip, reward_clip]; None: no clipping.
    Reported episode returns are always unclipped."""
    beta: float = 0.01
    """Entropy bonus weight (beta)."""
    value_coef: float = 1.0
    """Weight of the value loss 0.5 (R - V)^2 (the reference weighs both losses 1)."""
    log_epsilon: float = 1e-6
    """LOG_EPSILON: probabilities are clamped to >= this inside the log (policy lag underflow)."""
    loss_reduction: str = "mean"
    """``mean`` over the batch, or ``sum`` as the reference."""
    updates_per_batch: int = 1
    """Optimizer steps on each training batch (>= 1), one after the other. More than 1 reuses each batch while
    the agents collect the next, when the learner would otherwise wait for data: the later steps are
    off-policy, which ``vtrace`` corrects (IMPALA section 4.2; PPO's epochs over a batch do the same with a
    clipped ratio)."""
    vtrace: bool = False
    """Correct for policy lag with V-trace (Espeholt et al. 2018, IMPALA, eq. 1 and section 4.2): the
    value targets and policy-gradient advantages are recomputed at each update from the learner's own V,
    with importance weights pi/mu of the learner's policy pi over the predictor's mu that acted, truncated at
    ``vtrace_rho_clip`` and ``vtrace_c_clip``. Off: the agents' n-step returns, as in GA3C."""
    vtrace_rho_clip: float = 1.0
    """V-trace's rho-bar (> 0): the truncation of the importance weight in the TD errors and the advantage."""
    vtrace_c_clip: float = 1.0
    """V-trace's c-bar (> 0): the truncation of the trace coefficients (<= rho-bar in the paper)."""
    max_policy_lag: int | None = None
    """Bound on the policy lag (int >= 1, in learner updates) of a transition that reaches a gradient; None: no
    bound. A transition's lag is the number of optimizer steps between the prediction that chose its action
    (the policy version stamped on it) and the update that trains on it; it is measured again at every update
    (a batch reused by ``updates_per_batch`` ages by one each time). Transitions beyond the bound are treated
    by ``lag_policy`` through a weight multiplied into the loss on the device (no host synchronisation; graph
    mode captures it). Sample Factory drops samples older than its ``max_policy_lag`` and advises 20-30 SGD
    steps or less; the status line, the epoch metrics and ``summary.json`` report the lag's p50/p95/max and
    the dropped fraction, which say whether the bound bites."""
    lag_policy: str = "drop"
    """What a transition older than ``max_policy_lag`` = L gets: ``drop`` (weight 0, as Sample Factory does) or
    ``downweight`` (ours: weight w = clip(2 - lag / L, 0, 1), 1 up to L, falling linearly to 0 at 2L, so
    nothing older than 2L is trained on). The loss's ``mean`` is over the transitions of weight > 0."""
    loss: str = "a3c"
    """The learner's loss: ``a3c`` (GA3C section 3.2: -log pi(a|s) A, with V-trace's advantage when ``vtrace``)
    or ``appo`` (APPO as in RLlib / Sample Factory: PPO's clipped importance ratio, PPO eq. 7, over V-trace
    targets and advantages, IMPALA eq. 1; needs ``vtrace: true``; see :func:`~lightning_per.ga3c.loss.appo_loss`)."""
    ppo_clip: float = 0.2
    """PPO's epsilon (``loss: appo``), in (0, 1): the ratio pi/mu is clipped to [1 - eps, 1 + eps] (PPO eq. 7)."""
    appo_target_update: int | None = None
    """``loss: appo``: a target network, a copy of the learner's network refreshed every this many updates (int >=
    1), is the baseline of the behaviour ratio, r = clip(mu / pi_target, 0, 2) pi / mu (RLlib's APPO); None: no
    target network, r = pi / mu (Sample Factory's)."""
    normalize_advantage: bool = False
    """Shift and scale each batch's advantages to mean 0, std 1 (over the transitions the lag bound keeps) before
    the policy term, as PPO implementations and Sample Factory do; both losses."""

    # --- network and optimiser -------------------------------------------------------------------
    network: str = "auto"
    """``mlp`` for vector observations, ``conv`` for the A3C Atari net on (C, H, H) frame stacks, ``minatar`` for the
    MinAtar paper's net on (H, H, C) frames; ``auto`` picks by shape (``lightning_per.ga3c.networks.make_network``)."""
    hidden_sizes: list = field(default_factory=lambda: [128, 128])
    """MLP hidden layer widths."""
    obs_center_steps: int = 0
    """Center the network's input: before training, take this many observations of uniformly random play in each of
    ``envs_per_agent`` envs (the reset's and those of N - 1 random steps, seeded by ``seed``) and subtract their
    mean from every observation, in the predictors and the update alike (the network's ``obs_loc``; TorchRL's
    ``ObservationNorm`` location from ``init_stats``). 0: no centering. On Pong the A3C net's FC units see two
    frames 99.5-99.7% alike (mean cosine) and live or die together; centered with 128, 51-56% (docs/ga3c.md,
    "Dead units")."""
    optimizer: str = "rmsprop_tf"
    """``rmsprop_tf`` (TF semantics: eps inside the sqrt, square average starts at 1), ``rmsprop``
    (torch), ``adam``."""
    lr: float = 3e-4
    """Learning rate."""
    rmsprop_alpha: float = 0.99
    """RMSProp decay of the square average."""
    rmsprop_eps: float = 0.1
    """RMSProp epsilon (GA3C uses 0.1)."""
    adam_eps: float = 1e-8
    """Adam's epsilon (``optimizer: adam``; PPO implementations often take 1e-5)."""
    adam_betas: list = field(default_factory=lambda: [0.9, 0.999])
    """Adam's (beta1, beta2), each in [0, 1) (``optimizer: adam``). ``[0.0, alpha]`` is RMSProp with a bias-corrected
    square average: no momentum, each step lr g / (sqrt(v / (1 - alpha^t)) + eps) (Kingma & Ba 2015, algorithm 1),
    where torch's ``rmsprop`` divides by sqrt(v) + eps with v started at 0, so its first step is about
    lr / sqrt(1 - alpha) per weight (10 lr at alpha 0.99)."""
    anneal_updates: int | None = None
    """Updates (int >= 1) over which ``lr`` falls linearly to ``lr_final`` and ``beta`` to ``beta_final`` (each
    then stays there); None: both constant. The learning rate goes through torch's ``LambdaLR`` stepped every
    update; graph mode (``cuda_graph``) bakes the rate into its capture, so ``lr_final`` is refused there."""
    lr_final: float | None = None
    """Learning rate reached after ``anneal_updates`` (>= 0); None: ``lr`` throughout."""
    beta_final: float | None = None
    """Entropy weight reached after ``anneal_updates`` (>= 0); None: ``beta`` throughout (an entropy schedule)."""
    grad_clip: float | None = None
    """Gradient norm clip (Lightning ``gradient_clip_val``); None: off, as in the paper."""
    cuda_graph: bool = False
    """Graph mode: capture the whole training update (forward, loss, backward, gradient clip, optimizer
    step, step metrics) in one CUDA graph at the first update and replay it for every later one, after
    copying each batch into the graph's static device inputs: one replay instead of ~100 kernel launches.
    Only with one CUDA device (``devices: 1``); on the CPU or under DDP the run trains eagerly and logs one
    line saying so, so one config serves both machines (see ``lightning_per/ga3c/module.py``)."""

    # --- dynamic adjustment (section 4.2) --------------------------------------------------------
    dynamic_adjustment: bool = False
    """Random-walk (NA, NP, NT) and keep a change only if TPS did not drop (within ``adjust_max_lag_p95``)."""
    adjust_warmup_s: float = 10.0
    """Seconds before the first adjustment."""
    adjust_window_s: float = 20.0
    """Seconds each configuration is measured for."""
    adjust_max_lag_p95: float | None = None
    """Lag-aware adjustment: bound (> 0, in updates) on the p95 policy lag of a measurement window; the adjustment
    then maximises TPS subject to p95 lag <= this bound (a configuration over it is reverted, one back within it
    kept; each decision and its reason is logged). None: TPS alone, as the paper (which section 4.4 warns raises
    the lag)."""

    # --- run length and outputs ------------------------------------------------------------------
    updates_per_epoch: int = 200
    """Optimizer steps per Lightning epoch (metrics are logged once an epoch)."""
    max_time_s: float = 180.0
    """Wall-clock budget of training in seconds, counted from when ``Trainer.fit`` starts the GA3C system
    (agents, predictors, trainers), after the imports and the environment probe; the status line's
    ``[Time]`` runs on the same clock. Training stops at the first batch after it, or at it while no
    batch comes (single process); the shutdown follows (summary's ``shutdown_s``, at most 5 s)."""
    max_updates: int = -1
    """Optimizer steps budget (-1: unlimited)."""
    max_env_steps: int | None = None
    """Environment steps budget (an int >= 1; None: unlimited), as the DQN's ``max_env_steps``: training stops at
    the first update after the trainers have received this many env steps (agent steps x envs, the summary's
    ``env_steps``; stop reason ``max_env_steps``), so runs of different throughput compare at the same
    experience. One process only (refused with ``devices`` x ``num_nodes`` > 1, whose ranks count their own)."""
    target_return: float | None = None
    """Stop once the mean of the last ``return_window`` episode returns reaches it; None: never."""
    return_window: int = 20
    """Episodes averaged for ``mean_return``."""
    device: str = "auto"
    """Model device for predictors and training: ``auto`` (cuda if available), ``cpu``, ``cuda``."""
    devices: int = 1
    """Learner processes (GPUs, or CPU processes with ``device: cpu``). Above 1 the run uses Lightning's
    DDP: every rank runs its own GA3C system (predictors, trainers, agent processes), ``agents`` and
    ``max_agents`` are split across the ranks, env seeds are offset by 1000 x rank, and DDP all-reduces
    the gradients of each update (every rank takes the same number of optimizer steps)."""
    num_nodes: int = 1
    """Machines (Lightning's ``Trainer(num_nodes=...)``), each running ``devices`` learner processes; above one
    node every process is started by the cluster's launcher with Lightning's environment (``NODE_RANK``,
    ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), and the ``devices * num_nodes`` ranks split the agents
    as above (by global rank). Rank 0 writes the run's files."""
    torch_threads: int = 1
    """``torch.set_num_threads`` of the learner process (predictor/trainer/learner threads)."""
    seed: int = 0
    """Seed of the network init, the agents' environments and the adjustment's random walk."""
    run_dir: str = "runs/ga3c"
    """Parent directory; each run writes to ``run_dir/<name>-<timestamp>/``."""
    run_name: str = "ga3c"
    """Run name (directory prefix, W&B name)."""
    wandb_mode: str = "auto"
    """W&B logging: ``auto`` (offline without W&B credentials, online with them: ``lightning-per fit``'s default
    logger, :class:`~lightning_per.callbacks.AutoModeWandbLogger`), ``offline``, ``online`` or ``disabled``."""
    wandb_project: str = "lightning_per"
    """W&B project."""
    status_interval_s: float = 5.0
    """Seconds between console status lines (0: none)."""

    def validate(self) -> GA3CConfig:
        """Check every field; returns self. Raises ValueError naming the field and the allowed range."""
        for name in ("frame_skip", "atari_frame_stack", "envs_per_agent", "agents", "predictors",
                     "trainers", "max_agents", "max_predictors", "max_trainers", "predict_batch_size",
                     "train_min_batch_size", "batch_queue_size", "t_max", "updates_per_epoch", "updates_per_batch",
                     "torch_threads", "return_window"):
            _check_int(self, name, low=1)
        _check_int(self, "rollout_slots", low=2)
        _check_int(self, "devices", low=1)
        _check_int(self, "num_nodes", low=1)
        if self.agents < self.devices * self.num_nodes:
            raise ValueError(f"agents={self.agents} must be >= devices x num_nodes={self.devices * self.num_nodes} "
                             "(agents are split across the DDP ranks)")
        _check_int(self, "max_updates", low=-1)
        steps = self.max_env_steps
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise ValueError(f"max_env_steps must be an int >= 1 (env steps) or null (no budget), got {steps!r}")
        if self.max_env_steps is not None and self.devices * self.num_nodes > 1:
            raise ValueError(f"max_env_steps={self.max_env_steps} needs one process, got devices x num_nodes="
                             f"{self.devices * self.num_nodes} (each rank counts its own env steps; use max_updates)")
        _check_int(self, "seed", low=0)
        if self.seed > MAX_SEED:  # env seeds add 1000 x rank and the agent's index
            raise ValueError(f"seed must be an int in [0, {MAX_SEED}], got {self.seed}")
        for count, bound in (("agents", "max_agents"), ("predictors", "max_predictors"),
                             ("trainers", "max_trainers")):
            if getattr(self, count) > getattr(self, bound):
                raise ValueError(f"{count}={getattr(self, count)} must be <= {bound}={getattr(self, bound)}")
        _check_float(self, "gamma", low=0.0, high=1.0, low_open=True)
        _check_float(self, "beta", low=0.0)
        _check_float(self, "value_coef", low=0.0)
        _check_float(self, "log_epsilon", low=0.0, high=0.5, low_open=True)
        _check_float(self, "lr", low=0.0, low_open=True)
        _check_float(self, "rmsprop_alpha", low=0.0, high=1.0, high_open=True)
        _check_float(self, "rmsprop_eps", low=0.0, low_open=True)
        _check_float(self, "adjust_warmup_s", low=0.0)
        _check_float(self, "adjust_window_s", low=0.0, low_open=True)
        if self.adjust_max_lag_p95 is not None:
            _check_float(self, "adjust_max_lag_p95", low=0.0, low_open=True)
        _check_float(self, "max_time_s", low=0.0, low_open=True)
        _check_float(self, "agent_stall_timeout_s", low=1.0)
        _check_float(self, "status_interval_s", low=0.0)
        for name in ("reward_clip", "grad_clip"):
            if getattr(self, name) is not None:
                _check_float(self, name, low=0.0, low_open=True)
        if self.target_return is not None:
            _check_float(self, "target_return")
        for name in ("cuda_graph", "vtrace", "normalize_advantage"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        _check_float(self, "vtrace_rho_clip", low=0.0, low_open=True)
        _check_float(self, "vtrace_c_clip", low=0.0, low_open=True)
        if self.train_max_batch_size is not None:
            value = self.train_max_batch_size
            if isinstance(value, bool) or not isinstance(value, int) or value < self.train_min_batch_size:
                raise ValueError(f"train_max_batch_size must be an int >= train_min_batch_size="
                                 f"{self.train_min_batch_size} or null (no whole-round batching), got {value!r}")
            if self.cuda_graph:
                raise ValueError("train_max_batch_size (whole-round batches of varying size) cannot be used with "
                                 "cuda_graph: true (a captured update replays one batch size); set one of them off")
        _check_float(self, "ppo_clip", low=0.0, high=1.0, low_open=True, high_open=True)
        _check_float(self, "adam_eps", low=0.0, low_open=True)
        betas = self.adam_betas
        if (not isinstance(betas, (list, tuple)) or len(betas) != 2
                or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0.0 <= b < 1.0 for b in betas)):
            raise ValueError(f"adam_betas must be two numbers in [0, 1), [beta1, beta2], got {betas!r}")
        if self.optimizer != "adam" and [float(b) for b in betas] != [0.9, 0.999]:
            raise ValueError(f"adam_betas={list(betas)!r} is an option of optimizer: adam (optimizer is "
                             f"{self.optimizer!r}); set optimizer: adam, or leave adam_betas at its default")
        if self.loss == "appo" and not self.vtrace:
            raise ValueError("loss='appo' needs vtrace: true (its targets and advantages are V-trace's)")
        if self.appo_target_update is not None:
            if self.loss != "appo":
                raise ValueError(f"appo_target_update={self.appo_target_update!r} is an option of loss: appo "
                                 f"(loss is {self.loss!r}); set it to null")
            _check_int(self, "appo_target_update", low=1)
        for name in ("lr_final", "beta_final"):
            if getattr(self, name) is not None:
                _check_float(self, name, low=0.0)
        if self.anneal_updates is not None:
            _check_int(self, "anneal_updates", low=1)
        elif self.lr_final is not None or self.beta_final is not None:
            raise ValueError("lr_final / beta_final need anneal_updates (the updates to reach them over), got null")
        if self.max_policy_lag is not None:
            value = self.max_policy_lag
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"max_policy_lag must be an int >= 1 (updates) or null (no bound), got {value!r}")
        for name, allowed in (("optimizer", _OPTIMIZERS), ("network", _NETWORKS),
                              ("env_backend", _BACKENDS), ("loss_reduction", _REDUCTIONS),
                              ("device", _DEVICES), ("wandb_mode", _WANDB), ("lag_policy", _LAG_POLICIES),
                              ("loss", _LOSSES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not isinstance(self.env, str) or not self.env:
            raise ValueError(f"env must be a non-empty Gymnasium id, got {self.env!r}")
        if not isinstance(self.env_kwargs, dict):
            raise ValueError(f"env_kwargs must be a mapping, got {type(self.env_kwargs).__name__}")
        if isinstance(self.obs_center_steps, bool) or not isinstance(self.obs_center_steps, int) \
                or self.obs_center_steps < 0:
            raise ValueError(f"obs_center_steps must be an int >= 0 (0: no centering), got {self.obs_center_steps!r}")
        if (not isinstance(self.hidden_sizes, (list, tuple)) or not self.hidden_sizes
                or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 1
                           for h in self.hidden_sizes)):
            raise ValueError(f"hidden_sizes must be a non-empty list of ints >= 1, got {self.hidden_sizes!r}")
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain mapping of every field (logged as hyper-parameters)."""
        return dataclasses.asdict(self)


def _check_int(cfg: GA3CConfig, name: str, low: int) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def _check_float(cfg: GA3CConfig, name: str, low: float = -math.inf, high: float = math.inf,
                 low_open: bool = False, high_open: bool = False) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    below = value <= low if low_open else value < low
    above = value >= high if high_open else value > high
    if below or above:
        lo, hi = "(" if low_open else "[", ")" if high_open else "]"
        span = (f"{'>' if low_open else '>='} {low}" if high == math.inf else
                f"{'<' if high_open else '<='} {high}" if low == -math.inf else f"in {lo}{low}, {high}{hi}")
        raise ValueError(f"{name} must be {span}, got {value!r}")


def config_parser(**kwargs: Any):
    """The jsonargparse parser of :class:`GA3CConfig` in the config files' layout (:func:`load_config`'s):
    ``--config FILE`` (jsonargparse's ``ActionConfigFile``: YAML, later options override earlier ones) and
    one typed ``--model.<field>`` per field, its help the field's attribute docstring; a file's ``trainer:``
    section (Trainer settings, :class:`lightning_per.cli.GA3CCLI`'s) is read as a mapping and not checked here.
    Values are YAML (``--model.reward_clip null``, ``--model.hidden_sizes [64,64]``). It raises
    ``argparse.ArgumentError`` instead of exiting; :func:`parse_args` turns that into a ``ValueError``.

    Args:
        **kwargs: for ``jsonargparse.ArgumentParser`` (``prog``, ``description``...).

    Example::

        >>> from lightning_per.ga3c.config import config_parser, parse_args
        >>> cfg = parse_args(config_parser(), ["--model.agents", "2", "--model.reward_clip", "null"])
        >>> cfg.agents, cfg.reward_clip
        (2, None)
    """
    from jsonargparse import ActionConfigFile, ArgumentParser, set_parsing_settings

    class _ConfigFile(ActionConfigFile):
        """``--config``: a missing file is named in one line (jsonargparse's own message gives the absolute
        path of whatever it tried)."""

        def __call__(self, parser, cfg, values, option_string=None):
            if isinstance(values, (str, Path)) and not Path(values).is_file():
                raise ValueError(f"config file {str(values)!r} not found")
            return super().__call__(parser, cfg, values, option_string)

    set_parsing_settings(docstring_parse_attribute_docstrings=True)  # the fields' docstrings become the help
    parser = ArgumentParser(exit_on_error=False, allow_abbrev=False, **kwargs)
    parser.add_argument("--config", action=_ConfigFile, help="YAML file: GA3CConfig fields under model:")
    parser.add_class_arguments(GA3CConfig, "model")
    parser.add_argument("--trainer", type=dict | None, default=None, help="Trainer settings (lightning-per ga3c's)")
    parser.add_argument("--seed_everything", type=bool | int, default=False, help="lightning-per ga3c's")
    return parser


class UnknownOption(ValueError):
    """A command-line option or config key that is no field of :class:`GA3CConfig`."""


def parse_args(parser, argv: list[str], overrides: dict[str, Any] | None = None) -> GA3CConfig:
    """Parse ``argv`` with ``parser`` (:func:`config_parser`), then ``overrides`` (field values, checked by
    the same types), into a validated :class:`GA3CConfig`.

    Raises:
        UnknownOption: an option or a config-file key that is no field (a ValueError).
        ValueError: a missing config file, a value of the wrong type or out of range (the message names the
            field).
    """
    from argparse import ArgumentError

    names = sorted(f.name for f in fields(GA3CConfig))
    try:
        ns = parser.parse_args(list(argv))
        if overrides:  # values as they are: a string stays that string (no command-line quoting)
            unknown = sorted(set(overrides) - set(names))
            if unknown:  # e.g. "config", which parse_object would not take as a file
                raise UnknownOption(f"overrides: {unknown} are no fields of GA3CConfig; known fields: {names}")
            ns = parser.parse_object({"model": dict(overrides)}, ns)  # positional: the name differs across versions
    except ArgumentError as err:
        message = " ".join(str(err).split())
        if message.startswith("unrecognized arguments") or "not accept option" in message:
            given = re.findall(r"--(?:model\.)?([\w.]+)|does not accept option '([^']+)'", message)
            close = sorted({c for dashed, quoted in given
                            for c in difflib.get_close_matches(dashed or quoted, names, n=2, cutoff=0.75)})
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            raise UnknownOption(f"{message}{hint}; known fields: {names}") from None
        raise ValueError(message) from None
    values = ns.as_dict()["model"]
    return GA3CConfig(**{name: values[name] for name in names}).validate()


def field_docs() -> dict[str, str]:
    """``field name -> attribute docstring`` of :class:`GA3CConfig` (what ``--help`` shows), as the
    parser read them."""
    from lightning_per.lightning_compat import parser_actions  # imports Lightning: only when asked

    return {a.dest[len("model."):]: " ".join(str(a.help).split()) for a in parser_actions(config_parser())
            if a.dest[len("model."):] in GA3CConfig.__dataclass_fields__ and a.dest.startswith("model.")}


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> GA3CConfig:
    """Build and validate a :class:`GA3CConfig` from a YAML mapping plus overrides, through
    :func:`config_parser` (the command line's types and checks).

    Args:
        path: YAML file whose ``model:`` section maps field names to values (None: defaults only).
        overrides: field values applied after the file (e.g. from the command line).

    Raises:
        ValueError: an unknown field name, a file that is not a mapping, or a value out of range.
    """
    argv = [] if path is None else ["--config", str(path)]
    return parse_args(config_parser(), argv, overrides)
