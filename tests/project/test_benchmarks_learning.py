"""The ``learning`` benchmark suite: time and env steps to a target from run directories' episodes.csv, checked
on synthetic run directories whose crossing points are known by construction, the table and the figure of
all seeds' curves, and one tiny real CartPole DQN run through the suite (in this process)."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks import SUITES, learning  # noqa: E402
from benchmarks._results import write  # noqa: E402
from lightning_per.cli import config_kind  # noqa: E402

WINDOW, TARGET = 5, 20.0


def _run_dir(path: Path, returns: list[float], wall: float) -> Path:
    """A run directory as RunArtifactsCallback leaves it: episode k ends at env step 100 (k + 1), 0.5 (k + 1) s."""
    path.mkdir(parents=True)
    with open(path / "episodes.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["episode", "env_steps", "time_s", "return", "return_mean"])
        for k, r in enumerate(returns):
            w.writerow([k, 100 * (k + 1), 0.5 * (k + 1), r, ""])
    summary = {"status": "done", "wall_time_s": wall, "env_steps": 100 * len(returns),
               "env_steps_per_s": 100 * len(returns) / wall}
    (path / "summary.json").write_text(json.dumps(summary))
    return path


@pytest.fixture
def seeds(tmp_path):
    return {
        0: _run_dir(tmp_path / "s0", [float(k) for k in range(30)], 15.0),  # mean of k-4..k = k-2: >= 20 at k = 22
        1: _run_dir(tmp_path / "s1", [10.0] * 30, 15.0),  # never
        2: _run_dir(tmp_path / "s2", [19.0, 30.0, 30.0, 30.0, 30.0, 0.0], 3.0),  # first full window: k = 4
    }


def test_time_and_env_steps_to_target_from_the_episodes(seeds):
    res = learning.summarise(seeds, TARGET, WINDOW, "toy")
    by_seed = {r["seed"]: r for r in res.rows}
    assert (by_seed[0]["time_to_target_s"], by_seed[0]["env_steps_to_target"]) == (0.5 * 23, 100 * 23)
    assert by_seed[0]["episodes_to_target"] == 23 and by_seed[0]["final_mean_return"] == 27.0
    assert not by_seed[1]["reached"] and by_seed[1]["time_to_target_s"] is None
    assert by_seed[1]["final_mean_return"] == by_seed[1]["best_mean_return"] == 10.0
    assert (by_seed[2]["time_to_target_s"], by_seed[2]["env_steps_to_target"]) == (2.5, 500)
    assert by_seed[2]["final_mean_return"] == 24.0 and by_seed[2]["best_mean_return"] == 27.8
    assert by_seed[2]["env_steps"] == 600 and by_seed[2]["wall_time_s"] == 3.0
    agg = res.extra["aggregate"]
    assert agg["seeds_reached"] == 2 and agg["median_time_to_target_s"] == (11.5 + 2.5) / 2
    assert agg["worst_time_to_target_s"] is None  # a seed never got there: no worst time
    assert learning.aggregate([by_seed[0], by_seed[2]])["worst_env_steps_to_target"] == 2300


def test_table_figure_and_files(seeds, tmp_path):
    res = learning.summarise(seeds, TARGET, WINDOW, "toy")
    lines = res.table.splitlines()
    assert lines[0].startswith("| seed | reached 20 | time to target (s) | env steps to target |")
    assert lines[2].startswith("| 0 | yes | 11.5 | 2,300 |") and lines[3].startswith("| 1 | no |  |  |")
    fig, (ax_steps, ax_time) = learning.figure(res.extra["curves"], TARGET, WINDOW, "toy")
    assert ax_steps.get_xlabel() == "env steps" and ax_time.get_xlabel().startswith("wall time")
    for ax, key in ((ax_steps, "env_steps"), (ax_time, "time_s")):
        lines_ = ax.get_lines()
        assert [ln.get_label() for ln in lines_] == ["seed 0", "seed 1", "seed 2", "target 20"]
        seed0 = lines_[0]  # full windows only: episodes 4..29 of seed 0, mean k - 2
        assert list(seed0.get_ydata()) == [float(k - 2) for k in range(4, 30)]
        assert list(seed0.get_xdata()) == [(100.0 if key == "env_steps" else 0.5) * (k + 1) for k in range(4, 30)]
        assert list(lines_[-1].get_ydata()) == [TARGET, TARGET]
    env = {"gpu": None, "command": "python -m benchmarks run learning", "utc": "t"}
    paths = write("learning", res, tmp_path / "out", env)
    assert [p.name for p in paths] == ["learning-toy-cpu.json", "learning-toy-cpu.md", "learning-toy-cpu.png"]
    data = json.loads(paths[0].read_text())
    assert data["target"] == TARGET and [r["seed"] for r in data["rows"]] == [0, 1, 2]
    assert "2 of 3 seeds reached 20" in paths[1].read_text()
    assert paths[2].read_bytes()[:4] == b"\x89PNG"


def test_config_kind_and_commands(tmp_path):
    assert config_kind(ROOT / "configs/dqn_pong.yaml") == "dqn"
    assert config_kind(ROOT / "configs/ga3c_pong.yaml") == "ga3c"
    dqn = learning.run_command("dqn", "c.yaml", 2, 18.0, tmp_path, 110.0, ["--x"])
    assert dqn[1:4] == ["-m", "lightning_per.console", "fit"] and dqn[-1] == "--x"
    assert {"--model.seed", "--model.target_return", "--trainer.max_time"} <= set(dqn)
    assert dqn[dqn.index("--trainer.max_time") + 1] == "00:00:01:50"
    ga3c = learning.run_command("ga3c", "c.yaml", 2, 18.0, tmp_path, None, [], window=20)
    assert ga3c[3] == "ga3c" and ga3c[ga3c.index("--model.seed") + 1] == "2" and "--model.max_time_s" not in ga3c
    assert "--model.max_env_steps" not in ga3c
    for kind in ("dqn", "ga3c"):  # both modules take the env-step budget as max_env_steps
        cmd = learning.run_command(kind, "c.yaml", 0, 18.0, tmp_path, None, ["--x"], budget_steps=300_000)
        assert cmd[cmd.index("--model.max_env_steps") + 1] == "300000" and cmd[-1] == "--x"
    assert SUITES["learning"] == "benchmarks.learning"


def test_quick_suite_runs_a_real_cartpole_seed(tmp_path, monkeypatch):
    """The suite end to end on one real (short) CartPole DQN run, in this process (no second interpreter)."""
    from lightning_per.console import main

    def in_process(cmd, env, quiet=False):
        monkeypatch.setenv("WANDB_MODE", env.get("WANDB_MODE", ""))
        limits = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--trainer.max_time"]
        assert limits == ["00:00:00:04"], cmd  # --budget-s, not --quick's 8 s
        return main(cmd[3:])

    monkeypatch.setattr(learning, "launch", in_process)
    args = argparse.Namespace(quick=True, config=None, seeds=[0], target=None, window=20, budget_s=4.0,
                              run_arg=[], wandb=False, device="cpu", out=str(tmp_path), reuse_runs=False)
    res = learning.run(args)
    (row,) = res.rows
    run_dir = tmp_path / "learning-runs" / "dqn_cartpole" / "seed0"
    assert row["run_dir"] == str(run_dir) and (run_dir / "episodes.csv").exists()
    episodes = learning.read_episodes(run_dir / "episodes.csv")
    assert row["episodes"] == len(episodes) > 0 and row["env_steps"] >= episodes[-1]["env_steps"]
    if len(episodes) >= 20:  # a full window (random CartPole episodes are ~20 steps: about 50 of them here)
        assert row["final_mean_return"] == pytest.approx(sum(e["return"] for e in episodes[-20:]) / 20)
    # with reuse_runs a second call reads the seed's directory instead of training again
    monkeypatch.setattr(learning, "launch", lambda *a, **k: pytest.fail("ran again"))
    args.reuse_runs, args.seeds = True, [0]
    assert learning.run(args).rows == res.rows
    # --name: a variant's runs and results under its own name, the config unchanged
    args.name = "dqn_cartpole-variant"
    with pytest.raises(FileNotFoundError):  # nothing under the new name yet: it would run (launch fails here)
        learning.find_run_files(tmp_path / "learning-runs" / args.name)
    import shutil

    shutil.copytree(run_dir.parent, tmp_path / "learning-runs" / args.name)
    renamed = learning.run(args)
    assert renamed.name == "learning-dqn_cartpole-variant" and renamed.rows[0]["run_dir"].startswith(
        str(tmp_path / "learning-runs" / args.name))


def test_profile_loop_tool_measures_the_configs_own_steps(tmp_path, monkeypatch):
    """``python -m benchmarks tool profile_loop --tiny``: both windows measured; at replay ratio 0.25 with 4 envs
    each training step (one update) owes 4 env steps, one vector step."""
    from benchmarks import profile_loop

    monkeypatch.setenv("WANDB_MODE", "disabled")
    out = tmp_path / "p.json"
    assert profile_loop.main(["--config", str(ROOT / "configs/dqn_cartpole.yaml"), "--tiny", "--warmup-steps", "3",
                              "--steps", "8", "--out", str(out), "--run-dir", str(tmp_path / "run")]) == 0
    res = json.loads(out.read_text())
    for window in ("free_running", "broken_down"):
        assert res[window]["updates"] == 8 and res[window]["env_steps"] == 8 * 4
    assert set(res["phases_ms"]) == set(profile_loop.PHASES)
    assert res["phases_ms"]["env step"] > 0 and res["phases_ms"]["update: sample + learner + priorities"] > 0
    assert min(res["phases_ms"].values()) >= 0, res["phases_ms"]  # nested calls are not counted twice
    assert "| env step |" in out.with_suffix(".md").read_text()


def test_profile_loop_tool_times_an_overlapped_env(tmp_path, monkeypatch):
    """An env that steps in its own threads (ale-py's vector env: start, then wait at the next step) is
    measured too: the same counts as the config's steps, no phase negative, the env's launch and wait in
    "env step"."""
    pytest.importorskip("ale_py")
    from benchmarks import profile_loop

    monkeypatch.setenv("WANDB_MODE", "disabled")
    out = tmp_path / "p.json"
    small = ["--model.replay.batch_size=8", "--model.updates_per_step=1", "--model.updates_per_graph=1",
             "--model.replay_ratio=0.25", "--model.compile=false", "--model.inductor=false",
             "--model.hidden_sizes=[32]", "--trainer.benchmark=false"]
    assert profile_loop.main(["--config", str(ROOT / "configs/dqn_pong.yaml"), "--tiny", "--warmup-steps", "2",
                              "--steps", "6", "--out", str(out), "--run-dir", str(tmp_path / "run"),
                              *[f"--run-arg={a}" for a in small]]) == 0
    res = json.loads(out.read_text())
    for window in ("free_running", "broken_down"):  # 1 update per training step owes 4 env steps at 0.25
        assert res[window]["updates"] == 6 and res[window]["env_steps"] == 6 * 4
    phases = res["phases_ms"]
    assert min(phases.values()) >= 0, phases
    assert phases["env step"] > 0 and phases["act"] > 0 and phases["replay write"] > 0


def test_a_run_that_wrote_no_episodes_is_one_error_naming_the_seed(tmp_path, monkeypatch):
    """A seed's run that exits before writing episodes.csv (a refused setting, say) stops the suite with one line
    naming the seed, its exit status and where it looked."""
    from benchmarks import UsageError

    monkeypatch.setattr(learning, "launch", lambda cmd, env, quiet=False: 2)
    args = argparse.Namespace(quick=True, config=None, seeds=[3], target=None, window=20, budget_s=None,
                              run_arg=[], wandb=False, device="cpu", out=str(tmp_path), reuse_runs=False)
    with pytest.raises(UsageError, match=r"seed 3: the run exited with status 2 and wrote no episodes.csv under "):
        learning.run(args)


@pytest.mark.parametrize(("argv", "match"), [(["--config", "configs/nope.yaml", "--target", "25"], "no such file"),
                                             (["--config", "configs/dqn_cartpole.yaml"], "--target is required"),
                                             (["--quick", "--budget-s", "-5"], "--budget-s must be a number of "
                                                                               "seconds > 0, got -5"),
                                             (["--quick", "--budget-s", "nan"], "--budget-s must be"),
                                             (["--quick", "--seeds", "0", "-1"], "--seeds must be ints >= 0")])
def test_learning_options_that_cannot_run_are_one_line_and_exit_2(argv, match, capsys):
    from benchmarks.__main__ import main

    assert main(["run", "learning", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: learning:") and match in err and "\n" not in err


def test_ga3c_runs_add_the_learners_columns(seeds):
    """A GA3C run's summary.json carries TPS, the mean policy lag and the last epoch's entropy: the table shows them
    (a DQN run's summary has no policy lag, and its table keeps its columns: the test above)."""
    for seed, (tps, lag, entropy) in {0: (91.0, 13.28, 1.5856), 1: (165.0, 27.29, 1.6088)}.items():
        path = seeds[seed] / "summary.json"
        p95 = {"policy_lag_p95": 25.0} if seed == 0 else {}  # summaries written before the quantile have none
        path.write_text(json.dumps({**json.loads(path.read_text()), "tps": tps, "policy_lag_mean": lag,
                                    "metrics": {"entropy": entropy}, **p95}))
    res = learning.summarise(seeds, TARGET, WINDOW, "toy")
    header, rule, *rows = res.table.splitlines()
    assert "| env steps/s | updates/s | policy lag (mean, p95) | entropy | wall (s) | stop |" in header
    assert rule == "|---" * 14 + "|"
    assert "| 91 | 13.3, 25 | 1.59 |" in rows[0] and "| 165 | 27.3 | 1.61 |" in rows[1]
    assert "|  |  |  |" in rows[2]  # the seed whose summary has none
    assert [r["policy_lag"] for r in res.rows] == [13.28, 27.29, None]


def test_apex_runs_add_the_feeds_columns(seeds):
    """An Ape-X DQN run's summary.json metrics carry the learner's total wait for actor transitions, the slots the
    actors found the queue full for and the weights' lag: the table says which side waited (% of the run's wall)."""
    for seed, (ups, wait, full, lag) in {0: (966.4, 3.75, 0.0, 2.44), 1: (930.0, 0.0, 412.0, 9.96)}.items():
        path = seeds[seed] / "summary.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "updates_per_s": ups, "metrics": {
            "learner_wait_s": wait, "actor_queue_full": full, "actor_weight_lag": lag}}))
    res = learning.summarise(seeds, TARGET, WINDOW, "toy")
    header, rule, *rows = res.table.splitlines()
    assert ("| env steps/s | updates/s | learner waiting (% of wall) | actor queue full (slots) | actor weight lag "
            "| wall (s) | stop |") in header
    assert rule == "|---" * 15 + "|"
    # wall 15 s (the fixture): 3.75 s waited is 25.0 %
    assert "| 966 | 25.0 | 0 | 2.4 |" in rows[0] and "| 930 | 0.0 | 412 | 10.0 |" in rows[1]
    assert "|  |  |  |  |" in rows[2]  # the seed whose summary has none
    assert [r["learner_wait_s"] for r in res.rows] == [3.75, 0.0, None]



def test_runs_with_the_agents_time_add_its_column(seeds):
    """The shares of the agents' time (env, answer wait, slot wait) of either learner are one column in percent: the
    median over the epochs of history.csv when the run wrote one (a warm-up first epoch and a short stop epoch do
    not move it), else the last epoch's in summary.json's metrics; a seed with neither leaves it empty."""
    epochs = [(0.03, 0.17, 0.80), (0.28, 0.69, 0.0), (0.30, 0.68, 0.01), (0.27, 0.70, 0.0), (0.25, 0.74, 0.0)]
    with open(seeds[0] / "history.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["epoch", "agent_env_share", "agent_answer_wait_share", "agent_slot_wait_share", "loss"])
        w.writerow([-1, "", "", "", 0.5])  # a row of another metric only
        for k, (env, answer, slot) in enumerate(epochs):
            w.writerow([k, env, answer, slot, 0.1])
    for seed in (0, 1):
        path = seeds[seed] / "summary.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "updates_per_s": 900.0, "metrics": {
            "learner_wait_s": 1.5, "agent_env_share": 0.05, "agent_answer_wait_share": 0.004,
            "agent_slot_wait_share": 0.9}}))
    res = learning.summarise(seeds, TARGET, WINDOW, "toy")
    header, rule, *rows = res.table.splitlines()
    assert ("| actor weight lag | agents: env / answer wait / slot wait (% of their time, median epoch) | wall (s) |"
            in header)
    assert rule == "|---" * 16 + "|"
    # seed 0: medians of the five epochs 0.27 / 0.69 / 0.0; seed 1: no history.csv, its summary's last epoch
    assert "| 27 / 69 / 0 |" in rows[0] and "| 5 / 0 / 90 |" in rows[1] and " / " not in rows[2]
    assert [r["agent_answer_wait_share"] for r in res.rows] == [0.69, 0.004, None]


def test_ga3c_runs_with_dead_units_add_their_column(seeds):
    """GA3C's dead_unit_frac (an epoch's mean share of dead hidden units) is one column: the first epoch's, the
    largest and the last epoch's over history.csv's epochs (rows of other metrics and NaN epochs skipped); a seed
    whose history has none leaves it empty."""
    with open(seeds[0] / "history.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["epoch", "dead_unit_frac", "loss"])
        w.writerow([-1, "", 0.5])  # a row of another metric only
        for k, dead in enumerate([0.84, 0.99, "nan", 0.54, 0.37]):
            w.writerow([k, dead, 0.1])
    with open(seeds[1] / "history.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([["epoch", "loss"], [0, 0.2]])
    for seed in (0, 1):
        path = seeds[seed] / "summary.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "tps": 150.0, "policy_lag_mean": 13.0}))
    res = learning.summarise(seeds, TARGET, WINDOW, "toy")
    header, rule, *rows = res.table.splitlines()
    assert "| entropy | hidden units dead: first / most / last epoch | wall (s) |" in header
    assert rule == "|---" * 15 + "|"
    assert "| 0.84 / 0.99 / 0.37 |" in rows[0] and " / " not in rows[1] and " / " not in rows[2]
    assert [(r["dead_units_first"], r["dead_units_max"], r["dead_units_last"]) for r in res.rows] == [
        (0.84, 0.99, 0.37), (None, None, None), (None, None, None)]


def test_pooled_calls_give_the_table_of_one_call_over_every_seed(seeds, tmp_path):
    """Seeds run in two calls (two results files), pooled by ``tool pool_learning``: the rows, table, median / worst
    line, aggregate and curves are those of the suite's one call over all three seeds; files of another target or a
    seed twice are refused."""
    from benchmarks import UsageError, pool_learning

    env = {"gpu": None, "cpu": "test", "command": "python -m benchmarks run learning", "utc": "now"}
    paths = []
    for part, name in (({0: seeds[0], 2: seeds[2]}, "a"), ({1: seeds[1]}, "b")):
        res = learning.summarise(part, TARGET, WINDOW, "toy")
        paths.append(write("learning", res, tmp_path / name, env, machine="cpu")[0])
    out = pool_learning.main(["--name", "toy", "--out", str(tmp_path / "pooled"), *map(str, paths)])
    pooled = json.loads(out[0].read_text())
    whole = learning.summarise(seeds, TARGET, WINDOW, "toy")
    assert [r["seed"] for r in pooled["rows"]] == [0, 1, 2]
    assert pooled["rows"] == json.loads(json.dumps(whole.rows))
    assert pooled["aggregate"] == whole.extra["aggregate"] and pooled["aggregate"]["seeds_reached"] == 2
    assert pooled["curves"] == json.loads(json.dumps(whole.extra["curves"]))
    md = out[1].read_text()
    assert whole.table in md and whole.notes.split("\n\n")[0] in md  # the table and the median / worst line
    assert out[2].stat().st_size > 0
    other = {**json.loads(paths[1].read_text()), "target": 30.0}
    with pytest.raises(UsageError, match="target"):
        pool_learning.pool([json.loads(paths[0].read_text()), other], "toy")
    with pytest.raises(UsageError, match="seed"):
        pool_learning.pool([json.loads(paths[0].read_text())] * 2, "toy")
    # a file that is missing or not JSON: one error naming it, nothing written
    (tmp_path / "broken.json").write_text("{")
    for bad, match in ((tmp_path / "missing.json", "No such file"), (tmp_path / "broken.json", "not a results file")):
        with pytest.raises(UsageError, match=f"pool_learning: {bad}: {match}"):
            pool_learning.main(["--name", "bad", "--out", str(tmp_path / "bad-out"), str(paths[0]), str(bad)])
    assert not (tmp_path / "bad-out").exists()
