"""A sampler's own random generator on its device, driven by the replay buffer's generator.

TorchRL hands every component the buffer's generator (``ReplayBuffer(generator=...)``, ``set_rng``),
usually a CPU generator. Drawing on the CPU and copying would cost a host round trip per step, so a
sampler keeps a generator on its own device. Before each draw it compares the buffer generator's state
(a CPU tensor, for CUDA generators too: no device sync) with the state it last left it in; when they
differ (a new generator, ``gen.manual_seed(...)`` in place, a restored checkpoint), it takes one seed
from the buffer generator (consuming it, as TorchRL's own draws do) and reseeds its device stream.
So re-seeding the buffer generator in place replays the same draws, and the sampler's ``state_dict``
carries both its device state and the buffer-generator state it last saw: a resumed run draws exactly
the samples the original would have. Unchanged, the buffer generator costs a draw one host-side state
comparison and no device work. Inside a CUDA-graph capture or ``torch.compile`` the check is skipped.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from lightning_per.replay.errors import check_seed

__all__ = ["GeneratorBytes", "SamplerRNG", "check_rng_state", "unregistered_generator_error"]


def _fingerprint(generator: torch.Generator | torch.Tensor) -> int:
    """A 63-bit digest of a generator's state (or of a ``get_state()`` tensor)."""
    state = generator if isinstance(generator, torch.Tensor) else generator.get_state()  # CPU ByteTensor
    digest = hashlib.sha256(state.numpy().tobytes()).digest()  # sync-ok: get_state() is a CPU tensor
    return int.from_bytes(digest[:8], "little") >> 1


def _state_bytes(state: torch.Tensor) -> bytes:
    """The bytes of a ``get_state()`` tensor (a contiguous CPU uint8 tensor)."""
    return state.numpy().tobytes()  # sync-ok: get_state() is a CPU tensor


def _take_seed(generator: torch.Generator, state: torch.Tensor) -> int:
    """One seed taken from ``generator`` (whose current state is ``state``), advancing it: a host draw for a CPU
    generator; for a device generator (whose draws land on the device) the digest of its state, then its
    Philox offset moved on (host-side, no device sync)."""
    if generator.device.type == "cpu":
        return int(torch.randint(0, 2**62, (1,), generator=generator))  # sync-ok: a CPU generator's draw
    seed = _fingerprint(state)
    try:
        generator.set_offset(generator.get_offset() + 4)
    except (RuntimeError, AttributeError):  # a generator without an offset: its state stays as it is
        pass
    return seed


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


#: torch's error when a CUDA generator is advanced while a stream capture is underway that the generator was not
#: registered with (``CUDAGeneratorState::increase``; a host check before any launch, so the capture stays valid)
_UNREGISTERED_GENERATOR = "not in capture mode"


def unregistered_generator_error(owner: str, exc: BaseException, way: str = "") -> BaseException:
    """``exc`` itself, or, when it is torch's error for a draw from a CUDA generator that the graph being captured
    did not register, a RuntimeError naming the generator of the sampler class ``owner`` and the ways out
    (``way``: one more, specific to the sampler). The caller raises the result ``from exc``."""
    if _UNREGISTERED_GENERATOR not in str(exc):
        return exc
    ways = ["capture the update with lightning_per.graphs.capture (it registers the generators the buffer's draws "
            "use)", "call graph.register_generator_state(sampler.generator) before your own torch.cuda.graph capture"]
    return RuntimeError(
        f"{owner}.generator (the sampler's own CUDA torch.Generator) is drawn from inside a CUDA "
        f"graph capture that did not register it: torch.cuda.graph registers only the device's default generator, "
        f"so captures made by others (tensordict's CudaGraphModule, a plain torch.cuda.graph) cannot draw from it. "
        f"Either " + "; or ".join([*ways, *([way] if way else [])]) + ".")


@dataclass(frozen=True)
class GeneratorBytes:
    """A ``torch.Generator`` as plain data: its device and the bytes of its ``get_state()``. What a sampler
    pickles in place of a generator (torch pickles a generator's state tensor, which a ``spawn``ed process cannot
    rebuild from shared memory; bytes cross any process boundary).

    Attributes:
        device: the generator's device (``"cpu"``, ``"cuda:0"``, ...).
        state: the bytes of its ``get_state()`` (a uint8 CPU tensor).

    Example::

        >>> import torch
        >>> g = torch.Generator().manual_seed(3)
        >>> copy = GeneratorBytes.of(g).generator()
        >>> torch.equal(torch.rand(4, generator=copy), torch.rand(4, generator=g))
        True
    """

    device: str
    state: bytes

    @classmethod
    def of(cls, generator: torch.Generator) -> GeneratorBytes:
        """The device and state of ``generator`` (host work: ``get_state()`` is a CPU tensor)."""
        return cls(str(generator.device), _state_bytes(generator.get_state()))

    def generator(self) -> torch.Generator:
        """A new generator on :attr:`device` in :attr:`state` (its next draws are the original's next draws)."""
        gen = torch.Generator(device=self.device)
        gen.set_state(_bytes_state(self.state))
        return gen


def _bytes_state(data: bytes) -> torch.Tensor:
    """A ``get_state()``-like uint8 CPU tensor holding ``data`` (its own memory)."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


class SamplerRNG:
    """A sampler's own ``torch.Generator`` on its device, driven by the replay buffer's generator (module
    docstring): a component every sampler holds as ``rng``.

    Pickling and ``copy.deepcopy`` (also handing a sampler to a ``spawn``ed process) carry the generators as
    :class:`GeneratorBytes`: the copy's next draws are the original's next draws.

    Args:
        device: where the generator lives and the draws land.
        seed: its seed (default: a fresh non-deterministic one, ``torch.Generator().seed()``: building a sampler
            leaves torch's global RNG untouched, as TorchRL's; pass ``seed``, or give the replay buffer a
            ``generator``, for reproducible draws).
        owner: the sampler's class name, for error messages.

    Raises:
        TypeError, ValueError: ``seed`` is not an int in ``[-2**63, 2**64)`` (:func:`check_seed`).
    """

    def __init__(self, device: torch.device, seed: int | None = None, owner: str = "sampler") -> None:
        check_seed(seed)
        self.device, self.owner = device, owner
        self.fingerprint: int | None = None  # of a checkpoint written before buffer_seen was saved
        self.buffer: torch.Generator | None = None  # the buffer's generator (TorchRL's ``sampler._rng``)
        self.seen: torch.Tensor | None = None  # the buffer generator's state after our last reseed
        self.adopt: torch.Generator | None = None  # the buffer generator attached when a checkpoint loaded
        gen = torch.Generator(device=device)
        gen.manual_seed(torch.Generator().seed() if seed is None else seed)  # never torch's global generator
        self.generator = gen

    def __repr__(self) -> str:
        return f"SamplerRNG(device={self.device}, follows_buffer={self.buffer is not None})"

    def __getstate__(self) -> dict:
        """The attributes, with the sampler's and the buffer's generators as :class:`GeneratorBytes` and the
        last-seen buffer state as bytes. A checkpoint's generator adopted at load (module docstring) is settled as
        the next draw would settle it, so the copy, which gets a new buffer generator of the same state, draws
        what the original draws next."""
        state = self.__dict__.copy()
        state.pop("_seen_cache", None)
        buf, seen, fingerprint = self.buffer, self.seen, self.fingerprint
        if buf is not None and (buf is self.adopt or (seen is None and fingerprint is not None
                                                      and _fingerprint(buf) == fingerprint)):
            seen, fingerprint = buf.get_state(), None  # what follow() settles on at the next draw
        state["generator"] = GeneratorBytes.of(self.generator)
        state["buffer"] = None if buf is None else GeneratorBytes.of(buf)
        state["seen"] = None if seen is None else _state_bytes(seen)
        state["fingerprint"], state["adopt"] = fingerprint, None
        return state

    def __setstate__(self, state: dict) -> None:
        """Restore a :meth:`__getstate__` result: new generators in the saved states."""
        state = dict(state)
        state["generator"] = state["generator"].generator()
        buf, seen = state["buffer"], state["seen"]
        state["buffer"] = None if buf is None else buf.generator()
        state["seen"] = None if seen is None else _bytes_state(seen)
        self.__dict__.update(state)

    def attach(self, generator: torch.Generator | None) -> None:
        """The buffer attached ``generator`` (TorchRL assigns ``sampler._rng``); the draws follow it from the next
        :meth:`follow` on (the owner calls it at once, restarting what it derives from the generator)."""
        self.buffer = generator
        if generator is not self.adopt:
            self.adopt = None

    def follow(self) -> bool:
        """Reseed the generator from the buffer generator if its state is not the one last seen (module
        docstring); every draw calls this first. True when it reseeded (the caller restarts any stream derived
        from the generator). Host work only (no device sync)."""
        buf = self.buffer
        if buf is None or torch.compiler.is_compiling() or _capturing(self.device):
            return False
        state = buf.get_state()  # a CPU tensor
        seen = self.seen
        if seen is not None and _state_bytes(state) == self._seen_bytes(seen):
            return False
        if buf is self.adopt or (seen is None and self.fingerprint is not None
                                 and _fingerprint(state) == self.fingerprint):
            # a sampler checkpoint loaded under the generator attached then (not restored with it), or an older
            # checkpoint's generator: keep the restored device stream
            self.seen, self.fingerprint, self.adopt = state, None, None
            return False
        self.fingerprint = self.adopt = None
        self.generator.manual_seed(_take_seed(buf, state))
        self.seen = buf.get_state()
        return True

    def _seen_bytes(self, seen: torch.Tensor) -> bytes:
        """The bytes of ``seen`` (:attr:`seen`), kept until another state tensor is assigned: comparing bytes costs
        the host a fraction of ``torch.equal`` (a dispatched op) on every draw."""
        cached = self.__dict__.get("_seen_cache")
        if cached is None or cached[0] is not seen:
            cached = self._seen_cache = (seen, _state_bytes(seen))
        return cached[1]

    def rand(self, shape: tuple[int, ...], way: str = "") -> torch.Tensor:
        """float64 U[0, 1) draws of ``shape`` from :attr:`generator` on :attr:`device`.

        Raises:
            RuntimeError: inside a CUDA-graph capture that did not register :attr:`generator` (the message names
                it, how to capture instead, and ``way``, one more way out specific to the sampler).
        """
        if torch.compiler.is_compiling():  # traced: no capture underway, and no try block for dynamo to trace
            return torch.rand(shape, generator=self.generator, device=self.device, dtype=torch.float64)
        try:
            return torch.rand(shape, generator=self.generator, device=self.device, dtype=torch.float64)
        except RuntimeError as exc:
            raise unregistered_generator_error(self.owner, exc, way) from exc

    def randint(self, high: int, shape: tuple[int, ...]) -> torch.Tensor:
        """int64 draws uniform on ``[0, high)`` of ``shape`` from :attr:`generator` on :attr:`device`.

        Raises:
            RuntimeError: as :meth:`rand`.
        """
        if torch.compiler.is_compiling():
            return torch.randint(0, high, shape, generator=self.generator, device=self.device)
        try:
            return torch.randint(0, high, shape, generator=self.generator, device=self.device)
        except RuntimeError as exc:  # a capture that did not register the generator: named
            raise unregistered_generator_error(self.owner, exc) from exc

    def manual_seed(self, seed: int) -> None:
        """Seed the generator directly.

        Raises:
            TypeError, ValueError: ``seed`` is not an int in ``[-2**63, 2**64)`` (:func:`check_seed`).
        """
        self.generator.manual_seed(check_seed(seed))

    def get_rng_state(self) -> dict[str, torch.Tensor | None]:
        """``{"generator": CPU uint8 tensor, "device_rng": None}``: what a sampler drawing from this generator alone
        returns from its ``get_rng_state`` (the graphs' ``CapturableSampler`` protocol)."""
        return {"generator": self.generator.get_state(), "device_rng": None}

    def set_rng_state(self, state: dict[str, torch.Tensor | None]) -> None:
        """Restore the generator of a ``get_rng_state()`` result.

        Raises:
            TypeError, ValueError: ``state`` is not such a dict (:func:`check_rng_state`); nothing changes.
        """
        check_rng_state(state)
        self.generator.set_state(state["generator"])

    def state(self) -> dict:
        """What a sampler checkpoint saves under ``"rng"``: ``{"generator", "fingerprint", "buffer_seen"}``."""
        seen = self.seen
        return {"generator": self.generator.get_state(), "fingerprint": self.fingerprint,
                "buffer_seen": None if seen is None else seen.clone()}

    def check(self, rng) -> None:
        """Raise unless ``rng`` is a saved :meth:`state` that this generator accepts (tried on a fresh generator of
        its device, never on the sampler's own: nothing changes).

        Raises:
            ValueError: not a saved generator state, or one of another kind of device.
        """
        if not (isinstance(rng, dict) and isinstance(rng.get("generator"), torch.Tensor)
                and rng["generator"].dtype == torch.uint8 and "fingerprint" in rng):
            raise ValueError("sampler checkpoint's 'rng' is not a saved generator state (a dict with a uint8 "
                             "'generator' tensor and a 'fingerprint')")
        device = self.generator.device
        try:
            torch.Generator(device=device).set_state(rng["generator"].cpu())  # sync-ok: load path, a CPU tensor
        except RuntimeError as err:
            raise ValueError(f"sampler checkpoint's generator state does not fit this sampler's {device.type} "
                             f"generator (saved on another kind of device?): {err}") from err

    def load(self, state: dict) -> None:
        """Restore a :meth:`state` (checked first by :meth:`check`)."""
        self.generator.set_state(state["generator"].cpu())  # sync-ok: checkpoint load, not a step
        seen = state.get("buffer_seen")
        self.seen = seen.cpu().clone() if isinstance(seen, torch.Tensor) else None  # sync-ok: load
        self.fingerprint = None if seen is not None else state["fingerprint"]
        # until the buffer attaches another generator (TorchRL's load restores its own), the restored device stream
        # continues under the generator attached now
        self.adopt = self.buffer


def check_rng_state(state) -> None:
    """Raise a clear error unless ``state`` looks like a sampler's ``get_rng_state()`` result: a dict with a
    ``"generator"`` uint8 tensor (and optionally ``"device_rng"``)."""
    if not isinstance(state, dict):
        raise TypeError(f"state must be the dict returned by get_rng_state() ({{'generator', 'device_rng'}}), got "
                        f"{type(state).__name__}" + (" (a generator's own state? pass sampler.get_rng_state())"
                                                     if isinstance(state, torch.Tensor) else ""))
    gen = state.get("generator")
    if not (isinstance(gen, torch.Tensor) and gen.dtype == torch.uint8):
        raise ValueError(f"state must be the dict returned by get_rng_state() ({{'generator', 'device_rng'}}), got "
                         f"keys {sorted(map(str, state))}")
