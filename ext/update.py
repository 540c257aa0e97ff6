"""Fused priority update: the sampler's whole ``_write`` in one launch, with no O(N) pass.

``write_priorities`` = ``GPUPrioritizedSampler._write`` (twin: ``lightning_per.ops.reference.write_priorities``).

Batches of at most ``MAX_ONE_LAUNCH`` entries (every training step, every extend of a rollout): one
program per entry ``k`` (``_write_one_kernel``). Each program loads all B slots (one vector), cleans
and transforms its own priority (the rules of ``_scatter_kernel`` below), writes it only if no later
entry holds the same slot (last write wins), then takes a ticket of its block (``atomic_add``,
acquire-release, on a per-block int32 counter). The program that draws the block's last ticket (the
number of entries in that block minus 1) sees every write into the block: it recomputes the block's
sum and minimum from the leaves and resets the counter. Right after its block ticket each program takes a
global ticket (release); the program that draws the last one resets it (an acquire exchange) and folds the
batch's max raw priority and counters from registers (the whole priority vector, the max raw priority
and the counters, all loaded at the start, before any ticket), in parallel with the block refreshes.
Deterministic (no value depends on the order of the programs) and graph-safe (the counters are zero
between calls); the counters live in the state (``PriorityTree.scratch.tickets``, one int32 per block plus one).

Larger batches take an O(B) path (below). A two-launch pairwise path, for batches up to ``max_quadratic``
entries of :func:`_launch_write` (0 by default: slower than the O(B) path for the slice sampler's 4,096 slots,
docs/kernels.md, "Tried and reverted"), is kept as the ticket-free reference of the one-launch kernel:

* ``_scatter_kernel`` (grid ``ceil(B / 64)``), per entry ``k``: ``clean, bad = sanitize(p_k, default)``
  with ``default = max_raw`` (1 while no priority was seen), ``ok = 0 <= index_k < n_valid``, rejected
  entries go to the ``trash`` slot with value 0, ``stored = (clean + eps)^alpha``; entry ``k`` writes
  ``raw[idx_k] = clean_k`` and ``leaves[idx_k] = stored_k`` only if no later entry holds the same slot
  (**last write wins**, deterministic: pairwise comparisons, no atomics); per-program partials of
  ``max(clean over ok)``, ``#bad`` and ``#rejected``.
* ``_refresh_kernel`` (grid ``B``): the first entry of each touched block recomputes that block's
  ``block_sum`` (float64 sum) and ``block_min`` (min of non-zero leaves) *from the leaves*
  (never by deltas: no drift); program 0 folds the partials into ``max_raw``, ``n_clamped`` and
  ``n_dropped``. Traffic O(B * block) = O(B sqrt(N)).

Batches above ``MAX_ONE_LAUNCH`` (large priority updates, extends of many items) take the O(B) path, three
launches: an ``atomic_max`` of ``k`` into a persistent scratch ``(N,)`` int32 (-1 between writes) at ``idx_k``
leaves there the last writer of each slot; the scatter writes the winners and flags the touched blocks in a
persistent ``(n_blocks,)`` int32 (0 between writes); the refresh runs one program per block (a flagged one
recomputes its sums and clears its flag), and its first ``ceil(B / SPREAD)`` programs put the scratch of the
batch's slots back to -1 (both in the state: ``PriorityTree.scratch``, :func:`~.state.write_scratch`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import (
    MAX_CHUNK,
    cdiv,
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
from .blocks import BB, row_stats
from .priority import exponent, sanitize, transform
from .search import check_levels
from .state import PriorityTree, WriteScratch

__all__ = ["write_priorities", "MAX_ONE_LAUNCH"]

#: Largest batch written by the one-launch kernel (each of its B programs holds all B slots in registers).
MAX_ONE_LAUNCH = 1024

#: Entries per program of the O(B) path's scattered atomics and stores (the last-writer claim, the scratch
#: reset): 128 spreads a 4,096-slot write over 32 programs; 1,024 per program (4 programs) made the claim a
#: visible share of the slice sampler's step (docs/kernels.md, "Tried and reverted"; benchmarks/results/slice-*.md).
SPREAD = 128

@triton.jit
def _slots(index_ptr, offs, m, n_valid, trash):
    """Target slot of each entry: ``index`` if in ``[0, n_valid)``, else ``trash``; and the ok mask."""
    index = tl.load(index_ptr + offs, mask=m, other=0).to(tl.int64)
    ok = (index >= 0) & (index < n_valid)
    return tl.where(ok, index, trash), ok


@triton.jit(do_not_specialize=["n", "n_valid", "trash"])
def _claim_kernel(index_ptr, scratch_ptr, n, n_valid, trash, BLOCK: tl.constexpr):
    """``scratch[idx_k] = max k`` over the entries of each slot (the scratch holds -1 between writes): the last
    writer of each slot."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    idx, ok = _slots(index_ptr, offs, m, n_valid, trash)
    tl.atomic_max(scratch_ptr + idx, offs, mask=m)


@triton.jit(do_not_specialize=["n", "n_valid", "trash", "block", "n_blocks", "alpha_bits", "eps_bits"])
def _write_one_kernel(index_ptr, prio_ptr, raw_ptr, leaves_ptr, bsum_ptr, bmin_ptr, maxraw_ptr, nclamp_ptr,
                      ndrop_ptr, ticket_ptr, alpha_ptr, alpha_bits, eps_bits, valid_ptr, n, n_valid, trash, block,
                      n_blocks, ALPHA_FROM_PTR: tl.constexpr, BP: tl.constexpr, ROW_CHUNK: tl.constexpr,
                      MASKED: tl.constexpr):
    k = tl.program_id(0)
    offs = tl.arange(0, BP)
    m = offs < n
    idx, ok = _slots(index_ptr, offs, m, n_valid, trash)  # every entry's slot
    mine = tl.load(index_ptr + k).to(tl.int64)
    mine_ok = (mine >= 0) & (mine < n_valid)
    mine = tl.where(mine_ok, mine, trash)
    blk = mine // block
    mr = tl.load(maxraw_ptr)  # read before any ticket: only the last program writes it
    # the fold's inputs, loaded now with everything else (only the last program uses them): its tail then
    # runs from registers, with no memory round trip before its stores
    n_clamped0 = tl.load(nclamp_ptr)
    n_dropped0 = tl.load(ndrop_ptr)
    every = tl.load(prio_ptr + offs, mask=m, other=0.0).to(tl.float32)
    default = tl.where(tl.abs(mr) == float("inf"), 1.0, mr)
    clean, bad = sanitize(tl.load(prio_ptr + k).to(tl.float32), default)
    clean = tl.where(mine_ok, clean, 0.0)
    alpha = exponent(alpha_ptr, alpha_bits, ALPHA_FROM_PTR)
    stored = tl.where(mine_ok, transform(clean, alpha, f64_from_bits(eps_bits)), 0.0)
    if MASKED:  # a slot the mask leaves out keeps its raw priority and stores the value 0
        stored = tl.where(tl.load(valid_ptr + mine, mask=mine_ok, other=0) != 0, stored, 0.0)
    # two counts in one reduction (B <= MAX_ONE_LAUNCH < 2^15): later entries of my slot in the low 16 bits,
    # entries of my block above them
    both = tl.sum(tl.where(m & (offs > k) & (idx == mine), 1, 0) + tl.where(m & (idx // block == blk), 65536, 0), 0)
    n_later = both & 0xFFFF
    n_in_block = both >> 16
    tl.store(raw_ptr + mine, clean, mask=n_later == 0)
    tl.store(leaves_ptr + mine, stored, mask=n_later == 0)
    tl.debug_barrier()  # all threads past the writes before the ticket (Triton issues both from one thread today)
    seen = tl.atomic_add(ticket_ptr + blk, 1, sem="acq_rel")
    # The global ticket at once, release only (an acquire would hold back the refresh's loads below): the fold
    # reads nothing from memory (its inputs were loaded at the start, before this release), so it need not
    # wait for a block refresh, nor a refresh for the global ticket. The last holder resets the ticket with an
    # acquire exchange before its stores: it then synchronises with every program's release (the increments
    # form one release sequence), so its stores of max_raw and the counters follow all programs' reads.
    done = tl.atomic_add(ticket_ptr + n_blocks, 1, sem="release")
    if seen == n_in_block - 1:  # last entry of this block: every write into it is visible
        tl.debug_barrier()
        s, low = row_stats(leaves_ptr + blk * block, block, ROW_CHUNK)
        tl.store(bsum_ptr + blk, s)
        tl.store(bmin_ptr + blk, low)
        tl.store(ticket_ptr + blk, 0)
    if done == n - 1:  # last program: fold the batch's max raw priority and counters
        tl.atomic_xchg(ticket_ptr + n_blocks, 0, sem="acquire")  # the reset, and the acquire (see above)
        cv, bv = sanitize(every, default)
        tl.store(maxraw_ptr, tl.maximum(mr, tl.max(tl.where(m & ok, cv, float("-inf")), 0)))
        tl.store(nclamp_ptr, n_clamped0 + tl.sum((m & bv).to(tl.int64), 0))
        tl.store(ndrop_ptr, n_dropped0 + tl.sum((m & ~ok).to(tl.int64), 0))


@triton.jit(do_not_specialize=["n", "n_valid", "trash", "block", "alpha_bits", "eps_bits"])
def _scatter_kernel(index_ptr, prio_ptr, raw_ptr, leaves_ptr, maxraw_ptr, alpha_ptr, alpha_bits, eps_bits,
                    idx_out_ptr, scratch_ptr, flags_ptr, pmax_ptr, pbad_ptr, pdrop_ptr, valid_ptr, n, n_valid, trash,
                    block,
                    ALPHA_FROM_PTR: tl.constexpr, QUADRATIC: tl.constexpr, BB: tl.constexpr, MASKED: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BB + tl.arange(0, BB)
    m = offs < n
    idx, ok = _slots(index_ptr, offs, m, n_valid, trash)
    mr = tl.load(maxraw_ptr)
    clean, bad = sanitize(tl.load(prio_ptr + offs, mask=m, other=0.0).to(tl.float32),
                          tl.where(tl.abs(mr) == float("inf"), 1.0, mr))
    clean = tl.where(ok, clean, 0.0)
    alpha = exponent(alpha_ptr, alpha_bits, ALPHA_FROM_PTR)
    stored = tl.where(ok, transform(clean, alpha, f64_from_bits(eps_bits)), 0.0)
    if MASKED:
        stored = tl.where(tl.load(valid_ptr + idx, mask=m & ok, other=0) != 0, stored, 0.0)
    if QUADRATIC:
        n_later = tl.zeros([BB], tl.int32)
        for start in range(pid * BB, n, BB):  # entries before this program's cannot be later ones
            jo = start + tl.arange(0, BB)
            jidx, _ = _slots(index_ptr, jo, jo < n, n_valid, trash)
            same = (idx[:, None] == jidx[None, :]) & (jo[None, :] > offs[:, None]) & (jo < n)[None, :]
            n_later += tl.sum(same.to(tl.int32), 1)
        win = m & (n_later == 0)
    else:
        win = m & (tl.load(scratch_ptr + idx, mask=m, other=-1) == offs)
        tl.store(flags_ptr + idx // block, 1, mask=m)
    tl.store(idx_out_ptr + offs, idx, mask=m)
    tl.store(raw_ptr + idx, clean, mask=win)
    tl.store(leaves_ptr + idx, stored, mask=win)
    tl.store(pmax_ptr + pid, tl.max(tl.where(m & ok, clean, float("-inf")), 0))
    tl.store(pbad_ptr + pid, tl.sum((m & bad).to(tl.int64), 0))
    tl.store(pdrop_ptr + pid, tl.sum((m & ~ok).to(tl.int64), 0))


@triton.jit(do_not_specialize=["n", "block", "n_parts", "n_blocks"])
def _refresh_kernel(idx_ptr, flags_ptr, scratch_ptr, leaves_ptr, bsum_ptr, bmin_ptr, maxraw_ptr, nclamp_ptr,
                    ndrop_ptr, pmax_ptr, pbad_ptr, pdrop_ptr, n, block, n_parts, n_blocks,
                    BY_FLAG: tl.constexpr, ROW_CHUNK: tl.constexpr, DUP_CHUNK: tl.constexpr,
                    RESET_CHUNK: tl.constexpr):
    k = tl.program_id(0)
    if BY_FLAG:  # one program per block (and per RESET_CHUNK entries: their scratch slots back to -1)
        blk = k.to(tl.int64)
        live = k < n_blocks
        todo = live & (tl.load(flags_ptr + k, mask=live, other=0) != 0)
        ro = k.to(tl.int64) * RESET_CHUNK + tl.arange(0, RESET_CHUNK)
        rm = ro < n
        tl.store(scratch_ptr + tl.load(idx_ptr + ro, mask=rm, other=0), -1, mask=rm)
    else:  # one program per entry: the first entry of each block refreshes it
        blk = tl.load(idx_ptr + k) // block
        n_before = tl.zeros([], tl.int32)
        for start in range(0, k, DUP_CHUNK):
            jo = start + tl.arange(0, DUP_CHUNK)
            jm = jo < k
            same = jm & ((tl.load(idx_ptr + jo, mask=jm, other=0) // block) == blk)
            n_before += tl.sum(same.to(tl.int32), 0)
        todo = n_before == 0
    if todo:
        s, low = row_stats(leaves_ptr + blk * block, block, ROW_CHUNK)
        tl.store(bsum_ptr + blk, s)
        tl.store(bmin_ptr + blk, low)
        if BY_FLAG:
            tl.store(flags_ptr + blk, 0)
    if k == 0:
        gmax = tl.full([], float("-inf"), tl.float32)
        bad = tl.zeros([], tl.int64)
        drop = tl.zeros([], tl.int64)
        for start in range(0, n_parts, DUP_CHUNK):
            po = start + tl.arange(0, DUP_CHUNK)
            pm = po < n_parts
            gmax = tl.maximum(gmax, tl.max(tl.load(pmax_ptr + po, mask=pm, other=float("-inf")), 0))
            bad += tl.sum(tl.load(pbad_ptr + po, mask=pm, other=0), 0)
            drop += tl.sum(tl.load(pdrop_ptr + po, mask=pm, other=0), 0)
        tl.store(maxraw_ptr, tl.maximum(tl.load(maxraw_ptr), gmax))
        tl.store(nclamp_ptr, tl.load(nclamp_ptr) + bad)
        tl.store(ndrop_ptr, tl.load(ndrop_ptr) + drop)


def _launch_write(raw_store, leaves, block_sum, block_min, max_raw, n_clamped, n_dropped, scratch: WriteScratch,
                  index, priority, n_valid: int, trash: int, alpha: Tensor | None, alpha_value: float, eps: float,
                  valid: Tensor | None = None, max_chunk: int = MAX_CHUNK, max_quadratic: int = 0,
                  max_one: int = MAX_ONE_LAUNCH) -> None:
    n = index.numel()
    if n == 0:
        return
    nb, block = leaves.shape
    dev = index.device
    if n <= max_one:
        row_chunk = chunk_for(block, max_chunk)
        bp = chunk_for(n, 1 << 30)
        _write_one_kernel[(n,)](
            index, priority, raw_store, leaves, block_sum, block_min, max_raw, n_clamped, n_dropped,
            scratch.tickets, alpha if alpha is not None else max_raw, f64_bits(alpha_value), f64_bits(eps),
            valid if valid is not None else index, n, n_valid, trash, block, nb, ALPHA_FROM_PTR=alpha is not None,
            BP=bp, ROW_CHUNK=row_chunk, MASKED=valid is not None,
            num_warps=max(warps_for(row_chunk), 4 if bp <= 512 else 8))
        return
    parts = cdiv(n, BB)
    quadratic = n <= max_quadratic
    idx = torch.empty(n, dtype=torch.int64, device=dev)  # target slot per entry
    pmax = torch.empty(parts, dtype=torch.float32, device=dev)  # per-program max(clean), #bad, #rejected
    pbad = torch.empty(parts, dtype=torch.int64, device=dev)
    pdrop = torch.empty(parts, dtype=torch.int64, device=dev)
    if quadratic:
        scratch = flags = pmax  # unused
    else:  # the persistent last-writer scratch (-1) and block flags (0), left so by the refresh
        scratch, flags = scratch.last_writer, scratch.flags
        _claim_kernel[(cdiv(n, SPREAD),)](index, scratch, n, n_valid, trash, BLOCK=SPREAD)
    _scatter_kernel[(parts,)](
        index, priority, raw_store, leaves, max_raw, alpha if alpha is not None else max_raw,
        f64_bits(alpha_value), f64_bits(eps), idx, scratch, flags, pmax, pbad, pdrop,
        valid if valid is not None else index, n, n_valid, trash, block,
        ALPHA_FROM_PTR=alpha is not None, QUADRATIC=quadratic, BB=BB, MASKED=valid is not None, num_warps=4)
    row_chunk = chunk_for(block, max_chunk)
    _refresh_kernel[(n if quadratic else max(nb, cdiv(n, SPREAD)),)](
        idx, flags, scratch, leaves, block_sum, block_min, max_raw, n_clamped, n_dropped, pmax, pbad, pdrop, n,
        block, parts, nb, BY_FLAG=not quadratic, ROW_CHUNK=row_chunk, DUP_CHUNK=1024, RESET_CHUNK=SPREAD,
        num_warps=warps_for(row_chunk))


@register_op("write_priorities", mutates_args=("raw_store", "leaves", "block_sum", "block_min", "max_raw",
                                               "n_clamped", "n_dropped", "tickets", "last_writer", "flags"),
             fake=lambda *args: None)
def _write_op(raw_store: Tensor, leaves: Tensor, block_sum: Tensor, block_min: Tensor, max_raw: Tensor,
              n_clamped: Tensor, n_dropped: Tensor, tickets: Tensor, last_writer: Tensor, flags: Tensor,
              index: Tensor, priority: Tensor, n_valid: int, trash: int, alpha: Tensor | None, alpha_value: float,
              eps: float, valid: Tensor | None) -> None:
    _launch_write(raw_store, leaves, block_sum, block_min, max_raw, n_clamped, n_dropped,
                  WriteScratch(tickets, last_writer, flags), index, priority, n_valid, trash, alpha, alpha_value, eps,
                  valid)


def _check_write(tree: PriorityTree, index: Tensor, priority: Tensor, n_valid: int, valid: Tensor | None) -> None:
    leaves = tree.leaves
    nb, block = leaves.shape
    dev = leaves.device
    if not isinstance(tree.scratch, WriteScratch):
        raise ValueError("tree.scratch must be the write's WriteScratch (ext.state.write_scratch(leaves)), got "
                         f"{type(tree.scratch).__name__}")
    state = (tree.raw, leaves, tree.block_sum, tree.block_min, tree.max_raw, tree.n_clamped, tree.n_dropped,
             *tree.scratch)
    if not validated(state):  # a sampler's persistent tensors: checked once
        check_levels(leaves, tree.block_sum)
        expect(tree.raw, "tree.raw", torch.float32, (nb * block,), device=dev)
        expect(tree.block_min, "tree.block_min", torch.float32, (nb,), device=dev)
        expect(tree.max_raw, "tree.max_raw", torch.float32, (), device=dev)
        expect(tree.n_clamped, "tree.n_clamped", torch.int64, (), device=dev)
        expect(tree.n_dropped, "tree.n_dropped", torch.int64, (), device=dev)
        expect(tree.scratch.tickets, "tree.scratch.tickets", torch.int32, (nb + 1,), device=dev)
        expect(tree.scratch.last_writer, "tree.scratch.last_writer", torch.int32, (nb * block,), device=dev)
        expect(tree.scratch.flags, "tree.scratch.flags", torch.int32, (nb,), device=dev)
        if not (tree.raw.is_contiguous() and leaves.is_contiguous() and tree.block_sum.is_contiguous()
                and tree.block_min.is_contiguous()):
            raise ValueError("tree.raw, leaves, block_sum and block_min must be contiguous "
                             "(they are updated in place)")
        remember_validated(state)
    expect(index, "index", torch.int64, ndim=1, device=dev)
    expect(priority, "priority", shape=index.shape, device=dev)
    if not priority.is_floating_point():
        raise TypeError(f"priority must be a float tensor, got {priority.dtype}")
    trash = tree.capacity
    if not (0 <= n_valid <= trash < nb * block):
        raise ValueError(f"need 0 <= n_valid ({n_valid}) <= tree.capacity ({trash}) < n_blocks * block "
                         f"({nb * block})")
    if valid is not None and not validated((valid,)):
        expect(valid, "valid", torch.bool, ndim=1, device=dev)
        if valid.numel() < trash or not valid.is_contiguous():
            raise ValueError(f"valid must be a contiguous (>= tree.capacity = {trash},) bool mask, got "
                             f"{tuple(valid.shape)}")
        remember_validated((valid,))


def write_priorities(tree: PriorityTree, index: Tensor, priority: Tensor, n_valid: int,
                     valid: Tensor | None = None) -> None:
    """Store raw priorities at slots of ``tree``, in place (module docstring); no host synchronisation.

    Args:
        tree: the :class:`~.state.PriorityTree` written: ``raw`` and ``leaves`` (the entries' slots), the touched
            blocks' ``block_sum`` / ``block_min``, ``max_raw``, ``n_clamped``, ``n_dropped``; it reads ``alpha``
            (float or 0-d float tensor on the device), ``eps``, ``capacity`` (the trash slot) and uses
            ``scratch`` (:func:`~.state.write_scratch`, left as found).
        index: ``(B,)`` int64 slots; entries outside ``[0, n_valid)`` go to the trash slot (value 0), counted.
        priority: ``(B,)`` float raw priorities; NaN/Inf/negative are clamped and counted.
        n_valid: filled slots (host int, ``n_valid <= tree.capacity``).
        valid: optional ``(>= capacity,)`` bool mask: a written slot where it is False stores the value 0 (its raw
            priority is still stored and folded into the running max, and it is not counted as dropped), e.g. a
            slice sampler's slots that cannot start a slice.

    Raises:
        ValueError/TypeError: a shape, dtype, device or range that does not fit (named); a tree without scratch.

    Example::

        write_priorities(tree, torch.tensor([3, 3], device="cuda"), torch.tensor([1.0, 2.0], device="cuda"), 10)
    """
    _check_write(tree, index, priority, n_valid, valid)
    alpha_t, alpha_v = scalar_arg(tree.alpha, "alpha", tree.leaves.device)
    args = (tree.raw, tree.leaves, tree.block_sum, tree.block_min, tree.max_raw, tree.n_clamped, tree.n_dropped,
            *tree.scratch, index.contiguous(), priority.contiguous(), int(n_valid), int(tree.capacity), alpha_t,
            alpha_v, float(tree.eps), valid)
    if compiling():
        torch.ops.lightning_per.write_priorities(*args)
    else:
        _launch_write(*args[:7], tree.scratch, *args[10:])
