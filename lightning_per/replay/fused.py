"""The fused sample + row gather of a prioritized sampler over a packed storage: one op draws the slots and copies
their rows (:func:`lightning_per.replay.priority.sample_gather`), when the storage's packed ring can be read that
way; otherwise a draw, then the storage's read."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_per.replay.errors import check_draw
from lightning_per.replay.rows import set_all
from lightning_per.replay.storage import GPUTensorStorage

__all__ = ["FUSED_GATHER_MAX_WORDS", "FusedGather"]

FUSED_GATHER_MAX_WORDS = 1024
"""Widest packed row (int64 words, i.e. 8 KiB) that :meth:`GPUPrioritizedSampler.sample_gather` copies inside
the sample kernel (one program per draw copies its row); wider rows, e.g. Atari frame stacks, are gathered by
a separate kernel."""


class FusedGather:
    """``sample_gather`` of :class:`~lightning_per.replay.GPUPrioritizedSampler` (mixed into it)."""

    def _fusable_rows(self, storage) -> Tensor | None:
        """The storage's packed ring when a fused sample + gather can read it (packed, flat keys, on this
        sampler's device; ``cuda`` stands for the current CUDA device) and :meth:`sample` is this class's
        proportional draw (a subclass that overrides it, e.g. the rank-based sampler, never fuses), else None."""
        if type(self).sample is not type(self)._proportional_sample:
            return None
        rows = getattr(storage, "gather_rows", None)
        if rows is None or not hasattr(storage, "rows_to_batch"):
            return None
        if rows.shape[1] > FUSED_GATHER_MAX_WORDS:  # wide rows (pixels): a separate gather spreads each row
            return None                             # over many thread blocks; one program per row would not
        have, want = rows.device, self._device
        if have.type != want.type or (want.index is not None and have.index != want.index) or (
                want.index is None and have.type == "cuda" and have.index != torch.cuda.current_device()):
            return None
        return rows

    def sample_gather(self, storage, batch_size: int, *,
                      with_info: bool = False) -> tuple[Tensor, dict[str, Tensor], Any]:
        """:meth:`sample`, and the batch: ``(index, info, batch)``, with ``batch`` the TensorDict ``[B]``
        that ``storage.get(index)`` returns.

        With a packed :class:`~lightning_per.replay.GPUTensorStorage` (flat keys, rows of at most
        :data:`FUSED_GATHER_MAX_WORDS` int64 words) on this sampler's device the draw and the row gather are
        one op (``sample_proportional_gather``: one kernel launch with the compiled backend) and the batch's
        fields are views of the gathered rows
        (:meth:`GPUTensorStorage.rows_to_batch`); otherwise :meth:`sample` then ``storage.get(index)``.
        Either way the same generator draws give the same index, weights and batch values.

        Args:
            storage: the buffer's storage.
            batch_size: B >= 1.
            with_info: also put ``"index"`` and ``"priority_weight"`` in the batch (the replay buffer's keys).

        Returns:
            ``index`` ``(B,)`` int64 and ``info`` ``{"priority_weight": (B,) float32}`` on :attr:`device`, as
            :meth:`sample`; ``batch`` a TensorDict ``[B]`` on the storage's device (packed: its fields are
            views into one gathered ``(B, W)`` int64 block).

        Raises:
            As :meth:`sample`.
        """
        rows = self._fusable_rows(storage)
        if rows is None:
            index, info = self.sample(storage, batch_size)
            extra = {"index": index, "priority_weight": info["priority_weight"]} if with_info else None
            if isinstance(storage, GPUTensorStorage):  # the batch built once, with the extra keys
                return index, info, storage.read(index, extra)
            return index, info, set_all(storage.get(index), extra)
        check_draw(storage, batch_size)
        self._follow_buffer_rng()
        block, index, weight = self._served(("gather", batch_size, self.stratified, self.weight_normalization),
                                            lambda: self._draw_gather(batch_size, rows), (),
                                            (*self._draw_state(batch_size), rows), self.draw_generators(batch_size))
        extra = {"index": index, "priority_weight": weight} if with_info else None
        return index, {"priority_weight": weight}, storage.rows_to_batch(block, extra)
