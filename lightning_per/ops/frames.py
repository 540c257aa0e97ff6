"""Frame-deduplicated replay as pure tensor ops: hash and deduplicate stacked frames.

A transition of a stacked-frame environment carries two stacks of ``S`` frames (observation and next
observation) that share ``S - 1`` frames with each other and with the neighbouring transitions of the
same environment. :func:`dedup_frames` finds, for every incoming frame, an identical frame among the
``window`` most recently stored ones (or an earlier frame of the same batch), so only new content is
written to the ring of frames; the ops backend's ``gather_stacks``
(:func:`lightning_per.ops.reference.gather_stacks`) rebuilds the stacks of a batch from the frame positions
each transition keeps. Identity is exact: a hash picks the candidate, a byte comparison
confirms it (a hash collision only costs a duplicate frame). Nothing here synchronises with the host:
every size is a host int and every data-dependent choice a ``torch.where``.

Frames carry a *serial*: the number of frames written before them. The ring of ``F`` frames holds
serial ``s`` at position ``s % F`` until serial ``s + F`` is written, so a transition whose oldest
frame has serial ``o`` is intact while ``o >= written - F`` (:func:`intact`).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["hash_weights", "hash_frames", "dedup_frames", "intact"]

#: Hash weights lie in ``[1, 2^31)``: with pixels < 2^8 and fewer than 2^24 pixels a frame, the weighted
#: sum stays below 2^63 (no int64 overflow).
_WEIGHT_BITS = 31
_MAX_PIXELS = 1 << 24


def hash_weights(pixels: int, device: torch.device | str = "cpu", seed: int = 0) -> Tensor:
    """Random hash weights ``(pixels,) int64`` in ``[1, 2^31)`` from a fixed ``seed`` (same on every device).

    Raises:
        ValueError: ``pixels`` is not in ``[1, 2^24]``.
    """
    if not 1 <= pixels <= _MAX_PIXELS:
        raise ValueError(f"a frame must have 1 to {_MAX_PIXELS} pixels, got {pixels}")
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, 1 << _WEIGHT_BITS, (pixels,), generator=gen, dtype=torch.int64).to(device)


def hash_frames(frames: Tensor, weights: Tensor, chunk: int = 4096) -> Tensor:
    """``(M,) int64`` hashes ``sum_j w_j x_j`` of ``frames`` ``(M, P) uint8`` with ``weights`` ``(P,) int64``.

    Exact integer arithmetic (no overflow, see :data:`_WEIGHT_BITS`); equal frames have equal hashes, two
    different frames collide with probability about ``2^-31``. The int64 products are formed ``chunk`` frames at
    a time (a ``(chunk, P)`` temporary, 231 MB for 84x84 frames), so a large write does not hold ``8 M P`` bytes.
    """
    if frames.shape[0] <= chunk:
        return (frames.to(torch.int64) * weights).sum(1)  # [M]
    return torch.cat([(part.to(torch.int64) * weights).sum(1) for part in frames.split(chunk)])


def dedup_frames(frames_in: Tensor, hashes_in: Tensor, ring: Tensor, ring_hash: Tensor, written: Tensor,
                 window: int) -> tuple[Tensor, Tensor]:
    """Serials of the incoming frames, each an identical stored frame's where there is one.

    Args:
        frames_in: ``(M, P) uint8`` incoming frames (on the ring's device).
        hashes_in: ``(M,) int64`` their :func:`hash_frames`.
        ring: ``(F + 1, P) uint8`` the ring of frames (row ``F``: scratch for discarded writes).
        ring_hash: ``(F + 1,) int64`` hashes of the ring's frames.
        written: ``() int64`` frames written so far (the next serial).
        window: how many of the most recent frames are candidates (``window + M <= F``: a candidate
            survives the writes of this batch).

    Returns:
        ``(serial, new)``: ``(M,) int64`` the serial each incoming frame will have (a matched frame's, or
        ``written + k`` for the ``k``-th new frame in order) and ``(M,) bool`` which ones are new. A frame
        matches the most recent candidate of equal hash if its bytes are equal too; else, the first earlier
        frame of the batch of equal hash that matched no candidate, if its bytes are equal. (A hash collision
        only costs a duplicate frame.)

    Both searches sort hashes (``O((M + window) log)`` time, ``O(M + window)`` memory), so a write of many
    writers' batches costs what its frames cost, not ``M^2``.
    """
    m, n_ring = frames_in.shape[0], ring.shape[0] - 1
    device = frames_in.device
    idx = torch.arange(m, device=device)
    # the window: candidate k is serial written - 1 - k (most recent first); a stable sort of their hashes keeps
    # equal hashes most recent first, and the written serials (cand_ok) are the most recent ones, so the first
    # candidate of a run of equal hashes is a written one whenever any is
    cand_serial = written - torch.arange(1, window + 1, device=device)  # [W]
    cand_ok = cand_serial >= 0  # unwritten serials are no candidates
    cand_pos = cand_serial.remainder(n_ring)  # [W]
    cand_hash, order = torch.sort(ring_hash[cand_pos], stable=True)  # [W]
    at = torch.searchsorted(cand_hash, hashes_in).clamp_(max=window - 1)  # [M] the first of equal hash, if any
    pick = order[at]  # [M]
    hit = (cand_hash[at] == hashes_in) & cand_ok[pick]
    hit &= (ring[cand_pos[pick]] == frames_in).all(1)  # confirmed byte for byte
    stored_serial = cand_serial[pick]  # [M]

    # the batch: among frames that matched no candidate, group equal hashes (a stable sort by hash, then by hit,
    # keeps each group in batch order); a group's first frame is the root of the others
    by_hash = torch.sort(hashes_in, stable=True).indices
    order = by_hash[torch.sort(hit[by_hash].to(torch.uint8), stable=True).indices]  # unmatched first
    h, matched = hashes_in[order], hit[order]
    starts = torch.ones(m, dtype=torch.bool, device=device)
    starts[1:] = (h[1:] != h[:-1]) | (matched[1:] != matched[:-1])
    group_first = torch.where(starts, idx, 0).cummax(0).values  # [M] position of each sorted frame's group start
    first = torch.empty_like(idx)
    first[order] = order[group_first]  # [M] the first frame (batch order) of its group
    has_root = (first != idx) & ~hit
    has_root &= (frames_in[first] == frames_in).all(1)
    new = ~hit & ~has_root  # [M]
    new_serial = written + torch.cumsum(new, 0) - 1  # [M] (meaningful where new)
    own = torch.where(hit, stored_serial, new_serial)  # [M] roots and matched frames
    return torch.where(has_root, own[first], own), new


def intact(oldest: Tensor, written: Tensor, n_frames: int) -> Tensor:
    """``(N,) bool``: transitions whose oldest frame serial ``oldest`` ``(N,) int64`` is still in a ring of
    ``n_frames`` frames after ``written`` ``() int64`` writes (``oldest >= written - n_frames``)."""
    return oldest >= written - n_frames
