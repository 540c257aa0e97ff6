"""Fused priority update: the sampler's whole ``_write`` in one launch (``B <= MAX_QUADRATIC``), with no
O(N) pass, leaving the block prefix (``block_cdf``, ``p_min``) current for the next draw.

``write_priorities`` = ``GPUPrioritizedSampler._write`` (twin: ``ext.composite.write_priorities``).
Per entry ``k``: ``clean, bad = sanitize(p_k, default)`` with ``default = max_raw`` (1 while no priority
was seen), ``ok = 0 <= index_k < n_valid``, rejected entries go to the ``trash`` slot with value 0,
``stored = (clean + eps)^alpha``; ``raw[idx_k] = clean_k``, ``leaves[idx_k] = stored_k`` unless a later
entry holds the same slot (**last write wins**, deterministic); the touched blocks' ``block_sum``
(float64 scan total) and ``block_min`` (min of non-zero leaves) are recomputed *from the leaves* (never
by deltas: no drift); ``max_raw``, ``n_clamped``, ``n_dropped`` fold in ``max(clean over ok)``, ``#bad``,
``#rejected``; then ``block_cdf`` / ``p_min`` are recomputed over all blocks
(:func:`.blocks.write_block_prefix`: the scan of the sample kernel, O(n_blocks) = O(sqrt(N))).

``_write_kernel`` (grid ``B``, one launch): program ``k`` sanitizes its entry and adds its partials to a
scratch ``workspace`` ``(4,)`` int32 by atomics (``[ticket, 1 + bits(max clean), #bad, #rejected]``;
clean values are >= 0, so their float32 bit patterns order like the values). The first entry (lowest
``k``) of each touched block *owns* it: it applies every entry of the batch that falls in its block, in
tiles of ``BB`` in batch order (within a tile a write is dropped if a later lane holds the same slot; a
barrier between tiles orders the writes of later tiles after earlier ones), then rescans the row. Each
program then takes a ticket (``atomic_add``, acq_rel, after a barrier); the program that draws the last
ticket - every other program has finished its writes - folds the accumulators into ``max_raw`` and the
counters, recomputes ``block_cdf``/``p_min``, and zeroes the workspace (next call, CUDA-graph replays).
No program waits for another; the result does not depend on program order. ``max_raw`` is read by every
program before its ticket and written only by the last one.

Batches above ``MAX_QUADRATIC`` (extends of many items) take an O(B) variant: a store then an
``atomic_max`` of ``k`` into a scratch ``(N,)`` int32 at ``idx_k`` leave there the last writer of each
slot (``_claim_kernel`` x2), ``_scatter_kernel`` writes the winners, flags touched blocks in a zeroed
``(n_blocks,)`` int32 and adds its partials to the workspace, and ``_refresh_kernel`` (one program per
block) rescans flagged rows, the last ticket folding and recomputing the prefix as above (memset + 4
launches).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from lightning_per.ops.reference import WRITE_WORKSPACE

from ._common import (
    MAX_CHUNK,
    chunk_for,
    compiling,
    expect,
    f64_bits,
    f64_from_bits,
    register_op,
    remember_validated,
    scalar_arg,
    validated,
    warps_for,
)
from .blocks import BB, MAX_QUADRATIC, row_stats, write_block_prefix
from .priority import exponent, sanitize, transform
from .sample import check_levels, check_prefix

__all__ = ["write_priorities", "WRITE_WORKSPACE"]

#: Entries per chunk of the owner check (is an earlier entry in my block?).
DUP_CHUNK = 1024


@triton.jit
def _slots(index_ptr, offs, m, n_valid, trash):
    """Target slot of each entry: ``index`` if in ``[0, n_valid)``, else ``trash``; and the ok mask."""
    index = tl.load(index_ptr + offs, mask=m, other=0).to(tl.int64)
    ok = (index >= 0) & (index < n_valid)
    return tl.where(ok, index, trash), ok


@triton.jit
def _default(maxraw_ptr):
    """``(max_raw, default)``: the running max raw priority and the clamp value (1 before any)."""
    mr = tl.load(maxraw_ptr)
    return mr, tl.where(tl.abs(mr) == float("inf"), 1.0, mr)


@triton.jit
def _add_partials(ws_ptr, hi, n_bad, n_drop):
    """Accumulate ``hi`` (1 + float32 bits of a clean max, 0 = none), ``#bad``, ``#rejected`` (int32).
    Relaxed: the program's later ticket (acq_rel, after a barrier) publishes them to the last program."""
    if hi > 0:
        tl.atomic_max(ws_ptr + 1, hi, sem="relaxed")
    if n_bad > 0:
        tl.atomic_add(ws_ptr + 2, n_bad, sem="relaxed")
    if n_drop > 0:
        tl.atomic_add(ws_ptr + 3, n_drop, sem="relaxed")


@triton.jit
def _finish(ws_ptr, n_programs, mr, maxraw_ptr, nclamp_ptr, ndrop_ptr, bsum_ptr, bmin_ptr, cdf_ptr, pmin_ptr,
            n_blocks, PREFIX: tl.constexpr, NB_CHUNK: tl.constexpr):
    """Take a ticket; the last of ``n_programs`` folds the workspace into ``max_raw`` (``mr``: its value
    read at this program's start) and the counters, zeroes the workspace, and recomputes the prefix."""
    tl.debug_barrier()  # this program's block writes and partials precede its ticket
    ticket = tl.atomic_add(ws_ptr, 1, sem="acq_rel")
    if ticket == n_programs - 1:  # every other program has finished its writes (acquire)
        hi = tl.atomic_xchg(ws_ptr + 1, 0, sem="acq_rel")
        n_bad = tl.atomic_xchg(ws_ptr + 2, 0, sem="acq_rel")
        n_drop = tl.atomic_xchg(ws_ptr + 3, 0, sem="acq_rel")
        tl.atomic_xchg(ws_ptr, 0, sem="acq_rel")
        gmax = tl.where(hi > 0, (hi - 1).to(tl.float32, bitcast=True), float("-inf"))
        tl.store(maxraw_ptr, tl.maximum(mr, gmax))
        tl.store(nclamp_ptr, tl.load(nclamp_ptr) + n_bad.to(tl.int64))
        tl.store(ndrop_ptr, tl.load(ndrop_ptr) + n_drop.to(tl.int64))
        if PREFIX:
            write_block_prefix(bsum_ptr, bmin_ptr, cdf_ptr, pmin_ptr, n_blocks, NB_CHUNK)


@triton.jit(do_not_specialize=["n", "n_valid", "trash", "block", "n_blocks", "alpha_bits", "eps_bits"])
def _write_kernel(index_ptr, prio_ptr, raw_ptr, leaves_ptr, bsum_ptr, bmin_ptr, maxraw_ptr, nclamp_ptr,
                  ndrop_ptr, cdf_ptr, pmin_ptr, ws_ptr, alpha_ptr, alpha_bits, eps_bits, n, n_valid, trash,
                  block, n_blocks,
                  ALPHA_FROM_PTR: tl.constexpr, PREFIX: tl.constexpr, BB: tl.constexpr,
                  DUP_CHUNK: tl.constexpr, ROW_CHUNK: tl.constexpr, NB_CHUNK: tl.constexpr):
    k = tl.program_id(0)
    mr, default = _default(maxraw_ptr)
    slot, ok = _slots(index_ptr, k, k < n, n_valid, trash)
    clean, bad = sanitize(tl.load(prio_ptr + k).to(tl.float32), default)
    _add_partials(ws_ptr, tl.where(ok, clean.to(tl.int32, bitcast=True) + 1, 0), bad.to(tl.int32),
                  (~ok).to(tl.int32))
    blk = slot // block
    n_before = tl.zeros([], tl.int32)  # earlier entries in my block: the first one owns the block
    for start in range(0, k, DUP_CHUNK):
        jo = start + tl.arange(0, DUP_CHUNK)
        jm = jo < k
        jslot, _ = _slots(index_ptr, jo, jm, n_valid, trash)
        n_before += tl.sum((jm & (jslot // block == blk)).to(tl.int32), 0)
    if n_before == 0:
        alpha = exponent(alpha_ptr, alpha_bits, ALPHA_FROM_PTR)
        eps = f64_from_bits(eps_bits)
        for start in range(k - k % BB, n, BB):  # tiles in batch order, from mine
            offs = start + tl.arange(0, BB)
            m = (offs >= k) & (offs < n)
            idx, okv = _slots(index_ptr, offs, m, n_valid, trash)
            mine = m & (idx // block == blk)
            if tl.sum(mine.to(tl.int32), 0) > 0:
                later = (idx[:, None] == idx[None, :]) & (offs[None, :] > offs[:, None]) & mine[None, :]
                win = mine & (tl.sum(later.to(tl.int32), 1) == 0)
                c, _ = sanitize(tl.load(prio_ptr + offs, mask=m, other=0.0).to(tl.float32), default)
                c = tl.where(okv, c, 0.0)
                stored = tl.where(okv, transform(c, alpha, eps), 0.0)
                tl.store(raw_ptr + idx, c, mask=win)
                tl.store(leaves_ptr + idx, stored, mask=win)
                tl.debug_barrier()  # writes of later tiles land after these: the last write wins
        tl.debug_barrier()  # the row scan below sees every write of this program
        s, low = row_stats(leaves_ptr + blk * block, block, ROW_CHUNK)
        tl.store(bsum_ptr + blk, s)
        tl.store(bmin_ptr + blk, low)
    _finish(ws_ptr, tl.num_programs(0), mr, maxraw_ptr, nclamp_ptr, ndrop_ptr, bsum_ptr, bmin_ptr, cdf_ptr,
            pmin_ptr, n_blocks, PREFIX, NB_CHUNK)


@triton.jit(do_not_specialize=["n", "n_valid", "trash"])
def _claim_kernel(index_ptr, scratch_ptr, n, n_valid, trash, ATOMIC: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    idx, ok = _slots(index_ptr, offs, m, n_valid, trash)
    if ATOMIC:  # scratch[idx] already holds one writer of idx from this batch: the max is the last
        tl.atomic_max(scratch_ptr + idx, offs, mask=m)
    else:
        tl.store(scratch_ptr + idx, offs, mask=m)


@triton.jit(do_not_specialize=["n", "n_valid", "trash", "block", "alpha_bits", "eps_bits"])
def _scatter_kernel(index_ptr, prio_ptr, raw_ptr, leaves_ptr, maxraw_ptr, alpha_ptr, alpha_bits, eps_bits,
                    scratch_ptr, flags_ptr, ws_ptr, n, n_valid, trash, block,
                    ALPHA_FROM_PTR: tl.constexpr, BB: tl.constexpr):
    offs = tl.program_id(0) * BB + tl.arange(0, BB)
    m = offs < n
    idx, ok = _slots(index_ptr, offs, m, n_valid, trash)
    _, default = _default(maxraw_ptr)
    clean, bad = sanitize(tl.load(prio_ptr + offs, mask=m, other=0.0).to(tl.float32), default)
    clean = tl.where(ok, clean, 0.0)
    alpha = exponent(alpha_ptr, alpha_bits, ALPHA_FROM_PTR)
    stored = tl.where(ok, transform(clean, alpha, f64_from_bits(eps_bits)), 0.0)
    win = m & (tl.load(scratch_ptr + idx, mask=m, other=-1) == offs)
    tl.store(flags_ptr + idx // block, 1, mask=m)
    tl.store(raw_ptr + idx, clean, mask=win)
    tl.store(leaves_ptr + idx, stored, mask=win)
    _add_partials(ws_ptr, tl.max(tl.where(m & ok, clean.to(tl.int32, bitcast=True) + 1, 0), 0),
                  tl.sum((m & bad).to(tl.int32), 0), tl.sum((m & ~ok).to(tl.int32), 0))


@triton.jit(do_not_specialize=["block", "n_blocks"])
def _refresh_kernel(flags_ptr, leaves_ptr, bsum_ptr, bmin_ptr, maxraw_ptr, nclamp_ptr, ndrop_ptr, cdf_ptr,
                    pmin_ptr, ws_ptr, block, n_blocks,
                    PREFIX: tl.constexpr, ROW_CHUNK: tl.constexpr, NB_CHUNK: tl.constexpr):
    k = tl.program_id(0)  # one program per block
    mr, _ = _default(maxraw_ptr)
    if tl.load(flags_ptr + k) != 0:
        blk = k.to(tl.int64)
        s, low = row_stats(leaves_ptr + blk * block, block, ROW_CHUNK)
        tl.store(bsum_ptr + blk, s)
        tl.store(bmin_ptr + blk, low)
    _finish(ws_ptr, n_blocks, mr, maxraw_ptr, nclamp_ptr, ndrop_ptr, bsum_ptr, bmin_ptr, cdf_ptr, pmin_ptr,
            n_blocks, PREFIX, NB_CHUNK)


def _launch_write(raw_store, leaves, block_sum, block_min, max_raw, n_clamped, n_dropped, index, priority,
                  n_valid: int, trash: int, alpha: Tensor | None, alpha_value: float, eps: float,
                  block_cdf: Tensor | None = None, p_min: Tensor | None = None, workspace: Tensor | None = None,
                  max_chunk: int = MAX_CHUNK, max_quadratic: int | None = None) -> None:
    n = index.numel()
    if n == 0:
        return
    nb, block = leaves.shape
    dev = index.device
    if workspace is None:
        workspace = torch.zeros(WRITE_WORKSPACE, dtype=torch.int32, device=dev)
    prefix = block_cdf is not None
    cdf, pmin = (block_cdf, p_min) if prefix else (block_sum, block_min)  # unused without PREFIX
    alpha_arg = alpha if alpha is not None else max_raw
    row_chunk, nb_chunk = chunk_for(block, max_chunk), chunk_for(nb, max_chunk)
    warps = warps_for(max(row_chunk, nb_chunk))  # the sample kernel's: the same block prefix scan
    if n <= (MAX_QUADRATIC if max_quadratic is None else max_quadratic):
        _write_kernel[(n,)](
            index, priority, raw_store, leaves, block_sum, block_min, max_raw, n_clamped, n_dropped, cdf, pmin,
            workspace, alpha_arg, f64_bits(alpha_value), f64_bits(eps), n, n_valid, trash, block, nb,
            ALPHA_FROM_PTR=alpha is not None, PREFIX=prefix, BB=BB, DUP_CHUNK=DUP_CHUNK, ROW_CHUNK=row_chunk,
            NB_CHUNK=nb_chunk, num_warps=warps)
        return
    scratch = torch.empty(nb * block, dtype=torch.int32, device=dev)
    flags = torch.zeros(nb, dtype=torch.int32, device=dev)
    for atomic in (False, True):
        _claim_kernel[(triton.cdiv(n, 1024),)](index, scratch, n, n_valid, trash, ATOMIC=atomic, BLOCK=1024)
    _scatter_kernel[(triton.cdiv(n, BB),)](
        index, priority, raw_store, leaves, max_raw, alpha_arg, f64_bits(alpha_value), f64_bits(eps), scratch,
        flags, workspace, n, n_valid, trash, block, ALPHA_FROM_PTR=alpha is not None, BB=BB, num_warps=4)
    _refresh_kernel[(nb,)](
        flags, leaves, block_sum, block_min, max_raw, n_clamped, n_dropped, cdf, pmin, workspace, block, nb,
        PREFIX=prefix, ROW_CHUNK=row_chunk, NB_CHUNK=nb_chunk, num_warps=warps)


@register_op("write_priorities", mutates_args=("raw_store", "leaves", "block_sum", "block_min", "max_raw",
                                               "n_clamped", "n_dropped", "block_cdf", "p_min", "workspace"),
             fake=lambda *args: None)
def _write_op(raw_store: Tensor, leaves: Tensor, block_sum: Tensor, block_min: Tensor, max_raw: Tensor,
              n_clamped: Tensor, n_dropped: Tensor, index: Tensor, priority: Tensor, n_valid: int, trash: int,
              alpha: Tensor | None, alpha_value: float, eps: float, block_cdf: Tensor | None,
              p_min: Tensor | None, workspace: Tensor | None) -> None:
    _launch_write(raw_store, leaves, block_sum, block_min, max_raw, n_clamped, n_dropped, index, priority,
                  n_valid, trash, alpha, alpha_value, eps, block_cdf, p_min, workspace)


def _check_write(raw_store, leaves, block_sum, block_min, max_raw, n_clamped, n_dropped, index, priority,
                 n_valid, trash, block_cdf, p_min, workspace) -> None:
    state = tuple(t for t in (raw_store, leaves, block_sum, block_min, max_raw, n_clamped, n_dropped, block_cdf,
                              p_min, workspace) if t is not None)
    nb, block = leaves.shape
    dev = leaves.device
    if not validated(state):  # a sampler's persistent tensors: checked once
        check_levels(leaves, block_sum)
        expect(raw_store, "raw_store", torch.float32, (nb * block,), device=dev)
        expect(block_min, "block_min", torch.float32, (nb,), device=dev)
        expect(max_raw, "max_raw", torch.float32, (), device=dev)
        expect(n_clamped, "n_clamped", torch.int64, (), device=dev)
        expect(n_dropped, "n_dropped", torch.int64, (), device=dev)
        check_prefix(block_sum, block_cdf, p_min)
        if workspace is not None:
            expect(workspace, "workspace", torch.int32, (WRITE_WORKSPACE,), device=dev)
        if not (raw_store.is_contiguous() and leaves.is_contiguous() and block_sum.is_contiguous()
                and block_min.is_contiguous()):
            raise ValueError("raw_store, leaves, block_sum and block_min must be contiguous "
                             "(they are updated in place)")
        remember_validated(state)
    expect(index, "index", torch.int64, ndim=1, device=dev)
    expect(priority, "priority", shape=index.shape, device=dev)
    if not priority.is_floating_point():
        raise TypeError(f"priority must be a float tensor, got {priority.dtype}")
    if not (0 <= n_valid <= trash < nb * block):
        raise ValueError(f"need 0 <= n_valid ({n_valid}) <= trash ({trash}) < n_blocks * block "
                         f"({nb * block})")
    if index.numel() >= 1 << 31:
        raise ValueError(f"index has {index.numel()} entries; the kernels take fewer than 2**31")


def write_priorities(raw_store: Tensor, leaves: Tensor, block_sum: Tensor, block_min: Tensor, max_raw: Tensor,
                     n_clamped: Tensor, n_dropped: Tensor, index: Tensor, priority: Tensor, n_valid: int,
                     trash: int, alpha: Tensor | float, eps: float, block_cdf: Tensor | None = None,
                     p_min: Tensor | None = None, workspace: Tensor | None = None) -> None:
    """Store raw priorities at slots, in place (module docstring); no host synchronisation.

    Args:
        raw_store: ``(n_blocks * block,)`` float32 clean raw priorities (updated).
        leaves: ``(n_blocks, block)`` float32 stored values ``(p + eps)^alpha`` (updated).
        block_sum: ``(n_blocks,)`` float64, block_min: ``(n_blocks,)`` float32 (touched blocks recomputed).
        max_raw: 0-d float32 running max raw priority (``-inf`` before any); n_clamped, n_dropped: 0-d
            int64 counters (updated).
        index: ``(B,)`` int64 slots; entries outside ``[0, n_valid)`` go to ``trash`` (value 0), counted.
        priority: ``(B,)`` float raw priorities; NaN/Inf/negative are clamped and counted.
        n_valid: filled slots (host int); trash: the always-empty slot (host int, ``n_valid <= trash``).
        alpha: exponent, float or 0-d float tensor on the device; eps: added before the exponent.
        block_cdf: optional ``(n_blocks,)`` float64 and p_min: 0-d float32 (both or neither): recomputed
            as the prefix sums of ``block_sum`` and ``block_min.amin()`` (:func:`.sample.sample_proportional`
            reads them).
        workspace: ``(WRITE_WORKSPACE,)`` int32 zeros, persistent (a sampler's; left zero after every
            call, CUDA-graph replays included). ``None``: a zeroed one per call (one memset more).

    Raises:
        ValueError/TypeError: a shape, dtype, device or range that does not fit (named).
    """
    _check_write(raw_store, leaves, block_sum, block_min, max_raw, n_clamped, n_dropped, index, priority,
                 n_valid, trash, block_cdf, p_min, workspace)
    alpha_t, alpha_v = scalar_arg(alpha, "alpha", leaves.device)
    args = (raw_store, leaves, block_sum, block_min, max_raw, n_clamped, n_dropped, index.contiguous(),
            priority.contiguous(), int(n_valid), int(trash), alpha_t, alpha_v, float(eps), block_cdf, p_min,
            workspace)
    if compiling():
        torch.ops.lightning_per.write_priorities(*args)
    else:
        _launch_write(*args)
