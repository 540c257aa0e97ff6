"""Pieces shared by the replay kernels: interpreter detection, exact float64 scalar arguments,
``pow``, chunk sizes, and custom-op registration.

Triton types a Python ``float`` kernel argument as float32, which would round ``eps = 1e-8`` or
``beta = 0.4`` before the float64 arithmetic of :mod:`lightning_per.ops.reference`. Float64 scalars
therefore travel as their IEEE-754 bit pattern in an ``int64`` argument (:func:`f64_bits`) and are
rebuilt in the kernel (:func:`f64_from_bits`), exactly.
"""

from __future__ import annotations

import functools
import os
import struct
import weakref

import torch
import triton
import triton.language as tl
from torch import Tensor


def _interpret_requested() -> bool:
    try:
        return bool(triton.knobs.runtime.interpret)
    except AttributeError:  # triton < 3.4 has no knobs module
        return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


#: True when this package was imported with ``TRITON_INTERPRET=1``: ``@triton.jit`` then builds
#: interpreted functions that run on CPU tensors (NumPy), and the kernels accept CPU devices.
INTERPRET = _interpret_requested()

#: Largest number of elements one program holds in registers per pass (float64 scan of a chunk).
MAX_CHUNK = 4096

#: Largest block (leaves per row) and number of blocks the launchers accept: a draw scans one row
#: and all block sums, so both are bounded to keep one draw O(sqrt(N)) and int32 offsets safe.
MAX_BLOCK = 1 << 20
MAX_BLOCKS = 1 << 20

OPS_NAMESPACE = "lightning_per"

#: ``1 - 2^-40``: the reference scales every search total by it so that a target stays strictly below
#: the mass it searches (``reference.two_level_search_with_values``); exactly representable.
SHRINK = 1.0 - 2.0**-40


_F64 = struct.Struct("<d")
_I64 = struct.Struct("<q")


_BITS: dict[float, int] = {}


def f64_bits(value: float) -> int:
    """IEEE-754 bits of ``float(value)`` as a signed int64 (see :func:`f64_from_bits`).

    Remembered per value (launch arguments repeat: eps, 1/B, ...), except for zeros (``-0.0 == 0.0`` but
    their bits differ) and NaNs (never equal to themselves)."""
    value = float(value)
    bits = _BITS.get(value) if value else None
    if bits is None:
        bits = _I64.unpack(_F64.pack(value))[0]
        if value == value and value:
            if len(_BITS) >= 1024:
                _BITS.clear()
            _BITS[value] = bits
    return bits


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for host ints (``triton.cdiv`` is a constexpr function: a wrapper call per use)."""
    return -(-a // b)


@functools.lru_cache(maxsize=256)
def chunk_for(n: int, max_chunk: int = MAX_CHUNK) -> int:
    """Power-of-two elements per pass: ``max(16, next_pow2(n))`` capped at ``max_chunk`` (a power of
    two; tests pass a small one to exercise the multi-chunk paths)."""
    return max(1, min(max(16, 1 << (max(int(n), 1) - 1).bit_length()), int(max_chunk)))


def warps_for(chunk: int) -> int:
    """Warps per program that scans chunks of ``chunk`` float64 values: 4 for every chunk up to ``MAX_CHUNK``.

    4 warps beat 2, 8 and 16 for both the sample + gather and the write kernel at chunks of 1,024 and 4,096
    (``python -m benchmarks.tune_warps``; docs/kernels.md, "The sample kernel")."""
    return 4


def same_device(a: torch.device, b: torch.device) -> bool:
    """``a == b``, with an index-less CUDA device standing for the current one (``cuda`` == ``cuda:0``)."""
    if a == b:  # the common case (two torch.device objects), without building new ones
        return True
    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False
    if a.index == b.index:
        return True
    current = torch.cuda.current_device() if a.type == "cuda" else 0
    return (current if a.index is None else a.index) == (current if b.index is None else b.index)


def check_device(t: Tensor, name: str) -> None:
    """Raise ValueError unless ``t`` lives where these kernels run (CUDA, or CPU under the interpreter)."""
    if not (t.is_cuda or INTERPRET):
        raise ValueError(f"{name} must be a CUDA tensor (CPU tensors need TRITON_INTERPRET=1 at import), "
                         f"got device {t.device}")


def expect(t, name: str, dtype: torch.dtype | None = None, shape: tuple | None = None,
           ndim: int | None = None, device: torch.device | None = None) -> None:
    """Cheap check that ``t`` is a tensor of ``dtype``, ``shape`` (or ``ndim`` dimensions) on ``device``
    (each optional); on failure raise the specific TypeError/ValueError naming ``name``."""
    if (isinstance(t, Tensor) and (dtype is None or t.dtype == dtype) and (shape is None or t.shape == shape)
            and (ndim is None or t.dim() == ndim) and (device is None or same_device(t.device, device))):
        return
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    want_dim = len(shape) if shape is not None else ndim
    if want_dim is not None and t.dim() != want_dim:
        raise ValueError(f"{name} must be {want_dim}-D, got shape {tuple(t.shape)}")
    if shape is not None and t.shape != shape:
        if len(shape) == 1:
            raise ValueError(f"{name} must have {shape[0]} elements, got {t.numel()}")
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
    raise ValueError(f"{name} must be on {device}, got {t.device}")


_VALIDATED: dict[tuple[int, int], tuple[weakref.ref, ...]] = {}


def validated(tensors: tuple[Tensor, ...]) -> bool:
    """True if exactly these tensor objects passed :func:`remember_validated` last (weak references:
    a freed tensor whose id is reused does not match). Lets the hot path skip re-checking a sampler's
    persistent state tensors; never true while torch.compile traces."""
    if compiling():  # checked first: dynamo never traces id()
        return False
    refs = _VALIDATED.get((id(tensors[0]), len(tensors)))
    if refs is None:
        return False
    for ref, t in zip(refs, tensors):
        if ref() is not t:
            return False
    return True


def remember_validated(tensors: tuple[Tensor, ...]) -> None:
    if compiling():
        return
    if len(_VALIDATED) > 64:
        _VALIDATED.clear()
    _VALIDATED[(id(tensors[0]), len(tensors))] = tuple(weakref.ref(t) for t in tensors)


def scalar_arg(value: Tensor | float, name: str, device: torch.device) -> tuple[Tensor | None, float]:
    """Split a float-or-1-element-tensor exponent into ``(tensor or None, python value)`` for the ops.

    A tensor is read by the kernel on the device (graph-safe annealing); a float is baked in.
    """
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a number or a 1-element tensor, got shape {tuple(value.shape)}")
        if not same_device(value.device, device):
            raise ValueError(f"{name} must be on {device}, got {value.device}")
        return value, 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number or a tensor, got {type(value).__name__}")
    return None, float(value)


def register_op(name: str, mutates_args: tuple[str, ...] | str = (), fake=None):
    """Register ``fn`` as the opaque custom op ``lightning_per::name`` (``torch.library.custom_op``),
    tolerant of a second import.

    Opaque on purpose: ``torch.compile`` (and Inductor) treat the op as one call with the shapes given by
    ``fake`` (a function of the same arguments returning empty outputs: ``torch.empty`` of the right
    shape, dtype and device) instead of tracing into the Triton source, which Inductor's kernel-mutation
    analysis of torch 2.11 cannot follow for our int64-bit-pattern scalars. Inside a CUDA graph the op
    runs its kernels as in eager mode.
    """
    qualname = f"{OPS_NAMESPACE}::{name}"

    def decorate(fn):
        try:
            op = torch.library.custom_op(qualname, mutates_args=mutates_args)(fn)
        except RuntimeError as err:  # already registered by an earlier import of this package
            if "already" not in str(err).lower() and "duplicate" not in str(err).lower():
                raise
            return getattr(getattr(torch.ops, OPS_NAMESPACE), name)
        if fake is not None:
            op.register_fake(fake)
        return op

    return decorate


def compiling() -> bool:
    """True while torch.compile traces: calls then go through the registered custom op."""
    return torch.compiler.is_compiling()


@triton.jit
def f64_from_bits(bits):
    """The float64 whose IEEE-754 bits are ``bits`` (an int32/int64 kernel argument)."""
    return bits.to(tl.int64).to(tl.float64, bitcast=True)


@triton.jit
def exponent(ptr, bits, FROM_PTR: tl.constexpr):
    """A float64 exponent (alpha, beta) from a device scalar at ``ptr`` (``FROM_PTR``: graph-safe
    annealing) or from the IEEE-754 ``bits`` of a baked-in float (:func:`f64_bits`)."""
    if FROM_PTR:
        a = tl.load(ptr).to(tl.float64)
    else:
        a = f64_from_bits(bits)
    return a


if INTERPRET:
    @triton.jit
    def powf(x, y):
        """``x ** y`` (x >= 0) in the dtype of ``x``; interpreter: exp(y log x) in float64, with the
        IEEE special cases y == 0 -> 1 and x == 0 -> 0 (y > 0) or inf (y < 0)."""
        x64 = x.to(tl.float64)
        y64 = y.to(tl.float64)
        r = tl.exp(tl.log(tl.where(x64 > 0, x64, 1.0)) * y64)
        r = tl.where(x64 > 0, r, tl.where(y64 > 0, 0.0, float("inf")))
        return tl.where(y64 == 0, 1.0, r).to(x.dtype)
else:
    from triton.language.extra import libdevice

    @triton.jit
    def powf(x, y):
        """``x ** y`` (CUDA libdevice ``pow``/``powf``: the functions torch's CUDA ``pow`` calls);
        ``x`` and ``y`` of one dtype, float32 or float64."""
        return libdevice.pow(x, y)
