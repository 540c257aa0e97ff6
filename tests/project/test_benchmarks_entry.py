"""The benchmark entry point: ``python -m benchmarks run replay --quick`` (and ``dropin --quick``) on the CPU
writes the canonical results files (named by suite and machine, with the environment inside), and the shared
results writer names machines and formats tables as documented."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks import SUITES  # noqa: E402
from benchmarks._results import Results, machine_name, markdown_table, write  # noqa: E402


def test_replay_quick_on_cpu_writes_the_canonical_files(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "run", "replay", "--quick", "--device", "cpu",
                           "--sizes", "1e3", "--batches", "32", "--threads", "1,2", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["replay-cpu.json", "replay-cpu.md", "replay-cpu.png"]
    data = json.loads((out / "replay-cpu.json").read_text())
    assert data["suite"] == "replay" and data["machine"] == "cpu"
    env = data["environment"]
    assert env["torch"] == torch.__version__ and env["gpu"] is None and env["args"]["quick"] is True
    assert {"triton", "driver", "cpu", "cpu_cores", "command"} <= set(env)
    impls = {r["impl"] for r in data["rows"]}
    assert {"ours-eager", "ours-eager-parallel", "ours-rank-eager", "bare-gather"} <= impls  # no kernels, graphs
    assert all(r["N"] == 1000 and r["B"] == 32 and r["step_us"] > 0 for r in data["rows"])
    assert {(r["impl"], r["threads"]) for r in data["rows"]} == {(i, t) for i in impls for t in (1, 2)}
    md = (out / "replay-cpu.md").read_text()
    assert "| impl | N | B | threads | step (us) |" in md
    assert "Reproduce: `python -m benchmarks run replay --quick" in md
    if "torchrl-per" in impls:  # both layouts against TorchRL's tree, at each thread count
        assert "1 thread: torchrl-per / ours-eager = " in md and "2 threads: torchrl-per / ours-eager-parallel" in md
    assert (out / "replay-cpu.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_writers_quick_on_cpu_writes_the_canonical_files(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "run", "writers", "--quick", "--device", "cpu",
                           "--seconds", "0.3", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["writers-cpu.json", "writers-cpu.md", "writers-cpu.png"]
    rows = json.loads((out / "writers-cpu.json").read_text())["rows"]
    assert {(r["transport"], r["writers"], r["batch"]) for r in rows} == {
        (kind, w, 64) for kind in ("shm", "gloo", "torchrl") for w in (1, 2)}
    for r in rows:  # every writer's rows became sampleable, with their latency and the learner's step measured
        assert r["rows_per_s"] > 0 and 0 <= r["lat_p50_ms"] <= r["lat_p99_ms"], r
        assert r["learn_idle_us"] > 0 and r["learn_busy_us"] > 0, r
    assert "| impl | transport | writers | batch | rows_per_s |" in (out / "writers-cpu.md").read_text()


def test_writers_at_an_offered_rate_send_no_more_than_it(tmp_path):
    """``--rate``: the writers pace their batches to the offered load (here 2,000 transitions/s, far below what a
    saturated shared-memory writer sends on any CPU), so the rows made sampleable stay near the rate, not the
    transport's capacity; the row records the offered load."""
    out = tmp_path / "results"
    rate = 2000.0
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "run", "writers", "--quick", "--device", "cpu",
                           "--transports", "shm", "--writers", "2", "--seconds", "1", "--rate", str(rate),
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads((out / "writers-cpu.json").read_text())["rows"]
    assert row["offered_per_s"] == rate and row["impl"] == "shm-W2-B64-R2000"
    # one batch per writer at the start on top of the paced ones: 2 x 64 rows over a 1 s run
    assert 0 < row["rows_per_s"] <= rate + 2 * 64 / 1.0 + 0.1 * rate, row
    assert "The writers offer 2000 transitions/s together" in (out / "writers-cpu.md").read_text()


def test_unknown_suite_is_a_usage_error():
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "run", "nope"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "expected a suite in" in proc.stderr and "'nope'" in proc.stderr


def test_run_help_lists_the_common_options_and_every_suite(capsys):
    """The entry point's ``main`` in this process: the help imports every suite to name it (seconds in a child;
    this module imports them anyway), and ``python -m benchmarks`` itself runs in the tests above and below."""
    from benchmarks.__main__ import main

    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--quick" in out and "--out" in out and "--machine" in out
    listed = {line.split()[0] for line in out.split("suites (")[1].splitlines()[1:] if line.strip()}
    assert listed == {*SUITES, "all"}


def test_every_registered_suite_exposes_run():
    import importlib

    for name, module in SUITES.items():
        assert callable(importlib.import_module(module).run), name


@pytest.mark.parametrize(("gpu", "devices", "name"), [("NVIDIA H200", 1, "h200"), ("NVIDIA H200", 2, "h200x2"),
                                                      ("NVIDIA H100 80GB HBM3", 1, "h100"),
                                                      ("NVIDIA GeForce RTX 4090", 1, "rtx"), (None, 1, "cpu")])
def test_machine_name(gpu, devices, name):
    assert machine_name({"gpu": gpu}, devices) == name


def test_markdown_table_and_default_plot(tmp_path):
    rows = [{"impl": "a", "us": 1234.56, "n": 3}, {"impl": "b", "us": 2.0, "extra": None}]
    assert markdown_table(rows).splitlines() == ["| impl | us | n | extra |", "|---|---|---|---|",
                                                 "| a | 1,234.6 | 3 |  |", "| b | 2.0 |  |  |"]
    env = {"gpu": None, "torch": "x", "command": "python -m benchmarks run toy", "utc": "t"}
    paths = write("toy", Results(rows=rows, metric="us", title="Toy."), tmp_path, env)
    assert [p.name for p in paths] == ["toy-cpu.json", "toy-cpu.md", "toy-cpu.png"]
    assert json.loads(paths[0].read_text())["rows"] == rows
    assert paths[2].read_bytes()[:4] == b"\x89PNG"
    # a results name with dots (a variant named by its learning rate) keeps them all
    dotted = write("toy", Results(rows=rows, metric="us", name="toy-lr1.0e-3"), tmp_path, env, machine="h200")
    assert [p.name for p in dotted] == ["toy-lr1.0e-3-h200.json", "toy-lr1.0e-3-h200.md", "toy-lr1.0e-3-h200.png"]


def test_every_results_file_the_docs_cite_exists():
    import re

    texts = {p: p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
    cited = {(p.name, m) for p, t in texts.items() for m in re.findall(r"benchmarks/results/[\w.-]+", t)}
    assert cited, "no results file cited"
    missing = [(doc, path) for doc, path in sorted(cited) if not (ROOT / path).is_file()]
    assert not missing, missing


def test_tools_run_through_the_entry_point(tmp_path):
    runs = tmp_path / "a.json"
    runs.write_text(json.dumps({"rows": [{"impl": "dqn-fit", "world_size": 1, "updates_per_s_total": 100.0}]}))
    out = tmp_path / "pooled.md"
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "tool", "fit_runs", str(runs), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| dqn-fit | 1 | 100 | 100 | 0% |  |" in out.read_text()


@pytest.mark.torchrl_tree
def test_user_loop_quick_on_cpu_writes_every_cpu_row(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHRL_PYTHONPATH", "ANCHOR_PYTHONPATH")}
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "run", "user_loop", "--quick", "--device", "cpu",
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**env, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((tmp_path / "user_loop-cpu.json").read_text())
    rows = {r["impl"]: r for r in data["rows"]}
    # on a CPU: no CUDA graphs (the captured rows are capture()'s eager fallback), no compiled or graph-module rows
    assert list(rows) == ["torchrl-eager", "ours-eager", "ours-captured-k1", "ours-captured-k8"]
    assert all(r["updates_per_s"] > 0 for r in rows.values()) and rows["torchrl-eager"]["x_torchrl-eager"] == 1.0
    assert rows["ours-captured-k8"]["K"] == 8 and rows["ours-captured-k8"]["graphed"] is False
    assert "| loop | K | updates/s |" in (tmp_path / "user_loop-cpu.md").read_text()


def test_user_loop_table_keeps_a_failed_row_with_its_error():
    from benchmarks.user_loop import table, with_ratios

    rows = with_ratios([
        {"impl": "torchrl-eager", "K": 1, "updates_per_s": 200.0, "us_per_update": 5000.0, "syncs_per_update": 11.0},
        {"impl": "ours-cudagraphmodule", "K": None, "updates_per_s": None, "us_per_update": None,
         "error": "RuntimeError: a | b\nsecond line"},
        {"impl": "ours-eager", "K": 1, "updates_per_s": 300.0, "us_per_update": 3333.3, "syncs_per_update": 0.0}])
    lines = table(rows).splitlines()
    assert len(lines) == 2 + 3  # header, rule and every row
    assert lines[3] == "| ours-cudagraphmodule | - | failed: RuntimeError: a \\| b second line | - | - | - | - |"
    assert lines[3].count(" | ") == lines[2].count(" | ")  # as many cells as a measured row
    assert lines[4] == "| ours-eager | 1 | 300 | 3333.3 | 0.00 | 1.5 | - |"


def test_dqn_pool_of_repeated_fit_runs(tmp_path):
    """--pool: medians and scaling of repeated runs, worked out by hand (1 device: 100, 300, 200 -> 200;
    2 devices: 380, 420 -> 400, 2.00x), written as the dqn suite's canonical files of the N-device machine."""
    files = []
    for i, (world, total) in enumerate([(1, 100), (1, 300), (1, 200), (2, 380), (2, 420)]):
        path = tmp_path / f"run{i}.json"
        path.write_text(json.dumps({"environment": {"gpu": "X"},
                                    "rows": [{"impl": "dqn-fit", "world_size": world, "updates_per_s_total": total}]}))
        files.append(str(path))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "run", "dqn", "--pool", *files, "--out", str(out),
                           "--machine", "gpux2"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    md = (out / "dqn-gpux2.md").read_text()
    assert "| dqn-fit | 1 | 100, 300, 200 | 200 | 100% |  |" in md
    assert "| dqn-fit | 2 | 380, 420 | 400 | 10% | 2.00x |" in md
    data = json.loads((out / "dqn-gpux2.json").read_text())
    assert len(data["rows"]) == 5 and [p["file"] for p in data["pooled"]] == files


def test_every_benchmark_module_is_a_suite_or_a_tool():
    from benchmarks import TOOLS

    modules = {p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.stem.startswith("_")}
    registered = set(TOOLS) | {m.rsplit(".", 1)[1] for m in SUITES.values()}
    assert modules == registered, (sorted(modules - registered), sorted(registered - modules))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_ga3c_rows_build_their_config_from_the_command_line(device):
    """The GA3C rows' config: the suite's counts and the --device string as given (a quoted '"cuda"' failed
    every GA3C row at the config's device check)."""
    from benchmarks import ga3c
    from benchmarks.__main__ import parser

    args = parser("ga3c").parse_args(["--device", device, "--agents", "3", "--max-agents", "5", "--cuda-graph"])
    args.quick = False
    cfg = ga3c.ga3c_config(args, dynamic=True)
    assert (cfg.device, cfg.agents, cfg.max_agents, cfg.cuda_graph, cfg.dynamic_adjustment) == (
        device, 3, 5, True, True)
    assert cfg.max_time_s == args.warmup + args.seconds + 60.0 and cfg.wandb_mode == "disabled"


def test_host_floors_are_the_sums_of_their_parts():
    """The floors of docs/kernels.md, "Host cost of eager calls", from made-up primitive rows (hand sums)."""
    from benchmarks.host_floor import floors_of

    rows = {"graph replay": 2.0, "copy_": 5.0, "clone": 7.0, "priority math": 11.0, "alloc+launch": 13.0,
            "view": 1.5, "batch TensorDict": 4.0}
    assert floors_of(rows) == {"step": 2 + 7 + 11 + 2 * 5 + 2, "rb.extend(64)": 5 + 13 + 5 + 2}
    assert floors_of(rows, fields=7)["step with its batch"] == 32 + 7 * 1.5 + 4


def test_environment_records_the_package_version_without_its_distribution_metadata(monkeypatch):
    """A checkout on PYTHONPATH has no installed metadata: the version is the imported package's."""
    import importlib.metadata as md

    import lightning_per
    from benchmarks import _results

    real = md.version

    def version(name):
        if name == "lightning_per":
            raise md.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(_results._md, "version", version)
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    declared = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]["version"]
    assert _results.environment("cpu")["lightning_per"] == lightning_per.__version__ == declared


def test_dropin_quick_runs_the_three_buffers_with_every_episode_recorded(tmp_path):
    import numpy as np

    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "run", "dropin", "--quick", "--device", "cpu",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {"dropin-cpu.json", "dropin-cpu.md", "dropin-cpu.png"} <= {p.name for p in out.iterdir()}
    data = json.loads((out / "dropin-cpu.json").read_text())
    assert [r["impl"] for r in data["rows"]] == ["cartpole/torchrl", "cartpole/ours", "cartpole/ours-iid"]
    assert sorted(r["impl"] for r in data["runs"]) == ["ours", "ours-iid", "torchrl"]
    for run in data["runs"]:
        assert run["frames"] == 1280 and run["seed"] == 0 and run["episodes"] == len(run["returns"]) > 20
        at, returns = np.array(run["returns"]).T
        # CartPole pays 1 a step and one env runs from frame 1: an episode ends at the frame its return sums to
        np.testing.assert_array_equal(at, np.cumsum(returns))
        assert run["final"] == pytest.approx(returns[-20:].mean())
    md = (out / "dropin-cpu.md").read_text()
    assert "| impl | seeds | frames | median_final |" in md and "Reproduce: `python -m benchmarks run dropin" in md


def test_writers_pong_batches_are_frame_stacks_of_one_stream_that_the_buffer_dedups():
    """Each pong writer sends stacks of its own stream of distinct frames (stack t = frames t .. t + 3, next stack
    = stack t + 1, wrapping around after a lap), so our frame-dedup buffer stores b + 4 frames for a first batch of
    b transitions (the stacks of b + 3 frames, plus the last next frame)."""
    from benchmarks.writers import TRANSITIONS, _Batches
    from lightning_per import make_replay_buffer

    kind, b = TRANSITIONS["pong"], 64
    source = _Batches(kind, b, 3)
    lap = [source.next() for _ in range(len(source.tds))]
    obs = torch.cat([td["observation"] for td in lap])  # (n, 4, 84, 84) uint8
    frames = obs[:, 0]
    for k in range(4):
        assert torch.equal(obs[:, k], frames.roll(-k, 0))
    assert torch.equal(torch.cat([td["next_observation"] for td in lap]), obs.roll(-1, 0))
    assert frames.flatten(1).unique(dim=0).shape[0] == frames.shape[0] >= 2048  # distinct, beyond the dedup window
    assert torch.equal(source.next()["observation"], lap[0]["observation"])  # the next lap starts again
    rb = make_replay_buffer(1024, 32, device="cpu", frame_stack=kind.frame_stack)
    rb.extend(lap[0])
    assert int(rb.storage.frames_written) == b + 4
