"""A checkpoint's env state and env id are data, checked before anything reaches the env.

Only each env kind's dynamic state is restored (CartPole's ``state``, ``steps_beyond_terminated``, the time
limit's ``_elapsed_steps``, the RNG ...), each value checked for type, dtype, shape and finiteness, all before
any is set; a constant (``tau``, ``gravity``, ``x_threshold``, the time limit) that differs from the live env's
is refused in one line naming it. An ``env.id`` of Gymnasium's ``module:Id`` form read from a checkpoint never
imports its module (a real module on ``sys.path`` writes a marker file when imported: it must never appear).
Expected values come from Gymnasium's own constants and from an uninterrupted env, never from the code under test.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_per import cli
from lightning_per.callbacks import AtomicCheckpointIO
from lightning_per.envs import (
    EnvConfig,
    TorchCartPoleEnv,
    check_checkpoint_env_id,
    check_env_state,
    make_env,
    restore_env,
    snapshot_env,
)

CONFIG = str(Path(__file__).parents[2] / "configs" / "dqn_cartpole.yaml")
TINY = ["--model.env.num_envs=2", "--model.replay.capacity=1000", "--model.replay.batch_size=16",
        "--model.hidden_sizes=[16, 16]", "--model.warmup_steps=64", "--model.updates_per_epoch=20",
        "--trainer.enable_progress_bar=false"]
CARTPOLE_LAYERS = ["TimeLimit", "OrderEnforcing", "PassiveEnvChecker", "CartPoleEnv"]  # gymnasium.make's chain


def _members(env):
    return env._env.envs


def _layer(env, member: int, name: str):
    layer = _members(env)[member]
    while type(layer).__name__ != name:
        layer = layer.env
    return layer


def _fingerprint(env) -> str:
    """Every member's plain attributes on every layer (dynamic and constant; arrays with their dtype, the RNG's
    state) as one text, to show that a refusal changed nothing."""
    def plain(v):
        if isinstance(v, np.random.Generator):
            return v.bit_generator.state
        if isinstance(v, (np.ndarray, np.generic)):
            return [str(v.dtype), np.asarray(v).tolist()]
        if isinstance(v, (tuple, list)):
            return [plain(x) for x in v]
        return v if v is None or isinstance(v, (bool, int, float, str)) else f"<{type(v).__name__}>"

    out = []
    for member in _members(env):
        layer = member
        while True:
            out.append({k: plain(v) for k, v in vars(layer).items() if k not in ("env", "_previous_data")})
            if not hasattr(layer, "env"):
                break
            layer = layer.env
    return json.dumps(out, sort_keys=True)


def _run(env, td, actions):
    """Step ``env`` with ``actions`` ``(T, E)``; the observations, rewards and done flags of every step."""
    out = []
    for a in actions:
        td["action"] = a
        step, td = env.step_and_maybe_reset(td)
        n = td.batch_size[0]
        out.append(torch.cat([step["next", "observation"].reshape(n, -1).double(),
                              step["next", "reward"].reshape(n, 1).double(),
                              step["next", "done"].reshape(n, 1).double()], 1))
    return torch.stack(out), td


def _actions(env, steps: int, seed: int) -> torch.Tensor:
    """``steps`` batches of random actions of ``env``'s action spec (discrete or a box), from ``seed``."""
    g, shape = torch.Generator().manual_seed(seed), (steps, *env.action_spec.shape)
    space = env.action_spec.space
    if hasattr(space, "n"):
        return torch.randint(int(space.n), shape, generator=g)
    return space.low + (space.high - space.low) * torch.rand(shape, generator=g, dtype=space.low.dtype)


def _stepped(config: EnvConfig, seed: int, steps: int):
    env = make_env(config, seed=seed)
    _, td = _run(env, env.reset(), _actions(env, steps, seed))
    return env, td


def _through_a_checkpoint(snapshot, tmp_path):
    """The snapshot as a resumed run reads it: saved with torch.save, loaded with weights_only=True."""
    torch.save({"env": snapshot}, tmp_path / "snap.pt")
    return torch.load(tmp_path / "snap.pt", weights_only=True)["env"]


def _edited(snapshot, member: int, layer: int, **attrs):
    layers = json.loads(snapshot["state"])
    layers[member][layer].update(attrs)
    return {"kind": snapshot["kind"], "state": json.dumps(layers)}


# --------------------------------------------------------------------------------------- exact round trip
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0",
                                    "Pendulum-v1"])
def test_a_restored_env_continues_the_exact_trajectory(env_id, tmp_path):
    config = EnvConfig(id=env_id, num_envs=3)
    a, td = _stepped(config, seed=7, steps=231)  # past episode ends and resets of some members
    snap, td_copy = _through_a_checkpoint(snapshot_env(a), tmp_path), td.clone()
    actions = _actions(a, 120, seed=1)
    original, _ = _run(a, td, actions)
    b = make_env(config, seed=123)  # another seed: everything that matters comes from the snapshot
    b.reset()
    fresh, _ = _run(make_env(config, seed=123), td_copy.clone(), actions)
    assert not torch.equal(fresh, original)  # without the restore the future differs
    assert check_env_state(b, snap) and restore_env(b, snap)
    resumed, _ = _run(b, td_copy, actions)
    for t in range(len(actions)):  # step by step, bit for bit
        torch.testing.assert_close(resumed[t], original[t], rtol=0, atol=0, msg=f"step {t}")


def test_a_restored_torch_env_continues_the_exact_trajectory(tmp_path):
    config = EnvConfig(backend="torch", num_envs=4, max_episode_steps=30)
    a, td = _stepped(config, seed=3, steps=77)
    snap, td_copy = _through_a_checkpoint(snapshot_env(a), tmp_path), td.clone()
    actions = _actions(a, 90, seed=2)
    original, _ = _run(a, td, actions)
    b = make_env(config, seed=99)
    fresh, _ = _run(make_env(config, seed=99), td_copy.clone(), actions)
    assert not torch.equal(fresh, original)  # without the restore the future differs
    assert restore_env(b, snap)
    resumed, _ = _run(b, td_copy, actions)
    torch.testing.assert_close(resumed, original, rtol=0, atol=0)


def test_the_snapshot_holds_only_the_dynamic_state():
    env, _ = _stepped(EnvConfig(num_envs=2), seed=0, steps=5)
    layers = json.loads(snapshot_env(env)["state"])
    # the names Gymnasium's CartPole-v1 chain changes while it runs (gymnasium/wrappers/common.py, cartpole.py)
    expected = [{"_elapsed_steps"}, {"_has_reset"},
                {"checked_reset", "checked_step", "checked_render", "close_called", "checked_data_reuse"},
                {"state", "steps_beyond_terminated", "_np_random", "_np_random_seed"}]
    assert [[set(layer) for layer in member] for member in layers] == [expected, expected]


def test_an_older_snapshot_carrying_equal_constants_still_restores():
    a, _ = _stepped(EnvConfig(num_envs=2), seed=4, steps=9)
    snap = snapshot_env(a)
    for member in (0, 1):  # the values of gymnasium/envs/classic_control/cartpole.py and CartPole-v1's limit
        snap = _edited(snap, member, 3, gravity=9.8, masscart=1.0, tau=0.02, x_threshold=2.4,
                       kinematics_integrator="euler")
        snap = _edited(snap, member, 0, _max_episode_steps=500)
    b = make_env(EnvConfig(num_envs=2), seed=5)
    assert restore_env(b, snap)
    np.testing.assert_array_equal(_layer(b, 1, "CartPoleEnv").state, _layer(a, 1, "CartPoleEnv").state)
    assert _layer(b, 1, "CartPoleEnv").tau == 0.02


# --------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("layer, attrs, named", [
    (3, {"tau": {"__float__": "nan"}}, "CartPoleEnv.tau"),
    (3, {"tau": math.nan}, "CartPoleEnv.tau"),  # a JSON NaN literal
    (3, {"gravity": 0.0}, "CartPoleEnv.gravity"),
    (3, {"x_threshold": 1e9}, "CartPoleEnv.x_threshold"),
    (3, {"theta_threshold_radians": 3.0}, "CartPoleEnv.theta_threshold_radians"),
    (0, {"_max_episode_steps": 10**9}, "TimeLimit._max_episode_steps"),
    (3, {"not_an_attribute": 1}, "CartPoleEnv.not_an_attribute"),
    (3, {"state": "abc"}, "CartPoleEnv.state"),
    (3, {"state": {"__ndarray__": [0.0, math.nan, 0.0, 0.0], "dtype": "<f8", "shape": [4]}}, "CartPoleEnv.state"),
    (3, {"state": {"__ndarray__": [0.0, 1e400, 0.0, 0.0], "dtype": "<f8", "shape": [4]}}, "CartPoleEnv.state"),
    (3, {"state": {"__ndarray__": [0.0, 0.0, 0.0], "dtype": "<f8", "shape": [3]}}, "CartPoleEnv.state"),
    (3, {"state": {"__ndarray__": [0, 0, 0, 0], "dtype": "<i8", "shape": [4]}}, "CartPoleEnv.state"),
    (3, {"state": {"__ndarray__": ["1", "2", "3", "4"], "dtype": "<f8", "shape": [4]}}, "CartPoleEnv.state"),
    (3, {"state": {"__ndarray__": [0.0, 0.0, 0.0, 0.0], "dtype": "|O", "shape": [4]}}, "CartPoleEnv.state"),
    (3, {"steps_beyond_terminated": -1}, "CartPoleEnv.steps_beyond_terminated"),
    (3, {"_np_random": {"__rng__": {"bit_generator": "MT19937", "state": {"key": [0], "pos": 0}}}},
     "CartPoleEnv._np_random"),
    (3, {"_np_random": {"__rng__": {"bit_generator": "PCG64", "state": {"state": "x", "inc": 1},
                                    "has_uint32": 0, "uinteger": 0}}}, "CartPoleEnv._np_random"),
    (3, {"_np_random": "abc"}, "CartPoleEnv._np_random"),
    (0, {"_elapsed_steps": 501}, "TimeLimit._elapsed_steps"),  # past CartPole-v1's 500-step limit
    (0, {"_elapsed_steps": 1.5}, "TimeLimit._elapsed_steps"),
    (1, {"_has_reset": 1}, "OrderEnforcing._has_reset"),
])
def test_a_spoiled_env_state_is_refused_in_one_line_and_changes_nothing(layer, attrs, named):
    a, _ = _stepped(EnvConfig(num_envs=2), seed=1, steps=13)
    # member 0 holds a valid state (different from b's), member 1 the spoiled one: nothing may be set
    snap = _edited(snapshot_env(a), 1, layer, **attrs)
    b, _ = _stepped(EnvConfig(num_envs=2), seed=2, steps=4)
    before = _fingerprint(b)
    for call in (check_env_state, restore_env):
        with pytest.raises(ValueError, match=r"member 1, " + named.replace(".", r"\.")) as err:
            call(b, snap)
        assert "\n" not in str(err.value)
        assert _fingerprint(b) == before


@pytest.mark.parametrize("key, value, named", [
    ("state", torch.full((3, 4), math.nan), "TorchCartPoleEnv.state"),
    ("state", torch.zeros(3, 4, dtype=torch.float64), "TorchCartPoleEnv.state"),
    ("state", "abc", "TorchCartPoleEnv.state"),
    ("steps", torch.full((3,), 10**6), "TorchCartPoleEnv.steps"),
    ("steps", torch.full((3,), -1), "TorchCartPoleEnv.steps"),
    ("rng", torch.zeros(7, dtype=torch.uint8), "TorchCartPoleEnv.rng"),
    ("max_steps", 10**9, "TorchCartPoleEnv: expected the keys"),
])
def test_a_spoiled_torch_env_state_is_refused_and_changes_nothing(key, value, named):
    a, _ = _stepped(EnvConfig(backend="torch", num_envs=3), seed=1, steps=13)
    snap = snapshot_env(a)
    snap["state"][key] = value
    b = TorchCartPoleEnv(num_envs=3, seed=5)
    b.reset()
    before = (b.state.clone(), b.steps.clone(), b.rng.get_state())
    with pytest.raises(ValueError, match=named):
        restore_env(b, snap)
    torch.testing.assert_close((b.state, b.steps, b.rng.get_state()), before, rtol=0, atol=0)


def test_a_snapshot_that_does_not_fit_warns_and_changes_nothing():
    b, _ = _stepped(EnvConfig(num_envs=2), seed=2, steps=4)
    before = _fingerprint(b)
    other, _ = _stepped(EnvConfig(num_envs=3), seed=2, steps=4)  # another number of members
    for snap in (None, {"kind": "gym_vector", "state": b"\x80"}, snapshot_env(other),
                 snapshot_env(TorchCartPoleEnv(num_envs=2))):
        assert check_env_state(b, snap) is False
        with pytest.warns(UserWarning, match="starts new episodes"):
            assert restore_env(b, snap) is False
    assert _fingerprint(b) == before


def test_envs_outside_the_allow_list_are_not_captured():
    env = make_env(EnvConfig(id="FrozenLake-v1", num_envs=2), seed=0)
    assert snapshot_env(env) is None


# --------------------------------------------------------------------------------------- env id
@pytest.fixture
def marker_module(tmp_path, monkeypatch):
    """A real module on sys.path that writes a marker file when imported; (module name, marker path)."""
    name, marker = "lp_env_trust_marker", tmp_path / "imported"
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    yield name, marker
    sys.modules.pop(name, None)


def test_the_env_id_rule_allows_only_the_users_own_module(marker_module):
    name, marker = marker_module
    check_checkpoint_env_id("CartPole-v1", "Acrobot-v1")  # no module: the checkpoint's id is kept (and checked later)
    check_checkpoint_env_id(f"{name}:Evil-v0", f"{name}:Evil-v0")  # the user names the same module:Id
    with pytest.raises(ValueError, match=f"env.id '{name}:Evil-v0' names a module"):
        check_checkpoint_env_id(f"{name}:Evil-v0", "CartPole-v1")
    for bad in ("a:b:c", ":Id", "not a module:Id", "", 5):
        with pytest.raises(ValueError, match="env.id"):
            EnvConfig(id=bad).validate()
    assert not marker.exists() and name not in sys.modules


# --------------------------------------------------------------------------------------- through the command line
@pytest.fixture(autouse=True)
def _offline_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("first") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        mp.delenv("WANDB_API_KEY", raising=False)
        cli.cli_main(["fit", "--config", CONFIG, *TINY, f"--trainer.default_root_dir={run}", "--trainer.max_epochs=1"])
    assert (run / "checkpoints" / "last.ckpt").is_file()
    return run


def _reseal(ckpt: Path, edit) -> None:
    """Load the checkpoint, ``edit`` it, save it sealed again (a consistent file refused by its content)."""
    io = AtomicCheckpointIO()
    checkpoint = io.load_checkpoint(ckpt)
    edit(checkpoint)
    io.save_checkpoint(checkpoint, ckpt)


def _spoil_env_state(**attrs):
    def edit(checkpoint):
        env = checkpoint["dqn_state"]["collector"]["env"]
        layers = json.loads(env["state"])
        assert [len(member) for member in layers] == [len(CARTPOLE_LAYERS)] * 2
        layers[1][CARTPOLE_LAYERS.index("CartPoleEnv")].update(attrs)
        env["state"] = json.dumps(layers)
    return edit


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case, attrs, named", [
    ("tau nan", {"tau": {"__float__": "nan"}}, "CartPoleEnv.tau"),
    ("another task", {"gravity": 0.0, "x_threshold": 1e9}, "CartPoleEnv.gravity"),
    ("state abc", {"state": "abc"}, "CartPoleEnv.state"),
])
def test_fit_refuses_a_spoiled_env_state_before_anything_starts(finished_run, tmp_path, capsys, case, attrs, named):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    ckpt = run / "checkpoints" / "last.ckpt"
    _reseal(ckpt, _spoil_env_state(**attrs))
    before = _files(run)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["fit", "--config", CONFIG, *TINY, f"--trainer.default_root_dir={run}", "--trainer.max_epochs=2",
                  "--ckpt_path", str(ckpt)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    message = [line for line in err.splitlines() if "error:" in line]
    assert "Traceback" not in err and len(message) == 1, err[-3000:]
    assert str(ckpt) in message[0] and named in message[0], message[0]
    assert _files(run) == before  # nothing written: no summary, no config, no checkpoint


def test_fit_never_imports_a_module_named_by_a_checkpoints_env_id(finished_run, tmp_path, capsys, marker_module):
    name, marker = marker_module
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    ckpt = run / "checkpoints" / "last.ckpt"
    _reseal(ckpt, lambda c: c["hyper_parameters"]["env"].update(id=f"{name}:CartPole-v1"))
    before = _files(run)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["fit", "--config", CONFIG, *TINY, f"--trainer.default_root_dir={run}", "--trainer.max_epochs=2",
                  "--ckpt_path", str(ckpt)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    message = [line for line in err.splitlines() if "error:" in line]
    assert "Traceback" not in err and len(message) == 1, err[-3000:]
    assert "env.id" in message[0] and name in message[0], message[0]
    assert not marker.exists() and name not in sys.modules
    assert _files(run) == before
