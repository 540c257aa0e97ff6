"""Centering the network's input (`obs_center_steps`, the networks' `obs_loc`): the mean observation of random play
against NumPy's mean of the same play recorded step by step; each network's features of an observation against a
twin's features of the observation minus the location; the module, a real run and a checkpoint keeping it."""

from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from lightning_per.actors.envs import TOY_ENV_ID, make_env_group, mean_observation
from lightning_per.ga3c.config import GA3CConfig
from lightning_per.ga3c.module import GA3C
from lightning_per.ga3c.networks import A3CConvNet, MinAtarConvNet, MLPActorCritic

_TOY_IMAGE = {"env": TOY_ENV_ID, "backend": "gym", "kwargs": {"image": True}, "frame_stack": 4}


def _recorded_mean(spec: dict, steps: int, seed: int) -> np.ndarray:
    """Every observation of the play, kept, then averaged by NumPy (float64)."""
    group = make_env_group(spec)
    rng = np.random.default_rng(seed)
    seen = [group.reset(seed=seed)]
    for _ in range(steps - 1):
        seen.append(group.step(rng.integers(0, group.n_actions, group.num_envs))[0])
    group.close()
    return np.concatenate(seen).astype(np.float64).mean(axis=0)


@pytest.mark.parametrize("spec, steps, seed", [
    ({"env": "CartPole-v1", "backend": "gym", "num_envs": 3, "kwargs": {}}, 40, 0),
    ({**_TOY_IMAGE, "num_envs": 2}, 9, 5),  # uint8 frames, episodes of 3 steps: resets inside the play
    ({**_TOY_IMAGE, "num_envs": 1}, 1, 1),  # the reset's observations alone
])
def test_mean_observation_is_the_mean_of_the_recorded_play(spec, steps, seed):
    got = mean_observation(spec, steps, seed)
    want = _recorded_mean(spec, steps, seed)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert np.array_equal(got, mean_observation(spec, steps, seed))  # same spec, steps and seed: same mean


def test_mean_observation_counts_the_reset_and_steps_minus_one_random_steps():
    # Gymnasium's CartPole stepped by hand: env k reset with seed + k, then one vector step of the actions
    # numpy.random.default_rng(seed) draws; 2 observations per env, 6 in all
    import gymnasium as gym

    seed, envs = 4, [gym.make("CartPole-v1") for _ in range(3)]
    first = [env.reset(seed=seed + k)[0] for k, env in enumerate(envs)]
    actions = np.random.default_rng(seed).integers(0, 2, 3)
    second = [env.step(int(a))[0] for env, a in zip(envs, actions)]
    want = np.mean(np.stack(first + second).astype(np.float64), axis=0)
    got = mean_observation({"env": "CartPole-v1", "backend": "gym", "num_envs": 3, "kwargs": {}}, 2, seed)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_mean_observation_of_a_lit_half_is_its_share_of_episodes():
    # the toy's frame lights the cue's half at 200 (rows above the time line halved): at the reset every row is
    # full, so over many envs each half's mean tends to 200 x the share of episodes whose cue lit it
    spec = {**_TOY_IMAGE, "num_envs": 400}
    loc = mean_observation(spec, 1, seed=0)
    left = loc[:, :, :42].mean()
    assert left + loc[:, :, 42:].mean() == pytest.approx(200.0, abs=1e-3)  # each frame lights exactly one half
    assert left == pytest.approx(100.0, abs=200 * 3 * 0.025)  # Binomial(400, 1/2) / 400: 3 sigma = 0.075


@pytest.mark.parametrize("steps", [0, -1, True, 2.5])
def test_mean_observation_refuses_steps_below_one(steps):
    with pytest.raises(ValueError, match=r"^steps must be an int >= 1"):
        mean_observation({"env": "CartPole-v1", "backend": "gym", "num_envs": 1, "kwargs": {}}, steps)


@pytest.mark.parametrize("make, obs, shifted", [
    # uint8 frames: the location is in pixels and comes off before the 1/255 scaling
    (lambda: A3CConvNet(4, 6), torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8),
     lambda obs, loc: (obs.float() - loc) / 255.0),
    (lambda: MinAtarConvNet(4, 3), torch.rand(3, 10, 10, 4) > 0.7, lambda obs, loc: obs.float() - loc),
    (lambda: MLPActorCritic(4, 2, (16, 8)), torch.randn(3, 4), lambda obs, loc: obs - loc),
])
def test_each_network_subtracts_its_location_before_anything_else(make, obs, shifted):
    torch.manual_seed(0)
    net = make()
    twin = make()
    twin.load_state_dict(net.state_dict())
    assert torch.equal(net.obs_loc, torch.zeros_like(net.obs_loc))  # unset: the input as it comes
    loc = torch.rand(net.obs_loc.shape) * (255 if obs.dtype == torch.uint8 else 1)
    net.obs_loc.copy_(loc)
    with torch.no_grad():
        got, want = net.features(obs), twin.features(shifted(obs, loc))
    torch.testing.assert_close(got, want)
    assert "obs_loc" in net.state_dict() and all(p is not net.obs_loc for p in net.parameters())  # kept, not trained


def _cfg(**overrides) -> GA3CConfig:
    base = dict(env=TOY_ENV_ID, env_kwargs={"image": True}, agents=2, envs_per_agent=2, t_max=3,
                train_min_batch_size=12, max_updates=6, updates_per_epoch=3, max_time_s=60, status_interval_s=0,
                device="cpu", seed=7)
    return GA3CConfig(**{**base, **overrides})


def test_the_module_centers_with_the_mean_of_its_own_envs_and_seed():
    cfg = _cfg(obs_center_steps=6)
    model = GA3C(cfg)
    want = _recorded_mean({**_TOY_IMAGE, "num_envs": cfg.envs_per_agent}, 6, cfg.seed)
    np.testing.assert_allclose(model.net.obs_loc.numpy(), want, rtol=1e-6, atol=1e-6)
    assert torch.equal(GA3C(_cfg()).net.obs_loc, torch.zeros(4, 84, 84))  # 0: no centering


@pytest.mark.parametrize("steps", [-1, True, 1.5, "8"])
def test_the_config_refuses_a_negative_or_non_integer_obs_center_steps(steps):
    with pytest.raises(ValueError, match=r"^obs_center_steps must be an int >= 0"):
        _cfg(obs_center_steps=steps).validate()


def test_a_centered_run_acts_and_trains_on_centered_frames_and_its_checkpoint_keeps_the_location(tmp_path):
    seen: dict[str, list] = {"act": [], "update": []}

    class Watching(GA3C):
        """Records the first conv layer's input as the network sees it, in the predictors and in the update."""

        def __init__(self, cfg):
            super().__init__(cfg)
            self.net.trunk[0].register_forward_pre_hook(lambda mod, args: seen[
                "update" if torch.is_grad_enabled() else "act"].append(args[0].detach().clone()))

    cfg = _cfg(obs_center_steps=5)
    model = Watching(cfg)
    loc = model.net.obs_loc.clone()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=-1, logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(model)
    assert model.updates == 6 and seen["act"] and len(seen["update"]) == 6
    # every frame of the toy is 0, 100 or 200 in each pixel: centered and scaled, (value - loc) / 255
    allowed = [(v - loc) / 255.0 for v in (0.0, 100.0, 200.0)]
    for x in seen["act"] + seen["update"]:
        assert bool(torch.stack([(x - a).abs() < 1e-5 for a in allowed]).any(0).all())
    assert torch.equal(model.net.obs_loc, loc)  # no update moves it
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    restored = GA3C(_cfg())  # uncentered until the checkpoint's state is loaded
    restored.load_state_dict(torch.load(tmp_path / "last.ckpt", weights_only=True)["state_dict"])
    assert torch.equal(restored.net.obs_loc, loc)


def test_a_checkpoint_without_a_location_loads_uncentered(tmp_path):
    model = GA3C(_cfg(obs_center_steps=3))
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.strategy.connect(model)
    trainer.save_checkpoint(tmp_path / "new.ckpt")
    old = torch.load(tmp_path / "new.ckpt", weights_only=True)
    del old["state_dict"]["net.obs_loc"]  # as the networks wrote it before they held one
    torch.save(old, tmp_path / "old.ckpt")
    with pytest.warns(UserWarning, match=r"no net\.obs_loc .* loads uncentered although obs_center_steps=3"):
        loaded = GA3C.load_from_checkpoint(tmp_path / "old.ckpt", map_location="cpu")  # its config centers
    assert torch.equal(loaded.net.obs_loc, torch.zeros(4, 84, 84))
    for name, value in old["state_dict"].items():
        torch.testing.assert_close(loaded.state_dict()[name], value, rtol=0, atol=0, equal_nan=True)
