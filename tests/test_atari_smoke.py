"""Atari Pong smoke runs through the spec-style scripts (MuZero and UniZero), sync and async (about 30 and
40 s each on 2 loaded cores: sync is in the default tests, async is slow), and their one-line errors."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "scripts")
SCRIPT = os.path.join(SCRIPTS, "atari_muzero_segment_async_config.py")
UNIZERO_SCRIPT = os.path.join(SCRIPTS, "atari_unizero_segment_async_config.py")
ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


# async is slow (about 40 s here): the async driver, its actors and their checkpoints run end to end in the
# default tests on CartPole (test_async_pipeline.py) and the conv net, frames and checkpoint here in sync
@pytest.mark.parametrize("pipeline", ["sync", pytest.param("async", marks=pytest.mark.slow)])
def test_pong_smoke_run_writes_loadable_checkpoints(pipeline, tmp_path):
    args = [sys.executable, SCRIPT, "--env", "ALE/Pong-v5", "--seed", "0", "--smoke",
            "--set", f"logging.output_dir={tmp_path}", "--set", "max_envstep=400"]
    if pipeline == "async":
        args.append("--async-pipeline")
    res = subprocess.run(args, capture_output=True, text=True, timeout=900, env=ENV)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"ALE/Pong-v5 {pipeline}: stopped (max_envstep)" in res.stdout
    ckpts = sorted(glob.glob(os.path.join(str(tmp_path), "*", "ckpt", "eval_*.pt")))
    assert ckpts, res.stdout[-2000:]
    ckpt = torch.load(ckpts[-1], weights_only=True)
    assert ckpt["config"]["env.env_id"] == "ALE/Pong-v5" and ckpt["config"]["env.frame_stack"] == 4
    assert ckpt["resume"]["learner"]["train_iter"] > 0
    # the preset's channels-last conv network, placed so again when the checkpoint is loaded to act
    from muzero_tune.runs.checkpoint import load_policy

    cfg, policy, model, _ = load_policy(ckpts[-1])
    assert cfg.model.channels_last
    convs = [m.weight for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(w.is_contiguous(memory_format=torch.channels_last) for w in convs)
    obs = torch.zeros((2, *policy.spec.obs_shape), dtype=torch.uint8).numpy()
    out = policy.act(model, obs, torch.ones((2, policy.spec.num_actions), dtype=torch.bool).numpy(),
                     explore=False, temperature=1.0, rng=np.random.default_rng(0))  # fmt: skip
    assert out.actions.shape == (2,)


@pytest.mark.parametrize("pipeline", ["sync", pytest.param("async", marks=pytest.mark.slow)])
def test_unizero_pong_smoke_run_and_its_one_line_errors(pipeline, tmp_path):
    """The spec's UniZero command line on its smoke preset; the same command again is refused in one line
    (the run folder holds a run), and so is a misspelt setting."""
    args = [sys.executable, UNIZERO_SCRIPT, "--env", "ALE/Pong-v5", "--seed", "0", "--smoke",
            "--set", f"logging.output_dir={tmp_path}", "--set", "max_envstep=400"]  # fmt: skip
    if pipeline == "async":
        args.append("--async-pipeline")
    res = subprocess.run(args, capture_output=True, text=True, timeout=900, env=ENV)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"ALE/Pong-v5 {pipeline}: stopped (max_envstep)" in res.stdout
    (ckpt,) = glob.glob(os.path.join(str(tmp_path), "*unizero*", "ckpt", "eval_*.pt"))[-1:]
    assert torch.load(ckpt, weights_only=True)["config"]["policy.type"] == "unizero"
    for extra, expected in ((["--set", "learn.batch_siz=3"], "did you mean 'learn.batch_size'"),
                            ([], "already holds a run")):  # fmt: skip
        res = subprocess.run(args + extra, capture_output=True, text=True, timeout=300, env=ENV)
        lines = [line for line in res.stderr.splitlines() if line.strip()]
        assert res.returncode == 2 and len(lines) == 1 and expected in lines[0], res.stderr[-2000:]
        assert lines[0].startswith("atari_unizero_segment_async_config.py: error: ")
