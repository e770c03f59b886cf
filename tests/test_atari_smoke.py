"""Atari Pong smoke runs through the spec-style script, sync and async (about 25 s for both on 2 cores, so
they are in the default tests)."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest
import torch

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "atari_muzero_segment_async_config.py")


@pytest.mark.parametrize("pipeline", ["sync", "async"])
def test_pong_smoke_run_writes_loadable_checkpoints(pipeline, tmp_path):
    args = [sys.executable, SCRIPT, "--env", "ALE/Pong-v5", "--seed", "0", "--smoke",
            "--set", f"logging.output_dir={tmp_path}", "--set", "max_env_step=400"]
    if pipeline == "async":
        args.append("--async-pipeline")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    res = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"ALE/Pong-v5 {pipeline}: stopped (max_env_step)" in res.stdout
    ckpts = sorted(glob.glob(os.path.join(str(tmp_path), "*", "ckpt", "eval_*.pt")))
    assert ckpts, res.stdout[-2000:]
    ckpt = torch.load(ckpts[-1], weights_only=True)
    assert ckpt["config"]["env.env_id"] == "ALE/Pong-v5" and ckpt["config"]["env.frame_stack"] == 4
    assert ckpt["resume"]["learner"]["train_iter"] > 0
