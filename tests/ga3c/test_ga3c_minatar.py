"""GA3C on MinAtar (Young & Tian 2019, the optional ``minatar`` package; skipped without it): the env group's frames,
actions and rewards against MinAtar's own game object, and the committed config's optimizer against the defect that
kept its policy uniform (docs/ga3c.md, "Policy lag on CPU: MinAtar"). About 5 s on 2 cores."""

import warnings

import numpy as np
import pytest

from lightning_per.actors.envs import make_env_group

minatar = pytest.importorskip("minatar")


def test_breakout_frames_are_the_games_state_as_float32_with_its_minimal_action_set():
    group = make_env_group({"env": "MinAtar/Breakout-v1", "backend": "gym", "num_envs": 2})
    game = group.envs[0].unwrapped.game  # MinAtar's Environment, the independent source
    assert group.obs_shape == (10, 10, 4) and group.obs_dtype == np.float32
    assert group.n_actions == len(game.minimal_action_set()) == 3  # Breakout: no-op, left, right
    obs = group.reset(seed=3)
    np.testing.assert_array_equal(obs[0], game.state().astype(np.float32))
    for t in range(200):
        obs, reward, term, trunc = group.step(np.array([t % 3, 2 - t % 3]))
        np.testing.assert_array_equal(obs[0], game.state().astype(np.float32))  # after an end: the next episode's
    assert set(np.unique(obs)) <= {0.0, 1.0}
    group.close()
    with warnings.catch_warnings():  # a second group does not register MinAtar's ids again (gymnasium warns)
        warnings.simplefilter("error")
        make_env_group({"env": "MinAtar/Breakout-v1", "backend": "gym", "num_envs": 1}).close()


def _random_breakout_batch(n: int = 40, seed: int = 0):
    """``n`` transitions of a uniform-random policy on Breakout with 5-step returns (no bootstrap), in NumPy."""
    group = make_env_group({"env": "MinAtar/Breakout-v1", "backend": "gym", "num_envs": 1})
    rng = np.random.default_rng(seed)
    obs, act, rew, end = [group.reset(seed=seed)[0]], [], [], []
    for _ in range(4 * n):
        a = int(rng.integers(3))
        o, r, te, tr = group.step(np.array([a]))
        act.append(a), rew.append(float(r[0])), end.append(bool(te[0] or tr[0])), obs.append(o[0])
    group.close()
    ret = np.zeros(len(act), dtype=np.float32)
    for i in range(len(act)):
        for k in range(i, min(i + 5, len(act))):
            ret[i] += 0.99 ** (k - i) * rew[k]
            if end[k]:
                break
    pick = rng.choice(len(act), n, replace=False)
    return np.stack(obs[:-1])[pick], np.array(act)[pick], ret[pick]


def _policy_shift(module, batch, updates: int = 20) -> float:
    """Mean total-variation distance between the policy on the batch's states before and after ``updates`` updates
    of the module's optimizer on the A3C loss of that batch."""
    import torch

    from lightning_per.ga3c.loss import a3c_loss

    obs, action, ret = (torch.as_tensor(x) for x in batch)
    with torch.no_grad():
        before = torch.softmax(module.net(obs)[0], -1)
    opt = module.make_optimizer()
    for _ in range(updates):
        logits, value = module.net(obs)
        loss, _ = a3c_loss(logits, value, action, ret, beta=module.cfg.beta)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        after = torch.softmax(module.net(obs)[0], -1)
    return float(0.5 * (after - before).abs().sum(-1).mean())


def test_the_configs_optimizer_moves_the_policy_on_breakout_gradients():
    """The defect: RMSProp-TF with eps 0.1 inside the square root (GA3C's setting, made for a summed loss) and the
    batch-mean loss divided Breakout's gradients (about 1e-3) by sqrt(0.1), so a step was about 1e-3 of lr and the
    policy stayed uniform for thousands of updates. The committed config's optimizer moves it at lr's scale."""
    from pathlib import Path

    from lightning_per.ga3c import GA3C, load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "ga3c_minatar.yaml")
    batch = _random_breakout_batch()
    moved = _policy_shift(GA3C(cfg), batch)
    frozen = _policy_shift(GA3C(cfg, optimizer="rmsprop_tf", rmsprop_eps=0.1), batch)  # the settings before
    assert moved > 0.05 and moved > 10 * frozen, (moved, frozen)  # measured: 0.156 against 0.008
