"""Stateless tensor math of prioritized replay: the typed :class:`ReplayOps` protocol, its plain-torch
reference, and the backend choice (the reference, or the self-checked kernels of ``lightning_per.ext``).
No Lightning here."""

from lightning_per.ops import reference
from lightning_per.ops.dispatch import select_backend
from lightning_per.ops.protocol import CompiledReplayOps, ReplayOps
from lightning_per.ops.reference import (
    block_size_for,
    inverse_cdf_search,
    is_weights,
    last_write_wins,
    rank_weights,
    reduce_blocks,
    sanitize_priority,
    stratified_uniforms,
    transform_priority,
    two_level_search,
)

__all__ = [
    "reference",
    "select_backend",
    "ReplayOps",
    "CompiledReplayOps",
    "block_size_for",
    "inverse_cdf_search",
    "is_weights",
    "last_write_wins",
    "rank_weights",
    "reduce_blocks",
    "sanitize_priority",
    "stratified_uniforms",
    "transform_priority",
    "two_level_search",
]
