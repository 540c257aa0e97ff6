"""The plain-torch twins of the fused kernels live in :mod:`lightning_per.ops.reference`; this module
re-exports them under their old home for the kernel tests and the self-check."""

from lightning_per.ops.reference import rank_sample, sample_proportional, sample_proportional_gather, write_priorities

__all__ = ["sample_proportional", "sample_proportional_gather", "write_priorities", "rank_sample"]
