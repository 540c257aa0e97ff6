"""GA3C throughput benchmark on Pong (paper section 4.2 metrics: TPS, PPS, steps/s, FPS, policy lag).

Rows (each measured over ``--seconds`` after ``--warmup`` seconds, one process, sequentially):
  ale-bare        ale-py's C++ AtariVectorEnv alone, random actions, NA x E envs on all cores (the ceiling)
  ga3c-static     lightning_per.ga3c under Trainer.fit, fixed (NA, NP, NT) from the config
  ga3c-dynamic    the same with the dynamic adjustment of (NA, NP, NT) (section 4.2) switched on
  torchrl-async   TorchRL's AsyncBatchedCollector (process-slot transport, a policy server on the same
                  device, per-env TorchRL pixel transforms), collection only: steps/s, no training

    python -m benchmarks run ga3c                                      # GPU machine, 16 cores
    python -m benchmarks run ga3c --quick --out runs/bench             # smoke test (~1 min, CPU)
    python -m benchmarks run ga3c --rows ga3c-static --cuda-graph --agents 32

``--cuda-graph``: the GA3C rows run with ``cuda_graph: true``, the training update replayed as one CUDA
graph; the rows are named ``ga3c-static-graph`` / ``ga3c-dynamic-graph``. The learner alone on synthetic
batches is the ``ga3c-learner`` suite (``benchmarks/ga3c_learner.py``).
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
import warnings
from pathlib import Path

import torch
from torch import nn

from benchmarks._results import Results

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------- rows
def bench_ale_bare(args) -> dict:
    import numpy as np
    from ale_py.vector_env import AtariVectorEnv

    n = args.agents * args.envs_per_agent
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    env = AtariVectorEnv("pong", n, num_threads=cores, frameskip=4, reward_clipping=False,
                         autoreset_mode="SameStep")
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    end_warm = time.monotonic() + min(args.warmup, 3.0)
    steps, t0 = 0, None
    while True:
        env.step(rng.integers(0, 6, size=n))
        now = time.monotonic()
        if t0 is None and now >= end_warm:
            t0, steps = now, 0
        elif t0 is not None:
            steps += n
            if now - t0 >= args.seconds:
                break
    env.close()
    sps = steps / (time.monotonic() - t0)
    return {"row": "ale-bare", "envs": n, "steps_per_s": sps, "fps": 4 * sps, "agent_cores": float(cores)}


def _cpu_seconds() -> tuple[float, float]:
    """CPU seconds (user + system) used so far by this process and by its live direct children (the
    agent processes), from /proc (Linux); (nan, nan) elsewhere."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    me, kids = os.getpid(), 0.0
    try:
        def used(stat: str) -> tuple[int, float]:
            fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
            return int(fields[1]), (int(fields[11]) + int(fields[12])) / tick  # ppid, utime + stime

        own = used(Path(f"/proc/{me}/stat").read_text())[1]
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    ppid, cpu = used((entry / "stat").read_text())
                except (OSError, ValueError):
                    continue  # exited meanwhile
                if ppid == me:
                    kids += cpu
        return own, kids
    except OSError:
        return float("nan"), float("nan")


def ga3c_config(args, dynamic: bool):
    """The row's :class:`GA3CConfig`: ``--config`` with the row's counts, window and device."""
    from lightning_per.ga3c.config import load_config

    overrides = dict(agents=args.agents, envs_per_agent=args.envs_per_agent, predictors=args.predictors,
                     trainers=args.trainers, dynamic_adjustment=dynamic, adjust_warmup_s=args.warmup,
                     adjust_window_s=args.adjust_window, target_return=None, status_interval_s=10.0,
                     max_time_s=args.warmup + args.seconds + 60.0, wandb_mode="disabled", device=args.device,
                     max_agents=max(args.agents, args.max_agents), cuda_graph=args.cuda_graph)
    if args.quick:
        overrides.update(train_min_batch_size=20, predict_batch_size=8, torch_threads=1, max_predictors=2,
                         max_trainers=2)
    return load_config(args.config, overrides)


def bench_ga3c(args, dynamic: bool) -> dict:
    import lightning.pytorch as pl

    from lightning_per.actors.stats import rates
    from lightning_per.ga3c.module import GA3C

    cfg = ga3c_config(args, dynamic)
    model = GA3C(cfg)
    trainer = pl.Trainer(accelerator="gpu" if args.device == "cuda" else "cpu", devices=1, max_epochs=-1,
                         max_time={"seconds": cfg.max_time_s}, logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False,
                         gradient_clip_val=cfg.grad_clip)
    window: dict = {}

    def clock():
        while model.system is None:
            time.sleep(0.05)
        time.sleep(args.warmup)
        window["a"], window["cpu_a"], window["t_a"] = model.stats.snapshot(), _cpu_seconds(), time.monotonic()
        time.sleep(args.seconds)
        window["b"], window["cpu_b"], window["t_b"] = model.stats.snapshot(), _cpu_seconds(), time.monotonic()
        window["counts"] = model.system.counts().as_tuple() if model.system else None
        trainer.should_stop = True

    threading.Thread(target=clock, daemon=True).start()
    trainer.fit(model)
    r = rates(window["a"], window["b"], cfg.frame_skip)
    s = model.system_summary
    name = ("ga3c-dynamic" if dynamic else "ga3c-static") + ("-graph" if model.graph_captures else "")
    return {"row": name, "envs": cfg.agents * cfg.envs_per_agent,
            "steps_per_s": r["steps_per_s"], "fps": r["fps"], "tps": r["tps"], "pps": r["pps"],
            "policy_lag": r["policy_lag"], "policy_lag_p95": r["policy_lag_p95"], "train_batch": r["train_batch"],
            "predict_batch": r["predict_batch"],
            "start_counts": [cfg.agents, cfg.predictors, cfg.trainers], "end_counts": window["counts"],
            "mean_return": s.get("mean_return"), "episodes": s.get("episodes"),
            # cores busy over the window: the learner process (predictor/trainer threads, Lightning's loop)
            # and the agent processes (envs); their sum against the machine's cores says whether the CPU is the limit
            "learner_cores": (window["cpu_b"][0] - window["cpu_a"][0]) / (window["t_b"] - window["t_a"]),
            "agent_cores": (window["cpu_b"][1] - window["cpu_a"][1]) / (window["t_b"] - window["t_a"]),
            "adjustments": s.get("adjustments", [])}


class _SamplePolicy(nn.Module):
    """A3C conv net -> sampled integer action (TorchRL policy for the collector row)."""

    def __init__(self, n_actions: int) -> None:
        super().__init__()
        from lightning_per.ga3c.networks import A3CConvNet

        self.net = A3CConvNet(4, n_actions)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        logits, _ = self.net(pixels)
        return torch.multinomial(torch.softmax(logits, -1), 1).squeeze(-1)


def _torchrl_policy(n_actions: int, device: str):
    from tensordict.nn import TensorDictModule

    with torch.device(device):
        module = _SamplePolicy(n_actions)
    return TensorDictModule(module, in_keys=["pixels"], out_keys=["action"])


def _torchrl_env():
    """Pong as TorchRL users build it: GymEnv + ToTensorImage, GrayScale, Resize(84), CatFrames(4).

    TorchRL's Resize needs torchvision; without it the same bilinear antialiased resize runs through
    ``torch.nn.functional.interpolate``.
    """
    import ale_py
    import gymnasium as gym
    from torchrl.envs import CatFrames, GrayScale, GymEnv, Resize, ToTensorImage, TransformedEnv
    from torchrl.envs.transforms import Compose, ObservationTransform

    class InterpolateResize(Resize):
        def __init__(self, size: int) -> None:
            ObservationTransform.__init__(self, in_keys=["pixels"], out_keys=["pixels"])
            self.w = self.h = size
            self.interpolation = "bilinear"

        def _apply_transform(self, obs: torch.Tensor) -> torch.Tensor:
            if obs.shape[-2:] == (self.w, self.h):
                return obs
            lead = obs.shape[:-3]
            x = obs.reshape(-1, *obs.shape[-3:])
            x = torch.nn.functional.interpolate(x, size=(self.w, self.h), mode="bilinear", antialias=True)
            return x.reshape(*lead, *x.shape[-3:])

    try:
        import torchvision  # noqa: F401

        resize = Resize(84, 84)
    except ImportError:
        resize = InterpolateResize(84)
    gym.register_envs(ale_py)
    base = GymEnv("ALE/Pong-v5", frameskip=4, repeat_action_probability=0.0, categorical_action_encoding=True)
    return TransformedEnv(base, Compose(ToTensorImage(from_int=False), GrayScale(), resize,
                                        CatFrames(N=4, dim=-3)))


def bench_torchrl(args) -> dict:
    from torchrl.collectors import AsyncBatchedCollector
    from torchrl.modules.inference_server import InferenceDeviceConfig, InferenceServerConfig

    n = args.torchrl_envs
    collector = AsyncBatchedCollector(
        create_env_fn=[_torchrl_env] * n, policy_factory=functools.partial(_torchrl_policy, 6, args.device),
        frames_per_batch=max(64, n * 16), total_frames=-1, env_backend="multiprocessing", transport="auto",
        server_config=InferenceServerConfig(max_batch_size=n, min_batch_size=1, timeout=0.001),
        device_config=InferenceDeviceConfig(policy_device=args.device, output_device="cpu",
                                            storing_device="cpu"))
    steps, t0, start = 0, None, time.monotonic()
    try:
        for batch in collector:
            now = time.monotonic()
            if t0 is None:
                if now - start >= args.warmup:
                    t0, steps = now, 0
                continue
            steps += batch.numel()
            if now - t0 >= args.seconds:
                break
    finally:
        collector.shutdown()
    sps = steps / (time.monotonic() - t0)
    return {"row": "torchrl-async", "envs": n, "steps_per_s": sps, "fps": 4 * sps}


# ----------------------------------------------------------------------------------------- main
def _table(rows: list[dict]) -> str:
    cols = ["row", "envs", "steps_per_s", "fps", "tps", "pps", "policy_lag", "policy_lag_p95", "train_batch",
            "end_counts", "learner_cores", "agent_cores"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c)
            cells.append("" if v is None else f"{v:,.1f}" if isinstance(v, float) else str(v))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def add_common_arguments(ap) -> None:
    """Options of both GA3C suites (``ga3c`` and ``ga3c-learner``)."""
    ap.add_argument("--config", default=str(ROOT / "configs/ga3c_pong.yaml"))
    ap.add_argument("--predictors", type=int, default=2)
    ap.add_argument("--trainers", type=int, default=2)
    ap.add_argument("--cuda-graph", action="store_true", help="cuda_graph=true: the training update as one "
                    "CUDA graph replay (eager on the CPU); the GA3C rows get a -graph suffix")


def add_arguments(ap) -> None:
    add_common_arguments(ap)
    ap.add_argument("--rows", default="ale-bare,ga3c-static,ga3c-dynamic,torchrl-async")
    ap.add_argument("--seconds", type=float, default=60.0, help="measurement window per row, s")
    ap.add_argument("--warmup", type=float, default=20.0, help="seconds before measuring, s")
    ap.add_argument("--adjust-window", type=float, default=10.0, help="dynamic adjustment window, s")
    ap.add_argument("--agents", type=int, default=16)
    ap.add_argument("--max-agents", type=int, default=32)
    ap.add_argument("--envs-per-agent", type=int, default=16)
    ap.add_argument("--torchrl-envs", type=int, default=16)


def run(args) -> Results:
    """Each row of ``--rows`` in turn; a failing row is reported in its ``error`` field."""
    if args.quick:
        args.seconds, args.warmup, args.adjust_window = 6.0, 4.0, 2.0
        args.agents, args.max_agents, args.envs_per_agent = 2, 3, 2
        args.predictors = args.trainers = 1
        args.torchrl_envs = 2
        args.device = "cpu"
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    rows = []
    for name in [r.strip() for r in args.rows.split(",") if r.strip()]:
        fn = {"ale-bare": bench_ale_bare, "ga3c-static": functools.partial(bench_ga3c, dynamic=False),
              "ga3c-dynamic": functools.partial(bench_ga3c, dynamic=True),
              "torchrl-async": bench_torchrl}[name]
        try:
            row = fn(args)
        except Exception as err:  # one failing row must not lose the others
            row = {"row": name, "error": f"{type(err).__name__}: {err}"}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "adjustments"}), flush=True)
    for r in rows:
        r.setdefault("impl", r["row"])
    return Results(rows=rows, table=_table(rows), metric="steps_per_s",
                   title=f"GA3C throughput ({Path(args.config).name}, {args.seconds:g} s per row after "
                         f"{args.warmup:g} s): agent steps/s, frames/s, TPS (training batches/s), PPS "
                         "(predictions/s), policy lag (updates), cores used.")
