"""The console command ``lightning-per`` (``lightning_per.console``): top-level help and unknown commands
answer without importing torch, TorchRL or Lightning; ``import lightning_per`` stays light; the public
names still import as before."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lightning_per import console


def _fresh(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          timeout=120).stdout


def test_help_lists_both_commands(capsys):
    assert console.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "fit" in out and "ga3c" in out and "lightning-per fit --help" in out


def test_no_command_prints_help_and_fails(capsys):
    assert console.main([]) == 2
    assert "commands:" in capsys.readouterr().err


def test_an_unknown_command_is_one_line(capsys):
    assert console.main(["trian"]) == 2
    err = capsys.readouterr().err
    assert "'trian'" in err and "fit, ga3c" in err and len(err.splitlines()) == 1


def test_help_and_errors_import_no_heavy_module():
    out = _fresh("import sys, contextlib, io\n"
                 "from lightning_per import console\n"
                 "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
                 "    console.main(['--help']); console.main(['trian'])\n"
                 "print(sorted(m for m in ('torch', 'torchrl', 'lightning', 'tensordict') if m in sys.modules))")
    assert out.strip() == "[]"


def test_public_names_import_on_first_use():
    out = _fresh("import sys, lightning_per\n"
                 "print('torchrl' in sys.modules)\n"
                 "from lightning_per import GPUPrioritizedReplayBuffer, make_replay_buffer\n"
                 "from torchrl.data import TensorDictPrioritizedReplayBuffer\n"
                 "print(issubclass(GPUPrioritizedReplayBuffer, TensorDictPrioritizedReplayBuffer),\n"
                 "      lightning_per.make_replay_buffer is make_replay_buffer,\n"
                 "      'GPUTensorStorage' in dir(lightning_per))")
    assert out.split() == ["False", "True", "True", "True"]


def test_dir_lists_the_public_names_not_the_modules_helpers():
    out = _fresh("import lightning_per\nprint(' '.join(dir(lightning_per)))").split()
    assert set(out) == set(__import__("lightning_per").__all__) | {"__version__"}  # nothing imported yet


def test_unknown_attribute_is_an_attribute_error():
    import lightning_per

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        lightning_per.nope  # noqa: B018


def test_fit_hands_its_arguments_over_as_given(monkeypatch):
    """From the console script (argv None) the LightningCLI reads sys.argv itself: handing it both an args list
    and sys.argv makes it warn on every run."""
    import lightning_per.cli as cli

    got = []
    monkeypatch.setattr(cli, "main", lambda argv=None: got.append(argv) or 0)
    monkeypatch.setattr(sys, "argv", ["lightning-per", "fit", "--config", "x.yaml"])
    assert console.main() == 0 and console.main(["fit", "--help"]) == 0
    assert got == [None, ["fit", "--help"]]


ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command, config, right", [
    ("ga3c", "configs/dqn_cartpole.yaml", "lightning-per fit"),
    ("ga3c", "configs/dqn_pong_apex.yaml", "lightning-per fit"),
    ("fit", "configs/ga3c_cartpole.yaml", "lightning-per ga3c"),
    ("fit", "configs/ga3c_pong.yaml", "lightning-per ga3c"),
])
@pytest.mark.parametrize("spelling", ["split", "equals"])
def test_a_config_of_the_other_command_is_one_line_naming_the_right_one(capsys, command, config, right, spelling):
    path = str(ROOT / config)
    args = ["--config", path] if spelling == "split" else [f"--config={path}"]
    assert console.main([command, *args, "--trainer.max_epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"lightning-per {command}: error: --config {path} is ")
    assert f"`{right} --config {path}`" in err


def test_the_old_flat_ga3c_layout_is_a_ga3c_config_for_fit_too(capsys, tmp_path):
    flat = tmp_path / "flat.yaml"
    flat.write_text("env: CartPole-v1\nagents: 2\n")  # GA3C's flat layout of the last release: no sections
    assert console.main(["fit", "--config", str(flat)]) == 2
    assert f"`lightning-per ga3c --config {flat}`" in capsys.readouterr().err


@pytest.mark.parametrize("text, kind", [
    ("seed_everything: 3\n", "dqn"),  # a partial fit config (the resume tests' seed.yaml): not GA3C's flat layout
    ("trainer:\n  max_epochs: 2\n", "dqn"),
    ("env: CartPole-v1\nagents: 2\n", "ga3c"),  # GA3C's old flat layout: every key a GA3CConfig field
    ("model:\n  agents: 2\n  t_max: 5\n", "ga3c"),
    ("model:\n  replay:\n    alpha: 0.6\n", "dqn"),
])
def test_config_kind_of_partial_and_flat_files(tmp_path, text, kind):
    from lightning_per.cli import config_kind

    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert config_kind(path) == kind


@pytest.mark.parametrize("command", ["fit", "ga3c"])
def test_ctrl_c_while_the_libraries_load_exits_130_without_a_traceback(monkeypatch, command):
    """Ctrl-C during the seconds of imports (torch, TorchRL, Lightning) is the shell's 130, as during a run."""
    import lightning_per

    class InterruptTheImport:
        def find_spec(self, name, path=None, target=None):
            if name == "lightning_per.cli":
                raise KeyboardInterrupt
            return None

    monkeypatch.delitem(sys.modules, "lightning_per.cli", raising=False)
    monkeypatch.delattr(lightning_per, "cli", raising=False)
    monkeypatch.setattr(sys, "meta_path", [InterruptTheImport(), *sys.meta_path])
    assert console.main([command, "--config", "configs/dqn_cartpole.yaml"]) == 130
