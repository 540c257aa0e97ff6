"""GA3C Atari observations, actions and rewards from both backends, checked against the game itself
(Pong's rules and screen) and ale-py's single-env interface rather than against the wrapper's own output:
(E, 4, 84, 84) uint8 stacks, oldest frame first and newest last, stacks cleared at episode ends, the
policy's action index mapped through the ROM's minimal action set, terminal rewards kept and unclipped."""

from pathlib import Path

import numpy as np
import pytest

from lightning_per.actors.envs import make_env_group, probe_env

pytest.importorskip("ale_py")

PONG_KW = {"frameskip": 4, "repeat_action_probability": 0.0, "noop_max": 30, "num_threads": 1}
BACKGROUND = 87  # Pong's playfield grey after ALE's grayscale conversion
PLAYFIELD = slice(14, 77)  # rows between the score bar and the bottom border (84x84 frame)
OUR_PADDLE_COLUMN = 74  # the agent's (right, green) paddle


def _group(backend, num_envs=2, env="ALE/Pong-v5", kwargs=PONG_KW):
    return make_env_group({"env": env, "backend": backend, "num_envs": num_envs, "kwargs": dict(kwargs),
                           "frame_stack": 4})


def _backends():
    try:
        import cv2  # noqa: F401 - AtariPreprocessing needs it
        return ["ale_vector", "gym"]
    except ImportError:
        return ["ale_vector", pytest.param("gym", marks=pytest.mark.skip(reason="needs opencv-python"))]


def _minimal_action_set(game="pong"):
    """The ROM's minimal action set through ale-py's single-environment interface."""
    import ale_py
    from ale_py import roms

    ale = ale_py.ALEInterface()
    ale.setLoggerMode(ale_py.LoggerMode.Error)
    ale.loadROM(roms.get_rom_path(game))
    return list(ale.getMinimalActionSet())


def _paddle_row(frame):
    rows = np.flatnonzero(np.abs(frame[PLAYFIELD, OUR_PADDLE_COLUMN].astype(int) - BACKGROUND) > 20)
    return rows.mean() if rows.size else np.nan


@pytest.mark.parametrize("backend", _backends())
def test_pong_observations_are_uint8_stacks_newest_last(backend):
    group = _group(backend)
    try:
        assert group.obs_shape == (4, 84, 84) and group.obs_dtype == np.uint8
        obs = group.reset(seed=0)
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
        assert 0 < obs[:, -1].max() <= 255  # raw pixels: the network scales them (once)
        moved = 0
        for _ in range(30):
            nxt, *_ = group.step(np.zeros(2, dtype=np.int64))
            # one new frame per step, appended at the end: the stack slides towards index 0
            np.testing.assert_array_equal(nxt[:, :3], obs[:, 1:])
            moved += not np.array_equal(nxt[:, 3], nxt[:, 2])  # the ball moves between frames
            obs = nxt
        assert moved >= 20
    finally:
        group.close()


@pytest.mark.parametrize("backend", _backends())
def test_action_index_goes_through_the_roms_minimal_action_set(backend):
    import ale_py

    actions = _minimal_action_set()
    assert probe_env({"env": "ALE/Pong-v5", "backend": backend, "kwargs": PONG_KW})[2] == len(actions) == 6
    up, down = actions.index(ale_py.Action.RIGHT), actions.index(ale_py.Action.LEFT)  # Pong: RIGHT = up
    group = _group(backend)
    try:
        obs = group.reset(seed=0)
        start = [_paddle_row(obs[k, -1]) for k in range(2)]
        for _ in range(15):
            obs, *_ = group.step(np.array([up, down]))
        assert _paddle_row(obs[0, -1]) < start[0] - 10  # env 0 went up (row index decreases)
        assert _paddle_row(obs[1, -1]) > start[1] + 10  # env 1 went down
    finally:
        group.close()


def test_pong_episode_ends_at_21_with_its_reward_and_a_fresh_stack():
    """Pong ends when one side scores 21: the terminal step must carry the 21st point, and the stack
    returned with it (auto-reset in the same step) must hold no frame of the finished game."""
    group = _group("ale_vector")
    rng = np.random.default_rng(0)
    try:
        obs = group.reset(seed=1)
        points = np.zeros((2, 2), dtype=int)  # (env, [ours, theirs])
        finished = 0
        for _ in range(3000):
            prev = obs
            obs, reward, term, trunc = group.step(rng.integers(0, 6, 2))
            assert reward.dtype == np.float32 and set(np.unique(reward)) <= {-1.0, 0.0, 1.0}
            points[:, 0] += reward > 0
            points[:, 1] += reward < 0
            assert not trunc.any()
            for k in np.flatnonzero(term):
                assert reward[k] != 0  # the point that ended the game
                assert points[k].max() == 21 and points[k].min() < 21
                assert not any(np.array_equal(obs[k, i], prev[k, j]) for i in range(4) for j in range(4))
                assert obs[k, :3].max() == 0  # older slots of a fresh stack are blank
                points[k] = 0
                finished += 1
            if finished >= 2:
                break
        assert finished >= 2
    finally:
        group.close()


def test_ale_vector_rewards_are_not_clipped():
    """MsPacman pays 10 per pellet: a clipped reward would be 1 (GA3C clips for training itself)."""
    group = _group("ale_vector", num_envs=2, env="ALE/MsPacman-v5", kwargs={"num_threads": 1})
    rng = np.random.default_rng(0)
    try:
        group.reset(seed=0)
        rewards = np.concatenate([group.step(rng.integers(0, group.n_actions, 2))[1] for _ in range(200)])
        assert rewards.max() >= 10
    finally:
        group.close()


def test_gym_backend_accepts_the_ale_vector_kwargs():
    """The Pong config's env_kwargs (noop_max, num_threads) must also build the gym fallback."""
    pytest.importorskip("cv2")
    group = _group("gym", num_envs=1)
    try:
        env = group.envs[0]
        while not hasattr(env, "noop_max"):
            env = env.env
        assert env.noop_max == PONG_KW["noop_max"] and env.frame_skip == PONG_KW["frameskip"]
    finally:
        group.close()


def test_the_pong_config_takes_another_ale_id():
    """``lightning-per ga3c --config configs/ga3c_pong.yaml --env ALE/Breakout-v5``: the same preprocessing,
    the game's minimal action set (ale-py's ALEInterface)."""
    import ale_py

    from lightning_per.ga3c.cli import parse_config

    root = Path(__file__).resolve().parents[2]
    cfg = parse_config(["--config", str(root / "configs/ga3c_pong.yaml"), "--model.env", "ALE/Breakout-v5"])
    ale = ale_py.ALEInterface()
    ale.loadROM(ale_py.roms.get_rom_path("breakout"))
    spec = {"env": cfg.env, "backend": cfg.env_backend, "kwargs": dict(cfg.env_kwargs),
            "frame_stack": cfg.atari_frame_stack}
    shape, dtype, n_actions = probe_env(spec)
    assert (shape, str(dtype), n_actions) == ((4, 84, 84), "uint8", len(ale.getMinimalActionSet()))


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the CPU warning")
def test_the_pong_config_on_a_cpu_warns_that_it_is_meant_for_a_gpu():
    import logging

    from lightning_per.ga3c.cli import parse_config, prepare

    # a handler of our own on the logger: caplog's see it twice or not at all once the CLI has set its logging up
    warned: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warned.append(record.getMessage())
    logger = logging.getLogger("lightning_per.ga3c")
    logger.addHandler(handler)
    root = Path(__file__).resolve().parents[2]
    try:
        prepare(parse_config(["--config", str(root / "configs/ga3c_pong.yaml")]))
        prepare(parse_config(["--config", str(root / "configs/ga3c_cartpole.yaml"), "--model.device", "auto"]))
    finally:
        logger.removeHandler(handler)
    assert len(warned) == 1 and "ALE/Pong-v5 on the CPU" in warned[0]  # CartPole's vector network: no warning
