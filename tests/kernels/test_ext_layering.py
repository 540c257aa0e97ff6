"""The kernel package's boundary: ``ext/`` imports nothing of ``lightning_per`` outside itself, and both
backends satisfy the typed ``ReplayOps`` protocol."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

from lightning_per.ops import dispatch, reference
from lightning_per.ops.protocol import CompiledReplayOps, ReplayOps

EXT = Path(__file__).resolve().parents[2] / "ext"


def _absolute_imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.append(node.module or "")
    return names


def test_ext_imports_nothing_of_lightning_per():
    files = sorted(EXT.glob("*.py"))
    assert files
    bad = [f"{p.name}: {name}" for p in files for name in _absolute_imports(p)
           if name.split(".")[0] == "lightning_per"]
    assert bad == []


def test_reference_module_is_a_replay_ops_and_not_compiled():
    assert isinstance(reference, ReplayOps)
    assert not isinstance(reference, CompiledReplayOps)
    assert dispatch.select_backend(torch.device("cpu"), "reference") is reference
    assert dispatch.select_backend(torch.device("cpu"), "auto") is reference


def test_protocol_names_are_the_reference_names():
    members = {n for n in vars(ReplayOps) if not n.startswith("_")}
    assert members == set(reference.__all__)
