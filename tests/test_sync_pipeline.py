"""Integration: a short sync CartPole run, its checkpoints, resume, the CLI, and no Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from muzero_tune.cli import main as cli_main
from muzero_tune.config import make_config
from muzero_tune.pipeline.checkpoint import latest_checkpoint, load_policy
from muzero_tune.pipeline.reporter import MemoryReporter
from muzero_tune.pipeline.sync_driver import train_muzero_segment

SMALL = {
    "model.hidden_dim": 32,
    "model.latent_dim": 16,
    "mcts.num_simulations": 4,
    "learn.batch_size": 32,
    "env.collector_env_num": 4,
    "env.evaluator_env_num": 2,
    "eval.n_episodes": 2,
    "eval.eval_freq": 20,
    "replay.game_segment_length": 20,
    "max_env_step": 400,
    "stop_value": None,
    "logging.quiet": True,
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    cfg = make_config("cartpole_muzero", overrides={**SMALL, "logging.output_dir": str(out), "exp_name": "t"})
    summary = train_muzero_segment(cfg)
    return cfg, summary, os.path.join(str(out), "t")


def test_short_run_completes_trains_and_writes_loadable_checkpoints(run):
    cfg, summary, run_dir = run
    assert summary.stop_reason == "max_env_step" and summary.env_steps >= 400
    assert summary.train_iter > 0 and len(summary.evals) >= 2
    files = sorted(os.listdir(os.path.join(run_dir, "ckpt")))
    assert len(files) == len(summary.evals)
    ckpt = torch.load(os.path.join(run_dir, "ckpt", files[-1]), weights_only=True)
    assert ckpt["evaluated"]["version"] == summary.evals[-1]["train_iter"]
    assert ckpt["resume"]["counters"]["env_steps"] == summary.env_steps
    assert ckpt["resume"]["learner"]["train_iter"] == summary.train_iter
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert [r["eval_index"] for r in rows] == list(range(1, len(summary.evals) + 1))


def test_checkpoint_evaluated_weights_reproduce_reward(run, capsys):
    _, summary, run_dir = run
    path = latest_checkpoint(run_dir)
    cfg, policy, model, ckpt = load_policy(path)
    assert cli_main(["eval", path]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["reward_mean"] == pytest.approx(ckpt["evaluated"]["metrics"]["reward_mean"])
    assert out["version"] == ckpt["evaluated"]["version"]


def test_resume_continues_counters_exactly(run):
    cfg, summary, run_dir = run
    path = latest_checkpoint(run_dir)
    rep = MemoryReporter()
    cfg2 = make_config(
        "cartpole_muzero",
        overrides={
            **SMALL,
            "max_env_step": summary.env_steps + 200,
            "learn.resume_warmup_transitions": 64,
            "logging.output_dir": os.path.dirname(run_dir),
            "exp_name": "t_resumed",
        },
    )
    s2 = train_muzero_segment(cfg2, reporter=rep, resume_from=path)
    first = rep.evals[0]
    assert first["eval_index"] == len(summary.evals) + 1
    assert first["train_iter"] > summary.train_iter and first["envstep"] > summary.env_steps
    assert s2.env_steps >= summary.env_steps + 200


def test_sync_pipeline_never_starts_ray(tmp_path):
    code = (
        "import sys; from muzero_tune.config import make_config;"
        "from muzero_tune.pipeline.sync_driver import train_muzero_segment;"
        f"cfg = make_config('cartpole_muzero', overrides={{**{SMALL!r}, 'max_env_step': 100,"
        f" 'logging.output_dir': {str(tmp_path)!r}}});"
        "train_muzero_segment(cfg); print('ray' in sys.modules)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "False"


def test_cli_train_smoke(tmp_path, capsys):
    args = ["train", "--preset", "cartpole_muzero", "--set", f"logging.output_dir={tmp_path}"]
    for k, v in {**SMALL, "max_env_step": 100}.items():
        args += ["--set", f"{k}={'none' if v is None else v}"]
    assert cli_main(args) == 0
    assert "stopped (max_env_step)" in capsys.readouterr().out
    assert cli_main(["train", "--set", "learn.batch_siz=3"]) == 2


def test_continuous_env_with_a_discrete_policy_fails_clearly(tmp_path):
    from muzero_tune.config import ConfigError

    cfg = make_config("cartpole_muzero", overrides={**SMALL, "env.env_id": "Pendulum-v1",
                                                    "logging.output_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="continuous actions"):
        train_muzero_segment(cfg)
    assert not os.path.exists(os.path.join(str(tmp_path), cfg.exp_name))
