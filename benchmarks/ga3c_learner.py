"""GA3C learner alone on synthetic Pong-shaped batches: its maximum TPS and the time split per update.

The real :class:`~lightning_per.ga3c.GA3C` module, its loss, optimiser and ``Trainer`` (the CLI's
:func:`~lightning_per.ga3c.cli.build_trainer`, with :class:`~lightning_per.callbacks.AsyncMetricsCallback`),
its data loader over the bounded batch queue, and the real :class:`~lightning_per.ga3c.workers.TrainerThread`
threads that claim rollouts from the shared buffers, copy them out and merge them into (pinned) batches.
What is missing: agent processes, and predictor threads unless ``--synthetic-pps`` asks for them (then
the real :class:`~lightning_per.actors.predictor.PredictorThread` serves paced synthetic requests, to measure
how much they slow the learner down: GIL, CPU, device). Every rollout slot of the shared buffers holds
random Pong-shaped data (``(4, S, S)`` uint8 frames, 6 actions) and is marked ready again as soon as a
trainer took it, so the trainers are never starved and the learner runs as fast as it can.

Per measured update the host time (``time.perf_counter``) is split into: ``wait`` (the data loader
waiting for the batch queue), ``h2d`` (Lightning's ``transfer_batch_to_device``), ``forward`` (``training_step``:
forward, loss, device metrics), ``backward`` (``on_before_backward`` -> ``on_after_backward``), ``step``
(the rest of Lightning's ``optimizer_step``: zero_grad, hooks, gradient clipping, the optimiser) and
``lightning`` (everything else: the fit loop, data fetcher, hooks, the module's ``on_train_batch_end``).
On CUDA the device time of ``h2d``, ``forward``, ``backward`` and ``step`` is measured with CUDA events
(read after the run, so no host synchronisation during it), and host synchronisations during the measured
updates are counted with ``torch.cuda.set_sync_debug_mode("warn")`` (as :func:`benchmarks._harness.count_syncs`).
With ``--cuda-graph`` on CUDA (``cuda_graph: true``, graph mode) ``training_step`` is the whole update,
so ``forward`` is the copy of the pinned batch into the graph's static inputs plus the one replay (forward,
loss, backward, clip, optimiser step, metrics), and ``h2d``, ``backward`` and ``step`` are 0 (the row's
``cuda_graph`` says which mode ran; the capture falls in the warm-up updates).

The ``bare`` figure is the floor: the same net, loss, optimiser and gradient clipping in a plain PyTorch
loop on one batch already on the device (no Lightning, data path or metrics), timed with
:func:`benchmarks._harness.timed`; ``ms_per_update - bare_ms_per_update`` is the learner's host overhead.

    python -m benchmarks run ga3c-learner                                  # GPU: batch 160 x 4x84x84
    python -m benchmarks run ga3c-learner --synthetic-pps 18000 --predictors 2   # + 2 predictor threads
    python -m benchmarks run ga3c-learner --cuda-graph                     # the update as one graph replay
    python -m benchmarks run ga3c-learner --quick --out runs/bench         # smoke test: batch 20 x 4x36x36
"""

from __future__ import annotations

import queue
import tempfile
import threading
import time
import warnings
from unittest import mock

import numpy as np
import torch

from benchmarks._harness import timed
from benchmarks._results import Results
from lightning_per.actors.predictor import PredictorThread
from lightning_per.actors.spawn import AgentHandle
from lightning_per.ga3c import module as ga3c_module
from lightning_per.ga3c.loss import a3c_loss
from lightning_per.ga3c.module import GA3C
from lightning_per.ga3c.system import GA3CSystem
from lightning_per.ga3c.workers import TrainerThread

__all__ = ["add_arguments", "bench_learner", "run", "PHASES"]

#: Host phases of one update, in seconds (see the module docstring).
PHASES = ("wait", "h2d", "forward", "backward", "step", "lightning")
_DEVICE_PHASES = ("h2d", "forward", "backward", "step")


class _Always:
    """A semaphore that never blocks: agents have always just announced a rollout / freed a slot."""

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        return True

    def release(self) -> None:
        pass


class SyntheticSystem(GA3CSystem):
    """:class:`GA3CSystem` with its trainer threads and shared buffers but no agents or predictors.

    The first ``cfg.agents`` agent indices hold random rollouts (obs (A, S, T, E, *obs_shape) uint8,
    actions in [0, ``n_actions``), returns ~ N(0, 1) float32, one rollout in ten ends an episode of
    return -21, so ``target_return`` is never reached); a rollout is ready again as soon as a
    trainer has copied it out (:meth:`take_rollout`), so batches are assembled as fast as the trainers can.
    """

    n_actions = 6
    pps = 0.0  # observations/s the predictor threads serve in all (0: no predictor threads)
    predict_requests = 4  # requests (of E observations each) per prediction batch

    def claim_requests(self, limit: int) -> tuple[torch.Tensor, list[AgentHandle]]:
        """``predict_requests`` requests of the next agents, paced so that the predictors serve ``pps``."""
        c, local = self.cfg, self._pace
        k = min(limit, self.predict_requests, c.agents)
        now = time.monotonic()
        due = max(getattr(local, "due", now), now - 0.1)
        local.due = due + k * c.envs_per_agent * len(self._predictors) / self.pps
        if due > now:
            time.sleep(due - now)
        first = getattr(local, "next", 0)
        local.next = (first + k) % c.agents
        agents = [(first + j) % c.agents for j in range(k)]
        return torch.tensor([self.row(i, 0, 0) for i in agents]), [self.pool.agents[i] for i in agents]

    def start(self) -> SyntheticSystem:
        c = self.cfg
        self._map_buffers()
        g = torch.Generator().manual_seed(c.seed)
        self.obs_rows.copy_(torch.randint(0, 256, self.obs_rows.shape, generator=g).to(self.obs_rows.dtype))
        self.action_rows.copy_(torch.randint(0, self.n_actions, self.action_rows.shape, generator=g))
        self._returns.copy_(torch.randn(self._returns.shape, generator=g))
        sh = self.shared  # ~1 rollout in 10 ends a -21 Pong game of 820 steps (the rate of the early Pong runs)
        sh.ep_count.reshape(-1)[: c.agents * c.rollout_slots: 10] = 1
        sh.ep_return[..., 0], sh.ep_length[..., 0] = -21.0, 820
        self.shared.busy[: c.agents] = 1
        self.shared.ready[: c.agents] = 1
        self.pred_sem = self.ready_sem = _Always()
        self.batch_q = queue.Queue(maxsize=c.batch_queue_size)
        self._make_pool()
        self.pool.agents = [AgentHandle(0, None, _Always(), _Always()) if i < c.agents else None
                            for i in range(c.max_agents)]
        self._pace = threading.local()
        self._set_threads(self._trainers, c.trainers, TrainerThread, "trainer")
        if self.pps > 0:
            self._set_threads(self._predictors, c.predictors, PredictorThread, "predictor")
        return self

    def take_rollout(self, index: int, agent: AgentHandle, slot: int, out=None) -> dict[str, torch.Tensor] | None:
        part = super().take_rollout(index, agent, slot, out)
        self.shared.busy[index, slot] = self.shared.ready[index, slot] = 1  # the next rollout is done at once
        return part

    def close(self, timeout: float = 5.0) -> None:
        self.stopping.set()  # the threads leave their loops first: a predictor must not see the agents go
        for th in [*self._predictors, *self._trainers]:
            th.join(1.0)
        self.pool.agents = [None] * self.cfg.max_agents  # no processes to join
        super().close(timeout)


class TimedGA3C(GA3C):
    """:class:`GA3C` on a :class:`SyntheticSystem`, timing each phase of updates ``warmup`` .. ``warmup + n``.

    Results: :attr:`host` (phase -> seconds summed over the measured updates), :attr:`wall` (seconds),
    :attr:`queue_sum` (batch queue length summed at each measured update start), :attr:`events`
    ((phase, start, end) CUDA events; empty on CPU).
    """

    def __init__(self, config, warmup: int, n: int, pps: float = 0.0, predict_requests: int = 4) -> None:
        super().__init__(config)
        self.warmup, self.n = warmup, n
        self.pps, self.predict_requests = pps, predict_requests
        self.host = dict.fromkeys(PHASES, 0.0)
        self.wall = 0.0
        self.cpu_s = 0.0  # CPU seconds of the learner (main) thread over the measured updates
        self.queue_sum = 0
        self.events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self._t: dict[str, float] = {}
        self._wall0: float | None = None
        self._caught = None
        self.sync_warnings: list = []  # CUDA: host synchronisations warned about during the measured updates
        self._ev: dict[str, torch.cuda.Event] = {}

    # ---- measurement helpers
    def _on(self) -> bool:
        on = self.warmup <= self.policy_version < self.warmup + self.n
        if on and self._wall0 is None:
            self._wall0, self._cpu0 = time.perf_counter(), time.thread_time()
        return on

    def _mark(self, name: str) -> None:
        self._t[name] = time.perf_counter()
        if self.device.type == "cuda" and self._on():
            ev = self._ev[name] = torch.cuda.Event(enable_timing=True)
            ev.record()

    def _span(self, phase: str, start: str, end: str) -> float:
        self._mark(end)
        dt = self._t[end] - self._t[start]
        if self._on():
            self.host[phase] += dt
            if self.device.type == "cuda":
                self.events.append((phase, self._ev[start], self._ev[end]))
        return dt

    # ---- the system and its batch queue
    def make_system(self, cfg):
        system = SyntheticSystem(cfg, self.env_spec, self.obs_shape, self.obs_dtype, self.act,
                                 lambda: self.policy_version, self.device, self.stats)
        system.n_actions, system.pps, system.predict_requests = self.n_actions, self.pps, self.predict_requests
        get_batch = system.get_batch

        def timed_get_batch(timeout=None):
            t0 = time.perf_counter()
            batch = get_batch(timeout)
            if self._on():
                self.host["wait"] += time.perf_counter() - t0
            return batch

        system.get_batch = timed_get_batch
        return system

    # ---- hooks (each calls the real one)
    def on_train_batch_start(self, batch, batch_idx):
        if self.policy_version == self.warmup and self.device.type == "cuda":  # count host syncs from here on
            self._caught = warnings.catch_warnings(record=True)
            self.sync_warnings = self._caught.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        if self._on():
            self.queue_sum += self.system.batch_q.qsize() if self.system is not None else 0
        return super().on_train_batch_start(batch, batch_idx)

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        self._mark("h2d0")
        out = super().transfer_batch_to_device(batch, device, dataloader_idx)
        self._span("h2d", "h2d0", "h2d1")
        return out

    def training_step(self, batch, batch_idx):
        self._mark("fwd0")
        loss = super().training_step(batch, batch_idx)
        self._fwd = self._span("forward", "fwd0", "fwd1")
        return loss

    def on_before_backward(self, loss):
        self._mark("bwd0")

    def on_after_backward(self):
        self._bwd = self._span("backward", "bwd0", "bwd1")

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        self._mark("opt0")
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        self._mark("opt1")
        if self._on():
            self.host["step"] += self._t["opt1"] - self._t["opt0"] - self._fwd - self._bwd
            if self.device.type == "cuda":
                self.events.append(("step", self._ev["bwd1"], self._ev["opt1"]))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        measured = self._on()
        super().on_train_batch_end(outputs, batch, batch_idx)
        if measured and self.policy_version == self.warmup + self.n:
            self.wall = time.perf_counter() - self._wall0
            self.cpu_s = time.thread_time() - self._cpu0
            if self._caught is not None:
                torch.cuda.set_sync_debug_mode(0)
                self._caught.__exit__(None, None, None)
                self._caught = None
            self.trainer.should_stop = True


def bare_update_s(model: GA3C, batch: int, iters: int, device: torch.device) -> float:
    """Seconds per update of ``model``'s net, loss, optimiser and clipping in a plain loop on one random
    device batch of ``batch`` transitions (obs (batch, *obs_shape) uint8, action (batch,) int64, ret
    (batch,) float32)."""
    c = model.cfg
    model.to(device)
    opt = model.make_optimizer()  # eager, as the plain loop runs it
    obs = torch.randint(0, 256, (batch, *model.obs_shape), dtype=torch.uint8, device=device)
    action = torch.randint(0, model.n_actions, (batch,), device=device)
    ret = torch.randn(batch, device=device)

    def update() -> None:
        logits, value = model.net(obs)  # [N, A], [N]
        loss, _ = a3c_loss(logits, value, action, ret, beta=c.beta, value_coef=c.value_coef,
                           log_epsilon=c.log_epsilon, reduction=c.loss_reduction)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if c.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), c.grad_clip)
        opt.step()

    return timed(update, iters, device)


def bench_learner(args) -> dict:
    """One learner-only row: ``args`` has config, device, batch, obs_size, trainers, updates, warmup_updates."""
    from lightning_per.callbacks import AsyncMetricsCallback
    from lightning_per.ga3c.cli import build_trainer
    from lightning_per.ga3c.config import load_config

    base = load_config(args.config)
    e = base.envs_per_agent
    if args.batch % (base.t_max * e):  # keep the config's E when the batch is whole rollouts of it
        e = max(1, args.batch // (2 * base.t_max))
    total = args.warmup_updates + args.updates
    cfg = load_config(args.config, dict(
        device=args.device, train_min_batch_size=args.batch, envs_per_agent=e, trainers=args.trainers,
        max_trainers=max(args.trainers, base.max_trainers), max_updates=total,
        torch_threads=args.torch_threads or base.torch_threads,
        predictors=args.predictors, max_predictors=max(args.predictors, base.max_predictors),
        dynamic_adjustment=False, status_interval_s=0, wandb_mode="disabled", max_time_s=3600.0,
        cuda_graph=args.cuda_graph))
    spec = ((4, args.obs_size, args.obs_size), np.dtype("uint8"), 6)
    with mock.patch.object(ga3c_module, "probe_env", lambda env_spec: spec):  # no environment is made
        model = TimedGA3C(cfg, args.warmup_updates, args.updates, args.synthetic_pps, args.predict_requests)
    cuda = torch.device(args.device).type == "cuda"
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = build_trainer(cfg, cuda, False, [AsyncMetricsCallback(prog_bar=False)], run_dir)
        trainer.fit(model)
    n = model.policy_version - args.warmup_updates
    if n < args.updates or model.wall <= 0:
        raise RuntimeError(f"learner-only run ended after {model.policy_version} updates, wanted {total}")
    host = dict(model.host)
    host["lightning"] = max(0.0, model.wall - sum(v for k, v in host.items() if k != "lightning"))
    row = {"row": "learner-only", "device": args.device, "cuda_graph": model.graph_captures > 0,
           "batch": model.stats.snapshot().batch_transitions // max(model.policy_version, 1),
           "obs": list(spec[0]), "trainers": cfg.trainers, "updates": n,
           "tps": n / model.wall, "ms_per_update": 1e3 * model.wall / n,
           "cpu_ms_per_update": 1e3 * model.cpu_s / n, "batch_queue_mean": model.queue_sum / n,
           "host_ms": {k: 1e3 * v / n for k, v in host.items()},
           "predictors": cfg.predictors if args.synthetic_pps > 0 else 0,
           "pps": model.stats.snapshot().predictions / max(time.monotonic() - model.stats.t0, 1e-9)}
    bare = bare_update_s(model, row["batch"], n, torch.device(args.device))
    row.update(bare_ms_per_update=1e3 * bare, overhead_ms=row["ms_per_update"] - 1e3 * bare)
    if cuda:
        torch.cuda.synchronize()
        dev = dict.fromkeys(_DEVICE_PHASES, 0.0)
        for phase, start, end in model.events:
            dev[phase] += start.elapsed_time(end)  # ms
        row["device_ms"] = {k: v / n for k, v in dev.items()}
        row["device_busy_ms"] = sum(row["device_ms"].values())
        # any thread (predictors sync once a batch on purpose: the agents need the actions)
        row["syncs_per_update"] = sum("synchroniz" in str(w.message) for w in model.sync_warnings) / n
    return row


def learner_table(row: dict) -> str:
    """Markdown: one line per phase with host (and device) ms per update and its share of the update."""
    per = row["ms_per_update"]
    dev = row.get("device_ms", {})
    mode = " in graph mode (one CUDA graph replay per update)" if row["cuda_graph"] else ""
    out = [f"learner-only on {row['device']}{mode}: batch {row['batch']} x {tuple(row['obs'])} uint8, "
           f"{row['trainers']} trainer threads, {row['predictors']} predictor threads ({row['pps']:,.0f} "
           f"predictions/s), {row['updates']} updates: **{row['tps']:,.1f} TPS** "
           f"({per:.2f} ms/update, {row['cpu_ms_per_update']:.2f} ms CPU of the learner thread), batch queue "
           f"mean {row['batch_queue_mean']:.2f}; the same update in a plain "
           f"loop on a device batch (bare): {row['bare_ms_per_update']:.2f} ms, so {row['overhead_ms']:.2f} ms "
           "of learner overhead per update", "",
           "| phase | host ms/update | share | device ms/update |", "|---|---|---|---|"]
    for k in PHASES:
        v = row["host_ms"][k]
        d = f"{dev[k]:.3f}" if k in dev else ""
        out.append(f"| {k} | {v:.3f} | {100 * v / per:.0f}% | {d} |")
    if dev:
        out.append(f"| device busy | | | {row['device_busy_ms']:.3f} |")
        out += ["", f"host synchronisations per update: {row['syncs_per_update']:.2f}"]
    return "\n".join(out)


def add_arguments(ap) -> None:
    from benchmarks.ga3c import add_common_arguments

    add_common_arguments(ap)
    ap.add_argument("--batch", type=int, default=160, help="transitions per batch")
    ap.add_argument("--obs-size", type=int, default=84, help="frame side (4 x S x S uint8)")
    ap.add_argument("--updates", type=int, default=500, help="measured updates")
    ap.add_argument("--synthetic-pps", type=float, default=0.0, help="run --predictors predictor threads "
                    "serving this many synthetic predictions/s in all (0: none)")
    ap.add_argument("--predict-requests", type=int, default=4, help="requests per prediction batch")
    ap.add_argument("--torch-threads", type=int, default=None, help="torch threads (default: the config's)")
    ap.add_argument("--warmup-updates", type=int, default=50, help="updates before measuring")


def run(args) -> Results:
    """One learner-only row."""
    if args.quick:
        args.device, args.batch, args.obs_size = "cpu", 20, 36
        args.updates, args.warmup_updates, args.trainers = min(args.updates, 200), min(args.warmup_updates, 20), 1
        args.torch_threads = args.torch_threads or 1
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    row = bench_learner(args)
    row["impl"] = "learner-only" + ("-graph" if row["cuda_graph"] else "")
    return Results(rows=[row], table=learner_table(row), metric="tps",
                   title="The GA3C learner alone (module, loss, optimiser, Trainer, data loader, trainer threads) "
                         "on synthetic batches: TPS (training batches/s) and host/device ms per update by phase.")
