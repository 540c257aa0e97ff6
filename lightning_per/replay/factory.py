"""make_replay_buffer: one call that builds a replay buffer of our storage, sampler and writer."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torchrl.data import TensorDictReplayBuffer

from lightning_per.replay.buffer import (
    SAMPLERS,
    GPUPrioritizedReplayBuffer,
    _GPUUniformReplayBuffer,
    build_sampler,
)
from lightning_per.replay.compat import buffer_parts
from lightning_per.replay.errors import check_batch_size, check_bool, check_capacity, check_generator, check_seed
from lightning_per.replay.frames import FrameStackStorage
from lightning_per.replay.host import PinnedHostStorage
from lightning_per.replay.random import GPURandomSampler
from lightning_per.replay.slice import GPUSliceSampler
from lightning_per.replay.storage import GPUTensorStorage, resolve_device
from lightning_per.replay.writer import GPURoundRobinWriter

__all__ = ["make_replay_buffer"]

#: ``frame_keys``' default: the stacked keys of a ``frame_stack`` buffer.
_FRAME_KEYS = ("observation", "next_observation")

#: Sampler constructor parameters that make_replay_buffer sets itself (not accepted in **sampler_kwargs).
_SET_BY_FACTORY = {"self", "max_capacity", "alpha", "beta", "eps", "device"}


def make_replay_buffer(capacity: int, batch_size: int, *, sampler: str = "proportional",
                       device: torch.device | str | None = None, alpha: float = 0.6, beta: float = 0.4,
                       eps: float = 1e-6, generator: torch.Generator | None = None,
                       priority_key: str = "td_error", fallback: bool = True, packed: bool = False,
                       frame_stack: int | None = None, frames: int | None = None, pinned_host: bool = False,
                       frame_keys: tuple[Any, Any] = _FRAME_KEYS, backpressure: str = "block",
                       backpressure_timeout: float = 30.0, **sampler_kwargs) -> TensorDictReplayBuffer:
    """A replay buffer of ``capacity`` transitions on ``device`` with one of our samplers.

    Args:
        capacity: slots (>= 1).
        batch_size: default batch of ``sample()`` (>= 1).
        sampler: ``"proportional"``, ``"rank"``, ``"uniform"``, ``"slice"`` (:class:`GPUSliceSampler`) or
            ``"prioritized_slice"`` (:class:`GPUPrioritizedSliceSampler`); the slice samplers take
            ``slice_len`` or ``num_slices`` and their other options through ``**sampler_kwargs``.
        device: default CUDA when available, else CPU.
        alpha, beta, eps: PER exponents and offset (ignored by ``"uniform"``).
        generator: the buffer's ``torch.Generator`` (reproducible draws; see ``set_rng``).
        priority_key: key of raw priorities read by ``update_tensordict_priority``.
        fallback: on CUDA OOM at allocation use the CPU (one warning) instead of raising.
        packed: store each transition as one row (:class:`GPUTensorStorage` ``packed=True``): a batch read
            is one gather kernel whatever the number of keys, and the batch's fields are views into it
            (``torch.save`` of a batch needs ``.clone()`` first). For learners that consume batches at once.
        frame_stack: store the stacked-frame ``frame_keys`` with each frame once
            (:class:`~lightning_per.replay.frames.FrameStackStorage` of ``frame_stack`` frames a stack and a ring
            of ``frames`` frames); needs ``sampler="proportional"`` (it masks slots whose frames are gone).
        frames, frame_keys: the ring of frames' capacity and the two stacked keys (with ``frame_stack`` only).
        pinned_host: keep the transitions in page-locked host memory
            (:class:`~lightning_per.replay.host.PinnedHostStorage`; priorities, draws and the batch on
            ``device``): for buffers larger than the GPU.
        backpressure, backpressure_timeout: what a writer of another process (``rb.writer_handle()``) does when
            its ring is full: ``"block"`` up to the timeout (seconds), or ``"drop_oldest"``.
        **sampler_kwargs: ``stratified``, ``shuffle_strata``, ``weight_normalization``, ``sort_every``,
            ``backend``, ``seed``, ``eager_graphs``, ``reduction`` (TorchRL's, over a stored item's extra dims;
            default ``"max"``); ``"uniform"`` takes ``seed`` and ``eager_graphs`` only; for the slice samplers
            ``slice_len`` / ``num_slices``, ``end_key``, ``end_keys``, ``traj_key``, ``strict_length``,
            ``truncated_key``, ``init_key``, ``span``, ``slice_priority``.

    Returns:
        :class:`GPUPrioritizedReplayBuffer` for ``"proportional"``, ``"rank"`` and ``"prioritized_slice"`` (with
        :class:`GPUPrioritizedSliceSampler`), else a TorchRL ``TensorDictReplayBuffer`` with
        :class:`GPURandomSampler` (``"uniform"``) or :class:`GPUSliceSampler` (``"slice"``). All sample
        TensorDicts ``[B]`` on the device with ``"index"``; prioritized ones add ``"priority_weight"``.

    Raises:
        ValueError: an unknown ``sampler``, a size, seed, device, ``eps`` or exponent out of range, or ``frames`` /
            ``frame_keys`` without ``frame_stack`` (named in the message).
        TypeError: a keyword the chosen sampler does not take (the message lists the ones it does), or a flag
            (``packed``, ``fallback``, ``pinned_host``, ``stratified``, ...) that is not a bool.

    Example::

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from lightning_per import make_replay_buffer
        >>> rb = make_replay_buffer(1000, 32, sampler="proportional", device="cpu", packed=True, seed=0)
        >>> _ = rb.extend(TensorDict({"observation": torch.randn(100, 4), "reward": torch.randn(100)}, [100]))
        >>> batch = rb.sample()
        >>> tuple(batch["observation"].shape), batch["priority_weight"].dtype
        ((32, 4), torch.float32)
        >>> rb.update_priority(batch["index"], batch["reward"].abs())
    """
    check_capacity("capacity", capacity)
    check_batch_size(batch_size)
    check_generator(generator)
    check_seed(sampler_kwargs.get("seed"))
    for name, flag in (("fallback", fallback), ("packed", packed), ("pinned_host", pinned_host)):
        check_bool(name, flag)
    if frame_stack is None and (frames is not None or frame_keys != _FRAME_KEYS):
        given = "frames" if frames is not None else "frame_keys"
        raise ValueError(f"{given} configures the frame ring of a frame_stack buffer: give frame_stack (frames a "
                         f"stack) too, or leave {given} unset")
    device = resolve_device(device)
    if pinned_host:
        if frame_stack is not None:
            raise ValueError("pinned_host=True and frame_stack: choose one storage")
        storage = PinnedHostStorage(capacity, device=device)
    elif frame_stack is None:
        storage = GPUTensorStorage(capacity, device=device, fallback=fallback, packed=packed)
    else:
        if sampler != "proportional":
            raise ValueError(f"frame_stack needs sampler='proportional' (its draws skip transitions whose frames "
                             f"the ring overwrote), got sampler={sampler!r}")
        storage = FrameStackStorage(capacity, frame_stack=frame_stack, frames=frames, keys=frame_keys,
                                    device=device, fallback=fallback, packed=packed)
    if sampler == "slice":
        options = sorted(_init_options(GPUSliceSampler) - {"capacity", "device"})
        unknown = sorted(set(sampler_kwargs) - set(options))
        if unknown:
            raise TypeError(f"make_replay_buffer got unexpected keyword arguments {unknown} for sampler='slice'; "
                            f"its options are {options}")
        slicer = build_sampler(GPUSliceSampler, capacity, device, **sampler_kwargs)
        slicer.spec.shape(batch_size)  # a batch_size the slices cannot divide fails here, not at sample()
        return _GPUUniformReplayBuffer(storage=storage, sampler=slicer, writer=GPURoundRobinWriter(),
                                       batch_size=batch_size, generator=generator, priority_key=priority_key,
                                       backpressure=backpressure, backpressure_timeout=backpressure_timeout)
    if sampler == "uniform":
        unknown = sorted(set(sampler_kwargs) - {"seed", "eager_graphs"})
        if unknown:
            raise TypeError(f"make_replay_buffer got unexpected keyword arguments {unknown} for sampler='uniform'; "
                            f"its options are ['eager_graphs', 'seed']")
        seed = sampler_kwargs.pop("seed", None)
        check_bool("eager_graphs", sampler_kwargs.pop("eager_graphs", True))  # accepted, as for the other
        # samplers: nothing to serve here
        rb = _GPUUniformReplayBuffer(storage=storage, sampler=build_sampler(GPURandomSampler, capacity, device,
                                                                            seed=seed),
                                     writer=GPURoundRobinWriter(), batch_size=batch_size,
                                     generator=generator, priority_key=priority_key,
                                     backpressure=backpressure, backpressure_timeout=backpressure_timeout)
        return rb
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler must be 'proportional', 'rank', 'uniform', 'slice' or 'prioritized_slice', "
                         f"got {sampler!r}")
    options = sorted(_init_options(SAMPLERS[sampler]) - _SET_BY_FACTORY)
    unknown = sorted(set(sampler_kwargs) - set(options))
    if unknown:
        raise TypeError(f"make_replay_buffer got unexpected keyword arguments {unknown} for sampler={sampler!r}; "
                        f"its options are {options}")
    reduction = sampler_kwargs.pop("reduction", "max")  # the buffer's own argument (it reduces before the sampler)
    rb = GPUPrioritizedReplayBuffer(alpha=alpha, beta=beta, eps=eps, storage=storage, device=device,
                                    sampler=sampler, sampler_kwargs=sampler_kwargs, batch_size=batch_size,
                                    generator=generator, priority_key=priority_key, reduction=reduction,
                                    backpressure=backpressure, backpressure_timeout=backpressure_timeout)
    if sampler == "prioritized_slice":
        buffer_parts(rb).sampler.spec.shape(batch_size)  # as for "slice": the batch must split into slices
    return rb


def _init_options(cls: type) -> set[str]:
    """Keyword names ``cls(...)`` accepts: its ``__init__``'s named parameters, plus those of the next
    ``__init__`` up the MRO as long as the current one forwards ``**kwargs`` (e.g. the rank sampler's
    ``sort_every`` and the proportional sampler's options)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(klass.__init__).parameters.values()
        names |= {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self"}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names

