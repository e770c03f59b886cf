"""The Ray Tune function trainable: the sync or async driver, reporting through Tune.

``make_trainable(cfg)`` returns the function wrapped in ``tune.with_resources`` with a
``PlacementGroupFactory`` (bundle 0: driver + learner; one bundle per collector and evaluator actor for an
async trial). Each trial applies its ``param_space`` values to ``cfg`` by dotted path (the same
``apply_overrides`` as the CLI), resumes from ``tune.get_checkpoint()`` when there is one, and runs the
same driver code as a standalone run with a :class:`TuneReporter`: every evaluation calls
``tune.report`` with the metrics and a checkpoint holding the exact evaluated snapshot plus the full resume
state, and logs the metrics to the trial's MLflow run. Reports carry ``timesteps_total`` (= env steps) and
MLflow metric steps are env steps, so every curve is indexed by env steps.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable

from muzero_tune.config import ExperimentConfig, apply_overrides, from_flat_dict, to_flat_dict, validate
from muzero_tune.envs.factory import creators_for
from muzero_tune.runs.checkpoint import FORMAT, load_checkpoint, save_checkpoint
from muzero_tune.tune.resources import placement_group_factory

CHECKPOINT_FILE = "checkpoint.pt"


class TuneReporter:
    """Reports each evaluation to Tune (metrics + checkpoint) and to the trial's MLflow run."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        *,
        mlflow_run=None,
        driver_out: list | None = None,
        report_keys: list[str] | None = None,
    ):
        self.cfg = cfg
        self.flat_config = to_flat_dict(cfg)
        self.mlflow_run = mlflow_run
        self.driver_out = driver_out  # the async driver, once it exists (its actors' placement is reported)
        self._placement_reported = False
        # The trial's Tune report schema: its first report's keys, kept in every checkpoint, so a retried or
        # restored trial reports the same keys in the same order (missing ones as NaN). Tune's CSV logger
        # appends to progress.csv under the first post-restart report's keys without rereading the header:
        # any other key set (e.g. an evaluation before the first train step: no train/* keys) shifts columns.
        self.report_keys = list(report_keys) if report_keys else None
        self.checkpoint_write_s: list[float] = []
        self.checkpoint_bytes: list[int] = []

    def on_progress(self, metrics: dict) -> None:
        pass  # Tune sees one report per evaluation

    def on_videos(self, videos: tuple[tuple[str, bytes], ...], metrics: dict) -> None:
        """An evaluation's videos: into the trial folder's ``videos/`` and the trial's MLflow run."""
        from ray import tune

        from muzero_tune.runs.videos import log_videos, write_videos

        paths = write_videos(os.path.join(tune.get_context().get_trial_dir(), "videos"), videos)
        if self.mlflow_run is not None:
            log_videos(self.mlflow_run, paths)

    def on_eval(self, metrics: dict, evaluated: dict, resume_state: Callable[[], dict]) -> None:
        from ray import tune

        report = {
            k: v for k, v in metrics.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)
        }
        # Tune's own loggers (TensorBoard, MLflowLoggerCallback, CSV) take timesteps_total as their x axis
        report["timesteps_total"] = int(metrics["envstep"])
        if self.driver_out and not self._placement_reported:  # first report of this (re)start
            report.update(actor_placement(self.driver_out[0]))
            self._placement_reported = True
        if self.report_keys is None:
            self.report_keys = [*report, "checkpoint_bytes", "checkpoint_write_s"]
        with tempfile.TemporaryDirectory(prefix="muzero_tune_ckpt_") as d:
            t0 = time.perf_counter()
            size = save_checkpoint(
                os.path.join(d, CHECKPOINT_FILE),
                {
                    "format": FORMAT,
                    "config": self.flat_config,
                    "evaluated": evaluated,
                    "resume": resume_state(),
                    "report_keys": self.report_keys,
                },
            )
            self.checkpoint_write_s.append(time.perf_counter() - t0)
            self.checkpoint_bytes.append(size)
            report["checkpoint_bytes"] = size
            report["checkpoint_write_s"] = self.checkpoint_write_s[-1]
            if self.mlflow_run is not None:  # curves share one x axis: env steps
                self.mlflow_run.log_metrics(report, step=int(metrics["envstep"]))
            tune.report(
                {k: report.get(k, float("nan")) for k in self.report_keys},
                checkpoint=tune.Checkpoint.from_directory(d),
            )

    def close(self) -> None:
        pass


def actor_placement(driver) -> dict:
    """Where the async driver's actors run, observed (not assumed): their placement group, as each actor
    reports it, against the trial's; and which of the trial's bundles hold something (bundle 0: the trial)."""
    import ray
    from ray.util import get_current_placement_group

    pg = get_current_placement_group()
    pg_id = pg.id.hex() if pg is not None else ""
    infos = list(driver.actors.actor_info)
    in_pg = bool(infos) and all(i["placement_group_id"] == pg_id for i in infos)
    free = ray.available_resources()
    in_use = [
        i
        for i, spec in enumerate(pg.bundle_specs if pg is not None else [])
        if any(free.get(f"{r}_group_{i}_{pg_id}", 0.0) < amount - 1e-9 for r, amount in spec.items())
    ]
    me = ray.get_runtime_context().get_node_id()
    col_nodes = [i.get("node_id", "") for i in infos[: len(driver.actors.collectors)]]
    return {
        "placement/strategy": driver.ap.placement_strategy,
        "placement/driver_node": me,
        "placement/actor_nodes": " ".join(i.get("node_id", "") for i in infos),
        "placement/collectors_off_driver_node": sum(1 for n in col_nodes if n and n != me),
        "placement/trial_pg_id": pg_id,
        "placement/actors": len(infos),
        "placement/actors_in_trial_pg": int(in_pg),
        "placement/actor_bundles": " ".join(str(s.bundle) for s in driver.actors.slots),
        "placement/bundles_in_use": " ".join(map(str, in_use)),
        "placement/actor_pids": " ".join(str(i["pid"]) for i in infos),
    }


def trial_tags(cfg: ExperimentConfig, sweep_name: str) -> dict[str, str]:
    from muzero_tune.runs.mlflow_log import KIND_TAG, run_tags

    return run_tags(to_flat_dict(cfg), sweep=sweep_name, **{KIND_TAG: "trial"})


def run_trial(
    config: dict,
    *,
    base_flat: dict,
    sweep_name: str,
    mlflow_uri: str | None,
    experiment_name: str,
    artifact_root: str,
    env_creators: dict | None = None,
) -> None:
    """The trial body (module-level so Ray can pickle the trainable by reference). ``env_creators``: an env
    registered from Python in the process that started the sweep (``register_env``)."""
    from ray import tune

    from muzero_tune.api import train
    from muzero_tune.envs.factory import install_creators

    install_creators(env_creators)

    cfg = validate(apply_overrides(from_flat_dict(base_flat), config))
    ctx = tune.get_context()
    mlflow_run = None
    if mlflow_uri is not None:
        from muzero_tune.runs.mlflow_log import TrialRun, run_name

        flat = to_flat_dict(cfg)
        name = run_name(flat, ctx.get_trial_id(), swept=config)  # the keys this trial's param_space set
        mlflow_run = TrialRun(
            tracking_uri=mlflow_uri,
            experiment_name=experiment_name,
            artifact_root=artifact_root,
            trial_id=ctx.get_trial_id(),
            run_name=name,
            params=flat,
            tags={**trial_tags(cfg, sweep_name), "trial_name": ctx.get_trial_name()},
            description=f"Trial `{ctx.get_trial_name()}` of sweep `{sweep_name}`: "
            + ", ".join(f"`{k}={config[k]}`" for k in sorted(config)),
        )
    resume = None
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            resume = load_checkpoint(os.path.join(d, CHECKPOINT_FILE))
    status = "FAILED"
    driver_out: list = []
    reporter = TuneReporter(
        cfg, mlflow_run=mlflow_run, driver_out=driver_out, report_keys=(resume or {}).get("report_keys")
    )
    try:
        if cfg.policy.async_pipeline.enabled:
            from muzero_tune.distributed.async_driver import train_muzero_segment_async

            summary = train_muzero_segment_async(
                cfg, reporter=reporter, resume_from=resume, driver_out=driver_out
            )
        else:
            summary = train(cfg, reporter=reporter, resume_from=resume)
        status = "FINISHED"
        print(
            f"[muzero-tune] trial {ctx.get_trial_name()} stopped ({summary.stop_reason}): "
            f"envstep={summary.env_steps} train_iter={summary.train_iter}",
            flush=True,
        )
    finally:
        if mlflow_run is not None:
            mlflow_run.finish(status)


def make_trainable(
    cfg: ExperimentConfig,
    *,
    sweep_name: str = "sweep",
    experiment_name: str | None = None,
    mlflow_uri: str | None = "default",
):
    """The Tune function trainable for ``cfg`` (per-trial ``param_space`` values override it).

    Resources are computed per trial from its own config (a sync trial needs one bundle, an async one
    1 + collectors + evaluators). ``mlflow_uri``: "default" = sqlite in ``tune.storage_path``; None = off.
    """
    from functools import partial

    from ray import tune

    from muzero_tune.runs.mlflow_log import ensure_experiment
    from muzero_tune.tune.storage import default_tracking_uri_for, storage_of

    storage = storage_of(cfg.tune.storage_path)
    if mlflow_uri == "default":
        mlflow_uri = (
            (cfg.tune.mlflow_tracking_uri or default_tracking_uri_for(storage)) if cfg.tune.mlflow else None
        )
    if mlflow_uri is not None:
        # here, once: trials starting together would race to create the sqlite store and its experiment
        storage.makedirs(storage.uri)
        ensure_experiment(mlflow_uri, experiment_name or sweep_name, storage.join("mlartifacts"))
    base_flat = to_flat_dict(cfg)
    fn = partial(
        run_trial,
        base_flat=base_flat,
        sweep_name=sweep_name,
        mlflow_uri=mlflow_uri,
        experiment_name=experiment_name or sweep_name,
        artifact_root=storage.join("mlartifacts"),
        env_creators=creators_for(cfg.env.env_id),
    )

    def resources(trial_config: dict):
        return placement_group_factory(apply_overrides(cfg, trial_config or {}))

    return tune.with_resources(_named(fn, "muzero_tune_trainable"), resources)


def _named(fn, name: str):
    """A plain function wrapper (Tune names trials after the trainable's ``__name__``)."""

    def trainable(config: dict) -> None:
        fn(config)

    trainable.__name__ = name
    return trainable
