"""DQN update benchmark: updates/s of the seed-sized Q-network (51 -> 256 -> 256 -> 45, B = 256).

One update = sample B from a prioritized replay of N transitions -> double-DQN n-step target ->
IS-weighted Huber loss -> backward -> clip -> Adam -> priority update (|td|). Rows:

  ours-eager     lightning_per replay (GPUPrioritizedSampler, proportional) + the DQN learner step, eager
  ours-graph     the same update captured in one CUDA graph (lightning_per.graphs.capture,
                 scope "full": sampling and the priority update inside the graph)           [CUDA only]
  ours-graph-inductor  the same captured update with the learner's pure-tensor parts (forwards, target,
                 loss and their backward, the gradient clip) compiled by Inductor first
                 (lightning_per.dqn.compiled.InductorUpdate, as DQN(inductor=True)) and the Adam step
                 compiled too (foreach Adam through lightning_per.dqn.compiled.CompiledStep, as the module
                 does in graph mode): the graph replays Inductor's fused kernels. The row adds compile_s
                 (the first two, compiling calls: dynamo + Inductor + Triton autotuning, seconds) and
                 setup_s (warm-ups + capture), both outside the timed replays; ours-graph has setup_s
                 too                                                                       [CUDA only]
  ours-graph-inductor-tf32  the same with TF32 tensor cores for the float32 matmuls
                 (torch.backends.cuda.matmul.allow_tf32, i.e. torch.set_float32_matmul_precision("high"):
                 10-bit mantissa products, float32 accumulation)                             [CUDA only]
  ...-x<K>       K updates per CUDA-graph replay (DQN(updates_per_graph=K)); --per-graph takes several K
  ...-autotune-  Inductor mode max-autotune-no-cudagraphs (--autotune: every GEMM shape autotuned)
  ...-separate-clip  the gradient clip as its own compiled function before the compiled Adam step; every
                 other Inductor row clips inside the compiled step (CompiledStep(clip=...)), as DQN does
  ...-serial-priorities  the updates one after the other on one stream; every other Inductor row forks
                 each update's priority update and the next update's sample onto a second stream after the
                 forward (lightning_per.graphs.pipeline.pipelined_updates), concurrent with the backward and
                 the step, as DQN's graph mode does
  torchrl-eager  TorchRL TensorDictPrioritizedReplayBuffer (its C++ sum tree; LazyTensorStorage on the
                 same device) + the same learner step
  dqn-fit        the whole DQN LightningModule under Trainer.fit on TorchCartPoleEnv (env steps at the
                 configured replay ratio included; graph mode on CUDA): updates/s of the second epoch and
                 host synchronisations per step counted with torch.cuda.set_sync_debug_mode("warn") from
                 the start to the end of that epoch (epoch-end hooks excluded). With --devices N > 1 it
                 runs under Lightning DDP (strategy "ddp", one process per GPU, graph mode with the
                 gradient all-reduce inside the captured update; on --device cpu: gloo, eager). Every
                 rank does the same updates of B each, so the row adds world_size,
                 updates_per_s_per_rank (= updates_per_s, rank 0's rate) and updates_per_s_total
                 (= world_size x per rank: updates of B-sized batches per second over all GPUs; one
                 synchronous step's global batch is world_size x B)
  dqn-fit-inductor  (--fit-inductor) dqn-fit with DQN(inductor=True)

Every row reports updates/s, microseconds per update and host syncs per update (CUDA only; counted with
``torch.cuda.set_sync_debug_mode("warn")``).

    python -m benchmarks run dqn                                        # GPU machine: every row
    python -m benchmarks run dqn --quick --out runs/bench               # smoke test (any machine)
    python -m benchmarks run dqn --family ours --out /tmp/ours          # one family per interpreter ...
    python -m benchmarks run dqn --merge /tmp/ours/dqn-h200.json /tmp/torchrl/dqn-h200.json   # ... pooled

    python -m benchmarks run dqn --fit-only --out /tmp/fit1             # dqn-fit on 1 GPU
    python -m benchmarks run dqn --fit-only --devices 2 --out /tmp/fit2 # dqn-fit on 2 GPUs (DDP)
    python -m benchmarks run dqn --scaling /tmp/fit1/dqn-h200.json /tmp/fit2/dqn-h200x2.json   # N / 1 device
    python -m benchmarks run dqn --pool /tmp/fit*/dqn-h200*.json    # repeated runs: medians, spread, scaling

Under --devices N > 1 Lightning's DDP launcher re-runs the command once per extra rank; only rank 0
writes results (the replay rows are single-device measurements: --devices N > 1 implies --fit-only).
Where TorchRL's C++ sum tree does not load against the installed torch, run ``--family torchrl`` in an
interpreter whose TorchRL loads it and merge (benchmarks/README.md).
"""

from __future__ import annotations

import copy
import json
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks._harness import capture, count_syncs, timed  # noqa: F401
from benchmarks._results import Results

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# --------------------------------------------------------------------------------------- pieces
def make_net(obs: int, hidden: list[int], actions: int) -> nn.Module:
    layers, width = [], obs
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return nn.Sequential(*layers, nn.Linear(width, actions))


def load_learner_step():
    """lightning_per's learner step; an identical inline copy where our package does not import
    (the torchrl family may run with an older torchrl)."""
    try:
        from lightning_per.dqn.learner import learner_step
        return learner_step
    except Exception:  # noqa: BLE001
        def learner_step(q_net, target_net, optimizer, b, *, double_dqn=True, huber_delta=1.0,
                         grad_clip_norm=10.0, backward=None):
            n = b["action"].shape[0]
            q_both = q_net(torch.cat((b["observation"], b["next_observation"])))
            q_taken = q_both[:n].gather(1, b["action"].long().unsqueeze(1)).squeeze(1)
            with torch.no_grad():
                nt = target_net(b["next_observation"])
                a = q_both[n:].argmax(-1, keepdim=True)
                y = b["reward"] + b["discount"] * nt.gather(-1, a).squeeze(-1)
            loss = (b["weight"] * F.huber_loss(q_taken, y, reduction="none", delta=huber_delta)).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(q_net.parameters(), grad_clip_norm, foreach=True)
            optimizer.step()
            td = (y - q_taken).detach()
            return {"loss": loss.detach(), "td": td, "td_abs": td.abs(), "q": q_taken.detach(),
                    "weight": b["weight"]}
        return learner_step


def transitions(n: int, obs: int, actions: int, device):
    from tensordict import TensorDict

    return TensorDict({"observation": torch.randn(n, obs, device=device),
                       "action": torch.randint(0, actions, (n,), device=device),
                       "reward": torch.randn(n, device=device),
                       "discount": torch.full((n,), 0.99 ** 3, device=device),
                       "next_observation": torch.randn(n, obs, device=device)}, [n], device=device)


def fill(rb, n: int, obs: int, actions: int, device) -> None:
    for start in range(0, n, 1 << 15):
        rb.extend(transitions(min(1 << 15, n - start), obs, actions, device))


def eager_step(rb, learner_step, q, tgt, opt):
    """One eager PER update through a TorchRL-style prioritized buffer (ours or TorchRL's)."""
    def step():
        batch = rb.sample()
        opt.zero_grad(set_to_none=True)
        out = learner_step(q, tgt, opt, inputs_of(batch, batch["priority_weight"]))
        rb.update_priority(batch["index"], out["td_abs"])
    return step


def graph_body(sampler, storage, learner_step, q, tgt, opt, batch: int, fast=None, clip_in_step: bool = False,
               side=None, per_graph: int = 1, zero_grad=None):
    """The captured body of the graph rows: ``per_graph`` updates, each sample + gather (one fused op with the
    packed storage) -> learner step -> priority update, all on the device (as ``ReplayGraphUpdate.body`` of
    ``lightning_per.dqn.updates``);
    ``fast``: an ``InductorUpdate`` whose compiled loss and clip replace the eager ones; ``clip_in_step``:
    ``opt`` is a ``CompiledStep`` that clips itself (the learner step does not); ``side``: a ``SideStream``
    on which each update's priority update and the next update's sample run, concurrent with its backward
    and step (``pipelined_updates``, as DQN's graph mode), else the updates run one after the other on one
    stream; ``zero_grad``: called before every update but the first (each starts without gradients)."""
    from lightning_per.dqn.learner import pipelined_updates

    extra = {} if fast is None else {"loss_fn": fast.loss, "clip_fn": fast.clip}
    if clip_in_step:
        extra["grad_clip_norm"] = None

    def draw():
        return sampler.sample_gather(storage, batch)  # [B], {[B]}, [B]: one fused op, as DQN

    def learn(i, sample, after_forward=None):
        if i and zero_grad is not None:
            zero_grad()
        _, info, data = sample
        return learner_step(q, tgt, opt, inputs_of(data, info["priority_weight"]), after_forward=after_forward,
                            **extra)

    def write(sample, td_abs):
        sampler.update_priority(sample[0], td_abs, storage=None)

    def body(_=None):
        if side is not None:
            return pipelined_updates(per_graph, draw, learn, write, side)
        for i in range(per_graph):
            sample = draw()
            out = learn(i, sample)
            write(sample, out["td_abs"])
        return out
    return body


def captured(body, opt, q, sampler, device) -> tuple[object, float]:
    """``graphs.capture`` of ``body`` (no recompilation inside the capture) and its setup seconds (warm-up,
    capture and the first replay). No sync check: the Inductor rows recompile in the warm-up."""
    from lightning_per import graphs

    def step():
        opt.zero_grad(set_to_none=True)  # each call starts without gradients
        return body()

    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    graph = graphs.capture(step, state=[q, opt, sampler], check_syncs=False)
    graph()  # warm-up, rollback, capture, replay
    torch.cuda.synchronize(device)
    return graph, time.perf_counter() - t0


def inputs_of(batch, weight):
    return {"observation": batch["observation"], "next_observation": batch["next_observation"],
            "action": batch["action"], "reward": batch["reward"], "discount": batch["discount"],
            "weight": weight.to(torch.float32)}


def row(name: str, seconds: float, syncs, **extra) -> dict:
    return {"impl": name, "updates_per_s": 1.0 / seconds, "update_us": seconds * 1e6,
            "syncs_per_update": syncs,
            **extra}


# ------------------------------------------------------------------------------------------ rows
def replay_rows(family: str, a, device) -> list[dict]:
    learner_step = load_learner_step()
    torch.manual_seed(0)
    q = make_net(a.obs, a.hidden, a.actions).to(device)
    tgt = copy.deepcopy(q).requires_grad_(False)
    opt = torch.optim.Adam(q.parameters(), lr=1e-4, fused=True, capturable=device.type == "cuda")
    rows = []
    if family == "ours":
        from lightning_per import make_replay_buffer
        from lightning_per.dqn.compiled import CompiledStep, InductorUpdate
        from lightning_per.graphs.pipeline import SideStream

        rb = make_replay_buffer(a.capacity, a.batch, sampler="proportional", device=device, packed=True)  # as DQN
        fill(rb, a.capacity, a.obs, a.actions, device)

        eager = eager_step(rb, learner_step, q, tgt, opt)
        rows.append(row("ours-eager", timed(eager, a.iters, device), count_syncs(eager, 50, device)))
        if device.type == "cuda":
            sampler, storage = rb.sampler, rb.storage
            graph, setup_s = captured(graph_body(sampler, storage, learner_step, q, tgt, opt, a.batch),
                                      opt, q, sampler, device)
            rows.append(row("ours-graph", timed(graph, a.iters * 4, device), count_syncs(graph, 200, device),
                            setup_s=setup_s))
            if not a.no_inductor:
                # DQN(inductor=True, compile=True): compiled loss + backward and clip, compiled foreach Adam
                opt_c = torch.optim.Adam(q.parameters(), lr=1e-4, foreach=True, capturable=True)
                fast = InductorUpdate(q, tgt, double_dqn=True, huber_delta=1.0, grad_clip_norm=10.0)
                # as DQN's graph mode: the clip compiled into the Adam step (one function: fewer kernels)
                steppers = {True: CompiledStep(opt_c, clip=(list(q.parameters()), 10.0)), False: CompiledStep(opt_c)}
                best_k = max(a.per_graph)
                # (row, TF32, Inductor mode, updates per graph replay: DQN(updates_per_graph=...), clip in step,
                #  priority update on a side stream concurrent with backward + step, as DQN on CUDA)
                variants = [("ours-graph-inductor", False, "default", 1, True, True),
                            ("ours-graph-inductor-tf32", True, "default", 1, True, True)]
                variants += [(f"ours-graph-inductor-tf32-x{k}", True, "default", k, True, True) for k in a.per_graph]
                mode = "max-autotune-no-cudagraphs" if a.autotune else "default"
                tag = "autotune-tf32" if a.autotune else "tf32"
                if a.autotune:
                    variants += [("ours-graph-inductor-autotune-tf32", True, mode, 1, True, True)]
                    variants += [(f"ours-graph-inductor-autotune-tf32-x{k}", True, mode, k, True, True)
                                 for k in a.per_graph]
                variants += [(f"ours-graph-inductor-{tag}-x{best_k}-separate-clip", True, mode, best_k, False, True),
                             (f"ours-graph-inductor-{tag}-x{best_k}-serial-priorities", True, mode, best_k, True,
                              False)]
                compiled = {"default": fast}
                side = SideStream(device)
                for name, tf32, mode, per_graph, clip_in_step, overlap in variants:
                    torch.backends.cuda.matmul.allow_tf32 = tf32  # TF32 tensor cores for the float32 matmuls
                    if mode not in compiled:
                        compiled[mode] = InductorUpdate(q, tgt, double_dqn=True, huber_delta=1.0,
                                                        grad_clip_norm=10.0, mode=mode)
                    one = graph_body(sampler, storage, learner_step, q, tgt, steppers[clip_in_step], a.batch,
                                     compiled[mode], clip_in_step=clip_in_step, side=side if overlap else None)
                    # as DQN(updates_per_graph=K): every update starts without gradients
                    body = graph_body(sampler, storage, learner_step, q, tgt, steppers[clip_in_step], a.batch,
                                      compiled[mode], clip_in_step=clip_in_step, side=side if overlap else None,
                                      per_graph=per_graph, zero_grad=lambda: opt_c.zero_grad(set_to_none=True))

                    torch.cuda.synchronize(device)
                    t0 = time.perf_counter()
                    for _ in range(2):  # compiles and autotunes (the step recompiles once); not timed
                        opt_c.zero_grad(set_to_none=True)
                        one()
                    torch.cuda.synchronize(device)
                    compile_s = time.perf_counter() - t0
                    graph, setup_s = captured(body, opt_c, q, sampler, device)
                    calls = max(1, a.iters * 4 // per_graph)
                    seconds = timed(graph, calls, device) / per_graph
                    rows.append(row(name, seconds, count_syncs(graph, 200, device) / per_graph,
                                    compile_s=compile_s, setup_s=setup_s, tf32=tf32, inductor_mode=mode,
                                    updates_per_graph=per_graph, clip_in_step=clip_in_step,
                                    priorities_on_side_stream=overlap))
                    del graph
                torch.backends.cuda.matmul.allow_tf32 = False
    else:
        from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer

        storage = LazyTensorStorage(a.capacity, device=device)
        rb = TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=storage, batch_size=a.batch)
        fill(rb, a.capacity, a.obs, a.actions, device)

        eager = eager_step(rb, learner_step, q, tgt, opt)
        rows.append(row("torchrl-eager", timed(eager, a.iters, device), count_syncs(eager, 50, device)))
    for r in rows:
        r.update(N=a.capacity, B=a.batch, net=f"{a.obs}-{'-'.join(map(str, a.hidden))}-{a.actions}")
    return rows


def fit_row(a, device) -> tuple[dict, int]:
    """The DQN module under Trainer.fit; epoch 0 warms up (and captures), epoch 1 is measured.

    With ``a.devices > 1``: Lightning DDP over that many GPUs (this process is one rank). Returns the row
    (this rank's timing) and this process's global rank (only rank 0 writes results)."""
    import lightning.pytorch as pl

    from lightning_per.callbacks import AsyncMetricsCallback
    from lightning_per.dqn import DQN, ReplayConfig
    from lightning_per.envs import EnvConfig

    class Probe(pl.Callback):
        def __init__(self):
            self.t0 = self.t1 = None
            self.caught: list = []
            self._ctx = None

        def on_train_epoch_start(self, trainer, pl_module):
            if trainer.current_epoch == 1:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                    self._ctx = warnings.catch_warnings(record=True)
                    self.caught = self._ctx.__enter__()
                    warnings.simplefilter("always")
                    torch.cuda.set_sync_debug_mode("warn")
                self.t0 = time.perf_counter()

        def on_train_epoch_end(self, trainer, pl_module):  # runs before the module's epoch-end hook
            if trainer.current_epoch == 1:
                if device.type == "cuda":
                    torch.cuda.set_sync_debug_mode(0)
                    self._ctx.__exit__(None, None, None)
                    torch.cuda.synchronize()
                self.t1 = time.perf_counter()

    env = EnvConfig(backend="torch", num_envs=a.fit_envs)
    model = DQN(env=env, replay=ReplayConfig(capacity=a.capacity, batch_size=a.batch), hidden_sizes=a.hidden,
                warmup_steps=max(2 * a.batch, 1000 if not a.quick else 64), updates_per_epoch=a.fit_steps,
                updates_per_step=a.updates_per_step, updates_per_graph=a.updates_per_graph,
                replay_ratio=a.replay_ratio, compile=device.type == "cuda", inductor=a.fit_inductor)
    torch.backends.cuda.matmul.allow_tf32 = a.fit_tf32
    probe = Probe()
    trainer = pl.Trainer(accelerator="gpu" if device.type == "cuda" else "cpu", devices=a.devices,
                         strategy="ddp" if a.devices > 1 else "auto", max_epochs=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, limit_val_batches=0,
                         callbacks=[probe, AsyncMetricsCallback(prog_bar=False)])
    trainer.fit(model)
    seconds = (probe.t1 - probe.t0) / a.fit_steps
    syncs = None
    if device.type == "cuda":
        syncs = sum("synchroniz" in str(w.message) for w in probe.caught) / a.fit_steps
    world_size = trainer.world_size
    name = ("dqn-fit-inductor" if a.fit_inductor else "dqn-fit") + ("-tf32" if a.fit_tf32 else "")
    name += f"-x{a.updates_per_graph}-per-graph" if a.updates_per_graph > 1 else ""
    r = row(name, seconds, syncs, N=a.capacity, B=a.batch, net=f"4-{'-'.join(map(str, a.hidden))}-2",
            env="TorchCartPoleEnv", num_envs=a.fit_envs, replay_ratio=a.replay_ratio, steps=a.fit_steps,
            updates_per_step=a.updates_per_step, updates_per_graph=a.updates_per_graph, tf32=a.fit_tf32,
            world_size=world_size, updates_per_s_per_rank=1.0 / seconds,
            updates_per_s_total=world_size / seconds)
    return r, trainer.global_rank


# ------------------------------------------------------------------------------------------ output
def table(rows: list[dict]) -> str:
    lines = ["| impl | net | N | B | updates/s | us/update | syncs/update | compile s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        syncs = "n/a" if r.get("syncs_per_update") is None else f"{r['syncs_per_update']:.2f}"
        comp = "" if r.get("compile_s") is None else f"{r['compile_s']:.1f}"
        lines.append(f"| {r['impl']} | {r.get('net', '')} | {r.get('N', '')} | {r.get('B', '')} | "
                     f"{r['updates_per_s']:,.0f} | {r['update_us']:.1f} | {syncs} | {comp} |")
    for r in rows:
        if r.get("world_size", 1) > 1:
            lines.append(f"\n{r['impl']} on {r['world_size']} devices (DDP): updates/s is per rank; "
                         f"{r['updates_per_s_total']:,.0f} updates/s in total")
    by = {r["impl"]: r["updates_per_s"] for r in rows}
    if "ours-graph" in by and "torchrl-eager" in by:
        lines.append(f"\nours-graph / torchrl-eager: {by['ours-graph'] / by['torchrl-eager']:.1f}x")
    for name in ("ours-graph-inductor", "ours-graph-inductor-tf32"):
        if "ours-graph" in by and name in by:
            lines.append(f"\n{name} / ours-graph: {by[name] / by['ours-graph']:.2f}x")
        if "torchrl-eager" in by and name in by:
            lines.append(f"\n{name} / torchrl-eager: {by[name] / by['torchrl-eager']:.1f}x")
    return "\n".join(lines) + "\n"


def scaling(files: list[str]) -> tuple[list[dict], dict, str]:
    """The dqn-fit rows of ``files`` (1 device and N devices) and the scaling of total updates/s."""
    rows = [r for f in files for r in json.loads(Path(f).read_text())["rows"] if r["impl"].startswith("dqn-fit")]
    for r in rows:  # rows written before --devices: one device
        r.setdefault("world_size", 1)
        r.setdefault("updates_per_s_per_rank", r["updates_per_s"])
        r.setdefault("updates_per_s_total", r["world_size"] * r["updates_per_s_per_rank"])
    rows.sort(key=lambda r: r["world_size"])
    one = [r for r in rows if r["world_size"] == 1]
    many = [r for r in rows if r["world_size"] > 1]
    if not one or not many:
        raise SystemExit(f"--scaling needs a 1-device and an N-device dqn-fit row; got world sizes "
                         f"{[r['world_size'] for r in rows]} from {files}")
    base, top = one[0], many[-1]
    ratio = top["updates_per_s_total"] / base["updates_per_s_total"]
    result = {"devices": top["world_size"], "total_1": base["updates_per_s_total"],
              "total_n": top["updates_per_s_total"], "ratio": ratio, "efficiency": ratio / top["world_size"]}
    lines = ["| devices | row | net | B | updates/s per rank | updates/s total | syncs/update |",
             "|---|---|---|---|---|---|---|"]
    for r in (base, top):
        syncs = "n/a" if r.get("syncs_per_update") is None else f"{r['syncs_per_update']:.2f}"
        lines.append(f"| {r['world_size']} | {r['impl']} | {r.get('net', '')} | {r.get('B', '')} | "
                     f"{r['updates_per_s_per_rank']:,.0f} | {r['updates_per_s_total']:,.0f} | {syncs} |")
    lines.append(f"\ntotal updates/s, {top['world_size']} devices / 1 device: {ratio:.2f}x "
                 f"(efficiency {result['efficiency']:.0%})")
    return [base, top], result, "\n".join(lines) + "\n"


def add_net_args(ap, device: bool = True) -> None:
    """The options of the seed-sized update (``--device`` if ``device``, replay capacity N, batch B, MLP
    obs-hidden-actions), shared with ``profile_dqn.py``."""
    if device:
        ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--capacity", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--obs", type=int, default=51)
    ap.add_argument("--actions", type=int, default=45)
    ap.add_argument("--hidden", type=int, nargs="+", default=[256, 256])


def add_arguments(ap) -> None:
    ap.add_argument("--family", choices=["all", "ours", "torchrl"], default="all")
    add_net_args(ap, device=False)
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--fit-steps", type=int, default=1000, help="updates in the measured dqn-fit epoch")
    ap.add_argument("--updates-per-step", type=int, default=1,
                    help="DQN updates_per_step of the dqn-fit row (gradient updates per Lightning step)")
    ap.add_argument("--updates-per-graph", type=int, default=1,
                    help="DQN updates_per_graph of the dqn-fit row (updates captured in one CUDA graph)")
    ap.add_argument("--fit-tf32", action="store_true", help="dqn-fit with TF32 matmuls")
    ap.add_argument("--per-graph", type=int, nargs="+", default=[8],
                    help="updates per CUDA-graph replay of the ours-graph-inductor*-x<K> rows (one row per K)")
    ap.add_argument("--autotune", action="store_true",
                    help="add ours-graph-inductor-autotune-tf32 (Inductor mode max-autotune-no-cudagraphs)")
    ap.add_argument("--fit-envs", type=int, default=64)
    ap.add_argument("--replay-ratio", type=float, default=0.25)
    ap.add_argument("--no-fit", action="store_true", help="skip the dqn-fit row")
    ap.add_argument("--no-inductor", action="store_true", help="skip the ours-graph-inductor row")
    ap.add_argument("--fit-inductor", action="store_true",
                    help="dqn-fit with DQN(inductor=True); the row is named dqn-fit-inductor (compilation falls "
                         "in the unmeasured first epoch)")
    ap.add_argument("--fit-only", action="store_true", help="only the dqn-fit row (skip the replay rows)")
    ap.add_argument("--devices", type=int, default=1,
                    help="GPUs for the dqn-fit row (> 1: Lightning DDP, implies --fit-only)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op CPU threads")
    ap.add_argument("--merge", nargs="*", default=None, help="results JSON files of earlier runs: one table")
    ap.add_argument("--scaling", nargs=2, metavar=("ONE.json", "N.json"), default=None,
                    help="dqn-fit rows of a 1-device and an N-device run: the scaling table, nothing measured")
    ap.add_argument("--pool", nargs="+", default=None, metavar="RUN.json",
                    help="results of repeated --fit-only runs (1 and N devices): every run, the median and spread "
                         "per configuration and the scaling of the medians (benchmarks/fit_runs.py), nothing "
                         "measured")


def run(args) -> Results | None:
    """The update rows (and the dqn-fit row); None on a DDP rank other than 0 (rank 0 writes)."""
    a = args
    if a.merge:
        rows = [r for f in a.merge for r in json.loads(Path(f).read_text())["rows"]]
        return Results(rows=rows, table=table(rows), metric="updates_per_s", title=TITLE)
    if a.pool:
        from benchmarks import fit_runs

        runs = fit_runs.load(a.pool)
        files = [json.loads(Path(f).read_text()) for f in a.pool]
        rows = [r for data in files for r in data["rows"]]
        return Results(rows=rows, table=fit_runs.table(runs), plot=lambda path: fit_runs.plot(runs, path),
                       devices=max(world for _, world in runs),
                       extra={"pooled": [{"file": str(f), "environment": data.get("environment")}
                                         for f, data in zip(a.pool, files)]},
                       title="dqn-fit runs pooled: total updates/s of every run, the median and spread per "
                             "configuration and device count, and the scaling of the medians.")
    if a.scaling:
        rows, result, text = scaling(a.scaling)
        return Results(rows=rows, table=text, metric="updates_per_s_total", extra={"scaling": result},
                       devices=result["devices"], title="dqn-fit total updates/s on 1 and N devices (DDP).")
    if a.devices < 1:
        raise SystemExit(f"--devices must be >= 1, got {a.devices}")
    if a.devices > 1 and not a.fit_only:
        print(f"--devices {a.devices}: the replay rows measure one device; running the dqn-fit row only",
              file=sys.stderr)
        a.fit_only = True
    if a.fit_only and a.no_fit:
        raise SystemExit("--fit-only and --no-fit together leave nothing to run")
    if a.quick:
        a.capacity, a.batch, a.hidden, a.iters, a.fit_steps, a.fit_envs = 2048, 32, [32, 32], 20, 20, 4
    torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    rows: list[dict] = []
    for family in () if a.fit_only else (("ours", "torchrl") if a.family == "all" else (a.family,)):
        try:
            rows += replay_rows(family, a, device)
        except (ImportError, RuntimeError) as err:  # e.g. TorchRL's C++ tree missing for this torch
            print(f"{family}: skipped ({type(err).__name__}: {err})", file=sys.stderr)
    rank = 0
    if (a.fit_only or a.family in ("all", "ours")) and not a.no_fit:
        fit, rank = fit_row(a, device)
        rows.append(fit)
    if rank != 0:
        return None
    return Results(rows=rows, table=table(rows), metric="updates_per_s", devices=a.devices, title=TITLE)


TITLE = ("One DQN update = sample B -> double-DQN n-step target -> IS-weighted Huber loss -> backward -> clip -> "
         "Adam -> priority update; updates/s, microseconds and host syncs per update.")
