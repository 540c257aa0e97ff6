"""One-time self-check of the compiled ops against :mod:`lightning_per.ops.reference` on small random
inputs; run by :func:`lightning_per.ops.dispatch.make_kernel_ops` before a sampler may use the kernels.

Indices, counts and integer-valued sums must match exactly (integer-valued priorities make every
float64 prefix sum exact, so ties ``u S == C_i`` are exercised too); float values to ``rtol`` 1e-6
(float32) / 1e-12 (float64), which allows a last-ulp difference between libdevice and the host's
``pow`` under the interpreter.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_per.ext.state import PriorityTree, RankTable, write_scratch
from lightning_per.ops import reference
from lightning_per.ops.protocol import CompiledReplayOps

__all__ = ["self_check", "make_levels", "boundary_uniforms", "fresh_state"]


def make_levels(capacity: int, device: torch.device, generator: torch.Generator, integer: bool = True,
                zero_fraction: float = 0.25) -> tuple[Tensor, Tensor, Tensor]:
    """A sampler-shaped two-level array for ``capacity`` slots (+1 trash slot, padding 0).

    Returns:
        ``(leaves (n_blocks, block) float32, block_sum (n_blocks,) float64, block_min (n_blocks,) float32)``,
        sums/minima from ``reference.reduce_blocks``; leaves in {0, 1, 2, 3} if ``integer``.
    """
    block = reference.block_size_for(capacity + 1)
    n_blocks = -(-(capacity + 1) // block)
    flat = torch.zeros(n_blocks * block, dtype=torch.float32)
    if integer:
        vals = torch.randint(1, 4, (capacity,), generator=generator).float()
    else:
        vals = torch.rand(capacity, generator=generator) * 10 + 1e-3
    vals[torch.rand(capacity, generator=generator) < zero_fraction] = 0
    flat[:capacity] = vals
    leaves = flat.view(n_blocks, block).to(device)
    block_sum, block_min = reference.reduce_blocks(leaves)
    return leaves, block_sum, block_min


def boundary_uniforms(block_sum: Tensor, n_random: int, generator: torch.Generator,
                      n_bound: int = 24) -> Tensor:
    """``n_random`` uniforms plus ``m / S`` for integers ``m < S`` (at most ``n_bound``, evenly spread):
    draws that land exactly on slot boundaries when the masses are integers. ``(B,)`` float64."""
    total = float(block_sum.sum())
    steps = torch.linspace(0, max(total - 1, 0), min(n_bound, max(int(total), 1))).floor()
    u = torch.cat([torch.rand(n_random, generator=generator, dtype=torch.float64), steps.double() / total])
    return u.to(block_sum.device)


def fresh_state(leaves: Tensor, capacity: int = 0, alpha: Tensor | float = 1.0, eps: float = 0.0,
                beta: Tensor | float = 0.0) -> PriorityTree:
    """A sampler-like :class:`~lightning_per.ext.state.PriorityTree` around ``leaves`` (copied): raw priorities
    equal to the leaves, sums, minima, max -inf, zero counters, the write's scratch, the given exponents, ``eps``
    and ``capacity`` (the trash slot)."""
    d = leaves.device
    leaves = leaves.clone()
    block_sum, block_min = (t.contiguous() for t in reference.reduce_blocks(leaves))  # sums: a strided view
    return PriorityTree(leaves, block_sum, block_min, raw=leaves.reshape(-1).clone(),
                        max_raw=torch.full((), float("-inf"), device=d),
                        n_clamped=torch.zeros((), dtype=torch.int64, device=d),
                        n_dropped=torch.zeros((), dtype=torch.int64, device=d), alpha=alpha, beta=beta, eps=eps,
                        capacity=capacity, scratch=write_scratch(leaves))


def _equal(name: str, got: Tensor, want: Tensor) -> None:
    # sync-ok: the self-check runs once per device, when the backend is chosen
    if got.shape != want.shape or got.dtype != want.dtype or not torch.equal(got.cpu(), want.cpu()):  # sync-ok: once
        raise RuntimeError(f"self-check failed: {name} differs from the reference "
                           f"(got {got.cpu().tolist()[:8]}..., want {want.cpu().tolist()[:8]}...)")  # sync-ok: failed


def _close(name: str, got: Tensor, want: Tensor, rtol: float) -> None:
    # sync-ok: the self-check runs once per device, when the backend is chosen
    if got.shape != want.shape or got.dtype != want.dtype or not torch.allclose(
            got.cpu(), want.cpu(), rtol=rtol, atol=0.0, equal_nan=True):  # sync-ok: once per device
        raise RuntimeError(f"self-check failed: {name} differs from the reference beyond rtol={rtol}")


def _check_search(ops: CompiledReplayOps, device: torch.device, gen: torch.Generator) -> None:
    beta = torch.tensor(0.4, dtype=torch.float64, device=device)
    for capacity in (5, 37):
        leaves, bs, bm = make_levels(capacity, device, gen)
        u = boundary_uniforms(bs, 4, gen, n_bound=12)
        got, want = ops.two_level_search_with_values(leaves, bs, u), reference.two_level_search_with_values(
            leaves, bs, u)
        _equal(f"two_level_search_with_values[{capacity}].index", got[0], want[0])
        _equal(f"two_level_search_with_values[{capacity}].value", got[1], want[1])
        for normalize in ("buffer", "batch"):
            (gi, gw), (wi, ww) = (f(PriorityTree(leaves, bs, bm, beta=beta), u[:6], True, normalize)
                                  for f in (ops.sample_proportional, reference.sample_proportional))
            _equal(f"sample_proportional[{normalize}].index", gi, wi)
            _close(f"sample_proportional[{normalize}].weight", gw, ww, 1e-6)
        p_min = bm.amin()
        _close("is_weights", ops.is_weights(want[1], p_min, beta), reference.is_weights(want[1], p_min, beta),
               1e-6)


def _check_gather(ops: CompiledReplayOps, device: torch.device, gen: torch.Generator) -> None:
    """The fused sample + row gather against ``sample_proportional`` then ``rows[index]`` (a packed ring of
    37 rows of 5 int64 words, random bits), both normalisations."""
    capacity = 37
    leaves, bs, bm = make_levels(capacity, device, gen)
    rows = torch.randint(-2**62, 2**62, (capacity, 5), generator=gen).to(device)
    u = boundary_uniforms(bs, 4, gen, n_bound=8)
    beta = torch.tensor(0.4, dtype=torch.float64, device=device)
    for normalize in ("buffer", "batch"):
        (gi, gw, gr), (wi, ww, wr) = (f(PriorityTree(leaves, bs, bm, beta=beta), u, rows, True, normalize)
                                      for f in (ops.sample_proportional_gather, reference.sample_proportional_gather))
        _equal(f"sample_proportional_gather[{normalize}].index", gi, wi)
        _close(f"sample_proportional_gather[{normalize}].weight", gw, ww, 1e-6)
        _equal(f"sample_proportional_gather[{normalize}].rows", gr, wr)


def _check_priority_ops(ops: CompiledReplayOps, device: torch.device, gen: torch.Generator) -> None:
    raw = torch.tensor([0.5, float("nan"), float("inf"), -float("inf"), -2.0, 0.0, 3.0, 1e30], device=device)
    mp = torch.tensor(7.0, device=device)
    for i, (g, w) in enumerate(zip(ops.sanitize_priority(raw, mp), reference.sanitize_priority(raw, mp))):
        _equal(f"sanitize_priority[{i}]", g, w)
    clean = torch.rand(33, generator=gen).to(device) * 5
    for alpha in (0.6, torch.tensor(0.6, dtype=torch.float64, device=device), 0.0):
        _close("transform_priority", ops.transform_priority(clean, alpha, 1e-6),
               reference.transform_priority(clean, alpha, 1e-6), 1e-6)
    rows = make_levels(70, device, gen, integer=False)[0]
    for i, (g, w) in enumerate(zip(ops.reduce_blocks(rows), reference.reduce_blocks(rows))):
        _close(f"reduce_blocks[{i}]", g, w, 1e-12)
    index = torch.randint(0, 6, (40,), generator=gen).to(device)
    values = torch.rand(40, generator=gen, dtype=torch.float64).to(device)
    _equal("last_write_wins", ops.last_write_wins(index, values), reference.last_write_wins(index, values))
    pos = torch.arange(40, dtype=torch.int32, device=device)
    scratch = torch.zeros(8, dtype=torch.int32, device=device)
    _equal("last_writer", ops.last_writer(index, scratch.clone(), pos), reference.last_writer(index, scratch, pos))


def _check_write(ops: CompiledReplayOps, device: torch.device, gen: torch.Generator) -> None:
    capacity, n_valid = 37, 30
    leaves = make_levels(capacity, device, gen, integer=False)[0]
    alpha = torch.tensor(0.7, dtype=torch.float64, device=device)
    got, want = (fresh_state(leaves, capacity, alpha, 1e-6) for _ in range(2))
    for _ in range(2):
        index = torch.randint(-2, capacity + 2, (24,), generator=gen)
        index[:6] = index[6:12]  # clashing duplicates
        prio = torch.rand(24, generator=gen) * 4
        prio[3], prio[7], prio[11] = float("nan"), -1.0, float("inf")
        index, prio = index.to(device), prio.to(device)
        ops.write_priorities(got, index, prio, n_valid)
        reference.write_priorities(want, index, prio, n_valid)
    for key in ("raw", "leaves", "block_min", "max_raw"):
        _close(f"write_priorities.{key}", getattr(got, key), getattr(want, key), 1e-6)
    _close("write_priorities.block_sum", got.block_sum, want.block_sum, 1e-12)
    _equal("write_priorities.n_clamped", got.n_clamped, want.n_clamped)
    _equal("write_priorities.n_dropped", got.n_dropped, want.n_dropped)
    _equal("write_priorities.scratch", torch.cat(got.scratch), torch.cat(write_scratch(leaves)))  # left as found


def _check_rank(ops: CompiledReplayOps, device: torch.device, gen: torch.Generator) -> None:
    _, cdf = reference.rank_weights(50, 0.7, device)
    order = torch.randperm(50, generator=gen).to(device)
    u = torch.rand(20, generator=gen, dtype=torch.float64).to(device)
    alpha = torch.tensor(0.7, dtype=torch.float64, device=device)
    beta = torch.tensor(0.5, dtype=torch.float64, device=device)
    for normalize in ("buffer", "batch"):
        (gi, gw), (wi, ww) = (f(RankTable(cdf, order, alpha, beta), u, 41, True, normalize)
                              for f in (ops.rank_sample, reference.rank_sample))
        _equal(f"rank_sample[{normalize}].index", gi, wi)
        _close(f"rank_sample[{normalize}].weight", gw, ww, 1e-6)


def _check_device_rng(ops: CompiledReplayOps, device: torch.device, gen: torch.Generator) -> None:
    """The in-kernel uniforms (``tree.rng``): both sample kernels build and run, draw the same slots and weights from
    equal states, count one draw per position, and land on written slots."""
    capacity, batch = 37, 8
    leaves, bs, bm = make_levels(capacity, device, gen)
    rows = torch.randint(-2**62, 2**62, (capacity, 5), generator=gen).to(device)
    first, second = ops.new_rng_state(12345, device), ops.new_rng_state(12345, device)
    gi, gw = ops.sample_proportional(PriorityTree(leaves, bs, bm, beta=0.4, rng=first), batch)
    hi, hw, hr = ops.sample_proportional_gather(PriorityTree(leaves, bs, bm, beta=0.4, rng=second), batch, rows)
    _equal("device rng: sample vs sample_gather index", gi, hi)
    _equal("device rng: sample vs sample_gather weight", gw, hw)
    _equal("device rng: gathered rows", hr, rows[gi])
    _equal("device rng: counters", first, second)
    counted = torch.zeros_like(first)
    counted[0], counted[1:1 + batch] = first[0], 1
    _equal("device rng: one count per draw", first, counted)
    if not bool((leaves.view(-1)[gi] > 0).all()):  # sync-ok: one-time self-check
        raise RuntimeError("device rng: a draw landed on an empty slot")
    u = ops.shuffled_uniforms(first, batch)  # one draw per stratum, in some order
    strata = torch.sort(torch.floor(u * batch).to(torch.int64)).values
    _equal("device rng: shuffled strata", strata, torch.arange(batch, device=device))
    counted[1:1 + batch] = 2
    _equal("device rng: shuffled draws counted", first, counted)


def _check_storage(ops: CompiledReplayOps, device: torch.device, gen: torch.Generator) -> None:
    """The storages' copies: rows gathered and scattered (row widths of 8-, 4- and 1-byte words, a ring in pinned
    host memory on CUDA) and frame stacks gathered, against the reference, exactly."""
    pin = device.type == "cuda"
    for row_bytes in (16, 12, 7):
        ring = torch.randint(0, 256, (9, row_bytes), dtype=torch.uint8, generator=gen)
        index = torch.tensor([7, 0, 3, 3, 8], device=device)
        host = ring.pin_memory() if pin else ring.clone()
        _equal(f"gather_rows[{row_bytes}]", ops.gather_rows(host, index), reference.gather_rows(ring, index))
        src = torch.randint(0, 256, (3, row_bytes), dtype=torch.uint8, generator=gen).to(device)
        rows = torch.tensor([8, 1, 4], device=device)
        expected = ring.clone()
        reference.scatter_rows(expected, rows, src)
        ops.scatter_rows(host, rows, src)
        if pin:
            torch.cuda.synchronize(device)  # sync-ok: one-time self-check reads the host ring the kernel wrote
        _equal(f"scatter_rows[{row_bytes}]", host, expected)
    frames = torch.randint(0, 256, (11, 3, 4), dtype=torch.uint8, generator=gen).to(device)
    positions = torch.randint(0, 11, (7, 6), dtype=torch.int32, generator=gen).to(device)
    index = torch.tensor([6, 0, 3, 3], device=device)
    _equal("gather_stacks", ops.gather_stacks(frames, positions, index),
           reference.gather_stacks(frames, positions, index))


def self_check(ops: CompiledReplayOps, device: torch.device, seed: int = 0) -> None:
    """Run every compiled op of ``ops`` on ``device`` against the reference.

    Raises:
        RuntimeError: naming the first op whose result differs.
    """
    gen = torch.Generator().manual_seed(seed)
    _check_search(ops, device, gen)
    _check_gather(ops, device, gen)
    _check_priority_ops(ops, device, gen)
    _check_write(ops, device, gen)
    _check_rank(ops, device, gen)
    _check_device_rng(ops, device, gen)
    _check_storage(ops, device, gen)
