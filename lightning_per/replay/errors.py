"""Input checks shared by the samplers: clear errors naming the argument, raised before any change.

Only host-visible properties are checked here (types, shapes, and the values of *host* tensors);
reading the values of a device tensor would synchronise, so the samplers neutralise and count bad
device-side values instead (documented on each method).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real

import torch
from torch import Tensor

__all__ = ["MAX_CAPACITY", "EmptyBufferError", "check_batch_size", "check_bool", "check_capacity", "check_draw",
           "check_eps", "check_exponent", "check_generator", "check_index", "check_index_priority", "check_key",
           "check_reduction", "check_seed", "eps_limit", "stored_fits"]

#: Largest finite float32: no stored priority ``(p + eps)^alpha`` exceeds it (see ``GPUPrioritizedSampler``).
FLOAT32_MAX = float(torch.finfo(torch.float32).max)
#: Smallest positive normal float32: every stored priority is at least this (``eps^alpha`` must not underflow).
FLOAT32_TINY = float(torch.finfo(torch.float32).tiny)


class EmptyBufferError(ValueError, RuntimeError):
    """Sampling from a buffer that holds no transition (a ValueError; also a RuntimeError, which is
    what TorchRL's own samplers raise, so existing handlers keep working).

    Example::

        >>> from lightning_per.replay import make_replay_buffer
        >>> try:
        ...     make_replay_buffer(4, 2, device="cpu").sample()
        ... except RuntimeError as err:
        ...     print(type(err).__name__, isinstance(err, ValueError))
        EmptyBufferError True
    """


def check_batch_size(batch_size: int) -> None:
    """Raise ValueError unless ``batch_size`` is an int >= 1."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")


def stored_fits(p: float, alpha: float, eps: float) -> bool:
    """Whether the stored value of the raw priority ``p`` is at most ``FLOAT32_MAX``, computed as the ops compute
    it: ``(float64(float32(p)) + eps) ** float32(alpha)`` in float64 (the samplers hold alpha in a float32 device
    scalar), then rounded to float32, which keeps such a value finite. Host arithmetic."""
    try:
        return (_f32(p) + eps) ** _f32(alpha) <= FLOAT32_MAX
    except OverflowError:
        return False


def _f32(value: float) -> float:
    """``value`` rounded to float32 (host tensor)."""
    return float(torch.tensor(value, dtype=torch.float32))


def eps_limit(alpha: float) -> float:
    """The largest priority offset ``eps`` allowed with exponent ``alpha`` (up to float64 rounding):
    ``min(FLOAT32_MAX, FLOAT32_MAX**(1/alpha) - 1)``, so that the default priority ``p = 1`` of a new item (and
    every smaller one) stores a finite float32 ``(p + eps)**alpha``: ``FLOAT32_MAX`` for any alpha <= 1,
    1.8e19 for alpha 2, 3.2e5 for alpha 7. What :func:`check_eps` reports; it decides with :func:`stored_fits`.
    Host arithmetic."""
    if alpha <= 0:
        return FLOAT32_MAX
    log_top = math.log(FLOAT32_MAX) / alpha  # log of the largest p + eps
    return FLOAT32_MAX if log_top >= math.log(2 * FLOAT32_MAX) else min(FLOAT32_MAX, math.exp(log_top) - 1)


def check_eps(eps, alpha: float, *, name: str = "eps") -> float:
    """``eps`` as a float after checking it is a finite real number in ``(0, eps_limit(alpha)]``
    (:func:`eps_limit`): at most ``FLOAT32_MAX``, and the stored value ``(1 + eps)**alpha`` of the default priority
    1 a finite float32 (:func:`stored_fits`). ``alpha`` must already be checked (:func:`check_exponent`).
    ``name``: how the message names ``eps``.

    Raises:
        ValueError: ``eps`` is not a number (a bool included), not finite, <= 0, or above the limit.
    """
    if isinstance(eps, bool) or not (isinstance(eps, Real) and math.isfinite(eps) and eps > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {eps!r}")
    eps = float(eps)
    if eps > FLOAT32_MAX or not stored_fits(1.0, alpha, eps):
        raise ValueError(f"{name} must be in (0, {eps_limit(alpha):.6g}] with alpha={alpha!r}, got {name}={eps!r}: "
                         f"the stored priority (p + {name})**alpha of the default priority p = 1 must be a finite "
                         f"float32, so {name} <= min(FLOAT32_MAX, FLOAT32_MAX**(1/alpha) - 1) (FLOAT32_MAX = "
                         f"{FLOAT32_MAX:.6g})")
    return eps


def check_exponent(name: str, value, *, eps: float | None = None) -> float:
    """``value`` as a float after checking it is a finite real number >= 0: a Python or NumPy number, or a
    0-d real tensor (TorchRL's ``ParameterScheduler`` sets tensors when it started from one).

    With ``eps`` (the priority offset, for ``alpha``), also ``eps ** alpha`` must stay a normal float32 (it is
    the smallest stored priority; one that underflows to 0 would read as an empty slot): ``alpha <=
    log(FLOAT32_TINY) / log(eps)`` for ``eps < 1`` (4.7 for eps 1e-8); and ``(1 + eps) ** alpha``, the stored
    value of the default priority 1, must stay a finite float32 (:func:`stored_fits`): ``alpha <=
    log(FLOAT32_MAX) / log(1 + eps)`` (8.9e7 for eps 1e-6, 128 for eps 1).

    Raises:
        TypeError: ``value`` is a bool, not a number, or a tensor that is not 0-d real.
        ValueError: NaN, infinite, negative, or (``eps``) too large an exponent.
    """
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.dtype == torch.bool or value.is_complex():
            raise TypeError(f"{name} must be a number or a 0-d real tensor, got a tensor of shape "
                            f"{tuple(value.shape)} and dtype {value.dtype}")
        value = float(value)  # sync-ok: setting an exponent (construction or a schedule step), not a replay op
    elif isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        # TorchRL's wording ("alpha must be greater or equal than 0", "beta ... equal to 0"), and finite
        raise ValueError(f"{name} must be greater or equal {'than' if name == 'alpha' else 'to'} 0 and finite, "
                         f"got {name}={value!r}")
    if eps is not None and eps < 1 and value > 0:
        limit = math.log(FLOAT32_TINY) / math.log(eps)
        if value > limit:
            raise ValueError(f"{name} must be <= {limit:.4g} with eps={eps!r}: eps**{name} = {eps ** value:.3g} "
                             f"underflows float32 (the smallest stored priority must stay > 0)")
    if eps is not None and not stored_fits(1.0, value, eps):
        limit = math.log(FLOAT32_MAX) / math.log1p(eps)
        raise ValueError(f"{name} must be <= {limit:.6g} with eps={eps!r}, got {name}={value!r}: the stored priority "
                         f"(1 + eps)**{name} of the default priority 1 must be a finite float32, so {name} <= "
                         f"log(FLOAT32_MAX) / log(1 + eps)")
    return value


def check_seed(seed) -> int | None:
    """``seed`` unless it is neither None nor an int (bools refused) in ``torch.Generator.manual_seed``'s range
    ``[-2**63, 2**64)``.

    Raises:
        TypeError: another type, naming ``seed``.
        ValueError: an int outside that range.
    """
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed must be None or an int, got {type(seed).__name__} {seed!r}")
    if seed is not None and not -2**63 <= seed < 2**64:
        raise ValueError(f"seed must be None or an int in [-2**63, 2**64) (torch.Generator.manual_seed's range), "
                         f"got {seed!r}")
    return seed


#: the reductions of an item's priorities that TorchRL's buffers apply (``torchrl.data.replay_buffers.utils._reduce``)
REDUCTIONS = ("max", "min", "mean", "median", "sum")


def check_reduction(reduction) -> str:
    """``reduction`` unless it is none of ``REDUCTIONS`` (TorchRL would fail only at the first ``extend`` that carries
    priorities).

    Raises:
        ValueError: another value, naming ``reduction`` and the values it may take.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {list(REDUCTIONS)}, got {reduction!r}")
    return reduction


def check_bool(name: str, value) -> bool:
    """``value`` unless it is not a bool: a truthy string such as ``"no"`` or an int such as 2 would be read as
    True.

    Raises:
        TypeError: not a bool, naming ``name``.
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool (True or False), got {type(value).__name__} {value!r}")
    return value


#: Largest number of slots a buffer or sampler takes: its priorities alone (8 bytes a slot) would fill 2**48 bytes,
#: the address space of today's CPUs and CUDA devices.
MAX_CAPACITY = 2**45


def check_capacity(name: str, value) -> int:
    """``value`` unless it is not an int (bools refused) in ``[1, MAX_CAPACITY]`` (:data:`MAX_CAPACITY`).

    Raises:
        ValueError: naming ``name`` and the range.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if value > MAX_CAPACITY:
        raise ValueError(f"{name} must be an int in [1, 2**45], got {value!r}: 8 bytes a slot of priorities alone "
                         f"would exceed 2**48 bytes, the address space of a CPU or CUDA device")
    return value


def check_key(name: str, value, *, allow_none: bool = True):
    """``value`` unless it is not a TensorDict key: a str or a non-empty tuple of str (a nested key), or None with
    ``allow_none``.

    Raises:
        TypeError: another type, naming ``name``.
    """
    if value is None and allow_none:
        return value
    if isinstance(value, str) or (isinstance(value, tuple) and value and all(isinstance(k, str) for k in value)):
        return value
    raise TypeError(f"{name} must be a key of the stored TensorDict (a str or a non-empty tuple of str"
                    f"{', or None' if allow_none else ''}), got {type(value).__name__} {value!r}")


def check_generator(generator) -> None:
    """Raise TypeError unless ``generator`` is None or a ``torch.Generator``."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be None or a torch.Generator, got {type(generator).__name__} {generator!r}")


def check_index_priority(index: Tensor | int | Sequence[int], priority: Tensor | float,
                         n_valid: int, live: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Validate and flatten an (index, priority) pair.

    Args:
        index: integer slots: a tensor of any shape (flattened), an int or a sequence of ints.
        priority: a tensor with as many elements as ``index``, or a single number / 1-element tensor.
        n_valid: host int, slots ``[0, n_valid)`` hold data.
        live: optional ``(B,) bool``, one flag per entry of the flattened ``index``: entries where it is False are
            stale (dropped by the write) and not range-checked; on another device than the CPU no entry of a host
            ``index`` is range-checked (that would read ``live`` back: the write drops out-of-range entries on the
            device instead).

    Returns:
        ``(index, priority)``: ``(B,)`` int64 and ``(B,)`` float32, on their original devices.

    Raises:
        TypeError: ``index`` is not integer, ``priority`` not numeric.
        ValueError: ``priority`` has another number of elements than ``index``; ``live`` is not a ``(B,)`` bool
            tensor.
        IndexError: ``index`` is a host tensor/int with a value outside ``[0, n_valid)`` (at a live entry).

    Example::

        >>> import torch
        >>> check_index_priority(torch.tensor([1, 9]), 2.0, 4, live=torch.tensor([True, False]))  # 9: stale
        (tensor([1, 9]), tensor([2., 2.]))
    """
    index = _flat_index(index)
    if live is not None and (not isinstance(live, Tensor) or live.dtype != torch.bool or live.shape != index.shape):
        raise ValueError(f"update_priority: live must be a {tuple(index.shape)} bool tensor (one flag per index), "
                         f"got {getattr(live, 'dtype', type(live).__name__)} {tuple(getattr(live, 'shape', ()))}")
    if not isinstance(priority, Tensor):
        if isinstance(priority, (bool, str)) or not isinstance(priority, (int, float, Sequence)):
            raise TypeError(f"priority must be a number or a float tensor, got {type(priority).__name__}")
        try:
            priority = torch.as_tensor(priority, dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"priority must be numbers (a number, a sequence of numbers or a float tensor), got "
                            f"{type(priority).__name__} {priority!r:.80}") from err
    if priority.dtype == torch.bool or priority.is_complex():
        raise TypeError(f"priority must be a real tensor, got dtype {priority.dtype}")
    if priority.numel() == 1 and index.numel() != 1:
        priority = priority.reshape(()).expand(index.shape)
    elif priority.numel() != index.numel():
        raise ValueError(f"priority must have one value per index ({index.numel()}), got shape "
                         f"{tuple(priority.shape)}")
    if priority.dim() != 1 or priority.dtype is not torch.float32:  # else already what reshape + to give
        priority = priority.reshape(-1).to(torch.float32)
    if live is None:
        _check_range(index, n_valid)
    elif live.device.type == "cpu":
        _check_range(index[live] if index.device.type == "cpu" else index, n_valid)  # stale entries: dropped
    return index, priority


def check_index(index: Tensor | int | Sequence[int], n_valid: int) -> Tensor:
    """The index half of :func:`check_index_priority` (same checks, same errors): ``(B,)`` int64 slots on
    the original device."""
    index = _flat_index(index)
    _check_range(index, n_valid)
    return index


def _flat_index(index) -> Tensor:
    if not isinstance(index, Tensor):
        if isinstance(index, Sequence) and not isinstance(index, (str, bytes)) and len(index) == 0:
            return torch.empty(0, dtype=torch.int64)  # no slot (TorchRL's samplers accept it: a no-op)
        if isinstance(index, (bool, str, bytes)):
            raise TypeError(f"index must be integer slots, got {type(index).__name__} {index!r}")
        try:
            index = torch.as_tensor(index)
        except (TypeError, ValueError) as err:
            raise TypeError(f"index must be integer slots, got {type(index).__name__}") from err
    dtype = index.dtype
    if dtype is torch.int64 and index.dim() == 1:  # already what reshape(-1).to(int64) gives (a view of)
        return index
    if dtype == torch.bool or index.is_floating_point() or index.is_complex():
        raise TypeError(f"index must be an integer tensor, got dtype {dtype}")
    return index.reshape(-1).to(torch.int64)


def _check_range(index: Tensor, n_valid: int) -> None:
    if index.device.type == "cpu" and index.numel():
        lo, hi = index.aminmax()
        lo, hi = int(lo), int(hi)  # host tensor: no device sync
        if lo < 0 or hi >= n_valid:
            raise IndexError(f"index values must lie in [0, {n_valid}) (the filled slots), got range "
                             f"[{lo}, {hi}]")


#: Our sampler classes, whose checkpoints name their kind (``state_dict()["kind"]``).
SAMPLER_KINDS = ("GPURankBasedSampler", "GPUPrioritizedSliceSampler", "GPUSliceSampler", "GPUPrioritizedSampler",
                 "GPURandomSampler")


def check_kind(state_dict, sampler) -> None:
    """Refuse a sampler checkpoint of another kind than ``sampler``'s (its nearest class among
    :data:`SAMPLER_KINDS`: a user subclass loads its base's checkpoints).

    Raises:
        TypeError: ``state_dict`` is not a dict.
        ValueError: it names another of our sampler kinds.
    """
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a sampler's state_dict() (a dict), got {type(state_dict).__name__}")
    own = next((c.__name__ for c in type(sampler).__mro__ if c.__name__ in SAMPLER_KINDS), None)
    kind = state_dict.get("kind")
    if kind in SAMPLER_KINDS and own is not None and kind != own:
        raise ValueError(f"sampler checkpoint is from {kind}; this buffer's sampler is {own} (build the buffer "
                         f"with the checkpoint's sampler kind)")


def check_draw(storage, batch_size: int) -> None:
    """The checks every draw makes: ``batch_size`` an int >= 1 and a non-empty ``storage`` (``len`` a host int).

    Raises:
        ValueError: ``batch_size`` is not an int >= 1.
        EmptyBufferError (a ValueError and RuntimeError): the storage is empty.
    """
    check_batch_size(batch_size)
    if len(storage) == 0:
        raise EmptyBufferError("Cannot sample from an empty storage (the replay buffer holds no transition): "
                               "extend it first")
