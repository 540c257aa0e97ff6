"""The compiled replay ops of one device as one object: :class:`TritonOps`.

``lightning_per.ops`` completes it with the reference ops that need no kernel and admits it after a
self-check against the reference (``lightning_per.ops.dispatch.select_backend``). Importing this module
imports Triton and every kernel module.
"""

from __future__ import annotations

import torch

from . import COMPILED_OPS, FUSED_OPS, STORAGE_OPS
from ._common import INTERPRET
from .blocks import last_write_wins, last_writer, reduce_blocks
from .gather import gather_rows, gather_stacks, scatter_rows
from .philox import DEVICE_RNG_DRAWS, SHUFFLE_DRAWS, new_rng_state, seed_word, shuffled_uniforms
from .priority import sanitize_priority, transform_priority
from .rank import rank_sample
from .sample import (
    is_weights,
    sample_proportional,
    sample_proportional_gather,
    two_level_search,
    two_level_search_with_values,
)
from .update import write_priorities

__all__ = ["TritonOps"]


class TritonOps:
    """The Triton kernels of the replay ops for ``device``; each op is the module function of the same name.

    Args:
        device: a CUDA device (or CPU when Triton runs under ``TRITON_INTERPRET=1``).

    Raises:
        RuntimeError: the device is not one the kernels run on, or CUDA is not available.

    Example::

        ops = TritonOps("cuda")
        index, w = ops.sample_proportional(leaves, block_sum, block_min, 256, 0.4, rng=ops.new_rng_state(0, "cuda"))
    """

    #: The names whose calls run kernels (single ops, the fused ones of a whole sampler step, the storages').
    COMPILED: tuple[str, ...] = COMPILED_OPS + FUSED_OPS + STORAGE_OPS
    #: Most draws one call may take from the device RNG (positions with their own counter).
    DEVICE_RNG_DRAWS: int = DEVICE_RNG_DRAWS
    #: Largest batch whose shuffled stratified uniforms the device RNG draws (:meth:`shuffled_uniforms`).
    SHUFFLE_DRAWS: int = SHUFFLE_DRAWS

    sanitize_priority = staticmethod(sanitize_priority)
    transform_priority = staticmethod(transform_priority)
    reduce_blocks = staticmethod(reduce_blocks)
    last_write_wins = staticmethod(last_write_wins)
    last_writer = staticmethod(last_writer)
    two_level_search = staticmethod(two_level_search)
    two_level_search_with_values = staticmethod(two_level_search_with_values)
    is_weights = staticmethod(is_weights)
    sample_proportional = staticmethod(sample_proportional)
    sample_proportional_gather = staticmethod(sample_proportional_gather)
    write_priorities = staticmethod(write_priorities)
    rank_sample = staticmethod(rank_sample)
    gather_rows = staticmethod(gather_rows)
    scatter_rows = staticmethod(scatter_rows)
    gather_stacks = staticmethod(gather_stacks)
    #: the proportional draws' in-kernel uniforms (``rng=``)
    new_rng_state = staticmethod(new_rng_state)
    seed_word = staticmethod(seed_word)
    #: stratified uniforms in a random order of the strata, from the device RNG (one launch)
    shuffled_uniforms = staticmethod(shuffled_uniforms)

    def __init__(self, device: torch.device | str) -> None:
        device = torch.device(device)
        if device.type != "cuda" and not (INTERPRET and device.type == "cpu"):
            raise RuntimeError(f"the replay kernels run on CUDA devices (or CPU under TRITON_INTERPRET=1), "
                               f"not on {device}")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("CUDA is not available")
        #: the device the ops were checked on
        self.device = device
