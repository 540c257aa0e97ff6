"""Stateless tensor math of prioritized replay (reference ops + backend dispatch). No Lightning here."""

from lightning_per.ops import reference
from lightning_per.ops.dispatch import select_backend
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
