"""The proportional replay core: an explicit :class:`PriorityState` and the functions that read and write it.

Proportional PER (Schaul et al. 2016, arXiv:1511.05952, section 3.3): ``P(i) = p_i^a / sum_k p_k^a`` with stored
value ``(p_i + eps)^alpha`` (TorchRL's convention) and IS weights ``w_i = (P(i) / min_j P(j))^-beta`` (section
3.4). The stored values live in a two-level flat array (see :mod:`lightning_per.ops.reference`): ``(n_blocks,
block)`` leaves with float64 block sums and float32 block minima, recomputed from the leaves of every touched
block (no float drift). Slot ``N`` (= ``capacity``) is the trash slot: always 0, where rejected writes go.

Every function takes the backend ``ops`` (chosen once by the sampler, :func:`lightning_per.ops.select_backend`)
and the state, and changes the state's tensors *in place*: captured CUDA graphs keep pointing at them. None
synchronises with the host. :class:`~lightning_per.replay.GPUPrioritizedSampler` is the TorchRL adapter that
holds one state and does the bookkeeping around these calls.

Example::

    >>> import torch
    >>> from lightning_per.ops import reference
    >>> from lightning_per.replay.priority import PriorityState, probabilities, sample, write
    >>> state = PriorityState.empty(4, block=4, alpha=1.0, beta=1.0, eps=1e-8, device=torch.device("cpu"))
    >>> write(reference, state, torch.arange(4), torch.tensor([1.0, 1.0, 1.0, 3.0]), 4)
    >>> probabilities(state)[:4].tolist()
    [0.16666666..., 0.16666666..., 0.16666666..., 0.5]
    >>> index, weight = sample(reference, state, torch.tensor([0.1, 0.9], dtype=torch.float64), False, "buffer")
    >>> index.tolist(), weight.tolist()
    ([0, 3], [1.0, 0.33333...])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_per.ext.state import PriorityTree, WriteScratch, write_scratch
from lightning_per.replay.errors import FLOAT32_MAX, stored_fits

__all__ = ["PriorityState", "bounded", "default_priority", "mask", "max_within_buffer", "probabilities",
           "raw_limit", "rebuild", "sample", "sample_gather", "write"]


@dataclass(eq=False)
class PriorityState:
    """The device state of a proportional sampler (all tensors on one device, changed in place).

    Attributes:
        raw: ``(n_blocks * block,) float32`` raw clean priorities (as given, sanitized).
        leaves: ``(n_blocks, block) float32`` stored values ``(p + eps)^alpha``; 0 for unwritten slots.
        block_sum: ``(n_blocks,) float64`` sum of each block's leaves.
        block_min: ``(n_blocks,) float32`` min of each block's positive leaves (inf for an empty block).
        max_raw: ``() float32`` running max raw priority (-inf before any write).
        n_clamped: ``() int64`` priorities clamped (NaN, +/-inf, negative, or overflowing ``(p + eps)^alpha``).
        n_dropped: ``() int64`` device-side indices outside the valid slots, ignored.
        alpha: ``() float32`` the priority exponent (a device copy of the host value).
        beta: ``() float32`` the IS-weight exponent (a device copy: captured graphs see new values).
        rng: ``(1 + 65536,) int64`` the compiled draws' seed and counters, or None (draws from ``torch.rand``).
        scratch: the write's persistent tensors (:class:`lightning_per.ext.state.WriteScratch`, made with the
            leaves): the compiled write's, or a serial CPU sampler's (the reference write finds each slot's last
            writer through its ``last_writer`` in O(B)); or None (the reference write sorts instead).
        capacity: number of slots N (host int).
        eps: added to raw priorities before the exponent (host float > 0).
        raw_limit: largest raw priority whose stored value is finite under ``alpha`` (host float, :func:`raw_limit`).
        writes: priority writes made through the sampler (host int; what a rank index counts to know when to
            re-sort; cached CUDA graphs replay writes without Python, so the adapter counts them, not :func:`write`).
    """

    raw: Tensor
    leaves: Tensor
    block_sum: Tensor
    block_min: Tensor
    max_raw: Tensor
    n_clamped: Tensor
    n_dropped: Tensor
    alpha: Tensor
    beta: Tensor
    rng: Tensor | None
    capacity: int
    eps: float
    raw_limit: float
    writes: int = 0
    scratch: WriteScratch | None = None

    @classmethod
    def empty(cls, capacity: int, *, block: int, alpha: float, beta: float | Tensor, eps: float,
              device: torch.device, rng: Tensor | None = None, scratch: bool = False) -> PriorityState:
        """A state with no priority written: ``ceil((capacity + 1) / block)`` blocks of ``block`` leaves (slot
        ``capacity`` is the trash slot). ``beta`` may be a 0-d tensor (copied, no sync); ``scratch``: make the
        compiled write's scratch with the leaves (:func:`lightning_per.ext.state.write_scratch`)."""
        nb = -(-(capacity + 1) // block)
        beta_t = torch.zeros((), dtype=torch.float32, device=device)
        beta_t.copy_(torch.as_tensor(beta))  # a number or a 0-d tensor (no sync)
        leaves = torch.zeros(nb, block, dtype=torch.float32, device=device)
        return cls(raw=torch.zeros(nb * block, dtype=torch.float32, device=device), leaves=leaves,
                   block_sum=torch.zeros(nb, dtype=torch.float64, device=device),
                   block_min=torch.full((nb,), float("inf"), dtype=torch.float32, device=device),
                   max_raw=torch.full((), float("-inf"), dtype=torch.float32, device=device),
                   n_clamped=torch.zeros((), dtype=torch.int64, device=device),
                   n_dropped=torch.zeros((), dtype=torch.int64, device=device),
                   alpha=torch.full((), float(alpha), dtype=torch.float32, device=device), beta=beta_t, rng=rng,
                   capacity=capacity, eps=float(eps), raw_limit=raw_limit(float(alpha), float(eps)),
                   scratch=write_scratch(leaves) if scratch else None)

    def tree(self) -> PriorityTree:
        """The state as the ops take it (:class:`lightning_per.ext.state.PriorityTree`): the same tensors, no copy."""
        return PriorityTree(self.leaves, self.block_sum, self.block_min, self.raw, self.max_raw, self.n_clamped,
                            self.n_dropped, self.alpha, self.beta, self.eps, self.capacity, self.rng, self.scratch)

    def tensors(self) -> tuple[Tensor, ...]:
        """Every device tensor of the state, in a fixed order: ``raw, leaves, block_sum, block_min, max_raw,
        n_clamped, n_dropped, alpha, beta`` and ``rng`` when there is one. What a CUDA graph recording a call on
        this state names as its state, and what a snapshot around work that must leave no trace copies."""
        base = (self.raw, self.leaves, self.block_sum, self.block_min, self.max_raw, self.n_clamped,
                self.n_dropped, self.alpha, self.beta)
        return base if self.rng is None else (*base, self.rng)

    def written(self) -> Tensor:
        """``(n_blocks * block,) bool``: the slots holding a stored value (> 0 since eps > 0)."""
        return self.leaves.view(-1) > 0


def raw_limit(alpha: float, eps: float) -> float:
    """The largest float32 raw priority ``p`` whose stored value ``(p + eps)^alpha``, computed as the ops compute it,
    stays finite (:func:`lightning_per.replay.errors.stored_fits`): ``FLOAT32_MAX`` when that one fits (any alpha
    below 1 with an ``eps`` below float32's max; alpha 1 with a small ``eps``), else found by bisection over the
    float32 bit patterns (31 host steps; about ``FLOAT32_MAX**(1/alpha) - eps``). At least 1 for every ``eps`` the
    samplers accept (:func:`~lightning_per.replay.errors.check_eps`); 0 when not even ``p = 0`` fits. Host
    arithmetic at construction and when alpha changes."""
    if stored_fits(FLOAT32_MAX, alpha, eps):
        return FLOAT32_MAX
    lo, hi = 0, _F32_MAX_BITS  # bit patterns of non-negative float32s order as their values
    if not stored_fits(0.0, alpha, eps):
        return 0.0
    while hi - lo > 1:  # stored_fits(bits lo) and not stored_fits(bits hi)
        mid = (lo + hi) // 2
        if stored_fits(_f32_of_bits(mid), alpha, eps):
            lo = mid
        else:
            hi = mid
    return _f32_of_bits(lo)


#: The bit pattern of the largest float32.
_F32_MAX_BITS = int(torch.tensor(FLOAT32_MAX, dtype=torch.float32).view(torch.int32))  # host tensor


def _f32_of_bits(bits: int) -> float:
    """The non-negative float32 of bit pattern ``bits``."""
    return float(torch.tensor(bits, dtype=torch.int32).view(torch.float32))  # host tensor


def default_priority(max_raw: Tensor) -> Tensor:
    """The raw priority new items get: ``max_raw``, or 1.0 where it is +/-inf (no priority written yet); NaN stays
    NaN. Any shape (e.g. ``max_raw.expand(n)``), one op: a fresh tensor on ``max_raw``'s device."""
    return torch.nan_to_num(max_raw, nan=float("nan"), posinf=1.0, neginf=1.0)


def rebuild(ops, state: PriorityState) -> None:
    """Recompute every stored value and block reduction from the raw priorities (O(N), in place), e.g. after
    ``alpha`` changed (raw priorities above the new :attr:`PriorityState.raw_limit` are lowered to it first)."""
    written = state.written()
    if state.raw_limit < FLOAT32_MAX:  # a larger alpha: raw priorities above its limit would overflow
        state.raw.clamp_(max=state.raw_limit)
        state.max_raw.clamp_(max=state.raw_limit)
    stored = ops.transform_priority(state.raw, state.alpha, state.eps)
    state.leaves.view(-1).copy_(torch.where(written, stored, torch.zeros_like(stored)))
    reduce(ops, state)


def reduce(ops, state: PriorityState) -> None:
    """Recompute the block sums and minima from the leaves (O(N), in place)."""
    s, m = ops.reduce_blocks(state.leaves)
    state.block_sum.copy_(s)  # in place: captured CUDA graphs keep pointing at these tensors
    state.block_min.copy_(m)


def bounded(state: PriorityState, raw: Tensor) -> Tensor:
    """``raw`` with every finite value above :attr:`PriorityState.raw_limit` lowered to it, counted in
    ``n_clamped`` (device ops, no sync); ``raw`` itself while that limit is ``FLOAT32_MAX`` (nothing can overflow:
    alpha < 1, or alpha 1 with a small eps). NaN, +/-inf and
    negatives pass unchanged to the write's own sanitizing rule."""
    limit = state.raw_limit
    if limit >= FLOAT32_MAX:
        return raw
    over = (raw > limit) & (raw < float("inf"))
    state.n_clamped.add_(over.sum())
    return torch.where(over, torch.full((), limit, dtype=raw.dtype, device=raw.device), raw)


def write(ops, state: PriorityState, index: Tensor, raw: Tensor, n_valid: int, valid: Tensor | None = None) -> None:
    """Store raw priorities ``raw`` ``(B,)`` at slots ``index`` ``(B,)`` (both on the state's device), in place.

    One whole-step op (:func:`lightning_per.ops.reference.write_priorities` or its fused kernel): sanitize,
    send slots outside ``[0, n_valid)`` to the trash slot (counted in ``n_dropped``), ``(p + eps)^alpha`` (0 where
    the optional ``(>= capacity,)`` bool mask ``valid`` is False, the raw priority kept), the value given *last*
    wins for a repeated slot, touched block sums/minima recomputed from their leaves, counters and the running
    max folded in.
    """
    ops.write_priorities(state.tree(), index, bounded(state, raw), n_valid, valid)


def max_within_buffer(state: PriorityState) -> None:
    """Make ``max_raw`` the max raw priority over the slots holding data now (TorchRL's
    ``max_priority_within_buffer``), not the running max of every priority written; O(N), in place."""
    cap = state.capacity
    written = state.leaves.view(-1)[:cap] > 0
    state.max_raw.copy_(torch.where(written, state.raw[:cap], float("-inf")).amax())


def mask(ops, state: PriorityState, valid: Tensor) -> None:
    """Zero the stored value of every slot where ``valid`` ``(capacity,) bool`` is False and recompute the block
    reductions (O(N), in place)."""
    state.leaves.view(-1)[:state.capacity].mul_(valid)
    reduce(ops, state)


def sample(ops, state: PriorityState, draws: Tensor | int, stratified: bool,
           weight_normalization: str) -> tuple[Tensor, Tensor]:
    """Draw slots with probability P(i) and their IS weights: ``(index (B,) int64, weight (B,) float32)``.

    ``draws``: ``(B,) float64`` uniforms in [0, 1) (stratified in stratum order by the op when ``stratified``), or
    the int ``B``: the compiled kernels draw the uniforms themselves from :attr:`PriorityState.rng`.
    ``weight_normalization``: ``"buffer"`` (by ``min_j P(j)``) or ``"batch"`` (by the batch max).
    """
    return ops.sample_proportional(state.tree(), draws, stratified, weight_normalization)


def sample_gather(ops, state: PriorityState, draws: Tensor | int, rows: Tensor, stratified: bool,
                  weight_normalization: str) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`sample` and the rows of the drawn slots in one fused op: ``(block (B, W) int64, index (B,) int64,
    weight (B,) float32)``, ``rows`` the ring's packed ``(N, W) int64`` rows
    (the storage's ``gather_rows``) on the state's device."""
    index, weight, block = ops.sample_proportional_gather(state.tree(), draws, rows, stratified,
                                                          weight_normalization)  # [B], [B], [B, W]
    return block, index, weight


def probabilities(state: PriorityState) -> Tensor:
    """Exact P(i) of every slot, ``(capacity,)`` float64 on the state's device."""
    leaves = state.leaves.view(-1)[: state.capacity].to(torch.float64)
    return leaves / state.block_sum.sum()
