"""What a suite returns and how its canonical results are written (JSON + Markdown + PNG, with metadata).

A suite's ``run(args)`` returns a :class:`Results`; :func:`write` names the files by suite and machine
(``replay-h200.json``, ``replay-cpu.md``, ``dqn-h200x2.png``, ...) so that one directory holds one current
result per suite and machine, and a new run of the same suite on the same kind of machine replaces it.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata as _md
from pathlib import Path

from lightning_per.utils import atomic_write_text

__all__ = ["Results", "environment", "machine_name", "markdown_table", "write"]


@dataclass
class Results:
    """One suite run.

    Attributes:
        rows: one dict per measured configuration (JSON-serialisable values; a row's ``impl`` names it).
        table: the Markdown table of ``rows`` (default: :func:`markdown_table` of every key).
        title: one line above the table (what one row measures, with units).
        notes: Markdown paragraphs below the table (ratios measured in the same run, caveats).
        plot: draws the PNG at the given path; default: a bar chart of ``metric`` per ``impl``.
        metric: the row key the default plot shows, e.g. ``"step_us"``.
        devices: accelerators the run used (> 1 names the machine ``<gpu>x<devices>``).
        extra: more JSON fields (e.g. a scaling summary).
        name: the results files' stem instead of the suite's name (a suite run per config, e.g.
            ``learning-dqn_pong``).
    """

    rows: list[dict]
    table: str | None = None
    title: str = ""
    notes: str = ""
    plot: Callable[[Path], None] | None = None
    metric: str | None = None
    devices: int = 1
    extra: dict = field(default_factory=dict)
    name: str | None = None


def _version(name: str) -> str | None:
    try:
        return _md.version(name)
    except _md.PackageNotFoundError:
        return None


def _imported_version() -> str | None:
    """``lightning_per.__version__`` of the package imported: a checkout on ``PYTHONPATH`` has no
    distribution metadata for :func:`_version` to read."""
    try:
        import lightning_per
    except ImportError:
        return None
    return getattr(lightning_per, "__version__", None)


def _driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: str = "cpu") -> dict:
    """Versions and hardware of this run: python, torch, triton, torchrl, tensordict, lightning, CUDA, GPU
    name and count, driver, CPU model and cores, the command line and the UTC time of the run."""
    import torch

    cuda = torch.device(device).type == "cuda" and torch.cuda.is_available()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "torchrl": _version("torchrl"),
        "tensordict": _version("tensordict"),
        "lightning": _version("lightning"),
        "lightning_per": _version("lightning_per") or _imported_version(),
        "cuda": torch.version.cuda if cuda else None,
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "driver": _driver() if cuda else None,
        "cpu": _cpu_model(),
        "cpu_cores": cores,
        "command": "python -m benchmarks " + " ".join(sys.argv[1:]),
        "utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def machine_name(env: dict, devices: int = 1) -> str:
    """The machine part of a results file name: the GPU's model (``"NVIDIA H200"`` -> ``"h200"``, with
    ``x<devices>`` when a run used several) or ``"cpu"``."""
    if not env.get("gpu"):
        return "cpu"
    words = [w for w in re.split(r"[^A-Za-z0-9]+", env["gpu"]) if w and w.lower() not in ("nvidia", "geforce", "tesla")]
    name = (words[0] if words else "gpu").lower()
    return f"{name}x{devices}" if devices > 1 else name


def markdown_table(rows: list[dict], columns: list[str] | None = None) -> str:
    """A Markdown table of ``rows`` (``columns``: default every key, in first-seen order); floats with
    one decimal, thousands separated."""
    if columns is None:
        columns = list(dict.fromkeys(k for r in rows for k in r if not isinstance(r[k], (dict, list))))

    def cell(v) -> str:
        if v is None:
            return ""
        if isinstance(v, float):
            return f"{v:,.1f}"
        return str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def _bar_plot(rows: list[dict], metric: str, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(str(r.get("impl", i)), float(r[metric])) for i, r in enumerate(rows)
           if isinstance(r.get(metric), (int, float))]
    fig, ax = plt.subplots(figsize=(7, 0.35 * max(len(pts), 3) + 1))
    if pts:
        ax.barh([p[0] for p in pts], [p[1] for p in pts])
        ax.invert_yaxis()
    ax.set(xlabel=metric, title=title)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)




def write(suite: str, results: Results, out: Path | str, env: dict, machine: str | None = None) -> list[Path]:
    """Write ``<out>/<suite>-<machine>.{json,md,png}``; return the three paths.

    The JSON holds ``{"suite", "machine", "environment", "rows", **extra}``; the Markdown the title, a
    metadata line (GPU, driver, torch, triton, CPU), the table, the notes and the command that reproduces
    it; the PNG ``results.plot`` or a bar chart of ``results.metric``.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    machine = machine or machine_name(env, results.devices)
    stem = f"{results.name or suite}-{machine}"  # may hold dots (a name made of an lr): no with_suffix
    paths = [out / f"{stem}.json", out / f"{stem}.md", out / f"{stem}.png"]
    payload = {"suite": suite, "machine": machine, "environment": env, "rows": results.rows, **results.extra}
    atomic_write_text(paths[0], json.dumps(payload, indent=1, default=str) + "\n")
    def v(key: str) -> str:
        return "not recorded" if env.get(key) is None else str(env[key])

    hw = env.get("gpu") or "CPU only"
    if env.get("gpu") and results.devices > 1:
        hw = f"{results.devices} x {hw}"
    meta = (f"Machine: {hw}" + (f", driver {v('driver')}, CUDA {v('cuda')}" if env.get("gpu") else "")
            + f"; CPU {v('cpu')} ({v('cpu_cores')} cores). torch {v('torch')}, triton {v('triton')}, "
            f"torchrl {v('torchrl')}, python {v('python')}. Run at {v('utc')} (UTC).")
    table = results.table if results.table is not None else markdown_table(results.rows)
    parts = [f"# {results.name or suite} ({machine})", results.title, meta, table.rstrip(), results.notes.strip(),
             f"Reproduce: `{env.get('command')}`"]
    atomic_write_text(paths[1], "\n\n".join(p for p in parts if p) + "\n")
    if results.plot is not None:
        results.plot(paths[2])
    else:
        _bar_plot(results.rows, results.metric or "value", f"{suite} ({machine})", paths[2])
    return paths
