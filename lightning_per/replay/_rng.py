"""A sampler's own random generator on its device, derived from the replay buffer's generator.

TorchRL hands every component the buffer's generator (``ReplayBuffer(generator=...)``, ``set_rng``),
usually a CPU generator. Drawing on the CPU and copying would cost a host round trip per step, so a
sampler keeps a generator on its own device, seeded from a fingerprint of the buffer generator's
*state* (never consuming it). The device generator's state travels in the sampler's ``state_dict``;
when a checkpoint restores the buffer's generator to the state it was derived from, the sampler keeps
its restored device state, so a resumed run draws exactly the samples the original would have.
"""

from __future__ import annotations

import hashlib

import torch

__all__ = ["DeviceRNGMixin"]


def _fingerprint(generator: torch.Generator) -> int:
    state = generator.get_state()  # CPU ByteTensor, also for CUDA generators: no device sync
    digest = hashlib.sha256(state.numpy().tobytes()).digest()  # sync-ok: get_state() is a CPU tensor
    return int.from_bytes(digest[:8], "little") >> 1


class DeviceRNGMixin:
    """Gives a sampler ``self.generator`` (a ``torch.Generator`` on ``self._device``)."""

    _device: torch.device

    def _init_rng(self, seed: int | None = None) -> None:
        self._rng_fingerprint: int | None = None
        self._buffer_rng: torch.Generator | None = None
        gen = torch.Generator(device=self._device)
        if seed is None:
            # follows torch.manual_seed: draws one int from the default CPU generator (host only)
            seed = int(torch.randint(0, 2**62, (1,)))
        gen.manual_seed(seed)
        self.generator = gen

    @property
    def _rng(self) -> torch.Generator | None:
        return self._buffer_rng

    @_rng.setter
    def _rng(self, generator: torch.Generator | None) -> None:
        # TorchRL's Sampler declares ``_rng = None`` at class level and buffers assign it.
        self._buffer_rng = generator
        if generator is None or not hasattr(self, "generator"):
            return
        fp = _fingerprint(generator)
        if fp != self._rng_fingerprint:
            self._rng_fingerprint = fp
            self.generator.manual_seed(fp)
            self._seeded()

    def manual_seed(self, seed: int) -> None:
        """Seed the device generator directly (reproducible runs without a buffer generator)."""
        self.generator.manual_seed(int(seed))
        self._seeded()

    def _seeded(self) -> None:
        """Hook: the generator was just seeded (samplers with other random state derived from it re-derive it)."""

    def get_rng_state(self) -> dict:
        """The state of the random streams the draws use, to replay them with :meth:`set_rng_state`:
        ``{"generator": CPU uint8 tensor, "device_rng": None}`` here (samplers with more state add it)."""
        return {"generator": self.generator.get_state(), "device_rng": None}

    def set_rng_state(self, state: dict) -> None:
        """Restore a :meth:`get_rng_state` result.

        Raises:
            TypeError, ValueError: ``state`` is not such a dict (see :func:`check_rng_state`); nothing changes.
        """
        check_rng_state(state)
        self.generator.set_state(state["generator"])

    def _rng_state(self) -> dict:
        return {"generator": self.generator.get_state(), "fingerprint": self._rng_fingerprint}

    def _check_rng_checkpoint(self, rng) -> None:
        """Raise unless ``rng`` is a saved :meth:`_rng_state` that this sampler's generator accepts (tried on a
        fresh generator of its device, never on the sampler's own: nothing changes).

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

    def _load_rng_state(self, state: dict) -> None:
        self.generator.set_state(state["generator"].cpu())  # sync-ok: checkpoint load, not a step
        self._rng_fingerprint = state["fingerprint"]


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
