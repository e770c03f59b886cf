"""Settings files, run folders and checkpoints written under a setting's former name still load: each
renamed key (``config.RENAMED_KEYS``) is read as its new name, with a ConfigWarning naming both.

``tests/data/run_before_renames/`` is a run folder written while the env-step budget was ``max_env_step``
(config.json, metrics.jsonl and its last checkpoint, a tiny CartPole MuZero run of 304 env steps);
``tests/data/settings_before_renames.yaml`` a settings file of that time.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from muzero_tune.api import evaluate
from muzero_tune.cli import main as cli_main
from muzero_tune.config import RENAMED_KEYS, ConfigWarning, apply_overrides, leaf_keys, make_config
from muzero_tune.runs.checkpoint import load_policy

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
OLD_RUN = os.path.join(DATA, "run_before_renames")
OLD_YAML = os.path.join(DATA, "settings_before_renames.yaml")
RENAMED = "config key 'max_env_step' is now 'max_envstep'"


def test_every_former_name_points_at_a_current_setting():
    keys = set(leaf_keys())
    for old, new in RENAMED_KEYS.items():
        assert new in keys and old not in keys


def test_a_former_name_in_yaml_and_in_overrides_sets_the_new_setting_with_a_warning():
    with pytest.warns(ConfigWarning, match=RENAMED):
        cfg = make_config("cartpole_muzero", yaml_path=OLD_YAML)
    assert cfg.max_envstep == 1234 and cfg.learn.batch_size == 32
    with pytest.warns(ConfigWarning, match=RENAMED):
        assert apply_overrides(cfg, {"max_env_step": "77"}).max_envstep == 77


def test_a_former_name_on_the_command_line(capsys):
    with pytest.warns(ConfigWarning, match=RENAMED):
        assert cli_main(["train", "--set", "max_env_step=555", "--print-config"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["max_envstep"] == 555 and "max_env_step" not in printed


def test_an_old_checkpoint_loads_and_evaluates_to_the_return_it_reported():
    with pytest.warns(ConfigWarning, match=RENAMED):
        cfg, policy, model, ckpt = load_policy(OLD_RUN)
    assert cfg.max_envstep == 300 and ckpt["config"]["max_env_step"] == 300
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, ckpt["evaluated"]["weights"][name])
    with pytest.warns(ConfigWarning, match=RENAMED):
        ev = evaluate(OLD_RUN)
    assert ev.version == 74 and len(ev.episode_returns) == 2
    assert ev.reward_mean == pytest.approx(ev.reported_reward_mean)


def test_an_old_run_folder_resumes_where_it_stopped(tmp_path, capsys):
    run = str(tmp_path / "run_before_renames")
    shutil.copytree(OLD_RUN, run)
    with pytest.warns(ConfigWarning, match=RENAMED):
        # (resumed without its buffer, training waits for resume_warmup_transitions fresh transitions)
        assert cli_main(["train", "--resume", run, "--set", "max_envstep=400",
                         "--set", "learn.resume_warmup_transitions=32"]) == 0
    assert "stopped (max_envstep): envstep=" in capsys.readouterr().out
    with open(os.path.join(run, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    evals = [r for r in rows if "reward_mean" in r]
    assert [r["eval_index"] for r in evals] == list(range(1, len(evals) + 1)) and len(evals) > 7
    assert evals[7]["envstep"] > 304 and evals[-1]["envstep"] >= 400  # counters continued, not restarted
    with open(os.path.join(run, "config.json")) as f:
        assert json.load(f)["max_envstep"] == 400
