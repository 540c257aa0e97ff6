"""Compiled prioritized-replay kernels (Triton), installed as ``lightning_per.ext``.

This package imports nothing of ``lightning_per`` outside itself: the plain-torch reference, the typed
``ReplayOps`` protocol and the self-check against the reference live in ``lightning_per.ops``, which imports
this package (never the other way round).

Layout (kernel -> launcher -> public op): each module holds private ``@triton.jit`` kernels, launchers that
validate and pick chunk sizes, ``torch.library.custom_op`` registrations (``torch.ops.lightning_per.*``:
opaque calls under ``torch.compile``, capturable in CUDA graphs) and the public functions, which launch
directly in eager mode (no dispatcher overhead) and call the registered op while ``torch.compile`` traces.

* :mod:`.backend` - :class:`~.backend.TritonOps`, the compiled ops of one device as one object.
* :mod:`.sample` - ``two_level_search(_with_values)``, ``is_weights`` and the fused ``sample_proportional``
  (draws -> block search -> leaf search -> IS weight, one launch), and ``sample_proportional_gather`` (the
  same, plus the drawn rows of a packed ring, still one launch); both take uniforms, or draw them in the
  kernel from a device RNG state (``rng=``). :mod:`.search` - the block and leaf search both sample
  kernels inline. :mod:`.philox` - the device RNG (Philox4x32-10 in the kernel, ``new_rng_state``).
* :mod:`.update` - the fused ``write_priorities`` (sanitize, transform, last write wins, scatter, touched
  block sums/minima from the leaves, counters; one launch up to ``MAX_ONE_LAUNCH`` entries, else two or five).
* :mod:`.blocks` - ``reduce_blocks``, ``last_write_wins``, ``last_writer``; :mod:`.torch_paths` - their
  plain-torch paths beyond the kernels' batch limit.
* :mod:`.priority` - ``sanitize_priority``, ``transform_priority``.
* :mod:`.rank` - the fused ``rank_sample`` (rank search -> slot -> IS weight, one launch).
* :mod:`.gather` - row gathers and scatters of the storages (frame stacks, pinned host rows).
* :mod:`.state` - ``PriorityTree`` (with its ``WriteScratch``) and ``RankTable``: the explicit state an op takes
  as one value (plain torch, no Triton).

Importing this package never imports Triton; importing :mod:`.backend` (or any kernel module) does. Kernels
run on CUDA devices, or on CPU tensors when Triton is first imported with ``TRITON_INTERPRET=1`` (Triton's
interpreter; slow, for tests).
"""

from __future__ import annotations

__all__ = ["COMPILED_OPS", "FUSED_OPS", "STORAGE_OPS"]

#: Single ops of the reference that run as kernels (same names and signatures).
COMPILED_OPS = ("sanitize_priority", "transform_priority", "reduce_blocks", "last_write_wins", "last_writer",
                "two_level_search", "two_level_search_with_values", "is_weights")
#: One-call ops of a whole sampler step (one or two launches each).
FUSED_OPS = ("sample_proportional", "write_priorities", "rank_sample", "sample_proportional_gather")
#: Row and frame-stack copies of the storages' reads and writes.
STORAGE_OPS = ("gather_rows", "scatter_rows", "gather_stacks")
