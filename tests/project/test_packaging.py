"""The installed distribution holds every package of the source tree (a non-editable ``pip install .``)."""

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_every_source_package_is_listed_for_the_wheel():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "lightning_per").rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    on_disk.add("lightning_per.ext")  # mapped from the top-level ext/ by package-dir
    assert config["package-dir"]["lightning_per.ext"] == "ext"
    assert (ROOT / "ext" / "__init__.py").is_file()
    assert listed == on_disk, f"missing from pyproject: {sorted(on_disk - listed)}; stale: {sorted(listed - on_disk)}"
