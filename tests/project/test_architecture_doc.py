"""docs/architecture.md names only what exists: every dotted ``lightning_per.`` name in it resolves
(``torch.ops.lightning_per.*``, the custom ops, excepted: they are names of the op registry)."""

import importlib
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
NAMES = sorted(set(re.findall(r"(?<![.\w])lightning_per(?:\.[A-Za-z_][A-Za-z0-9_]*)+", DOC.read_text())))


def _resolve(name: str):
    """The object ``name`` names: the longest importable module prefix, then attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


def test_the_document_names_something():
    assert len(NAMES) >= 10


@pytest.mark.parametrize("name", NAMES)
def test_every_name_in_the_architecture_document_exists(name):
    _resolve(name)
