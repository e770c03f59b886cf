"""Compare runs from MLflow: reward_mean against wall-clock and env steps, env steps/s per pipeline.

Reads runs back through ``MlflowClient`` (any tracking URI), draws PNG plots with matplotlib (Agg), and logs
them with the summary table to a run of the experiment's own comparison experiment ``<experiment>_compare``.
Kept apart from the trials on purpose: in the trials' experiment the runs table holds only trials, and the
chart view only their curves (a compare run there put its summary numbers among them as bar charts, and a
parent run would fold the trials under one row and need to exist before the first trial). The comparison
experiment shows the plots as image cards in its chart view and the table under the run's artifacts.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field

from muzero_tune.errors import UserError
from muzero_tune.runs.mlflow_log import (
    COMPARE_SUFFIX,
    DEFAULT_UI_URL,
    DESCRIPTION_TAG,
    KIND_TAG,
    ensure_experiment,
    experiment_url,
    run_url,
)


@dataclass
class RunSeries:
    run_id: str
    name: str
    tags: dict[str, str]
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # metric -> [(step, value)]

    def values(self, key: str) -> list[float]:
        return [v for _, v in sorted(self.series.get(key, []))]


def read_runs(
    tracking_uri: str, experiment: str, *, keys=("reward_mean", "wall_s", "envstep", "envstep_per_s")
) -> list[RunSeries]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = [e.name for e in client.search_experiments()]
        raise UserError(
            f"--experiment {experiment}: no such MLflow experiment at {tracking_uri}; experiments there: "
            f"{', '.join(names) or '(none)'}"
        )
    out = []
    for run in client.search_runs([exp.experiment_id]):
        if run.data.tags.get(KIND_TAG) == "compare":  # stores from before the comparison experiment
            continue
        rs = RunSeries(run.info.run_id, run.info.run_name or run.info.run_id, dict(run.data.tags))
        for k in keys:
            rs.series[k] = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)]
        out.append(rs)
    return out


def plot_runs(runs: list[RunSeries], out_dir: str) -> list[str]:
    """Write reward_vs_wall.png, reward_vs_envstep.png, envstep_per_s.png; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    colors = {"sync": "tab:blue", "async": "tab:orange"}
    paths = []
    for x_key, fname, xlabel in (
        ("wall_s", "reward_vs_wall.png", "wall-clock (s)"),
        ("envstep", "reward_vs_envstep.png", "env steps"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for r in runs:
            xs, ys = r.values(x_key), r.values("reward_mean")
            n = min(len(xs), len(ys))
            pipe = r.tags.get("pipeline", "?")
            ax.plot(
                xs[:n],
                ys[:n],
                marker="o",
                ms=3,
                color=colors.get(pipe),
                alpha=0.8,
                label=f"{pipe} seed={r.tags.get('seed', '?')} {r.name[-12:]}",
            )
        ax.set_xlabel(xlabel)
        ax.set_ylabel("eval reward_mean")
        ax.set_title(f"reward_mean vs {xlabel}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        p = os.path.join(out_dir, fname)
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)

    by_pipe: dict[str, list[float]] = defaultdict(list)
    for r in runs:
        vals = r.values("envstep_per_s")
        if vals:
            by_pipe[r.tags.get("pipeline", "?")].append(vals[-1])
    fig, ax = plt.subplots(figsize=(5, 4))
    names = sorted(by_pipe)
    means = [sum(by_pipe[n]) / len(by_pipe[n]) for n in names]
    ax.bar(names, means, color=[colors.get(n, "gray") for n in names])
    for i, n in enumerate(names):
        ax.scatter([i] * len(by_pipe[n]), by_pipe[n], color="black", s=12, zorder=3)
    ax.set_ylabel("env steps / s (final report)")
    ax.set_title("throughput per pipeline")
    fig.tight_layout()
    p = os.path.join(out_dir, "envstep_per_s.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    return paths


def summarize(runs: list[RunSeries]) -> dict[str, dict[str, float]]:
    """Per pipeline: runs, mean final env steps/s, mean best reward."""
    agg: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        pipe = r.tags.get("pipeline", "?")
        if r.values("envstep_per_s"):
            agg[pipe]["envstep_per_s"].append(r.values("envstep_per_s")[-1])
        if r.values("reward_mean"):
            agg[pipe]["reward_best"].append(max(r.values("reward_mean")))
    return {
        p: {"runs": float(len(d["reward_best"])), **{k: sum(v) / len(v) for k, v in d.items() if v}}
        for p, d in agg.items()
    }


def summary_rows(summary: dict[str, dict[str, float]]) -> dict[str, list]:
    """The summary as table columns (``mlflow log_table`` form): one row per pipeline."""
    pipes = sorted(summary)
    return {
        "pipeline": pipes,
        "runs": [int(summary[p].get("runs", 0)) for p in pipes],
        "envstep_per_s": [summary[p].get("envstep_per_s", float("nan")) for p in pipes],
        "reward_best": [summary[p].get("reward_best", float("nan")) for p in pipes],
    }


def compare(
    tracking_uri: str,
    experiment: str,
    out_dir: str,
    *,
    log_artifacts: bool = True,
    ui_url: str = DEFAULT_UI_URL,
) -> dict:
    """Read, plot, log the plots and the summary table to a run of ``<experiment>_compare``.

    Returns {"plots", "summary", "run_id", "compare_experiment", "urls"}: ``urls["charts"]`` opens the
    trials' chart view (grouped by pipeline, reward and throughput first), ``urls["compare"]`` the run.
    """
    from mlflow.tracking import MlflowClient

    runs = read_runs(tracking_uri, experiment)
    if not runs:
        raise UserError(f"--experiment {experiment}: the MLflow experiment has no runs to compare")
    paths = plot_runs(runs, out_dir)
    summary = summarize(runs)
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    # stores written before the shared view existed get it (and the model-training kind) now
    ensure_experiment(tracking_uri, experiment, exp.artifact_location)
    urls = {"charts": experiment_url(exp.experiment_id, ui_url=ui_url)}
    run_id = None
    compare_name = experiment + COMPARE_SUFFIX
    if log_artifacts:
        import datetime

        cmp_id = ensure_experiment(
            tracking_uri,
            compare_name,
            exp.artifact_location,  # the same root: run ids keep them apart
            shared_view=False,
            description=(
                f"Sync-vs-async comparison of experiment `{experiment}` "
                f"([its runs]({experiment_url(exp.experiment_id, ui_url='')})): one run per `muzero-tune "
                f"compare`, holding the plots (reward vs env steps and vs wall-clock, env steps/s per "
                f"pipeline) and the summary table (`summary.json`, `summary.csv`)."
            ),
            tags={"muzero_tune.compares": experiment, "muzero_tune.compares_id": exp.experiment_id},
        )
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        pipes = " vs ".join(f"{p} x{int(s.get('runs', 0))}" for p, s in sorted(summary.items()))
        run = client.create_run(
            cmp_id,
            run_name=f"compare-{stamp}",
            tags={
                KIND_TAG: "compare",
                "muzero_tune.compares": experiment,
                DESCRIPTION_TAG: f"{len(runs)} runs of `{experiment}`: {pipes}",
            },
        )
        run_id = run.info.run_id
        for p in paths:
            client.log_artifact(run_id, p, artifact_path="plots")
            _log_image(client, run_id, p)
        rows = summary_rows(summary)
        client.log_table(run_id, data=rows, artifact_file="summary.json")
        csv_path = os.path.join(out_dir, "summary.csv")
        with open(csv_path, "w") as f:
            f.write(",".join(rows) + "\n")
            for i in range(len(rows["pipeline"])):
                f.write(",".join(str(rows[k][i]) for k in rows) + "\n")
        client.log_artifact(run_id, csv_path)
        for pipe, s in summary.items():
            for k, v in s.items():
                client.log_metric(run_id, f"{pipe}/{k}", v)
        client.set_terminated(run_id)
        client.set_experiment_tag(exp.experiment_id, "muzero_tune.compare_experiment", compare_name)
        # the run's artifacts page with the reward-vs-env-steps plot open
        urls["compare"] = run_url(cmp_id, run_id, ui_url=ui_url, tab="artifacts/plots/reward_vs_envstep.png")
    return {
        "plots": paths,
        "summary": summary,
        "run_id": run_id,
        "compare_experiment": compare_name if log_artifacts else None,
        "urls": urls,
    }


def _log_image(client, run_id: str, path: str) -> None:
    """The plot as an MLflow image, so the comparison experiment's chart view shows it as a card."""
    from PIL import Image

    with Image.open(path) as img:
        client.log_image(run_id, img.convert("RGB"), key=os.path.splitext(os.path.basename(path))[0], step=0)
