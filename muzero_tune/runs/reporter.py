"""Reporters: how a driver hands its progress and evaluations to its host (a run folder, Tune, memory).

The drivers call ``on_progress`` (often) and ``on_eval`` (every evaluation, with the exact evaluated
snapshot and a callable returning the resume state). Standalone, :class:`StandaloneReporter` prints a
progress line, appends metrics to ``<run>/metrics.jsonl``, writes ``<run>/ckpt/eval_<index>.pt`` and, with
``logging.mlflow``, logs each evaluation to MLflow; under Tune a reporter calls ``tune.report`` instead.
Drivers do not know which host they run in.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Protocol

from muzero_tune.runs.checkpoint import FORMAT, save_checkpoint

# progress and evaluation lines: INFO records of the "muzero_tune" logger (the CLI prints them to stdout; a
# program that embeds the library shows them with its own logging configuration)
log = logging.getLogger("muzero_tune")


class Reporter(Protocol):
    def on_progress(self, metrics: dict) -> None: ...

    def on_eval(self, metrics: dict, evaluated: dict, resume_state: Callable[[], dict]) -> None:
        """``evaluated`` = {"weights", "version", "metrics"}: exactly what the evaluator used."""

    def close(self) -> None: ...


def format_progress(m: dict) -> str:
    parts = [
        f"envstep={m.get('envstep', 0):>8d}",
        f"envstep/s={m.get('envstep_per_s', 0.0):7.1f}",
        f"train_iter={m.get('train_iter', 0):>7d}",
        f"buffer={m.get('buffer/transitions', 0):>7d}",
    ]
    ret = m.get("collect/episode_return_mean")
    if ret is not None and ret == ret:  # NaN until a training episode ends
        parts.append(f"episode_return_mean={ret:.1f}")
        parts.append(f"episodes={m.get('collect/episodes', 0)}")
    if m.get("reward_mean") is not None:
        parts.append(f"reward_mean={m['reward_mean']:.1f}")
    for kind in ("collectors", "evaluators"):  # an async pool running short of actors says so
        up, total = m.get(f"pipeline/{kind}_up"), m.get(f"pipeline/{kind}_total")
        if up is not None and total is not None and up < total:
            parts.append(f"{kind}_up={up}/{total}")
    return "[muzero-tune] " + " ".join(parts)


def json_row(metrics: dict) -> str:
    """One metrics.jsonl line: the scalar metrics, NaN written as null (strict JSON)."""
    row = {
        k: (None if isinstance(v, float) and v != v else v)
        for k, v in metrics.items()
        if isinstance(v, (int, float, str))
    }
    return json.dumps(row)


class StandaloneReporter:
    """Writes ``<run_dir>/{run.json, config.json, metrics.jsonl, ckpt/eval_NNNNNN.pt}`` and prints progress.

    It claims ``run_dir`` first (:mod:`muzero_tune.runs.run_folder`): a new run (``resume_eval_index``
    None) refuses a folder that holds another run unless ``overwrite``; a resumed run continues its folder
    from evaluation ``resume_eval_index``. With ``mlflow_uri`` every evaluation is also logged to that MLflow
    store (one run per run folder, metric step = env steps).
    """

    def __init__(
        self,
        run_dir: str,
        *,
        flat_config: dict,
        progress_interval_s: float = 5.0,
        quiet: bool = False,
        resume_eval_index: int | None = None,
        overwrite: bool = False,
        mlflow_uri: str | None = None,
        mlflow_experiment: str = "standalone",
    ):
        from muzero_tune.runs import run_folder

        self.run_dir = run_dir
        self.ckpt_dir = os.path.join(run_dir, "ckpt")
        if resume_eval_index is None:
            self.run_info, self.notes = run_folder.claim_new(run_dir, overwrite=overwrite)
        else:
            self.run_info, self.notes = run_folder.claim_resume(
                run_dir, resume_eval_index, overwrite=overwrite
            )
        self.flat_config = flat_config
        self.progress_interval_s = progress_interval_s
        self.quiet = quiet
        self._last_print = 0.0
        self._last_reward: float | None = None
        with open(os.path.join(run_dir, "config.json"), "w") as f:
            json.dump(flat_config, f, indent=1)
        self.mlflow_run = None
        if mlflow_uri is not None:
            self.mlflow_run = _standalone_mlflow_run(
                mlflow_uri, mlflow_experiment, run_dir, self.run_info["run_id"], flat_config
            )
            self.run_info = run_folder.update_run_info(run_dir, mlflow_run_id=self.mlflow_run.run_id)
        self._metrics = open(os.path.join(run_dir, "metrics.jsonl"), "a")
        self.checkpoints: list[str] = []

    def _print(self, m: dict) -> None:
        if not self.quiet:
            log.info(format_progress({**m, "reward_mean": self._last_reward}))

    def on_progress(self, metrics: dict) -> None:
        now = time.monotonic()
        if now - self._last_print >= self.progress_interval_s:
            self._last_print = now
            self._print(metrics)

    def on_eval(self, metrics: dict, evaluated: dict, resume_state: Callable[[], dict]) -> None:
        self._last_reward = metrics.get("reward_mean")
        self._metrics.write(json_row(metrics) + "\n")
        self._metrics.flush()
        path = os.path.join(self.ckpt_dir, f"eval_{int(metrics['eval_index']):06d}.pt")
        save_checkpoint(
            path,
            {"format": FORMAT, "config": self.flat_config, "evaluated": evaluated, "resume": resume_state()},
        )
        self.checkpoints.append(path)
        if self.mlflow_run is not None:
            self.mlflow_run.log_metrics(metrics, step=int(metrics["envstep"]))
        self._print(metrics)

    def on_videos(self, videos: tuple[tuple[str, bytes], ...], metrics: dict) -> None:
        """An evaluation's videos: into ``<run_dir>/videos/`` and the MLflow run's ``videos/``."""
        from muzero_tune.runs.videos import log_videos, write_videos

        paths = write_videos(os.path.join(self.run_dir, "videos"), videos)
        if self.mlflow_run is not None:
            log_videos(self.mlflow_run, paths)

    def close(self) -> None:
        self._metrics.close()
        if self.mlflow_run is not None:
            # close() runs in the drivers' ``finally``: an exception in flight means the run failed
            self.mlflow_run.finish("FAILED" if sys.exc_info()[0] is not None else "FINISHED")
            self.mlflow_run = None


def _standalone_mlflow_run(uri: str, experiment: str, run_dir: str, run_id: str, flat_config: dict):
    from muzero_tune.runs.mlflow_log import KIND_TAG, RUN_TAG, TrialRun, run_name, run_tags

    artifact_root = os.path.join(os.path.dirname(os.path.abspath(run_dir)), "mlartifacts")
    folder = os.path.basename(os.path.abspath(run_dir))
    return TrialRun(
        tracking_uri=uri,
        experiment_name=experiment,
        artifact_root=artifact_root,
        trial_id=run_id,
        run_name=run_name(flat_config, folder),  # e.g. sync-s1-tiny: pipeline, lag knobs, seed, folder
        params=flat_config,
        tags=run_tags(flat_config, run_dir=os.path.abspath(run_dir), **{KIND_TAG: "standalone"}),
        key_tag=RUN_TAG,
        description=f"Standalone run `{folder}` (`muzero-tune train`) in `{os.path.abspath(run_dir)}`",
    )


class MemoryReporter:
    """Keeps everything in memory (tests, benchmarks): progress rows, eval rows and evaluated snapshots."""

    def __init__(self, *, keep_resume: bool = False):
        self.progress: list[dict] = []
        self.evals: list[dict] = []
        self.snapshots: list[dict] = []
        self.resume_states: list[dict] = []
        self.keep_resume = keep_resume

    def on_progress(self, metrics: dict) -> None:
        self.progress.append(dict(metrics))

    def on_eval(self, metrics: dict, evaluated: dict, resume_state: Callable[[], dict]) -> None:
        self.evals.append(dict(metrics))
        self.snapshots.append(evaluated)
        if self.keep_resume:
            self.resume_states.append(resume_state())

    def close(self) -> None:
        pass


def run_dir(cfg) -> str:
    """The run folder of a config: ``<logging.output_dir>/<exp_name>``."""
    return os.path.join(cfg.logging.output_dir, cfg.exp_name)


def default_reporter(
    cfg,
    *,
    resume_from: str | dict | None = None,
    resume_eval_index: int | None = None,
    overwrite: bool = False,
    folder: str | None = None,
    log_notes: bool = True,
) -> StandaloneReporter:
    """The standalone reporter of ``cfg``'s run folder (``folder``, default ``<output_dir>/<exp_name>``).

    A new run refuses a folder holding another run unless ``overwrite``. Resuming from a checkpoint path
    inside that folder (or giving ``resume_eval_index``) continues the folder's run from that evaluation;
    any other resume source starts a new run in the folder. ``log_notes``: log what claiming the folder did
    (a replaced run, set-aside checkpoints) as warnings; the command line prints them itself.
    """
    from muzero_tune.config import to_flat_dict
    from muzero_tune.runs.checkpoint import find_checkpoint
    from muzero_tune.runs.mlflow_log import default_tracking_uri, make_store_folder_writable
    from muzero_tune.runs.run_folder import make_writable_folder

    folder = folder or run_dir(cfg)
    make_writable_folder("logging.output_dir", os.path.dirname(folder) or ".")
    if resume_eval_index is None and isinstance(resume_from, str):
        found = find_checkpoint(resume_from)
        if found.run_dir is not None and os.path.realpath(found.run_dir) == os.path.realpath(folder):
            resume_eval_index = found.eval_index
    mlflow_uri = None
    if cfg.logging.mlflow:
        mlflow_uri = cfg.logging.mlflow_tracking_uri or default_tracking_uri(cfg.logging.output_dir)
        key = "logging.mlflow_tracking_uri" if cfg.logging.mlflow_tracking_uri else "logging.output_dir"
        make_store_folder_writable(key, mlflow_uri)
    reporter = StandaloneReporter(
        folder,
        flat_config=to_flat_dict(cfg),
        progress_interval_s=cfg.logging.progress_interval_s,
        quiet=cfg.logging.quiet,
        resume_eval_index=resume_eval_index,
        overwrite=overwrite,
        mlflow_uri=mlflow_uri,
        mlflow_experiment=cfg.logging.mlflow_experiment,
    )
    for note in reporter.notes if log_notes else ():
        log.warning(note)
    return reporter
