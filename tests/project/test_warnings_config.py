"""The test configuration turns DeprecationWarnings attributed to our own modules into errors (pyproject.toml's
``filterwarnings``), in every submodule, and leaves other libraries' deprecations as warnings."""

from __future__ import annotations

import warnings

import pytest


def _warn_from(module: str, category: type[Warning]) -> None:
    """A module-level ``warnings.warn`` run as module ``module`` (the filter matches the warning's module)."""
    code = compile("import warnings\nwarnings.warn('old spelling', CATEGORY)\n", f"<{module}>", "exec")
    exec(code, {"__name__": module, "CATEGORY": category})


@pytest.mark.parametrize("module", ["lightning_per", "lightning_per.graphs.captured_step",
                                    "lightning_per.replay.prioritized", "lightning_per.ext.search"])
def test_our_deprecation_warnings_fail_the_test(module):
    with pytest.raises(DeprecationWarning, match="old spelling"):
        _warn_from(module, DeprecationWarning)


def test_other_modules_deprecations_stay_warnings():
    with pytest.warns(DeprecationWarning, match="old spelling"):
        _warn_from("some_other_library.sub", DeprecationWarning)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _warn_from("lightning_per.graphs.captured_step", UserWarning)
    assert [w.category for w in seen] == [UserWarning]
