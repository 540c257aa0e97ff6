"""The slice samplers' starts rules, values a :class:`~lightning_per.replay.slice_index.SliceIndex` holds: how its
start mask becomes the leaves a draw searches. :class:`UniformStarts` (TorchRL's ``SliceSampler``) and
:class:`PriorityStarts` (``"start"`` / ``"max"``: TorchRL's ``PrioritizedSliceSampler`` and the slice-max rule).
A starts rule offers ``reset(index)``, ``changed(index, start)`` (the start mask changed at slots ``start`` ``(S,)``:
its leaves follow) and ``usable(index)`` (some start can be drawn)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lightning_per.ext.state import PriorityTree
from lightning_per.ops import block_size_for, reference, select_backend
from lightning_per.replay._rng import SamplerRNG
from lightning_per.replay.slice_ops import device_fn, reduce_touched, uniform_starts

if TYPE_CHECKING:
    from lightning_per.replay.slice_index import SliceIndex

__all__ = ["PriorityStarts", "SLICE_PRIORITY_RULES", "UniformStarts"]

#: How :class:`PriorityStarts` turns transition priorities into a start's priority.
SLICE_PRIORITY_RULES = ("start", "max")


class UniformStarts:
    """TorchRL's ``SliceSampler`` starts rule: 1.0 at the first slot of each trajectory with a valid start (a
    two-level array, as the priorities), so a draw picks a trajectory uniformly by one two-level search, then a
    start uniformly among its valid ones (:func:`~lightning_per.replay.slice_ops.uniform_starts`).

    Args:
        device: where its leaves live; backend: the ops (:func:`lightning_per.ops.select_backend`).

    Attributes:
        leaves, block_sum, block_min: ``(nb, blk) float32``, ``(nb,) float64``, ``(nb,) float32`` on ``device``
            (allocated for the index's slots at its first storage).
        compiled: the compiled kernels serve the draws (the start pick is compiled on CUDA).
    """

    def __init__(self, device: torch.device, backend: str = "auto") -> None:
        self.device, self.backend = device, backend
        self.ops = select_backend(device, backend)
        self.compiled = self.ops is not reference
        self.pick = device_fn("uniform_starts", uniform_starts, device, self.compiled)
        self.leaves = self.block_sum = self.block_min = None

    def __repr__(self) -> str:
        return f"UniformStarts(device={self.device}, compiled={self.compiled})"

    def __getstate__(self) -> dict[str, Any]:
        """Pickle state: without the backend module and the compiled pick, which :meth:`__setstate__` takes afresh."""
        state = self.__dict__.copy()
        state["ops"] = state["pick"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.ops = select_backend(self.device, self.backend)
        self.pick = device_fn("uniform_starts", uniform_starts, self.device, self.compiled)

    def reset(self, index: SliceIndex) -> None:
        """No usable trajectory start (fresh leaves for ``index``'s slots)."""
        blk = block_size_for(index.slots + 1)
        nb, d = -(-(index.slots + 1) // blk), self.device
        self.leaves = torch.zeros(nb, blk, dtype=torch.float32, device=d)  # 1 at usable trajectory starts
        self.block_sum = torch.zeros(nb, dtype=torch.float64, device=d)
        self.block_min = torch.full((nb,), float("inf"), dtype=torch.float32, device=d)

    def changed(self, index: SliceIndex, start: Tensor) -> None:
        """The start mask changed at slots ``start`` ``(S,)``: their leaves follow (a trajectory's first slot)."""
        first = index.end_flat[(start - index.stride) % index.slots]  # the step before is an end: a first step
        T, spec = index.T, index.spec
        if spec.strict_length and spec.need(T) < T:  # a right span: TorchRL's strict filter keeps L >= T only
            window = (start[:, None] + torch.arange(T - 1, device=start.device) * index.stride) % index.slots
            first = first & ~index.end_flat[window].any(1)
        self.leaves.view(-1)[start] = (index.valid[start] & first).to(torch.float32)
        reduce_touched(self.leaves, self.block_sum, self.block_min, start)

    def usable(self, index: SliceIndex) -> Tensor:
        """0-d bool on the device: some trajectory can be drawn."""
        return self.block_sum.sum() > 0

    def draw(self, index: SliceIndex, rng: SamplerRNG, num: int, T: int) -> tuple[Tensor, Tensor | None]:
        """``num`` slice starts ``(num,) int64`` and their most steps (``(num,) int64``, or None without a left
        span: every slice may hold ``T`` steps): a trajectory uniformly, then a start uniformly inside it
        (:func:`~lightning_per.replay.slice_ops.uniform_starts`)."""
        u = rng.rand((num,))
        first, _ = self.ops.sample_proportional(PriorityTree(self.leaves, self.block_sum, self.block_min), u, False,
                                                "buffer")
        pick = rng.rand((num,))
        spec = index.spec
        return self.pick(first, pick, index.end_leaves, index.end_bsum, (index.stride, index.rows), T, spec.need(T),
                         spec.left(T))

    def probabilities(self, index: SliceIndex) -> Tensor:
        """Exact ``P(s)`` of every slot as a start, ``(N,)`` float64 on the host (a host loop over trajectories,
        for tests and diagnostics; no span)."""
        N, E = index.slots, index.stride
        starts = self.leaves.view(-1)[:N].to(torch.float64).cpu()  # sync-ok: diagnostics
        ends = index.end_flat.cpu()  # sync-ok: diagnostics
        valid = index.valid[:N].cpu()  # sync-ok: diagnostics
        k = starts.sum()
        p = torch.zeros(N, dtype=torch.float64)
        for s in torch.nonzero(starts).flatten().tolist():  # sync-ok: host copy (diagnostics)
            members, j = [], s
            while True:
                members.append(j)
                if ends[j]:
                    break
                j = (j + E) % N
            ok = [m for m in members if valid[m]]
            for m in ok:
                p[m] += 1.0 / (k * len(ok))
        return p


class PriorityStarts:
    """The prioritized starts rule: a start's leaf in ``core``'s priorities is ``v_s`` times the start mask,
    ``v_s = (p + eps)^alpha`` of its own raw priority (``"start"``, TorchRL's) or of the largest among its slice's
    members (``"max"``; :class:`~lightning_per.replay.GPUPrioritizedSliceSampler` describes both).

    Args:
        core: the sampler's :class:`~lightning_per.replay.core.PriorityCore`.
        rule: ``"start"`` or ``"max"``.

    Raises:
        ValueError: ``rule`` is neither.
    """

    def __init__(self, core, rule: str = "start") -> None:
        if rule not in SLICE_PRIORITY_RULES:
            raise ValueError(f"slice_priority must be one of {SLICE_PRIORITY_RULES}, got {rule!r}")
        self.core, self.rule, self.device = core, rule, core.device

    def __repr__(self) -> str:
        return f"PriorityStarts(rule={self.rule!r})"

    def reset(self, index: SliceIndex) -> None:
        """Nothing of its own: the sampler resets its core."""
        return None

    def values(self, index: SliceIndex, start: Tensor) -> Tensor:
        """Stored values ``(p + eps)^alpha`` of the starts ``start`` ``(S,)`` float32 under :attr:`rule`."""
        state = self.core.state
        if self.rule == "start" or index.T is None or index.T == 1:
            raw = state.raw[start]
        else:
            window = (start[:, None] + torch.arange(index.T, device=start.device) * index.stride) % index.slots
            ends = index.end_flat[window].to(torch.int32)  # [S, T]
            member = (torch.cumsum(ends, 1) - ends) == 0
            raw = state.raw[window].masked_fill(~member, 0.0).amax(1)
        return self.core.ops.transform_priority(raw, state.alpha, state.eps)

    def usable(self, index: SliceIndex) -> Tensor:
        """0-d bool on the device: some slot can start a slice."""
        return index.valid.any()

    def changed(self, index: SliceIndex, start: Tensor) -> None:
        """The start mask changed at slots ``start`` ``(S,)``: their stored values become ``v_s * valid_s``."""
        state = self.core.state
        flat = state.leaves.view(-1)
        flat[start] = torch.where(index.valid[start], self.values(index, start), torch.zeros((), device=start.device))
        reduce_touched(state.leaves, state.block_sum, state.block_min, start)

    def refresh(self, index: SliceIndex) -> None:
        """Recompute every start's stored value (after the core re-transformed them for a new alpha), O(N)."""
        if index.T is not None and index.slots is not None:
            self.changed(index, torch.arange(index.slots, device=self.device))

    def write(self, index: SliceIndex, slots: Tensor, raw: Tensor, n_valid: int) -> None:
        """The core's write of raw priorities ``raw`` at ``slots`` (both ``(B,)`` on the device), keeping the stored
        value of every slot that cannot start a slice at 0.

        ``"start"``: one fused write masked by the start mask (such a slot keeps its raw priority, which the running
        max folds in, and stores the value 0; nothing else recomputed). ``"max"``: the plain write, then the
        ``B * T`` starts whose slices hold the slots are recomputed.
        """
        if index.T is None or index.slots is None or slots.numel() == 0:  # no mask yet: plain values (masked later)
            return self.core.write(slots, raw, n_valid)
        if self.rule == "max" and index.T > 1:
            self.core.write(slots, raw, n_valid)
            near = slots.clamp(0, index.slots - 1)  # slots the write dropped: recomputing a valid one is harmless
            starts = (near[:, None] - torch.arange(index.T, device=self.device) * index.stride) % index.slots
            self.changed(index, starts.reshape(-1))
            return
        self.core.write(slots, raw, n_valid, index.valid)
