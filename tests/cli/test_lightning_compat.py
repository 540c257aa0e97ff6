"""The Lightning privates that lightning_per.lightning_compat relies on still exist and mean what we use them for
(one test each), and LightningCLI still runs a CLI method named after the subcommand (``LightningPerCLI.fit``)."""

from __future__ import annotations

import functools
import inspect

import torch
from jsonargparse import ArgumentParser
from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.strategies import DDPStrategy

from lightning_per import lightning_compat


class _Model(BoringModel):
    def __init__(self, width: int = 1) -> None:
        super().__init__()
        self.save_hyperparameters()


class _RecordingCLI(LightningCLI):
    calls: list = []

    def parse_arguments(self, parser, args) -> None:
        self.calls.append("parse_arguments")
        super().parse_arguments(parser, args)

    def _parse_ckpt_path(self) -> None:
        self.calls.append("_parse_ckpt_path")
        lightning_compat.apply_checkpoint_hparams(self)

    def before_instantiate_classes(self) -> None:
        self.calls.append("before_instantiate_classes")

    def fit(self, model, **kwargs) -> None:
        self.calls.append(("fit", model.hparams.width, kwargs.get("ckpt_path")))


def test_parse_ckpt_path_is_the_step_between_parsing_and_instantiation_and_a_cli_fit_replaces_the_trainers(
        tmp_path):
    """OVERRIDDEN_HOOKS: LightningCLI.__init__ calls ``_parse_ckpt_path`` after ``parse_arguments`` and before
    ``before_instantiate_classes``; Lightning's step (apply_checkpoint_hparams) puts the checkpoint's
    hyperparameters into the model config; the ``fit`` subcommand runs the CLI's ``fit`` method."""
    assert set(lightning_compat.OVERRIDDEN_HOOKS) == {LightningCLI}
    for name in lightning_compat.OVERRIDDEN_HOOKS[LightningCLI]:
        assert callable(vars(LightningCLI).get(name)), name
        assert list(inspect.signature(vars(LightningCLI)[name]).parameters) == ["self"], name
    ckpt = tmp_path / "model.ckpt"
    torch.save({"hyper_parameters": {"width": 7}}, ckpt)
    _RecordingCLI.calls = []
    _RecordingCLI(_Model, args=["fit", f"--ckpt_path={ckpt}", "--trainer.logger=false",
                                "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false",
                                "--trainer.enable_model_summary=false", "--trainer.accelerator=cpu"],
                  save_config_callback=None)
    assert _RecordingCLI.calls == ["parse_arguments", "_parse_ckpt_path", "before_instantiate_classes",
                                   ("fit", 7, str(ckpt))]


def test_ddp_kwargs_are_what_the_strategy_builds_ddp_with():
    strategy = DDPStrategy(broadcast_buffers=True)
    kwargs = lightning_compat.ddp_kwargs(strategy)
    assert kwargs["broadcast_buffers"] is True
    assert lightning_compat.ddp_kwargs(DDPStrategy()) == {}
    assert "self._ddp_kwargs" in inspect.getsource(DDPStrategy._setup_model)  # the dict DDP is built with


def test_wrap_sigterm_broadcast_wraps_the_epoch_loops_method_on_the_instance_once():
    loop = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False).fit_loop.epoch_loop
    method = vars(type(loop)).get("_broadcast_sigterm_tensor")
    assert callable(method)  # Lightning >= 2.6 (on 2.5 wrap_sigterm_broadcast returns False and changes nothing)
    assert "_broadcast_sigterm_tensor()" in inspect.getsource(type(loop))  # called by the loop itself
    seen = []
    assert lightning_compat.wrap_sigterm_broadcast(loop, lambda original: seen.append(original) or (lambda: None))
    (original,) = seen
    assert isinstance(original, functools.partial) and original.func is method and original.args == (loop,)
    assert "_broadcast_sigterm_tensor" in vars(loop)
    assert not lightning_compat.wrap_sigterm_broadcast(loop, lambda original: original)  # once per loop
    other = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False).fit_loop.epoch_loop
    assert "_broadcast_sigterm_tensor" not in vars(other)  # the class is unchanged


def test_option_strings_and_parser_actions_of_a_parser():
    parser = LightningArgumentParser()
    parser.add_argument("--gamma", type=float, default=0.9, help="discount")
    assert "--gamma" in lightning_compat.option_strings(parser)
    (gamma,) = [a for a in lightning_compat.parser_actions(parser) if a.dest == "gamma"]
    assert gamma.help == "discount"


def test_subcommand_parser_finds_a_subcommands_own_parser():
    parser, fit = ArgumentParser(), ArgumentParser()
    parser.add_subcommands().add_subcommand("fit", fit)
    assert lightning_compat.subcommand_parser(parser, "fit") is fit
    assert lightning_compat.subcommand_parser(parser, "test") is parser
    plain = ArgumentParser()
    assert lightning_compat.subcommand_parser(plain, "fit") is plain
