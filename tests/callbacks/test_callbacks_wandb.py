"""W&B mode choice, the logger factory, and a real offline run read back from its .wandb file."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
from _callbacks_toy import KINDS, STEPS, ToyModule, expected_epoch, trainer_kwargs

from lightning_per.callbacks import (
    AsyncMetricsCallback,
    AutoModeWandbLogger,
    make_wandb_logger,
    read_wandb_history,
    resolve_wandb_mode,
)
from lightning_per.callbacks.wandb_utils import wandb_api_key_configured

READ_TIMEOUT_S = 60.0  # wandb.finish() may return before the service has flushed the log


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_DISABLED",
                "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    return tmp_path / "netrc"


def test_mode_offline_without_credentials(clean_env):
    assert not wandb_api_key_configured()
    assert resolve_wandb_mode() == "offline"


def test_mode_online_with_env_key(clean_env, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert resolve_wandb_mode() == "online"


def test_mode_online_with_netrc_entry_for_the_base_url_host(clean_env, monkeypatch):
    clean_env.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    clean_env.chmod(0o600)
    assert resolve_wandb_mode() == "online"
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.com")  # key is for another host
    assert resolve_wandb_mode() == "offline"


def test_wandb_mode_env_and_explicit_mode_win(clean_env, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_MODE", "dryrun")
    assert resolve_wandb_mode() == "offline"
    assert resolve_wandb_mode("disabled") == "disabled"
    monkeypatch.setenv("WANDB_MODE", "sideways")
    with pytest.raises(ValueError, match="WANDB_MODE"):
        resolve_wandb_mode()
    with pytest.raises(ValueError, match="mode"):
        resolve_wandb_mode("cloud")


def test_logger_args_and_offline_flag_do_not_touch_the_environment(clean_env, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    run_dir = clean_env.parent / "run"
    logger = make_wandb_logger(run_dir, name="n", tags=["a"], offline=True)
    assert isinstance(logger, AutoModeWandbLogger) and logger.mode == "offline"
    assert logger.save_dir == str(run_dir) and logger.name == "lightning_per"
    assert not run_dir.exists()  # made when the run starts, so a run refused before it leaves nothing behind
    assert logger._wandb_init["mode"] == "offline" and logger._wandb_init["tags"] == ["a"]
    import os

    assert "WANDB_MODE" not in os.environ  # Lightning's offline=True would set it process-wide
    assert make_wandb_logger(run_dir).mode == "online"
    # LightningCLI passes unset wandb.init arguments as None: they must not override WandbLogger's defaults
    assert make_wandb_logger(run_dir, resume=None, group=None)._wandb_init["resume"] == "allow"
    logger.experiment.finish()  # the run starts: its directory is made and wandb writes into it
    assert (run_dir / "wandb").is_dir()


def test_reader_handles_records_across_block_boundaries(clean_env):
    import wandb

    big = "x" * 70_000  # > 2 blocks of 32 KiB: FIRST / MIDDLE / LAST chunks
    run = wandb.init(mode="offline", dir=str(clean_env.parent), project="p")
    for i in range(5):
        run.log({"i": i, "half": i / 2, "text": big if i == 2 else "s"})
    run.finish()
    rows = read_wandb_history(clean_env.parent, timeout_s=READ_TIMEOUT_S)
    assert [r["i"] for r in rows] == list(range(5)) and [r["_step"] for r in rows] == list(range(5))
    assert [r["half"] for r in rows] == [i / 2 for i in range(5)] and rows[2]["text"] == big


def test_reader_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_wandb_history(tmp_path)
    bad = tmp_path / "run-x.wandb"
    bad.write_bytes(b"not a wandb log at all")
    with pytest.raises(ValueError, match="not a W&B"):
        read_wandb_history(bad)


def test_offline_fit_writes_exactly_one_row_per_epoch(clean_env):
    run_dir = clean_env.parent / "run"
    logger = AutoModeWandbLogger(save_dir=str(run_dir), project="p", name="toy", finish_on_end=True)
    trainer = pl.Trainer(logger=logger, callbacks=[AsyncMetricsCallback()], **trainer_kwargs(run_dir))
    trainer.fit(ToyModule())

    assert any(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    rows = read_wandb_history(run_dir, timeout_s=READ_TIMEOUT_S)
    assert len(rows) == 3
    for e, row in enumerate(rows):
        assert row["epoch"] == e and row["trainer/global_step"] == STEPS * (e + 1)
        for k, v in expected_epoch(e).items():
            got = row[f"train/{k}"]
            # W&B stores NaN as the JSON string "NaN"
            assert (math.isnan(float(got)) if math.isnan(v) else got == pytest.approx(v)), (e, k, got)
        assert set(row) >= {f"train/{k}" for k in KINDS}


def test_an_offline_run_starts_without_wandbs_anonymous_warning(clean_env, monkeypatch, tmp_path, capfd):
    """Lightning's WandbLogger passes ``anonymous=None`` to ``wandb.init``; wandb >= 0.19 then prints "The
    anonymous setting has no effect ..." at every run. Our logger leaves the setting out."""
    monkeypatch.delenv("WANDB_SILENT", raising=False)  # the warning is what this test looks for
    logger = AutoModeWandbLogger(save_dir=str(tmp_path), mode="offline", name="quiet")
    run = logger.experiment
    run.finish()
    captured = capfd.readouterr()
    assert "anonymous" not in captured.out + captured.err


def test_continue_run_sets_the_id_and_refuses_a_bad_one_or_a_started_run(clean_env, tmp_path):
    logger = AutoModeWandbLogger(save_dir=str(tmp_path / "run"), mode="offline", finish_on_end=True)
    for bad in ("", "a/b", "x:y", 3, None):
        with pytest.raises(ValueError, match="run_id"):
            logger.continue_run(bad)
    assert logger.version is None  # a refused id changes nothing
    logger.continue_run("abc123")
    run = logger.experiment
    try:
        assert run.id == "abc123"
        with pytest.raises(ValueError, match="already started as 'abc123'"):
            logger.continue_run("other")
        logger.continue_run("abc123")  # the same run: nothing to do
    finally:
        run.finish()
    assert not list((tmp_path / "run" / "wandb").glob("offline-run-*-other"))


def test_the_callback_state_refuses_a_run_id_that_is_no_string():
    cb = AsyncMetricsCallback()
    state = cb.state_dict()
    assert state["wandb_run_id"] is None
    with pytest.raises(ValueError, match="wandb_run_id"):
        cb.load_state_dict({**state, "wandb_run_id": 7})
    with pytest.raises(ValueError, match="wandb_run_id"):
        cb.wandb_run_id_in({"callbacks": {cb.state_key: {**state, "wandb_run_id": ["x"]}}})
    assert cb.wandb_run_id_in({"callbacks": {cb.state_key: {**state, "wandb_run_id": "r1"}}}) == "r1"
    assert cb.wandb_run_id_in({"callbacks": {}}) is None and cb.wandb_run_id_in({}) is None
