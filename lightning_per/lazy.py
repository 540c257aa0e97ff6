"""Lazy package exports (PEP 562): a package's public names, each imported from its submodule on first use.

Stdlib only: agent processes import :mod:`lightning_per.actors`, whose ``__init__`` uses this, and must not pay for
torch or Lightning.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, where: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` whose public name ``n`` lives in ``package.where[n]``.

    Args:
        package: the package's ``__name__``.
        where: public name -> submodule (relative to ``package``); its keys are the package's ``__all__``.

    Returns:
        ``(__getattr__, __dir__)``: ``__getattr__(name)`` imports the submodule and returns its attribute, or raises
        ``AttributeError`` naming the package and the name; ``__dir__()`` is the sorted public names.

    Example:
        >>> getattr_, dir_ = lazy_exports("json", {"JSONDecoder": "decoder"})
        >>> getattr_("JSONDecoder").__name__, dir_()
        ('JSONDecoder', ['JSONDecoder'])
        >>> getattr_("nothing")
        Traceback (most recent call last):
        ...
        AttributeError: module 'json' has no attribute 'nothing'
    """
    table = dict(where)

    def __getattr__(name: str) -> Any:
        if name in table:
            return getattr(importlib.import_module(f"{package}.{table[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(table)

    return __getattr__, __dir__
