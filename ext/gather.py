"""Compiled batch gathers for replay storages: stacked frames by two-level indexing, and rows of a ring in
page-locked host memory read by the GPU.

* :func:`gather_stacks` - ``ring[positions[index]]`` in one launch: each program reads its transition's
  frame position and copies a chunk of that frame (the frame-deduplicated storage's batch read).
* :func:`gather_rows` - ``src[index]`` in one launch, where ``src`` may be a pinned host tensor: under
  unified virtual addressing a page-locked allocation has one address for host and device, so the kernel
  reads it over the bus with no staging copy and no host synchronisation (the pinned-host storage);
  :func:`scatter_rows` writes transitions into it the same way.

All copy whole 8-, 4- or 1-byte words (the widest that divides a row), are the twins of the plain-torch
``gather_rows``, ``scatter_rows`` and ``gather_stacks`` of :mod:`lightning_per.ops.reference` (the backend's
self-check compares them), are ``torch.library`` custom ops under ``torch.compile`` and capturable in CUDA graphs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import INTERPRET, cdiv, check_device, chunk_for, compiling, register_op, remember_validated, validated

__all__ = ["gather_stacks", "gather_rows", "scatter_rows"]

#: Most words a program copies (one chunk of a row); shorter rows get one power-of-two chunk of their size.
BLOCK = 1024


@triton.jit
def _gather_kernel(src_ptr, pos_ptr, index_ptr, out_ptr, k, words, pos_stride,
                   TWO_LEVEL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)  # output row: (b, j) of the (B, K) rows
    chunk = tl.program_id(1)
    b = row // k
    j = row - b * k
    slot = tl.load(index_ptr + b).to(tl.int64)
    if TWO_LEVEL:
        src_row = tl.load(pos_ptr + slot * pos_stride + j).to(tl.int64)
    else:
        src_row = slot
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < words
    values = tl.load(src_ptr + src_row * words + offs, mask=mask)
    tl.store(out_ptr + row.to(tl.int64) * words + offs, values, mask=mask)


def _words(t: Tensor) -> Tensor:
    """``t`` ``(R, ...)`` contiguous as ``(R, words)`` of the widest int dtype dividing a row's bytes."""
    flat = t.view(t.shape[0], -1).view(torch.uint8)
    nbytes = flat.shape[1]
    for dtype, size in ((torch.int64, 8), (torch.int32, 4)):
        if nbytes % size == 0:
            return flat.view(dtype)
    return flat


def _launch(src: Tensor, positions: Tensor | None, index: Tensor, k: int, out: Tensor) -> Tensor:
    words_src = _words(src)
    words_out = out.view(out.shape[0] * k if positions is not None else out.shape[0], -1).view(torch.uint8)
    words_out = words_out.view(words_src.dtype)
    rows, words = words_out.shape
    if rows and words:
        pos = positions if positions is not None else index
        block = chunk_for(words, BLOCK)
        _gather_kernel[(rows, cdiv(words, block))](
            words_src, pos, index, words_out, k, words, pos.stride(0),
            TWO_LEVEL=positions is not None, BLOCK=block)
    return out


def _new_stacks(ring: Tensor, positions: Tensor, index: Tensor) -> Tensor:
    return torch.empty((index.shape[0], positions.shape[1], *ring.shape[1:]), dtype=ring.dtype, device=ring.device)


def _new_rows(src: Tensor, index: Tensor) -> Tensor:
    return torch.empty((index.shape[0], *src.shape[1:]), dtype=src.dtype, device=index.device)


@register_op("gather_stacks", fake=_new_stacks)
def _stacks_op(ring: Tensor, positions: Tensor, index: Tensor) -> Tensor:
    return _launch(ring, positions, index, positions.shape[1], _new_stacks(ring, positions, index))


@register_op("gather_rows", fake=lambda src, index: _new_rows(src, index))
def _rows_op(src: Tensor, index: Tensor) -> Tensor:
    return _launch(src, None, index, 1, _new_rows(src, index))


@register_op("scatter_rows", mutates_args=("dst",))
def _scatter_op(dst: Tensor, index: Tensor, src: Tensor) -> None:
    _launch_scatter(dst, index, src)


@triton.jit
def _scatter_kernel(dst_ptr, index_ptr, src_ptr, words, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    slot = tl.load(index_ptr + row).to(tl.int64)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < words
    values = tl.load(src_ptr + row.to(tl.int64) * words + offs, mask=mask)
    tl.store(dst_ptr + slot * words + offs, values, mask=mask)


def _launch_scatter(dst: Tensor, index: Tensor, src: Tensor) -> None:
    words_dst, words_src = _words(dst), _words(src)
    if words_src.dtype != words_dst.dtype:
        words_src = src.reshape(src.shape[0], -1).view(torch.uint8).view(words_dst.dtype)
    rows, words = words_src.shape
    if rows and words:
        block = chunk_for(words, BLOCK)
        _scatter_kernel[(rows, cdiv(words, block))](words_dst, index, words_src, words, BLOCK=block)


def _check(name: str, t: Tensor, ndim: int | None = None) -> None:
    if not isinstance(t, Tensor) or not t.is_contiguous() or (ndim is not None and t.dim() != ndim):
        raise ValueError(f"{name} must be a contiguous {ndim or 'N'}-D tensor, got "
                         f"{getattr(t, 'shape', type(t).__name__)}")


def gather_stacks(ring: Tensor, positions: Tensor, index: Tensor) -> Tensor:
    """Compiled ``ops.reference.gather_stacks``: ``(B, K, *frame)`` = ``ring[positions[index]]`` in one launch.

    Args:
        ring: ``(F + 1, *frame)`` contiguous frames (any dtype) on the device.
        positions: ``(N, K)`` int32/int64 ring positions, rows contiguous, on the device.
        index: ``(B,)`` int64 transitions in ``[0, N)``, on the device.

    Raises:
        ValueError: a tensor of another rank, not contiguous, or off the kernels' device.
    """
    _check("ring", ring)
    _check("positions", positions, 2)
    _check("index", index, 1)
    for name, t in (("ring", ring), ("positions", positions), ("index", index)):
        check_device(t, name)
    if compiling():
        return torch.ops.lightning_per.gather_stacks(ring, positions, index)
    return _launch(ring, positions, index, positions.shape[1], _new_stacks(ring, positions, index))


def _check_host(name: str, t: Tensor) -> None:
    """Raise unless ``t`` is on the device or page-locked (a host ring checked once: the same tensor object
    passes again without the driver query, see ``_common.validated``)."""
    if t.is_cuda or INTERPRET or validated((t,)):
        return
    if t.is_pinned():
        remember_validated((t,))
        return
    raise ValueError(f"{name} must be on the GPU or in pinned host memory (pin_memory=True), got pageable host "
                     f"memory")


def gather_rows(src: Tensor, index: Tensor) -> Tensor:
    """``src[index]`` ``(B, *row)`` on ``index``'s device, read by one kernel straight from ``src``.

    ``src`` may live in page-locked host memory (``pin_memory=True``): the GPU reads it through its
    unified address (zero-copy), so a batch needs no staging copy and no host synchronisation.

    Args:
        src: ``(R, *row)`` contiguous, on the device or pinned on the host (CPU under the interpreter).
        index: ``(B,)`` int64 rows in ``[0, R)``, on the device.

    Raises:
        ValueError: ``src`` is neither on the device nor pinned; a tensor of another rank or not contiguous.
    """
    _check("src", src)
    _check("index", index, 1)
    check_device(index, "index")
    _check_host("src", src)
    if compiling():
        return torch.ops.lightning_per.gather_rows(src, index)
    return _launch(src, None, index, 1, _new_rows(src, index))


def scatter_rows(dst: Tensor, index: Tensor, src: Tensor) -> None:
    """``dst[index] = src`` by one kernel writing straight into ``dst`` (zero-copy when ``dst`` is pinned host
    memory); no host synchronisation. A repeated index gets one of its rows (give repeats equal rows).

    Args:
        dst: ``(R, *row)`` contiguous, on the device or pinned on the host.
        index: ``(B,)`` int64 rows in ``[0, R)``, on the device.
        src: ``(B, *row)`` contiguous, same dtype and row shape as ``dst``, on the device.

    Raises:
        ValueError: ``dst`` is neither on the device nor pinned; shapes or dtypes that do not match.
    """
    _check("dst", dst)
    _check("index", index, 1)
    _check("src", src)
    check_device(index, "index")
    check_device(src, "src")
    _check_host("dst", dst)
    if src.dtype != dst.dtype or src.shape[1:] != dst.shape[1:] or src.shape[0] != index.shape[0]:
        raise ValueError(f"src must be ({index.shape[0]}, *{tuple(dst.shape[1:])}) {dst.dtype}, got "
                         f"{tuple(src.shape)} {src.dtype}")
    if compiling():
        torch.ops.lightning_per.scatter_rows(dst, index, src)
        return
    _launch_scatter(dst, index, src)
