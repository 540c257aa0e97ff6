"""Drop-in learning parity: TorchRL's DQN recipe with TorchRL's prioritized buffer vs ours (stratified, i.i.d.).

Each run is TorchRL's DQN recipe on one task, in its own process with one intra-op thread: TorchRL's ``GymEnv``
(``StepCounter``, ``RewardSum``) and single-process ``Collector`` (64 frames a batch), ``QValueActor``,
``EGreedyModule`` (epsilon 1 -> 0.05 over the first half of the frames), ``DQNLoss(double_dqn=True)`` (gamma
0.99, Huber), ``SoftUpdate(tau=0.01)``, Adam (lr 1e-3), 16 updates of B = 128 per 64 frames once 1,000
transitions are stored, alpha = 0.6, beta 0.4 -> 1 (TorchRL's ``LinearScheduler``). The buffer is the one
thing that changes; one line builds it (:func:`make_buffer`):

- ``torchrl``: ``TensorDictPrioritizedReplayBuffer(alpha=, beta=, storage=LazyTensorStorage(C), ...)``
- ``ours``: ``GPUPrioritizedReplayBuffer(...)`` with the same arguments (stratified draws, the default)
- ``ours-iid``: the same with ``sampler_kwargs={"stratified": False}`` (i.i.d. draws, as TorchRL's)

Tasks: ``cartpole`` (CartPole-v1, an MLP 64-64) and ``breakout`` (MinAtar Breakout-v1 through
``minatar.gym.register_envs()``, the MinAtar paper's network: one 3x3 convolution of 16 channels, 128
hidden units; needs the ``minatar`` package). A run's score is the mean return of its last 20 episodes after
all frames (``final``); its curve is that rolling mean at 30 points; ``auc`` is the curve's mean (a less
noisy score of the whole run).

Per task and buffer: the median final score with a 95% bootstrap confidence interval
(``scipy.stats.bootstrap``, BCa); per task: Kruskal-Wallis over the three buffers and a two-sided
Mann-Whitney U of each of ours against TorchRL's (``scipy.stats``); the test's power is stated as the shift of
TorchRL's own scores it detects at p < 0.05 with 80% probability (simulated: resampled TorchRL scores against
the same resampled and shifted).

    python -m benchmarks run dropin --quick --out runs/bench           # one seed, a few hundred frames
    python -m benchmarks run dropin --envs cartpole --seeds 20 --frames 30000 --jobs 2
    python -m benchmarks run dropin --envs cartpole breakout --seeds 20 --reuse-runs   # pool finished runs

Everything runs on the CPU (``--device`` is not read: the question is the learning, not the speed). Every run
writes ``<runs-dir>/<env>/<impl>-seed<k>.json`` (default ``runs/dropin``; ``--quick``: ``<out>/dropin-runs``);
``--reuse-runs`` reads those already there, so a grid can be run in parts and pooled. Results:
``<out>/dropin-<machine>.{json,md,png}`` with every run's curve and episodes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import UsageError
from benchmarks._results import Results

IMPLS = ("torchrl", "ours", "ours-iid")
ENVS = {"cartpole": "CartPole-v1", "breakout": "MinAtar/Breakout-v1"}
WINDOW = 20                     # episodes in a score (the "mean of the last 20 episodes")
POINTS = 30                     # points of a stored curve
FRAMES_PER_BATCH, UPDATES_PER_BATCH, BATCH, CAPACITY = 64, 16, 128, 100_000
LEARNING_STARTS, LR, GAMMA, TAU, ALPHA, BETA = 1_000, 1e-3, 0.99, 0.01, 0.6, 0.4


def add_arguments(ap) -> None:
    ap.add_argument("--envs", nargs="+", choices=sorted(ENVS), default=None,
                    help="tasks (default cartpole; --quick: cartpole)")
    ap.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS), help="buffers (default all three)")
    ap.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 per task and buffer (default 20)")
    ap.add_argument("--frames", type=int, default=None, help="env frames per run (default 30000; --quick: 1280)")
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time, one process and one thread each")
    ap.add_argument("--runs-dir", default="runs/dropin", help="one JSON file per run (default runs/dropin)")
    ap.add_argument("--reuse-runs", action="store_true", help="read runs already under --runs-dir")


# ----------------------------------------------------------------------------------------------- one run
def make_buffer(impl: str, capacity: int):
    """The one line that differs between the arms: TorchRL's prioritized buffer or ours, same arguments."""
    from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer

    from lightning_per import GPUPrioritizedReplayBuffer

    common = dict(alpha=ALPHA, beta=BETA, storage=LazyTensorStorage(capacity), batch_size=BATCH,
                  priority_key="td_error")
    if impl == "torchrl":
        return TensorDictPrioritizedReplayBuffer(**common)
    if impl == "ours":
        return GPUPrioritizedReplayBuffer(**common, device="cpu")
    if impl == "ours-iid":
        return GPUPrioritizedReplayBuffer(**common, device="cpu", sampler_kwargs={"stratified": False})
    raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")


def _q_network(env_name: str, obs_shape, n_actions: int):
    import torch
    from torch import nn
    from torchrl.modules import MLP

    if env_name == "cartpole":
        return MLP(in_features=obs_shape[-1], out_features=n_actions, num_cells=[64, 64])
    channels = obs_shape[-1]                                # MinAtar: (10, 10, C) bool, channels last

    class MinAtarQ(nn.Module):
        """The MinAtar paper's Q-network (Young & Tian 2019, arXiv:1903.03176): conv 3x3 x16, 128 hidden."""

        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(channels, 16, 3)
            self.head = nn.Sequential(nn.Linear(16 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, n_actions))

        def forward(self, obs):
            x = obs.to(torch.float32).movedim(-1, -3)           # [..., C, 10, 10]
            x = torch.relu(self.conv(x)).flatten(-3)            # [..., 1024]
            return self.head(x)

    return MinAtarQ()


def one_run(env_name: str, impl: str, seed: int, frames: int) -> dict:
    """One run of the recipe; returns its episodes (frame at the end, return), curve, scores and wall time."""
    import torch
    from tensordict.nn import TensorDictSequential
    from torchrl.collectors import Collector
    from torchrl.data.replay_buffers.scheduler import LinearScheduler
    from torchrl.envs import GymEnv, RewardSum, StepCounter, TransformedEnv
    from torchrl.modules import EGreedyModule, QValueActor
    from torchrl.objectives import DQNLoss, SoftUpdate

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    if env_name == "breakout":
        import minatar.gym

        minatar.gym.register_envs()
    env = TransformedEnv(GymEnv(ENVS[env_name]), StepCounter())
    env.append_transform(RewardSum())
    env.set_seed(seed)
    spec = env.action_spec
    actor = QValueActor(_q_network(env_name, env.observation_spec["observation"].shape, spec.space.n),
                        in_keys=["observation"], spec=spec)
    loss = DQNLoss(actor, action_space=spec, delay_value=True, double_dqn=True)
    loss.make_value_estimator(gamma=GAMMA)
    target = SoftUpdate(loss, tau=TAU)
    optimizer = torch.optim.Adam(loss.parameters(), lr=LR)
    rb = make_buffer(impl, CAPACITY)
    explore = EGreedyModule(spec, eps_init=1.0, eps_end=0.05, annealing_num_steps=frames // 2)
    beta = LinearScheduler(rb, param_name="beta", final_value=1.0, num_steps=frames // FRAMES_PER_BATCH)
    collector = Collector(env, TensorDictSequential(actor, explore), frames_per_batch=FRAMES_PER_BATCH,
                          total_frames=frames)
    episodes: list[tuple[int, float]] = []
    seen, t0 = 0, time.monotonic()
    for data in collector:
        seen += data.numel()
        done = data["next", "done"].squeeze(-1)
        at = seen - data.numel() + 1 + torch.nonzero(done).squeeze(-1)
        episodes += zip(at.tolist(), data["next", "episode_reward"][done].squeeze(-1).tolist())
        rb.extend(data.reshape(-1))
        explore.step(data.numel())
        beta.step()
        if len(rb) < LEARNING_STARTS:
            continue
        for _ in range(UPDATES_PER_BATCH):
            batch = rb.sample()
            out = loss(batch)                   # weights by "priority_weight", writes "td_error" into batch
            optimizer.zero_grad()
            out["loss"].backward()
            optimizer.step()
            target.step()
            rb.update_tensordict_priority(batch)
        collector.update_policy_weights_()
    collector.shutdown()
    wall = time.monotonic() - t0
    curve = curve_of(episodes, frames)
    return {"env": env_name, "impl": impl, "seed": seed, "frames": frames, "wall_s": round(wall, 2),
            "episodes": len(episodes), "final": final_score(episodes), "auc": _mean([v for _, v in curve]),
            "curve": curve, "returns": [[f, round(r, 3)] for f, r in episodes]}


def _mean(xs: list[float]) -> float | None:
    return float(np.mean(xs)) if xs else None


def final_score(episodes: list[tuple[int, float]]) -> float | None:
    """Mean return of the last :data:`WINDOW` episodes (fewer if fewer finished; None if none did)."""
    return _mean([r for _, r in episodes[-WINDOW:]])


def curve_of(episodes: list[tuple[int, float]], frames: int) -> list[list[float]]:
    """[frame, mean return of the last WINDOW episodes finished by that frame] at POINTS evenly spaced frames
    (points before the first finished episode are left out)."""
    out = []
    for k in range(1, POINTS + 1):
        f = frames * k // POINTS
        done = [r for at, r in episodes if at <= f][-WINDOW:]
        if done:
            out.append([f, round(float(np.mean(done)), 3)])
    return out


# ----------------------------------------------------------------------------------------------- the grid
def _run_file(runs_dir: Path, env_name: str, impl: str, seed: int) -> Path:
    return runs_dir / env_name / f"{impl}-seed{seed}.json"


def _launch_grid(todo: list[tuple[str, str, int]], frames: int, runs_dir: Path, jobs: int) -> None:
    """The runs in ``jobs`` processes at a time, one intra-op thread each; a process runs one seed of every
    buffer in turn (the imports are paid once a seed) and writes one file a run."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "RL_WARNINGS": "False"}
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    groups: dict[tuple[str, int], list[str]] = {}
    for env_name, impl, seed in todo:
        groups.setdefault((env_name, seed), []).append(impl)
    pending, running = list(groups.items()), []
    for env_name, _ in groups:
        (runs_dir / env_name).mkdir(parents=True, exist_ok=True)
    while pending or running:
        while pending and len(running) < jobs:
            (env_name, seed), impls = pending.pop(0)
            cmd = [sys.executable, "-m", "benchmarks.dropin", env_name, str(seed), str(frames), str(runs_dir), *impls]
            running.append((subprocess.Popen(cmd, env=env), env_name, seed, time.monotonic()))
        proc, env_name, seed, t0 = running[0]
        code = proc.wait()
        running.pop(0)
        if code != 0:
            raise RuntimeError(f"dropin: {env_name} seed {seed} exited with {code}")
        print(f"dropin: {env_name} seed {seed}: {time.monotonic() - t0:.1f} s ({len(pending)} seeds to start)",
              flush=True)


def _bootstrap_median(xs: np.ndarray, seed: int = 0) -> tuple[float, float]:
    from scipy.stats import bootstrap

    if len(xs) < 3 or np.ptp(xs) == 0:
        return float(np.median(xs)), float(np.median(xs))
    for method in ("BCa", "percentile"):  # BCa is undefined (NaN) when most scores tie; the percentile CI is not
        ci = bootstrap((xs,), np.median, confidence_level=0.95, method=method, n_resamples=10_000,
                       random_state=np.random.default_rng(seed)).confidence_interval
        if np.isfinite(ci.low) and np.isfinite(ci.high):
            break
    return float(ci.low), float(ci.high)


def detectable_shift(ref: np.ndarray, n: int, power: float = 0.8, alpha: float = 0.05, sims: int = 400,
                     seed: int = 0) -> float | None:
    """Smallest shift d (in return units) such that a two-sided Mann-Whitney U at ``alpha`` between ``n``
    resampled scores of ``ref`` and ``n`` resampled scores of ``ref`` + d rejects with probability >= ``power``
    (``sims`` simulated experiments per d, common random numbers across d); None if no d up to 3x the spread
    of ``ref`` reaches it."""
    from scipy.stats import mannwhitneyu

    if len(ref) < 2:
        return None
    rng = np.random.default_rng(seed)
    a = rng.choice(ref, size=(sims, n))
    b = rng.choice(ref, size=(sims, n))
    scale = float(np.ptp(ref)) or 1.0
    for d in np.linspace(0, 3 * scale, 61)[1:]:
        p = mannwhitneyu(a, b + d, alternative="two-sided", axis=1).pvalue
        if np.mean(p < alpha) >= power:
            return float(d)
    return None


def analyse(runs: list[dict]) -> tuple[list[dict], dict]:
    """Per (env, impl): median final score, its 95% BCa CI, median auc; per env: Kruskal-Wallis over the
    buffers, Mann-Whitney U (two-sided) of each of ours vs torchrl on the final score (and on auc), and the
    shift of the final score detectable with 80% power."""
    from scipy.stats import kruskal, mannwhitneyu

    rows, tests = [], {}
    for env_name in dict.fromkeys(r["env"] for r in runs):
        scores, aucs = {}, {}
        for impl in IMPLS:
            mine = [r for r in runs if r["env"] == env_name and r["impl"] == impl]
            if not mine:
                continue
            xs = np.array([r["final"] for r in mine if r["final"] is not None], dtype=float)
            scores[impl] = xs
            aucs[impl] = np.array([r["auc"] for r in mine if r["auc"] is not None], dtype=float)
            lo, hi = _bootstrap_median(xs)
            rows.append({"impl": f"{env_name}/{impl}", "env": env_name, "buffer": impl, "seeds": len(mine),
                         "frames": mine[0]["frames"], "median_final": float(np.median(xs)), "ci_low": lo,
                         "ci_high": hi, "mean_final": float(np.mean(xs)),
                         "median_auc": float(np.median([r["auc"] for r in mine if r["auc"] is not None])),
                         "median_wall_s": float(np.median([r["wall_s"] for r in mine]))})
        t: dict = {}
        if len(scores) >= 2 and all(len(x) >= 2 for x in scores.values()):
            t["kruskal_p"] = float(kruskal(*scores.values()).pvalue)
        for impl in ("ours", "ours-iid"):
            if impl in scores and "torchrl" in scores and len(scores["torchrl"]) >= 2 and len(scores[impl]) >= 2:
                u = mannwhitneyu(scores[impl], scores["torchrl"], alternative="two-sided")
                t[f"mannwhitney_{impl}_vs_torchrl"] = {
                    "U": float(u.statistic), "p": float(u.pvalue),
                    # P(a run of ours scores above a run of TorchRL's), ties counted half: U / (n m)
                    "p_superiority": float(u.statistic) / (len(scores[impl]) * len(scores["torchrl"]))}
                t[f"mannwhitney_auc_{impl}_vs_torchrl"] = {
                    "p": float(mannwhitneyu(aucs[impl], aucs["torchrl"], alternative="two-sided").pvalue)}
        if "torchrl" in scores:
            t["shift_detectable_80pct"] = detectable_shift(scores["torchrl"], len(scores["torchrl"]))
        tests[env_name] = t
    return rows, tests


def _plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(dict.fromkeys(r["env"] for r in runs))
    fig, axes = plt.subplots(1, len(envs), figsize=(6.5 * len(envs), 4.2), squeeze=False)
    colors = dict(zip(IMPLS, ("tab:blue", "tab:orange", "tab:green")))
    for ax, env_name in zip(axes[0], envs):
        for impl in IMPLS:
            mine = [r for r in runs if r["env"] == env_name and r["impl"] == impl and r["curve"]]
            for r in mine:
                f, v = zip(*r["curve"])
                ax.plot(f, v, color=colors[impl], alpha=0.15, lw=0.8)
            if mine:
                grid = sorted({p[0] for r in mine for p in r["curve"]})
                med = [np.median([dict(map(tuple, r["curve"])).get(g, np.nan) for r in mine]) for g in grid]
                ax.plot(grid, med, color=colors[impl], lw=2.2, label=f"{impl} (median of {len(mine)})")
        ax.set(title=f"{ENVS[env_name]}", xlabel="env frames", ylabel=f"mean return, last {WINDOW} episodes")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt_p(t: dict, key: str) -> str:
    v = t.get(key)
    return "n/a" if v is None else f"{v['p']:.3f} (P(ours > TorchRL's) = {v['p_superiority']:.2f})"


def _auc_p(t: dict, impl: str) -> str:
    v = t.get(f"mannwhitney_auc_{impl}_vs_torchrl")
    return "n/a" if v is None else f"{v['p']:.3f}"


def run(args) -> Results:
    envs = args.envs or ["cartpole"]
    seeds = args.seeds if args.seeds is not None else (1 if args.quick else 20)
    frames = args.frames if args.frames is not None else (1_280 if args.quick else 30_000)
    if seeds < 1 or frames < FRAMES_PER_BATCH or args.jobs < 1:
        raise UsageError(f"dropin: expected --seeds >= 1, --frames >= {FRAMES_PER_BATCH}, --jobs >= 1; got "
                         f"{seeds}, {frames}, {args.jobs}")
    if "breakout" in envs:
        try:
            import minatar.gym  # noqa: F401
        except ImportError as e:
            raise UsageError("dropin: --envs breakout needs the minatar package (pip install minatar)") from e
    runs_dir = Path(args.runs_dir) if not args.quick else Path(args.out) / "dropin-runs"
    grid = [(e, i, s) for e in envs for s in range(seeds) for i in args.impls]  # seeds interleaved across arms
    todo = [g for g in grid if not (args.reuse_runs and _run_file(runs_dir, *g).is_file())]
    runs = []
    _launch_grid(todo, frames, runs_dir, args.jobs)
    for g in grid:
        r = json.loads(_run_file(runs_dir, *g).read_text())
        if r["frames"] != frames:
            raise UsageError(f"dropin: {_run_file(runs_dir, *g)} ran {r['frames']} frames, not --frames {frames}")
        runs.append(r)
    rows, tests = analyse(runs)
    columns = ["impl", "seeds", "frames", "median_final", "ci_low", "ci_high", "mean_final", "median_auc",
               "median_wall_s"]
    from benchmarks._results import markdown_table

    notes = []
    for env_name, t in tests.items():
        shift = t.get("shift_detectable_80pct")
        notes.append(
            f"**{ENVS[env_name]}**: Kruskal-Wallis over the buffers p = "
            f"{'n/a' if t.get('kruskal_p') is None else format(t['kruskal_p'], '.3f')}; Mann-Whitney U (two-sided), "
            f"ours vs TorchRL's: p = {_fmt_p(t, 'mannwhitney_ours_vs_torchrl')}; ours-iid vs TorchRL's: p = "
            f"{_fmt_p(t, 'mannwhitney_ours-iid_vs_torchrl')}; on auc (the whole curve), ours p = "
            f"{_auc_p(t, 'ours')}, ours-iid p = {_auc_p(t, 'ours-iid')}. Power: with these seeds the test detects "
            f"a shift of TorchRL's scores by {'n/a' if shift is None else format(shift, '.1f')} (return units) "
            f"at p < 0.05 with 80% probability.")
    notes.append(f"Score: mean return of the last {WINDOW} episodes after all frames; CI: 95% bootstrap (BCa; "
                 f"percentile where BCa is undefined) of "
                 f"the median; auc: the mean of the run's rolling-mean curve at {POINTS} points. One process and "
                 "one intra-op thread per run; seeds 0..N-1 for each buffer.")
    return Results(rows=rows, table=markdown_table(rows, columns), notes="\n\n".join(notes),
                   title=("TorchRL's DQN recipe (double DQN, SoftUpdate, Adam, B = 128, 16 updates per 64 frames) "
                          "with TorchRL's prioritized buffer vs ours, one constructor changed; final score = mean "
                          f"return of the last {WINDOW} episodes."),
                   plot=lambda p: _plot(runs, p), extra={"tests": tests, "runs": runs})


def _main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Runs of one seed of the dropin suite (what the suite launches).")
    ap.add_argument("env", choices=sorted(ENVS))
    ap.add_argument("seed", type=int)
    ap.add_argument("frames", type=int)
    ap.add_argument("runs_dir", help="each run's JSON goes to <runs_dir>/<env>/<impl>-seed<k>.json")
    ap.add_argument("impls", nargs="+", choices=IMPLS)
    a = ap.parse_args(argv)
    for impl in a.impls:
        path = _run_file(Path(a.runs_dir), a.env, impl, a.seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(one_run(a.env, impl, a.seed, a.frames)) + "\n")
        os.replace(tmp, path)


if __name__ == "__main__":
    _main()
