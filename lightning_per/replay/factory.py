"""make_replay_buffer: one call that builds a replay buffer of our storage, sampler and writer."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torchrl.data.replay_buffers.samplers import PrioritizedSampler, Sampler

from lightning_per.replay.buffer import (
    PRIORITIZED,
    SAMPLERS,
    GPUPrioritizedReplayBuffer,
    GPUReplayBuffer,
    build_sampler,
    check_prioritized_sampler,
)
from lightning_per.replay.compat import buffer_parts
from lightning_per.replay.errors import check_batch_size, check_bool, check_capacity, check_generator, check_seed
from lightning_per.replay.frames import FrameStackStorage
from lightning_per.replay.host import PinnedHostStorage
from lightning_per.replay.prioritized import GPUPrioritizedSampler
from lightning_per.replay.random import GPURandomSampler
from lightning_per.replay.slice import GPUSliceSampler
from lightning_per.replay.storage import GPUTensorStorage, resolve_device
from lightning_per.replay.writer import GPURoundRobinWriter

__all__ = ["make_replay_buffer"]

#: Sampler constructor parameters that make_replay_buffer sets itself (not accepted in **sampler_kwargs).
_SET_BY_FACTORY = {"self", "max_capacity", "alpha", "beta", "eps", "device"}


def make_replay_buffer(capacity: int, batch_size: int, *, sampler: str | Sampler = "proportional",
                       device: torch.device | str | None = None, alpha: float | None = None,
                       beta: float | None = None, eps: float | None = None, generator: torch.Generator | None = None,
                       priority_key: str = "td_error", fallback: bool = True, packed: bool = False,
                       frame_stack: int | None = None, frames: int | None = None, pinned_host: bool = False,
                       frame_keys: tuple[Any, Any] | None = None, backpressure: str = "block",
                       backpressure_timeout: float = 30.0, samples_per_insert: float | None = None,
                       **sampler_kwargs) -> GPUPrioritizedReplayBuffer | GPUReplayBuffer:
    """A replay buffer of ``capacity`` transitions on ``device`` with one of our samplers.

    Args:
        capacity: slots (>= 1).
        batch_size: default batch of ``sample()`` (>= 1).
        sampler: as in TorchRL, a sampler instance (ours or TorchRL's, of ``capacity`` slots where it has a
            capacity), or the name of one built here: ``"proportional"``, ``"rank"``, ``"uniform"``, ``"slice"``
            (:class:`GPUSliceSampler`) or ``"prioritized_slice"`` (:class:`GPUPrioritizedSliceSampler`); the slice
            samplers take ``slice_len`` or ``num_slices`` and their other options through ``**sampler_kwargs``.
        device: default the sampler instance's device, else CUDA when available, else CPU.
        alpha, beta, eps: PER exponents and offset of a sampler built by name (default 0.6, 0.4, 1e-6; ignored by
            ``"uniform"`` and ``"slice"``); with a prioritized instance left unset or equal to its own.
        generator: the buffer's ``torch.Generator`` (reproducible draws; see ``set_rng``). Given, it draws every
            sample and a ``seed`` in ``sampler_kwargs`` has no effect on the draws.
        priority_key: key of raw priorities read by ``update_tensordict_priority``.
        fallback: on CUDA OOM at allocation use the CPU (one warning) instead of raising.
        packed: store each transition as one row (:class:`GPUTensorStorage` ``packed=True``): a batch read
            is one gather kernel whatever the number of keys (then one copy that gives each field its own
            contiguous tensor: the batch saves and views like an unpacked one).
        frame_stack: store the stacked-frame ``frame_keys`` with each frame once
            (:class:`~lightning_per.replay.frames.FrameStackStorage` of ``frame_stack`` frames a stack and a ring
            of ``frames`` frames); needs ``sampler="proportional"`` (it masks slots whose frames are gone).
        frames, frame_keys: the ring of frames' capacity and the two stacked keys (with ``frame_stack`` only;
            ``frame_keys=None`` finds flat ``("observation", "next_observation")`` or TorchRL's nested
            ``("observation", ("next", "observation"))`` at the first write: ``FrameStackStorage`` ``keys``).
        pinned_host: keep the transitions in page-locked host memory
            (:class:`~lightning_per.replay.host.PinnedHostStorage`; priorities, draws and the batch on
            ``device``): for buffers larger than the GPU.
        backpressure, backpressure_timeout: what a writer of another process (``rb.writer_handle()``) does when
            its ring is full: ``"block"`` up to the timeout (seconds), or ``"drop_oldest"``.
        samples_per_insert: optional sample-to-insert ratio limit (TorchRL 0.15's semantics,
            :class:`~lightning_per.replay.rate.SamplesPerInsert`; the buffer's ``rate_limit``).
        **sampler_kwargs: ``stratified``, ``shuffle_strata``, ``weight_normalization``, ``sort_every``,
            ``backend``, ``seed``, ``eager_graphs``, ``reduction`` (TorchRL's, over a stored item's extra dims;
            default ``"max"``); ``"uniform"`` takes ``seed`` and ``eager_graphs`` only; for the slice samplers
            ``slice_len`` / ``num_slices``, ``end_key``, ``end_keys``, ``traj_key``, ``strict_length``,
            ``truncated_key``, ``init_key``, ``span``, ``slice_priority``.

    Returns:
        :class:`GPUPrioritizedReplayBuffer` for ``"proportional"``, ``"rank"`` and ``"prioritized_slice"`` and
        prioritized instances, else :class:`GPUReplayBuffer` (TorchRL's ``TensorDictReplayBuffer``) with
        :class:`GPURandomSampler` (``"uniform"``), :class:`GPUSliceSampler` (``"slice"``) or the instance. All
        sample TensorDicts ``[B]`` on the device with ``"index"``; prioritized ones add ``"priority_weight"``.

    Raises:
        ValueError: an unknown ``sampler``, a size, seed, device, ``eps`` or exponent out of range, ``frames`` /
            ``frame_keys`` without ``frame_stack``, or an instance whose capacity, device, alpha, beta or eps
            differs from the one given (named in the message).
        TypeError: a keyword the chosen sampler does not take (the message lists the ones it does; an instance
            takes none), a ``sampler`` that is neither a name nor a TorchRL sampler, or a flag
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
        >>> from lightning_per import GPURandomSampler, GPUReplayBuffer
        >>> rb = make_replay_buffer(1000, 32, sampler=GPURandomSampler(device="cpu", seed=0))
        >>> isinstance(rb, GPUReplayBuffer), rb.storage.device
        (True, device(type='cpu'))
    """
    check_capacity("capacity", capacity)
    check_batch_size(batch_size)
    check_generator(generator)
    check_seed(sampler_kwargs.get("seed"))
    rate = {} if samples_per_insert is None else {"samples_per_insert": samples_per_insert}
    for name, flag in (("fallback", fallback), ("packed", packed), ("pinned_host", pinned_host)):
        check_bool(name, flag)
    if frame_stack is None and (frames is not None or frame_keys is not None):
        given = "frames" if frames is not None else "frame_keys"
        raise ValueError(f"{given} configures the frame ring of a frame_stack buffer: give frame_stack (frames a "
                         f"stack) too, or leave {given} unset")
    named = isinstance(sampler, str)
    if not named:
        _check_instance(sampler, capacity, sampler_kwargs, alpha=alpha, beta=beta, eps=eps)
        if device is None and isinstance(sampler, (*PRIORITIZED, GPURandomSampler, GPUSliceSampler)):
            device = sampler.device
    alpha, beta, eps = (0.6 if alpha is None else alpha), (0.4 if beta is None else beta), \
        (1e-6 if eps is None else eps)
    device = resolve_device(device)
    if pinned_host:
        if frame_stack is not None:
            raise ValueError("pinned_host=True and frame_stack: choose one storage")
        storage = PinnedHostStorage(capacity, device=device)
    elif frame_stack is None:
        storage = GPUTensorStorage(capacity, device=device, fallback=fallback, packed=packed)
    else:
        if sampler != "proportional" and not isinstance(sampler, GPUPrioritizedSampler):
            raise ValueError(f"frame_stack needs sampler='proportional' or a GPUPrioritizedSampler (its draws skip "
                             f"transitions whose frames the ring overwrote), got sampler={sampler!r}")
        storage = FrameStackStorage(capacity, frame_stack=frame_stack, frames=frames, keys=frame_keys,
                                    device=device, fallback=fallback, packed=packed)
    if not named:
        if isinstance(sampler, PRIORITIZED):
            return GPUPrioritizedReplayBuffer(storage=storage, device=device, sampler=sampler, batch_size=batch_size,
                                              generator=generator, priority_key=priority_key,
                                              backpressure=backpressure, backpressure_timeout=backpressure_timeout)
        return GPUReplayBuffer(storage=storage, sampler=sampler, writer=GPURoundRobinWriter(), batch_size=batch_size,
                               generator=generator, priority_key=priority_key, backpressure=backpressure,
                               backpressure_timeout=backpressure_timeout)
    if sampler == "slice":
        options = sorted(_init_options(GPUSliceSampler) - {"capacity", "device"})
        unknown = sorted(set(sampler_kwargs) - set(options))
        if unknown:
            raise TypeError(f"make_replay_buffer got unexpected keyword arguments {unknown} for sampler='slice'; "
                            f"its options are {options}")
        slicer = build_sampler(GPUSliceSampler, capacity, device, **sampler_kwargs)
        slicer.spec.shape(batch_size)  # a batch_size the slices cannot divide fails here, not at sample()
        return GPUReplayBuffer(storage=storage, sampler=slicer, writer=GPURoundRobinWriter(),
                                       batch_size=batch_size, generator=generator, priority_key=priority_key,
                                       backpressure=backpressure, backpressure_timeout=backpressure_timeout, **rate)
    if sampler == "uniform":
        unknown = sorted(set(sampler_kwargs) - {"seed", "eager_graphs"})
        if unknown:
            raise TypeError(f"make_replay_buffer got unexpected keyword arguments {unknown} for sampler='uniform'; "
                            f"its options are ['eager_graphs', 'seed']")
        seed = sampler_kwargs.pop("seed", None)
        check_bool("eager_graphs", sampler_kwargs.pop("eager_graphs", True))  # accepted, as for the other
        # samplers: nothing to serve here
        rb = GPUReplayBuffer(storage=storage, sampler=build_sampler(GPURandomSampler, capacity, device,
                                                                            seed=seed),
                                     writer=GPURoundRobinWriter(), batch_size=batch_size,
                                     generator=generator, priority_key=priority_key,
                                     backpressure=backpressure, backpressure_timeout=backpressure_timeout, **rate)
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
                                    backpressure=backpressure, backpressure_timeout=backpressure_timeout, **rate)
    if sampler == "prioritized_slice":
        buffer_parts(rb).sampler.spec.shape(batch_size)  # as for "slice": the batch must split into slices
    return rb


def _check_instance(sampler, capacity: int, sampler_kwargs: dict[str, Any], *, alpha, beta, eps) -> None:
    """Raise unless ``sampler``, given to :func:`make_replay_buffer` as an instance, can serve a buffer of
    ``capacity`` slots with nothing else to configure.

    Raises:
        TypeError: not a TorchRL sampler (a prioritized one: not ours either); ``sampler_kwargs`` given.
        ValueError: a prioritized sampler of another capacity, alpha, beta or eps.
    """
    if not isinstance(sampler, Sampler):
        raise TypeError(f"sampler must be one of {sorted([*SAMPLERS, 'slice', 'uniform'])} or a TorchRL sampler "
                        f"instance (e.g. GPUPrioritizedSampler(capacity, alpha, beta)), got {sampler!r}")
    if sampler_kwargs:
        raise TypeError(f"make_replay_buffer got sampler options {sorted(sampler_kwargs)} with a sampler instance "
                        f"({type(sampler).__name__}): they configure a sampler built by name; set them on the "
                        f"instance")
    if isinstance(sampler, PrioritizedSampler):
        check_prioritized_sampler(sampler, alpha=alpha, beta=beta, eps=eps, reduction=None, capacity=capacity)
    elif alpha is not None or beta is not None or eps is not None:
        raise ValueError(f"alpha, beta and eps are PER settings; the {type(sampler).__name__} given has no "
                         f"priorities: leave them unset")


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

