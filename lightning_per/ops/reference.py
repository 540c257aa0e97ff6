"""Plain-torch reference of every prioritized-replay op: CPU and CUDA, the test oracle and the fallback.

Pure functions over explicit tensors (no state, no host synchronisation, no Python branch on tensor
values), so they can be traced, compiled and captured in CUDA graphs. The compiled kernels of
``ext/`` must return the same values; :mod:`lightning_per.ops.dispatch` checks that once.

Notation follows Schaul et al., "Prioritized Experience Replay", ICLR 2016 (arXiv:1511.05952):
raw priority ``p_i`` (usually ``|td_i|``), stored value ``(p_i + eps)^alpha`` (TorchRL's convention),
P(i) = stored_i / sum_k stored_k (eq. 1), IS weight w_i = (N P(i))^-beta normalised by
max_j w_j (section 3.4), rank-based P(i) ∝ rank(i)^-alpha (section 3.3).

Layout of the priorities ("two-level flat array"): ``leaves`` ``(n_blocks, block)`` float32 holds the
stored values of slots ``b * block + j`` (0 for empty or padding slots); ``block_sum`` ``(n_blocks,)``
float64 and ``block_min`` ``(n_blocks,)`` float32 (``+inf`` for blocks with no positive leaf) are
*recomputed from the leaves* of every touched block, never updated by deltas, so they cannot drift.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lightning_per.ext.state import PriorityTree, RankTable

__all__ = [
    "block_size_for",
    "sanitize_priority",
    "transform_priority",
    "reduce_blocks",
    "last_write_wins",
    "stratified_uniforms",
    "inverse_cdf_search",
    "two_level_search",
    "two_level_search_with_values",
    "last_writer",
    "is_weights",
    "rank_weights",
    "sample_proportional",
    "sample_proportional_gather",
    "write_priorities",
    "rank_sample",
    "gather_rows",
    "scatter_rows",
    "gather_stacks",
]


#: The batch a serial layout (:func:`block_size_for` with ``serial=True``) is chosen for.
SERIAL_BATCH = 256


def block_size_for(capacity: int, serial: bool = False) -> int:
    """Leaves per block of a two-level array over ``capacity`` slots: a power of two (>= 1).

    A draw scans the ``capacity / block`` block sums once (their prefix sums, searched by
    ``torch.searchsorted``) and one block per draw; a write reduces one block per written slot.

    * ``serial=False`` (parallel devices, the compiled kernels): the power of two nearest above
      ``sqrt(capacity)``, which balances the two passes of a draw when each pass runs in parallel.
    * ``serial=True`` (these reference ops on a CPU, one thread): the power of two nearest above
      ``sqrt(capacity / SERIAL_BATCH)``, which balances the work a step of ``B = SERIAL_BATCH`` draws and
      writes does: a few passes over the ``capacity / block`` block sums against a few over the ``B * block``
      leaves of the drawn and written blocks (``block = 64`` at a million slots: 16k leaves a pass instead
      of 262k; docs/replay.md, "On a CPU", measures it).

    The layout changes no result: every draw has the same probabilities ``P(i) = leaf_i / S`` and
    every checkpoint loads under either layout (docs/replay.md, "On a CPU").

    Args:
        capacity: slots (>= 1).
        serial: choose for one CPU thread (see above).

    Returns:
        The block size, an int power of two.

    Raises:
        ValueError: ``capacity`` < 1.

    Example::

        >>> block_size_for(1_000_000), block_size_for(1_000_000, serial=True)
        (1024, 64)
    """
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    if serial:
        return 1 << max(0, math.ceil(math.log2(math.sqrt(capacity / SERIAL_BATCH))))
    return 1 << max(0, math.ceil(math.log2(math.sqrt(capacity))))


def sanitize_priority(priority: Tensor, max_priority: Tensor) -> tuple[Tensor, Tensor]:
    """Replace invalid raw priorities so they never enter the sums; count them.

    Rule: a finite value ``>= 0`` is kept; ``-inf`` and negative values clamp
    to 0 (stored as ``eps^alpha``, the floor); ``+inf`` and NaN clamp to the running maximum raw
    priority (NaN has no order: treating it as "high" makes the item be revisited soon).

    Args:
        priority: ``(B,)`` float raw priorities, any device.
        max_priority: 0-d float tensor on the same device, the running max raw priority (>= 0).

    Returns:
        ``(clean, n_invalid)``: ``(B,)`` float32 clean priorities, and a 0-d int64 count of replaced
        values. Both on ``priority.device``; no host sync.
    """
    p = priority.to(torch.float32)
    clean = torch.where(p < float("inf"), p.clamp_min(0), max_priority.to(torch.float32))  # NaN, +inf -> max
    # replaced exactly where the value changed: NaN (never equal), +/-inf and negatives (-0.0 == 0 stays)
    return clean, (clean != p).sum()


def transform_priority(clean: Tensor, alpha: Tensor | float, eps: float) -> Tensor:
    """Stored value ``(p + eps)^alpha`` (TorchRL ``PrioritizedSampler``; PER paper eq. 1 numerator).

    The one place where alpha is applied.

    Args:
        clean: ``(B,)`` float32 non-negative raw priorities.
        alpha: exponent, a Python float or a 0-d tensor on ``clean.device`` (graph-safe annealing).
        eps: small positive constant.

    Returns:
        ``(B,)`` float32 stored values (> 0 for eps > 0), on ``clean.device``.
    """
    return torch.pow(clean.to(torch.float64) + eps, alpha).to(torch.float32)


def reduce_blocks(rows: Tensor) -> tuple[Tensor, Tensor]:
    """Sum and min-over-positive of each row of leaves.

    Args:
        rows: ``(K, block)`` float32 stored values (0 = empty slot).

    Returns:
        ``(sum, min)``: ``(K,)`` float64 sums (accumulated in float64), ``(K,)`` float32 minima over
        the positive entries (``+inf`` where a row has none).
    """
    # the last element of the float64 inclusive scan: bit-identical to the row total that the reference's
    # two_level_search computes with the same op, so its draws never fall past a block's mass (the compiled
    # kernels sum rows as a tree instead and rely on their search's positive-mass rule for that)
    total = torch.cumsum(rows, 1, dtype=torch.float64)[:, -1].contiguous()
    pos_min = rows.masked_fill(rows == 0, float("inf")).amin(dim=1)
    return total, pos_min


def last_write_wins(index: Tensor, values: Tensor) -> Tensor:
    """For each position, the value of the *last* position in the batch holding the same index.

    Writing ``out`` at ``index`` then stores, for a repeated index, the value given last, whatever
    order the device applies the scatter in (TorchRL's rule, made deterministic on CUDA).

    Args:
        index: ``(B,)`` int64 slot indices.
        values: ``(B,)`` values to write.

    Returns:
        ``(B,)`` values, same dtype and device; ``out[k] = values[max{j : index[j] == index[k]}]``.
    """
    n = index.numel()
    if n <= 1:
        return values
    sorted_idx, order = torch.sort(index, stable=True)  # [B], equal indices keep batch order
    is_last = torch.ones_like(sorted_idx, dtype=torch.bool)
    is_last[:-1] = sorted_idx[1:] != sorted_idx[:-1]
    pos = torch.arange(n, device=index.device)
    big = torch.full_like(pos, n)
    # position (in sorted order) of the last member of each element's group: reverse cummin
    end = torch.where(is_last, pos, big).flip(0).cummin(0).values.flip(0)  # [B]
    winner_sorted = values[order][end]  # [B] in sorted order
    out = torch.empty_like(values)
    out[order] = winner_sorted
    return out


def last_writer(index: Tensor, scratch: Tensor, positions: Tensor) -> Tensor:
    """Position of the last batch entry writing each entry's slot (O(B), deterministic on CUDA).

    ``scratch`` is a persistent ``(N,)`` int32 buffer whose entries outside ``index`` are never read;
    one ``scatter_reduce(amax)`` of the batch positions into it, then a gather.
    Equivalent to :func:`last_write_wins` applied to ``positions``.

    Args:
        index: ``(B,)`` int64 slots.
        scratch: ``(N,)`` int32 on the same device (N > max index).
        positions: ``(B,)`` int32, ``arange(B)``.

    Returns:
        ``(B,)`` int64 positions ``max{j : index[j] == index[k]}``.
    """
    scratch.scatter_reduce_(0, index, positions, reduce="amax", include_self=False)
    return scratch[index].long()


def stratified_uniforms(batch_size: int, generator: torch.Generator | None, device: torch.device,
                        stratified: bool = True) -> Tensor:
    """Draws in [0, 1): one per equal-mass segment (PER paper, Appendix B.2.1) or i.i.d.

    ``u_j = (j + U_j) / B`` with ``U_j ~ U[0, 1)`` when ``stratified``, else ``u_j = U_j``.

    Args:
        batch_size: B >= 1.
        generator: a ``torch.Generator`` on ``device`` (or None for the default one).
        device: where to draw.
        stratified: segment draws (default) or plain draws.

    Returns:
        ``(B,)`` float64 on ``device``.
    """
    u = torch.rand(batch_size, generator=generator, device=device, dtype=torch.float64)
    if stratified:
        u = (torch.arange(batch_size, device=device, dtype=torch.float64) + u) / batch_size
    return u


def inverse_cdf_search(cdf: Tensor, target: Tensor) -> Tensor:
    """Smallest ``i`` with ``cdf[i] > target`` (zero-mass entries are never returned), clamped to
    the last entry.

    Args:
        cdf: ``(n,)`` float64 inclusive prefix sums (non-decreasing).
        target: ``(B,)`` float64 values in ``[0, cdf[-1])``.

    Returns:
        ``(B,)`` int64 indices in ``[0, n)``, on ``cdf.device``.
    """
    return torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.numel() - 1)


def two_level_search(leaves: Tensor, block_sum: Tensor, u: Tensor) -> Tensor:
    """Inverse-CDF draw over a two-level flat array: block first, then the leaf inside it.

    Draw ``k`` returns the slot ``i`` with ``C_{i-1} <= u_k * S < C_i`` where ``C`` is the inclusive
    prefix sum of the leaves and ``S`` their total, so ``P(i) = leaf_i / S`` for every ``u ~ U[0,1)``.

    Args:
        leaves: ``(n_blocks, block)`` float32 stored values (0 = empty).
        block_sum: ``(n_blocks,)`` float64 exact row sums of ``leaves``.
        u: ``(B,)`` float64 in ``[0, 1)``.

    Returns:
        ``(B,)`` int64 slot indices (``block_id * block + offset``), each with a positive leaf if any
        leaf is positive. Device of ``leaves``; no host sync.
    """
    index, _ = two_level_search_with_values(leaves, block_sum, u)
    return index


def two_level_search_with_values(leaves: Tensor, block_sum: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`two_level_search` that also returns the stored values of the drawn slots.

    Returns:
        ``(index, value)``: ``(B,)`` int64 slots and ``(B,)`` float32 stored values (``leaves`` at them).
    """
    block = leaves.shape[1]
    cdf = torch.cumsum(block_sum, 0)  # [n_blocks] float64
    # (1 - 2^-40) keeps every target strictly below the total mass despite rounding
    target = u * (cdf[-1] * (1.0 - 2.0**-40))  # [B]
    blk = torch.searchsorted(cdf, target, right=True)  # [B] < n_blocks, a block with mass
    offset = target - (cdf - block_sum)[blk]  # [B] mass left inside the block (may be ~ -1 ulp)
    rows = leaves.index_select(0, blk)  # [B, block] (whole rows: one copy each, cheaper than indexing)
    row_cdf = torch.cumsum(rows, 1, dtype=torch.float64)  # [B, block]; row_cdf[:, -1] == block_sum[blk]
    offset = torch.minimum(offset, row_cdf[:, -1] * (1.0 - 2.0**-40))
    j = torch.searchsorted(row_cdf, offset.unsqueeze(1), right=True)  # [B, 1] < block
    return torch.add(j.squeeze(1), blk, alpha=block), rows.gather(1, j).squeeze(1)


def is_weights(p_sel: Tensor, p_min: Tensor, beta: Tensor | float, normalize: str = "buffer") -> Tensor:
    """Importance-sampling weights, PER paper section 3.4.

    ``w_i = (N P(i))^-beta / max_j (N P(j))^-beta``. With ``normalize="buffer"`` the max runs over
    the filled buffer, which reduces to ``(p_i / p_min)^-beta`` (TorchRL's convention); with
    ``"batch"`` over the sampled batch only.

    Args:
        p_sel: ``(B,)`` float32 stored values of the sampled slots (> 0).
        p_min: 0-d float32, the minimum positive stored value in the buffer.
        beta: exponent (float or 0-d tensor on the same device).
        normalize: ``"buffer"`` or ``"batch"``.

    Returns:
        ``(B,)`` float32 weights in (0, 1].
    """
    if normalize not in ("buffer", "batch"):
        raise ValueError(f"normalize must be 'buffer' or 'batch', got {normalize!r}")
    w = torch.pow(p_sel / p_min, -beta)  # [B] float32 (a 0-d exponent does not promote)
    if normalize == "batch":
        w = w / w.max()
    return w


def rank_weights(capacity: int, alpha: float, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """Rank-based priorities ``w_k = k^-alpha`` for ranks ``k = 1..capacity`` (PER paper section 3.3).

    Returns:
        ``(w, cdf)``: ``(capacity,)`` float64 weights and their inclusive prefix sums; for a buffer
        holding ``n`` items, ``P(rank k) = w[k-1] / cdf[n-1]``.
    """
    k = torch.arange(1, capacity + 1, dtype=torch.float64, device=device)
    w = k.pow(-float(alpha))
    return w, torch.cumsum(w, 0)


# ---------------------------------------------------------------------------------------------
# Whole-step ops: what a sampler calls once per sample / update. The compiled backend replaces each
# with one or two fused kernels (ext/); these compositions are their oracle and fallback.
# ---------------------------------------------------------------------------------------------


def _stratify(u: Tensor, stratified: bool) -> Tensor:
    n = u.numel()
    return (torch.arange(n, device=u.device, dtype=torch.float64) + u) / n if stratified else u


def sample_proportional(tree: PriorityTree, u: Tensor, stratified: bool = True,
                        normalize: str = "buffer") -> tuple[Tensor, Tensor]:
    """Proportional draw from ``tree`` (its ``leaves``, ``block_sum``, ``block_min`` and ``beta``) with i.i.d.
    uniforms ``u`` ``(B,)`` float64: ``(index (B,) int64, w (B,) float32)``.

    ``u' = (arange(B) + u) / B`` if ``stratified``; ``index, p = two_level_search_with_values(leaves,
    block_sum, u')``; ``w = is_weights(p, block_min.amin(), beta, normalize)``.

    Example::

        >>> import torch
        >>> from lightning_per.ext.state import PriorityTree
        >>> leaves = torch.tensor([[1.0, 3.0]])
        >>> tree = PriorityTree(leaves, *reduce_blocks(leaves), beta=1.0)
        >>> index, w = sample_proportional(tree, torch.tensor([0.1, 0.9], dtype=torch.float64), False)
        >>> index.tolist(), w.tolist()
        ([0, 1], [1.0, 0.3333333432674408])
    """
    index, p_sel = two_level_search_with_values(tree.leaves, tree.block_sum, _stratify(u, stratified))
    return index, is_weights(p_sel, tree.block_min.amin(), tree.beta, normalize)


def sample_proportional_gather(tree: PriorityTree, u: Tensor, rows: Tensor, stratified: bool = True,
                               normalize: str = "buffer") -> tuple[Tensor, Tensor, Tensor]:
    """:func:`sample_proportional`, then the drawn rows of a packed ring: ``(index (B,) int64, w (B,)
    float32, rows[index] (B, W))``, ``rows`` ``(N, W)`` (the packed storage's ``int64`` ring)."""
    index, w = sample_proportional(tree, u, stratified, normalize)
    return index, w, rows[index]


def write_priorities(tree: PriorityTree, index: Tensor, priority: Tensor, n_valid: int,
                     valid: Tensor | None = None) -> None:
    """In-place priority write into ``tree`` (arguments as ``ext.update.write_priorities``; of ``tree.scratch``, when
    there is one, only ``last_writer`` is used, and left as found): sanitize against the running max (1 before any),
    reject slots outside ``[0, n_valid)`` to the trash slot ``tree.capacity`` with value 0, transform (the value 0
    where the optional bool mask ``valid`` is False; the raw priority is still stored), last write wins, recompute
    the touched blocks from their leaves, fold the counters.

    Example::

        >>> import torch
        >>> from lightning_per.ext.state import PriorityTree
        >>> leaves = torch.zeros(1, 4)
        >>> tree = PriorityTree(leaves, torch.zeros(1, dtype=torch.float64), torch.full((1,), float("inf")),
        ...                     raw=torch.zeros(4), max_raw=torch.tensor(float("-inf")),
        ...                     n_clamped=torch.tensor(0), n_dropped=torch.tensor(0), capacity=3)
        >>> write_priorities(tree, torch.tensor([1, 1, 7]), torch.tensor([5.0, 2.0, 9.0]), 3)
        >>> leaves.tolist(), int(tree.n_dropped)  # last write wins; slot 7 is outside [0, 3)
        ([[0.0, 2.0, 0.0, 0.0]], 1)
    """
    raw_store, leaves, block_sum, block_min = tree.raw, tree.leaves, tree.block_sum, tree.block_min
    max_raw, n_clamped, n_dropped, trash = tree.max_raw, tree.n_clamped, tree.n_dropped, tree.capacity
    alpha, eps = tree.alpha, tree.eps
    default = torch.nan_to_num(max_raw, nan=float("nan"), posinf=1.0, neginf=1.0)  # 1 before any write
    clean, n_bad = sanitize_priority(priority, default)  # [B] float32
    ok = (index >= 0) & (index < n_valid)  # [B]
    idx = index.where(ok, trash)  # [B]
    clean = clean.where(ok, 0.0)
    stored = transform_priority(clean, alpha, eps).where(ok, 0.0)  # [B]
    if valid is not None:
        stored = stored.where(valid[idx.clamp(max=valid.numel() - 1)], 0.0)
    scratch = tree.scratch
    if scratch is None:  # O(B log B), no persistent buffer
        last = last_write_wins(idx, torch.arange(idx.numel(), device=idx.device))  # [B]
    else:  # O(B) through the persistent (N,) int32 buffer, left at -1 as found (the compiled write's invariant)
        last = last_writer(idx, scratch.last_writer, torch.arange(idx.numel(), dtype=torch.int32, device=idx.device))
        scratch.last_writer.index_fill_(0, idx, -1)
    raw_store.index_put_((idx,), clean[last])
    leaves.view(-1).index_put_((idx,), stored[last])
    if idx.numel() * leaves.shape[1] >= leaves.numel():  # large batch (a fill): one O(N) pass is cheaper
        s, m = reduce_blocks(leaves)
        block_sum.copy_(s)
        block_min.copy_(m)
    else:
        blk = torch.div(idx, leaves.shape[1], rounding_mode="floor")  # [B]
        s, m = reduce_blocks(leaves.index_select(0, blk))  # [B], [B]; repeated blocks write equal values
        block_sum.index_put_((blk,), s)
        block_min.index_put_((blk,), m)
    torch.maximum(max_raw, clean.where(ok, float("-inf")).amax(), out=max_raw)
    n_clamped += n_bad
    n_dropped += idx.numel() - ok.sum()


def rank_sample(table: RankTable, u: Tensor, n: int, stratified: bool = True,
                normalize: str = "buffer") -> tuple[Tensor, Tensor]:
    """Rank-based draw (PER section 3.3) from i.i.d. uniforms ``u`` ``(B,)`` float64.

    ``k = searchsorted(cdf[:n], u' * cdf[n-1], right)`` (zero-based rank), ``index = order[k]``,
    ``w = ((k + 1) / n)^(alpha beta)`` in float64 (normalised by the batch max for ``"batch"``).

    Args:
        table: the :class:`~lightning_per.ext.state.RankTable`: ``cdf`` ``(N,)`` float64 prefix sums of
            ``k^-alpha``, ``order`` ``(N,)`` int64 slot of each rank, the exponents ``alpha`` and ``beta``.
        u: ``(B,)`` float64 uniforms; n: ranked items (host int, ``1 <= n <= N``).

    Returns:
        ``(index (B,) int64, w (B,) float32)``.
    """
    cdf = table.cdf[:n]
    k = inverse_cdf_search(cdf, _stratify(u, stratified) * cdf[-1])  # [B]
    weight = torch.pow((k + 1).to(torch.float64) / n, table.alpha * table.beta)
    if normalize == "batch":
        weight = weight / weight.max()
    return table.order[k], weight.to(torch.float32)


# ---------------------------------------------------------------------------------------------- storage ops


def gather_rows(src: Tensor, index: Tensor) -> Tensor:
    """The rows ``src[index]`` on ``index``'s device: a storage's batch read.

    Args:
        src: ``(R, *row)`` rows of a ring, on the device or on the host (a pinned-host ring).
        index: ``(B,) int64`` rows in ``[0, R)``, on the batch's device.

    Returns:
        ``(B, *row)``, ``src``'s dtype, on ``index``'s device (a host ring: host-side indexing, then one copy,
        ``non_blocking``; the compiled op reads pinned host memory in place).

    Example::

        >>> import torch
        >>> gather_rows(torch.arange(6).view(3, 2), torch.tensor([2, 0])).tolist()
        [[4, 5], [0, 1]]
    """
    return src[index.to(src.device)].to(index.device, non_blocking=True)  # [B, *row]


def scatter_rows(dst: Tensor, index: Tensor, src: Tensor) -> None:
    """``dst[index] = src``, in place: a storage's write. A repeated index gets one of its rows (give repeats
    equal rows).

    Args:
        dst: ``(R, *row)`` rows of a ring, on the device or on the host (a pinned-host ring).
        index: ``(B,) int64`` rows in ``[0, R)``, on the batch's device.
        src: ``(B, *row)`` rows of ``dst``'s dtype, on the batch's device.

    Example::

        >>> import torch
        >>> dst = torch.zeros(3, 2, dtype=torch.int64)
        >>> scatter_rows(dst, torch.tensor([2]), torch.tensor([[7, 8]]))
        >>> dst.tolist()
        [[0, 0], [0, 0], [7, 8]]
    """
    dst[index.to(dst.device)] = src.to(dst.device)


def gather_stacks(ring: Tensor, positions: Tensor, index: Tensor) -> Tensor:
    """The frames of transitions ``index``: ``ring[positions[index]]`` (a frame-deduplicated storage's read).

    Args:
        ring: ``(F + 1, *frame)`` the ring of frames (any dtype).
        positions: ``(N, K)`` int32/int64 ring positions of each transition's ``K`` frames.
        index: ``(B,) int64`` transitions in ``[0, N)``.

    Returns:
        ``(B, K, *frame)``, contiguous, on the ring's device.

    Example::

        >>> import torch
        >>> ring = torch.arange(4).view(4, 1)
        >>> gather_stacks(ring, torch.tensor([[0, 1], [2, 3]]), torch.tensor([1])).view(-1).tolist()
        [2, 3]
    """
    return ring[positions[index].to(torch.int64)]  # [B, K, *frame]
