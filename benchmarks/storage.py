"""Storages beyond device memory: frame-deduplicated Atari replay and pinned-host transitions.

Rows, measured side by side in one process:
  frames-dedup / frames-full    a Pong-shaped buffer (84x84 uint8 frames, stacks of 4, 32 envs, episodes of
                                ~1,000 steps) of N transitions (default 1e6 on CUDA) in FrameStackStorage vs
                                the full-stack GPUTensorStorage (packed, the DQN's): device memory of buffer +
                                sampler (torch.cuda.memory_allocated after the fill minus before it), and one
                                step = sample B = 64 + gather + update_priority, eager and in one CUDA graph
  host-pinned / host-device     transitions of observation + next observation (51 float32 each), action,
                                reward, done at N = 1e7: PinnedHostStorage (host ring, zero-copy gather) vs
                                GPUTensorStorage packed, the same step, host syncs per step
  host-pinned (--big)           the pinned-host buffer at N = 2e8 (~85 GB of host memory), the same step

    python -m benchmarks run storage                    # 1M-transition Pong buffer, N = 1e7 pinned vs device
    python -m benchmarks run storage --big              # also the 2e8-transition (~85 GB) pinned-host buffer
    python -m benchmarks run storage --quick --device cpu --out runs/bench
"""

from __future__ import annotations

import gc

import torch

from benchmarks._harness import capture, count_syncs, timed
from benchmarks._results import Results, markdown_table

FRAME, STACK, ENVS, EPISODE, B = 84, 4, 32, 1000, 64
GB = 1e9


class PongStream:
    """Pong-shaped 1-step transitions from ``ENVS`` envs on ``device``: a fresh random frame per env and step,
    stacks of the last ``STACK``; an env's episode ends every ``EPISODE`` steps (staggered), the next stack
    repeating its reset frame (Gymnasium's FrameStackObservation)."""

    def __init__(self, device, frame: int = FRAME, seed: int = 0):
        self.device, self.frame, self.t = device, frame, 0
        self.gen = torch.Generator(device).manual_seed(seed)
        self.window = self._new((ENVS,)).unsqueeze(1).expand(ENVS, STACK, frame, frame).clone()

    def _new(self, lead):
        return torch.randint(0, 256, (*lead, self.frame, self.frame), dtype=torch.uint8, device=self.device,
                             generator=self.gen)

    def step(self):
        from tensordict import TensorDict

        obs = self.window
        nxt = torch.cat((obs[:, 1:], self._new((ENVS, 1))), 1)
        self.t += 1
        done = (torch.arange(ENVS, device=self.device) * 31 + self.t) % EPISODE == 0
        reset = self._new((ENVS,)).unsqueeze(1).expand(ENVS, STACK, self.frame, self.frame)
        self.window = torch.where(done[:, None, None, None], reset, nxt)
        return TensorDict({"observation": obs, "next_observation": nxt,
                           "action": torch.zeros(ENVS, dtype=torch.int64, device=self.device),
                           "reward": torch.zeros(ENVS, device=self.device),
                           "discount": torch.ones(ENVS, device=self.device)},
                          [ENVS], device=self.device)


def _memory(device) -> int:
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device)


def _free():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _steps(rb, device, iters: int) -> dict:
    """Eager and graph step times (us) and host syncs per eager step of ``rb``."""
    sampler, storage = rb.sampler, rb.storage
    td = torch.rand(B, device=device) + 0.01

    def eager():
        batch = rb.sample()
        rb.update_priority(batch["index"], td)

    def step():
        index, _, batch = sampler.sample_gather(storage, B)
        sampler.update_priority(index, td, storage=storage)

    out = {"eager_us": timed(eager, iters, device) * 1e6, "syncs_per_step": count_syncs(eager, 20, device)}
    if device.type == "cuda":
        out["graph_us"] = timed(capture(step, sampler.capture_view(None, B).generators), iters, device) * 1e6
    return out


def frames_rows(n: int, device, iters: int, frame: int) -> list[dict]:
    from lightning_per import make_replay_buffer

    rows = []
    for impl in ("frames-dedup", "frames-full"):
        _free()
        before = _memory(device)
        rb = make_replay_buffer(n, B, device=device, packed=True, fallback=False,
                                frame_stack=STACK if impl == "frames-dedup" else None,
                                generator=torch.Generator().manual_seed(0))
        stream = PongStream(device, frame)
        for _ in range(-(-n // ENVS)):
            rb.extend(stream.step())
        after = _memory(device)
        row = {"impl": impl, "N": n, "device_GB": (after - before) / GB if device.type == "cuda" else None,
               "storage_GB": rb.storage.nbytes / GB, **_steps(rb, device, iters)}
        if impl == "frames-dedup":
            row["frames_per_transition"] = int(rb.storage.frames_written) / n
            row["valid_fraction"] = float(rb.storage.slot_valid.float().mean())
        rows.append(row)
        print(row, flush=True)
        del rb, stream
    return rows


def _host_batch(n: int, device, gen):
    from tensordict import TensorDict

    return TensorDict({"observation": torch.randn(n, 51, device=device, generator=gen),
                       "next_observation": torch.randn(n, 51, device=device, generator=gen),
                       "action": torch.randint(0, 18, (n,), device=device, generator=gen),
                       "reward": torch.randn(n, device=device, generator=gen),
                       "done": torch.zeros(n, dtype=torch.bool, device=device)}, [n], device=device)


def host_rows(n: int, device, iters: int, impls=("host-pinned", "host-device")) -> list[dict]:
    from lightning_per import make_replay_buffer

    rows = []
    for impl in impls:
        _free()
        before = _memory(device)
        rb = make_replay_buffer(n, B, device=device, packed=True, fallback=False, pinned_host=impl == "host-pinned",
                                generator=torch.Generator().manual_seed(0))
        gen = torch.Generator(device).manual_seed(0)
        chunk = min(n, 1 << 20)
        data = _host_batch(chunk, device, gen)
        for start in range(0, n, chunk):
            rb.extend(data if start + chunk <= n else data[: n - start])
        after = _memory(device)
        row = {"impl": impl, "N": n, "device_GB": (after - before) / GB if device.type == "cuda" else None,
               "storage_GB": rb.storage.nbytes / GB, **_steps(rb, device, iters)}
        rows.append(row)
        print(row, flush=True)
        del rb, data
    return rows


def ratios(rows: list[dict]) -> str:
    by = {(r["impl"], r["N"]): r for r in rows}
    lines = []
    for (impl, n), r in by.items():
        ref = by.get(({"frames-dedup": "frames-full", "host-pinned": "host-device"}.get(impl), n))
        if ref is None:
            continue
        for key in ("eager_us", "graph_us"):
            if r.get(key) and ref.get(key):
                lines.append(f"- N = {n:,}: {impl} / {ref['impl']} {key[:-3]} step = {r[key] / ref[key]:.2f}x")
        if r.get("device_GB") is not None and ref.get("device_GB"):
            lines.append(f"- N = {n:,}: device memory {impl} {r['device_GB']:.2f} GB vs {ref['impl']} "
                         f"{ref['device_GB']:.2f} GB")
    return "Ratios of this run:\n\n" + "\n".join(lines) if lines else ""


def add_arguments(ap) -> None:
    ap.add_argument("--frames-n", type=float, default=None, help="Pong buffer transitions (default 1e6 on CUDA)")
    ap.add_argument("--host-n", type=float, default=None, help="pinned-host transitions (default 1e7 on CUDA)")
    ap.add_argument("--big", action="store_true", help="also the pinned-host buffer of --big-n transitions")
    ap.add_argument("--big-n", type=float, default=2e8, help="(default %(default)s: ~85 GB of host memory)")
    ap.add_argument("--iters", type=int, default=200, help="timed steps per row")


def run(args) -> Results:
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    iters = 5 if args.quick else args.iters
    frame = 16 if args.quick else FRAME
    fn = int(args.frames_n or (2048 if args.quick or not cuda else 1e6))
    hn = int(args.host_n or (4096 if args.quick or not cuda else 1e7))
    rows = frames_rows(fn, device, iters, frame) + host_rows(hn, device, iters)
    if args.big:
        rows += host_rows(int(args.big_n), device, iters, impls=("host-pinned",))
    columns = ["impl", "N", "device_GB", "storage_GB", "eager_us", "graph_us", "syncs_per_step",
               "frames_per_transition", "valid_fraction"]
    return Results(rows=rows, table=markdown_table(rows, columns), metric="eager_us",
                   title=f"One replay step = sample B = {B} + gather + update_priority: microseconds (CUDA events on "
                         f"a GPU, wall clock on a CPU), eager and in one CUDA graph; device memory of buffer + "
                         f"sampler after the fill (torch.cuda.memory_allocated), the storage's own bytes.",
                   notes=ratios(rows))
