"""Every policy type through every path: a standalone async run and a Ray Tune trial on each pipeline, each
evaluated snapshot loaded and evaluated again to exactly what was reported.

The Tune part is one sweep: a grid over the ten registered types x {sync, async}, every trial its type's
``cartpole_<type>`` preset shrunk to a tiny run (the preset's own keys reach each trial through
``tune.sample_from``, so the trainable applies them like any ``param_space`` value). Every checkpoint a trial
wrote is re-evaluated with :func:`muzero_tune.api.evaluate` (the run's evaluation seed and episode count)
and must give the reported ``reward_mean`` and ``reward_std`` exactly.

Reward equality alone proves little here: after a couple hundred env steps every type still acts almost
constantly, and on CartPole many weights give the same episodes. So each checkpoint's weights are also tied
bit for bit to the weights that were evaluated (async: the digest the evaluator actor computed of the
weights it loaded; sync: the learner's weights stored in the same checkpoint at the same train step), the
policy loaded from it holds exactly those weights, and a control per trial shows that the re-evaluation
follows the weights: the snapshot steered to always push left and steered to always push right re-evaluate
to those constant policies' returns, which differ under the sweep's seed (seed 4: 10 and 11 steps left
against 8 and 8 right; under seed 0 both are 8 and 11).
"""

from __future__ import annotations

import csv
import glob
import os
from functools import partial

import gymnasium as gym
import pytest
import torch
from conftest import ACTOR_CPUS

from muzero_tune.config import make_config, to_flat_dict
from muzero_tune.pipeline.core import EVAL_SEED_OFFSET
from muzero_tune.pipeline.messages import weights_digest
from muzero_tune.policies.registry import POLICY_CLASSES
from muzero_tune.runs.checkpoint import load_checkpoint, load_policy, save_checkpoint
from muzero_tune.tune.trainable import CHECKPOINT_FILE

AP = "policy.async_pipeline."
TYPES = tuple(POLICY_CLASSES)  # the ten registered types
SEED = 4  # its two evaluation episodes tell always-left from always-right (module docstring)

# the tiny run every trial makes: about 200 env steps, 50 train steps, 2 reports of 2 episodes each
TINY = {
    "model.hidden_dim": 32, "model.latent_dim": 16, "mcts.num_simulations": 4, "learn.batch_size": 32,
    "env.collector_env_num": 4, "env.evaluator_env_num": 2, "eval.n_episodes": 2, "eval.eval_freq": 25,
    "replay.game_segment_length": 20, "max_envstep": 200, "stop_value": None, "logging.quiet": True,
    "seed": SEED,
    **ACTOR_CPUS,  # an async trial (1 + 0.25 + 0.25 CPUs) fits the test cluster
}
# a smaller world model for the transformer types (their preset's E = 64 costs several times a step at 32)
SMALLER = {t: {"policy.world_model_embed_dim": 32} for t in ("unizero", "sampled_unizero")}


def preset_keys(ptype: str, small: dict) -> dict:
    """The settings ``cartpole_<ptype>`` (shrunk by ``small``) holds that ``cartpole_muzero`` does not."""
    base = to_flat_dict(make_config("cartpole_muzero", overrides=small))
    own = to_flat_dict(make_config(f"cartpole_{ptype}", overrides={**small, **SMALLER.get(ptype, {})}))
    return {k: v for k, v in own.items() if v != base[k] and k != "exp_name"}


def constant_action_returns(action: int, seed: int, episodes: int) -> list[float]:
    """CartPole's returns when every step takes ``action``, episode j reset with ``seed + j`` (as the
    evaluator resets them)."""
    out = []
    for j in range(episodes):
        env = gym.make("CartPole-v1")
        env.reset(seed=seed + j)
        steps, done = 0, False
        while not done:
            _, _, terminated, truncated, _ = env.step(action)
            steps, done = steps + 1, terminated or truncated
        env.close()
        out.append(float(steps))
    return out


def policy_output_bias(weights: dict) -> str:
    """The key of the policy head's output bias, one logit per action (every type names its head
    ``*polic*``)."""
    keys = [k for k, v in weights.items() if "polic" in k and k.endswith("bias") and v.shape == (2,)]
    assert len(keys) == 1, f"expected one policy output bias of shape (2,) among {sorted(weights)}"
    return keys[0]


def steered(ckpt: dict, action: int, path: str) -> str:
    """``ckpt`` with its evaluated snapshot steered to ``action`` (+-30 on the policy logits: the prior is
    all on it, and every type's greedy search takes it), written to ``path``."""
    weights = dict(ckpt["evaluated"]["weights"])
    key = policy_output_bias(weights)
    push = torch.full((2,), -30.0)
    push[action] = 30.0
    weights[key] = weights[key] + push
    save_checkpoint(path, {**ckpt, "evaluated": {**ckpt["evaluated"], "weights": weights}})
    return path


def assert_bit_identical(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def check_reevaluates_exactly(path: str, ckpt: dict) -> None:
    """``path`` evaluated again (its run's seed, its episode count) gives exactly what was reported, from a
    policy holding exactly the evaluated weights."""
    from muzero_tune.api import evaluate

    ev = ckpt["evaluated"]
    metrics = ev["metrics"]
    again = evaluate(path)
    assert again.version == ev["version"]
    assert len(again.episode_returns) == metrics["eval_episodes"] == TINY["eval.n_episodes"]
    assert (again.reward_mean, again.reward_std) == (metrics["reward_mean"], metrics["reward_std"])
    assert again.reported_reward_mean == metrics["reward_mean"]
    _, _, model, _ = load_policy(path)
    assert_bit_identical({k: v.cpu() for k, v in model.state_dict().items()}, ev["weights"])


def check_weights_are_the_evaluated_ones(ckpt: dict, pipeline: str) -> None:
    """The snapshot is the one evaluated, bit for bit, from a source other than the snapshot itself."""
    ev = ckpt["evaluated"]
    if pipeline == "async":  # the evaluator actor hashed the weights it had loaded
        assert ev["weights_digest"] and ev["weights_digest"] == weights_digest(ev["weights"])
    else:  # the sync driver evaluates the learner's weights and checkpoints before its next train step
        learner = ckpt["resume"]["learner"]
        assert ev["weights_digest"] == "" and ev["version"] == learner["train_iter"]
        assert_bit_identical(ev["weights"], learner["model"])


def check_reevaluation_follows_the_weights(ckpt: dict, folder: str) -> None:
    """The control: steered left and steered right, the snapshot re-evaluates to those constant policies'
    returns, which differ, so the reported pair matches at most one of them."""
    from muzero_tune.api import evaluate

    seed, n = SEED + EVAL_SEED_OFFSET, TINY["eval.n_episodes"]
    got = {}
    for action in (0, 1):
        res = evaluate(steered(ckpt, action, os.path.join(folder, f"steered_{action}.pt")))
        assert sorted(res.episode_returns) == sorted(constant_action_returns(action, seed, n)), action
        got[action] = (res.reward_mean, res.reward_std)
    assert got[0] != got[1]


# ------------------------------------------------------------------------------------- standalone async


# The default test that proves each type's async run exactly (its async Tune trial: every checkpoint
# re-evaluated, its weights the ones the evaluator actor hashed); the standalone run below is checked the
# same way, by default only for sampled_muzero: the standalone reporter's checkpoints are the same for every
# type, so one type's default case proves them.
TUNE_CELL = "tests/test_every_policy_type.py::test_tune_trial_checkpoints_reevaluate_to_the_reported_reward"
DEFAULT_ASYNC_RUN = {t: f"{TUNE_CELL}[async-{t}]" for t in TYPES if t != "sampled_muzero"}


def test_each_default_async_run_named_here_exists_and_is_not_slow():
    """The slow marks below lean on these tests: each must exist as named and run by default (a parametrised
    one: its case exists and is not slow)."""
    from test_slow_marks import twin_problem

    assert set(DEFAULT_ASYNC_RUN) | {"sampled_muzero"} == set(TYPES)
    problems = [twin_problem(node_id) for node_id in DEFAULT_ASYNC_RUN.values()]
    assert problems == [None] * len(DEFAULT_ASYNC_RUN), problems


@pytest.mark.parametrize("ptype", [
    pytest.param(t, marks=pytest.mark.slow) if t in DEFAULT_ASYNC_RUN else t for t in TYPES])
def test_standalone_async_run_reevaluates_exactly(ptype, run_async, tmp_path):
    """A standalone async run of the type's tiny preset: every checkpoint the standalone reporter wrote
    re-evaluates exactly, its weights the ones the evaluator actor hashed (slow for the types in
    DEFAULT_ASYNC_RUN).

    Default-tier twin: the type's entry in DEFAULT_ASYNC_RUN (its async Tune trial, checked the same way) and
    tests/test_every_policy_type.py::test_standalone_async_run_reevaluates_exactly[sampled_muzero] (the
    standalone reporter's checkpoints, which are the same for every type).
    """
    from muzero_tune.runs.checkpoint import eval_checkpoints

    over = {**preset_keys(ptype, TINY), **{k: TINY[k] for k in ("seed", "max_envstep", "eval.eval_freq")}}
    run = run_async(tmp_path, over, standalone=True, exp_name=ptype)
    s, st = run.summary, run.stats
    assert s.stop_reason == "max_envstep" and s.train_iter > 0 and s.evals
    assert st.results > 0 and st.digest_mismatches == 0
    assert st.collector_restarts == st.evaluator_restarts == 0
    files = eval_checkpoints(os.path.join(run.run_dir, "ckpt"))
    assert len(files) == len(s.evals) == len(run.probe.evals)
    for path, seen in zip(files, run.probe.evals):
        ckpt = load_checkpoint(path)
        assert ckpt["config"]["policy.type"] == ptype
        assert ckpt["evaluated"]["weights_digest"] == seen["digest"]  # what the evaluator actor reported
        check_weights_are_the_evaluated_ones(ckpt, "async")
        check_reevaluates_exactly(path, ckpt)


# ---------------------------------------------------------------------------------------------- Tune


def _type_value(table: dict, base: dict, key: str, config: dict):
    """A trial's value of ``key``: its type's preset value (``tune.sample_from`` calls it with the trial's
    config)."""
    return table[config["policy.type"]].get(key, base[key])


@pytest.fixture(scope="module")
def type_sweep(ray_cluster, tmp_path_factory):
    """One trial per (type, pipeline), no MLflow: ``{(pipeline, type): ray.tune.Result}``.

    Tune reuses a finished trial's process for the next trial of the same shape (``reuse_actors``), so the
    ten sync trials share processes, as the ten async trials' drivers do; each trial still re-evaluates
    exactly, so a reused process carries nothing over from the trial it ran before."""
    from ray import tune

    from muzero_tune.tune.trainable import make_trainable

    storage = str(tmp_path_factory.mktemp("tune_types"))
    small = {**TINY, "tune.storage_path": storage}
    base = to_flat_dict(make_config("cartpole_muzero", overrides=small))
    table = {t: preset_keys(t, small) for t in TYPES}
    keys = sorted({k for own in table.values() for k in own} - {"policy.type"})
    space = {
        "policy.type": tune.grid_search(list(TYPES)),
        AP + "enabled": tune.grid_search([False, True]),
        **{k: tune.sample_from(partial(_type_value, table, base, k)) for k in keys},
    }
    tuner = tune.Tuner(
        make_trainable(make_config("cartpole_muzero", overrides=small), sweep_name="types", mlflow_uri=None),
        param_space=space,
        tune_config=tune.TuneConfig(max_concurrent_trials=2, reuse_actors=True),
        run_config=tune.RunConfig(name="types", storage_path=storage, verbose=0),
    )
    results = tuner.fit()
    assert len(results) == 2 * len(TYPES)
    return {("async" if r.config[AP + "enabled"] else "sync", r.config["policy.type"]): r for r in results}


def test_trials_of_one_shape_share_their_processes(type_sweep):
    """Tune gave a finished trial's process to the next trial of the same shape (the sweep's
    ``reuse_actors``), so the exact re-evaluations below also cover trials run in a used process."""
    for pipeline in ("sync", "async"):
        pids = {type_sweep[(pipeline, t)].metrics["pid"] for t in TYPES}
        assert len(pids) < len(TYPES), (pipeline, pids)


def _without_names(flat: dict) -> dict:
    """A flat config without the settings that only name things (the run, the sweep's folder)."""
    return {k: v for k, v in flat.items() if k not in ("exp_name", "tune.storage_path")}


def _progress(trial_dir: str) -> dict[int, dict[str, str]]:
    with open(os.path.join(trial_dir, "progress.csv"), newline="") as f:
        return {int(float(r["eval_index"])): r for r in csv.DictReader(f)}


@pytest.mark.parametrize("ptype", TYPES)
@pytest.mark.parametrize("pipeline", ["sync", "async"])
def test_tune_trial_checkpoints_reevaluate_to_the_reported_reward(pipeline, ptype, type_sweep, tmp_path):
    result = type_sweep[(pipeline, ptype)]
    assert result.error is None
    rows = _progress(result.path)
    paths = sorted(glob.glob(os.path.join(result.path, "checkpoint_*", CHECKPOINT_FILE)))
    assert len(paths) == len(rows) >= 2 and all(r["pipeline"] == pipeline for r in rows.values())
    with result.checkpoint.as_directory() as d:  # Tune's newest checkpoint: the trial's last report
        assert os.path.samefile(os.path.join(d, CHECKPOINT_FILE), paths[-1])
    # the trial ran its type's preset: the checkpoint's config is cartpole_<type>'s, shrunk the same way
    own = {**TINY, **SMALLER.get(ptype, {}), AP + "enabled": pipeline == "async"}
    expected = _without_names(to_flat_dict(make_config(f"cartpole_{ptype}", overrides=own)))
    for path in paths:
        ckpt = load_checkpoint(path)
        assert _without_names(ckpt["config"]) == expected
        metrics = ckpt["evaluated"]["metrics"]
        assert metrics["reward_mean"] == float(rows[metrics["eval_index"]]["reward_mean"])  # as reported
        check_weights_are_the_evaluated_ones(ckpt, pipeline)
        check_reevaluates_exactly(path, ckpt)
    assert result.metrics["reward_mean"] == load_checkpoint(paths[-1])["evaluated"]["metrics"]["reward_mean"]
    assert result.metrics["train_iter"] > 0 and result.metrics["envstep"] >= TINY["max_envstep"]
    check_reevaluation_follows_the_weights(load_checkpoint(paths[-1]), str(tmp_path))
