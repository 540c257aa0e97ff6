"""Compiled prioritized-replay kernels (Triton), installed as ``lightning_per.ext``.

Layout (kernel -> launcher -> public op): each module holds private ``@triton.jit``
kernels, launchers that validate and pick chunk sizes, ``torch.library.custom_op`` registrations
(``torch.ops.lightning_per.*``: opaque calls under ``torch.compile``, capturable in CUDA graphs) and the public
functions, which launch directly in eager mode (no dispatcher overhead) and call the registered op
while ``torch.compile`` traces.

* :mod:`.sample` - ``two_level_search(_with_values)``, ``is_weights`` and the fused
  ``sample_proportional`` (draws -> block search -> leaf search -> IS weight, one launch), and
  ``sample_proportional_gather`` (the same, plus the drawn rows of a packed ring, still one launch); both
  take uniforms, or draw them in the kernel from a device RNG state (``new_rng_state``, ``rng=``).
* :mod:`.update` - the fused ``write_priorities`` (sanitize, transform, last write wins, scatter, touched
  block sums/minima from the leaves, counters; one launch up to ``MAX_ONE_LAUNCH`` entries, else two or five).
* :mod:`.blocks` - ``reduce_blocks``, ``last_write_wins``, ``last_writer``.
* :mod:`.priority` - ``sanitize_priority``, ``transform_priority``.
* :mod:`.rank` - the fused ``rank_sample`` (rank search -> slot -> IS weight, one launch).
* :mod:`.composite` - the fused ops written with the reference ops (oracle and fallback).

:func:`make_backend` is what :func:`lightning_per.ops.select_backend` calls. Importing this package
never imports Triton; :func:`make_backend` does, and raises on any failure, so the dispatcher can fall
back to the reference ops with one warning. Kernels run on CUDA devices, or on CPU tensors when the
package is imported with ``TRITON_INTERPRET=1`` (Triton's interpreter; slow, for tests).
"""

from __future__ import annotations

import types

import torch

__all__ = ["make_backend", "COMPILED_OPS", "FUSED_OPS"]

#: Reference ops replaced by kernels (when the reference still exports the name).
COMPILED_OPS = ("sanitize_priority", "transform_priority", "reduce_blocks", "last_write_wins", "last_writer",
                "two_level_search", "two_level_search_with_values", "is_weights")
#: One-call ops of a whole sampler step, added to the backend (plain-torch twins in :mod:`.composite`).
FUSED_OPS = ("sample_proportional", "write_priorities", "rank_sample", "sample_proportional_gather")


def _kernel_functions() -> dict:
    from . import blocks, priority, rank, sample, update  # imports triton: may raise

    found = {}
    for module in (blocks, priority, rank, sample, update):
        for name in module.__all__:
            if name in COMPILED_OPS or name in FUSED_OPS:
                found[name] = getattr(module, name)
    return found


def make_backend(device: torch.device | str) -> types.ModuleType:
    """The replay ops for ``device``: the reference module's functions with the compiled ones swapped
    in, plus the fused ops; self-checked against the reference before it is returned.

    Args:
        device: a CUDA device (or CPU when imported with ``TRITON_INTERPRET=1``).

    Returns:
        A module object exposing every name of ``lightning_per.ops.reference.__all__`` (same
        signatures), ``sample_proportional``, ``write_priorities``, ``rank_sample``,
        ``sample_proportional_gather``, ``COMPILED`` (the names that run kernels), and the helpers
        ``prepare_write``, ``new_rng_state``, ``seed_word``, ``DEVICE_RNG_DRAWS``.

    Raises:
        RuntimeError: the device is not supported, Triton or a kernel fails to build, or a kernel's
            result differs from the reference (the message names the op).
    """
    from lightning_per.ops import reference

    from ._common import INTERPRET
    from .selfcheck import self_check

    device = torch.device(device)
    if device.type != "cuda" and not (INTERPRET and device.type == "cpu"):
        raise RuntimeError(f"the replay kernels run on CUDA devices (or CPU under TRITON_INTERPRET=1), "
                           f"not on {device}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available")
    try:
        kernels = _kernel_functions()
    except Exception as err:  # noqa: BLE001 - a broken Triton must turn into the documented RuntimeError
        raise RuntimeError(f"importing the Triton kernels failed: {err!r}") from err
    backend = types.ModuleType("lightning_per.ext.backend", "Replay ops with compiled kernels swapped in.")
    names = list(getattr(reference, "__all__", ()))
    for name in names:
        setattr(backend, name, getattr(reference, name))
    compiled = tuple(name for name in COMPILED_OPS if name in names) + FUSED_OPS
    for name in compiled:
        setattr(backend, name, kernels[name])
    from .sample import DEVICE_RNG_DRAWS, new_rng_state, seed_word
    from .update import prepare_write

    backend.prepare_write = prepare_write  # the write's counters, made outside any capture
    backend.new_rng_state = new_rng_state  # the proportional draws' in-kernel uniforms (``rng=``)
    backend.DEVICE_RNG_DRAWS = DEVICE_RNG_DRAWS
    backend.seed_word = seed_word
    backend.__all__ = names + [n for n in FUSED_OPS if n not in names]
    backend.COMPILED = compiled
    backend.device = device
    try:
        self_check(backend, device)
    except RuntimeError:
        raise
    except Exception as err:  # noqa: BLE001 - compile errors, launch failures: all mean "fall back"
        raise RuntimeError(f"replay kernels failed to run on {device}: {err!r}") from err
    return backend
