"""The compiled backend: :class:`KernelOps`, the Triton ops of ``lightning_per.ext`` completed with the
reference ops that need no kernel. Importing this module imports Triton.

:func:`lightning_per.ops.dispatch.select_backend` builds one per device and admits it only after
:func:`lightning_per.ops.selfcheck.self_check` compared it with :mod:`lightning_per.ops.reference`.
"""

from __future__ import annotations

from lightning_per.ext.backend import TritonOps
from lightning_per.ops import reference

__all__ = ["KernelOps"]


class KernelOps(TritonOps):
    """:class:`lightning_per.ops.protocol.CompiledReplayOps` on ``device``: every name of
    :mod:`lightning_per.ops.reference`, the ones in ``COMPILED`` running kernels, the rest delegated.

    Args:
        device: a CUDA device (or CPU when Triton runs under ``TRITON_INTERPRET=1``).

    Raises:
        RuntimeError: the kernels do not run on ``device``.

    Example::

        ops = KernelOps("cuda")
        ops.block_size_for(1000)  # 32, the reference's
    """

    block_size_for = staticmethod(reference.block_size_for)
    stratified_uniforms = staticmethod(reference.stratified_uniforms)
    inverse_cdf_search = staticmethod(reference.inverse_cdf_search)
    rank_weights = staticmethod(reference.rank_weights)
