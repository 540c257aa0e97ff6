"""The typed interface of the replay ops: :class:`ReplayOps`, and :class:`CompiledReplayOps` for the kernels.

A sampler holds one implementation, chosen once at construction by
:func:`lightning_per.ops.dispatch.select_backend`: the module :mod:`lightning_per.ops.reference` (plain
torch, CPU and CUDA: the oracle and the fallback) or a :class:`lightning_per.ops.kernels.KernelOps` (the
Triton kernels of ``lightning_per.ext``, admitted after a self-check). Both satisfy :class:`ReplayOps`
structurally (a module can implement a protocol, PEP 544), so static tools follow every call to its
definition. Shapes, dtypes and formulas: the functions of :mod:`lightning_per.ops.reference`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from lightning_per.ext.state import PriorityTree, RankTable

__all__ = ["ReplayOps", "CompiledReplayOps"]


@runtime_checkable
class ReplayOps(Protocol):
    """The replay ops every backend provides (signatures of :mod:`lightning_per.ops.reference`).

    Example::

        >>> from lightning_per.ops import ReplayOps, reference
        >>> isinstance(reference, ReplayOps)
        True
    """

    def block_size_for(self, capacity: int, serial: bool = False) -> int: ...

    def sanitize_priority(self, priority: Tensor, max_priority: Tensor) -> tuple[Tensor, Tensor]: ...

    def transform_priority(self, clean: Tensor, alpha: Tensor | float, eps: float) -> Tensor: ...

    def reduce_blocks(self, rows: Tensor) -> tuple[Tensor, Tensor]: ...

    def last_write_wins(self, index: Tensor, values: Tensor) -> Tensor: ...

    def last_writer(self, index: Tensor, scratch: Tensor, positions: Tensor) -> Tensor: ...

    def stratified_uniforms(self, batch_size: int, generator: torch.Generator | None, device: torch.device,
                            stratified: bool = True) -> Tensor: ...

    def inverse_cdf_search(self, cdf: Tensor, target: Tensor) -> Tensor: ...

    def two_level_search(self, leaves: Tensor, block_sum: Tensor, u: Tensor) -> Tensor: ...

    def two_level_search_with_values(self, leaves: Tensor, block_sum: Tensor,
                                     u: Tensor) -> tuple[Tensor, Tensor]: ...

    def is_weights(self, p_sel: Tensor, p_min: Tensor, beta: Tensor | float,
                   normalize: str = "buffer") -> Tensor: ...

    def rank_weights(self, capacity: int, alpha: float,
                     device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]: ...

    def sample_proportional(self, tree: PriorityTree, u: Tensor, stratified: bool = True,
                            normalize: str = "buffer") -> tuple[Tensor, Tensor]: ...

    def sample_proportional_gather(self, tree: PriorityTree, u: Tensor, rows: Tensor, stratified: bool = True,
                                   normalize: str = "buffer") -> tuple[Tensor, Tensor, Tensor]: ...

    def write_priorities(self, tree: PriorityTree, index: Tensor, priority: Tensor, n_valid: int,
                         valid: Tensor | None = None) -> None: ...

    def rank_sample(self, table: RankTable, u: Tensor, n: int, stratified: bool = True,
                    normalize: str = "buffer") -> tuple[Tensor, Tensor]: ...

    def gather_rows(self, src: Tensor, index: Tensor) -> Tensor: ...

    def scatter_rows(self, dst: Tensor, index: Tensor, src: Tensor) -> None: ...

    def gather_stacks(self, ring: Tensor, positions: Tensor, index: Tensor) -> Tensor: ...


@runtime_checkable
class CompiledReplayOps(ReplayOps, Protocol):
    """:class:`ReplayOps` on compiled kernels, with what only they have.

    ``sample_proportional`` and ``sample_proportional_gather`` also take ``u`` as an int (the batch size) for a
    tree whose ``rng`` is a device RNG state from :meth:`new_rng_state`: the uniforms are drawn in the kernel.
    """

    #: The names whose calls run kernels.
    COMPILED: tuple[str, ...]
    #: Most draws one call may take from a device RNG state.
    DEVICE_RNG_DRAWS: int
    #: Largest batch :meth:`shuffled_uniforms` draws.
    SHUFFLE_DRAWS: int
    #: The device the ops were checked on.
    device: torch.device

    def new_rng_state(self, seed: int, device: torch.device | str) -> Tensor: ...

    def seed_word(self, seed: int) -> int: ...

    def shuffled_uniforms(self, rng: Tensor, n: int) -> Tensor: ...
