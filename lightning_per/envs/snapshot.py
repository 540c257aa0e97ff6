"""An environment's dynamic state in a checkpoint: captured, checked and restored by an allow-list per env kind.

A checkpoint is data, so the state it carries is checked like any input before it reaches the env. Each env kind
has its list of dynamic state (what changes while it runs); everything else an env holds (gravity, the pole's
length, the thresholds, ``tau``, the time limit, the spaces) is a constant of the env this run built, and is never
restored.

The allow-lists (``_ALLOWED``; "the RNG" is ``_np_random``, a NumPy ``Generator`` whose bit generator is of the
live one's kind, and ``_np_random_seed``):

* :class:`~lightning_per.envs.TorchCartPoleEnv`: ``state (E, 4) float32``, ``steps (E,) int64`` (at most
  ``max_steps``), ``rng`` (its ``torch.Generator``'s state);
* Gymnasium ``CartPoleEnv``: ``state (4,) float64``, ``steps_beyond_terminated``, the RNG;
* ``AcrobotEnv``: ``state (4,) float32/float64``, the RNG;
* ``MountainCarEnv``: ``state (2,) float64`` (an array, or the pair of numbers a step leaves), the RNG;
* ``Continuous_MountainCarEnv``: ``state (2,) float32/float64``, the RNG;
* ``PendulumEnv``: ``state (2,) float32/float64``, ``last_u``, the RNG;
* the wrappers of ``gymnasium.make``: ``TimeLimit._elapsed_steps`` (at most the live ``_max_episode_steps``),
  ``OrderEnforcing._has_reset``, ``PassiveEnvChecker``'s ``checked_*`` flags and ``close_called``.

Gymnasium envs are captured in a ``SyncVectorEnv`` whose members consist of these layers
only; any other env (ALE, ale-py's vector env, ``AsyncVectorEnv``, toy text, Box2D, an env of your own) is not
captured, and a resumed run starts new episodes there.

Restoring is all or nothing: every value is decoded and checked first (type, dtype, shape, finiteness, range,
against the live env), then all are set. Three outcomes:

* restored (True);
* does not fit (False, a warning, the env untouched: a resumed run starts new episodes): no state, a state of
  another kind or another number of members or layers, an env that is not captured, a layer's dynamic
  attribute missing;
* refused (``ValueError`` naming the member, the layer and the attribute, the env untouched): a dynamic value
  that fails its check (``state = "abc"``, a NaN, another dtype or shape, a step count past the time limit, an
  RNG state of another kind), or a constant that differs from the live env's (``tau = nan``, ``gravity = 0``,
  ``x_threshold = 1e9``). A snapshot may carry constants (an older format stored every attribute): a constant
  equal to the live env's is ignored; one that differs is refused rather than ignored, since a checkpoint that
  says the task is another task is not one to resume quietly.

The Gymnasium state is stored as one JSON text (numbers, strings, arrays as lists with their dtype): loading it
never runs code.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium.envs.classic_control import (
    AcrobotEnv,
    CartPoleEnv,
    Continuous_MountainCarEnv,
    MountainCarEnv,
    PendulumEnv,
)
from gymnasium.vector import SyncVectorEnv
from gymnasium.wrappers import OrderEnforcing, PassiveEnvChecker, TimeLimit
from torchrl.envs import EnvBase, GymWrapper

from lightning_per.envs.torch_cartpole import TorchCartPoleEnv
from lightning_per.replay.compat import wrapped_gym_env

__all__ = ["check_env_state", "restore_env", "snapshot_env"]

_TORCH_KIND = "torch"
_GYM_KIND = "gym_vector_json"


class _DoesNotFit(Exception):
    """The snapshot is not one for this env (nothing is restored; a resumed run starts new episodes)."""


def snapshot_env(env: EnvBase) -> dict[str, Any] | None:
    """The environment's dynamic state for a checkpoint, or None where its kind is not captured.

    Returns:
        ``{"kind": "torch", "state": {...}}`` (CPU tensors) for :class:`TorchCartPoleEnv`;
        ``{"kind": "gym_vector_json", "state": str}`` for a Gymnasium ``SyncVectorEnv`` of allow-listed layers
        (one JSON text: per member, per layer outermost first, the layer's allow-listed attributes);
        None otherwise, and where a value would not pass :func:`restore_env`'s checks (what is written can be
        read back).
    """
    if isinstance(env, TorchCartPoleEnv):
        snapshot = {"kind": _TORCH_KIND, "state": env.snapshot()}
    else:
        members = _members(env)
        if members is None:
            return None
        try:
            layers = [[{name: _encode(vars(layer)[name]) for name in _ALLOWED[type(layer)] if name in vars(layer)}
                       for layer in _layers(member)] for member in members]
            snapshot = {"kind": _GYM_KIND, "state": json.dumps(layers)}
        except (_NotPlain, TypeError, ValueError):  # e.g. a bit generator whose state holds arrays
            return None
    try:
        _plan(env, snapshot)
    except (_DoesNotFit, ValueError):
        return None
    return snapshot


def check_env_state(env: EnvBase, snapshot: Any) -> bool:
    """Check a :func:`snapshot_env` result against ``env`` without changing it: True where :func:`restore_env`
    would restore it, False where it does not fit (a resumed run starts new episodes).

    Raises:
        ValueError: the snapshot is refused (a dynamic value fails its check, or a constant differs from
            ``env``'s), naming the member, the layer and the attribute.
    """
    try:
        _plan(env, snapshot)
    except _DoesNotFit:
        return False
    return True


def restore_env(env: EnvBase, snapshot: Any) -> bool:
    """Restore a :func:`snapshot_env` result: every value checked first, then all set (see the module docstring).

    Returns:
        True where restored; False, with a warning and ``env`` untouched, where the snapshot does not fit.

    Raises:
        ValueError: the snapshot is refused, naming the member, the layer and the attribute; ``env`` untouched.
    """
    try:
        apply = _plan(env, snapshot)
    except _DoesNotFit as reason:
        warnings.warn(f"the environment state is not in the checkpoint (or does not fit this env: {reason}): the "
                      "resumed run starts new episodes, so its transitions differ from an uninterrupted run",
                      stacklevel=2)
        return False
    apply()
    return True


def _plan(env: EnvBase, snapshot: Any):
    """Decode and check all of ``snapshot`` against ``env``; returns a function that sets it.

    Raises:
        _DoesNotFit, ValueError: see :func:`restore_env`.
    """
    if not isinstance(snapshot, dict) or snapshot.get("kind") not in (_TORCH_KIND, _GYM_KIND):
        raise _DoesNotFit("no snapshot" if snapshot is None else "a snapshot of another format")
    if snapshot["kind"] == _TORCH_KIND:
        if not isinstance(env, TorchCartPoleEnv):
            raise _DoesNotFit("a torch env's state")
        state = snapshot.get("state")
        env.checked_snapshot(state)
        return lambda: env.restore(state)
    members = _members(env)
    if members is None:
        raise _DoesNotFit("this env's state is not captured")
    text = snapshot.get("state")
    if not isinstance(text, str):
        raise ValueError(f"env state: expected a JSON text, got {type(text).__name__}")
    try:
        saved = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise ValueError(f"env state: not JSON ({type(err).__name__})") from None
    targets = [_layers(member) for member in members]
    if not isinstance(saved, list) or not all(isinstance(s, list) for s in saved):
        raise ValueError("env state: expected a list per member of a list per layer")
    if len(saved) != len(targets) or any(len(s) != len(t) for s, t in zip(saved, targets)):
        raise _DoesNotFit(f"{len(saved)} members of {[len(s) for s in saved]} layers, this env has "
                          f"{len(targets)} of {[len(t) for t in targets]}")
    plan = []  # every value of every layer decoded and checked before any is set
    for i, (member, layers) in enumerate(zip(saved, targets)):
        for attrs, layer in zip(member, layers):
            plan.append((layer, _checked_layer(i, layer, attrs)))

    def apply() -> None:
        for layer, values in plan:
            for name, value in values.items():
                if isinstance(value, _RNGState):
                    getattr(layer, name).bit_generator.state = value.state
                else:
                    setattr(layer, name, value)

    return apply


def _members(env: EnvBase) -> list[Any] | None:
    """The member envs of a Gymnasium ``SyncVectorEnv`` under TorchRL's ``GymWrapper`` whose layers are all
    allow-listed, else None."""
    venv = wrapped_gym_env(env) if isinstance(env, GymWrapper) else None
    if not isinstance(venv, SyncVectorEnv):
        return None
    members = list(venv.envs)
    if not all(type(layer) in _ALLOWED for member in members for layer in _layers(member)):
        return None
    return members


def _layers(member) -> list[Any]:
    """A Gymnasium env's wrapper chain, outermost first, down to the unwrapped env."""
    layers = [member]
    while hasattr(layers[-1], "env") and len(layers) < 64:
        layers.append(layers[-1].env)
    return layers


def _checked_layer(member: int, layer, attrs: Any) -> dict[str, Any]:
    """The values to set on ``layer`` (member ``member``): each allow-listed attribute of ``attrs`` decoded and
    checked; every other attribute of ``attrs`` equal to the live one (then ignored).

    Raises:
        _DoesNotFit: an allow-listed attribute the live layer has is missing. ValueError: naming the attribute.
    """
    where = f"env state, member {member}, {type(layer).__name__}"
    if not isinstance(attrs, dict):
        raise ValueError(f"{where}: expected an object of attributes, got {type(attrs).__name__}")
    have, allowed = vars(layer), _ALLOWED[type(layer)]
    missing = [name for name in allowed if name in have and name not in attrs]
    if missing:
        raise _DoesNotFit(f"{where} lacks {', '.join(missing)}")
    out: dict[str, Any] = {}
    for name, encoded in attrs.items():
        if name in allowed and name in have:
            try:
                value = _decode(encoded)
            except (_NotPlain, ValueError, TypeError, KeyError, OverflowError, RecursionError) as err:
                raise ValueError(f"{where}.{name}: not a plain value ({type(err).__name__}: {err})") from None
            out[name] = allowed[name].checked(f"{where}.{name}", value, layer, have[name])
        elif name not in have:
            raise ValueError(f"{where}.{name}: this env has no such attribute; refused")
        elif not _same_constant(encoded, have[name]):
            raise ValueError(f"{where}.{name} = {_shown(encoded)}: a constant of the environment, never restored, and "
                             f"this env has {_shown(_encode_or_none(have[name]))}; refused")
    return out


def _same_constant(encoded: Any, live: Any) -> bool:
    """Whether a snapshot's ``encoded`` value is exactly the live env's ``live`` value (compared as JSON)."""
    try:
        return json.loads(json.dumps(encoded)) == json.loads(json.dumps(_encode(live)))
    except (_NotPlain, ValueError, TypeError, RecursionError):
        return False


def _encode_or_none(value: Any) -> Any:
    try:
        return _encode(value)
    except _NotPlain:
        return f"<{type(value).__name__}>"


def _shown(encoded: Any) -> str:
    """A short one-line rendering of an encoded value for a message."""
    if isinstance(encoded, dict) and "__float__" in encoded:
        text = str(encoded["__float__"])
    elif isinstance(encoded, dict) and "__scalar__" in encoded:
        text = str(encoded["__scalar__"])
    else:
        try:
            text = repr(encoded) if isinstance(encoded, str) else json.dumps(encoded)
        except (TypeError, ValueError, RecursionError):
            text = f"<{type(encoded).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------------------------------------- the checks
def _described(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"a {value.dtype} array of shape {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"{type(value).__name__} {_shown(value) if isinstance(value, (str, bool, int, float)) else ''}".strip()


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


@dataclass(frozen=True)
class _Vector:
    """A finite real vector of ``size`` numbers: an array of one of ``dtypes`` (NumPy ``dtype.str``), or with
    ``pair_of_numbers`` also a tuple of numbers (MountainCar keeps ``(position, velocity)`` after a step)."""

    size: int
    dtypes: tuple[str, ...]
    pair_of_numbers: bool = False

    def checked(self, where: str, value: Any, layer: Any, live: Any) -> Any:
        expected = f"a finite {'/'.join(np.dtype(d).name for d in self.dtypes)} array of shape ({self.size},)"
        if isinstance(value, np.ndarray):
            if value.dtype.str not in self.dtypes or value.shape != (self.size,):
                raise ValueError(f"{where}: expected {expected}, got {_described(value)}")
            numbers = value
        elif self.pair_of_numbers and isinstance(value, tuple) and len(value) == self.size \
                and all(_is_number(v) for v in value):
            numbers = np.asarray([float(v) for v in value])
        else:
            raise ValueError(f"{where}: expected {expected}, got {_described(value)}")
        if not np.isfinite(numbers).all():
            raise ValueError(f"{where}: expected {expected}, got a non-finite value")
        return value


@dataclass(frozen=True)
class _Number:
    """A finite real number, or None."""

    def checked(self, where: str, value: Any, layer: Any, live: Any) -> Any:
        if value is None or _is_number(value) and np.isfinite(float(value)):
            return value
        raise ValueError(f"{where}: expected None or a finite number, got {_described(value)}")


@dataclass(frozen=True)
class _Count:
    """None or an int >= 0, at most the live layer's attribute ``most`` where given."""

    most: str | None = None

    def checked(self, where: str, value: Any, layer: Any, live: Any) -> Any:
        bound = None if self.most is None else vars(layer).get(self.most)
        if value is None or isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
                and (not isinstance(bound, int) or value <= bound):
            return value
        limit = f" in [0, {bound}] ({self.most})" if isinstance(bound, int) else " >= 0"
        raise ValueError(f"{where}: expected None or an int{limit}, got {_described(value)}")


@dataclass(frozen=True)
class _Flag:
    """A bool."""

    def checked(self, where: str, value: Any, layer: Any, live: Any) -> Any:
        if isinstance(value, bool):
            return value
        raise ValueError(f"{where}: expected a bool, got {_described(value)}")


@dataclass(frozen=True)
class _Seed:
    """The seed Gymnasium records (``np_random_seed``): None or an int >= -1."""

    def checked(self, where: str, value: Any, layer: Any, live: Any) -> Any:
        if value is None or isinstance(value, int) and not isinstance(value, bool) and value >= -1:
            return value
        raise ValueError(f"{where}: expected None or an int >= -1, got {_described(value)}")


class _RNGState:
    """A NumPy bit-generator state, checked, to set on the live generator."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state


@dataclass(frozen=True)
class _Generator:
    """The state of a NumPy ``Generator`` whose bit generator is of the live one's kind (set into a scratch bit
    generator first: NumPy checks the fields; the value read back must equal the one given)."""

    def checked(self, where: str, value: Any, layer: Any, live: Any) -> Any:
        if not isinstance(live, np.random.Generator):
            raise ValueError(f"{where}: this env's attribute is not a NumPy Generator; refused")
        kind = type(live.bit_generator).__name__
        if not isinstance(value, _RNGState) or not isinstance(value.state, dict) \
                or value.state.get("bit_generator") != kind:
            raise ValueError(f"{where}: expected the state of a {kind} bit generator")
        scratch = type(live.bit_generator)()
        try:
            scratch.state = value.state
        except (ValueError, TypeError, KeyError, OverflowError) as err:
            raise ValueError(f"{where}: not a {kind} state ({type(err).__name__}: {err})") from None
        if scratch.state != value.state:
            raise ValueError(f"{where}: not a {kind} state (NumPy reads it back differently)")
        return _RNGState(scratch.state)


_RNG = {"_np_random": _Generator(), "_np_random_seed": _Seed()}

#: Per layer class (exactly that class, not a subclass), its dynamic attributes and their checks.
_ALLOWED: dict[type, dict[str, Any]] = {
    CartPoleEnv: {"state": _Vector(4, ("<f8",)), "steps_beyond_terminated": _Count(), **_RNG},
    AcrobotEnv: {"state": _Vector(4, ("<f4", "<f8")), **_RNG},
    MountainCarEnv: {"state": _Vector(2, ("<f8",), pair_of_numbers=True), **_RNG},
    Continuous_MountainCarEnv: {"state": _Vector(2, ("<f4", "<f8")), **_RNG},
    PendulumEnv: {"state": _Vector(2, ("<f4", "<f8")), "last_u": _Number(), **_RNG},
    TimeLimit: {"_elapsed_steps": _Count(most="_max_episode_steps")},
    OrderEnforcing: {"_has_reset": _Flag()},
    PassiveEnvChecker: {"checked_reset": _Flag(), "checked_step": _Flag(), "checked_render": _Flag(),
                        "close_called": _Flag(), "checked_data_reuse": _Flag()},
}


# ---------------------------------------------------------------------------------------------- JSON encoding
class _NotPlain(Exception):
    """A value that is not plain data."""


def _encode(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        if isinstance(value, float) and not np.isfinite(value):
            return {"__float__": repr(value)}
        return value
    if isinstance(value, np.random.Generator):
        return {"__rng__": value.bit_generator.state}
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        return {"__scalar__": value.item(), "dtype": value.dtype.str}
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return {"__ndarray__": value.tolist(), "dtype": value.dtype.str, "shape": list(value.shape)}
    if isinstance(value, (tuple, list)):
        return {"__seq__": [_encode(v) for v in value], "tuple": isinstance(value, tuple)}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"__map__": {k: _encode(v) for k, v in value.items()}}
    raise _NotPlain(type(value).__name__)


def _decode(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if not isinstance(value, dict):
        raise _NotPlain(type(value).__name__)
    if "__rng__" in value:
        return _RNGState(value["__rng__"])
    if "__float__" in value:
        return float(str(value["__float__"]))
    if "__scalar__" in value:
        if not _is_number(value["__scalar__"]) and not isinstance(value["__scalar__"], bool):
            raise _NotPlain(type(value["__scalar__"]).__name__)
        return _numeric_dtype(value["dtype"]).type(value["__scalar__"])
    if "__ndarray__" in value:
        raw = np.asarray(value["__ndarray__"])
        if raw.dtype.kind not in "biuf":
            raise _NotPlain(f"an array of {raw.dtype}")
        return raw.astype(_numeric_dtype(value["dtype"])).reshape(value["shape"])
    if "__seq__" in value and isinstance(value["__seq__"], list):
        items = [_decode(v) for v in value["__seq__"]]
        return tuple(items) if value.get("tuple") else items
    if "__map__" in value and isinstance(value["__map__"], dict):
        return {str(k): _decode(v) for k, v in value["__map__"].items()}
    raise _NotPlain("an unknown encoding")


def _numeric_dtype(name) -> np.dtype:
    dtype = np.dtype(str(name))
    if dtype.kind not in "biuf":
        raise _NotPlain(f"dtype {name}")
    return dtype

