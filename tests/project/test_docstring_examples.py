"""The ``>>>`` examples in the docstrings run and show what they claim (pytest's doctest machinery, on CPU):
every public class of ``lightning_per.replay`` and ``lightning_per.callbacks``, and ``lightning_per.dqn.DQN``,
has one. (``pytest --doctest-modules lightning_per/replay`` runs the same examples.)"""

from __future__ import annotations

import doctest
import importlib
import inspect
import io

import pytest

import lightning_per.callbacks
import lightning_per.replay
from lightning_per.dqn import DQN


def _public_classes() -> list[type]:
    classes = [obj for pkg in (lightning_per.replay, lightning_per.callbacks)
               for obj in (getattr(pkg, name) for name in pkg.__all__) if inspect.isclass(obj)]
    return classes + [DQN]


MODULES = sorted({cls.__module__ for cls in _public_classes()})


@pytest.mark.parametrize("cls", _public_classes(), ids=lambda c: c.__name__)
def test_public_class_has_an_example(cls):
    assert ">>>" in (cls.__doc__ or ""), f"{cls.__module__}.{cls.__name__}: the docstring has no >>> example"


@pytest.mark.parametrize("name", MODULES)
def test_examples_run(name):
    module = importlib.import_module(name)
    tests = [t for t in doctest.DocTestFinder().find(module, name) if t.examples]
    assert tests, f"{name}: no examples"
    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        runner.run(test, out=out.write)
    assert runner.failures == 0, out.getvalue()
    assert runner.tries >= len(tests)
