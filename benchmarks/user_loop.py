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
  ours-eager-torchrl-env   ours-eager run beside the TorchRL rows, in their interpreter (with
                           ``--torchrl-pythonpath``: their torchrl and tensordict), so that the two eager rows
                           differ by the buffer only, not by the loss's and tensordict's versions
  ours-captured-k1/-k8     the whole update in ``lightning_per.graphs.capture`` (K = 1, 8)
  ours-captured-compiled-k1/-k8   the same with ``torch.compile(loss)`` (default mode) inside the graph (CUDA)
  ours-captured-compiled-learner-k8  the learner part (loss, backward, Adam, SoftUpdate) in one
                           ``torch.compile``'d function (LeanRL's recipe), sample and priority update around it,
                           all in the graph (CUDA)
  *-fused-adam             the same rows with ``Adam(capturable=True, fused=True)`` (one multi-tensor kernel per
                           step; foreach's capturable step launches about a dozen): TorchRL's eager and learner-graph
                           rows, ours captured (K = 8) and captured + compiled loss; their ratios are to the TorchRL
                           rows with that optimizer
  ours-cudagraphmodule     the whole update wrapped in tensordict's ``CudaGraphModule`` (warmup 2), over the same
                           buffer (CudaGraphModule registers no generator with its graph: the draws take their
                           uniforms from the compiled kernels' device RNG)
Columns: updates/s (median of ``--repeats`` timed runs of ~``--seconds`` each, wall clock between two device
synchronisations), us per update, host synchronisations per update (``torch.cuda.set_sync_debug_mode("warn")``),
and the ratios to torchrl-eager and torchrl-learner-graph of the same run.

TorchRL's C++ sum tree may need another interpreter than ours (where its extension is built for another torch):
with ``--torchrl-pythonpath DIR`` (default ``$TORCHRL_PYTHONPATH``, else ``$ANCHOR_PYTHONPATH``) the TorchRL rows
run in a child process with DIR first on its PYTHONPATH, beside ours-eager-torchrl-env, and the rows are merged
into one table. Without one, they run in this process.

    python -m benchmarks run user_loop                                  # every row, this machine (CUDA)
    python -m benchmarks run user_loop --quick --device cpu --out /tmp  # smoke test
    python -m benchmarks run user_loop --family ours --out /tmp/ours    # one family; then --merge A.json B.json
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks._harness import count_syncs
from benchmarks._results import Results

OBS, ACTIONS, HIDDEN = 51, 45, (256, 256)
#: suffix of the rows whose learner steps ``Adam(capturable=True, fused=True)``; their ratios are to the TorchRL rows
#: with the same optimizer
FUSED = "-fused-adam"
KEYS = ("observation", "action", ("next", "observation"), ("next", "reward"), ("next", "done"),
        ("next", "terminated"), "priority_weight", "_weight", "index")  # "_weight": older TorchRL's IS weights


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


def make_buffer(cls, N: int, B: int, device, **kwargs):
    """``cls(alpha=0.6, beta=0.4, storage=LazyTensorStorage(N, device), batch_size=B, **kwargs)``, filled with N
    transitions."""
    from torchrl.data import LazyTensorStorage

    rb = cls(alpha=0.6, beta=0.4, storage=LazyTensorStorage(N, device=device), batch_size=B, priority_key="td_error",
             **kwargs)
    chunk = min(N, 100_000)
    for i in range(0, N, chunk):
        rb.extend(transitions(min(chunk, N - i), device, seed=i))
    return rb


def make_learner(device, seed: int = 0, fused_adam: bool = False, captured: bool = False):
    """TorchRL's DQN learner: QValueActor (MLP 256-256), DQNLoss(double_dqn=True), SoftUpdate, Adam(capturable);
    ``fused_adam``: ``Adam(capturable=True, fused=True)`` (one multi-tensor kernel per step instead of foreach's
    dozen, CUDA). ``captured``: for ``graphs.capture``, which needs ``capturable=True`` on every device (on a CPU
    its eager calls step it as ``capturable=False``); plain eager loops on a CPU cannot step a capturable Adam."""
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
    cuda = torch.device(device).type == "cuda"
    opt = torch.optim.Adam(loss.parameters(), lr=1e-4, capturable=cuda or captured,
                           **({"fused": True} if fused_adam else {}))
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
    static = rb.sample().select(*KEYS, strict=False).clone()  # the IS weights' key differs across versions
    keys = list(static.keys(True, True))  # before the loss adds "td_error"

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
        static.update_(rb.sample().select(*keys))
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
        for fused in (False, True):
            def learner_graph(fused=fused):
                loss, target, opt = make_learner(device, fused_adam=fused)
                update, graph = learner_graph_update(rb, loss, opt, target, device)
                try:
                    return measure(update, 1, device, seconds, repeats)
                finally:
                    torch.cuda.synchronize(device)
                    graph.reset()
            rows.append(_row("torchrl-learner-graph" + FUSED * fused, learner_graph))
        loss, target, opt = make_learner(device, fused_adam=True)
        rows.append(_row("torchrl-eager" + FUSED, lambda: measure(eager_update(rb, loss, opt, target), 1, device,
                                                                  seconds, repeats)))
    return rows


def ours_eager(N: int, B: int, device, seconds: float, repeats: int) -> dict:
    """The ours-eager measurement (its buffer and learner built here, in whichever interpreter runs it)."""
    from lightning_per import GPUPrioritizedReplayBuffer

    rb = make_buffer(GPUPrioritizedReplayBuffer, N, B, device)
    loss, target, opt = make_learner(device)
    return measure(eager_update(rb, loss, opt, target), 1, device, seconds, repeats)


def compiled_learner_update(rb, loss, opt, target):
    """The update with its learner part (loss, backward, Adam, SoftUpdate) in one ``torch.compile``'d function
    (the LeanRL recipe's ``torch.compile(update)``); sample and priority update around it."""
    def learn(batch):
        out = loss(batch)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        target.step()
        return out["loss"].detach()

    learn = torch.compile(learn)

    def update():
        batch = rb.sample()
        out = learn(batch)
        rb.update_tensordict_priority(batch)
        return out
    return update


def _row(name: str, measure_row) -> dict:
    """One row, or its error (one failing row must not cost the others of a one-shot run)."""
    try:
        return {"impl": name, **measure_row()}
    except Exception as err:  # noqa: BLE001 - recorded in the results, printed
        print(f"{name} failed: {type(err).__name__}: {err}", file=sys.stderr)
        return {"impl": name, "K": None, "updates_per_s": None, "us_per_update": None,
                "error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]}


def ours_rows(N: int, B: int, device, seconds: float, repeats: int) -> list[dict]:
    from lightning_per import GPUPrioritizedReplayBuffer as TensorDictPrioritizedReplayBuffer  # the one switch
    from lightning_per import graphs

    cuda = torch.device(device).type == "cuda"
    rb = make_buffer(TensorDictPrioritizedReplayBuffer, N, B, device)
    rows = []
    loss, target, opt = make_learner(device)
    rows.append(_row("ours-eager", lambda: measure(eager_update(rb, loss, opt, target), 1, device, seconds, repeats)))
    variants = [("", 1), ("", 8)] + ([("-compiled", 1), ("-compiled", 8), ("-compiled-learner", 8), (FUSED, 8),
                                      ("-compiled" + FUSED, 8)] if cuda else [])
    for compiled, k in variants:  # on CPU, Inductor's C++ path is not what this measures
        def captured(compiled=compiled, k=k):
            torch._dynamo.reset()
            loss, target, opt = make_learner(device, fused_adam=compiled.endswith(FUSED), captured=True)
            compiled = compiled.removesuffix(FUSED)
            if compiled == "-compiled-learner":
                step = compiled_learner_update(rb, loss, opt, target)
            else:
                step = eager_update(rb, torch.compile(loss) if compiled else loss, opt, target)
            update = graphs.capture(step, state=[loss, opt, rb, target], updates_per_replay=k)
            try:
                return {**measure(update, k, device, seconds, repeats), "graphed": update.graphed}
            finally:
                update.release()
        name = f"ours-captured{compiled.removesuffix(FUSED)}-k{k}" + FUSED * compiled.endswith(FUSED)
        rows.append(_row(name, captured))
    if cuda:
        def graph_module():
            return measure(cudagraphmodule_update(N, B, device)[0], 1, device, seconds, repeats)
        rows.append(_row("ours-cudagraphmodule", graph_module))
    return rows


#: the sampler keywords of the CudaGraphModule row: the default sampler, whose draws take their uniforms from the
#: compiled kernels' device RNG (CudaGraphModule registers no generator with its graph; see docs/graphs.md)
CUDAGRAPHMODULE_SAMPLER: dict = {}


def cudagraphmodule_update(N: int, B: int, device, warmup: int = 2, sampler_kwargs: dict | None = None):
    """``(update, rb)``: the whole update in tensordict's ``CudaGraphModule(update, warmup=warmup)``, over our buffer
    ``rb`` (N transitions; sampler :data:`CUDAGRAPHMODULE_SAMPLER`, or ``sampler_kwargs``) and a new learner."""
    from tensordict.nn import CudaGraphModule

    from lightning_per import GPUPrioritizedReplayBuffer

    kwargs = dict(CUDAGRAPHMODULE_SAMPLER) if sampler_kwargs is None else sampler_kwargs
    rb = make_buffer(GPUPrioritizedReplayBuffer, N, B, device, sampler_kwargs=kwargs)
    loss, target, opt = make_learner(device)
    return CudaGraphModule(eager_update(rb, loss, opt, target), warmup=warmup), rb


def with_ratios(rows: list[dict]) -> list[dict]:
    """Each row's ratios to ``torchrl-eager`` and ``torchrl-learner-graph`` (the ``-fused-adam`` rows: to the TorchRL
    rows of that optimizer) of the same run."""
    base = {r["impl"]: r["updates_per_s"] for r in rows if r.get("updates_per_s")}
    for r in rows:
        suffix = FUSED * r["impl"].endswith(FUSED)
        for ref in ("torchrl-eager", "torchrl-learner-graph"):
            ok = ref + suffix in base and r.get("updates_per_s")
            r[f"x_{ref}"] = r["updates_per_s"] / base[ref + suffix] if ok else None
    return rows


def table(rows: list[dict]) -> str:
    def num(value, fmt):
        return "-" if value is None else format(value, fmt)

    lines = ["| loop | K | updates/s | us/update | host syncs/update | x TorchRL eager | x TorchRL best |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("error"):  # a failed row stays in the table, with its error (one line, no cell breaks)
            error = " ".join(str(r["error"]).split()).replace("|", "\\|")
            lines.append(f"| {r['impl']} | {num(r.get('K'), 'd')} | failed: {error} | - | - | - | - |")
            continue
        lines.append(f"| {r['impl']} | {r['K']} | {r['updates_per_s']:,.0f} | {r['us_per_update']:.1f} "
                     f"| {num(r.get('syncs_per_update'), '.2f')} | {num(r.get('x_torchrl-eager'), '.1f')} "
                     f"| {num(r.get('x_torchrl-learner-graph'), '.1f')} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.get("updates_per_s")]
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
    order = ["torchrl-eager", "torchrl-learner-graph", "ours-eager-torchrl-env", "ours-eager", "ours-captured-k1",
             "ours-captured-k8", "ours-captured-compiled-k1", "ours-captured-compiled-k8",
             "ours-captured-compiled-learner-k8", "ours-cudagraphmodule", "torchrl-eager" + FUSED,
             "torchrl-learner-graph" + FUSED, "ours-captured-k8" + FUSED, "ours-captured-compiled-k8" + FUSED]
    return sorted(rows, key=lambda r: order.index(r["impl"]) if r["impl"] in order else len(order))


def _versions() -> dict:
    import tensordict
    import torchrl

    return {"torch": torch.__version__, "torchrl": torchrl.__version__, "tensordict": tensordict.__version__}


def _torchrl_child(args, pythonpath: str) -> list[dict]:
    """The TorchRL rows in a child interpreter with ``pythonpath`` first on its path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([pythonpath, str(Path(__file__).parents[1]),
                                         *filter(None, [env.get("PYTHONPATH")])])
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "torchrl.json"
        cmd = [sys.executable, "-m", "benchmarks.user_loop", "--torchrl-rows", str(out), args.device, str(args.N),
               str(args.B), str(args.seconds), str(args.repeats)]
        subprocess.run(cmd, check=True, env=env, cwd=Path(__file__).parents[1])
        return json.loads(out.read_text())


def add_arguments(ap) -> None:
    ap.add_argument("--family", choices=["all", "ours", "torchrl"], default="all")
    ap.add_argument("--N", type=float, default=None, help="stored transitions (default 1e6; --quick 1e4)")
    ap.add_argument("--B", type=int, default=None, help="batch size (default 256; --quick 32)")
    ap.add_argument("--seconds", type=float, default=None, help="seconds per timed run (default 2; --quick 0.2)")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per row (default 3; --quick 1)")
    ap.add_argument("--torchrl-pythonpath", default=None,
                    help="run the TorchRL rows in a child process with this first on PYTHONPATH (default "
                         "$TORCHRL_PYTHONPATH, else $ANCHOR_PYTHONPATH; unset: in this process)")
    ap.add_argument("--merge", nargs="*", default=None, help="results JSON files of earlier runs to pool")


def run(args) -> Results:
    """Measure the rows (or pool ``--merge`` files), with the ratios of this run."""
    args.N = int(args.N or (1e4 if args.quick else 1e6))
    args.B = args.B or (32 if args.quick else 256)
    args.seconds = args.seconds or (0.2 if args.quick else 2.0)
    args.repeats = args.repeats or (1 if args.quick else 3)
    if args.merge:
        rows = [r for f in args.merge for r in json.loads(Path(f).read_text())["rows"]]
    else:
        rows = []
        if args.family in ("all", "torchrl"):
            path = args.torchrl_pythonpath or os.environ.get("TORCHRL_PYTHONPATH") or os.environ.get(
                "ANCHOR_PYTHONPATH")
            try:
                rows += (_torchrl_child(args, path) if path else
                         torchrl_rows(args.N, args.B, args.device, args.seconds, args.repeats))
            except (ImportError, RuntimeError, subprocess.CalledProcessError) as err:  # e.g. no C++ tree here
                print(f"TorchRL rows skipped ({type(err).__name__}: {err})", file=sys.stderr)
                rows.append({"impl": "torchrl-eager", "K": None, "updates_per_s": None, "us_per_update": None,
                             "error": f"TorchRL rows skipped: {type(err).__name__}: {err}"[:300]})
        if args.family in ("all", "ours"):
            rows += [{**r, **_versions()} for r in ours_rows(args.N, args.B, args.device, args.seconds, args.repeats)]
    rows = with_ratios(_order(rows))
    best = {r["impl"]: r for r in rows}
    notes = []
    for impl in ("ours-captured-k8", "ours-captured-compiled-k8", "ours-captured-compiled-learner-k8",
                 "ours-captured-k8" + FUSED, "ours-captured-compiled-k8" + FUSED):
        if impl in best and best[impl].get("x_torchrl-eager") is not None:
            r = best[impl]
            notes.append(f"- {impl}: {r['updates_per_s']:,.0f} updates/s, {r['x_torchrl-eager']:.1f}x TorchRL's eager "
                         f"recipe" + (f", {r['x_torchrl-learner-graph']:.1f}x TorchRL's best (learner in a graph)"
                                      if r.get("x_torchrl-learner-graph") is not None else "") + " (same run)")
    return Results(rows=rows, table=table(rows), plot=lambda path: plot(rows, path), notes="\n".join(notes),
                   title=f"TorchRL's DQN update in a user loop: updates per second (N = {args.N:.0e}, B = {args.B}, "
                         f"obs {OBS} f32, {ACTIONS} actions, MLP {HIDDEN[0]}-{HIDDEN[1]}, DQNLoss(double_dqn=True), "
                         f"SoftUpdate, Adam(capturable=True on CUDA)); host syncs per update; ratios of this run.")


if __name__ == "__main__":  # the TorchRL rows for a parent run in another interpreter (see the module docstring)
    if len(sys.argv) == 8 and sys.argv[1] == "--torchrl-rows":
        out, device, N, B, seconds, repeats = sys.argv[2:]
        N, B, seconds, repeats = int(N), int(B), float(seconds), int(repeats)
        try:
            found = torchrl_rows(N, B, device, seconds, repeats)
        except (ImportError, RuntimeError) as err:  # e.g. TorchRL's C++ tree does not load here
            found = [{"impl": "torchrl-eager", "K": None, "updates_per_s": None, "us_per_update": None,
                      "error": f"TorchRL rows skipped: {type(err).__name__}: {err}"[:300]}]
        found.append(_row("ours-eager-torchrl-env", lambda: ours_eager(N, B, device, seconds, repeats)))
        Path(out).write_text(json.dumps([{**r, **_versions()} for r in found]))
    else:
        sys.exit("run the suite with: python -m benchmarks run user_loop [--quick] [--out DIR]")
