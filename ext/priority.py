"""Priority clean-up and transform: ``sanitize_priority`` and ``transform_priority`` as kernels, plus the
``@triton.jit`` helpers the fused update (:mod:`.update`) inlines.

Formulas (``reference.sanitize_priority`` / ``reference.transform_priority``), per element, float32 in:

* ``high = not (p < +inf)`` (NaN, +inf) -> ``max_priority``; otherwise ``max(p, 0)`` (-inf, negatives
  -> 0); counted: ``high or p < 0``.
* stored value ``float32((float64(p) + eps) ** alpha)``, ``eps`` and ``alpha`` in float64 (``alpha`` a
  float or a 0-d device tensor read by the kernel, so annealing stays graph-safe).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import (
    cdiv,
    check_device,
    compiling,
    expect,
    exponent,
    f64_bits,
    f64_from_bits,
    powf,
    register_op,
    scalar_arg,
)

__all__ = ["sanitize_priority", "transform_priority", "sanitize", "transform", "exponent"]

#: sanitize_priority runs in one program (it writes the count without atomics): largest batch it takes.
MAX_SANITIZE = 1 << 20


@triton.jit
def sanitize(p, default):
    """``(clean, bad)`` of float32 raw priorities ``p`` (module docstring); ``default`` float32 scalar."""
    high = ~(p < float("inf"))
    clean = tl.where(high, default, tl.maximum(p, 0.0))
    return clean, high | (p < 0)


@triton.jit
def transform(clean, alpha, eps):
    """``float32((float64(clean) + eps) ** alpha)``; ``alpha``, ``eps`` float64 scalars."""
    return powf(clean.to(tl.float64) + eps, alpha).to(tl.float32)


@triton.jit(do_not_specialize=["n"])
def _sanitize_kernel(p_ptr, maxp_ptr, clean_ptr, count_ptr, n, BLOCK: tl.constexpr):
    default = tl.load(maxp_ptr).to(tl.float32)
    count = tl.zeros([], tl.int64)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < n
        clean, bad = sanitize(tl.load(p_ptr + offs, mask=m, other=0.0).to(tl.float32), default)
        tl.store(clean_ptr + offs, clean, mask=m)
        count += tl.sum((bad & m).to(tl.int64), 0)
    tl.store(count_ptr, count)


@triton.jit(do_not_specialize=["n", "alpha_bits", "eps_bits"])
def _transform_kernel(c_ptr, out_ptr, alpha_ptr, alpha_bits, eps_bits, n,
                      ALPHA_FROM_PTR: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    alpha = exponent(alpha_ptr, alpha_bits, ALPHA_FROM_PTR)
    clean = tl.load(c_ptr + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, transform(clean, alpha, f64_from_bits(eps_bits)), mask=m)


def _launch_sanitize(priority: Tensor, max_priority: Tensor) -> tuple[Tensor, Tensor]:
    n = priority.numel()
    clean = torch.empty(n, dtype=torch.float32, device=priority.device)
    count = torch.empty((), dtype=torch.int64, device=priority.device)
    _sanitize_kernel[(1,)](priority.contiguous(), max_priority, clean, count, n,
                                        BLOCK=1024)
    return clean, count


@register_op("sanitize_priority", fake=lambda priority, max_priority: (
    torch.empty(priority.numel(), dtype=torch.float32, device=priority.device),
    torch.empty((), dtype=torch.int64, device=priority.device)))
def _sanitize_op(priority: Tensor, max_priority: Tensor) -> tuple[Tensor, Tensor]:
    return _launch_sanitize(priority, max_priority)


def _launch_transform(clean: Tensor, alpha: Tensor | None, alpha_value: float, eps: float) -> Tensor:
    n = clean.numel()
    out = torch.empty(n, dtype=torch.float32, device=clean.device)
    if n:
        _transform_kernel[(cdiv(n, 1024),)](
            clean.contiguous(), out, alpha if alpha is not None else out, f64_bits(alpha_value),
            f64_bits(eps), n, ALPHA_FROM_PTR=alpha is not None, BLOCK=1024)
    return out


@register_op("transform_priority", fake=lambda clean, alpha, alpha_value, eps: torch.empty(
    clean.numel(), dtype=torch.float32, device=clean.device))
def _transform_op(clean: Tensor, alpha: Tensor | None, alpha_value: float, eps: float) -> Tensor:
    return _launch_transform(clean, alpha, alpha_value, eps)


def sanitize_priority(priority: Tensor, max_priority: Tensor) -> tuple[Tensor, Tensor]:
    """Compiled ``reference.sanitize_priority`` (one launch, one program).

    Args:
        priority: ``(B,)`` float raw priorities (any float dtype; B <= ``MAX_SANITIZE``), CUDA.
        max_priority: 1-element float tensor on the same device, the running max raw priority.

    Returns:
        ``(clean, n_invalid)``: ``(B,)`` float32 and a 0-d int64 count of replaced values.
    """
    expect(priority, "priority", ndim=1)
    check_device(priority, "priority")
    if not priority.is_floating_point():
        raise TypeError(f"priority must be a float tensor, got {priority.dtype}")
    if priority.numel() > MAX_SANITIZE:
        raise ValueError(f"priority has {priority.numel()} elements; the kernel takes at most {MAX_SANITIZE}")
    if not isinstance(max_priority, Tensor) or max_priority.numel() != 1:
        raise ValueError("max_priority must be a 1-element tensor")
    expect(max_priority, "max_priority", device=priority.device)
    if compiling():
        return torch.ops.lightning_per.sanitize_priority(priority, max_priority)
    return _launch_sanitize(priority, max_priority)


def transform_priority(clean: Tensor, alpha: Tensor | float, eps: float) -> Tensor:
    """Compiled ``reference.transform_priority``: ``(B,)`` float32 ``(clean + eps)^alpha`` in float64.

    Args:
        clean: ``(B,)`` float32 non-negative raw priorities (any shape is flattened), CUDA.
        alpha: exponent, a float or a 1-element tensor on ``clean.device``.
        eps: small positive constant (applied in float64, exactly).
    """
    if not isinstance(clean, Tensor) or not clean.is_floating_point():
        raise TypeError("clean must be a float tensor")
    check_device(clean, "clean")
    alpha_t, alpha_v = scalar_arg(alpha, "alpha", clean.device)
    flat = clean.reshape(-1)
    if compiling():
        out = torch.ops.lightning_per.transform_priority(flat, alpha_t, alpha_v, float(eps))
    else:
        out = _launch_transform(flat, alpha_t, alpha_v, float(eps))
    return out.view(clean.shape)
