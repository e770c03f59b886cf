"""MLflow logging for trials and standalone runs: one MLflow run each, found again (not duplicated) after a
retry, a restore or a ``--resume``. Metric steps are env steps, so curves of every run share one x axis.

A trial's run is identified by the tag ``muzero_tune.trial_id``; a restarted trial (``FailureConfig``
retry, ``Tuner.restore``) reopens the same run and appends to its metric series. The default store is a
sqlite file in the sweep's storage folder, so nothing needs to be started. Uses ``MlflowClient`` only (no
global active run), which is safe in Ray worker processes. A standalone run (``logging.mlflow``) is found by
the tag ``muzero_tune.run_id`` (its run folder's ``run.json``) and logs to ``sqlite:///<output_dir>/mlflow.db``
by default, experiment ``standalone``.

What the MLflow UI shows (checked against the ``mlflow ui`` of MLflow 3.17 in headless Chromium):

- every experiment is tagged as model training (``mlflow.experimentKind``) and carries a description
  (``mlflow.note.content``). MLflow 3.17's UI itself picks its GenAI or "Model training" view from a
  UI-wide toggle, so the URLs printed here also carry ``workflowType=machine_learning``;
- run names say what a run is: ``async-lag8-sync4-s0-29e08_00003`` (pipeline, the lag knobs of an async
  run, other swept values, seed, then the trial id or the run folder's name);
- ``reward_mean`` and ``envstep_per_s`` are also logged as ``eval/reward_mean`` and ``perf/envstep_per_s``;
  a shared view (an experiment tag the UI reads through ``viewStateShareKey``) opens the chart view with
  those two sections first and the runs grouped by the ``pipeline`` tag (mean line, min-max band over seeds).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from urllib.parse import urlencode

TRIAL_TAG = "muzero_tune.trial_id"
RUN_TAG = "muzero_tune.run_id"  # standalone runs: the id in the run folder's run.json
KIND_TAG = "muzero_tune.kind"  # trial | standalone | compare
STANDALONE_EXPERIMENT = "standalone"

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"  # MLflow 3: what the UI opens an experiment as
MODEL_TRAINING_KIND = "custom_model_development"  # shown as "Machine learning" / "Model training"
DESCRIPTION_TAG = "mlflow.note.content"  # the description of an experiment or a run (markdown)
VIEW_KEY = "sync-vs-async"
VIEW_TAG = "mlflow.sharedViewState." + VIEW_KEY
COMPARE_SUFFIX = "_compare"  # `muzero-tune compare` logs to its own experiment "<experiment>_compare"
# the curves a user wants first, under a prefix (the bare names stay: the spec fixes them for Tune)
HEADLINE_METRICS = {"reward_mean": "eval/reward_mean", "envstep_per_s": "perf/envstep_per_s"}
HEADLINE_SECTION = "reward and throughput (x: env steps)"
DEFAULT_UI_URL = "http://127.0.0.1:5000"
_AP = "policy.async_pipeline."


def default_tracking_uri(storage_path: str) -> str:
    return "sqlite:///" + os.path.join(os.path.abspath(storage_path), "mlflow.db")


def shared_view_state() -> str:
    """The UI state behind ``?viewStateShareKey=sync-vs-async`` (JSON; the MLflow UI's own field names).

    Runs grouped by the ``pipeline`` tag (mean, min-max band), every run shown, x = step (= env steps), and
    reward and throughput side by side in the first section; ``isAccordionReordered`` makes the UI append
    the other metric sections after it instead of sorting all sections by name (``async/*`` would be first).
    The runs table shows those two metrics, env steps and the pipeline, seed and lag tags.
    """

    def line(key: str, section: str) -> dict:
        return {
            "type": "LINE", "uuid": f"muzero-tune-{key.replace('/', '-')}", "metricSectionId": section,
            "isGenerated": True, "deleted": False, "metricKey": key, "displayName": key.split("/")[-1],
            "runsCountToCompare": 10, "lineSmoothness": 0, "xAxisScaleType": "linear",
            "scaleType": "linear", "xAxisKey": "step", "selectedXAxisMetricKey": "", "yAxisKey": "metric",
            "yAxisExpressions": [], "ignoreOutliers": False, "useGlobalXaxisKey": True,
            "useGlobalLineSmoothing": True, "range": {},
        }  # fmt: skip

    section = "muzero-tune-headline"
    sections = [{"uuid": section, "name": HEADLINE_SECTION, "display": True, "isReordered": False}]
    charts = [line(key, section) for key in HEADLINE_METRICS.values()]
    columns = [f"metrics.`{k}`" for k in (*HEADLINE_METRICS.values(), "envstep")]
    columns += [f"tags.`{k}`" for k in ("pipeline", "seed", "max_policy_lag", "weight_sync_interval")]
    state = {
        "groupBy": {
            "aggregateFunction": "average",
            "groupByKeys": [{"mode": "tag", "groupByData": "pipeline"}],
        },
        "useGroupedValuesInCharts": True,
        "runsHiddenMode": "SHOW_ALL",
        "selectedColumns": columns,
        "hideEmptyCharts": True,
        "isAccordionReordered": True,
        "compareRunSections": sections,
        "compareRunCharts": charts,
        "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0, "selectedXAxisMetricKey": ""},
    }
    return json.dumps(state, separators=(",", ":"))


def experiment_url(
    experiment_id: str, *, ui_url: str = DEFAULT_UI_URL, charts: bool = True, shared_view: bool = True
) -> str:
    """The UI address of an experiment's runs, as model training: its chart view (``charts``) or its runs
    table, in the shared view (grouped by pipeline, reward and throughput first) when ``shared_view``."""
    query = {"workflowType": "machine_learning", "compareRunsMode": "CHART" if charts else "TABLE"}
    if shared_view:
        query["viewStateShareKey"] = VIEW_KEY
    return f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs?{urlencode(query)}"


def run_url(experiment_id: str, run_id: str, *, ui_url: str = DEFAULT_UI_URL, tab: str = "") -> str:
    tail = f"/{tab}" if tab else ""
    base = f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
    return f"{base}{tail}?workflowType=machine_learning"


def sqlite_path(tracking_uri: str) -> str | None:
    """The database file of an ``sqlite:///`` tracking URI (None for any other store)."""
    prefix = "sqlite:///"
    return tracking_uri[len(prefix) :] if tracking_uri.startswith(prefix) else None


def make_store_folder_writable(key: str, tracking_uri: str) -> None:
    """For an sqlite store: create its folder and probe it for writing before any work starts (a
    ``ConfigError`` naming ``key``); other stores are left to MLflow."""
    from muzero_tune.runs.run_folder import make_writable_folder

    path = sqlite_path(tracking_uri)
    if path is not None:
        make_writable_folder(key, os.path.dirname(os.path.abspath(path)))


def sqlite_store_missing(tracking_uri: str) -> bool:
    """Whether ``tracking_uri`` is an sqlite store whose file does not exist (opening it creates it)."""
    path = sqlite_path(tracking_uri)
    return path is not None and not os.path.exists(path)


def experiment_runs(tracking_uri: str, name: str) -> list[str]:
    """The ids of the active (not deleted) runs of experiment ``name`` ([] when there is none). An sqlite
    store that does not exist yet is not created by asking."""
    if sqlite_store_missing(tracking_uri):
        return []
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(name)
    if exp is None or exp.lifecycle_stage != "active":
        return []
    return [r.info.run_id for r in client.search_runs([exp.experiment_id], max_results=50_000)]


def delete_runs(tracking_uri: str, run_ids: list[str]) -> None:
    """Mark runs deleted (MLflow's soft delete: searches and ``compare`` no longer see them)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    for run_id in run_ids:
        client.delete_run(run_id)


def ensure_experiment(
    tracking_uri: str,
    name: str,
    artifact_root: str,
    *,
    description: str | None = None,
    tags: dict[str, str] | None = None,
    shared_view: bool = True,
) -> str:
    """Get or create the experiment; artifacts go under ``artifact_root`` (not Tune's ephemeral cwd).

    It is tagged as model training, with the shared chart view (``shared_view``) and a description: the
    given one replaces the old; without one, an experiment that has none gets a generic one. Tags are only
    written when they differ, so concurrent trials calling this do not write the store each time.
    """
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            location = artifact_root if "://" in artifact_root else os.path.abspath(artifact_root)
            client.create_experiment(name, artifact_location=location)
        except Exception:  # created concurrently by another trial
            pass
        exp = client.get_experiment_by_name(name)
    want = {EXPERIMENT_KIND_TAG: MODEL_TRAINING_KIND, **(tags or {})}
    if shared_view:
        want[VIEW_TAG] = shared_view_state()
    if description is not None:
        want[DESCRIPTION_TAG] = description
    elif not exp.tags.get(DESCRIPTION_TAG):
        want[DESCRIPTION_TAG] = (
            f"muzero-tune runs. Metric step = env steps; `eval/reward_mean`, `perf/envstep_per_s` first; "
            f"Group by the `pipeline` tag for sync against async. Plots: `muzero-tune compare --experiment "
            f"{name}`."
        )
    for key, value in want.items():
        if exp.tags.get(key) != value:
            client.set_experiment_tag(exp.experiment_id, key, value)
    return exp.experiment_id


def _value(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def run_name(flat_config: dict, suffix: str, *, swept: Iterable[str] = ()) -> str:
    """``<pipeline>[-lag<L>-sync<W>][-<key>=<value>...]-s<seed>-<suffix>``.

    E.g. ``async-lag8-sync4-s0-29e08_00003``, ``sync-s1-tiny``.

    An async run names its two publish knobs (``lagoff``: ``max_policy_lag < 0``, the lag rule off); a sync
    run has none. Swept keys other than those, the pipeline switch and the seed follow as
    ``<last part of the key>=<value>``. ``suffix``: the Tune trial id, or a standalone run's folder name.
    """
    is_async = bool(flat_config.get(_AP + "enabled"))
    parts = ["async" if is_async else "sync"]
    if is_async:
        lag = int(flat_config.get(_AP + "max_policy_lag", -1))
        parts += [
            "lagoff" if lag < 0 else f"lag{lag}",
            f"sync{flat_config.get(_AP + 'weight_sync_interval')}",
        ]
    named = {_AP + "enabled", _AP + "max_policy_lag", _AP + "weight_sync_interval", "seed"}
    for key in sorted(set(swept) - named):
        if key in flat_config:
            parts.append(f"{key.rsplit('.', 1)[-1]}={_value(flat_config[key])}")
    parts += [f"s{flat_config.get('seed')}", suffix]
    return "-".join(parts)


def run_tags(flat_config: dict, **extra: str) -> dict[str, str]:
    """The tags every run gets: ``pipeline`` (Group by), the lag knobs, policy, env and seed."""
    is_async = bool(flat_config.get(_AP + "enabled"))
    tags = {
        "pipeline": "async" if is_async else "sync",
        "policy_type": str(flat_config.get("policy.type")),
        "env_id": str(flat_config.get("env.env_id")),
        "seed": str(flat_config.get("seed")),
    }
    if is_async:
        tags["max_policy_lag"] = str(flat_config.get(_AP + "max_policy_lag"))
        tags["weight_sync_interval"] = str(flat_config.get(_AP + "weight_sync_interval"))
    return {**tags, **extra}


def count_trials(param_space: dict, num_samples: int) -> int:
    """How many trials a Tune ``param_space`` makes: ``num_samples`` times the product of its grid sizes."""
    n = num_samples
    for value in param_space.values():
        if isinstance(value, dict) and "grid_search" in value:
            n *= len(value["grid_search"])
    return n


def _domain_text(value) -> str:
    if isinstance(value, dict) and "grid_search" in value:
        return "{" + ", ".join(_value(v) for v in value["grid_search"]) + "}"
    cats = getattr(value, "categories", None)
    if cats is not None:
        return "choice {" + ", ".join(_value(v) for v in cats) + "}"
    lower, upper = getattr(value, "lower", None), getattr(value, "upper", None)
    if lower is not None and upper is not None:
        return f"[{_value(lower)}, {_value(upper)})"
    return _value(value)


def sweep_description(
    *,
    name: str,
    space_name: str,
    space_text: str,
    preset: str,
    param_space: dict,
    n_trials: int,
    overrides: dict,
    searcher: str,
) -> str:
    """The experiment description of a sweep (markdown): what was swept, over what, how many trials."""
    swept = "; ".join(f"`{k}` {_domain_text(v)}" for k, v in param_space.items()) or "(nothing)"
    over = ", ".join(f"`{k}={_value(v)}`" for k, v in overrides.items() if k != "tune.storage_path")
    return (
        f"**Sweep `{space_name}`** over preset `{preset}`: {n_trials} trials ({searcher}). {space_text}.\n\n"
        f"Swept: {swept}." + (f" Overrides: {over}." if over else "") + "\n\n"
        f"Runs are named `<pipeline>-lag<L>-sync<W>-s<seed>-<trial id>`; Group by the `pipeline` tag for "
        f"sync against async (mean and min-max over seeds). Metric step = env steps; `eval/reward_mean` "
        f"and `perf/envstep_per_s` are `reward_mean` and `envstep_per_s`. Comparison plots and the summary "
        f"table: experiment `{name}{COMPARE_SUFFIX}` (`muzero-tune compare --experiment {name}`)."
    )


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
        description: str | None = None,
    ):
        from mlflow.entities import Param, RunTag
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri)
        exp_id = ensure_experiment(tracking_uri, experiment_name, artifact_root)
        self.experiment_id = exp_id
        found = self.client.search_runs([exp_id], filter_string=f"tags.`{key_tag}` = '{trial_id}'")
        if found:
            self.run_id = found[0].info.run_id
            self.resumed = True
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            run_tags = {key_tag: trial_id, **tags}
            if description:
                run_tags[DESCRIPTION_TAG] = description
            run = self.client.create_run(exp_id, run_name=run_name, tags=run_tags)
            self.run_id = run.info.run_id
            self.resumed = False
            items = [Param(k, str(v)[:500]) for k, v in params.items()]
            for lo in range(0, len(items), 100):
                self.client.log_batch(self.run_id, params=items[lo : lo + 100])
            self.client.log_batch(self.run_id, tags=[RunTag("mlflow.runName", run_name)])

    def log_metrics(self, metrics: dict, *, step: int) -> None:
        """Log the numeric metrics at ``step`` (env steps), plus ``reward_mean`` and ``envstep_per_s``
        again under their headline names (``eval/reward_mean``, ``perf/envstep_per_s``)."""
        import time

        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        numeric = {
            k: float(v)
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
        }
        for key, alias in HEADLINE_METRICS.items():
            if key in numeric and alias not in numeric:
                numeric[alias] = numeric[key]
        items = [Metric(k, v, ts, step) for k, v in numeric.items()]
        for lo in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[lo : lo + 1000])

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)
