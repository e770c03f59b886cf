"""scripts/learning_report.py: its table and plots from stored results (pure data), and one tiny real cell
that is stored and then skipped on a re-run."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
from conftest import ACTOR_CPUS, set_args

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                      "learning_report.py")


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("learning_report", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fake(preset, seed, env_id, solved_at, curve, *, target=195.0, max_envstep=30_000):
    return {
        "preset": preset, "seed": seed, "env_id": env_id, "target": target, "policy_type": "muzero",
        "solved": solved_at is not None,
        "env_steps_to_target": solved_at[0] if solved_at else None,
        "wall_s_to_target": solved_at[1] if solved_at else None,
        "best_reward_mean": max(c[2] for c in curve), "curve": curve,
        "final_return": curve[-1][2], "final_env_steps": curve[-1][0],
        "max_envstep": max_envstep, "max_wall_s": None, "stop_reason": "x", "overrides": {},
    }


def _store(report, out, rec):
    report._write_json_atomic(report.cell_path(str(out), rec["preset"], rec["seed"]), rec)


def test_table_and_plots_from_stored_results(report, tmp_path):
    # preset a: three seeds solved at 1000 / 3000 / 2000 env steps; preset b: one of two seeds unsolved
    for seed, (steps, wall) in enumerate([(1000, 10.0), (3000, 40.0), (2000, 20.0)]):
        _store(report, tmp_path, _fake("a", seed, "CartPole-v1", (steps, wall),
                                      [(steps // 2, wall / 2, 50.0), (steps, wall, 200.0 + seed)]))
    _store(report, tmp_path, _fake("b", 0, "CartPole-v1", (500, 5.0), [(500, 5.0, 196.0)]))
    _store(report, tmp_path, _fake("b", 1, "CartPole-v1", None, [(500, 5.0, 20.0), (30_000, 300.0, 150.0)]))
    _store(report, tmp_path, _fake("c", 0, "Acrobot-v1", None, [(1000, 9.0, -500.0)], target=-100.0,
                                   max_envstep=50_000))
    # preset d: two of three seeds solved, so its median (the slower solved seed) is known, its worst is not
    _store(report, tmp_path, _fake("d", 0, "CartPole-v1", (1000, 30.0), [(1000, 30.0, 199.0)]))
    _store(report, tmp_path, _fake("d", 1, "CartPole-v1", (2000, 10.0), [(2000, 10.0, 197.0)]))
    _store(report, tmp_path, _fake("d", 2, "CartPole-v1", (30_400, 301.0), [(30_400, 301.0, 199.0)]))

    md, pngs = report.build_report(str(tmp_path))
    rows = {line.split(" | ")[0].strip("| "): line for line in md.splitlines() if line.startswith("| ")}
    assert rows["a"] == ("| a | CartPole-v1 | 195 | 3/3 | 2,000 | 3,000 | 20.0 | 40.0 | 201.0 / 200.0 |")
    # b: 1/2 solved; the median counts the unsolved seed above the solved one -> not known: "> budget"
    assert rows["b"] == ("| b | CartPole-v1 | 195 | 1/2 | > 30,000 | > 30,000 | — | — | 173.0 / 150.0 |")
    # (its third seed crossed only after the budget, at the run's last evaluation)
    assert rows["d"] == ("| d | CartPole-v1 | 195 | 2/3 | 2,000 | > 30,000 | 30.0 | — | 199.0 / 197.0 |")
    assert ("- d seed 2: not solved within the budget (reached only at 30,400 env steps / 301.0 s)" in md)
    assert rows["c"].startswith("| c | Acrobot-v1 | -100 | 0/1 | > 50,000 | > 50,000 |")
    assert "- b seed 1: not solved (best 150.0); final return 150.0 at 30,000 env steps" in md
    assert open(tmp_path / "report.md").read() == md
    assert sorted(os.path.basename(p) for p in pngs) == ["Acrobot-v1.png", "CartPole-v1.png"]
    for p in pngs:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_band_holds_each_seeds_last_return(report):
    grid, med, lo, hi = report.band([[(100, 1, 0.0), (300, 3, 30.0)], [(200, 2, 10.0)], [(100, 1, 5.0)]])
    assert grid.tolist() == [100, 200, 300]
    assert lo.tolist() == [0.0, 0.0, 5.0] and hi.tolist() == [10.0, 10.0, 30.0]
    assert med.tolist() == [5.0, 5.0, 10.0]


def test_a_tiny_real_cell_is_stored_then_skipped(report, tmp_path, capsys):
    out = str(tmp_path / "rep")
    tiny = ["model.hidden_dim=32", "model.latent_dim=16", "mcts.num_simulations=4", "learn.batch_size=32",
            "env.collector_env_num=4", "env.evaluator_env_num=2", "eval.n_episodes=2", "eval.eval_freq=10",
            "replay.game_segment_length=20", "stop_value=1"]  # any CartPole episode returns >= 1
    args = ["--presets", "cartpole_muzero", "--seeds", "3", "--output-dir", out, "--max-envstep", "400"]
    for s in tiny:
        args += ["--set", s]
    assert report.main(args) == 0
    path = report.cell_path(out, "cartpole_muzero", 3)
    rec = json.load(open(path))
    assert rec["solved"] and rec["env_id"] == "CartPole-v1" and rec["max_envstep"] == 400
    assert rec["env_steps_to_target"] <= 400 and rec["curve"][-1][2] >= 1 and rec["pipeline"] == "sync"
    assert "| cartpole_muzero | CartPole-v1 | 1 | 1/1 |" in capsys.readouterr().out
    mtime = os.path.getmtime(path)
    assert report.main(args) == 0
    assert "stored, skipped" in capsys.readouterr().out and os.path.getmtime(path) == mtime
    assert report.main(["--output-dir", out, "--table-only"]) == 0
    assert os.path.exists(os.path.join(out, "CartPole-v1.png"))


TINY = ["model.hidden_dim=32", "model.latent_dim=16", "mcts.num_simulations=4", "learn.batch_size=32",
        "env.collector_env_num=4", "env.evaluator_env_num=2", "eval.n_episodes=2", "eval.eval_freq=10",
        "replay.game_segment_length=20", "eval.unvisited_q=min"]


def _cell(report, out, *extra):
    args = ["--presets", "cartpole_muzero", "--seeds", "3", "--output-dir", out, "--max-envstep", "400"]
    for s in TINY:
        args += ["--set", s]
    assert report.main([*args, *extra]) == 0
    return json.load(open(report.cell_path(out, "cartpole_muzero", 3)))


def test_a_cell_runs_the_pipeline_its_config_selects(report, ray_cluster, tmp_path):
    # a quarter of a CPU per actor: the async run fits the tests' Ray (conftest's RAY_TEST_CPUS)
    rec = _cell(report, str(tmp_path / "rep"), "--set", "stop_value=1", "--set",
                "policy.async_pipeline.enabled=true", *set_args(ACTOR_CPUS))
    assert rec["pipeline"] == "async" and rec["solved"]  # its segments in flight may pass max_envstep


def test_also_eval_compares_rules_on_the_same_training_run(report, tmp_path, capsys):
    """Evaluating every snapshot a second time changes neither training nor the run's own curve; a cell
    ends once both rules reach the target."""
    unreached = ["--set", "stop_value=500"]
    alone = _cell(report, str(tmp_path / "alone"), *unreached)
    both = _cell(report, str(tmp_path / "both"), *unreached, "--also-eval", "eval.unvisited_q=parent")
    assert not alone["solved"] and len(alone["curve"]) >= 2
    assert [(c[0], c[2]) for c in both["curve"]] == [(c[0], c[2]) for c in alone["curve"]]
    also = both["also_eval"]
    assert also["settings"] == {"eval.unvisited_q": "parent"} and not also["solved"]
    assert also["own_settings"] == {"eval.unvisited_q": "min"}
    assert [c[0] for c in also["curve"]] == [c[0] for c in both["curve"]]
    assert ("| cartpole_muzero | eval.unvisited_q=min | > 400 / > 400 (0/1) | eval.unvisited_q=parent | "
            "> 400 / > 400 (0/1) |") in capsys.readouterr().out
    done = _cell(report, str(tmp_path / "done"), "--set", "stop_value=1",
                 "--also-eval", "eval.unvisited_q=parent")
    assert done["solved"] and done["also_eval"]["solved"] and done["stop_reason"] == "stop_value"
    assert len(done["curve"]) == 1  # both reached at the first evaluation: the cell ended there
    with pytest.raises(SystemExit, match="--also-eval learn.lr"):
        report.main(["--output-dir", str(tmp_path / "x"), "--also-eval", "learn.lr=0.1"])


def test_the_rule_table_names_the_rule_each_run_had(report):
    """A run's own evaluation settings come from its record, not from the preset as it is when the table is
    rebuilt (acrobot_muzero evaluates under parent now; these runs had min)."""
    curve = [[1000, 1.0, -90.0]]
    also = {"settings": {"eval.unvisited_q": "parent"}, "stop_at_own": True, "solved": True,
            "env_steps_to_target": 1000, "curve": curve}
    ran_min = {**_fake("acrobot_muzero", 0, "Acrobot-v1", (1000, 1.0), curve, target=-100.0),
               "also_eval": {**also, "own_settings": {"eval.unvisited_q": "min"}}}
    assert "| acrobot_muzero | eval.unvisited_q=min | 1,000 / 1,000 (1/1) | eval.unvisited_q=parent |" in (
        report.also_eval_table([ran_min]))
    older = {**ran_min, "also_eval": also}  # stored before records kept their own settings: the preset's
    assert "| acrobot_muzero | eval.unvisited_q=parent | 1,000" in report.also_eval_table([older])


@pytest.mark.parametrize("stop_at_own", [False, True])
def test_a_cell_ends_when_both_rules_reached_the_target_or_at_its_own(report, stop_at_own):
    """The other rule's evaluation stands in as a fixed return (30, then 60) against a target of 50."""

    class Fixed(report.AlsoEvalPrinter):
        def _evaluate(self, evaluated):
            return 30.0 if len(self.also_evals) < 2 else 60.0

    rep = Fixed("x", None, {"eval.unvisited_q": "parent"}, 50.0, stop_at_own=stop_at_own)
    metrics = {"envstep": 100, "wall_s": 1.0, "reward_mean": 10.0, "train_iter": 1}
    rep.on_eval(metrics, {}, dict)  # neither reached: go on
    if stop_at_own:
        with pytest.raises(report.CellDone):  # the run's own rule reached: ends, the other one not yet
            rep.on_eval({**metrics, "reward_mean": 55.0}, {}, dict)
        return
    rep.on_eval({**metrics, "reward_mean": 55.0}, {}, dict)  # the other rule is at 30: go on
    with pytest.raises(report.CellDone):
        rep.on_eval(metrics, {}, dict)  # now it reached 60 too
    row = report.seed_row(0, rep.also_evals, 50.0, "stop_value")
    assert row["solved"] and [e["reward_mean"] for e in rep.also_evals] == [30.0, 30.0, 60.0]


def test_import_run_files_a_cli_run_only_under_its_own_config(report, trained_run, tmp_path):
    from conftest import CLI_SMALL

    overrides = {k: str(v) for k, v in {**CLI_SMALL, "max_envstep": 300}.items() if k != "exp_name"}
    overrides["stop_value"] = "none"
    rec = report.import_run(trained_run, "cartpole_muzero", overrides)
    assert rec["seed"] == 1 and rec["preset"] == "cartpole_muzero" and len(rec["curve"]) == 3
    assert rec["curve"][-1][0] >= 300 and not rec["solved"]  # stop_value none: the 195 default, not reached
    with pytest.raises(SystemExit, match="config key 'mcts.num_simulations' = 4 there, 25 in preset"):
        report.import_run(trained_run, "cartpole_muzero", {**overrides, "mcts.num_simulations": "25"})
