"""What a GA3C config's first updates do to its network on frames of random play, one optimizer against another.

The batch is fixed (random-play transitions of the config's env, discounted returns of the clipped rewards), so the
tool isolates the optimizer from the learning dynamics: for each optimizer and network seed it takes ``--updates``
updates of the config's A3C loss (its ``beta``, ``value_coef``, ``loss_reduction``, ``grad_clip``) on batches of
``train_min_batch_size`` drawn from those frames, and records, on held-out frames, after 0, 1, 2, 5, 10, 25, ...
updates: the share of the last hidden layer's units that no frame activates (``dead_unit_fraction``), the mean
policy entropy, the mean over units of each unit's standard deviation across frames (how much the features still
depend on the state), the mean cosine similarity of two frames' features (how alike the network sees them), and the
largest parameter change of the first update in units of ``lr``. ``--obs-center-steps`` repeats each optimizer with
the config's ``obs_center_steps`` set to each value (0: the input as the env gives it; default: the config's); the
network seed also seeds the centering's random play, as ``seed`` does in a run.

    python -m benchmarks tool first_updates --config configs/ga3c_pong.yaml --optimizers rmsprop adam:0.0,0.99 \
        adam --seeds 0 1 2 3 --updates 200 --out benchmarks/results
    python -m benchmarks tool first_updates --config configs/ga3c_pong.yaml --optimizers rmsprop \
        --obs-center-steps 0 128 --seeds 0 1 2 3 --updates 200 --name ga3c_pong-center --out benchmarks/results

``adam:B1,B2`` is Adam with ``adam_betas: [B1, B2]`` (``adam:0.0,0.99``: RMSProp with a bias-corrected square
average at the config's alpha); every optimizer takes the config's ``lr``, ``rmsprop_alpha``, ``rmsprop_eps`` and
``adam_eps`` (``adam_eps`` is set to ``rmsprop_eps`` when it is the default, so the two RMSProps differ only in the
correction). Writes ``<out>/first_updates-<name>-<machine>.{json,md,png}``. A study of the optimizer on a fixed
batch, not of learning: the agents' policy, and so the data, move in a real run.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

from benchmarks import UsageError
from benchmarks._results import Results, environment, write

CHECKPOINTS = (0, 1, 2, 5, 10, 25, 50, 100, 200, 500, 1000)
_HELD_OUT = 512


def parse_optimizer(spec: str) -> tuple[str, dict]:
    """``rmsprop``, ``rmsprop_tf``, ``adam`` or ``adam:B1,B2`` -> (label, GA3CConfig fields).

    Raises:
        UsageError: another name, or betas that are not two numbers.
    """
    name, _, betas = spec.partition(":")
    if name not in ("rmsprop", "rmsprop_tf", "adam") or (betas and name != "adam"):
        raise UsageError(f"--optimizers: expected rmsprop, rmsprop_tf, adam or adam:B1,B2, got {spec!r}")
    fields: dict = {"optimizer": name}
    if betas:
        try:
            b1, b2 = (float(b) for b in betas.split(","))
        except ValueError:
            raise UsageError(f"--optimizers: adam:B1,B2 needs two numbers, got {spec!r}") from None
        fields["adam_betas"] = [b1, b2]
    return spec, fields


def return_horizon(gamma: float) -> int:
    """Steps kept out at the end of each env's play so that every return sees this far ahead: 3 / (1 - gamma)."""
    return int(3 / (1 - gamma))


def random_play(cfg, steps: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``steps`` vector steps of uniformly random actions in ``envs_per_agent`` envs of ``cfg``'s env: (obs (M, *obs),
    action (M,) int64, discounted return (M,) float32 of the rewards clipped to ``reward_clip``), M = E x (steps -
    a horizon of 3 / (1 - gamma) steps kept out so that each return sees that far ahead)."""
    from lightning_per.actors.envs import make_env_group

    group = make_env_group({"env": cfg.env, "backend": cfg.env_backend, "kwargs": dict(cfg.env_kwargs),
                            "frame_stack": cfg.atari_frame_stack, "num_envs": cfg.envs_per_agent})
    try:
        rng = np.random.default_rng(seed)
        obs = [group.reset(seed=seed)]
        actions, rewards, ends = [], [], []
        for _ in range(steps):
            a = rng.integers(0, group.n_actions, cfg.envs_per_agent)
            o, r, term, trunc = group.step(a)
            actions.append(a)
            rewards.append(r if cfg.reward_clip is None else np.clip(r, -cfg.reward_clip, cfg.reward_clip))
            ends.append(term | trunc)
            obs.append(o)
    finally:
        group.close()
    ret = np.zeros((steps, cfg.envs_per_agent), np.float32)
    run = np.zeros(cfg.envs_per_agent, np.float32)
    for t in range(steps - 1, -1, -1):
        run = rewards[t] + cfg.gamma * run * (1.0 - ends[t])
        ret[t] = run
    keep = max(1, steps - return_horizon(cfg.gamma))
    obs_arr = np.stack(obs[:keep])  # [T, E, *obs]
    return (obs_arr.reshape(-1, *obs_arr.shape[2:]), np.stack(actions[:keep]).reshape(-1).astype(np.int64),
            ret[:keep].reshape(-1))


def held_out(frames: int) -> int:
    """Frames kept out of the updates to measure on: 512, or a quarter of a smaller set."""
    return min(_HELD_OUT, frames // 4)


def feature_cosine(h) -> float:
    """The mean cosine similarity of two different rows of ``h`` (N, units), N >= 2: 1 when the network sees every
    frame alike. A row of zeros (every unit dead on that frame) counts as similarity 0 with any other."""
    import torch

    n = h.shape[0]
    unit = h.double() / h.double().norm(dim=1, keepdim=True).clamp_min(1e-300)  # [N, units]
    gram = unit @ unit.T  # [N, N]
    return float((gram.sum() - torch.diagonal(gram).sum()) / (n * (n - 1)))


def study(cfg, label: str, fields: dict, data, seed: int, updates: int) -> dict:
    """One optimizer and network seed: the checkpoints' measures (see the module docstring) as a row."""
    import torch

    from lightning_per.ga3c.loss import a3c_loss
    from lightning_per.ga3c.module import GA3C
    from lightning_per.ga3c.networks import dead_unit_fraction

    run_cfg = dataclasses.replace(cfg, seed=seed, device="cpu", **fields)
    module = GA3C(run_cfg)
    net, opt = module.net, module.make_optimizer()
    obs, action, ret = (torch.from_numpy(x) for x in data)
    gen = torch.Generator().manual_seed(10_000 + seed)
    held = torch.randperm(obs.shape[0], generator=gen)[:held_out(obs.shape[0])]
    train = torch.ones(obs.shape[0], dtype=torch.bool)
    train[held] = False
    train_idx = train.nonzero().squeeze(1)
    n = run_cfg.train_min_batch_size
    points: dict[str, list] = {"updates": [], "dead_unit_frac": [], "entropy": [], "feature_std": [],
                               "feature_cos": []}
    first_step = None

    def measure(u: int) -> None:
        with torch.no_grad():
            h = net.features(obs[held])  # [H_out, units]
            logits, _ = net.heads(h)
            logp = torch.log_softmax(logits.float(), -1)
            points["updates"].append(u)
            points["dead_unit_frac"].append(float(dead_unit_fraction(h)))
            points["entropy"].append(float(-(logp.exp() * logp).sum(-1).mean()))
            points["feature_std"].append(float(h.std(0).mean()))
            points["feature_cos"].append(feature_cosine(h))

    for u in range(updates + 1):
        if u in CHECKPOINTS or u == updates:
            measure(u)
        if u == updates:
            break
        i = train_idx[torch.randint(0, train_idx.shape[0], (n,), generator=gen)]
        before = [p.detach().clone() for p in net.parameters()] if u == 0 else None
        logits, value = net(obs[i])
        loss, _ = a3c_loss(logits, value, action[i], ret[i], beta=run_cfg.beta, value_coef=run_cfg.value_coef,
                           log_epsilon=run_cfg.log_epsilon, reduction=run_cfg.loss_reduction)
        opt.zero_grad()
        loss.backward()
        if run_cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(net.parameters(), run_cfg.grad_clip)
        opt.step()
        if before is not None:
            first_step = max(float((p.detach() - b).abs().max()) for p, b in zip(net.parameters(), before)) / run_cfg.lr
    at = {u: k for k, u in enumerate(points["updates"])}
    row = {"impl": f"{label} seed {seed}", "optimizer": label, "seed": seed,
           "obs_center_steps": run_cfg.obs_center_steps, "first_update_max_step_lr": first_step,
           "feature_cos_at_0": points["feature_cos"][0]}
    for u in (0, 1, updates):
        row[f"dead_at_{u}"] = points["dead_unit_frac"][at[u]]
        row[f"entropy_at_{u}"] = points["entropy"][at[u]]
        row[f"feature_std_at_{u}"] = points["feature_std"][at[u]]
    row["curves"] = points
    return row


def table(rows: list[dict], updates: int) -> str:
    head = ("| optimizer | obs_center_steps | seed | feature cosine at start | largest first step (x lr) | dead "
            f"units: start / after 1 / after {updates} | entropy: start / 1 / {updates} | feature std: start / 1 / "
            f"{updates} |")
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['optimizer']} | {r['obs_center_steps']} | {r['seed']} | {r['feature_cos_at_0']:.3f} | "
            f"{r['first_update_max_step_lr']:.2f} | "
            f"{r['dead_at_0']:.2f} / {r['dead_at_1']:.2f} / {r[f'dead_at_{updates}']:.2f} | "
            f"{r['entropy_at_0']:.3f} / {r['entropy_at_1']:.3f} / {r[f'entropy_at_{updates}']:.3f} | "
            f"{r['feature_std_at_0']:.4f} / {r['feature_std_at_1']:.4f} / {r[f'feature_std_at_{updates}']:.4f} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    colours: dict[str, str] = {}
    for r in rows:
        arm = r["optimizer"] + (f", centered ({r['obs_center_steps']} steps)" if r["obs_center_steps"] else "")
        first = arm not in colours
        c = colours.setdefault(arm, f"C{len(colours)}")
        x = np.maximum(np.array(r["curves"]["updates"]), 0.5)  # update 0 on a log axis
        for ax, key in zip(axes, ("dead_unit_frac", "entropy", "feature_std")):
            ax.plot(x, r["curves"][key], color=c, alpha=0.7, label=arm if first else None)
    last = max(max(r["curves"]["updates"]) for r in rows)
    ticks = [0.5] + [t for t in (1, 10, 100, 1000) if t <= last]
    for ax, title in zip(axes, ("dead units (share)", "policy entropy (nats)", "feature std across frames")):
        ax.set_xscale("log")
        ax.set_xticks(ticks, ["0"] + [str(t) for t in ticks[1:]])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("updates (log scale; 0 drawn at 0.5)")
        ax.set_title(title)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> list[Path]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks tool first_updates", description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="a GA3C config file (its model: section)")
    ap.add_argument("--optimizers", nargs="+", default=["rmsprop", "adam:0.0,0.99"],
                    help="rmsprop, rmsprop_tf, adam or adam:B1,B2 (default: %(default)s)")
    ap.add_argument("--obs-center-steps", type=int, nargs="+", default=None,
                    help="obs_center_steps to run each optimizer with: random-play steps whose mean observation "
                         "the network subtracts, 0: none (default: the config's)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3], help="network seeds (default 0 1 2 3)")
    ap.add_argument("--updates", type=int, default=200, help="updates per optimizer and seed (default 200)")
    ap.add_argument("--steps", type=int, default=700, help="vector steps of random play (default 700)")
    ap.add_argument("--name", default=None, help="the files' name: first_updates-<name>-<machine>.* "
                                                 "(default: the config's file name)")
    ap.add_argument("--out", default="benchmarks/results",
                    help="directory of the files (default %(default)s, where the committed results are)")
    args = ap.parse_args(argv)
    if args.updates < 1 or args.steps < 1:
        raise UsageError(f"--updates and --steps must be >= 1, got {args.updates} and {args.steps}")
    if args.obs_center_steps is not None and min(args.obs_center_steps) < 0:
        raise UsageError(f"--obs-center-steps must be >= 0 (0: no centering), got {args.obs_center_steps}")
    if args.obs_center_steps is not None and len(set(args.obs_center_steps)) < len(args.obs_center_steps):
        raise UsageError(f"--obs-center-steps: each value once, got {args.obs_center_steps}")
    if not Path(args.config).is_file():
        raise UsageError(f"--config {args.config}: no such file")
    from lightning_per.cli import config_kind
    from lightning_per.ga3c.config import load_config

    if config_kind(args.config) != "ga3c":
        raise UsageError(f"--config {args.config}: a GA3C config is needed (this tool trains GA3C's network and "
                         "A3C loss), got a DQN config")
    cfg = load_config(args.config)
    if args.steps <= return_horizon(cfg.gamma):
        raise UsageError(f"--steps must exceed the returns' horizon of {return_horizon(cfg.gamma)} steps "
                         f"(3 / (1 - gamma), gamma {cfg.gamma:g}), got {args.steps}")
    eps_from_rmsprop = cfg.adam_eps == 1e-8  # the dataclass default: compare the RMSProps at the config's eps
    if eps_from_rmsprop:
        cfg = dataclasses.replace(cfg, adam_eps=cfg.rmsprop_eps)
    specs = [parse_optimizer(s) for s in args.optimizers]
    data = random_play(cfg, args.steps, seed=0)
    if held_out(data[0].shape[0]) < 1:
        raise UsageError(f"--steps {args.steps}: {data[0].shape[0]} frames after the returns' horizon of "
                         f"{return_horizon(cfg.gamma)} steps; take more steps")
    rows = [study(cfg, label, {**fields, "obs_center_steps": c}, data, seed, args.updates)
            for label, fields in specs for c in (args.obs_center_steps or [cfg.obs_center_steps])
            for seed in args.seeds]
    name = args.name or Path(args.config).stem
    frames, horizon = data[0].shape[0], return_horizon(cfg.gamma)
    adam_eps_note = ": the config leaves it at its default, so RMSProp's is used" if eps_from_rmsprop else ""
    title = (f"The first updates of `{args.config}`'s network and A3C loss under each optimizer (config: "
             f"`optimizer: {cfg.optimizer}`), on a fixed set of {frames:,} random-play frames of {cfg.env} "
             f"({cfg.envs_per_agent} envs x {args.steps} steps, less the last {horizon} steps of each env so that "
             f"every return sees {horizon} steps ahead), batches of {cfg.train_min_batch_size}, lr {cfg.lr:g}; "
             f"measured on {held_out(frames)} of those frames, which no update uses.")
    notes = ("dead units: the share of the last hidden layer's units that no held-out frame activates "
             "(`lightning_per.ga3c.networks.dead_unit_fraction`). feature std: the mean over units of each unit's "
             "standard deviation across the held-out frames. feature cosine: the mean cosine similarity of two "
             "different held-out frames' last hidden layers (1: the network sees every frame alike). "
             "obs_center_steps: the random-play observations per env whose mean the network subtracts from its "
             "input (0: none). largest "
             "first step: max |delta p| of the first update over every parameter, in units of lr (torch's RMSprop: "
             "about 1 / sqrt(1 - alpha); bias-corrected: "
             f"about 1). Every optimizer takes alpha = {cfg.rmsprop_alpha:g} (RMSProp's decay; `adam:B1,B2` its "
             f"own betas), eps = {cfg.rmsprop_eps:g} (RMSProp's) and {cfg.adam_eps:g} (Adam's{adam_eps_note}). "
             f"The targets are each frame's discounted return (gamma {cfg.gamma:g}) of the rewards "
             f"{'unclipped' if cfg.reward_clip is None else f'clipped to +-{cfg.reward_clip:g}'}, cut at episode "
             f"ends: mean {float(data[2].mean()):.3f}, standard deviation "
             f"{float(data[2].std()):.3f} over the frames.")
    env = {**environment("cpu"), "command": "python -m benchmarks tool first_updates " + " ".join(argv or [])}
    results = Results(rows=rows, table=table(rows, args.updates), title=title, notes=notes,
                      name=f"first_updates-{name}", plot=lambda path: plot(rows, path))
    return write("first_updates", results, args.out, env)


if __name__ == "__main__":
    import sys

    try:
        for path in main(sys.argv[1:]):
            print("wrote", path)
    except UsageError as err:  # a usage error: one line, exit status 2 (as the suites' in benchmarks.__main__)
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
