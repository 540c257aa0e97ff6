"""User-loop benchmark: TorchRL's DQN update in a user's own loop, with each replay buffer and each way to run it.

One update = sample B transitions -> ``DQNLoss(double_dqn=True)`` (IS-weighted by ``priority_weight``, writes
``td_error``) -> backward -> ``Adam(capturable=True)`` step -> ``SoftUpdate`` -> ``update_tensordict_priority``.
Public APIs only; the network is TorchRL's ``QValueActor`` over an ``MLP`` 256-256; observation 51 f32, 45 actions,
N = 1e6 stored transitions, B = 256 (``--quick``: N = 1e4, B = 32, short runs).

Rows (``K``: updates per call, i.e. per graph replay):
  torchrl-eager            TorchRL's ``TensorDictPrioritizedReplayBuffer`` (C++ sum tree), eager
  torchrl-learner-graph    the same buffer; loss, backward, Adam and SoftUpdate in one ``torch.cuda.graph``,
                           sample and priority update outside (its sampler reads priorities on the host): the
                           best TorchRL's buffer allows
  ours-eager               the same loop with ``from lightning_per import GPUPrioritizedReplayBuffer`` in place
                           of TorchRL's class (one import switched), eager
  ours-captured-k1/-k8     the whole update in ``lightning_per.graphs.capture`` (K = 1, 8)
  ours-captured-compiled-k1/-k8   the same with ``torch.compile(loss)`` (default mode) inside the graph (CUDA)
  ours-cudagraphmodule     the whole update wrapped in tensordict's ``CudaGraphModule`` (warmup 2)
Columns: updates/s (median of ``--repeats`` timed runs of ~``--seconds`` each, wall clock between two device
synchronisations), us per update, host synchronisations per update (``torch.cuda.set_sync_debug_mode("warn")``),
and the ratios to torchrl-eager and torchrl-learner-graph of the same run.

TorchRL's C++ sum tree may need another interpreter than ours (on the H200 image: torchrl 0.11.1 for the tree,
torchrl 0.14.1 for us): the TorchRL rows run in a child process whose PYTHONPATH starts with
``$TORCHRL_PYTHONPATH`` (default ``$ANCHOR_PYTHONPATH``, set by ``benchmarks/h200_setup.sh``) and the rows are
merged into one table; they import nothing of lightning_per.

    python benchmarks/user_loop.py --out benchmarks/results/user_loop.json       # every row (CUDA)
    python benchmarks/user_loop.py --quick --device cpu --out /tmp/user_loop.json  # smoke test
    python benchmarks/user_loop.py --family ours --out /tmp/ours.json              # one family
    python benchmarks/user_loop.py --merge /tmp/ours.json /tmp/torchrl.json --out benchmarks/results/user_loop.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _harness import count_syncs  # noqa: E402

OBS, ACTIONS, HIDDEN = 51, 45, (256, 256)
KEYS = ("observation", "action", ("next", "observation"), ("next", "reward"), ("next", "done"),
        ("next", "terminated"), "priority_weight", "index")


def transitions(n: int, device, seed: int):
    """``n`` random transitions with the keys TorchRL's collector gives DQNLoss (built on ``device``)."""
    from tensordict import TensorDict

    g = torch.Generator(device).manual_seed(seed)
    action = torch.nn.functional.one_hot(torch.randint(0, ACTIONS, (n,), generator=g, device=device), ACTIONS)
    done = torch.rand(n, 1, generator=g, device=device) < 0.01
    return TensorDict({"observation": torch.randn(n, OBS, generator=g, device=device), "action": action,
                       "next": {"observation": torch.randn(n, OBS, generator=g, device=device),
                                "reward": torch.randn(n, 1, generator=g, device=device), "done": done,
                                "terminated": done.clone()}}, [n], device=device)


def make_buffer(cls, N: int, B: int, device):
    """``cls(alpha=0.6, beta=0.4, storage=LazyTensorStorage(N, device), batch_size=B)``, filled with N transitions."""
    from torchrl.data import LazyTensorStorage

    rb = cls(alpha=0.6, beta=0.4, storage=LazyTensorStorage(N, device=device), batch_size=B, priority_key="td_error")
    chunk = min(N, 100_000)
    for i in range(0, N, chunk):
        rb.extend(transitions(min(chunk, N - i), device, seed=i))
    return rb


def make_learner(device, seed: int = 0):
    """TorchRL's DQN learner: QValueActor (MLP 256-256), DQNLoss(double_dqn=True), SoftUpdate, Adam(capturable)."""
    from torchrl.data import OneHot
    from torchrl.modules import MLP, QValueActor
    from torchrl.objectives import DQNLoss, SoftUpdate

    torch.manual_seed(seed)
    spec = OneHot(ACTIONS, device=device)
    actor = QValueActor(MLP(in_features=OBS, out_features=ACTIONS, num_cells=list(HIDDEN), device=device),
                        in_keys=["observation"], spec=spec)
    loss = DQNLoss(actor, action_space=spec, delay_value=True, double_dqn=True)
    loss.make_value_estimator(gamma=0.99)
    target = SoftUpdate(loss, tau=0.005)
    opt = torch.optim.Adam(loss.parameters(), lr=1e-4, capturable=torch.device(device).type == "cuda")
    return loss, target, opt


def eager_update(rb, loss_fn, opt, target):
    """TorchRL's recipe step, as a user writes it."""
    def update():
        batch = rb.sample()
        out = loss_fn(batch)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        target.step()
        rb.update_tensordict_priority(batch)
        return out["loss"].detach()
    return update


def learner_graph_update(rb, loss, opt, target, device):
    """TorchRL's best with its buffer: the learner in a hand-written ``torch.cuda.graph``; sample + priorities eager."""
    static = rb.sample().select(*KEYS).clone()

    def learn():
        out = loss(static)  # writes static["td_error"]
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        target.step()
        return out["loss"].detach()

    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            learn()
    torch.cuda.current_stream(device).wait_stream(side)
    opt.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        learn()

    def update():
        static.update_(rb.sample().select(*KEYS))
        graph.replay()
        rb.update_tensordict_priority(static)
    return update, graph


def measure(call, k: int, device, seconds: float, repeats: int) -> dict:
    """Median updates/s of ``call`` (``k`` updates each) and its host syncs per update."""
    device = torch.device(device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(3):
        call()
    sync()
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < min(seconds / 4, 0.5) or n < 2:
        call()
        n += 1
    sync()
    rate = n / (time.perf_counter() - t0)
    calls = max(3, int(rate * seconds))
    rates = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        sync()
        rates.append(calls * k / (time.perf_counter() - t0))
    ups = statistics.median(rates)
    syncs = count_syncs(call, max(2, min(20, calls)), device)
    return {"K": k, "updates_per_s": ups, "us_per_update": 1e6 / ups, "runs": rates,
            "syncs_per_update": None if syncs is None else syncs / k}


def torchrl_rows(N: int, B: int, device, seconds: float, repeats: int) -> list[dict]:
    from torchrl.data import TensorDictPrioritizedReplayBuffer

    rb = make_buffer(TensorDictPrioritizedReplayBuffer, N, B, device)
    rows = []
    loss, target, opt = make_learner(device)
    rows.append({"impl": "torchrl-eager", **measure(eager_update(rb, loss, opt, target), 1, device, seconds,
                                                    repeats)})
    if torch.device(device).type == "cuda":
        loss, target, opt = make_learner(device)
        update, graph = learner_graph_update(rb, loss, opt, target, device)
        rows.append({"impl": "torchrl-learner-graph", **measure(update, 1, device, seconds, repeats)})
        torch.cuda.synchronize(device)
        graph.reset()
    return rows


def ours_rows(N: int, B: int, device, seconds: float, repeats: int) -> list[dict]:
    from lightning_per import GPUPrioritizedReplayBuffer as TensorDictPrioritizedReplayBuffer  # the one switch
    from lightning_per import graphs

    cuda = torch.device(device).type == "cuda"
    rb = make_buffer(TensorDictPrioritizedReplayBuffer, N, B, device)
    rows = []
    loss, target, opt = make_learner(device)
    rows.append({"impl": "ours-eager", **measure(eager_update(rb, loss, opt, target), 1, device, seconds, repeats)})
    for compiled in (False, True) if cuda else (False,):  # on CPU, Inductor's C++ path is not what this measures
        for k in (1, 8):
            torch._dynamo.reset()
            loss, target, opt = make_learner(device)
            loss_fn = torch.compile(loss) if compiled else loss
            update = graphs.capture(eager_update(rb, loss_fn, opt, target), state=[loss, opt, rb, target],
                                    updates_per_replay=k)
            name = f"ours-captured{'-compiled' if compiled else ''}-k{k}"
            rows.append({"impl": name, **measure(update, k, device, seconds, repeats), "graphed": update.graphed})
            update.release()
    if cuda:
        from tensordict.nn import CudaGraphModule

        loss, target, opt = make_learner(device)
        update = CudaGraphModule(eager_update(rb, loss, opt, target), warmup=2)
        rows.append({"impl": "ours-cudagraphmodule", **measure(update, 1, device, seconds, repeats)})
    return rows


def with_ratios(rows: list[dict]) -> list[dict]:
    base = {r["impl"]: r["updates_per_s"] for r in rows}
    for r in rows:
        for ref in ("torchrl-eager", "torchrl-learner-graph"):
            r[f"x_{ref}"] = r["updates_per_s"] / base[ref] if ref in base else None
    return rows


def table(rows: list[dict], meta: dict) -> str:
    def num(value, fmt):
        return "-" if value is None else format(value, fmt)

    lines = [f"User loop, {meta.get('device', '?')}: N = {meta['N']:.0e}, B = {meta['B']}, obs {OBS} f32, "
             f"{ACTIONS} actions, MLP {HIDDEN[0]}-{HIDDEN[1]}, DQNLoss(double_dqn=True), SoftUpdate, "
             f"Adam (capturable=True on CUDA).", "",
             "| loop | K | updates/s | us/update | host syncs/update | x TorchRL eager | x TorchRL best |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['impl']} | {r['K']} | {r['updates_per_s']:,.0f} | {r['us_per_update']:.1f} "
                     f"| {num(r.get('syncs_per_update'), '.2f')} | {num(r.get('x_torchrl-eager'), '.1f')} "
                     f"| {num(r.get('x_torchrl-learner-graph'), '.1f')} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
    names = [r["impl"] for r in rows]
    ax.barh(names, [r["updates_per_s"] for r in rows],
            color=["tab:gray" if n.startswith("torchrl") else "tab:blue" for n in names])
    ax.invert_yaxis()
    ax.set(xscale="log", xlabel="updates / s (higher is better)", title="TorchRL DQN update in a user loop")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _order(rows: list[dict]) -> list[dict]:
    order = ["torchrl-eager", "torchrl-learner-graph", "ours-eager", "ours-captured-k1", "ours-captured-k8",
             "ours-captured-compiled-k1", "ours-captured-compiled-k8", "ours-cudagraphmodule"]
    return sorted(rows, key=lambda r: order.index(r["impl"]) if r["impl"] in order else len(order))


def _meta(N: int, B: int, device) -> dict:
    import tensordict
    import torchrl

    cuda = torch.device(device).type == "cuda"
    return {"N": N, "B": B, "torch": torch.__version__, "torchrl": torchrl.__version__,
            "tensordict": tensordict.__version__, "device": torch.cuda.get_device_name() if cuda else "cpu"}


def _torchrl_child(args, out: Path) -> list[dict]:
    """The TorchRL family in a child interpreter (``$TORCHRL_PYTHONPATH`` first on its path)."""
    env = dict(os.environ)
    extra = os.environ.get("TORCHRL_PYTHONPATH") or os.environ.get("ANCHOR_PYTHONPATH")
    if extra:
        env["PYTHONPATH"] = os.pathsep.join([extra, *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, __file__, "--family", "torchrl", "--device", args.device, "--N", str(args.N), "--B",
           str(args.B), "--seconds", str(args.seconds), "--repeats", str(args.repeats), "--out", str(out)]
    subprocess.run(cmd, check=True, env=env)
    return json.loads(out.read_text())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=["all", "ours", "torchrl"], default="all")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--N", type=float, default=None, help="stored transitions (default 1e6; --quick 1e4)")
    ap.add_argument("--B", type=int, default=None, help="batch size (default 256; --quick 32)")
    ap.add_argument("--seconds", type=float, default=None, help="seconds per timed run (default 2; --quick 0.2)")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per row (default 3; --quick 1)")
    ap.add_argument("--quick", action="store_true", help="small sizes and short runs (smoke test, CPU)")
    ap.add_argument("--merge", nargs="*", help="JSON files of --family runs to merge into --out")
    ap.add_argument("--out", default="benchmarks/results/user_loop.json")
    args = ap.parse_args(argv)
    args.N = int(args.N or (1e4 if args.quick else 1e6))
    args.B = args.B or (32 if args.quick else 256)
    args.seconds = args.seconds or (0.2 if args.quick else 2.0)
    args.repeats = args.repeats or (1 if args.quick else 3)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.merge:
        parts = [json.loads(Path(f).read_text()) for f in args.merge]
        meta = {**parts[0]["meta"], "families": [p["meta"] for p in parts]}
        rows = [r for p in parts for r in p["rows"]]
    else:
        meta, rows = _meta(args.N, args.B, args.device), []
        if args.family == "torchrl":
            rows = torchrl_rows(args.N, args.B, args.device, args.seconds, args.repeats)
        elif args.family == "ours":
            rows = ours_rows(args.N, args.B, args.device, args.seconds, args.repeats)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                child = _torchrl_child(args, Path(tmp) / "torchrl.json")
            meta["families"] = [child["meta"], _meta(args.N, args.B, args.device)]
            rows = child["rows"] + ours_rows(args.N, args.B, args.device, args.seconds, args.repeats)
    rows = with_ratios(_order(rows))
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    if args.family == "torchrl" and not args.merge:
        return 0
    out.with_suffix(".md").write_text(table(rows, meta) + "\n")
    plot(rows, out.with_suffix(".png"))
    print(table(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
