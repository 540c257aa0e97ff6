"""Where a DQN training step's time goes under ``Trainer.fit``: acting, the env step, the copies around it, the
replay write, the update (sample + learner + priorities, one graph replay in graph mode), and the rest (the
host: Lightning's loop and the module's bookkeeping).

The run is the config's own (``lightning-per fit --config C`` with any ``--run-arg`` overrides), built by the
same CLI. After the config's warm-up (random steps) and ``--warmup-steps`` training steps (compilation,
capture), it measures two windows of ``--steps`` training steps each:

1. free-running: only the window's ends are timed (one device synchronisation each): the real step time,
   env steps/s and updates/s;
2. broken down: each phase is timed with a device synchronisation at its start and end, so a phase's time
   includes its device work (this serialises work that normally overlaps: the phases add up to more than
   window 1's step; the ratio is printed).

"env step" is the host's time in the env's calls: the whole step for an env that steps in the caller's
thread, only the launch and the wait for the rest for one that steps in its own threads while the host
records the previous step and launches the updates (``NStepCollector.overlaps``, docs/dqn.md, "The loop").

``--trace DIR`` then records ``--trace-steps`` steps with ``torch.profiler`` (CPU + CUDA) as a Chrome trace.

    python -m benchmarks tool profile_loop --config configs/dqn_pong.yaml --out runs/profile_loop/pong.json
    python -m benchmarks tool profile_loop --config configs/dqn_pong.yaml --trace runs/profile_loop/trace
    python -m benchmarks tool profile_loop --config configs/dqn_cartpole.yaml --tiny --out /tmp/p.json  # CPU
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

PHASES = ("act", "env step", "collect: copies + n-step window", "replay write", "collect: episode stats",
          "update: sample + learner + priorities", "host: Lightning loop + bookkeeping")
TINY_ARGS = ["--model.warmup_steps=64", "--model.replay.capacity=1000", "--model.updates_per_epoch=40",
             "--model.env.num_envs=4", "--trainer.accelerator=cpu"]


class _Timer:
    """Inclusive times of the wrapped calls (seconds), with a device sync around each when ``sync``.

    A call wrapped with a ``group`` also counts towards that group's total, once for the outermost of the
    group's calls when they nest (``_collect`` calls ``_record``: the group counts the ``_collect``)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda, self.sync, self.on = cuda, False, False
        self.total: dict[str, float] = defaultdict(float)
        self._depth: dict[str, int] = defaultdict(int)

    def _now(self) -> float:
        if self.cuda and self.sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    def wrap(self, name: str, fn, group: str | None = None):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if not self.on:
                return fn(*args, **kwargs)
            outer = group is not None and self._depth[group] == 0
            if group is not None:
                self._depth[group] += 1
            t0 = self._now()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = self._now() - t0
                self.total[name] += dt
                if group is not None:
                    self._depth[group] -= 1
                    if outer:
                        self.total[group] += dt

        return timed


class _Profiler(Callback):
    def __init__(self, warmup: int, steps: int, trace: str | None, trace_steps: int) -> None:
        self.warmup, self.steps, self.trace, self.trace_steps = warmup, steps, trace, trace_steps
        self.timer: _Timer | None = None
        self.seen = 0
        self.result: dict = {}
        self._t0 = self._counts0 = None
        self._prof = None
        self.device = "cpu"

    def on_train_start(self, trainer, pl_module) -> None:
        self.device = str(pl_module.device)
        self.timer = t = _Timer(pl_module.device.type == "cuda")
        c, env = pl_module.collector, pl_module.collector.env
        c.act = t.wrap("act", c.act)
        from lightning_per.dqn.collector import steps_in_threads

        names = ("step_and_maybe_reset", *(("step_async", "step_wait") if steps_in_threads(env) else ()))
        for name in names:  # the host's time in the env's calls
            setattr(env, name, t.wrap(f"env.{name}", getattr(env, name), group="env"))
        c.start, c.record = t.wrap("collector.start", c.start), t.wrap("collector.record", c.record)
        c.wait = t.wrap("collector.wait", c.wait, group="collect")  # the overlapped path calls it directly
        pl_module.rb.extend = t.wrap("extend", pl_module.rb.extend)
        for name in ("_collect", "_start_collect", "_record"):
            setattr(pl_module, name, t.wrap(name, getattr(pl_module, name), group="collect"))
        pl_module._update_block = t.wrap("block", pl_module._update_block)

    def _window_start(self, pl_module) -> None:
        self._t0 = self.timer._now()
        self._counts0 = (pl_module.env_steps, pl_module.updates)

    def _window_end(self, pl_module) -> dict:
        dt = self.timer._now() - self._t0
        env_steps, updates = pl_module.env_steps - self._counts0[0], pl_module.updates - self._counts0[1]
        return {"seconds": dt, "step_ms": 1e3 * dt / self.steps, "env_steps_per_s": env_steps / dt,
                "updates_per_s": updates / dt, "env_steps": env_steps, "updates": updates}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        t, k, n = self.timer, self.seen - self.warmup, self.steps
        if k == 0:  # window 1: free-running
            t.sync = False
            self._window_start(pl_module)
        elif k == n:  # window 2: phases, synchronised
            self.result["free_running"] = self._window_end(pl_module)
            t.sync, t.on = True, True
            t.total.clear()
            self._window_start(pl_module)
        elif k == 2 * n:
            self.result["broken_down"] = self._window_end(pl_module)
            self.result["phases_ms"] = self._phases()
            t.on = False
            if self.trace:
                from torch.profiler import ProfilerActivity, profile

                acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if t.cuda else [])
                self._prof = profile(activities=acts, record_shapes=False)
                self._prof.__enter__()
            else:
                trainer.should_stop = True
        elif k == 2 * n + self.trace_steps and self._prof is not None:
            self._prof.__exit__(None, None, None)
            Path(self.trace).mkdir(parents=True, exist_ok=True)
            path = Path(self.trace) / "loop_trace.json"
            self._prof.export_chrome_trace(str(path))
            self.result["trace"] = str(path)
            self._prof = None
            trainer.should_stop = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.seen += 1

    def _phases(self) -> dict[str, float]:
        n = self.steps
        step = 1e3 * self.result["broken_down"]["seconds"] / n
        per = defaultdict(float, {k: 1e3 * v / n for k, v in self.timer.total.items()})
        collector = per["collector.start"] + per["collector.wait"] + per["collector.record"]
        return {
            "act": per["act"],
            "env step": per["env"],
            "collect: copies + n-step window": collector - per["act"] - per["env"],
            "replay write": per["extend"],
            "collect: episode stats": per["collect"] - collector - per["extend"],
            "update: sample + learner + priorities": per["block"] - per["collect"],
            "host: Lightning loop + bookkeeping": step - per["block"],
        }


def table(result: dict) -> str:
    free, broken, phases = result["free_running"], result["broken_down"], result["phases_ms"]
    step = broken["step_ms"]
    lines = ["| phase | ms / training step (synchronised) | share |", "|---|---|---|"]
    lines += [f"| {name} | {phases[name]:.3f} | {phases[name] / step:.0%} |" for name in PHASES]
    lines.append(f"| **step (phases synchronised)** | {step:.3f} | 100% |")
    lines.append(f"| **step (free-running)** | {free['step_ms']:.3f} | {free['step_ms'] / step:.0%} |")
    rates = (f"Free-running: {free['env_steps_per_s']:,.0f} env steps/s, {free['updates_per_s']:,.0f} updates/s "
             f"over {free['seconds']:.1f} s; synchronised: {broken['env_steps_per_s']:,.0f} env steps/s.")
    return "\n".join(lines) + "\n\n" + rates


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="a DQN config (lightning-per fit --config)")
    ap.add_argument("--warmup-steps", type=int, default=300, help="training steps before the windows")
    ap.add_argument("--steps", type=int, default=300, help="training steps per window")
    ap.add_argument("--trace", default=None, help="directory for a torch.profiler Chrome trace (after the windows)")
    ap.add_argument("--trace-steps", type=int, default=20)
    ap.add_argument("--run-arg", action="append", default=[], metavar="ARG", help="one more fit argument")
    ap.add_argument("--tiny", action="store_true", help="tiny sizes on the CPU: a smoke test")
    ap.add_argument("--out", default=None, help="JSON file to write (and a Markdown table beside it)")
    ap.add_argument("--run-dir", default=None, help="the run's directory (default: a new temporary one)")
    a = ap.parse_args(argv)

    from lightning_per import cli

    run_dir = a.run_dir or tempfile.mkdtemp(prefix="profile_loop-")
    args = ["--config", a.config, "--trainer.logger=false", "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={run_dir}", "--trainer.max_epochs=-1", "--trainer.max_time=null",
            "--model.max_env_steps=null", "--model.target_return=null", *(TINY_ARGS if a.tiny else []), *a.run_arg]
    built = cli.cli_main(args, run=False)
    prof = _Profiler(a.warmup_steps, a.steps, a.trace, a.trace_steps)
    trainer = built.trainer
    trainer.callbacks.append(prof)
    trainer.fit(built.model)
    result = {"config": a.config, "run_args": a.run_arg, "warmup_steps": a.warmup_steps, "steps": a.steps,
              "device": prof.device, **prof.result}
    if "phases_ms" not in result:
        print("profile_loop: the run ended before both windows were measured", file=sys.stderr)
        return 1
    print(table(result))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
        Path(a.out).with_suffix(".md").write_text(table(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
