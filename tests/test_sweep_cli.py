"""Sweeps from the command line: any key on a grid or drawn from a distribution (with a named space or
without), ASHA stopping over the run's own env-step budget, and a sweep name that already holds a sweep
refused unless replaced (so ``compare`` never mixes two)."""

from __future__ import annotations

import glob
import json
import os

import pytest

from muzero_tune.cli import main as cli_main
from muzero_tune.config import ConfigError, make_config

TINY = {
    "model.hidden_dim": 32, "model.latent_dim": 16, "mcts.num_simulations": 4, "learn.batch_size": 32,
    "env.collector_env_num": 4, "env.evaluator_env_num": 2, "eval.n_episodes": 2, "eval.eval_freq": 20,
    "replay.game_segment_length": 20, "max_envstep": 60, "stop_value": None, "logging.quiet": True,
}  # fmt: skip


def _sweep_args(storage, *extra: str) -> list[str]:
    sets = [a for k, v in {**TINY, "tune.storage_path": storage}.items() for a in ("--set", f"{k}={v}")]
    return ["sweep", *sets, "--max-concurrent", "2", *extra]


def _trial_params(exp_dir: str) -> list[dict]:
    out = []
    for path in sorted(glob.glob(os.path.join(exp_dir, "*", "params.json"))):
        with open(path) as f:
            out.append(json.load(f))
    return out


def test_a_grid_over_any_key_runs_a_trial_per_value_and_a_name_is_never_mixed(ray_cluster, tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    from muzero_tune.runs.mlflow_log import default_tracking_uri

    args = _sweep_args(str(tmp_path), "--grid", "learn.learning_rate=1e-3,3e-3", "--name", "lr")
    assert cli_main(args) == 0
    exp_dir = os.path.join(str(tmp_path), "lr")
    assert sorted(p["learn.learning_rate"] for p in _trial_params(exp_dir)) == [1e-3, 3e-3]
    capsys.readouterr()
    # the same name again: refused before any trial, naming the ways out
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert "sweep 'lr' exists" in err and "muzero-tune resume" in err and "--overwrite" in err
    # --overwrite (here a one-trial sweep): the old trials and their MLflow runs go; compare's experiment
    # holds only the new sweep
    again = _sweep_args(str(tmp_path), "--grid", "seed=5", "--name", "lr", "--overwrite")
    assert cli_main(again) == 0
    assert _trial_params(exp_dir) == [{"seed": 5}]  # only the new sweep's trial
    client = MlflowClient(default_tracking_uri(str(tmp_path)))
    active = client.search_runs([client.get_experiment_by_name("lr").experiment_id])
    assert [r.data.tags["seed"] for r in active] == ["5"]


def test_distributions_on_the_command_line_are_typed_and_checked_before_ray_starts():
    from ray.tune.search.sample import Categorical, Float, Integer

    from muzero_tune.tune.flags import param_space_from_flags

    space = param_space_from_flags({
        "grid": ["learn.lr_milestones=[1000],[2000,4000]"],
        "choice": ["policy.async_pipeline.enabled=true,false"],
        "loguniform": ["learn.learning_rate=1e-4,1e-2"], "randint": ["mcts.num_simulations=8,33"],
    })  # fmt: skip
    assert space["learn.lr_milestones"] == {"grid_search": [[1000], [2000, 4000]]}
    assert isinstance(space["policy.async_pipeline.enabled"], Categorical)
    assert space["policy.async_pipeline.enabled"].categories == [True, False]
    lr, sims = space["learn.learning_rate"], space["mcts.num_simulations"]
    assert isinstance(lr, Float) and (lr.lower, lr.upper) == (1e-4, 1e-2)
    assert isinstance(sims, Integer) and (sims.lower, sims.upper) == (8, 33)
    for flags, match in [
        ({"grid": ["learn.learnin_rate=1"]}, "did you mean 'learn.learning_rate'"),
        ({"grid": ["learn.learning_rate=fast"]}, "--grid learn.learning_rate.*expected a number"),
        ({"uniform": ["learn.learning_rate=3,1"]}, "LOW < HIGH"),
        ({"loguniform": ["learn.weight_decay=0,1"]}, "LOW must be > 0"),
        ({"grid": ["seed=1"], "choice": ["seed=2,3"]}, "already swept"),
    ]:
        with pytest.raises(ConfigError, match=match):
            param_space_from_flags(flags)


def test_asha_stops_over_env_steps_up_to_the_runs_budget():
    from muzero_tune.tune.sweep import _tune_configs
    from search_spaces import get_space

    cfg = make_config("cartpole_muzero", overrides={"max_envstep": 12_000})
    tc = _tune_configs(cfg, get_space("policy_lag_optuna"), samples=None, scheduler=None, max_concurrent=2,
                       seed=0, envstep_budgets=[cfg.max_envstep])  # fmt: skip
    asha = tc.scheduler
    assert (asha._time_attr, asha._max_t) == ("envstep", 12_000)
    assert [rung for rung, _ in asha._brackets[0]._rungs] == [9_600, 4_800, 2_400, 1_200]  # first: grace
    swept = _tune_configs(cfg, get_space("blank"), samples=None, scheduler="asha", max_concurrent=2, seed=0,
                          envstep_budgets=[6_000, 50_000])  # fmt: skip
    assert swept.scheduler._max_t == 50_000  # a sweep over max_envstep: its largest value
