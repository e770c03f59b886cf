"""CartPole with its velocities hidden (``muzero_tune/CartPoleNoVel-v1``): the env against gymnasium's
CartPole-v1 step by step, its registration in a fresh process, its presets, and a short sync run."""

from __future__ import annotations

import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from muzero_tune.config import PRESETS, make_config, to_flat_dict
from muzero_tune.envs.cartpole_novel import CARTPOLE_NOVEL_ID
from muzero_tune.envs.factory import env_family, env_spec, make_env, validate_env_id
from muzero_tune.pipeline.sync_driver import train_muzero_segment
from muzero_tune.runs.checkpoint import latest_checkpoint, load_policy

PRESET_TYPES = ("muzero_rnn_full_obs", "muzero_context", "unizero", "muzero")
SMALL = {
    "model.hidden_dim": 32, "model.latent_dim": 16, "mcts.num_simulations": 4, "learn.batch_size": 32,
    "env.collector_env_num": 4, "env.evaluator_env_num": 2, "eval.n_episodes": 2, "eval.eval_freq": 20,
    "replay.game_segment_length": 20, "max_envstep": 400, "stop_value": None, "logging.quiet": True,
    "policy.rnn_hidden_size": 8,
}


def _balance(full_obs: np.ndarray) -> int:
    """A linear controller on CartPole's full state: keeps the pole up for the whole 500 steps."""
    x, x_dot, theta, theta_dot = full_obs
    return int(theta + 0.5 * theta_dot + 0.05 * x + 0.1 * x_dot > 0)


# ---------------------------------------------------------------------------------------------- env


def test_space_is_cartpoles_position_and_angle_bounds():
    validate_env_id(CARTPOLE_NOVEL_ID)
    assert env_family(CARTPOLE_NOVEL_ID) == "gymnasium"
    env, full = make_env(CARTPOLE_NOVEL_ID), gym.make("CartPole-v1")
    space = env.observation_space
    assert isinstance(space, gym.spaces.Box) and space.shape == (2,) and space.dtype == np.float32
    np.testing.assert_array_equal(space.low, full.observation_space.low[[0, 2]])
    np.testing.assert_array_equal(space.high, full.observation_space.high[[0, 2]])
    assert env.action_space == full.action_space == gym.spaces.Discrete(2)
    assert env.spec.max_episode_steps == 500 and env.spec.reward_threshold == 195.0
    spec = env_spec(CARTPOLE_NOVEL_ID)
    assert (spec.frame_shape, spec.frame_dtype, spec.num_actions) == ((2,), "float32", 2)


@pytest.mark.parametrize("seed", [0, 7])
def test_observations_are_cartpoles_position_and_angle_step_by_step(seed):
    """Same seed, same actions: obs == CartPole's obs[[0, 2]], same rewards and episode ends, over a
    balanced episode cut by the 500-step limit and then random-action episodes that fall."""
    env = make_env(CARTPOLE_NOVEL_ID, seed=seed)
    full = gym.make("CartPole-v1")
    obs, _ = env.reset()
    full_obs, _ = full.reset(seed=seed)
    rng = np.random.default_rng(seed)
    ends: list[tuple[int, bool, bool]] = []
    step = 0
    while len(ends) < 4:
        assert obs.dtype == np.float32 and obs.shape == (2,)
        np.testing.assert_array_equal(obs, full_obs[[0, 2]])
        action = _balance(full_obs) if not ends else int(rng.integers(2))
        obs, reward, terminated, truncated, _ = env.step(action)
        full_obs, full_reward, full_terminated, full_truncated, _ = full.step(action)
        assert (reward, terminated, truncated) == (full_reward, full_terminated, full_truncated)
        assert reward == 1.0
        step += 1
        if terminated or truncated:
            np.testing.assert_array_equal(obs, full_obs[[0, 2]])
            ends.append((step, bool(terminated), bool(truncated)))
            obs, _ = env.reset()
            full_obs, _ = full.reset()
            step = 0
    assert ends[0] == (500, False, True)  # the time limit, as CartPole-v1's
    assert all(terminated and not truncated and step < 500 for step, terminated, truncated in ends[1:])


def test_registered_on_import_in_a_fresh_process():
    code = (
        "import gymnasium as gym, muzero_tune.envs; "
        f"print({CARTPOLE_NOVEL_ID!r} in gym.registry, muzero_tune.envs.env_family({CARTPOLE_NOVEL_ID!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "gymnasium"]


# ---------------------------------------------------------------------------------------------- presets


@pytest.mark.parametrize("ptype", PRESET_TYPES)
def test_presets_resolve_and_are_the_cartpole_preset_on_the_new_env(ptype):
    name = f"cartpole_novel_{ptype}"
    assert name in PRESETS
    cfg = make_config(name)
    assert cfg.exp_name == name and cfg.policy.type == ptype
    assert (cfg.env.env_id, cfg.env.frame_stack, cfg.max_envstep, cfg.stop_value) == (
        CARTPOLE_NOVEL_ID, 1, 50_000, 195.0)
    ours, base = to_flat_dict(cfg), to_flat_dict(make_config(f"cartpole_{ptype}"))
    changed = {k for k in ours if ours[k] != base[k]}
    assert changed <= {"exp_name", "env.env_id", "env.frame_stack", "max_envstep", "stop_value"}


# ---------------------------------------------------------------------------------------------- pipeline


def test_short_sync_run_of_the_recurrent_preset(tmp_path):
    cfg = make_config("cartpole_novel_muzero_rnn_full_obs",
                      overrides={**SMALL, "logging.output_dir": str(tmp_path), "exp_name": "s"})
    assert cfg.env.env_id == CARTPOLE_NOVEL_ID
    summary = train_muzero_segment(cfg)
    assert summary.stop_reason == "max_envstep" and summary.env_steps >= 400
    assert summary.train_iter > 0 and summary.evals
    assert all(np.isfinite(e["reward_mean"]) for e in summary.evals)
    path = latest_checkpoint(os.path.join(str(tmp_path), "s"))
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["config"]["env.env_id"] == CARTPOLE_NOVEL_ID
    assert ckpt["evaluated"]["version"] == summary.evals[-1]["train_iter"]
    _, policy, _, _ = load_policy(path)
    assert policy.spec.frame_shape == (2,) and policy.spec.obs_shape == (2,)
