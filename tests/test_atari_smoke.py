"""Atari Pong smoke runs through the spec-style scripts (MuZero and UniZero), sync and async (sync is in the
default tests, async is slow), and their one-line errors.

Each script file runs whole in this process as its interpreter would run it (``runpy`` as ``__main__``, its
folder first on ``sys.path``, ``sys.argv`` its command line; its exit status from ``sys.exit``): a process of
its own would add only its start-up, importing torch and ALE again. (``tests/test_script_imports.py`` resolves
every script's imports.)"""

from __future__ import annotations

import glob
import os
import runpy
import sys
import warnings

import numpy as np
import pytest
import torch
from conftest import ACTOR_CPUS, set_args

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")
SCRIPT = os.path.join(SCRIPTS, "atari_muzero_segment_async_config.py")
UNIZERO_SCRIPT = os.path.join(SCRIPTS, "atari_unizero_segment_async_config.py")


# the smoke run shortened: 200 env steps, training from the 100th (the preset: 800, from the 200th), its one
# evaluation stopped at 50 steps (the preset's 200 were most of the run; a Pong episode is longer than both)
SHORT = ["--set", "max_envstep=200", "--set", "learn.train_start_after_envsteps=100",
         "--set", "eval.max_episode_steps=50"]  # fmt: skip
# a quarter of a CPU per actor: the async run fits the tests' Ray (conftest's RAY_TEST_CPUS)
ACTOR_ARGS = set_args(ACTOR_CPUS)


def run_script(args: list[str], capsys, monkeypatch) -> tuple[int, str, str]:
    """``python SCRIPT ARGS...`` (``args[0]`` the script) in this process: (exit status, stdout, stderr, with
    every warning raised meanwhile in it as the interpreter would print it)."""
    monkeypatch.setattr(sys, "argv", list(args))
    monkeypatch.syspath_prepend(os.path.dirname(args[0]))
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for hidden in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", hidden)  # the interpreter's default filters hide these
        try:
            runpy.run_path(args[0], run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out, err = capsys.readouterr()
    err += "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line)
                   for w in caught)  # fmt: skip
    return code, out, err


# async is slow (about 40 s here): the async driver, its actors and their checkpoints run end to end in the
# default tests on CartPole (test_async_pipeline.py) and the conv net, frames and checkpoint here in sync
@pytest.mark.parametrize("pipeline", ["sync", pytest.param("async", marks=pytest.mark.slow)])
def test_pong_smoke_run_writes_loadable_checkpoints(pipeline, tmp_path, capsys, monkeypatch, request):
    """The spec's MuZero command line on its Pong smoke preset: it stops at max_envstep, and its newest
    checkpoint loads to the preset's channels-last conv network, which acts.

    Default-tier twin: tests/test_atari_smoke.py::test_pong_smoke_run_writes_loadable_checkpoints[sync] (the
    conv net, frames and checkpoint) and
    tests/test_async_pipeline.py::test_run_completes_trains_evaluates_and_writes_evaluated_snapshot (the async
    driver, its actors and their checkpoints end to end, on CartPole).
    """
    if pipeline == "async":
        request.getfixturevalue("ray_cluster")
    args = [SCRIPT, "--env", "ALE/Pong-v5", "--seed", "0", "--smoke",
            "--set", f"logging.output_dir={tmp_path}", *SHORT]
    if pipeline == "async":
        args += ["--async-pipeline", *ACTOR_ARGS]
    code, out, err = run_script(args, capsys, monkeypatch)
    assert code == 0, out[-3000:] + err[-3000:]
    assert f"ALE/Pong-v5 {pipeline}: stopped (max_envstep)" in out
    ckpts = sorted(glob.glob(os.path.join(str(tmp_path), "*", "ckpt", "eval_*.pt")))
    assert ckpts, out[-2000:]
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
def test_unizero_pong_smoke_run_and_its_one_line_errors(pipeline, tmp_path, capsys, monkeypatch, request):
    """The spec's UniZero command line on its smoke preset; the same command again is refused in one line
    (the run folder holds a run), and so is a misspelt setting.

    Default-tier twin: tests/test_atari_smoke.py::test_unizero_pong_smoke_run_and_its_one_line_errors[sync]
    (the script, its preset and its errors) and
    tests/test_every_policy_type.py::test_tune_trial_checkpoints_reevaluate_to_the_reported_reward[async-unizero]
    (UniZero on the async pipeline).
    """
    if pipeline == "async":
        request.getfixturevalue("ray_cluster")
    args = [UNIZERO_SCRIPT, "--env", "ALE/Pong-v5", "--seed", "0", "--smoke",
            "--set", f"logging.output_dir={tmp_path}", *SHORT]
    if pipeline == "async":
        args += ["--async-pipeline", *ACTOR_ARGS]
    code, out, err = run_script(args, capsys, monkeypatch)
    assert code == 0, out[-3000:] + err[-3000:]
    assert f"ALE/Pong-v5 {pipeline}: stopped (max_envstep)" in out
    (ckpt,) = glob.glob(os.path.join(str(tmp_path), "*unizero*", "ckpt", "eval_*.pt"))[-1:]
    assert torch.load(ckpt, weights_only=True)["config"]["policy.type"] == "unizero"
    for extra, expected in ((["--set", "learn.batch_siz=3"], "did you mean 'learn.batch_size'"),
                            ([], "already holds a run")):  # fmt: skip
        code, _, err = run_script(args + extra, capsys, monkeypatch)
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and expected in lines[0], err[-2000:]
        assert lines[0].startswith("atari_unizero_segment_async_config.py: error: ")
