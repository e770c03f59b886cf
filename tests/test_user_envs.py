"""Envs the library has no preset for: any registered gymnasium id, ``module:EnvId``, ``env.kwargs`` and
``env.wrappers``, the spaces decided from the env, and a clear refusal of the spaces it cannot take."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import pytest

from muzero_tune.config import ConfigError, make_config
from muzero_tune.envs import EnvConfigError, UnknownEnvError, UnsupportedEnvError, env_spec, make_env
from muzero_tune.pipeline.core import check_policy_env
from muzero_tune.policies.base import with_model_kind

CORRIDOR = "tests.user_envs:UserCorridor-v0"
STEPS_TAKEN = "tests.user_envs:StepsTaken {key: steps}"


def test_frozenlake_discrete_observations_are_one_hot():
    env = make_env("FrozenLake-v1", kwargs={"is_slippery": False}, seed=0)
    obs, _ = env.reset()
    assert obs.dtype == np.float32 and obs.shape == (16,) and obs[0] == 1.0 and obs.sum() == 1.0
    obs, *_ = env.step(2)  # right: the agent is on cell 1
    assert obs[1] == 1.0 and obs.sum() == 1.0
    spec = env_spec("FrozenLake-v1", kwargs={"is_slippery": False})
    assert (spec.frame_shape, spec.num_actions, spec.action_kind) == ((16,), 4, "discrete")


def test_tuple_observations_are_flattened():
    spec = env_spec("Blackjack-v1")  # Tuple(Discrete(32), Discrete(11), Discrete(2)) -> 45 one-hot entries
    assert spec.frame_shape == (45,) and spec.num_actions == 2


def test_a_users_module_env_with_kwargs_and_a_wrapper():
    """``module:EnvId`` imports the module (which registers the id); a Dict observation becomes one vector,
    a MultiDiscrete([2, 2]) action one flat action of 4, and the wrapper's keyword arguments arrive."""
    env = make_env(CORRIDOR, kwargs={"length": 4, "max_steps": 20}, wrappers=(STEPS_TAKEN,), seed=0)
    obs, _ = env.reset()
    # Dict entries in key order: position one-hot [4], then steps_left [1]
    np.testing.assert_array_equal(obs, [1, 0, 0, 0, 20])
    assert env.action_space == gym.spaces.Discrete(4)
    obs, reward, terminated, _, info = env.step(2)  # flat 2 = (direction 1, flag 0): one cell right
    np.testing.assert_array_equal(obs, [0, 1, 0, 0, 19])
    assert info["steps"] == 1 and reward == 0.0 and not terminated
    for _ in range(2):
        obs, reward, terminated, _, _ = env.step(3)  # (1, 1): right again
    assert terminated and reward == 1.0


@pytest.mark.skipif(importlib.util.find_spec("Box2D") is None, reason="needs the box2d extra")
def test_image_observations_become_square_channel_first_frames():
    spec = env_spec("CarRacing-v3")  # 96 x 96 x 3 uint8, continuous actions
    assert spec.frame_shape == (1, 64, 64) and spec.frame_dtype == "uint8" and spec.action_dim == 3
    rgb = env_spec("CarRacing-v3", grayscale=False, frame_size_px=96)
    assert rgb.frame_shape == (3, 96, 96)
    cfg = make_config(None, overrides={"env.env_id": "CarRacing-v3", "policy.type": "sampled_muzero"})
    assert cfg.model.kind == "auto" and with_model_kind(cfg, spec).model.kind == "conv"


def test_model_kind_auto_follows_the_frames_and_a_mismatch_is_refused():
    vector = env_spec("FrozenLake-v1")
    cfg = make_config(None, overrides={"env.env_id": "FrozenLake-v1"})
    assert cfg.model.kind == "auto" and with_model_kind(cfg, vector).model.kind == "mlp"
    conv = make_config(None, overrides={"env.env_id": "FrozenLake-v1", "model.kind": "conv"})
    with pytest.raises(ConfigError, match="vector observations .16,.: use model.kind=mlp or auto"):
        check_policy_env(conv)


def test_what_cannot_be_taken_is_one_line_naming_it():
    with pytest.raises(UnsupportedEnvError, match="unsupported observation space Text.*Supported: Box"):
        env_spec("tests.user_envs:UserTextObs-v0")
    with pytest.raises(UnknownEnvError, match="cannot import module 'no_such_pkg.envs'"):
        make_env("no_such_pkg.envs:Thing-v0")
    with pytest.raises(UnsupportedEnvError, match="env.wrappers: 'tests.user_envs:Nothing'"):
        make_env(CORRIDOR, wrappers=("tests.user_envs:Nothing",))
    with pytest.raises(UnsupportedEnvError, match="env.wrappers: 'gymnasium'"):
        make_env(CORRIDOR, wrappers=("gymnasium",))
    with pytest.raises(EnvConfigError, match="env.kwargs"):
        make_env(CORRIDOR, kwargs={"no_such_argument": 1})
    # and through the config, before any work starts
    with pytest.raises(ConfigError, match="env.env_id"):
        make_config(None, overrides={"env.env_id": "no_such_pkg.envs:Thing-v0"})


def test_kwargs_in_yaml_and_on_the_command_line(tmp_path):
    path = tmp_path / "env.yaml"
    path.write_text(f"env:\n  env_id: {CORRIDOR}\n  kwargs: {{length: 6}}\n  wrappers: ['{STEPS_TAKEN}']\n")
    cfg = make_config(None, yaml_path=str(path), overrides={"env.kwargs.max_steps": "30"})
    assert cfg.env.kwargs == {"length": 6, "max_steps": 30} and cfg.env.wrappers == (STEPS_TAKEN,)
    assert check_policy_env(cfg)[1].frame_shape == (7,)


# ---------------------------------------------------------------------------------------------- training

USER_RUN = {
    "env.env_id": CORRIDOR, "env.kwargs": {"length": 4, "max_steps": 20}, "env.wrappers": [STEPS_TAKEN],
    "model.hidden_dim": 32, "model.latent_dim": 16, "mcts.num_simulations": 8, "learn.batch_size": 32,
    "env.collector_env_num": 4, "env.evaluator_env_num": 2, "eval.n_episodes": 2, "eval.eval_freq": 20,
    "replay.game_segment_length": 20, "max_envstep": 3000, "stop_value": 1.0, "logging.quiet": True,
}


@pytest.mark.parametrize("pipeline", ["sync", "async"])
def test_a_users_module_env_trains_to_its_goal(pipeline, ray_cluster, tmp_path):
    """Through ``train``: the sync driver, and the async one whose Ray actors build the env themselves from
    the config (importing the user's module there too)."""
    from muzero_tune.api import train
    from muzero_tune.runs.reporter import MemoryReporter

    cfg = make_config("cartpole_muzero", overrides={
        **USER_RUN, "logging.output_dir": str(tmp_path), "exp_name": pipeline,
        "policy.async_pipeline.enabled": pipeline == "async", "policy.async_pipeline.num_collector_actors": 1,
    })  # fmt: skip
    rep = MemoryReporter()
    summary = train(cfg, reporter=rep)
    assert summary.stop_reason == "stop_value" and rep.evals[-1]["reward_mean"] == 1.0
    assert all(r["pipeline"] == pipeline for r in rep.evals)


def test_a_users_module_env_in_a_tune_trial(ray_cluster, tmp_path):
    """The trial's process imports the user's module and builds the env (a sync trial: actors building it
    are the async run above)."""
    from muzero_tune.tune.sweep import run_sweep

    res = run_sweep("quickstart", name="user_env", overrides={
        **USER_RUN, "tune.storage_path": str(tmp_path), "tune.mlflow": False, "stop_value": None,
        "max_envstep": 200,
    }, param_space_extra={"policy.async_pipeline.enabled": False, "seed": 0})  # fmt: skip
    (trial,) = list(res.results)
    assert trial.error is None and trial.config["policy.async_pipeline.enabled"] is False
    assert trial.metrics["eval_index"] >= 1 and "reward_mean" in trial.metrics
    from muzero_tune.runs.checkpoint import find_checkpoint

    ckpt = find_checkpoint(trial.path).checkpoint  # the trial's checkpoint: the user's env and its settings
    assert ckpt["config"]["env.env_id"] == CORRIDOR and ckpt["config"]["env.kwargs"] == USER_RUN["env.kwargs"]


# ---------------------------------------------------------------------------------------------- the docs


def _doc_blocks(lang: str, marker: str) -> str:
    import os
    import re

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "docs", "environments.md")
    text = open(path).read()
    return re.search(rf"<!-- example: {re.escape(marker)} -->\n```{lang}\n(.*?)```", text, re.S).group(1)


def test_the_docs_example_runs_as_written(tmp_path, monkeypatch, capsys):
    """docs/environments.md's module and command, from the folder holding the module (small settings added
    so it takes seconds)."""
    import shlex

    from muzero_tune.cli import main as cli_main

    (tmp_path / "my_envs.py").write_text(_doc_blocks("python", "my_envs.py"))
    command = shlex.split(_doc_blocks("bash", "command"))
    assert command[:2] == ["muzero-tune", "train"]
    monkeypatch.chdir(tmp_path)
    small = ["model.hidden_dim=32", "model.latent_dim=16", "mcts.num_simulations=8", "learn.batch_size=32",
             "env.collector_env_num=4", "env.evaluator_env_num=2", "eval.n_episodes=2", "eval.eval_freq=20",
             "replay.game_segment_length=20", "max_envstep=4000", "logging.mlflow=false"]  # fmt: skip
    args = command[1:] + [a for s in small for a in ("--set", s)]
    assert cli_main(args) == 0
    out = capsys.readouterr().out
    assert "stopped (stop_value)" in out and "reward_mean=1.0" in out


# ---------------------------------------------------------------------------------------------- from Python


def test_an_env_creator_registered_from_python_reaches_actors_and_trials(ray_cluster, tmp_path):
    """``register_env(id, creator)`` with a closure (no importable module): the sync driver, the async
    pipeline's actors and a Tune trial's process all build it (short runs: learning on such an env is the
    module env's goal runs above)."""
    from muzero_tune.api import train
    from muzero_tune.envs import register_env
    from muzero_tune.runs.reporter import MemoryReporter
    from muzero_tune.tune.sweep import run_sweep
    from tests.user_envs import UserCorridor

    steps = 20  # captured by the closure: only a pickled closure carries it to other processes
    register_env("ClosureCorridor-v0", lambda length=4: UserCorridor(length=length, max_steps=steps))
    run = {**USER_RUN, "env.env_id": "ClosureCorridor-v0", "env.kwargs": {"length": 3}, "env.wrappers": [],
           "stop_value": None, "max_envstep": 200}
    for pipeline in ("sync", "async"):
        cfg = make_config("cartpole_muzero", overrides={
            **run, "logging.output_dir": str(tmp_path), "exp_name": pipeline,
            "policy.async_pipeline.enabled": pipeline == "async",
        })  # fmt: skip
        rep = MemoryReporter()
        summary = train(cfg, reporter=rep)
        assert summary.stop_reason == "max_envstep" and summary.train_iter > 0 and rep.evals, pipeline
        assert env_spec("ClosureCorridor-v0", kwargs={"length": 3}).frame_shape == (4,)  # 3 cells, steps
    res = run_sweep("quickstart", name="closure_env", overrides={
        **run, "tune.storage_path": str(tmp_path), "tune.mlflow": False,
    }, param_space_extra={"policy.async_pipeline.enabled": False, "seed": 0})  # fmt: skip
    (trial,) = list(res.results)
    assert trial.error is None and trial.metrics["eval_index"] >= 1


# ---------------------------------------------------------------------------------------------- grids


def test_a_grid_keeps_its_channels_and_resolution_and_the_conv_net_its_size():
    """A non-picture [H, W, C] Box (a test wrapper turns FrozenLake's cell into a 4 x 4 x 2 bool grid) is
    a uint8 [C, H, W] frame at its own size; model.downsample=None keeps small grids at full resolution."""
    spec = env_spec("FrozenLake-v1", kwargs={"is_slippery": False}, wrappers=("tests.user_envs:CellGrid",))
    assert spec.frame_shape == (2, 4, 4) and spec.frame_dtype == "uint8"
    env = make_env("FrozenLake-v1", kwargs={"is_slippery": False}, wrappers=("tests.user_envs:CellGrid",))
    obs, _ = env.reset(seed=0)
    assert obs[0, 0, 0] == 255 and obs[0].sum() == 255 and obs[1].sum() == 255 * 4  # agent at 0; holes
    grid = {"env.env_id": "FrozenLake-v1", "env.wrappers": ["tests.user_envs:CellGrid"]}
    cfg = make_config(None, overrides=grid)
    resolved = with_model_kind(cfg, spec).model
    assert (resolved.kind, resolved.downsample) == ("conv", False)


def test_an_image_in_a_dict_keeps_its_grid_and_the_other_values_become_planes():
    """A Dict of a [4, 4, 2] grid, a Discrete(16) cell and an unbounded clock: the grid's two channels, then
    16 one-hot planes and one clock plane (squashed by x / (1 + |x|) into 0..255), all 4 x 4; the conv net."""
    wrappers = ("tests.user_envs:GridAndClock",)
    spec = env_spec("FrozenLake-v1", kwargs={"is_slippery": False}, wrappers=wrappers)
    assert spec.frame_shape == (2 + 16 + 1, 4, 4) and spec.frame_dtype == "uint8"
    env = make_env("FrozenLake-v1", kwargs={"is_slippery": False}, wrappers=wrappers)
    obs, _ = env.reset(seed=0)
    assert obs[0, 0, 0] == 255 and obs[0].sum() == 255 and obs[1].sum() == 255 * 4  # the grid as before
    assert (obs[2] == 255).all() and obs[3:18].sum() == 0  # cell 0, one-hot, as constant planes
    assert (obs[18] == 128).all()  # clock 0 -> 0 squashed -> the middle of 0..255
    obs, *_ = env.step(2)  # right: cell 1, clock 1
    assert (obs[3] == 255).all() and obs[2].sum() == 0 and (obs[18] == round(0.75 * 255)).all()
    cfg = make_config(None, overrides={"env.env_id": "FrozenLake-v1", "env.wrappers": list(wrappers)})
    assert with_model_kind(cfg, spec).model.kind == "conv"


def test_observation_bounds_declares_a_grids_true_range():
    """MiniGrid-like cells declared 0..255 but holding 0..10: with ObservationBounds {high: 10} they span
    0..255 (10 -> 255, 4 -> 102)."""
    from muzero_tune.envs.spaces import GridFrames
    from muzero_tune.envs.wrappers import ObservationBounds

    class Cells(gym.Env):
        observation_space = gym.spaces.Box(0, 255, shape=(3, 3, 1), dtype=np.uint8)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            return np.array([0, 4, 10] * 3, np.uint8).reshape(3, 3, 1), {}

    raw, _ = GridFrames(Cells()).reset()
    assert raw.max() == 10  # a uint8 grid declared 0..255 is taken as it is
    bounded, _ = GridFrames(ObservationBounds(Cells(), high=10)).reset()
    assert bounded.shape == (1, 3, 3) and sorted(set(bounded.ravel())) == [0, 102, 255]
    with pytest.raises(ValueError, match="low=3, high=1"):
        ObservationBounds(Cells(), low=3, high=1)


@pytest.mark.parametrize(("env_id", "wrappers", "shape", "extra"), [
    ("MinAtar/Breakout-v1", (), (4, 10, 10), "minatar"),
    ("MiniGrid-Empty-5x5-v0", ("minigrid.wrappers:ImgObsWrapper",), (3, 7, 7), "minigrid"),
])  # fmt: skip
def test_known_grid_packages_register_their_ids(env_id, wrappers, shape, extra):
    module = {"minatar": "minatar", "minigrid": "minigrid"}[extra]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"needs the {extra} extra")
    spec = env_spec(env_id, wrappers=wrappers)  # no module:EnvId needed: the package is imported first
    assert spec.frame_shape == shape and spec.frame_dtype == "uint8" and spec.action_kind == "discrete"


# ---------------------------------------------------------------------------------------------- other envs

SMOKE = {
    "mcts.num_simulations": 4, "learn.batch_size": 16, "env.collector_env_num": 2, "env.evaluator_env_num": 2,
    "eval.n_episodes": 2, "eval.eval_freq": 10, "replay.game_segment_length": 20, "max_envstep": 120,
    "stop_value": None, "logging.quiet": True, "model.num_channels": 8, "model.hidden_dim": 32,
    "model.latent_dim": 16, "env.max_episode_steps": 40,
}
OTHER_ENVS = {  # name -> (env id, extra module or None, more overrides)
    "FrozenLake": ("FrozenLake-v1", None, {"env.kwargs": {"is_slippery": False}}),
    "FrozenLake-grid-in-a-dict": ("FrozenLake-v1", None, {
        "env.kwargs": {"is_slippery": False}, "env.wrappers": ["tests.user_envs:GridAndClock"]}),
    "CarRacing": ("CarRacing-v3", "Box2D", {"policy.type": "sampled_muzero", "policy.num_samples": 4}),
    "MinAtar-Breakout": ("MinAtar/Breakout-v1", "minatar", {}),
    "MiniGrid-Empty": ("MiniGrid-Empty-5x5-v0", "minigrid", {"env.wrappers": [
        "minigrid.wrappers:ImgObsWrapper", "muzero_tune.envs.wrappers:ObservationBounds {high: 10}"]}),
}  # fmt: skip


@pytest.mark.parametrize("pipeline", ["sync", "async"])
@pytest.mark.parametrize("name", list(OTHER_ENVS))
def test_envs_written_elsewhere_train_on_both_pipelines(name, pipeline, ray_cluster, tmp_path):
    """Each trains and evaluates through ``train``: pictures (CarRacing, with a sampled type's conv
    Gaussian network), grids (MinAtar, MiniGrid, a grid inside a Dict) and one-hot cells (FrozenLake)."""
    from muzero_tune.api import train
    from muzero_tune.runs.reporter import MemoryReporter

    env_id, module, more = OTHER_ENVS[name]
    if module is not None and importlib.util.find_spec(module) is None:
        pytest.skip(f"needs the package {module} (its extra)")
    cfg = make_config(None, overrides={
        **SMOKE, **more, "env.env_id": env_id, "logging.output_dir": str(tmp_path), "exp_name": pipeline,
        "policy.async_pipeline.enabled": pipeline == "async",
    })  # fmt: skip
    rep = MemoryReporter()
    summary = train(cfg, reporter=rep)
    assert summary.train_iter > 0 and rep.evals and summary.env_steps >= 120
    assert all(np.isfinite(e["reward_mean"]) and e["pipeline"] == pipeline for e in rep.evals)


def test_a_grid_env_in_a_tune_trial(ray_cluster, tmp_path):
    from muzero_tune.tune.sweep import run_sweep

    if importlib.util.find_spec("minatar") is None:
        pytest.skip("needs the minatar extra")
    res = run_sweep("quickstart", name="minatar", overrides={
        **SMOKE, "env.env_id": "MinAtar/Breakout-v1", "model.kind": "auto", "model.downsample": None,
        "tune.storage_path": str(tmp_path), "tune.mlflow": False,
    }, param_space_extra={"policy.async_pipeline.enabled": False, "seed": 0})  # fmt: skip
    (trial,) = list(res.results)
    assert trial.error is None and trial.metrics["eval_index"] >= 1 and trial.metrics["train_iter"] > 0
