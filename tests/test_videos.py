"""Evaluation videos: ``eval.video_every`` during training (sync and async), ``muzero-tune eval --video``,
both into files and the run's MLflow run; an env that cannot render is one line before any work."""

from __future__ import annotations

import glob
import json
import os

import pytest
from conftest import ACTOR_CPUS

from muzero_tune.cli import main as cli_main
from muzero_tune.config import make_config

pytest.importorskip("moviepy", reason="videos need the video extra (moviepy)")

# a quarter of a CPU per actor: the async run fits the tests' Ray (conftest's RAY_TEST_CPUS)

TINY = {
    "model.hidden_dim": 32, "model.latent_dim": 16, "mcts.num_simulations": 4, "learn.batch_size": 32,
    "env.collector_env_num": 4, "env.evaluator_env_num": 2, "eval.n_episodes": 2, "eval.eval_freq": 10,
    "replay.game_segment_length": 20, "max_envstep": 300, "stop_value": None, "logging.quiet": True,
}


def _mp4s(folder: str) -> list[str]:
    return sorted(glob.glob(os.path.join(folder, "*.mp4")))


def _is_mp4(path: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(12)
    return head[4:8] == b"ftyp" and os.path.getsize(path) > 1000


@pytest.mark.parametrize("pipeline", ["sync", "async"])
def test_every_second_evaluation_records_its_first_episode(pipeline, tmp_path, request):
    if pipeline == "async":
        request.getfixturevalue("ray_cluster")  # the sync run starts no Ray
    from mlflow.tracking import MlflowClient

    from muzero_tune.api import train
    from muzero_tune.runs.mlflow_log import default_tracking_uri
    from muzero_tune.runs.reporter import default_reporter

    cfg = make_config("cartpole_muzero", overrides={
        **TINY, "eval.video_every": 2, "logging.output_dir": str(tmp_path), "exp_name": pipeline,
        "logging.mlflow": True, "policy.async_pipeline.enabled": pipeline == "async", **ACTOR_CPUS,
    })  # fmt: skip
    summary = train(cfg, reporter=default_reporter(cfg))
    n_evals = len(summary.evals)
    run_dir = os.path.join(str(tmp_path), pipeline)
    videos = _mp4s(os.path.join(run_dir, "videos"))
    assert n_evals >= 2 and len(videos) == n_evals // 2 and all(_is_mp4(v) for v in videos)
    assert os.path.basename(videos[0]).startswith("eval_000002_v")  # the second evaluation's
    with open(os.path.join(run_dir, "run.json")) as f:
        run_id = json.load(f)["mlflow_run_id"]
    logged = MlflowClient(default_tracking_uri(str(tmp_path))).list_artifacts(run_id, "videos")
    assert sorted(os.path.basename(a.path) for a in logged) == [os.path.basename(v) for v in videos]


def test_eval_video_writes_the_episodes_and_reproduces_the_reward(tmp_path, capsys):
    from muzero_tune.api import train
    from muzero_tune.runs.reporter import default_reporter

    cfg = make_config("cartpole_muzero", overrides={**TINY, "logging.output_dir": str(tmp_path),
                                                    "exp_name": "r", "max_envstep": 100})  # fmt: skip
    train(cfg, reporter=default_reporter(cfg))
    capsys.readouterr()
    out_dir = str(tmp_path / "vids")
    run = os.path.join(str(tmp_path), "r")
    assert cli_main(["eval", run, "--video", out_dir, "--video-episodes", "2"]) == 0
    captured = capsys.readouterr()
    row = json.loads(captured.out.strip().splitlines()[-1])
    assert row["reward_mean"] == pytest.approx(row["reported_reward_mean"])  # recording changes nothing
    videos = _mp4s(out_dir)
    assert len(videos) == 2 and all(_is_mp4(v) for v in videos)
    assert all(f"video: {v}" in captured.err for v in videos)


def test_an_env_that_cannot_render_is_one_line(tmp_path, capsys):
    cfg = {**TINY, "env.env_id": "tests.user_envs:UserCorridor-v0", "eval.video_every": 1,
           "logging.output_dir": str(tmp_path)}  # fmt: skip
    args = ["train"] + [a for k, v in cfg.items() for a in ("--set", f"{k}={'none' if v is None else v}")]
    assert cli_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot render rgb_array frames for a video" in err[0]
    assert not os.listdir(str(tmp_path))  # nothing written
