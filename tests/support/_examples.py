"""Load an example script of ``examples/`` as a module, for tests that call its functions in-process."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).parents[2] / "examples"


def load_example(name: str) -> ModuleType:
    """``examples/<name>.py`` executed as the module ``example_<name>`` (its ``__main__`` block does not run).

    The module is in ``sys.modules`` while it executes, as an import would put it: ``@dataclass`` (and anything
    else that looks its defining module up by name) needs it there; it is removed afterwards, so loads stay apart.
    """
    module_name = f"example_{name}"
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    before = sys.modules.get(module_name)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        if before is None:
            sys.modules.pop(module_name, None)
        else:
            sys.modules[module_name] = before
    return module
