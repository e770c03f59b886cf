"""Integration: the Ray Tune layer (trainable, sweeps, OptunaSearch, MLflow runs, compare) on tiny trials.

All trials run in the session's in-process Ray cluster (``ray_cluster``: ``RAY_TEST_CPUS`` logical CPUs).
Every assertion is on an invariant of the runs -- placement, counters, equalities between what was
reported, checkpointed and logged -- never on rewards or timings. Every policy type's sync and async trial,
each checkpoint evaluated again: ``test_every_policy_type.py``.
"""

from __future__ import annotations

import csv
import glob
import os

import pytest
from conftest import ACTOR_CPUS

from muzero_tune.config import ConfigError, make_config, to_flat_dict
from muzero_tune.pipeline.core import EVAL_SEED_OFFSET, setup_torch_threads
from muzero_tune.pipeline.evaluator import Evaluator
from muzero_tune.pipeline.messages import weights_digest
from muzero_tune.runs.checkpoint import load_checkpoint, load_policy
from muzero_tune.runs.mlflow_log import TRIAL_TAG, default_tracking_uri, ensure_experiment
from muzero_tune.tune.trainable import CHECKPOINT_FILE

AP = "policy.async_pipeline."


def tiny(storage, **extra) -> dict:
    return {
        "model.hidden_dim": 32, "model.latent_dim": 16, "mcts.num_simulations": 4, "learn.batch_size": 32,
        "env.collector_env_num": 4, "env.evaluator_env_num": 2, "eval.n_episodes": 2, "eval.eval_freq": 20,
        "replay.game_segment_length": 20, "max_envstep": 600, "stop_value": None, "logging.quiet": True,
        "tune.storage_path": str(storage),
        # an async trial is 1 + 0.25 + 0.25 CPUs: two fit the test cluster side by side
        **ACTOR_CPUS, **extra,
    }


def progress(trial_dir: str) -> list[dict[str, str]]:
    """Every row Tune wrote for the trial (progress.csv keeps the rows from before a restart too)."""
    with open(os.path.join(trial_dir, "progress.csv"), newline="") as f:
        return list(csv.DictReader(f))


def col(rows: list[dict[str, str]], key: str) -> list[float]:
    return [float(r[key]) for r in rows]


def checkpoints(trial_dir: str) -> list[str]:
    return sorted(glob.glob(os.path.join(trial_dir, "checkpoint_*", CHECKPOINT_FILE)))


def trial_dirs(results) -> list[str]:
    return sorted(r.path for r in results)


def files_under(path) -> list[str]:
    return [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]


def fail_once_trainable(flag: str, fail_after_reports: int, **run_trial_kwargs):
    """``run_trial`` that raises once, right after its ``fail_after_reports``-th report (checkpoint saved).

    The flag file records that the fault fired, so the retried trial (a new actor process) runs clean. The
    function is local, so Ray pickles it by value (the tests folder is not importable in Ray workers).
    """

    def fail_once(config: dict) -> None:
        from muzero_tune.tune import trainable as tt

        armed = not os.path.exists(flag)
        original = tt.TuneReporter.on_eval

        def on_eval(self, metrics, evaluated, resume_state):
            original(self, metrics, evaluated, resume_state)
            self.test_reports = getattr(self, "test_reports", 0) + 1
            if armed and self.test_reports == fail_after_reports:
                with open(flag, "w") as f:
                    f.write(str(metrics["eval_index"]))
                raise RuntimeError("injected trial failure (test)")

        tt.TuneReporter.on_eval = on_eval  # in this trial's worker process only
        try:
            tt.run_trial(config, **run_trial_kwargs)
        finally:
            tt.TuneReporter.on_eval = original

    return fail_once


# ---------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def async_sweep(ray_cluster, tmp_path_factory):
    """The ``quickstart`` sync-vs-async sweep, tiny: 4 trials (sync, async x seeds 0, 1) through
    ``run_sweep``, all four side by side: each async trial has 1 collector + 1 evaluator at 0.25 CPU each
    (1 + 1 + 1.5 + 1.5 = the test cluster's 5 CPUs)."""
    from muzero_tune.tune.sweep import run_sweep

    storage = tmp_path_factory.mktemp("tune_async")
    # 400 env steps: 100 train steps, 5 reports a trial (every check below needs 2)
    return run_sweep(
        "quickstart", overrides=tiny(storage, max_envstep=400), max_concurrent=4, name="sync_vs_async",
        param_space_extra={AP + "weight_sync_interval": 4, AP + "max_policy_lag": 8},
    )


def async_results(sweep) -> list:
    return sorted((r for r in sweep.results if r.config[AP + "enabled"]), key=lambda r: r.path)


@pytest.fixture(scope="module")
def sync_fault(ray_cluster, tmp_path_factory):
    """One sync trial that raises once after its 2nd report, with ``tune.max_failures=1``."""
    from ray import tune

    from muzero_tune.tune.resources import placement_group_factory
    from muzero_tune.tune.sweep import _run_config

    storage = tmp_path_factory.mktemp("tune_fault")
    # 400 env steps: 100 train steps, 5 reports (the test needs the fault after report 2 and 4 reports)
    fault_cfg = {"tune.max_failures": 1, "tune.checkpoint_num_to_keep": None, "tune.save_replay_buffer": True,
                 "max_envstep": 400}
    cfg = make_config("cartpole_muzero", overrides=tiny(storage, **fault_cfg))
    name = "fault"
    uri = default_tracking_uri(str(storage))
    artifacts = os.path.join(str(storage), "mlartifacts")
    ensure_experiment(uri, name, artifacts)
    flag = os.path.join(str(storage), "fault_fired")
    fn = fail_once_trainable(flag, 2, base_flat=to_flat_dict(cfg), sweep_name=name, mlflow_uri=uri,
                             experiment_name=name, artifact_root=artifacts)
    tuner = tune.Tuner(
        tune.with_resources(fn, placement_group_factory(cfg)),
        param_space={"seed": 3},
        run_config=_run_config(cfg, name, str(storage)),
    )
    results = tuner.fit()
    return {"results": results, "flag": flag, "uri": uri, "name": name, "cfg": cfg}


# ---------------------------------------------------------------------------------------------- placement


def test_async_trials_run_concurrently_with_their_actors_in_their_own_bundles(async_sweep, ray_cluster):
    results = async_sweep.results
    assert results.num_errors == 0 and results.num_terminated == 4
    firsts, spans = [], []
    for d in [r.path for r in async_results(async_sweep)]:
        rows = progress(d)
        assert len(rows) >= 2
        first = rows[0]
        # observed inside the trial at its first report: every actor's runtime context names the trial's
        # placement group, and the trial's bundles 0 (the trial: driver + learner), 1, 2 are all taken
        assert first["placement/actors"] == "2"
        assert first["placement/actors_in_trial_pg"] == "1"
        assert first["placement/actor_bundles"] == "1 2"  # collector 0 -> bundle 1, evaluator 0 -> bundle 2
        assert first["placement/bundles_in_use"] == "0 1 2"
        assert all(r["pipeline"] == "async" for r in rows)
        firsts.append(first)
        # the trial ran from (its first report - the time it took) to its last report
        spans.append((float(first["timestamp"]) - float(first["time_total_s"]), max(col(rows, "timestamp"))))
    pg_a, pg_b = (f["placement/trial_pg_id"] for f in firsts)
    assert pg_a and pg_b and pg_a != pg_b
    pids_a, pids_b = (set(f["placement/actor_pids"].split()) for f in firsts)
    assert len(pids_a) == len(pids_b) == 2 and not pids_a & pids_b
    trial_pids = {f["pid"] for f in firsts}  # the trials' own processes (bundle 0)
    assert len(trial_pids) == 2 and not trial_pids & (pids_a | pids_b)
    # the two trials ran at the same time (both placement groups were live together)
    (a0, a1), (b0, b1) = spans
    assert a0 <= b1 and b0 <= a1
    # the cluster knows both groups: the driver's bundle and the actors' (Tune removes them when trials end)
    table = ray_cluster.util.placement_group_table()
    for pg in (pg_a, pg_b):
        assert table[pg]["bundles"] == {0: {"CPU": 1.0}, 1: {"CPU": 0.25}, 2: {"CPU": 0.25}}
        assert table[pg]["strategy"] == "PACK"


# ---------------------------------------------------------------------------------------------- checkpoints


def test_async_checkpoints_hold_exactly_the_weights_the_evaluator_used(async_sweep):
    for d in [r.path for r in async_results(async_sweep)]:
        by_eval = {int(float(r["eval_index"])): r for r in progress(d)}
        paths = checkpoints(d)
        assert paths
        for path in paths:
            ev = load_checkpoint(path)["evaluated"]
            assert ev["weights_digest"]  # the digest the evaluator actor reported for the weights it loaded
            assert weights_digest(ev["weights"]) == ev["weights_digest"]
            row = by_eval[ev["metrics"]["eval_index"]]
            assert ev["version"] == ev["metrics"]["policy_version"] == int(float(row["policy_version"]))
            assert ev["metrics"]["reward_mean"] == float(row["reward_mean"])


@pytest.mark.parametrize("which", ["sync", "async"])
def test_evaluating_a_trial_checkpoint_reproduces_its_reported_reward(which, request):
    if which == "async":
        dirs = [r.path for r in async_results(request.getfixturevalue("async_sweep"))]
    else:
        dirs = trial_dirs(request.getfixturevalue("sync_fault")["results"])
    setup_torch_threads()  # as in the trial and its actors
    checked = 0
    for d in dirs:
        reported = {int(float(r["eval_index"])): float(r["reward_mean"]) for r in progress(d)}
        for path in checkpoints(d)[-2:]:
            cfg, policy, model, ckpt = load_policy(path)
            assert cfg.policy.async_pipeline.enabled == (which == "async")
            evaluator = Evaluator(cfg, policy, policy.spec, seed=cfg.seed + EVAL_SEED_OFFSET)
            try:
                res = evaluator.evaluate(model, policy_version=ckpt["evaluated"]["version"])
            finally:
                evaluator.close()
            metrics = ckpt["evaluated"]["metrics"]
            assert res.reward_mean == metrics["reward_mean"] == reported[metrics["eval_index"]]
            assert len(res.episode_returns) == cfg.eval.n_episodes
            checked += 1
    assert checked >= 2


# ---------------------------------------------------------------------------------------------- failures


def test_trial_error_is_retried_from_its_last_checkpoint_and_counters_continue(sync_fault):
    results = sync_fault["results"]
    assert results.num_errors == 0 and results.num_terminated == 1
    assert open(sync_fault["flag"]).read() == "2"  # the fault fired once, after the 2nd report
    (d,) = trial_dirs(results)
    rows = progress(d)
    n = len(rows)
    assert n >= 4
    # one restart, right after report 2: the 3rd row is the first of a new trial process
    restarts = [i for i, r in enumerate(rows) if r["iterations_since_restore"] == "1"]
    assert restarts == [0, 2]
    assert rows[2]["pid"] != rows[1]["pid"]
    assert col(rows, "training_iteration") == list(range(1, n + 1))
    assert col(rows, "eval_index") == list(range(1, n + 1))  # no gap, no repeat
    for key in ("train_iter", "envstep"):
        vals = col(rows, key)
        assert all(a < b for a, b in zip(vals, vals[1:])), (key, vals)
    # the retry resumed from the checkpoint of report 2 and continued from its counters
    ckpt = load_checkpoint(os.path.join(d, "checkpoint_000001", CHECKPOINT_FILE))
    counters = ckpt["resume"]["counters"]
    assert counters["eval_index"] == 2
    assert ckpt["resume"]["learner"]["train_iter"] == int(float(rows[1]["train_iter"]))
    assert counters["env_steps"] == int(float(rows[1]["envstep"]))
    assert "buffer" in ckpt["resume"]  # tune.save_replay_buffer
    assert int(float(rows[2]["eval_index"])) == counters["eval_index"] + 1
    assert int(float(rows[2]["train_iter"])) > ckpt["resume"]["learner"]["train_iter"]
    assert int(float(rows[2]["envstep"])) > counters["env_steps"]
    assert float(rows[2]["wall_s"]) > float(rows[1]["wall_s"])  # wall time carried across the restart
    # one MLflow run for the trial, reopened by the retry: one metric point per report
    from mlflow.tracking import MlflowClient

    client = MlflowClient(sync_fault["uri"])
    exp = client.get_experiment_by_name(sync_fault["name"])
    trial_id = results[0].metrics["trial_id"]
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`{TRIAL_TAG}` = '{trial_id}'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    hist = client.get_metric_history(runs[0].info.run_id, "eval_index")
    assert sorted(int(m.value) for m in hist) == list(range(1, n + 1))
    assert sorted(m.step for m in hist) == [int(v) for v in col(rows, "envstep")]  # steps are env steps


# ---------------------------------------------------------------------------------------------- Optuna


def test_optuna_sweep_over_the_policy_lag_space_runs_its_trials_to_completion(ray_cluster, tmp_path):
    from muzero_tune.tune.sweep import run_sweep

    # 50 train steps: 2 reports + the final one; MLflow's logging is checked on the other sweeps
    res = run_sweep("policy_lag_optuna", samples=2, max_concurrent=2, name="optuna",
                    overrides=tiny(tmp_path, max_envstep=200, **{"tune.mlflow": False}))
    results = res.results
    assert len(results) == 2
    assert results.num_errors == 0 and results.num_terminated == 2
    for r in results:
        assert r.error is None and r.metrics["eval_index"] >= 1
        assert r.config[AP + "weight_sync_interval"] in (1, 2, 4, 8, 16, 32)
        assert -1 <= r.config[AP + "max_policy_lag"] <= 32
        assert len(progress(r.path)) == r.metrics["training_iteration"]


# ---------------------------------------------------------------------------------------------- MLflow


def test_mlflow_has_one_run_per_trial_with_params_tags_and_a_point_per_report(async_sweep):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(async_sweep.tracking_uri)
    exp = client.get_experiment_by_name(async_sweep.experiment_name)
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 4
    by_trial = {r.data.tags[TRIAL_TAG]: r for r in runs}
    for result in async_sweep.results:
        run = by_trial[result.metrics["trial_id"]]
        assert run.info.status == "FINISHED"
        p, t = run.data.params, run.data.tags
        assert p["learn.batch_size"] == "32" and p["mcts.num_simulations"] == "4"
        pipeline = "async" if result.config[AP + "enabled"] else "sync"
        assert p[AP + "enabled"] == str(result.config[AP + "enabled"])
        assert p[AP + "weight_sync_interval"] == str(result.config[AP + "weight_sync_interval"])
        assert (t["pipeline"], t["policy_type"], t["env_id"]) == (pipeline, "muzero", "CartPole-v1")
        assert t["seed"] == str(result.config["seed"])
        assert t["sweep"] == async_sweep.experiment_name
        assert t["trial_name"] in os.path.basename(result.path)
        rows = progress(result.path)
        for key in ("reward_mean", "envstep", "train_iter", "wall_s"):
            hist = client.get_metric_history(run.info.run_id, key)
            hist = sorted(hist, key=lambda m: (m.step, m.timestamp))
            assert [m.step for m in hist] == [int(float(r["envstep"])) for r in rows]  # x axis: env steps
            assert [m.value for m in hist] == col(rows, key)


def test_compare_writes_three_plots_and_logs_them_to_a_compare_run(async_sweep, tmp_path):
    from mlflow.tracking import MlflowClient

    from muzero_tune.tune.compare import compare

    out = compare(async_sweep.tracking_uri, async_sweep.experiment_name, str(tmp_path / "plots"))
    names = sorted(os.path.basename(p) for p in out["plots"] if p.endswith(".png"))
    assert names == ["envstep_per_s.png", "reward_vs_envstep.png", "reward_vs_wall.png"]
    for p in out["plots"]:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert os.path.getsize(p) > 1000
    assert out["summary"]["async"]["runs"] == out["summary"]["sync"]["runs"] == 2.0
    client = MlflowClient(async_sweep.tracking_uri)
    run = client.get_run(out["run_id"])
    assert run.info.run_name.startswith("compare-") and run.data.tags["muzero_tune.kind"] == "compare"
    arts = {os.path.basename(a.path): a.file_size for a in client.list_artifacts(out["run_id"], "plots")}
    assert sorted(arts) == names and all(size > 1000 for size in arts.values())


# ------------------------------------------------------------------------------------------------ dashboard


def _trial_runs(client, sweep):
    exp = client.get_experiment_by_name(sweep.experiment_name)
    return exp, {r.data.tags[TRIAL_TAG]: r for r in client.search_runs([exp.experiment_id])}


def test_sweep_experiment_opens_as_model_training_with_a_description_and_a_grouped_view(async_sweep):
    import json

    from mlflow.tracking import MlflowClient

    from muzero_tune.runs import mlflow_log as ml

    exp = MlflowClient(async_sweep.tracking_uri).get_experiment_by_name(async_sweep.experiment_name)
    tags = exp.tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    desc = tags["mlflow.note.content"]
    for part in ("Sweep `quickstart`", "preset `cartpole_muzero`", "4 trials (grid)", "`seed` {0, 1}",
                 f"`{AP}enabled` {{False, True}}", f"`{AP}max_policy_lag` 8", "env steps",
                 "sync_vs_async_compare"):
        assert part in desc, (part, desc)
    assert (tags["muzero_tune.space"], tags["muzero_tune.preset"], tags["muzero_tune.trials"]) == (
        "quickstart", "cartpole_muzero", "4")
    view = json.loads(tags["mlflow.sharedViewState.sync-vs-async"])
    assert view["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": "pipeline"}]
    assert [c["metricKey"] for c in view["compareRunCharts"]] == ["eval/reward_mean", "perf/envstep_per_s"]
    assert view["isAccordionReordered"] and view["globalLineChartConfig"]["xAxisKey"] == "step"
    url = ml.experiment_url(exp.experiment_id)
    assert url == (f"http://127.0.0.1:5000/#/experiments/{exp.experiment_id}/runs"
                   "?workflowType=machine_learning&compareRunsMode=CHART&viewStateShareKey=sync-vs-async")


def test_every_trial_run_is_named_by_pipeline_lag_seed_and_trial_and_tagged_for_group_by(async_sweep):
    import re

    from mlflow.tracking import MlflowClient

    client = MlflowClient(async_sweep.tracking_uri)
    _, by_trial = _trial_runs(client, async_sweep)
    assert len(by_trial) == 4
    seen = set()
    for result in async_sweep.results:
        trial_id, cfg = result.metrics["trial_id"], result.config
        run = by_trial[trial_id]
        t = run.data.tags
        if cfg[AP + "enabled"]:
            expected = f"async-lag8-sync4-s{cfg['seed']}-{trial_id}"
            assert (t["max_policy_lag"], t["weight_sync_interval"]) == ("8", "4")
        else:
            expected = f"sync-s{cfg['seed']}-{trial_id}"
            assert "max_policy_lag" not in t
        assert run.info.run_name == t["mlflow.runName"] == expected
        assert re.fullmatch(r"(sync|async-lag8-sync4)-s[01]-[0-9a-f]{5}_\d{5}", run.info.run_name)
        assert t["pipeline"] == expected.split("-")[0] and t["seed"] == str(cfg["seed"])
        assert t["muzero_tune.kind"] == "trial" and t["sweep"] == async_sweep.experiment_name
        assert t["trial_name"] in t["mlflow.note.content"]
        seen.add((t["pipeline"], t["seed"]))
    assert seen == {("sync", "0"), ("sync", "1"), ("async", "0"), ("async", "1")}  # Group by: 2 lines x 2


def test_reward_and_throughput_are_also_logged_under_a_prefix_with_env_steps_as_x(async_sweep):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(async_sweep.tracking_uri)
    _, by_trial = _trial_runs(client, async_sweep)
    for result in async_sweep.results:
        run_id = by_trial[result.metrics["trial_id"]].info.run_id
        steps = [int(float(r["envstep"])) for r in progress(result.path)]
        assert steps == sorted(steps) and steps[-1] == result.metrics["envstep"]
        for bare, prefixed in (("reward_mean", "eval/reward_mean"), ("envstep_per_s", "perf/envstep_per_s")):
            a = sorted((m.step, m.value) for m in client.get_metric_history(run_id, bare))
            b = sorted((m.step, m.value) for m in client.get_metric_history(run_id, prefixed))
            assert a == b and [s for s, _ in a] == steps  # x: env steps, one point per report


def test_compare_logs_to_its_own_experiment_and_prints_the_chart_view_url(async_sweep, tmp_path):
    from conftest import run_cli
    from mlflow.tracking import MlflowClient

    uri, name = async_sweep.tracking_uri, async_sweep.experiment_name
    res = run_cli(["compare", "--experiment", name, "--tracking-uri", uri, "--out", str(tmp_path / "p"),
                   "--ui-url", "http://127.0.0.1:5077"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    client = MlflowClient(uri)
    exp, by_trial = _trial_runs(client, async_sweep)
    # the trials' experiment still holds exactly the 4 trial runs; no summary number among their metrics
    assert len(by_trial) == 4 and all(r.data.tags["muzero_tune.kind"] == "trial" for r in by_trial.values())
    assert not {k for r in by_trial.values() for k in r.data.metrics if k.split("/")[0] in ("sync", "async")}
    chart_url = (f"http://127.0.0.1:5077/#/experiments/{exp.experiment_id}/runs"
                 "?workflowType=machine_learning&compareRunsMode=CHART&viewStateShareKey=sync-vs-async")
    assert f"chart view (grouped by pipeline): {chart_url}" in res.stdout
    cmp_exp = client.get_experiment_by_name(name + "_compare")
    assert cmp_exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert cmp_exp.tags["muzero_tune.compares"] == name and name in cmp_exp.tags["mlflow.note.content"]
    exp_tags = client.get_experiment(exp.experiment_id).tags
    assert exp_tags["muzero_tune.compare_experiment"] == name + "_compare"
    runs = client.search_runs([cmp_exp.experiment_id])
    assert runs and all(r.data.tags["muzero_tune.kind"] == "compare" for r in runs)
    run = runs[0]
    assert f"#/experiments/{cmp_exp.experiment_id}/runs/{run.info.run_id}/artifacts/plots/" in res.stdout
    assert run.data.metrics["sync/runs"] == run.data.metrics["async/runs"] == 2.0
    arts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"plots", "summary.json", "summary.csv"} <= arts
    table = client.download_artifacts(run.info.run_id, "summary.csv", str(tmp_path))
    assert open(table).read().splitlines()[0] == "pipeline,runs,envstep_per_s,reward_best"


@pytest.mark.slow
def test_dashboard_snapshot_saves_the_runs_and_chart_views_as_pngs(async_sweep, tmp_path):
    """The proof this slow check makes at full size.

    Default-tier twin:
    tests/test_tune.py::test_sweep_experiment_opens_as_model_training_with_a_description_and_a_grouped_view
    """
    import shutil
    import subprocess
    import sys

    from PIL import Image

    if not any(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")):
        pytest.skip("Chromium is not installed (apt-get install -y chromium)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = os.path.join(root, "scripts", "tools", "dashboard_snapshot.py")
    out = tmp_path / "img"
    args = ["--tracking-uri", async_sweep.tracking_uri, "--experiment", async_sweep.experiment_name,
            "--out", str(out), "--width", "1200", "--height", "800"]
    res = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr + res.stdout
    assert "not fully drawn" not in res.stdout, res.stdout
    for view in ("runs", "charts"):
        path = out / f"mlflow_{view}.png"
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        with Image.open(path) as img:
            assert img.size == (1200, 800)
            colors = img.convert("RGB").getcolors(maxcolors=1 << 20)
            assert colors is None or len(colors) > 50  # a drawn page, not a blank one
        assert os.path.getsize(path) > 20_000
    assert "/runs?workflowType=machine_learning&compareRunsMode=CHART" in res.stdout
    assert "mlflow ui on http://127.0.0.1:" in res.stdout


# ---------------------------------------------------------------------------------------------- bad input


def _no_trial_started(storage) -> None:
    files = files_under(storage)
    assert not [f for f in files if os.path.basename(f) in ("progress.csv", "result.json", "params.json")]
    assert not glob.glob(os.path.join(str(storage), "*", "experiment_state-*.json"))
    assert not glob.glob(os.path.join(str(storage), "*", "muzero_tune_sweep.json"))


def test_unknown_space_name_is_a_config_error_with_a_suggestion(tmp_path):
    from muzero_tune.tune.sweep import run_sweep

    with pytest.raises(ConfigError) as e:
        run_sweep("policy_lag_gird", overrides=tiny(tmp_path))
    msg = str(e.value)
    assert "--space" in msg and "'policy_lag_grid'" in msg
    _no_trial_started(tmp_path)


def test_unknown_param_space_key_is_a_config_error_with_a_suggestion(tmp_path):
    from ray import tune

    from muzero_tune.tune.sweep import run_sweep

    with pytest.raises(ConfigError) as e:
        run_sweep("policy_lag_grid", overrides=tiny(tmp_path),
                  param_space_extra={AP + "weight_sync_intervl": tune.grid_search([1])})
    msg = str(e.value)
    assert AP + "weight_sync_intervl" in msg and f"'{AP}weight_sync_interval'" in msg
    _no_trial_started(tmp_path)


@pytest.mark.parametrize("bad", ["grid", "choice", "randint"])
def test_out_of_range_search_value_is_a_config_error(bad, tmp_path):
    from ray import tune

    from muzero_tune.tune.sweep import run_sweep

    domain = {"grid": tune.grid_search([4, 0]), "choice": tune.choice([1, 2, 0]),
              "randint": tune.randint(0, 8)}[bad]
    with pytest.raises(ConfigError) as e:
        run_sweep("policy_lag_grid", overrides=tiny(tmp_path),
                  param_space_extra={AP + "weight_sync_interval": domain})
    msg = str(e.value)
    assert AP + "weight_sync_interval" in msg and ">= 1" in msg
    _no_trial_started(tmp_path)


def test_placement_that_cannot_fit_the_cluster_is_a_config_error(ray_cluster, tmp_path):
    from muzero_tune.tune.sweep import run_sweep

    have = ray_cluster.cluster_resources()["CPU"]
    with pytest.raises(ConfigError) as e:
        run_sweep("policy_lag_grid", overrides=tiny(tmp_path, **{
            AP + "num_collector_actors": 64, AP + "collector_num_cpus": 1.0, AP + "evaluator_num_cpus": 1.0}))
    msg = str(e.value)
    assert "placement" in msg and "66 CPU" in msg and f"has {have:g}" in msg and "num_collector_actors" in msg
    _no_trial_started(tmp_path)


# ------------------------------------------------------------------------------------- reported metrics


def test_reports_carry_timesteps_total_and_training_episode_returns(async_sweep):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(async_sweep.tracking_uri)
    exp = client.get_experiment_by_name(async_sweep.experiment_name)
    by_trial = {r.data.tags.get(TRIAL_TAG): r for r in client.search_runs([exp.experiment_id])}
    for result in async_sweep.results:
        rows = progress(result.path)
        assert col(rows, "timesteps_total") == col(rows, "envstep")  # Tune's loggers plot against env steps
        episodes = col(rows, "collect/episodes")
        assert episodes == sorted(episodes) and episodes[-1] > 0
        assert result.metrics["collect/episode_return_mean"] >= 8  # CartPole: at least 8 steps an episode
        run = by_trial[result.metrics["trial_id"]]
        hist = client.get_metric_history(run.info.run_id, "collect/episode_return_mean")
        assert hist and all(m.step in {int(v) for v in col(rows, "envstep")} for m in hist)
        assert glob.glob(os.path.join(result.path, "events.out.tfevents.*"))  # Tune's TensorBoard files


def test_cli_eval_and_resume_accept_tune_trial_paths_and_an_async_trial_resumes_async(
    async_sweep, tmp_path, capsys
):
    import json

    from muzero_tune.cli import main as cli_main

    d = async_results(async_sweep)[0].path
    newest = checkpoints(d)[-1]
    for path in (d, os.path.dirname(newest), newest):
        assert cli_main(["eval", path, "--episodes", "1"]) == 0
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert out["checkpoint"] == newest and out["episodes"] == 1
    ckpt = load_checkpoint(newest)
    counters = ckpt["resume"]["counters"]
    args = ["train", "--resume", os.path.dirname(newest), "--set", f"logging.output_dir={tmp_path}",
            "--set", "exp_name=from_trial", "--set", f"max_envstep={counters['env_steps'] + 60}",
            "--set", "learn.resume_warmup_transitions=16"]
    assert cli_main(args) == 0
    err = capsys.readouterr().err
    assert f"eval_index={counters['eval_index']}" in err and "async pipeline" in err
    with open(tmp_path / "from_trial" / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert rows and all(r["pipeline"] == "async" for r in rows)
    assert rows[0]["eval_index"] == counters["eval_index"] + 1
    with open(tmp_path / "from_trial" / "config.json") as f:
        cfg = json.load(f)
    assert cfg[AP + "weight_sync_interval"] == ckpt["config"][AP + "weight_sync_interval"]  # the trial's own


def test_compare_of_an_unknown_experiment_is_one_line(async_sweep, tmp_path):
    from conftest import run_cli

    uri = async_sweep.tracking_uri
    res = run_cli(["compare", "--experiment", "nope", "--tracking-uri", uri], cwd=tmp_path)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr
    assert "--experiment nope: no such MLflow experiment" in lines[0]
    assert async_sweep.experiment_name in lines[0]  # the experiments that do exist


def test_device_auto_reserves_a_gpu_in_bundle_0_only_when_the_cluster_has_one(ray_cluster, tmp_path):
    from muzero_tune.tune.resources import trial_bundles

    auto = make_config("cartpole_muzero", overrides=tiny(tmp_path, **{"learn.device": "auto"}))
    cpu = make_config("cartpole_muzero", overrides=tiny(tmp_path))
    asyn = make_config(
        "cartpole_muzero", overrides=tiny(tmp_path, **{"learn.device": "auto", AP + "enabled": True})
    )
    assert trial_bundles(auto, cluster_gpus=1.0) == [{"CPU": 1.0, "GPU": 1.0}]
    assert trial_bundles(asyn, cluster_gpus=2.0)[0] == {"CPU": 1.0, "GPU": 1.0}
    assert all("GPU" not in b for b in trial_bundles(asyn, cluster_gpus=2.0)[1:])
    assert trial_bundles(auto, cluster_gpus=0.0) == [{"CPU": 1.0}]
    assert trial_bundles(cpu, cluster_gpus=1.0) == [{"CPU": 1.0}]
    assert trial_bundles(auto) == [{"CPU": 1.0}]  # the test cluster has no GPU


def test_learner_threads_are_reserved_in_bundle_0(tmp_path):
    """``learn.num_threads`` is the cores the learner's step uses: the driver's bundle reserves them, sync and
    async, and the actors' bundles are unchanged."""
    from muzero_tune.tune.resources import trial_bundles

    two = {"learn.num_threads": 2}
    sync = make_config("cartpole_muzero", overrides=tiny(tmp_path, **two))
    asyn = make_config("cartpole_muzero", overrides=tiny(tmp_path, **two, **{AP + "enabled": True}))
    assert trial_bundles(sync, cluster_gpus=0.0) == [{"CPU": 2.0}]
    assert trial_bundles(asyn, cluster_gpus=0.0)[0] == {"CPU": 2.0}
    assert all(b == {"CPU": 0.25} for b in trial_bundles(asyn, cluster_gpus=0.0)[1:])  # tiny()'s actors
