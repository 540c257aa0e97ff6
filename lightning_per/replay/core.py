"""PriorityCore: the one sampler core every prioritized sampler holds.

It owns the explicit device state (:class:`~lightning_per.replay.priority.PriorityState`, the compiled draws'
Philox counters included), the ops backend (chosen once, :func:`lightning_per.ops.select_backend`), the draw
source (the generator, :class:`~lightning_per.replay._rng.SamplerRNG`, or the compiled kernels' device counters:
chosen once, from the backend and the draw rule's ``device_rng``), the draw rule (a value,
:mod:`lightning_per.replay.rules`) and the eager CUDA-graph cache (:mod:`lightning_per.graphs.eager`), whose keys
come from :meth:`PriorityCore.key` alone. Its methods are the sampler's whole device work: :meth:`~PriorityCore.sample`
(with or without the row gather), :meth:`~PriorityCore.write`, :meth:`~PriorityCore.mark`,
:meth:`~PriorityCore.rebuild`, :meth:`~PriorityCore.state_dict` / :meth:`~PriorityCore.load_state_dict` and
:meth:`~PriorityCore.tensors`. The TorchRL adapters (``prioritized.py``, ``rank.py``, ``slice.py``) validate
TorchRL-shaped input, call it and map slots back. None of its step methods synchronises with the host.

Example::

    >>> import torch
    >>> from lightning_per.replay.core import PriorityCore
    >>> from lightning_per.replay.rules import Proportional
    >>> core = PriorityCore(4, alpha=1.0, beta=1.0, eps=1e-8, rule=Proportional(shuffle_strata=False),
    ...                     device=torch.device("cpu"), seed=0)
    >>> core.write(torch.arange(4), torch.tensor([1.0, 1.0, 1.0, 3.0]), 4)
    >>> index, weight = core.sample(8, 4)  # one draw per 1/8 of the mass: slot 3 holds half of it
    >>> int((index == 3).sum()), core
    (4, PriorityCore(capacity=4, rule=proportional, device=cpu, compiled=False, device_rng=False, graphs=False,
    block=1, serial=True))
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch import Tensor

from lightning_per.graphs.eager import EagerGraphs
from lightning_per.ops import reference, select_backend
from lightning_per.replay import priority
from lightning_per.replay._rng import SamplerRNG, _fingerprint, check_rng_state
from lightning_per.replay.errors import check_bool, check_eps, check_exponent, check_seed
from lightning_per.replay.priority import PriorityState
from lightning_per.replay.storage import GPUTensorStorage
from lightning_per.schema import check, stamp

__all__ = ["FUSED_GATHER_MAX_WORDS", "PriorityCore", "SAMPLER_SCHEMA_VERSION", "on_device"]

SAMPLER_SCHEMA_VERSION = 1

FUSED_GATHER_MAX_WORDS = 1024
"""Widest packed row (int64 words, i.e. 8 KiB) that a fused sample + gather copies inside the sample kernel (one
program per draw copies its row); wider rows, e.g. Atari frame stacks, are gathered by a separate kernel."""


class PriorityCore:
    """Priorities, draws and IS weights of one sampler, on ``device`` (module docstring).

    Args:
        capacity: number of slots N (>= 1).
        alpha, beta, eps: the priority exponent, IS-weight exponent and additive constant (validated as
            :class:`~lightning_per.replay.GPUPrioritizedSampler` documents).
        rule: the draw rule (:class:`~lightning_per.replay.rules.Proportional`,
            :class:`~lightning_per.replay.rank.RankIndex` or a rule of your own, docs/architecture.md).
        device: where everything lives.
        backend: ``"auto"``, ``"reference"`` or ``"kernels"`` (:func:`lightning_per.ops.select_backend`).
        seed: the generator's seed (:class:`~lightning_per.replay._rng.SamplerRNG`).
        eager_graphs: on CUDA, serve repeated eager calls of one shape by cached CUDA graphs.
        max_within_buffer: the default priority is the max over the slots holding data (TorchRL's
            ``max_priority_within_buffer``), not the running max.
        owner: the sampler's class name, for messages.
        serial: lay the priorities out for ops that run one CPU thread at a time (True), or for parallel devices
            (False); None (default): True for the reference ops on a CPU (docs/replay.md, "On a CPU"). A serial
            core has blocks of ``~sqrt(N / 256)`` leaves (:func:`lightning_per.ops.reference.block_size_for`), an
            ``(N,) int32`` last-writer buffer for its writes, and ranks its strata permutations by a sort;
            draws, weights and checkpoints are the same under both.

    Raises:
        TypeError, ValueError: an exponent, ``eps`` or ``seed`` out of its range (named); ``serial`` is not a bool
            or None, or True with the compiled kernels (their layout is theirs).
    """

    def __init__(self, capacity: int, *, alpha: float, beta: float, eps: float, rule, device: torch.device,
                 backend: str = "auto", seed: int | None = None, eager_graphs: bool = True,
                 max_within_buffer: bool = False, owner: str = "sampler", serial: bool | None = None) -> None:
        if serial is not None:
            check_bool("serial", serial)
        alpha = check_exponent("alpha", alpha)
        eps = check_eps(eps, alpha)  # (1 + eps)^alpha, the default priority's stored value, must be finite
        alpha, beta = check_exponent("alpha", alpha, eps=eps), check_exponent("beta", beta)
        check_seed(seed)
        self.capacity, self.device, self.backend, self.rule = capacity, device, backend, rule
        self.alpha, self.beta, self.max_within_buffer = float(alpha), float(beta), max_within_buffer
        self.ops = select_backend(device, backend)
        #: the compiled kernels serve the ops (their device RNG, their write's scratch)
        self.compiled = self.ops is not reference
        #: the draw source, chosen once: the compiled kernels' device counters, or the generator
        self.device_rng = self.compiled and rule.device_rng
        self.rng = SamplerRNG(device, seed, owner)
        if serial and self.compiled:
            raise ValueError(f"serial=True lays the priorities out for the reference ops on one CPU thread; this "
                             f"{owner} runs the compiled kernels (backend={backend!r}): pass serial=None or False")
        #: the layout and the strata permutation are chosen for ops that run one CPU thread at a time (by default
        #: the reference ops on a CPU), not for a parallel device (docs/replay.md, "On a CPU")
        self.serial = (device.type == "cpu" and not self.compiled) if serial is None else serial
        self.block = self.ops.block_size_for(capacity + 1, self.serial)  # slot N is the trash slot (always 0)
        self.n_blocks = -(-(capacity + 1) // self.block)
        counters = self.ops.new_rng_state(self.rng.generator.initial_seed(), device) if self.device_rng else None
        self.state = PriorityState.empty(capacity, block=self.block, alpha=self.alpha, beta=self.beta, eps=eps,
                                         device=device, rng=counters, scratch=self.compiled or self.serial)
        self.graphs = EagerGraphs() if eager_graphs and device.type == "cuda" else None
        #: the storage's ``slot_valid`` mask once a write showed one (``FrameStackStorage``), else None
        self.slot_valid: Tensor | None = None

    def __repr__(self) -> str:
        return (f"PriorityCore(capacity={self.capacity}, rule={self.rule.name}, "
                f"device={self.device}, compiled={self.compiled}, device_rng={self.device_rng}, "
                f"graphs={self.graphs is not None}, block={self.block}, serial={self.serial})")

    def __getstate__(self) -> dict[str, Any]:
        """Pickle / ``copy.deepcopy`` state: the device counters as a copy of their own (a draw advances them: a
        copy sharing them would move the original's draws), without the backend module and the cached graphs,
        which :meth:`__setstate__` selects and starts afresh."""
        state = self.__dict__.copy()
        if self.state.rng is not None:
            state["state"] = dataclasses.replace(self.state, rng=self.state.rng.clone())
        state["ops"], state["graphs"] = None, self.graphs is not None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.ops = select_backend(self.device, self.backend)
        self.graphs = EagerGraphs() if state["graphs"] else None

    # ------------------------------------------------------------------ exponents
    def set_alpha(self, value: float) -> None:
        """A new priority exponent: every stored value re-transformed exactly, O(N) on the device.

        Raises:
            TypeError, ValueError: ``value`` out of range for ``eps`` (:func:`check_exponent`).
        """
        value = check_exponent("alpha", value, eps=self.state.eps)
        if value == self.alpha:
            return
        self.alpha = value
        self.state.raw_limit = priority.raw_limit(value, self.state.eps)
        self.state.alpha.fill_(value)
        self.rebuild()

    def set_beta(self, value: float) -> None:
        """A new IS-weight exponent, also written to the device scalar captured graphs read.

        Raises:
            TypeError, ValueError: ``value`` is not a number >= 0.
        """
        value = check_exponent("beta", value)
        if value == self.beta:  # annealing finished: no device write (one launch saved per update)
            return
        self.beta = value
        self.state.beta.fill_(value)

    # ------------------------------------------------------------------ random streams
    def device_draws(self, batch_size: int) -> bool:
        """True when a draw of ``batch_size`` takes its uniforms from the device counters (not while
        ``torch.compile`` traces; up to the rule's limit for the compiled kernels), else from the generator."""
        return (self.device_rng and not torch.compiler.is_compiling()
                and batch_size <= self.rule.device_limit(self.ops))

    def rand(self, shape: tuple[int, ...]) -> Tensor:
        """float64 U[0, 1) draws from the generator (:meth:`SamplerRNG.rand`).

        Raises:
            RuntimeError: inside a CUDA-graph capture that did not register the generator (named).
        """
        way = ""
        if self.device_rng and self.rule.shuffles():
            way = (f"draw at most {self.ops.SHUFFLE_DRAWS} per call, or build the sampler with shuffle_strata=False "
                   f"(with the compiled kernels its draws then take their uniforms from counters in device "
                   f"memory: no generator to register)")
        return self.rng.rand(shape, way)

    def attach(self, generator: torch.Generator | None) -> None:
        """The buffer attached ``generator`` (TorchRL assigns ``sampler._rng``): the draws follow it from now on
        (:meth:`SamplerRNG.attach`, then :meth:`follow`)."""
        self.rng.attach(generator)
        self.follow()

    def follow(self) -> None:
        """Follow the buffer's generator (:meth:`SamplerRNG.follow`); a reseed restarts the device counters."""
        if self.rng.follow():
            self.reseed()

    def reseed(self, seed: int | None = None) -> None:
        """Restart the device counters under ``seed`` (default the generator's seed), in place."""
        rng = self.state.rng
        if rng is not None:
            rng[1:].zero_()
            rng[:1].fill_(self.ops.seed_word(self.rng.generator.initial_seed() if seed is None else seed))

    def manual_seed(self, seed: int) -> None:
        """Seed the generator and restart the device counters.

        Raises:
            TypeError, ValueError: ``seed`` is not an int in ``[-2**63, 2**64)``.
        """
        self.rng.manual_seed(seed)
        self.reseed()

    def get_rng_state(self) -> dict[str, Tensor | None]:
        """``{"generator": CPU uint8 tensor, "device_rng": (1 + 65536,) int64 device tensor or None}`` (copied; no
        host sync)."""
        rng = self.state.rng
        return {**self.rng.get_rng_state(), "device_rng": None if rng is None else rng.clone()}

    def set_rng_state(self, state: dict[str, Tensor | None]) -> None:
        """Restore a :meth:`get_rng_state` result in place (cached CUDA graphs keep drawing from it).

        Raises:
            TypeError, ValueError: not a ``get_rng_state()`` dict, or one without the ``"device_rng"`` this core
                draws from, or of another shape; nothing is changed.
        """
        check_rng_state(state)
        saved, rng = state.get("device_rng"), self.state.rng
        if rng is not None and (saved is None or saved.shape != rng.shape):
            raise ValueError(f"state['device_rng'] must be a {tuple(rng.shape)} int64 tensor (this sampler's "
                             f"compiled draws use it), got {None if saved is None else tuple(saved.shape)}")
        self.rng.set_rng_state(state)
        if rng is not None:
            rng.copy_(saved)

    def draw_generators(self, batch_size: int) -> tuple[torch.Generator, ...]:
        """The generators a draw of ``batch_size`` consumes: what a CUDA graph recording such draws must register
        (none when the compiled kernels draw the uniforms themselves)."""
        return () if self.device_draws(batch_size) else (self.rng.generator,)

    # ------------------------------------------------------------------ eager graphs
    def key(self, op: str, size: int, *parts: Hashable) -> tuple:
        """The eager-graph key of a call: the op, its size, its host decisions, and the host scalars every op of
        this core bakes in (``eps``, the raw-priority limit)."""
        return (op, size, *parts, self.state.eps, self.state.raw_limit)

    def serve(self, key: Hashable, fn: Callable, args: tuple[Tensor, ...] = (), state: tuple[Tensor, ...] = (),
              generators: tuple[torch.Generator, ...] = ()):
        """``fn(*args)``, served by a cached CUDA graph of ``key`` when the core has graphs and the call is plain
        eager (:meth:`EagerGraphs.run <lightning_per.graphs.eager.EagerGraphs.run>`)."""
        graphs = self.graphs
        if graphs is not None and graphs.active():
            return graphs.run(key, fn, args, state, generators)
        return fn(*args)

    def tensors(self) -> tuple[Tensor, ...]:
        """Every device tensor a call reads or writes: the state's (:meth:`PriorityState.tensors`), then the
        rule's."""
        return (*self.state.tensors(), *self.rule.tensors())

    # ------------------------------------------------------------------ draws
    def sample(self, batch_size: int, n: int, rows: Tensor | None = None) -> tuple[Tensor, ...]:
        """Draw ``batch_size`` slots among the ``n`` filled ones by the rule: ``(index (B,) int64, weight (B,)
        float32)``, or with ``rows`` (the storage's packed ``(N, W) int64`` ring, :meth:`gather_rows`) ``(block
        (B, W) int64, index, weight)``, one fused op. Served by a cached graph (once the ring is full when the
        rule reads ``n``).

        Raises:
            RuntimeError: inside a CUDA-graph capture that did not register the generator (named).
        """
        self.follow()
        rule = self.rule
        plan = rule.plan(self, batch_size, n)

        def draw():
            return rule.draw(self, batch_size, n, plan, rows)

        if rule.reads_filled and n < self.capacity:  # n is baked into the draw: only a full ring repeats
            out = draw()
        else:
            op = rule.name + ("+gather" if rows is not None else "")
            state = self.tensors() if rows is None else (*self.tensors(), rows)
            out = self.serve(self.key(op, batch_size, *plan), draw, (), state, self.draw_generators(batch_size))
        rule.drew(self, n, plan)
        return tuple(out)

    def gather_rows(self, storage) -> Tensor | None:
        """The storage's packed ring when a fused sample + gather can read it (the rule fuses, the storage is a
        :class:`~lightning_per.replay.GPUTensorStorage` packed with flat keys and rows of at most
        :data:`FUSED_GATHER_MAX_WORDS` words, on this core's device; ``cuda`` stands for the current CUDA device),
        else None."""
        if not (self.rule.fuses_gather and isinstance(storage, GPUTensorStorage)):
            return None
        rows = storage.gather_rows
        if rows is None:  # not packed
            return None
        if rows.shape[1] > FUSED_GATHER_MAX_WORDS:  # wide rows (pixels): a separate gather spreads each row
            return None                             # over many thread blocks; one program per row would not
        have, want = rows.device, self.device
        if have.type != want.type or (want.index is not None and have.index != want.index) or (
                want.index is None and have.type == "cuda" and have.index != torch.cuda.current_device()):
            return None
        return rows

    def probabilities(self) -> Tensor:
        """Exact P(i) of every slot, ``(N,)`` float64 on :attr:`device` (proportional to the stored values)."""
        return priority.probabilities(self.state)

    # ------------------------------------------------------------------ writes
    def write(self, index: Tensor, raw: Tensor, n_valid: int, valid: Tensor | None = None) -> None:
        """Store raw priorities ``raw`` ``(B,)`` at slots ``index`` ``(B,)`` (both on :attr:`device`):
        :func:`lightning_per.replay.priority.write` (``valid``: its optional mask of slots whose stored value may
        be non-zero), served by a cached CUDA graph into a full ring; counted in ``state.writes``."""
        if index.numel() == 0:  # e.g. extending with an empty batch: nothing to write
            pass
        elif n_valid == self.capacity and index.device == raw.device and index.device.type == "cuda":
            masked = valid is not None  # a full ring: n_valid is fixed, so the call shape is (B, masked)
            self.serve(self.key("write", index.numel(), masked), lambda i, r: self.write_eager(i, r, n_valid, valid),
                       (index, raw), (*self.state.tensors(), valid) if masked else self.state.tensors())
        else:
            self.write_eager(index, raw, n_valid, valid)
        self.state.writes += 1

    def write_eager(self, index: Tensor, raw: Tensor, n_valid: int, valid: Tensor | None = None) -> None:
        """The op :meth:`write` runs (what its cached graphs record), never served by a graph nor counted."""
        priority.write(self.ops, self.state, index, raw, n_valid, valid)
        if self.max_within_buffer:
            priority.max_within_buffer(self.state)

    def mark(self, index: Tensor, n_valid: int, valid: Tensor | None = None) -> None:
        """Give slots ``index`` ``(B,)`` (on :attr:`device`, just written) the default priority (the running max),
        as one :meth:`write`; into a full CUDA ring the default priority is computed in the cached graph too."""
        if n_valid == self.capacity and index.device.type == "cuda" and index.numel():
            masked = valid is not None
            self.serve(self.key("mark", index.numel(), masked),
                       lambda i: self.write_eager(i, self._defaults(i), n_valid, valid),
                       (index,), (*self.state.tensors(), valid) if masked else self.state.tensors())
            self.state.writes += 1
            return
        self.write(index, self._defaults(index), n_valid, valid)

    def _defaults(self, index: Tensor) -> Tensor:
        """The default priority of each slot of ``index``: a fresh contiguous ``(B,)`` tensor, one op."""
        return priority.default_priority(self.state.max_raw.expand(index.shape))

    def mask(self, valid: Tensor) -> None:
        """Zero the stored value of every slot where ``valid`` ``(capacity,) bool`` is False (kept by reference:
        later writes to such slots are dropped, :meth:`keep_valid`); O(N), in place."""
        self.slot_valid = valid
        priority.mask(self.ops, self.state, valid)

    def keep_valid(self, index: Tensor) -> Tensor:
        """``index`` with the slots the ``slot_valid`` mask marks invalid sent out of range (-1: dropped)."""
        if self.slot_valid is None:
            return index
        return index.where(self.slot_valid[index.clamp(0, self.capacity - 1)], -1)

    def keep_live(self, index: Tensor, live: Tensor | None) -> Tensor:
        """``index`` ``(B,)`` with the entries where ``live`` ``(B,) bool`` is False sent out of range (-1: dropped by
        :meth:`write`, counted in ``state.n_dropped``): updates aimed at slots rewritten since they were sampled
        (generation stamps). One device ``where``, no host read."""
        if live is None:
            return index
        return index.where(live.to(index.device, non_blocking=True), -1)

    def rebuild(self) -> None:
        """Recompute every stored value and block reduction from the raw priorities (O(N), in place)."""
        priority.rebuild(self.ops, self.state)

    def reset(self) -> None:
        """Forget every priority (a fresh state; the device counters and the generator are kept)."""
        old = self.state
        self.state = PriorityState.empty(self.capacity, block=self.block, alpha=self.alpha, beta=self.beta,
                                         eps=old.eps, device=self.device, rng=old.rng,
                                         scratch=self.compiled or self.serial)
        if self.graphs is not None:
            self.graphs.clear()  # they point at the tensors just replaced

    # ------------------------------------------------------------------ persistence
    def state_dict(self, kind: str) -> dict[str, Any]:
        """The checkpoint of a prioritized sampler of class ``kind`` (schema :data:`SAMPLER_SCHEMA_VERSION`)."""
        s = self.state
        return stamp({
            "kind": kind, "max_capacity": self.capacity,
            "alpha": self.alpha, "beta": float(self.beta), "eps": s.eps,
            "raw": s.raw.clone(), "max_raw": s.max_raw.clone(),
            "n_clamped": s.n_clamped.clone(), "n_dropped": s.n_dropped.clone(),
            "written": s.written().clone(), "rng": self.rng.state(),
            "device_rng": None if s.rng is None else s.rng.clone(),
        }, "sampler", SAMPLER_SCHEMA_VERSION)

    def check_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Raise what :meth:`load_state_dict` refuses, changing nothing: another schema or ``max_capacity``,
        TorchRL's own sampler state, missing, misshapen or corrupted entries. Host work only.

        Raises:
            ValueError: the checkpoint is refused (the message names why).
        """
        if "_sum_tree" in state_dict or "_min_tree" in state_dict:  # TorchRL's own PrioritizedSampler state
            raise ValueError("this is the state of TorchRL's PrioritizedSampler (its C++ sum and min trees), which "
                             "this sampler cannot load: lightning_per.from_torchrl(buffer_state_dict) builds one of "
                             "our buffers of a TorchRL buffer's state (data, write cursor, priorities)")
        if "max_capacity" not in state_dict:
            raise ValueError(f"not a prioritized sampler checkpoint (keys {sorted(map(str, state_dict))})")
        check(state_dict, "sampler", SAMPLER_SCHEMA_VERSION, missing=0)  # 0: TorchRL's own sampler state
        if state_dict["max_capacity"] != self.capacity:
            raise ValueError(f"checkpoint max_capacity {state_dict['max_capacity']} differs from "
                             f"this sampler's {self.capacity}")
        numbers, scalars = ("eps", "alpha", "beta"), ("max_raw", "n_clamped", "n_dropped")
        missing = sorted(k for k in (*numbers, *scalars, "raw", "written", "rng") if k not in state_dict)
        if missing:
            raise ValueError(f"prioritized sampler checkpoint lacks {missing}")
        for key in numbers:
            if isinstance(state_dict[key], bool) or not isinstance(state_dict[key], (int, float)):
                raise ValueError(f"sampler checkpoint's {key!r} must be a number, got {type(state_dict[key]).__name__}")
        if not (math.isfinite(state_dict["eps"]) and state_dict["eps"] > 0):
            raise ValueError(f"sampler checkpoint's 'eps' must be a finite number > 0, got {state_dict['eps']!r}")
        try:
            check_exponent("alpha", state_dict["alpha"], eps=float(state_dict["eps"]))
            check_exponent("beta", state_dict["beta"])
        except (TypeError, ValueError) as err:
            raise ValueError(f"sampler checkpoint's {err}") from None
        for key in scalars:
            value = state_dict[key]
            if not isinstance(value, Tensor) or value.shape != torch.Size([]):
                got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
                raise ValueError(f"sampler checkpoint's {key!r} must be a tensor of shape (), got {got}")
        # raw and written span the saving sampler's layout: n_blocks * block > max_capacity slots, whatever its
        # block (a GPU's or a CPU's, docs/replay.md "On a CPU"); the slots past max_capacity hold nothing
        length = None
        for key in ("raw", "written"):
            value = state_dict[key]
            if not isinstance(value, Tensor) or value.dim() != 1 or value.numel() <= self.capacity or (
                    length is not None and value.numel() != length):
                got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
                raise ValueError(f"sampler checkpoint's {key!r} must be a 1-d tensor of more than max_capacity "
                                 f"{self.capacity} entries (the raw priorities' length), got {got}")
            length = value.numel()
        if bool(state_dict["written"][self.capacity:].bool().any()):  # sync-ok: checkpoint load, not a step
            raise ValueError(f"sampler checkpoint's 'written' marks slots at or past max_capacity {self.capacity}: "
                             "the checkpoint is corrupted")
        raw = state_dict["raw"]
        if not bool(((raw >= 0) & torch.isfinite(raw)).all()):  # sync-ok: checkpoint load, not a step
            raise ValueError("sampler checkpoint's raw priorities must be finite and >= 0 (every write sanitizes "
                             "them): the checkpoint is corrupted")
        # the running max: -inf before any write, else at least every written slot's raw priority (so >= 0)
        max_raw, written = state_dict["max_raw"], state_dict["written"].bool()
        top = raw[written].max() if bool(written.any()) else torch.tensor(0.0)  # sync-ok: checkpoint load
        if not bool((max_raw == float("-inf")) | (torch.isfinite(max_raw) & (max_raw >= top))):  # sync-ok: load
            raise ValueError(f"sampler checkpoint's 'max_raw' must be -inf (nothing written) or finite and >= every "
                             f"written raw priority, got {float(max_raw)} against {float(top)}: the checkpoint "
                             "is corrupted")
        for key in ("n_clamped", "n_dropped"):
            if state_dict[key].dtype != torch.int64 or bool(state_dict[key] < 0):  # sync-ok: checkpoint load
                raise ValueError(f"sampler checkpoint's {key!r} must be an int64 count >= 0, got {state_dict[key]!r}")
        self.rng.check(state_dict["rng"])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` in place (checked first with :meth:`check_state_dict`).

        Raises:
            ValueError: as :meth:`check_state_dict`, before anything changes.
        """
        self.check_state_dict(state_dict)
        d, s = self.device, self.state
        self.alpha, self.beta = float(state_dict["alpha"]), float(state_dict["beta"])
        s.eps = float(state_dict["eps"])
        s.raw_limit = priority.raw_limit(self.alpha, s.eps)
        s.alpha.fill_(self.alpha)
        s.beta.fill_(self.beta)
        for key in ("max_raw", "n_clamped", "n_dropped"):
            getattr(s, key).copy_(state_dict[key].to(d))
        cap, leaves = self.capacity, s.leaves.view(-1)  # slots past cap (trash, padding) hold 0 in every layout
        s.raw[cap:].zero_()
        s.raw[:cap].copy_(state_dict["raw"][:cap].to(d))
        leaves[cap:].zero_()
        leaves[:cap].copy_(state_dict["written"][:cap].to(d).to(torch.float32))  # mask, then values
        self.rebuild()
        self.rng.load(state_dict["rng"])
        if s.rng is not None:  # the draws' stream as saved
            saved = state_dict.get("device_rng")
            if saved is not None and saved.shape == s.rng.shape:
                s.rng.copy_(saved.to(d))
            else:  # a checkpoint without it (older, or from the reference ops): a stream of its own, not a restart
                warnings.warn("sampler checkpoint has no 'device_rng' (the compiled draws' random state): seeding "
                              "it from the restored generator's state; the draws differ from the original run's",
                              RuntimeWarning, stacklevel=3)
                self.reseed(_fingerprint(self.rng.generator))


def on_device(t: Tensor, device: torch.device) -> Tensor:
    """``t`` on ``device`` (``non_blocking``; ``t`` itself, with no op, when it is there already)."""
    return t if t.device == device else t.to(device, non_blocking=True)
