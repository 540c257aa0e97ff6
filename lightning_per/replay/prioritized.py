"""GPUPrioritizedSampler: proportional prioritized replay kept entirely on the storage's device.

Proportional PER (Schaul et al. 2016, arXiv:1511.05952, section 3.3): ``P(i) = p_i^a / sum_k p_k^a``
with stored value ``(p_i + eps)^alpha`` (TorchRL's convention) and IS weights
``w_i = (P(i) / min_j P(j))^-beta`` (section 3.4, normalised over the filled buffer, or over the
batch as an option). Priorities live in a two-level flat array (see :mod:`lightning_per.ops.reference`):
a draw costs one scan over ``sqrt(N)`` block sums and one over a ``sqrt(N)`` block; an update
recomputes only the touched blocks *from their leaves* (no float drift, ever).

No method here synchronises with the host: ``len(storage)`` is a host int, every tensor op stays on
the device, and invalid input that can only be seen on the device is neutralised and counted instead
of raising (see :meth:`GPUPrioritizedSampler.update_priority`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchrl.data.replay_buffers.samplers import PrioritizedSampler

from lightning_per.graphs.protocol import CapturableSampler, SamplerCapture
from lightning_per.replay import priority, sampler_checkpoint
from lightning_per.replay.adapter import (
    capture_view,
    checked_update,
    draw,
    draw_gather,
    dump,
    mark_written,
    max_priority,
    new_core,
)
from lightning_per.replay.errors import check_bool, check_kind, check_reduction
from lightning_per.replay.rules import Proportional

__all__ = ["GPUPrioritizedSampler"]


class GPUPrioritizedSampler(PrioritizedSampler):
    """Proportional prioritized sampler whose priorities, draws and IS weights stay on ``device``.

    A drop-in for :class:`torchrl.data.PrioritizedSampler` (it subclasses it, so TorchRL's
    ``isinstance`` checks hold) that needs no ``torchrl._torchrl`` extension.

    Args:
        max_capacity: number of slots N (>= 1), the storage's ``max_size``.
        alpha: priority exponent (>= 0); settable, exactly (raw priorities are kept). With ``eps``, bounded so that
            every stored value ``(p + eps)^alpha`` is a normal float32: ``eps^alpha`` must not underflow and
            ``(1 + eps)^alpha`` (the default priority's) must not overflow (see ``check_exponent``).
        beta: IS-weight exponent (>= 0); settable (e.g. by a TorchRL ``ParameterScheduler``).
        eps: added to raw priorities before the exponent (> 0 keeps every stored value positive); at most
            ``min(FLOAT32_MAX, FLOAT32_MAX**(1/alpha) - 1)`` (:func:`~lightning_per.replay.errors.eps_limit`:
            the default priority 1 must store a finite value). Raw priorities whose stored value would overflow
            float32 are lowered to the largest that does not and counted in :attr:`clamped_priority_count`.
        device: where priorities live; default the CUDA device when available, else CPU.
        stratified: one draw per equal-mass segment (default) or i.i.d. draws.
        shuffle_strata: with ``stratified``, return the draws in a uniformly random order (default): a device-side
            permutation of the strata (the ranks of ``B`` random keys, no sync), so any part of a batch is
            distributed as any other (exchangeable, as TorchRL's i.i.d. draws); with the compiled kernels and
            ``B <= 1024`` the keys and uniforms come from their device RNG (one launch, no generator for a CUDA
            graph to register: what a capture made by others, such as tensordict's ``CudaGraphModule``, needs;
            draws from :attr:`generator` raise a RuntimeError naming it there). ``False`` returns them in stratum
            order, i.e. sorted by slot (one launch less).
        weight_normalization: ``"buffer"`` (TorchRL's, by min_j P(j)) or ``"batch"`` (by the batch max).
        backend: ``"auto"``, ``"reference"`` or ``"kernels"`` (see :func:`lightning_per.ops.select_backend`).
        seed: seed of the device generator when no buffer generator is set (default: a fresh one; torch's
            global RNG is left untouched, :class:`~lightning_per.replay._rng.SamplerRNG`). With the
            compiled kernels the draws take their uniforms inside the sample kernel from a Philox stream
            keyed by the generator's seed (its counters in device memory, restarted whenever the sampler
            is seeded, saved in ``state_dict``; see :meth:`get_rng_state`): one launch less per draw and
            nothing to register with a CUDA graph. The same seed then gives other draws than the reference
            ops (which use ``torch.rand``); each backend is reproducible on its own.
        rule: the draw rule (default :class:`~lightning_per.replay.rules.Proportional` of ``stratified``,
            ``shuffle_strata`` and ``weight_normalization``; docs/architecture.md, "Adding a draw rule").
        eager_graphs: on CUDA, serve repeated eager calls of one shape (a draw of B slots, with or without
            the row gather; a priority write of B slots into a full buffer, and the default priorities an
            extend of B items writes there) by replaying a CUDA graph
            recorded at the second such call: one launch instead of several, same results, fresh outputs
            (a call's outputs of one dtype share an allocation; see :mod:`lightning_per.graphs.eager`).
            The first capture of each shape synchronises the device once. Ignored on CPU, under
            ``torch.compile``, inside an outer CUDA-graph capture and during a capture's warm-up. The
            rank-based sampler serves its re-sort + draw too, once the buffer is full.
        serial: lay the priorities out for ops that run one CPU thread at a time (True) or for a parallel device
            (False); None (default): True for the reference ops on a CPU, the layout that keeps a CPU step
            within reach of TorchRL's C++ tree (docs/replay.md, "On a CPU"). Shown in the repr with ``block``.
            Draws, IS weights and checkpoints are the same under both.

    Repeated indices in one :meth:`update_priority` call: the value given *last* wins.

    Memory: raw ``float32`` + stored ``float32`` per slot, plus ``O(sqrt(N))`` block sums; with the compiled
    kernels or a ``serial`` layout also the writes' ``int32`` last-writer scratch per slot.

    Raises:
        ValueError: a bad argument (named in the message, with the range it must lie in).
        TypeError: a flag (``stratified``, ``shuffle_strata``, ``eager_graphs``, ``max_priority_within_buffer``,
            ``serial``) that is not a bool, or an exponent that is not a number.

    Example::

        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import TensorDictReplayBuffer
        >>> from lightning_per import GPUPrioritizedSampler
        >>> from lightning_per.replay import GPURoundRobinWriter, GPUTensorStorage
        >>> sampler = GPUPrioritizedSampler(4, alpha=1.0, beta=1.0, device="cpu", seed=0)
        >>> rb = TensorDictReplayBuffer(storage=GPUTensorStorage(4, device="cpu"), sampler=sampler,
        ...                             writer=GPURoundRobinWriter(), batch_size=8)
        >>> _ = rb.extend(TensorDict({"reward": torch.arange(4.0)}, [4]))
        >>> sampler.update_priority(torch.arange(4), torch.tensor([1.0, 1.0, 1.0, 3.0]))
        >>> index, info = sampler.sample(rb.storage, 8)  # P = (1/6, 1/6, 1/6, 1/2), one draw per 1/8 of mass
        >>> int((index == 3).sum())
        4
        >>> # IS weights (P(i) / min_j P(j))^-beta: 1/3 for slot 3, 1 for the others
        >>> torch.allclose(info["priority_weight"], torch.where(index == 3, 1 / 3, 1.0))
        True
    """

    def __init__(self, max_capacity: int, alpha: float, beta: float, eps: float = 1e-8, *,
                 device: torch.device | str | None = None, stratified: bool = True,
                 weight_normalization: str = "buffer", backend: str = "auto", seed: int | None = None,
                 dtype: torch.dtype = torch.float32, reduction: str = "max", eager_graphs: bool = True,
                 max_priority_within_buffer: bool = False, shuffle_strata: bool = True, rule=None,
                 serial: bool | None = None) -> None:
        check_bool("stratified", stratified)
        check_bool("shuffle_strata", shuffle_strata)
        if rule is None:
            rule = Proportional(stratified, shuffle_strata, weight_normalization)
        self.reduction, self.dtype = check_reduction(reduction), dtype
        #: priorities, draws, IS weights and the random streams (:class:`~lightning_per.replay.core.PriorityCore`)
        self.core = new_core(type(self).__name__, max_capacity, alpha, beta, eps, rule, device=device, backend=backend,
                             seed=seed, dtype=dtype, eager_graphs=eager_graphs,
                             max_priority_within_buffer=max_priority_within_buffer, serial=serial)

    def __getstate__(self) -> dict[str, Any]:
        """Pickle / ``copy.deepcopy`` state (also what a ``spawn``ed process receives): the attributes, the core
        pickling itself (:meth:`PriorityCore.__getstate__`)."""
        return self.__dict__.copy()

    def __repr__(self) -> str:
        c = self.core
        return (f"{type(self).__name__}(max_capacity={c.capacity}, alpha={c.alpha}, beta={c.beta}, "
                f"eps={c.state.eps}, device={c.device}, block={c.block}, serial={c.serial})")

    @property
    def _rng(self) -> torch.Generator | None:
        """The buffer's generator (TorchRL assigns it); the draws follow it (:class:`SamplerRNG`)."""
        return self.core.rng.buffer

    @_rng.setter
    def _rng(self, generator: torch.Generator | None) -> None:
        self.core.attach(generator)

    @property
    def generator(self) -> torch.Generator:
        """The sampler's own generator on :attr:`device` (what a CUDA graph of its draws registers)."""
        return self.core.rng.generator

    @property
    def device(self) -> torch.device:
        return self.core.device

    @property
    def max_size(self) -> int:
        return self.core.capacity

    @property
    def alpha(self) -> float:
        """Priority exponent; setting it re-transforms every stored value exactly, O(N) on the device."""
        return self.core.alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        self.core.set_alpha(value)

    @property
    def beta(self) -> float:
        """IS-weight exponent; also held in a device scalar so captured CUDA graphs see new values. Set it to a
        number or a 0-d tensor (e.g. from a TorchRL ``ParameterScheduler``; read as a number)."""
        return self.core.beta

    @beta.setter
    def beta(self, value: float) -> None:
        self.core.set_beta(value)

    @property
    def default_priority(self) -> Tensor:
        """Raw priority given to new items: the running max raw priority (1.0 before any update), a 0-d float32
        tensor on :attr:`device` (TorchRL's ``max_priority_within_buffer=False`` rule)."""
        return priority.default_priority(self.core.state.max_raw)

    @property
    def _max_priority(self) -> tuple[Tensor | None, None]:
        """TorchRL's private ``(max raw priority, its slot)`` pair: ``(0-d float32 tensor, None)``, or ``(None,
        None)`` before any priority was written. Reads the device (a diagnostic); the slot is not tracked."""
        return max_priority(self.core)

    # TorchRL's names of the exponents (its sampler keeps them as _alpha and _beta), read by code written for it
    _alpha = property(lambda self: self.core.alpha, doc="TorchRL's name of :attr:`alpha` (read-only).")
    _beta = property(lambda self: self.core.beta, doc="TorchRL's name of :attr:`beta` (read-only).")

    @property
    def clamped_priority_count(self) -> Tensor:
        """0-d int64 device tensor: priorities received that were NaN, +/-Inf or negative, or so large that
        ``(p + eps)^alpha`` would overflow float32 (see :func:`lightning_per.replay.priority.raw_limit`)."""
        return self.core.state.n_clamped

    @property
    def dropped_index_count(self) -> Tensor:
        """0-d int64 device tensor: device-side indices outside ``[0, len(storage))`` that were ignored."""
        return self.core.state.n_dropped

    def get_rng_state(self) -> dict[str, Tensor | None]:
        """The state of every random stream the draws use (:meth:`PriorityCore.get_rng_state`)."""
        return self.core.get_rng_state()

    def set_rng_state(self, state: dict[str, Tensor | None]) -> None:
        """Restore a :meth:`get_rng_state` result (raises as :meth:`PriorityCore.set_rng_state`)."""
        self.core.set_rng_state(state)

    def manual_seed(self, seed: int) -> None:
        """Seed the generator (and the compiled draws' counters). Raises TypeError / ValueError for a bad seed."""
        self.core.manual_seed(seed)

    def capture_view(self, storage, batch_size: int | None) -> SamplerCapture:
        """What a CUDA-graph capture of the draws needs (:class:`lightning_per.graphs.protocol.CapturableSampler`;
        :func:`~lightning_per.replay.adapter.capture_view`): draws and priority updates run on the device from
        device state, so ``problem`` is None for any storage."""
        return capture_view(self.core, batch_size)

    def probabilities(self) -> Tensor:
        """Exact P(i) of every slot, ``(N,)`` float64 on :attr:`device` (for tests and diagnostics)."""
        return self.core.probabilities()

    # ------------------------------------------------------------------ TorchRL's calls
    def update_priority(self, index, priority, *, storage=None, live=None) -> None:
        """Set raw priorities (usually ``|td_error|``) of ``index``; stored as ``(p + eps)^alpha``.

        Args:
            index: ``(B,)`` integer slots (tensor on any device, int or sequence).
            priority: ``(B,)`` raw priorities, or one number/0-d tensor for all.
            storage: the buffer's storage (gives the filled length); TorchRL passes it.
            live: optional ``(B,) bool`` (any device): entries where it is False are dropped on the device, no host
                read (counted in :attr:`dropped_index_count`), never range-checked (a restore may have shrunk the
                fill below their slots); the buffer passes the generation check here
                (:meth:`GPUPrioritizedReplayBuffer.update_priority` with ``generation=``).

        Host-side input (CPU tensors, ints, lists) is fully validated before anything changes. Device-side index
        values outside ``[0, len(storage))`` are ignored and counted in :attr:`dropped_index_count`;
        NaN/Inf/negative priorities are clamped and counted in :attr:`clamped_priority_count`. While a CUDA graph
        captures the call, the bound is the capacity (pass indices the sampler drew there).

        Raises:
            TypeError: non-integer ``index`` or non-numeric ``priority``.
            ValueError: ``priority`` shape does not match ``index``; ``live`` is not a ``(B,)`` bool tensor.
            IndexError: a host-side index outside ``[0, len(storage))`` at a live entry.
        """
        with torch.no_grad():  # the stored priorities never join an autograd graph
            self.core.write(*checked_update(self.core, index, priority, storage, type(self).__name__, live))

    def mark_update(self, index, *, storage=None) -> None:
        """Give slots ``index`` (just written) the default priority (:func:`mark_written`)."""
        mark_written(self.core, index, storage, type(self).__name__)

    def add(self, index) -> None:  # new items get their priority through mark_update
        return None

    def extend(self, index) -> None:
        return None

    def sample(self, storage, batch_size: int) -> tuple[Tensor, dict[str, Tensor]]:
        """Draw ``batch_size`` slots with probability P(i) and their IS weights: ``(index, {"priority_weight":
        w})``, ``(B,)`` int64 and ``(B,)`` float32 on :attr:`device`.

        Raises:
            ValueError: ``batch_size`` is not an int >= 1.
            EmptyBufferError (a ValueError and RuntimeError): the storage is empty.
        """
        return draw(self.core, storage, batch_size)

    def sample_gather(self, storage, batch_size: int, *, with_info: bool = False,
                      contiguous: bool = True) -> tuple[Tensor, dict[str, Tensor], Any]:
        """:meth:`sample`, and the batch ``storage.get(index)`` (a TensorDict ``[B]``): ``(index, info, batch)``.

        With a packed :class:`~lightning_per.replay.GPUTensorStorage` on this sampler's device the draw and the row
        gather are one op (:meth:`PriorityCore.gather_rows`) and the batch's fields are cut from the gathered rows;
        the same generator draws give the same index, weights and batch values either way. ``with_info`` also puts
        ``"index"`` and ``"priority_weight"`` in the batch (the replay buffer's keys). ``contiguous=False``: the
        fields may be strided views into the gathered rows (no copy, one kernel fewer a step), for a learner that
        consumes the batch at once (a field's ``torch.save`` then holds the whole block, and ``.view`` may refuse).

        Raises:
            As :meth:`sample`.
        """
        return draw_gather(self.core, storage, batch_size, with_info, contiguous)

    # ------------------------------------------------------------------ persistence
    def _empty(self) -> None:
        self.core.reset()

    def state_dict(self) -> dict[str, Any]:
        return self.core.state_dict(type(self).__name__)

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raise what :meth:`load_state_dict` refuses, changing nothing (another sampler kind, and as
        :meth:`PriorityCore.check_state_dict`). Host work only.

        Raises:
            ValueError: the checkpoint is refused (the message names why).
        """
        check_kind(state_dict, self)
        self.core.check_state_dict(state_dict)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (in place). Raises ValueError as :meth:`check_state_dict`, first."""
        check_kind(state_dict, self)
        self.core.load_state_dict(state_dict)

    def dumps(self, path) -> None:
        """Write the state to ``path/sampler.pt`` + a JSON summary (:func:`dump`)."""
        dump(self.state_dict(), path)

    def loads(self, path) -> None:
        self.load_state_dict(sampler_checkpoint.load(path, self.core.device))


CapturableSampler.register(GPUPrioritizedSampler)  # isinstance answers; the MRO is unchanged
