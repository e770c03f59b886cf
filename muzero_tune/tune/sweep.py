"""Sweeps: a named search space over a preset, run with Ray Tune; resume a killed sweep; all checks first.

Before any trial starts: the space name, every ``param_space`` key (it must be a config field) and every
value a grid or choice can take are validated, and a trial's placement group is checked to fit the
cluster. Runs are configured for fresh restores (state synced every ``tune.sync_period_s``) and write a
``muzero_tune_sweep.json`` beside Tune's state so ``muzero-tune resume PATH`` can rebuild the trainable.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from muzero_tune.config import (
    ConfigError,
    ConfigWarning,
    ExperimentConfig,
    apply_overrides,
    check_path_component,
    from_flat_dict,
    leaf_keys,
    make_config,
    to_flat_dict,
    validate,
)
from muzero_tune.distributed.cluster import DEFAULT_CONNECT_TIMEOUT_S
from muzero_tune.errors import PathError, RunFolderError
from muzero_tune.runs.mlflow_log import make_store_folder_writable
from muzero_tune.runs.run_folder import make_writable_folder
from muzero_tune.tune.resources import trial_bundles, trial_resources
from muzero_tune.tune.storage import Storage, default_tracking_uri_for, storage_of

SWEEP_FILE = "muzero_tune_sweep.json"


def _domain_values(value: Any) -> list[Any]:
    """Representative values of a param_space entry: every grid/choice value, or a range's ends."""
    if isinstance(value, dict) and "grid_search" in value:
        return list(value["grid_search"])
    cats = getattr(value, "categories", None)
    if cats is not None:
        return list(cats)
    lower, upper = getattr(value, "lower", None), getattr(value, "upper", None)
    if lower is not None and upper is not None:
        from ray.tune.search.sample import Integer

        return [lower, upper - 1] if isinstance(value, Integer) else [lower, upper]
    return [value]


def validate_param_space(cfg: ExperimentConfig, param_space: dict[str, Any]) -> None:
    """Every key must be a config field and every value it can take must validate (before trials start)."""
    keys = set(leaf_keys())
    for key, value in param_space.items():
        if key not in keys:
            apply_overrides(cfg, {key: None})  # raises the unknown-key ConfigError with suggestions
        with warnings.catch_warnings():  # one key at a time is no trial's config: warn in the trials
            warnings.simplefilter("ignore", ConfigWarning)
            for v in _domain_values(value):
                validate(apply_overrides(cfg, {key: v}), check_env=False)


def check_fits_cluster(cfg: ExperimentConfig, param_space: dict[str, Any]) -> None:
    """A trial's placement group must fit the cluster, or Tune would wait forever: its total, every bundle
    on some node, and under STRICT_SPREAD one node per bundle."""
    import ray

    from muzero_tune.distributed.cluster import alive_nodes

    have = ray.cluster_resources()
    nodes = alive_nodes()
    variants = [cfg]
    for key, value in param_space.items():
        variants += [apply_overrides(cfg, {key: v}) for v in _domain_values(value)]
    for v in variants:
        check_bundles_fit_nodes(v, trial_bundles(v), nodes)
        need = trial_resources(v)
        for res, amount in need.items():
            if amount > have.get(res, 0.0) + 1e-9:
                raise ConfigError(
                    "placement",
                    need,
                    f"a trial needs {amount:g} {res} but the Ray cluster has {have.get(res, 0.0):g}: reduce "
                    f"policy.async_pipeline.num_collector_actors / num_evaluator_actors / *_num_cpus / "
                    f"*_num_gpus or learn.device, or start Ray with more resources",
                )


def check_bundles_fit_nodes(cfg: ExperimentConfig, bs: list[dict[str, float]], nodes: list[dict]) -> None:
    """Every bundle must fit one live node's total resources; STRICT_SPREAD needs len(bs) such nodes."""

    def fits(b: dict[str, float], n: dict) -> bool:
        return all(n["resources"].get(k, 0.0) + 1e-9 >= a for k, a in b.items())

    for i, b in enumerate(bs):
        if not any(fits(b, n) for n in nodes):
            raise ConfigError(
                "placement",
                b,
                f"bundle {i} of a trial ({b}) fits no node of the Ray cluster ({len(nodes)} nodes, the "
                f"largest has {max((n['resources'].get('CPU', 0.0) for n in nodes), default=0):g} CPU): "
                f"lower policy.async_pipeline.*_num_cpus / *_num_gpus",
            )
    strategy = cfg.policy.async_pipeline.placement_strategy
    if strategy == "STRICT_SPREAD" and len(bs) > 1:
        usable = sum(1 for n in nodes if any(fits(b, n) for b in bs))
        if usable < len(bs):
            raise ConfigError(
                "policy.async_pipeline.placement_strategy",
                strategy,
                f"a trial has {len(bs)} bundles (driver + collectors + evaluators), one per node under "
                f"STRICT_SPREAD, but the Ray cluster has {usable} nodes that can hold one: use SPREAD or "
                f"PACK, fewer actors, or more nodes",
            )


@dataclass
class SweepResult:
    experiment_path: str
    results: Any  # ray.tune.ResultGrid
    tracking_uri: str | None
    experiment_name: str


def _tune_configs(
    cfg: ExperimentConfig,
    space,
    *,
    samples: int | None,
    scheduler: str | None,
    max_concurrent: int | None,
    seed: int,
    envstep_budgets: list[Any],
):
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search import ConcurrencyLimiter

    concurrency = max_concurrent or cfg.tune.max_concurrent_trials or space.max_concurrent
    use_asha = space.asha if scheduler is None else scheduler == "asha"
    search_alg = None
    if space.search_alg is not None:
        search_alg = ConcurrencyLimiter(space.search_alg(seed), max_concurrent=concurrency)
    sched = None
    if use_asha:
        # over env steps, the run's own budget: a trial is never stopped for reaching a fixed count of
        # evaluations before its max_envstep (a sweep over max_envstep takes the largest value it can take)
        budget = max(apply_overrides(cfg, {"max_envstep": v}).max_envstep for v in envstep_budgets)
        sched = ASHAScheduler(
            time_attr="envstep",
            max_t=budget,
            grace_period=max(1, int(budget * space.asha_grace_fraction)),
            reduction_factor=2,
        )
    return tune.TuneConfig(
        metric="reward_mean",
        mode="max",
        num_samples=samples or space.num_samples,
        search_alg=search_alg,
        scheduler=sched,
        max_concurrent_trials=None if search_alg is not None else concurrency,
    )


def _run_config(cfg: ExperimentConfig, name: str, storage: str):
    from ray import tune

    return tune.RunConfig(
        name=name,
        storage_path=storage,
        checkpoint_config=tune.CheckpointConfig(
            num_to_keep=cfg.tune.checkpoint_num_to_keep,
            checkpoint_score_attribute="reward_mean",
            checkpoint_score_order="max",
        ),
        failure_config=tune.FailureConfig(max_failures=cfg.tune.max_failures),
        sync_config=tune.SyncConfig(sync_period=cfg.tune.sync_period_s),
        verbose=1,
    )


def init_ray_for(
    cfg: ExperimentConfig,
    concurrency: int,
    num_cpus: int | None = None,
    *,
    address: str | None = None,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
) -> None:
    """Join ``address`` (or ``RAY_ADDRESS``), else start a local Ray big enough for ``concurrency`` trials."""
    from muzero_tune.distributed.cluster import requested_address, start_or_join

    if num_cpus is not None and requested_address(address) is not None:
        raise ConfigError(
            "--num-cpus",
            num_cpus,
            f"only for a local Ray; the cluster at {requested_address(address)} has its own",
        )
    async_cfg = apply_overrides(cfg, {"policy.async_pipeline.enabled": True})
    per_trial = trial_resources(async_cfg).get("CPU", 1.0)
    start_or_join(
        num_cpus=num_cpus or max(os.cpu_count() or 1, int(per_trial * concurrency + 0.999)),
        address=address,
        connect_timeout_s=connect_timeout_s,
    )


def run_sweep(
    space_name: str,
    *,
    preset: str = "cartpole_muzero",
    overrides: dict[str, Any] | None = None,
    samples: int | None = None,
    scheduler: str | None = None,
    max_concurrent: int | None = None,
    name: str | None = None,
    num_cpus: int | None = None,
    param_space_extra: dict[str, Any] | None = None,
    address: str | None = None,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    overwrite: bool = False,
) -> SweepResult:
    """Run a named sweep over a preset; everything is validated before Ray starts trials.

    Sweeps never mix: a name whose folder or MLflow experiment already holds a sweep is refused (resume it,
    pick another name) unless ``overwrite``, which removes the folder and marks the experiment's runs
    deleted first."""
    from search_spaces import get_space

    space = get_space(space_name)
    counts = (("--samples", samples), ("--max-concurrent", max_concurrent), ("--num-cpus", num_cpus))
    for flag, value in counts:
        if value is not None and value < 1:
            raise ConfigError(flag, value, "must be an integer >= 1")
    cfg = make_config(preset, overrides={**space.base_overrides, **(overrides or {})})
    param_space = {**space.param_space(), **(param_space_extra or {})}
    validate_param_space(cfg, param_space)
    if scheduler not in (None, "asha", "none"):
        raise ConfigError("--scheduler", scheduler, "allowed: asha, none")
    name = name or f"{space_name}_{preset}"
    check_path_component("--name", name)  # the sweep's folder <tune.storage_path>/<name>
    storage = storage_of(cfg.tune.storage_path)
    tracking_uri = None
    if cfg.tune.mlflow:
        tracking_uri = cfg.tune.mlflow_tracking_uri or default_tracking_uri_for(storage)
    if storage.local is not None:
        make_writable_folder("tune.storage_path", storage.local)
    else:
        storage.makedirs(storage.uri)
    if tracking_uri is not None:
        key = "tune.mlflow_tracking_uri" if cfg.tune.mlflow_tracking_uri else "tune.storage_path"
        make_store_folder_writable(key, tracking_uri)
    exp_path = storage.join(name)
    clear_old_sweep = _held_sweep(storage, exp_path, name, tracking_uri, overwrite=overwrite)
    concurrency = max_concurrent or cfg.tune.max_concurrent_trials or space.max_concurrent
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "1")  # with sync_period: restores pick the newest state
    init_ray_for(cfg, concurrency, num_cpus, address=address, connect_timeout_s=connect_timeout_s)
    check_fits_cluster(cfg, param_space)
    clear_old_sweep()  # --overwrite: only once everything else is known to be right

    from ray import tune

    from muzero_tune.runs.mlflow_log import count_trials, ensure_experiment, sweep_description
    from muzero_tune.tune.trainable import make_trainable

    if tracking_uri is not None:
        n_samples = samples or space.num_samples
        n_trials = n_samples if space.search_alg is not None else count_trials(param_space, n_samples)
        use_asha = space.asha if scheduler is None else scheduler == "asha"
        searcher = ("Optuna TPE" if space.search_alg is not None else "grid") + (", ASHA" if use_asha else "")
        description = sweep_description(
            name=name, space_name=space_name, space_text=space.description, preset=preset,
            param_space=param_space, n_trials=n_trials, searcher=searcher,
            overrides={**space.base_overrides, **(overrides or {})},
        )  # fmt: skip
        tags = {
            "muzero_tune.space": space_name,
            "muzero_tune.preset": preset,
            "muzero_tune.trials": str(n_trials),
        }
        ensure_experiment(
            tracking_uri, name, storage.join("mlartifacts"), description=description, tags=tags
        )
    trainable = make_trainable(cfg, sweep_name=name, experiment_name=name, mlflow_uri=tracking_uri)
    storage.makedirs(exp_path)
    meta = {"space": space_name, "preset": preset, "name": name, "config": to_flat_dict(cfg),
            "tracking_uri": tracking_uri, "concurrency": concurrency}  # fmt: skip
    storage.write_text(storage.join(name, SWEEP_FILE), json.dumps(meta, indent=1))
    tuner = tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=_tune_configs(
            cfg, space, samples=samples, scheduler=scheduler, max_concurrent=max_concurrent, seed=cfg.seed,
            envstep_budgets=_domain_values(param_space.get("max_envstep", cfg.max_envstep)),
        ),  # fmt: skip
        run_config=_run_config(cfg, name, storage.uri),
    )
    results = tuner.fit()
    return SweepResult(exp_path, results, tracking_uri, name)


def _held_sweep(
    storage: Storage, exp_path: str, name: str, tracking_uri: str | None, *, overwrite: bool
) -> Callable[[], None]:
    """Refuse a name that holds a sweep already (its folder, or runs in its MLflow experiment), unless
    ``overwrite``; returns what clears it then (the folder removed, the runs marked deleted, so ``compare``
    sees only the new sweep's), to call once everything else has been checked."""
    from muzero_tune.runs.mlflow_log import delete_runs, experiment_runs

    held = storage.holds_anything(exp_path)
    runs = experiment_runs(tracking_uri, name) if tracking_uri is not None else []
    if (held or runs) and not overwrite:
        what = " and ".join(
            part for part, there in ((f"its folder {exp_path}", held), (f"{len(runs)} MLflow runs", runs))
            if there
        )  # fmt: skip
        raise RunFolderError(
            f"sweep {name!r} exists ({what}); continue it with `muzero-tune resume {exp_path}`, give this "
            f"one another --name, or replace it with --overwrite"
        )

    def clear() -> None:
        if held:
            storage.remove(exp_path)
        if runs:
            delete_runs(tracking_uri, runs)

    return clear


def resume_sweep(
    path: str,
    *,
    num_cpus: int | None = None,
    address: str | None = None,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
) -> SweepResult:
    """Continue a killed or interrupted sweep: unfinished trials resume from their newest checkpoints."""
    from ray import tune

    from muzero_tune.tune.trainable import make_trainable

    storage = storage_of(path, key="PATH")
    path = storage.uri
    if not storage.is_dir(path):
        raise PathError(f"{path}: no such folder; expected a sweep folder <tune.storage_path>/<name>")
    text = storage.read_text(storage.join(SWEEP_FILE))
    if text is None:
        raise PathError(
            f"{path}: not a muzero-tune sweep folder (no {SWEEP_FILE}); expected <tune.storage_path>/<name> "
            f"as printed by `muzero-tune sweep`"
        )
    meta = json.loads(text)
    cfg = from_flat_dict(meta["config"])
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "1")
    init_ray_for(
        cfg, int(meta.get("concurrency", 2)), num_cpus, address=address, connect_timeout_s=connect_timeout_s
    )
    if not tune.Tuner.can_restore(path):
        raise ConfigError("PATH", path, "Tune cannot restore this folder (no experiment state)")
    trainable = make_trainable(
        cfg, sweep_name=meta["name"], experiment_name=meta["name"], mlflow_uri=meta["tracking_uri"]
    )
    tuner = tune.Tuner.restore(path, trainable=trainable, resume_unfinished=True, resume_errored=True)
    return SweepResult(path, tuner.fit(), meta["tracking_uri"], meta["name"])
