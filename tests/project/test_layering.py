"""The layering contracts of pyproject.toml (``[tool.importlinter]``) hold: ``lint-imports`` (import-linter, the
``dev`` extra) passes, as ``make lint`` runs it; here so that ``make test`` checks them too. Also the package's
architecture rules, checked with ``ast`` over its sources: third-party private names only in the compat modules,
private Lightning methods overridden only where listed, no machine names or timings in comments and docstrings."""

from __future__ import annotations

import ast
import io
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept():
    pytest.importorskip("importlinter", reason="import-linter is in the dev extra")
    exe = Path(sys.executable).with_name("lint-imports")
    cmd = [str(exe)] if exe.exists() else [shutil.which("lint-imports") or "lint-imports"]
    proc = subprocess.run([*cmd, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


# ---------------------------------------------------------------------------- private names of other packages
PACKAGE = ROOT / "lightning_per"
#: The two modules that may touch third-party private names: TorchRL/tensordict/torch, and Lightning.
COMPAT_MODULES = {PACKAGE / "replay" / "compat.py", PACKAGE / "lightning_compat.py"}
#: Where the privates we must not read are defined (argparse: the parsers LightningCLI builds).
THIRD_PARTY = ("torchrl", "tensordict", "lightning", "jsonargparse", "argparse")
#: Private names that our own classes define and read on our own objects, which happen to match a name of
#: THIRD_PARTY: the DQN module's run id, a graph owner's target networks, a slice sampler's slice length,
#: a NamedTuple's ``_fields`` (public API despite the underscore).
OWN_NAMES = {"_run_id", "_targets", "_T", "_fields"}
#: Reads allowed outside the compat modules for now (none).
PENDING: set[tuple[str, str]] = set()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _third_party_private_names() -> set[str]:
    """Every private name the THIRD_PARTY sources define: functions, classes, module and class attributes,
    attributes assigned on any object."""
    import importlib.util

    names: set[str] = set()
    for package in THIRD_PARTY:
        origin = Path(importlib.util.find_spec(package).origin)
        files = [origin] if origin.name != "__init__.py" else origin.parent.rglob("*.py")
        for file in files:
            try:
                tree = ast.parse(file.read_text(encoding="utf-8", errors="replace"))
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    found = [node.name]
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                    found = [node.attr]
                elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    found = [t.id for t in targets if isinstance(t, ast.Name)]
                else:
                    continue
                names.update(n for n in found if _private(n))
    return names


def _own_object(node: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: the object's own (also inherited) state."""
    return (isinstance(node, ast.Name) and node.id in ("self", "cls")) or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super")


def _private_reads(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """``(line, code)`` of each read of a THIRD_PARTY private name on another object than ``self``/``cls``, by
    attribute, by ``getattr``/``hasattr``/``setattr`` with a literal name, or by import."""
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and _private(node.attr) and not _own_object(node.value)
                and ast.unparse(node.value).split(".")[0] != "torch"):  # torch's own modules: not this rule
            if node.attr in names and node.attr not in OWN_NAMES:
                found.append((node.lineno, ast.unparse(node)))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _private(node.args[1].value) and not _own_object(node.args[0])):
            if node.args[1].value in names and node.args[1].value not in OWN_NAMES:
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] in THIRD_PARTY and (any(map(_private, parts)) or any(_private(a.name) for a in node.names)):
                found.append((node.lineno, f"from {node.module} import {', '.join(a.name for a in node.names)}"))
    return found


def test_no_third_party_private_name_is_read_outside_the_compat_modules():
    """TorchRL, tensordict and Lightning privates (and those of the parsers LightningCLI builds) are read only in
    ``replay/compat.py`` and ``lightning_compat.py``, one named function each, pinned by
    tests/replay/test_replay_compat.py and tests/cli/test_lightning_compat.py. A subclass's own (inherited) state,
    read on ``self``, is its own."""
    names = _third_party_private_names()
    assert {"_storage", "_sampler", "_ddp_kwargs", "_parse_ckpt_path", "_option_string_actions"} <= names
    offences = []
    for file in sorted(PACKAGE.rglob("*.py")):
        if file in COMPAT_MODULES:
            continue
        tree = ast.parse(file.read_text(encoding="utf-8"))
        offences += [f"{file.relative_to(ROOT)}:{line}: {code}" for line, code in _private_reads(tree, names)
                     if (str(file.relative_to(ROOT)), code) not in PENDING]
    assert not offences, "third-party private names read outside the compat modules:\n" + "\n".join(offences)


def test_the_rule_finds_each_kind_of_private_read():
    names = {"_storage", "_ddp_kwargs"}
    code = ("rb._storage\ngetattr(strategy, '_ddp_kwargs', None)\nfrom lightning.fabric.utilities.types import _PATH\n"
            "self._storage\nsuper()._storage\nour._unknown_to_them\n")
    assert sorted(line for line, _ in _private_reads(ast.parse(code), names)) == [1, 2, 3]


def test_only_the_listed_private_lightning_methods_are_overridden():
    """A class of ours overrides a private method of a Lightning base only where
    :data:`lightning_per.lightning_compat.OVERRIDDEN_HOOKS` lists it (and tests/cli/test_lightning_compat.py pins
    it)."""
    import importlib
    import inspect
    import pkgutil

    import lightning_per
    from lightning_per.lightning_compat import OVERRIDDEN_HOOKS

    listed = {(base, name) for base, hooks in OVERRIDDEN_HOOKS.items() for name in hooks}
    offences = []
    for info in pkgutil.walk_packages(lightning_per.__path__, "lightning_per."):
        if info.name.startswith("lightning_per.ext") or info.name.endswith("_agent_boot"):
            continue
        module = importlib.import_module(info.name)
        for cls in vars(module).values():
            if not (inspect.isclass(cls) and cls.__module__ == info.name):
                continue
            for base in cls.__mro__[1:]:
                if not base.__module__.startswith(("lightning.", "pytorch_lightning.")):
                    continue
                offences += [f"{cls.__module__}.{cls.__qualname__}.{name} overrides {base.__qualname__}.{name}"
                             for name, value in vars(cls).items() if _private(name) and name in vars(base)
                             and callable(value) and (base, name) not in listed]
    assert not offences, "\n".join(sorted(set(offences)))


# ---------------------------------------------------------------------------- no measurements in the code
#: Machine names and measured times: they rot in code; a comment or docstring cites a benchmark row or a docs
#: section instead (settings such as "a 50 ms timeout" are not measurements and are not matched).
MEASUREMENT = re.compile(r"\b(H100|H200|A100|V100|L40S?|RTX ?\d{3,4})\b|\d(\.\d+)? ?(us|µs)\b|\bG[i]?B/s\b"
                         r"|\d ?ms on\b")


def _comments_and_docstrings(source: str) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found.append((first.lineno, first.value.value))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found.append((node.lineno, node.value.value))  # attribute docstrings (#: comments are COMMENTs)
    return found


def test_no_machine_names_or_timings_in_code_comments_and_docstrings():
    offences = []
    for file in sorted([*PACKAGE.rglob("*.py"), *(ROOT / "ext").rglob("*.py")]):
        for line, text in _comments_and_docstrings(file.read_text(encoding="utf-8")):
            match = MEASUREMENT.search(text)
            if match:
                offences.append(f"{file.relative_to(ROOT)}:{line}: {match.group(0)!r}")
    assert not offences, "measurements or machines in comments/docstrings (cite a benchmark row instead):\n" + \
        "\n".join(offences)


def test_the_measurement_rule_matches_timings_and_machines_only():
    assert MEASUREMENT.search("took 109 us on it") and MEASUREMENT.search("on an H200")
    assert MEASUREMENT.search("12 GB/s") and MEASUREMENT.search("3.2 ms on the GPU")
    assert not MEASUREMENT.search("rescan every 50 ms") and not MEASUREMENT.search("the us of it")
