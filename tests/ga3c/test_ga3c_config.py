"""GA3C configuration: YAML files, CLI overrides, and ValueErrors that name the bad field."""

from pathlib import Path

import pytest

from lightning_per.cli import ga3c_main
from lightning_per.ga3c.cli import parse_config
from lightning_per.ga3c.config import GA3CConfig, field_docs, load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["ga3c_cartpole.yaml", "ga3c_pong.yaml", "ga3c_minatar.yaml"])
def test_shipped_configs_load(name):
    cfg = load_config(ROOT / "configs" / name)
    assert cfg.validate() is cfg


@pytest.mark.parametrize("field, value", [
    ("agents", 0), ("agents", 2.5), ("predictors", 0), ("trainers", -1), ("t_max", 0), ("gamma", 0.0),
    ("gamma", 1.5), ("lr", 0.0), ("lr", float("nan")), ("beta", -0.1), ("log_epsilon", 0.0),
    ("rollout_slots", 1), ("train_min_batch_size", 0), ("optimizer", "sgd"), ("loss_reduction", "max"),
    ("env_backend", "ray"), ("device", "tpu"), ("reward_clip", 0.0), ("rmsprop_eps", 0.0),
    ("max_time_s", 0.0), ("adjust_window_s", 0.0), ("hidden_sizes", []), ("envs_per_agent", True),
    ("wandb_mode", "maybe"), ("env", ""), ("cuda_graph", 1), ("cuda_graph", "yes"), ("max_env_steps", 0),
    ("max_env_steps", 2.5), ("max_env_steps", True), ("network", "resnet"), ("seed", -1), ("seed", 2**31),
])
def test_bad_values_raise_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        GA3CConfig(**{field: value}).validate()


def test_an_env_step_budget_needs_one_process():
    with pytest.raises(ValueError, match="max_env_steps=1000 needs one process"):
        GA3CConfig(max_env_steps=1000, devices=2, device="cpu").validate()
    assert GA3CConfig(max_env_steps=1000).validate().max_env_steps == 1000


def test_count_above_its_maximum():
    with pytest.raises(ValueError, match="agents"):
        GA3CConfig(agents=9, max_agents=8).validate()


def test_unknown_field_is_rejected(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  agents: 2\n  agnets: 3\n")
    with pytest.raises(ValueError, match="agnets"):
        load_config(path)


def test_yaml_numbers_are_coerced(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  lr: 1e-3\n  gamma: 1\n  reward_clip: 1\n")  # YAML 1.1 reads 1e-3 as a string
    cfg = load_config(path)
    assert cfg.lr == 1e-3 and cfg.gamma == 1.0 and cfg.reward_clip == 1.0


def test_cli_overrides_take_precedence(capsys):
    cfg = parse_config(["--config", str(ROOT / "configs/ga3c_cartpole.yaml"), "--model.agents", "3",
                        "--model.reward_clip", "null", "--model.hidden_sizes", "[32, 32]", "--model.lr", "2e-3"])
    assert cfg.agents == 3 and cfg.reward_clip is None and cfg.hidden_sizes == [32, 32] and cfg.lr == 2e-3
    assert cfg.env == "CartPole-v1"  # from the file
    assert "--model.beta" in _command_help(capsys)


def _command_help(capsys) -> str:
    """``lightning-per ga3c --help``, the command's own (GA3CCLI's)."""
    with pytest.raises(SystemExit) as exit_info:
        ga3c_main(["--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_cli_bad_value_raises(monkeypatch):
    monkeypatch.setenv("LIGHTNING_PER_TRACEBACK", "1")  # the error itself, not its one-line report
    with pytest.raises(ValueError, match="t_max"):
        ga3c_main(["--config", str(ROOT / "configs/ga3c_cartpole.yaml"), "--model.t_max", "0"])


def test_every_field_is_documented():
    assert set(field_docs()) == set(GA3CConfig().to_dict())


def test_console_reports_a_bad_value_in_one_line(capsys):
    code = ga3c_main(["--config", str(ROOT / "configs/ga3c_cartpole.yaml"), "--model.t_max", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "t_max" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args, match", [
    (["--model.env", "CartPol-v1"], "env 'CartPol-v1' cannot be made"),
    (["--model.device", "cuda"], "no CUDA device"),
])
def test_setting_errors_are_one_line_and_write_no_run_directory(tmp_path, capsys, args, match):
    import torch

    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    code = ga3c_main(["--config", str(ROOT / "configs/ga3c_cartpole.yaml"), "--model.run_dir", str(tmp_path / "runs"),
                      *args])
    err = capsys.readouterr().err
    assert code == 2 and match in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_a_missing_config_file_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:  # as lightning-per fit: usage, tip, error
        ga3c_main(["--config", "no/such/ga3c.yaml"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 3
    assert "File does not exist" in err[-1] and "no/such/ga3c.yaml" in err[-1]
    with pytest.raises(ValueError, match="config file 'no/such/ga3c.yaml' not found"):  # the Python reader's
        load_config("no/such/ga3c.yaml")


def test_an_unknown_option_prints_one_usage_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        ga3c_main(["--config", str(ROOT / "configs/ga3c_cartpole.yaml"), "--bogus", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 3  # as fit's: usage, tip, the error (not every option's usage)
    assert err[0].startswith("usage: lightning-per ga3c") and "unrecognized arguments: --bogus" in err[-1]


def test_num_nodes_makes_a_multi_node_ddp_trainer(tmp_path):
    from lightning.pytorch.strategies import DDPStrategy

    from lightning_per.ga3c.cli import build_trainer

    cfg = GA3CConfig(num_nodes=2, agents=2, device="cpu").validate()
    trainer = build_trainer(cfg, False, False, [], tmp_path)
    assert trainer.num_nodes == 2 and trainer.world_size == 2 and isinstance(trainer.strategy, DDPStrategy)
    with pytest.raises(ValueError, match="agents=1 must be >= devices x num_nodes=2"):
        GA3CConfig(num_nodes=2, agents=1).validate()
    with pytest.raises(ValueError, match="num_nodes"):
        GA3CConfig(num_nodes=0).validate()


def test_help_shows_each_fields_docstring(capsys):
    text = " ".join(_command_help(capsys).split())
    for name, doc in field_docs().items():
        assert f"--model.{name}" in text and doc[:40] in text, name


def test_a_value_of_the_wrong_type_names_the_field():
    with pytest.raises(ValueError, match="agents"):
        parse_config(["--model.agents", "2.5"])
    with pytest.raises(ValueError, match="cuda_graph"):
        parse_config(["--model.cuda_graph", "1"])


def test_load_config_overrides_are_typed_like_the_command_line():
    cfg = load_config(None, {"lr": 1, "hidden_sizes": [8], "reward_clip": None, "env_kwargs": {"frameskip": 4}})
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float) and cfg.hidden_sizes == [8] and cfg.reward_clip is None
    assert cfg.env_kwargs == {"frameskip": 4}
    with pytest.raises(ValueError, match="agnets"):
        load_config(None, {"agnets": 3})


def test_load_config_string_overrides_are_the_strings_given():
    """A string value is that string, as a YAML file gives it: not quoted again (``device="cuda"`` once
    became ``'"cuda"'`` and failed the device check), and YAML syntax inside it stays text."""
    cfg = load_config(ROOT / "configs/ga3c_cartpole.yaml", {"device": "cpu", "run_name": "a: b", "agents": 3})
    assert (cfg.device, cfg.run_name, cfg.agents) == ("cpu", "a: b", 3)
    with pytest.raises(ValueError, match="agents"):  # still checked by type, naming the field
        load_config(None, {"agents": "three"})
    with pytest.raises(ValueError, match="device"):
        load_config(None, {"device": "tpu"})
    with pytest.raises(ValueError, match="'config'"):  # a file is the path argument, not an override
        load_config(None, {"config": "x.yaml"})


def test_print_config_prints_the_merged_config(capsys):
    import yaml

    with pytest.raises(SystemExit) as exit_info:
        parse_config(["--config", str(ROOT / "configs/ga3c_cartpole.yaml"), "--model.agents", "3", "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert exit_info.value.code == 0
    assert printed["model"] == load_config(ROOT / "configs/ga3c_cartpole.yaml", {"agents": 3}).to_dict()


@pytest.mark.parametrize("flag", ["--model.agent", "--model.max_time"])
def test_an_abbreviated_option_is_refused(flag):
    # argparse would take a unique prefix for the field (--agents, --max_time_s): a typo must not set a field
    with pytest.raises(ValueError, match=rf"unrecognized arguments: {flag} 3"):
        parse_config([flag, "3"])


@pytest.mark.parametrize("argv, yaml_text, hint", [
    (["--model.agnets", "2"], None, "did you mean agents?"),
    (["--model.max_time", "3"], None, "did you mean max_time_s?"),
    ([], "model:\n  agnets: 2\n", "does not accept option 'agnets'; did you mean agents?"),
    (["--model.zzzz", "1"], None, None),
])
def test_a_misspelt_option_or_key_names_the_closest_fields(tmp_path, argv, yaml_text, hint):
    if yaml_text is not None:
        path = tmp_path / "bad.yaml"
        path.write_text(yaml_text)
        argv = ["--config", str(path)]
    with pytest.raises(ValueError) as info:
        parse_config(argv)
    message = str(info.value)
    assert (hint in message) if hint else "did you mean" not in message, message
