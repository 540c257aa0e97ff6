"""Block reductions and the last-writer rule as kernels: ``reduce_blocks``, ``last_write_wins``,
``last_writer`` (compiled versions of the reference ops of the same names), plus the ``@triton.jit``
row reduction the fused update (:mod:`.update`) shares.

* ``reduce_blocks``: one program per row; ``sum`` = the float64 sum (a tree reduction per chunk of at most
  ``MAX_CHUNK``, chunk sums added in order: the reference's scan total up to rounding), ``min`` = minimum of
  the non-zero leaves (``+inf`` if none).
* ``last_write_wins``: ``out[k] = values[max{j : index[j] == index[k]}]`` by O(B^2) comparisons spread
  over ``ceil(B / 64)`` programs, for ``B <= MAX_QUADRATIC``; larger batches use the plain-torch
  O(B log B) sort (``last_write_wins``) or O(B) scatter-amax (``last_writer``) of :mod:`.torch_paths`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import MAX_CHUNK, cdiv, check_device, chunk_for, compiling, expect, register_op, warps_for
from .torch_paths import scatter_last_writer, sorted_last_write_wins

__all__ = ["reduce_blocks", "last_write_wins", "last_writer", "row_stats", "MAX_QUADRATIC", "BB"]

#: Largest batch resolved by pairwise comparisons (one launch); larger ones take an O(B) path.
MAX_QUADRATIC = 4096
#: Entries per program of the pairwise comparisons.
BB = 64


@triton.jit
def row_stats(row_ptr, block, CHUNK: tl.constexpr):
    """``(float64 sum, float32 min of non-zero)`` of the ``block`` float32 leaves at ``row_ptr``: two
    independent reductions per chunk of at most ``CHUNK`` (no scan), chunk sums added in order."""
    total = tl.zeros([], tl.float64)
    low = tl.full([], float("inf"), tl.float32)
    for start in range(0, block, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        x = tl.load(row_ptr + offs, mask=offs < block, other=0.0)
        total += tl.sum(x.to(tl.float64), 0)
        low = tl.minimum(low, tl.min(tl.where(x != 0, x, float("inf")), 0))
    return total, low


@triton.jit(do_not_specialize=["block"])
def _reduce_rows_kernel(rows_ptr, sum_ptr, min_ptr, block, CHUNK: tl.constexpr):
    k = tl.program_id(0)
    s, low = row_stats(rows_ptr + k.to(tl.int64) * block, block, CHUNK)
    tl.store(sum_ptr + k, s)
    tl.store(min_ptr + k, low)


@triton.jit(do_not_specialize=["n"])
def _last_writer_kernel(index_ptr, values_ptr, out_ptr, n, BB: tl.constexpr):
    offs = tl.program_id(0) * BB + tl.arange(0, BB)
    m = offs < n
    idx = tl.load(index_ptr + offs, mask=m, other=0)
    last = offs
    for start in range(tl.program_id(0) * BB, n, BB):  # earlier entries cannot be later writers
        jo = start + tl.arange(0, BB)
        jidx = tl.load(index_ptr + jo, mask=jo < n, other=0)
        same = (idx[:, None] == jidx[None, :]) & (jo < n)[None, :]
        last = tl.maximum(last, tl.max(tl.where(same, jo[None, :], -1), 1))
    tl.store(out_ptr + offs, tl.load(values_ptr + last, mask=m).to(out_ptr.dtype.element_ty), mask=m)


def _launch_reduce(rows: Tensor, max_chunk: int = MAX_CHUNK) -> tuple[Tensor, Tensor]:
    k, block = rows.shape
    total = torch.empty(k, dtype=torch.float64, device=rows.device)
    low = torch.empty(k, dtype=torch.float32, device=rows.device)
    if k:
        chunk = chunk_for(block, max_chunk)
        _reduce_rows_kernel[(k,)](rows.contiguous(), total, low, block, CHUNK=chunk,
                                               num_warps=warps_for(chunk))
    return total, low


@register_op("reduce_blocks", fake=lambda rows: (
    torch.empty(rows.shape[0], dtype=torch.float64, device=rows.device),
    torch.empty(rows.shape[0], dtype=torch.float32, device=rows.device)))
def _reduce_op(rows: Tensor) -> tuple[Tensor, Tensor]:
    return _launch_reduce(rows)


def _launch_last(index: Tensor, values: Tensor, out_dtype: torch.dtype | None = None) -> Tensor:
    n = index.numel()
    out = torch.empty(n, dtype=out_dtype or values.dtype, device=values.device)
    if n:
        _last_writer_kernel[(cdiv(n, BB),)](
            index.contiguous(), values.contiguous(), out, n, BB=BB)
    return out


@register_op("last_write_wins", fake=lambda index, values: torch.empty(index.numel(), dtype=values.dtype,
                                                                      device=values.device))
def _last_op(index: Tensor, values: Tensor) -> Tensor:
    return _launch_last(index, values)


def reduce_blocks(rows: Tensor) -> tuple[Tensor, Tensor]:
    """Compiled ``reference.reduce_blocks``: for ``rows`` ``(K, block)`` float32, ``(K,)`` float64 totals
    and ``(K,)`` float32 minima of the non-zero entries (``+inf`` if none); one launch, contiguous out."""
    if not isinstance(rows, Tensor) or rows.dim() != 2 or rows.dtype != torch.float32:
        raise ValueError(f"rows must be a (K, block) float32 tensor, got {getattr(rows, 'shape', None)}")
    check_device(rows, "rows")
    if compiling():
        return torch.ops.lightning_per.reduce_blocks(rows)
    return _launch_reduce(rows)


def last_write_wins(index: Tensor, values: Tensor) -> Tensor:
    """Compiled ``reference.last_write_wins``: ``(B,)`` ``values[max{j : index[j] == index[k]}]``
    (one launch for ``B <= MAX_QUADRATIC``, a plain-torch sort above)."""
    expect(index, "index", ndim=1)
    check_device(index, "index")
    expect(values, "values", shape=index.shape, device=index.device)
    if index.numel() > MAX_QUADRATIC:
        return sorted_last_write_wins(index, values)
    if compiling():
        return torch.ops.lightning_per.last_write_wins(index, values)
    return _launch_last(index, values)


def last_writer(index: Tensor, scratch: Tensor, positions: Tensor) -> Tensor:
    """Compiled ``reference.last_writer``: ``(B,)`` int64 ``positions[max{j : index[j] == index[k]}]``.

    One launch for ``B <= MAX_QUADRATIC`` (``scratch`` untouched); a plain-torch scatter-amax into
    ``scratch`` above.
    """
    expect(index, "index", ndim=1)
    check_device(index, "index")
    expect(positions, "positions", shape=index.shape, device=index.device)
    if index.numel() > MAX_QUADRATIC:
        return scatter_last_writer(index, scratch, positions)
    if compiling():
        return torch.ops.lightning_per.last_write_wins(index, positions).to(torch.int64)
    return _launch_last(index, positions, torch.int64)
