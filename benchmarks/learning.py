"""Learning speed over seeds: time and env steps until the mean return of the last 20 episodes reaches a target.

Each seed is one ``lightning-per fit`` (a DQN config: ``model:`` and ``trainer:`` sections) or ``lightning-per
ga3c`` run (a GA3C config) in its own process, with the config's own settings, the seed and the target
return (the run stops once it is reached) and, if given, a time budget (``--budget-s``) and an env-step budget
(``--budget-steps``: learners of different throughput compared at the same experience). From each run directory's
``episodes.csv`` (one row per finished episode: env steps, seconds since ``Trainer.fit`` started, return) the
suite computes, independently of the run's own stop decision:

- ``time_to_target_s`` / ``env_steps_to_target``: at the first episode whose mean with the
  ``window - 1`` before it (a full window) is >= ``target``; empty if never;
- ``final_mean_return``: the mean of the last ``window`` episodes; ``best_mean_return``: the highest
  full-window mean;

plus the run's ``summary.json`` (wall time, env steps, env steps/s, status). The table has one row per seed
and a line with the median and the worst seed; the plot has every seed's rolling mean against env steps
and against wall time, with the target.

    python -m benchmarks run learning --config configs/dqn_pong.yaml --seeds 0 1 2 --target 18
    python -m benchmarks run learning --config configs/ga3c_pong.yaml --seeds 0 1 2 --target 18
    python -m benchmarks run learning --quick        # CartPole DQN on the CPU, two seeds, a few seconds each
    # a variant of a config, named for its files:
    python -m benchmarks run learning --config configs/dqn_pong.yaml --seeds 0 --target 18 --budget-s 150 \
        --run-arg=--model.replay.capacity=1000000 --run-arg=--model.replay.frame_dedup=true \
        --name dqn_pong-frame_dedup_1m
    # one seed per call (each within a time limit), then one table of all of them:
    python -m benchmarks run learning --config configs/dqn_pong.yaml --target 18 --budget-s 300 --seeds 1 \
        --runs-dir runs/learning
    python -m benchmarks run learning --config configs/dqn_pong.yaml --target 18 --seeds 0 1 2 --reuse-runs \
        --runs-dir runs/learning

Results: ``<out>/learning-<name>-<machine>.json``, ``.md``, ``.png``; the seeds' run directories under
``<runs-dir>/<name>/seed<k>/`` (default ``<out>/learning-runs``); ``<name>`` is ``--name``, by default the
config's file name.
"""

from __future__ import annotations

import csv
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import UsageError
from benchmarks._results import Results

QUICK_CONFIG = "configs/dqn_cartpole.yaml"
# --quick: CartPole DQN, short: a few epochs of 40 updates after 256 random steps, 8 s at most per seed
QUICK_DQN_ARGS = ["--model.warmup_steps", "256", "--model.updates_per_epoch", "40", "--model.env.num_envs", "8"]
QUICK_BUDGET_S = 8.0  # --quick's time budget per seed, unless --budget-s gives one
QUICK_GA3C_ARGS = ["--model.agents", "2", "--model.updates_per_epoch", "20"]
QUICK_TARGET = 25.0
DEFAULT_CONFIG, DEFAULT_TARGET = "configs/dqn_pong.yaml", 18.0  # what the published table measures (GPU)


def add_arguments(ap) -> None:
    ap.add_argument("--config", default=None,
                    help=f"a DQN or GA3C YAML config (default {DEFAULT_CONFIG}; --quick: {QUICK_CONFIG})")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds, one run each (default 0 1 2; "
                                                                       "--quick: 0 1)")
    ap.add_argument("--target", type=float, default=None,
                    help=f"target mean return of the last --window episodes (default {DEFAULT_TARGET:g} with the "
                         f"default config; --quick: {QUICK_TARGET:g})")
    ap.add_argument("--window", type=int, default=20, help="episodes in the mean (default %(default)s)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="time budget of each run in seconds (default: the config's own limit)")
    ap.add_argument("--budget-steps", type=int, default=None,
                    help="env-step budget of each run (GA3C and DQN configs: --model.max_env_steps; default: none), "
                         "so learners of different throughput compare at the same experience")
    ap.add_argument("--run-arg", action="append", default=[], metavar="ARG",
                    help="one more command-line argument for every run (repeat it: --run-arg=--model.agents "
                         "--run-arg=32)")
    ap.add_argument("--wandb", action="store_true", help="keep the config's W&B logging (default: disabled)")
    ap.add_argument("--runs-dir", default=None,
                    help="where the seeds' run directories go (default: <out>/learning-runs)")
    ap.add_argument("--name", default=None,
                    help="name of the results: files learning-<name>-<machine>.* and runs under <runs-dir>/<name>/ "
                         "(default: the config's file name; give one for a variant made with --run-arg)")
    ap.add_argument("--reuse-runs", action="store_true",
                    help="a seed whose run directory under --runs-dir already has episodes.csv is read, not run again "
                         "(run the seeds in separate calls, then all of them with --reuse-runs for one table)")


# ---------------------------------------------------------------------------------------------- runs
def run_command(kind: str, config: str, seed: int, target: float, run_dir: Path, budget_s: float | None,
                extra: list[str], window: int = 20, budget_steps: int | None = None) -> list[str]:
    """The command line of one seed's run (``python -m lightning_per.console ...``); ``budget_s`` (seconds) and
    ``budget_steps`` (env steps, the model's ``max_env_steps``) bound it when given."""
    cmd = [sys.executable, "-m", "lightning_per.console"]
    if kind == "dqn":
        cmd += ["fit", "--config", config, "--seed_everything", str(seed), "--model.seed", str(seed),
                "--model.target_return", str(target), "--trainer.default_root_dir", str(run_dir),
                "--trainer.enable_progress_bar", "false"]
        if budget_s is not None:
            cmd += ["--trainer.max_time", _hms(budget_s)]
    else:
        cmd += ["ga3c", "--config", config, "--model.seed", str(seed), "--model.target_return", str(target),
                "--model.return_window", str(window), "--model.run_dir", str(run_dir)]
        if budget_s is not None:
            cmd += ["--model.max_time_s", str(budget_s)]
    if budget_steps is not None:
        cmd += ["--model.max_env_steps", str(budget_steps)]
    return cmd + list(extra)


def launch(cmd: list[str], env: dict[str, str], quiet: bool = False) -> int:
    """Run one seed's command in its own process; its exit status (a run that stopped early still leaves
    its files, which the suite reads)."""
    return subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL if quiet else None).returncode


def _hms(seconds: float) -> str:
    s = int(math.ceil(seconds))
    return f"00:{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def find_run_files(run_dir: Path) -> Path:
    """The directory holding ``episodes.csv`` under ``run_dir`` (itself, or the newest run directory below it:
    GA3C writes ``<run_dir>/<run_name>-<timestamp>/``).

    Raises:
        FileNotFoundError: none there.
    """
    found = sorted(run_dir.rglob("episodes.csv"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"no episodes.csv under {run_dir}")
    return found[-1].parent


# ---------------------------------------------------------------------------------------- analysis
def read_episodes(path: str | os.PathLike[str]) -> list[dict[str, float]]:
    """The rows of an ``episodes.csv`` as floats (``env_steps``, ``time_s``, ``return``, ...), oldest first."""
    with open(path, newline="") as fh:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(fh)]


def rolling_means(returns: list[float], window: int) -> list[float | None]:
    """Mean of each return with the ``window - 1`` before it; None until a full window."""
    out: list[float | None] = []
    total = 0.0
    for k, r in enumerate(returns):
        total += r
        if k >= window:
            total -= returns[k - window]
        out.append(total / window if k >= window - 1 else None)
    return out


def analyse(episodes: list[dict[str, float]], target: float, window: int) -> dict:
    """Time and env steps to ``target`` (first full-window mean >= target), final and best full-window means."""
    means = rolling_means([e["return"] for e in episodes], window)
    hit = next((k for k, m in enumerate(means) if m is not None and m >= target), None)
    full = [m for m in means if m is not None]
    return {
        "reached": hit is not None,
        "time_to_target_s": episodes[hit]["time_s"] if hit is not None else None,
        "env_steps_to_target": int(episodes[hit]["env_steps"]) if hit is not None else None,
        "episodes_to_target": hit + 1 if hit is not None else None,
        "final_mean_return": full[-1] if full else None,
        "best_mean_return": max(full) if full else None,
        "episodes": len(episodes),
    }


def seed_row(seed: int, files: Path, target: float, window: int) -> dict:
    """One table row: :func:`analyse` of ``files/episodes.csv`` plus the run's ``summary.json``."""
    import json

    row = {"impl": f"seed {seed}", "seed": seed, **analyse(read_episodes(files / "episodes.csv"), target, window)}
    summary_path = files / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    wall = summary.get("wall_time_s")
    env_steps = summary.get("env_steps")
    metrics = summary.get("metrics") or {}
    row.update(wall_time_s=wall, env_steps=env_steps,
               env_steps_per_s=summary.get("steps_per_s") or summary.get("env_steps_per_s"),  # GA3C: its wall
               updates=summary.get("updates"), updates_per_s=summary.get("tps") or summary.get("updates_per_s"),
               policy_lag=summary.get("policy_lag_mean"),  # GA3C: updates between acting and training
               policy_lag_p95=summary.get("policy_lag_p95"),  # over the run's transitions
               entropy=metrics.get("entropy"),  # GA3C: the policy's, mean of the last epoch
               # Ape-X DQN (collector: actors): which side waits. The learner's total wait for actor transitions
               # (s), the slots the actors' ingest found the queue full for (the learner too slow), the weights' lag
               learner_wait_s=metrics.get("learner_wait_s"), actor_queue_full=metrics.get("actor_queue_full"),
               actor_weight_lag=metrics.get("actor_weight_lag"),
               # where the agents' time went (both learners): stepping envs, waiting for answers, for free slots
               **agent_shares(files, metrics),
               **dead_units(files),
               status=summary.get("status"), stop_reason=summary.get("stop_reason"), run_dir=str(files))
    return row


AGENT_SHARES = ("agent_env_share", "agent_answer_wait_share", "agent_slot_wait_share")


def agent_shares(files: Path, metrics: dict) -> dict[str, float | None]:
    """The shares of the agents' time (``AGENT_SHARES``, fractions of their running time): the median over the
    epochs of the run's ``history.csv`` (a run's first epoch holds the warm-up fill and its last may be a few
    seconds at the stop), else the last epoch's in ``metrics``; None when the run logged none."""
    history = files / "history.csv"
    if history.exists():
        with open(history, newline="") as fh:
            rows = list(csv.DictReader(fh))
        series = {k: [float(r[k]) for r in rows if r.get(k) not in (None, "") and float(r[k]) == float(r[k])]
                  for k in AGENT_SHARES}
        if all(series.values()):
            return {k: statistics.median(v) for k, v in series.items()}
    return {k: metrics.get(k) for k in AGENT_SHARES}


DEAD_UNITS = ("dead_units_first", "dead_units_max", "dead_units_last")


def dead_units(files: Path) -> dict[str, float | None]:
    """GA3C's ``dead_unit_frac`` (the share of the last hidden layer's units that no transition of a batch activates,
    an epoch's mean) over the epochs of the run's ``history.csv``: the first epoch's, the largest and the last
    epoch's (``DEAD_UNITS``); None when the run logged none (DQN runs, runs from before the metric)."""
    history = files / "history.csv"
    values = []
    if history.exists():
        with open(history, newline="") as fh:
            values = [r.get("dead_unit_frac") for r in csv.DictReader(fh)]
    series = [float(v) for v in values if v not in (None, "") and not math.isnan(float(v))]
    if not series:
        return dict.fromkeys(DEAD_UNITS)
    return dict(zip(DEAD_UNITS, (series[0], max(series), series[-1])))


def _curves(files: Path, window: int) -> dict:
    eps = read_episodes(files / "episodes.csv")
    means = rolling_means([e["return"] for e in eps], window)
    keep = [(e, m) for e, m in zip(eps, means) if m is not None]
    return {"env_steps": [e["env_steps"] for e, _ in keep], "time_s": [e["time_s"] for e, _ in keep],
            "mean_return": [m for _, m in keep]}


def table(rows: list[dict], target: float, window: int) -> str:
    def f(v, fmt):
        return "" if v is None else format(v, fmt)

    # GA3C's learner columns, or Ape-X's feed columns, when the runs' summaries have them (other DQN tables keep
    # their columns)
    learner = any(r.get("policy_lag") is not None for r in rows)
    feed = not learner and any(r.get("learner_wait_s") is not None for r in rows)
    extra = (" | updates/s | policy lag (mean, p95) | entropy" if learner else
             " | updates/s | learner waiting (% of wall) | actor queue full (slots) | actor weight lag" if feed else "")
    # where the agents' time went, when the runs logged it (agent processes of either learner; agent_shares)
    shares = any(r.get("agent_env_share") is not None for r in rows)
    extra += " | agents: env / answer wait / slot wait (% of their time, median epoch)" if shares else ""
    # GA3C's dead units of the last hidden layer, when the runs logged them (dead_units)
    dead = any(r.get("dead_units_first") is not None for r in rows)
    extra += " | hidden units dead: first / most / last epoch" if dead else ""
    lines = [f"| seed | reached {target:g} | time to target (s) | env steps to target | final mean (last {window}) "
             f"| best mean | episodes | env steps | env steps/s{extra} | wall (s) | stop |",
             "|---" * ((14 if learner else 15 if feed else 11) + shares + dead) + "|"]
    for r in rows:
        lag = f(r.get("policy_lag"), ".1f") + (f", {r['policy_lag_p95']:.0f}" if r.get("policy_lag_p95") is not None
                                               else "")
        cells = f" | {f(r.get('updates_per_s'), ',.0f')} | {lag} | {f(r.get('entropy'), '.2f')}" if learner else ""
        if feed:
            waited = (100 * r["learner_wait_s"] / r["wall_time_s"]
                      if r.get("learner_wait_s") is not None and r.get("wall_time_s") else None)
            cells = (f" | {f(r.get('updates_per_s'), ',.0f')} | {f(waited, '.1f')} "
                     f"| {f(r.get('actor_queue_full'), ',.0f')} | {f(r.get('actor_weight_lag'), '.1f')}")
        if shares:
            cells += " | " + ("" if r.get("agent_env_share") is None else " / ".join(
                f(100 * r[k], ".0f") for k in AGENT_SHARES))
        if dead:
            cells += " | " + ("" if r.get("dead_units_first") is None else " / ".join(
                f(r[k], ".2f") for k in DEAD_UNITS))
        lines.append(f"| {r['seed']} | {'yes' if r['reached'] else 'no'} | {f(r['time_to_target_s'], '.1f')} "
                     f"| {f(r['env_steps_to_target'], ',')} | {f(r['final_mean_return'], '.2f')} "
                     f"| {f(r['best_mean_return'], '.2f')} | {r['episodes']:,} | {f(r['env_steps'], ',')} "
                     f"| {f(r['env_steps_per_s'], ',.0f')}{cells} | {f(r['wall_time_s'], '.1f')} "
                     f"| {r.get('stop_reason') or r.get('status') or ''} |")
    return "\n".join(lines)


def aggregate(rows: list[dict]) -> dict:
    """Over the seeds: how many reached the target; median and worst time / env steps to it (worst: None if a
    seed never got there)."""
    times = [r["time_to_target_s"] for r in rows]
    steps = [r["env_steps_to_target"] for r in rows]
    reached = [t for t in times if t is not None]
    all_reached = len(reached) == len(rows) and rows
    return {
        "seeds": len(rows), "seeds_reached": len(reached),
        "median_time_to_target_s": statistics.median(reached) if reached else None,
        "worst_time_to_target_s": max(reached) if all_reached else None,
        "median_env_steps_to_target": statistics.median([s for s in steps if s is not None]) if reached else None,
        "worst_env_steps_to_target": max(steps) if all_reached else None,
    }


def figure(curves: dict[int, dict], target: float, window: int, title: str):
    """Every seed's mean of the last ``window`` returns against env steps (left) and wall time (right), with
    the target; returns ``(figure, (axes_env_steps, axes_time))``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax_steps, ax_time = fig.subplots(1, 2, sharey=True)
    for seed, c in sorted(curves.items()):
        ax_steps.plot(c["env_steps"], c["mean_return"], label=f"seed {seed}")
        ax_time.plot(c["time_s"], c["mean_return"], label=f"seed {seed}")
    for ax, label in ((ax_steps, "env steps"), (ax_time, "wall time since fit started (s)")):
        ax.axhline(target, color="black", linestyle="--", linewidth=1, label=f"target {target:g}")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    ax_steps.set_ylabel(f"mean return of the last {window} episodes")
    ax_time.legend(fontsize="small", loc="lower right")
    fig.suptitle(title)
    return fig, (ax_steps, ax_time)


def plot(curves: dict[int, dict], target: float, window: int, title: str, path: Path) -> None:
    """:func:`figure` as a PNG at ``path``."""
    figure(curves, target, window, title)[0].savefig(path, format="png")


def summarise(seed_dirs: dict[int, Path], target: float, window: int, name: str, notes: str = "") -> Results:
    """The suite's results from finished runs: ``{seed: directory with episodes.csv (and summary.json)}``."""
    rows = [seed_row(seed, files, target, window) for seed, files in sorted(seed_dirs.items())]
    agg = aggregate(rows)
    curves = {seed: _curves(files, window) for seed, files in seed_dirs.items()}
    line = aggregate_line(agg, target)
    title = (f"{name}: time and env steps until the mean return of the last {window} episodes reaches {target:g}, "
             f"one run per seed (time: seconds since Trainer.fit started).")
    return Results(rows=rows, table=table(rows, target, window), title=title,
                   notes="\n\n".join(p for p in (line, notes) if p), name=f"learning-{name}",
                   plot=lambda path: plot(curves, target, window, name, path),
                   extra={"target": target, "window": window, "aggregate": agg, "curves": curves})


def aggregate_line(agg: dict, target: float) -> str:
    """The line under the table: seeds that reached ``target``, median and worst time and env steps (:func:`aggregate`'s
    dict)."""
    return (f"{agg['seeds_reached']} of {agg['seeds']} seeds reached {target:g}; median time to target "
            f"{_fmt(agg['median_time_to_target_s'], '.1f')} s, worst {_fmt(agg['worst_time_to_target_s'], '.1f')} s; "
            f"median env steps {_fmt(agg['median_env_steps_to_target'], ',.0f')}, worst "
            f"{_fmt(agg['worst_env_steps_to_target'], ',')}.")


def _fmt(v, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def run(args) -> Results:
    config = args.config or (QUICK_CONFIG if args.quick else DEFAULT_CONFIG)
    seeds = args.seeds or ([0, 1] if args.quick else [0, 1, 2])
    target = args.target
    if target is None and args.config is None:
        target = QUICK_TARGET if args.quick else DEFAULT_TARGET
    if target is None:
        raise UsageError(f"learning: --target is required with --config ({config})")
    if not Path(config).is_file():
        raise UsageError(f"learning: --config {config}: no such file")
    from lightning_per.cli import config_kind

    kind = config_kind(config)
    budget_steps = getattr(args, "budget_steps", None)
    if budget_steps is not None and budget_steps < 1:
        raise UsageError(f"learning: --budget-steps must be >= 1 (env steps), got {budget_steps}")
    budget_s = args.budget_s
    if budget_s is not None and not (math.isfinite(budget_s) and budget_s > 0):
        raise UsageError(f"learning: --budget-s must be a number of seconds > 0, got {budget_s:g}")
    if args.quick and budget_s is None:
        budget_s = QUICK_BUDGET_S
    if any(seed < 0 for seed in seeds):
        raise UsageError(f"learning: --seeds must be ints >= 0, got {' '.join(map(str, seeds))}")
    name = getattr(args, "name", None) or Path(config).stem
    extra = list(args.run_arg)
    if args.quick:
        extra = (QUICK_DQN_ARGS if kind == "dqn" else QUICK_GA3C_ARGS) + extra
    if args.device == "cpu" and kind == "dqn":
        extra = ["--trainer.accelerator", "cpu"] + extra
    env = {**os.environ}
    if not args.wandb:
        env["WANDB_MODE"] = "disabled"
    base = Path(getattr(args, "runs_dir", None) or Path(args.out) / "learning-runs") / name
    seed_dirs = {}
    for seed in seeds:
        run_dir = base / f"seed{seed}"
        if args.reuse_runs and any(run_dir.rglob("episodes.csv")):
            print(f"learning: seed {seed}: reusing {find_run_files(run_dir)}", flush=True)
            seed_dirs[seed] = find_run_files(run_dir)
            continue
        cmd = run_command(kind, config, seed, target, run_dir, budget_s, extra, args.window, budget_steps)
        print(f"learning: seed {seed}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.monotonic()
        code = launch(cmd, env, quiet=args.quick)
        print(f"learning: seed {seed}: exit {code} after {time.monotonic() - t0:.1f} s", flush=True)
        try:
            seed_dirs[seed] = find_run_files(run_dir)
        except FileNotFoundError:
            raise UsageError(f"learning: seed {seed}: the run exited with status {code} and wrote no episodes.csv "
                             f"under {run_dir} (its errors are above)") from None
    shown = run_command(kind, config, seeds[0], target, base / "seed<k>", budget_s, extra, args.window,
                        budget_steps)
    notes = f"Each run: `python {' '.join(shown[1:])}` (seed {seeds[0]} shown; `<k>`: the seed)."
    return summarise(seed_dirs, target, args.window, name, notes=notes)
