"""FrameStackStorage: transitions of stacked-frame environments with each distinct frame stored once.

An Atari transition holds two stacks of ``S`` 84x84 frames (observation and next observation, 56 KB at
``S = 4``), but consecutive stacks of one environment share ``S - 1`` frames, so a full-stack ring keeps
each frame ``2S`` times. Here every frame goes once into a device ring of frames and each transition keeps
the ring positions of its ``2S`` frames; the batch read rebuilds both stacks in one gather (a Triton
kernel on CUDA, :func:`lightning_per.ops.reference.gather_stacks` elsewhere). The other keys (action,
reward, ...) live in the :class:`GPUTensorStorage` this class extends.

Deduplication is by content (:func:`lightning_per.ops.frames.dedup_frames`): a frame identical to one of
the ``window`` most recently stored frames, or to an earlier frame of the same batch, is not stored again.
It needs no episode or environment bookkeeping, and the stacks come back exactly as they were written, so
an episode start keeps the env's own padding (Gymnasium's ``FrameStackObservation`` repeats the reset
frame, ``padding_type="zero"`` zeros; neither holds frames of the previous episode).

The ring of frames overwrites its oldest frames as new ones come; a transition some of whose frames are
gone is *invalid*: :attr:`slot_valid` ``(max_size,) bool`` on the device says which slots may be sampled,
updated in place by every write without a host synchronisation, and :class:`GPUPrioritizedSampler` reads
it (such slots get no probability mass). With the default ring (``max_size + max_size // 64 + window``
frames) that only happens when episodes are shorter than about 64 steps.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from tensordict import TensorDictBase

from lightning_per.ops import frames as frame_ops
from lightning_per.ops import select_backend
from lightning_per.replay.ring import make_batch, match_pairs
from lightning_per.replay.rows import batch_views, check_dense, last_writes
from lightning_per.replay.slots import cursor_slots
from lightning_per.replay.storage import GPUTensorStorage
from lightning_per.schema import check, stamp

__all__ = ["FrameStackStorage"]

FRAMES_SCHEMA_VERSION = 1
_NEVER = -(1 << 62)  # the oldest-frame serial of a slot never written: never intact

#: The stacked-key layouts ``keys=None`` recognises at the first write, in this order: flat keys, then TorchRL's
#: nested ``"next"`` entry (what its collectors and ``TransformedEnv`` write) of observations and of pixels.
FRAME_LAYOUTS = (("observation", "next_observation"), ("observation", ("next", "observation")),
                 ("pixels", ("next", "pixels")))


class FrameStackStorage(GPUTensorStorage):
    """Ring of transitions whose stacked-frame keys share one device ring of frames, each stored once.

    Args:
        max_size: capacity in transitions (>= 1).
        frame_stack: ``S``, the frames a stack holds: the leading dim of each per-transition stack
            (``observation: (S, 84, 84) uint8``).
        frames: capacity of the ring of frames (default ``max_size + max_size // 64 + window``); must be at
            least ``window + 2 * S * B`` for a write of ``B`` transitions.
        window: how many of the most recently stored frames an incoming frame is compared with (>= 1;
            default 1024, at most half of ``frames`` when that is given).
        keys: the two stacked keys (observation, next observation), nested keys as tuples; None (default):
            the first layout of :data:`FRAME_LAYOUTS` the first write holds, flat
            ``("observation", "next_observation")`` or TorchRL's nested ``("observation", ("next", "observation"))``
            (then :attr:`frame_keys`).
        device, fallback, packed: as :class:`GPUTensorStorage` (the other keys' storage); with ``fallback``
            an out-of-memory at the first write puts frames and transitions on the CPU (one warning).

    Layout (:attr:`layout` ``"frames"``): :attr:`frames` ``(frames + 1, *frame) uint8`` (the last row takes
    discarded writes), :attr:`frame_positions` ``(max_size, 2S) int32`` (observation's frames, then next
    observation's), :attr:`slot_valid` ``(max_size,) bool``, all on :attr:`device`; :attr:`frames_written` ``()
    int64``; the other keys in the :class:`GPUTensorStorage` ring (``ring``).
    ``get(index)`` returns both stacks as ``(B, S, *frame) uint8`` views into one gathered
    ``(B, 2S, *frame)`` block, beside the other keys.

    Raises:
        ValueError: a bad ``max_size``, ``frame_stack``, ``frames``, ``window`` or ``keys`` (named).

    Example::

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from lightning_per import FrameStackStorage
        >>> s = FrameStackStorage(8, frame_stack=2, device="cpu")
        >>> f = torch.arange(4, dtype=torch.uint8).view(4, 1, 1).expand(4, 3, 3)  # frames 0, 1, 2, 3
        >>> td = TensorDict({"observation": torch.stack([f[0:2], f[1:3]]),
        ...                  "next_observation": torch.stack([f[1:3], f[2:4]]),
        ...                  "action": torch.tensor([0, 1])}, batch_size=[2])
        >>> s.set(torch.arange(2), td)
        >>> int(s.frames_written)  # four distinct frames in eight stack positions
        4
        >>> bool((s.get(torch.tensor([1]))["next_observation"] == td["next_observation"][1:]).all())
        True
    """

    def __init__(self, max_size: int, *, frame_stack: int, frames: int | None = None, window: int | None = None,
                 keys: tuple[Any, Any] | None = None, device: torch.device | str | None = None,
                 fallback: bool = True, packed: bool = False) -> None:
        super().__init__(max_size, device=device, fallback=fallback, packed=packed)
        if isinstance(frame_stack, bool) or not isinstance(frame_stack, int) or frame_stack < 1:
            raise ValueError(f"frame_stack must be an int >= 1, got {frame_stack!r}")
        if window is None:
            window = 1024 if frames is None or isinstance(frames, bool) or not isinstance(frames, int) \
                else min(1024, max(1, frames // 2))
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an int >= 1, got {window!r}")
        n_frames = max_size + max_size // 64 + window if frames is None else frames
        if isinstance(n_frames, bool) or not isinstance(n_frames, int) or not window < n_frames < (1 << 31):
            raise ValueError(f"frames must be an int in ({window} (the window), 2^31), got {frames!r}")
        if keys is not None and not (isinstance(keys, (tuple, list)) and len(keys) == 2 and keys[0] != keys[1]):
            raise ValueError(f"keys must be None or two different keys (observation, next observation), got {keys!r}")
        self.frame_stack, self.window, self.n_frames = frame_stack, window, n_frames
        #: the most transitions one write takes: their ``2 * frame_stack`` frames each fit beside the window
        self.write_limit = (n_frames - window) // (2 * frame_stack)
        #: the stacked keys; None until the first write when ``keys=None``
        self.frame_keys = None if keys is None else tuple(tuple(k) if isinstance(k, list) else k for k in keys)
        self.frames: torch.Tensor | None = None  # (F + 1, *frame) uint8
        self.frame_hash: torch.Tensor | None = None  # (F + 1,) int64
        self.frame_positions: torch.Tensor | None = None  # (max_size, 2S) int32
        self.oldest: torch.Tensor | None = None  # (max_size,) int64 serial of each slot's oldest frame
        self.frames_written: torch.Tensor | None = None  # () int64
        self._weights: torch.Tensor | None = None  # (P,) int64 hash weights
        #: the ops backend of the frames' device (:func:`lightning_per.ops.select_backend`; chosen again if the
        #: frames fall back to the CPU): its ``gather_stacks`` rebuilds a batch's stacks
        self.ops = select_backend(torch.device(self.device))
        self.layout = "frames"

    def __setstate__(self, state) -> None:
        """Unpickling (:meth:`GPUTensorStorage.__setstate__`), the ops backend chosen again."""
        super().__setstate__(state)
        self.ops = select_backend(torch.device(self.device) if self.frames is None else self.frames.device)

    # ------------------------------------------------------------------ checks
    def _frame_shape(self) -> tuple[int, ...] | None:
        return None if self.frames is None else tuple(self.frames.shape[1:])

    def _keys_of(self, data: TensorDictBase) -> tuple[Any, Any]:
        """The stacked keys a write of ``data`` uses: :attr:`frame_keys`, or when still None the first layout of
        :data:`FRAME_LAYOUTS` whose keys ``data`` holds.

        Raises:
            ValueError: ``data`` holds none of them (the message names the ``keys=`` that fixes it).
        """
        if self.frame_keys is not None:
            return self.frame_keys
        for keys in FRAME_LAYOUTS:
            if all(isinstance(data.get(k, None), torch.Tensor) for k in keys):
                return keys
        raise ValueError(f"data holds none of the stacked-frame layouts {list(FRAME_LAYOUTS)}; name its two "
                         f"stacked keys: FrameStackStorage(..., keys=(obs_key, next_obs_key)) or "
                         f"make_replay_buffer(..., frame_keys=(obs_key, next_obs_key)), nested keys as tuples")

    def _check_frames(self, data) -> None:
        """Raise if the stacked keys of ``data`` (batch ``[B]``) cannot be written; changes nothing."""
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"data must be a TensorDict with a leading batch dimension, got {type(data).__name__}")
        shape = self._frame_shape()
        keys = self._keys_of(data)
        for key in keys:
            value = data.get(key, None)
            if not isinstance(value, torch.Tensor):
                nested = key == "next_observation" and isinstance(data.get(("next", "observation"), None),
                                                                  torch.Tensor)
                raise ValueError(f"data has no stacked-frame key {key!r} (FrameStackStorage keys={keys})" + (
                    "; it holds TorchRL's nested ('next', 'observation'): pass keys=('observation', ('next', "
                    "'observation')) (make_replay_buffer: frame_keys=...), or leave keys unset to detect it"
                    if nested else ""))
            if value.dtype != torch.uint8:
                raise TypeError(f"data[{key!r}] must hold uint8 frames, got {value.dtype}")
            if value.dim() < 3 or value.shape[1] != self.frame_stack:
                raise ValueError(f"frame_stack={self.frame_stack} does not match data[{key!r}]: per-transition "
                                 f"shape {tuple(value.shape[1:])}, expected ({self.frame_stack}, *frame)")
            if shape is not None and tuple(value.shape[2:]) != shape:
                raise ValueError(f"data[{key!r}] holds frames of shape {tuple(value.shape[2:])}, the storage "
                                 f"holds {shape}")
        if data.batch_dims != 1:
            raise ValueError(f"data must have one batch dimension, got batch_size {tuple(data.batch_size)}")
        incoming = 2 * self.frame_stack * data.batch_size[0]
        if data.batch_size[0] > self.write_limit:
            most = self.write_limit
            raise ValueError(
                f"a write of {data.batch_size[0]} transitions brings up to {incoming} frames (2 x frame_stack="
                f"{self.frame_stack} each), more than the ring of frames={self.n_frames} holds beside its "
                f"window={self.window}: extend in batches of at most {most} transitions, or build the storage "
                f"with frames >= {self.window + incoming} (make_replay_buffer(..., frames={self.window + incoming}))"
                f" or a smaller FrameStackStorage window (nothing was written)")

    def _rest(self, data: TensorDictBase) -> TensorDictBase:
        drop = [k for k in (*self._keys_of(data), "index") if data.get(k, None) is not None]
        return data.exclude(*drop)

    def check_spec(self, data: TensorDictBase) -> None:
        """Raise if a batch ``data`` cannot be written, changing nothing: the stacked keys must be
        ``(B, frame_stack, *frame) uint8`` (the frame shape of earlier writes), the others as
        :meth:`GPUTensorStorage.check_spec`.

        Raises:
            TypeError: ``data`` is not a TensorDict; a stacked key is not uint8; another key's dtype; a leaf not
                dense and strided (sparse).
            ValueError: a stacked key missing or of another stack size or frame shape; other keys; a leaf on the
                ``"meta"`` device.
        """
        if isinstance(data, TensorDictBase):  # the stacked keys; super() checks the others (not a TensorDict: below)
            check_dense(data.select(*self._keys_of(data), strict=False))
        self._check_frames(data)
        super().check_spec(self._rest(data))

    # ------------------------------------------------------------------ allocation
    def _allocate_frames(self, frame: tuple[int, ...], device: torch.device) -> None:
        f, n = self.n_frames, self.max_size
        self.frames = torch.zeros((f + 1, *frame), dtype=torch.uint8, device=device)
        self.frame_hash = torch.zeros(f + 1, dtype=torch.int64, device=device)
        self.frame_positions = torch.zeros((n, 2 * self.frame_stack), dtype=torch.int32, device=device)
        self.oldest = torch.full((n,), _NEVER, dtype=torch.int64, device=device)
        self.frames_written = torch.zeros((), dtype=torch.int64, device=device)
        self.slot_valid = torch.zeros(n, dtype=torch.bool, device=device)
        pixels = 1
        for d in frame:
            pixels *= d
        self._weights = frame_ops.hash_weights(pixels, device)
        self.ops = select_backend(device)

    def _ensure_frames(self, frame: tuple[int, ...]) -> None:
        if self.frames is not None:
            return
        try:
            self._allocate_frames(frame, torch.device(self.device))
        except torch.OutOfMemoryError:
            if not self.fallback:
                raise
            self.frames = self.frame_hash = self.frame_positions = self.oldest = None
            torch.cuda.empty_cache()
            warnings.warn(f"FrameStackStorage: out of memory allocating {self.n_frames} frames of {frame} on "
                          f"{self.device}; keeping the replay data on the CPU instead (PinnedHostStorage keeps "
                          f"transitions in host memory with sampling on the GPU)", RuntimeWarning, stacklevel=4)
            self.device = torch.device("cpu")
            self._allocate_frames(frame, self.device)

    def write_example(self) -> dict[Any, torch.Tensor] | None:
        """One stored transition ``{key: (1, ...) tensor}`` of the layout a write takes: the other keys'
        (:meth:`GPUTensorStorage.write_example`) and both stacked keys, ``(1, frame_stack, *frame) uint8`` (views
        of the ring of frames on :attr:`device`, values unspecified); None before the first write.

        Example::

            >>> import torch
            >>> from tensordict import TensorDict
            >>> from lightning_per import FrameStackStorage
            >>> s = FrameStackStorage(8, frame_stack=2, device="cpu")
            >>> s.set(torch.arange(1), TensorDict({"observation": torch.zeros(1, 2, 3, 3, dtype=torch.uint8),
            ...                                    "next_observation": torch.ones(1, 2, 3, 3, dtype=torch.uint8),
            ...                                    "action": torch.zeros(1)}, [1]))
            >>> {k: tuple(v.shape) for k, v in s.write_example().items()}
            {'action': (1,), 'observation': (1, 2, 3, 3), 'next_observation': (1, 2, 3, 3)}
        """
        rest = super().write_example()
        if rest is None or self.frames is None:
            return None
        example = dict(rest.items(include_nested=True, leaves_only=True))  # a new dict: the storage is untouched
        stack = self.frames[:1].unsqueeze(1).expand(1, self.frame_stack, *self.frames.shape[1:])  # [1, S, *frame]
        for key in self.frame_keys:
            example[key] = stack
        return example

    @property
    def nbytes(self) -> int:
        """Bytes held by the frames, their bookkeeping and the other keys (0 before the first write)."""
        if self.frames is None:
            return 0
        own = (self.frames, self.frame_hash, self.frame_positions, self.oldest, self.slot_valid)
        return super().nbytes + sum(t.numel() * t.element_size() for t in own)

    # ------------------------------------------------------------------ writes
    def set(self, cursor, data, *, set_cursor: bool = True) -> None:
        """Write transitions ``data`` (batch ``[B]``) at slots ``cursor``: new frames into the ring of frames,
        their positions and the other keys into the slots; then :attr:`slot_valid` is refreshed.

        Raises:
            As :meth:`check_spec`, before anything changes.
        """
        if isinstance(data, TensorDictBase) and data.batch_dims == 0:
            data = data.unsqueeze(0)
            cursor = torch.as_tensor([cursor]) if isinstance(cursor, int) else cursor
        self.check_spec(data)
        if data.batch_size[0] == 0:  # nothing to write (TorchRL's storages write nothing for an empty batch)
            return
        self.frame_keys = self._keys_of(data)  # checked: the layout this storage keeps from now on
        obs, nxt = (data.get(k) for k in self.frame_keys)
        self._ensure_frames(tuple(obs.shape[2:]))
        device = self.frames.device
        b, s = obs.shape[0], self.frame_stack
        incoming = torch.cat((obs, nxt), 1).to(device, non_blocking=True).reshape(2 * s * b, -1)  # [M, P]
        hashes = frame_ops.hash_frames(incoming, self._weights)  # [M]
        ring = self.frames.view(self.frames.shape[0], -1)  # [F + 1, P]
        serial, new = frame_ops.dedup_frames(incoming, hashes, ring, self.frame_hash, self.frames_written,
                                             self.window)
        dest = torch.where(new, serial.remainder(self.n_frames), self.n_frames)  # [M] discarded: row F
        ring.index_copy_(0, dest, incoming)
        self.frame_hash.index_copy_(0, dest, hashes)
        serial = serial.view(b, 2 * s)  # [B, 2S]
        positions = serial.remainder(self.n_frames).to(torch.int32)
        oldest = serial.amin(1)  # [B]

        rest = self._rest(data)
        if not self.initialized:
            self._init(rest[0])
        slots = cursor_slots(cursor, self.max_size, device)
        if slots.shape[0] != b:
            raise RuntimeError(f"cursor names {slots.shape[0]} slots for a batch of {b} transitions")
        # the other keys (checked above) through GPUTensorStorage's write path
        self.write_direct(slots, match_pairs(self.ring, rest), set_cursor=set_cursor)
        if slots.shape[0] > self.max_size:  # a batch longer than the ring: each slot keeps its last write
            last = last_writes(slots, self.max_size)
            slots, positions, oldest = slots[last], positions[last], oldest[last]
        self.frame_positions[slots] = positions
        self.oldest[slots] = oldest
        self.frames_written += new.sum()
        self._refresh_valid()

    def _refresh_valid(self) -> None:
        torch.ge(self.oldest, self.frames_written - self.n_frames, out=self.slot_valid)

    # ------------------------------------------------------------------ reads
    def read(self, index, extra: dict[str, torch.Tensor] | None = None):
        """The read path: the transitions at slots ``index`` (a ``(B,)`` int64 tensor, or a 0-d one for one
        transition), the other keys as :meth:`GPUTensorStorage.read` reads them and both stacks, ``(B, S, *frame)
        uint8`` views into one gathered ``(B, 2S, *frame)`` block (one kernel on CUDA), plus ``extra``.

        Raises:
            RuntimeError: nothing was ever written.
        """
        if self.frames is None:
            raise RuntimeError("Cannot read from an empty FrameStackStorage: extend it first")
        device = self.frames.device
        if not isinstance(index, torch.Tensor):
            index = torch.as_tensor(index, dtype=torch.int64)
        squeeze = index.dim() == 0
        index = index.reshape(-1).to(device, non_blocking=True)
        if index.dtype != torch.int64:
            index = index.to(torch.int64)
        stacks = self.ops.gather_stacks(self.frames, self.frame_positions, index)  # [B, 2S, *frame]
        s = self.frame_stack
        obs, nxt = stacks[:, :s], stacks[:, s:]  # [B, S, *frame] views
        ring = self.ring
        if ring.flat is not None and all(isinstance(k, str) for k in self.frame_keys) and all(
                isinstance(v, torch.Tensor) and v.device == device and v.shape == index.shape
                for v in (extra or {}).values()):
            # one TensorDict of every field (the shapes are ours): the other keys as GPUTensorStorage reads them
            fields = (batch_views(ring.rows[index], ring.layout, ring.plan) if ring.rows is not None
                      else {k: v[index] for k, v in ring.flat.items()})
            fields[self.frame_keys[0]], fields[self.frame_keys[1]] = obs, nxt
            if extra:
                fields.update(extra)
            batch = make_batch(ring, fields, index.shape)
        else:
            batch = super().read(index, extra)
            batch.set(self.frame_keys[0], obs)
            batch.set(self.frame_keys[1], nxt)
        return batch[0] if squeeze else batch

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        """:meth:`GPUTensorStorage.state_dict` of the other keys, plus ``"frame_ring"``: the frames, their
        hashes, each slot's positions and oldest serial, the frames written, ``frame_stack`` and sizes."""
        state = super().state_dict()
        ring = None
        if self.frames is not None:
            ring = stamp({"frame_stack": self.frame_stack, "n_frames": self.n_frames, "window": self.window,
                          "frames": self.frames[:-1], "frame_hash": self.frame_hash[:-1],
                          "frame_positions": self.frame_positions, "oldest": self.oldest,
                          "frames_written": self.frames_written,
                          "frame_keys": [list(k) if isinstance(k, tuple) else k for k in self.frame_keys]},
                         "frame_ring", FRAMES_SCHEMA_VERSION)
        state["frame_ring"] = ring
        return state

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raise what :meth:`load_state_dict` refuses, changing nothing: :meth:`GPUTensorStorage.check_state_dict`,
        a missing, newer or differently sized ring of frames (``frame_stack``, ``frames``, frame shape).

        Raises:
            ValueError: the checkpoint is refused (the message names why).
        """
        super().check_state_dict(state_dict)
        if "frame_ring" not in state_dict:
            raise ValueError("storage checkpoint has no frame_ring: it was not saved by a FrameStackStorage")
        ring = state_dict["frame_ring"]
        if ring is None:
            return
        if not isinstance(ring, dict):
            raise ValueError(f"storage checkpoint's frame_ring must be a dict, got {type(ring).__name__}")
        check(ring, "frame_ring", FRAMES_SCHEMA_VERSION, missing=FRAMES_SCHEMA_VERSION, label="frame_ring schema")
        if ring.get("frame_stack") != self.frame_stack:
            raise ValueError(f"the saved storage stacks frame_stack={ring.get('frame_stack')!r} frames, this "
                             f"one frame_stack={self.frame_stack}")
        saved = _saved_keys(ring)
        if self.frame_keys is not None and saved != self.frame_keys:
            raise ValueError(f"the saved storage stacks the keys {saved}, this one keys={self.frame_keys}")
        if ring.get("n_frames") != self.n_frames:
            raise ValueError(f"the saved storage holds frames={ring.get('n_frames')!r}, this one "
                             f"frames={self.n_frames}")
        want = {"frames": (torch.uint8, None), "frame_hash": (torch.int64, (self.n_frames,)),
                "frame_positions": (torch.int32, (self.max_size, 2 * self.frame_stack)),
                "oldest": (torch.int64, (self.max_size,)), "frames_written": (torch.int64, ())}
        for key, (dtype, shape) in want.items():
            t = ring.get(key)
            if not isinstance(t, torch.Tensor) or t.dtype != dtype or (shape is not None and tuple(t.shape) != shape):
                raise ValueError(f"storage checkpoint's frame_ring[{key!r}] must be a {dtype} tensor of shape "
                                 f"{shape if shape is not None else '(frames, *frame)'}, got "
                                 f"{getattr(t, 'dtype', None)} {tuple(getattr(t, 'shape', ()))}")
        frames = ring["frames"]
        have = self._frame_shape()
        if (frames.dim() < 2 or frames.shape[0] != self.n_frames
                or (have is not None and tuple(frames.shape[1:]) != have)):
            raise ValueError(f"storage checkpoint's frames have shape {tuple(frames.shape)}, expected "
                             f"({self.n_frames}, *{have or 'frame'})")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state from :meth:`state_dict`.

        Raises:
            ValueError: as :meth:`check_state_dict`, before anything changes.
        """
        self.check_state_dict(state_dict)
        self._load({k: v for k, v in state_dict.items() if k != "frame_ring"})
        ring = state_dict["frame_ring"]
        if ring is None:
            return
        self.frame_keys = _saved_keys(ring)
        self._ensure_frames(tuple(ring["frames"].shape[1:]))
        self.frames[:-1].copy_(ring["frames"])
        self.frame_hash[:-1].copy_(ring["frame_hash"])
        self.frame_positions.copy_(ring["frame_positions"])
        self.oldest.copy_(ring["oldest"])
        self.frames_written.copy_(ring["frames_written"])
        self._refresh_valid()


def _saved_keys(ring: dict[str, Any]) -> tuple[Any, Any]:
    """The stacked keys a saved ring of frames was written with (nested keys saved as lists); a ring saved
    before the keys were recorded used the flat ones.

    Raises:
        ValueError: the saved keys are not two keys.
    """
    keys = ring.get("frame_keys", FRAME_LAYOUTS[0])
    if not (isinstance(keys, (list, tuple)) and len(keys) == 2
            and all(isinstance(k, str) or (isinstance(k, (list, tuple)) and all(isinstance(p, str) for p in k))
                    for k in keys)):
        raise ValueError(f"storage checkpoint's frame_ring['frame_keys'] must be two keys, got {keys!r}")
    return tuple(tuple(k) if isinstance(k, list) else k for k in keys)
