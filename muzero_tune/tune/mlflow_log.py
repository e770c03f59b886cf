"""MLflow logging for trials and standalone runs: one MLflow run each, found again (not duplicated) after a
retry, a restore or a ``--resume``. Metric steps are env steps, so curves of every run share one x axis.

A trial's run is identified by the tag ``muzero_tune.trial_id``; a restarted trial (``FailureConfig``
retry, ``Tuner.restore``) reopens the same run and appends to its metric series. The default store is a
sqlite file in the sweep's storage folder, so nothing needs to be started. Uses ``MlflowClient`` only (no
global active run), which is safe in Ray worker processes. A standalone run (``logging.mlflow``) is found by
the tag ``muzero_tune.run_id`` (its run folder's ``run.json``) and logs to ``sqlite:///<output_dir>/mlflow.db``
by default, experiment ``standalone``.
"""

from __future__ import annotations

import os

TRIAL_TAG = "muzero_tune.trial_id"
RUN_TAG = "muzero_tune.run_id"  # standalone runs: the id in the run folder's run.json
STANDALONE_EXPERIMENT = "standalone"


def default_tracking_uri(storage_path: str) -> str:
    return "sqlite:///" + os.path.join(os.path.abspath(storage_path), "mlflow.db")


def ensure_experiment(tracking_uri: str, name: str, artifact_root: str) -> str:
    """Get or create the experiment; artifacts go under ``artifact_root`` (not Tune's ephemeral cwd)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=os.path.abspath(artifact_root))
    except Exception:  # created concurrently by another trial
        return client.get_experiment_by_name(name).experiment_id


class TrialRun:
    """The MLflow run of one trial (or of one standalone run: ``key_tag=RUN_TAG``, key = its run id)."""

    def __init__(
        self,
        *,
        tracking_uri: str,
        experiment_name: str,
        artifact_root: str,
        trial_id: str,
        run_name: str,
        params: dict,
        tags: dict,
        key_tag: str = TRIAL_TAG,
    ):
        from mlflow.entities import Param, RunTag
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri)
        exp_id = ensure_experiment(tracking_uri, experiment_name, artifact_root)
        found = self.client.search_runs([exp_id], filter_string=f"tags.`{key_tag}` = '{trial_id}'")
        if found:
            self.run_id = found[0].info.run_id
            self.resumed = True
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            run = self.client.create_run(exp_id, run_name=run_name, tags={key_tag: trial_id, **tags})
            self.run_id = run.info.run_id
            self.resumed = False
            items = [Param(k, str(v)[:500]) for k, v in params.items()]
            for lo in range(0, len(items), 100):
                self.client.log_batch(self.run_id, params=items[lo : lo + 100])
            self.client.log_batch(self.run_id, tags=[RunTag("mlflow.runName", run_name)])

    def log_metrics(self, metrics: dict, *, step: int) -> None:
        import time

        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [
            Metric(k, float(v), ts, step)
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
        ]
        for lo in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[lo : lo + 1000])

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)
