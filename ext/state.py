"""The explicit state the replay ops read and write, as values: :class:`PriorityTree` (a two-level priority array
with its counters, exponents, device RNG counters and the write's scratch) and :class:`RankTable` (a rank
sampler's sorted ranks). Plain torch: importing this module imports no Triton.

An op takes one of these values plus the call's own arguments (``write_priorities(tree, index, priority,
n_valid)``), reads the fields it needs and changes the tensors in place; the host fields (``eps``,
``capacity``) are plain numbers. The compiled kernels and the plain-torch reference
(``lightning_per.ops.reference``) take the same values.

Example::

    >>> import torch
    >>> from lightning_per.ext.state import PriorityTree, write_scratch
    >>> leaves = torch.zeros(2, 4)
    >>> tree = PriorityTree(leaves, torch.zeros(2, dtype=torch.float64), torch.full((2,), float("inf")),
    ...                     scratch=write_scratch(leaves))
    >>> tree.capacity, tree.scratch.tickets.shape, int(tree.scratch.last_writer[0])
    (0, torch.Size([3]), -1)
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["PriorityTree", "RankTable", "WriteScratch", "write_scratch"]


class WriteScratch(NamedTuple):
    """The compiled priority write's persistent tensors, every launch leaving them as it found them.

    Attributes:
        tickets: ``(n_blocks + 1,) int32``, zero: the one-launch kernel's counters (one per block, one global).
        last_writer: ``(n_blocks * block,) int32``, -1: the larger batches' last writer of each slot.
        flags: ``(n_blocks,) int32``, zero: the larger batches' touched blocks.
    """

    tickets: Tensor
    last_writer: Tensor
    flags: Tensor


def write_scratch(leaves: Tensor) -> WriteScratch:
    """A fresh :class:`WriteScratch` for ``leaves`` ``(n_blocks, block)`` on their device (4 bytes a slot).
    Make it with the leaves, outside any CUDA-graph capture (the fills must run, not only be recorded)."""
    nb, dev = leaves.shape[0], leaves.device
    return WriteScratch(tickets=torch.zeros(nb + 1, dtype=torch.int32, device=dev),
                        last_writer=torch.full((leaves.numel(),), -1, dtype=torch.int32, device=dev),
                        flags=torch.zeros(nb, dtype=torch.int32, device=dev))


class PriorityTree(NamedTuple):
    """A two-level priority array (Schaul et al. 2016, arXiv:1511.05952: stored value ``(p + eps)^alpha``) and
    what its ops read and write, all tensors on one device, changed in place.

    A draw reads ``leaves``, ``block_sum``, ``block_min``, ``beta`` (and ``rng`` when the kernels draw their own
    uniforms); a write reads and changes the others too. A tree that is only drawn from (a slice sampler's start
    mask) leaves the write's fields at their defaults.

    Attributes:
        leaves: ``(n_blocks, block) float32`` stored values; 0 for unwritten slots.
        block_sum: ``(n_blocks,) float64`` sum of each block's leaves (recomputed from them: no drift).
        block_min: ``(n_blocks,) float32`` min of each block's positive leaves (inf for an empty block).
        raw: ``(n_blocks * block,) float32`` raw clean priorities (a write's).
        max_raw: ``() float32`` running max raw priority (-inf before any write).
        n_clamped, n_dropped: ``() int64`` priorities clamped (NaN, +/-inf, negative) and slots rejected.
        alpha: priority exponent, a float or a ``()`` float tensor on the device.
        beta: IS-weight exponent, a float or a ``()`` float tensor on the device.
        eps: added to raw priorities before the exponent (host float).
        capacity: slots N (host int); slot N is the trash slot, always 0, where rejected writes go.
        rng: ``(1 + 65536,) int64`` the kernels' Philox seed and counters, or None.
        scratch: the compiled write's :class:`WriteScratch`, or None (the reference needs none).
    """

    leaves: Tensor
    block_sum: Tensor
    block_min: Tensor
    raw: Tensor | None = None
    max_raw: Tensor | None = None
    n_clamped: Tensor | None = None
    n_dropped: Tensor | None = None
    alpha: Tensor | float = 1.0
    beta: Tensor | float = 0.0
    eps: float = 0.0
    capacity: int = 0
    rng: Tensor | None = None
    scratch: WriteScratch | None = None


class RankTable(NamedTuple):
    """A rank sampler's sorted ranks (PER section 3.3: ``P(k) ∝ k^-alpha`` for rank ``k``), on one device.

    Attributes:
        cdf: ``(N,) float64`` prefix sums of ``k^-alpha``, ``k = 1..N``.
        order: ``(N,) int64`` the slot of each rank (highest priority first).
        alpha: rank exponent, a float or a ``()`` float tensor on the device.
        beta: IS-weight exponent, a float or a ``()`` float tensor on the device.
    """

    cdf: Tensor
    order: Tensor
    alpha: Tensor | float
    beta: Tensor | float
