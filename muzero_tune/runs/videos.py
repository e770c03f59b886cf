"""Where evaluation videos go: files in a folder, and artifacts of the run's MLflow run.

What this module owns
    :func:`write_videos` (``(name, mp4 bytes)`` pairs from ``EvalResult.videos`` -> files) and
    :func:`log_videos_to_run` (a standalone run folder's MLflow run, found from its ``run.json``, gets them
    under ``videos/``). Recording itself is :mod:`muzero_tune.envs.video`'s.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

VIDEO_ARTIFACT_DIR = "videos"


def write_videos(folder: str, videos: Iterable[tuple[str, bytes]]) -> tuple[str, ...]:
    """Write each ``(file name, mp4 bytes)`` into ``folder`` (created); returns the paths."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for name, data in videos:
        path = os.path.join(folder, os.path.basename(name))
        with open(path, "wb") as f:
            f.write(data)
        paths.append(path)
    return tuple(paths)


def log_videos(mlflow_run, paths: Iterable[str]) -> None:
    """Log the files as artifacts of an open MLflow run (a ``TrialRun``), under ``videos/``."""
    for path in paths:
        mlflow_run.client.log_artifact(mlflow_run.run_id, path, VIDEO_ARTIFACT_DIR)


def log_videos_to_run(run_dir: str | None, cfg, paths: tuple[str, ...]) -> None:
    """Log the files to the MLflow run of the standalone run folder ``run_dir`` (its ``run.json`` names it),
    when it has one; nothing otherwise."""
    if run_dir is None or not paths:
        return
    try:
        with open(os.path.join(run_dir, "run.json")) as f:
            run_id = json.load(f).get("mlflow_run_id")
    except OSError:
        return
    if not run_id:
        return
    from mlflow.tracking import MlflowClient

    from muzero_tune.runs.mlflow_log import default_tracking_uri

    uri = cfg.logging.mlflow_tracking_uri or default_tracking_uri(os.path.dirname(os.path.abspath(run_dir)))
    client = MlflowClient(uri)
    for path in paths:
        client.log_artifact(run_id, path, VIDEO_ARTIFACT_DIR)
