"""Validation: every setting checked against its range and every cross-setting rule, before any
environment, process or network is created.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import warnings
from typing import Any

from muzero_tune.config.overrides import iter_fields
from muzero_tune.config.schema import ExperimentConfig
from muzero_tune.errors import ConfigError, ConfigWarning

# ---------------------------------------------------------------------------------------------- validation


def _control_characters(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def check_path_component(key: str, value: str) -> None:
    """Refuse a name that would not be exactly one folder or file name below its parent: empty, ``.`` or
    ``..``, holding a path separator, or control characters (so nothing is written outside the folder the
    name lives in)."""
    seps = [s for s in (os.sep, os.altsep, "/") if s]
    if not value or value in (".", "..") or any(s in value for s in seps) or _control_characters(value):
        raise ConfigError(
            key, value, "must be one folder name: not empty, not . or .., no '/' and no control characters"
        )


def check_text(key: str, value: str) -> None:
    """A name or folder setting (``logging.output_dir``, an MLflow experiment): not empty, no control
    characters."""
    if not value or _control_characters(value):
        raise ConfigError(key, value, "must not be empty or hold control characters")


# MLflow stores this tool writes to: sqlite files, tracking servers and the databases MLflow's SQL store takes
# (MLflow's file store is in maintenance mode and refuses new runs).
TRACKING_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks")


def check_tracking_uri(key: str, value: str) -> None:
    """Refuse an MLflow tracking URI that names no store runs can be written to (a bare folder, an unknown
    scheme)."""
    scheme, sep, rest = value.partition("://")
    if not sep or scheme.split("+")[0] not in TRACKING_SCHEMES or not rest or _control_characters(value):
        raise ConfigError(
            key, value, "expected an MLflow store URI: sqlite:///path/to/mlflow.db, http(s)://host:port, or "
            f"a database URI ({', '.join(TRACKING_SCHEMES[3:6])}); MLflow's folder store takes no new runs",
        )  # fmt: skip


def _check_field(key: str, value: Any, f: dataclasses.Field) -> None:
    m = f.metadata
    if value is None:
        return
    if m.get("path_component"):
        check_path_component(key, value)
    if m.get("text"):
        check_text(key, value)
    vals = value if isinstance(value, tuple) else (value,)
    for v in vals:
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(key, value, "must be a finite number")
        if m.get("choices") is not None and v not in m["choices"]:
            close = difflib.get_close_matches(str(v), [str(c) for c in m["choices"]], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(key, value, f"allowed: {', '.join(map(str, m['choices']))}{hint}")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if m.get("ge") is not None and v < m["ge"]:
                raise ConfigError(key, value, f"must be >= {m['ge']}")
            if m.get("gt") is not None and v <= m["gt"]:
                raise ConfigError(key, value, f"must be > {m['gt']}")
            if m.get("le") is not None and v > m["le"]:
                raise ConfigError(key, value, f"must be <= {m['le']}")
            if m.get("lt") is not None and v >= m["lt"]:
                raise ConfigError(key, value, f"must be < {m['lt']}")


def _get(cfg: ExperimentConfig, key: str) -> Any:
    obj: Any = cfg
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def validate(cfg: ExperimentConfig, *, check_env: bool = True) -> ExperimentConfig:
    """Check every field's range and the cross-field rules; raise ConfigError before any work starts.

    ``check_env`` also checks that ``env.env_id`` is a registered gymnasium id (without building it).
    Returns ``cfg`` so calls can be chained.
    """
    for key, _, f in iter_fields():
        _check_field(key, _get(cfg, key), f)

    for key in ("logging.mlflow_tracking_uri", "tune.mlflow_tracking_uri"):
        if _get(cfg, key) is not None:
            check_tracking_uri(key, _get(cfg, key))
    learn, replay, ap = cfg.learn, cfg.replay, cfg.policy.async_pipeline
    if learn.device not in ("cpu", "auto", "cuda") and not learn.device.startswith("cuda:"):
        raise ConfigError("learn.device", learn.device, "allowed: cpu, auto, cuda, cuda:<index>")
    if list(learn.lr_milestones) != sorted(learn.lr_milestones):
        raise ConfigError("learn.lr_milestones", learn.lr_milestones, "must be increasing")
    if replay.capacity_transitions < learn.batch_size:
        raise ConfigError(
            "replay.capacity_transitions",
            replay.capacity_transitions,
            f"must be >= learn.batch_size ({learn.batch_size})",
        )
    if replay.off_policy_transitions_per_step > 0 and replay.td_steps_min > replay.td_steps:
        raise ConfigError(
            "replay.td_steps_min", replay.td_steps_min, f"must be <= replay.td_steps ({replay.td_steps})"
        )
    for name, amount in learn.learner_resources.items():
        if name not in ("CPU", "GPU"):
            raise ConfigError(f"learn.learner_resources.{name}", amount, "allowed keys: CPU, GPU")
        number = isinstance(amount, (int, float)) and not isinstance(amount, bool)
        if not number or not math.isfinite(amount) or amount < 0:
            raise ConfigError(f"learn.learner_resources.{name}", amount, "must be a finite number >= 0")
    if learn.num_learners > 0 and ap.enabled and ap.ray_local_mode:
        raise ConfigError(
            "learn.num_learners", learn.num_learners,
            "learner workers are Ray actors; policy.async_pipeline.ray_local_mode runs without Ray",
        )  # fmt: skip
    if learn.num_learners > 0 and learn.batch_size % learn.num_learners != 0:
        raise ConfigError(
            "learn.num_learners",
            learn.num_learners,
            f"must divide learn.batch_size ({learn.batch_size}): each learner takes an equal share",
        )
    if learn.num_threads == 2 and learn.overlap_bootstrap and learn.prefetch_next_batch:
        warnings.warn(
            ConfigWarning(
                "learn.num_threads=2 runs the learner's step on one thread, as 1 does: the bootstrap helper "
                "takes the second core beside both the loss's forward (learn.overlap_bootstrap) and its "
                "backward (learn.prefetch_next_batch), and a Tune trial's bundle reserves both cores; for a "
                "two-thread backward set learn.prefetch_next_batch=false, or use 3 or more threads"
            ),
            stacklevel=2,
        )
    if learn.compile_optimizer_step and learn.compile == "off":
        warnings.warn(
            ConfigWarning("learn.compile_optimizer_step=true has no effect with learn.compile=off"),
            stacklevel=2,
        )
    if learn.helper_ssl_encodings > 0:
        if not learn.overlap_bootstrap:
            warnings.warn(
                ConfigWarning(
                    f"learn.helper_ssl_encodings={learn.helper_ssl_encodings} has no helper thread with "
                    "learn.overlap_bootstrap=false: every SSL target encoding runs on the loss's thread"
                ),
                stacklevel=2,
            )
        if learn.helper_ssl_encodings > replay.num_unroll_steps:
            raise ConfigError(
                "learn.helper_ssl_encodings",
                learn.helper_ssl_encodings,
                f"must be <= replay.num_unroll_steps ({replay.num_unroll_steps}): one encoding per step",
            )
    if cfg.env.env_id.startswith("ALE/") and cfg.model.kind == "mlp":
        raise ConfigError("model.kind", "mlp", "Atari image observations need model.kind=conv or auto")
    if ap.max_collect_inflight is not None and ap.max_collect_inflight > ap.num_collector_actors:
        raise ConfigError(
            "policy.async_pipeline.max_collect_inflight",
            ap.max_collect_inflight,
            f"must be <= num_collector_actors ({ap.num_collector_actors}): one collect per actor at a time",
        )
    if ap.max_eval_inflight > ap.num_evaluator_actors:
        raise ConfigError(
            "policy.async_pipeline.max_eval_inflight",
            ap.max_eval_inflight,
            f"must be <= num_evaluator_actors ({ap.num_evaluator_actors})",
        )
    for kind in ("collector", "evaluator"):
        if getattr(ap, f"{kind}_num_cpus") + getattr(ap, f"{kind}_num_gpus") <= 0:
            raise ConfigError(
                f"policy.async_pipeline.{kind}_num_cpus",
                getattr(ap, f"{kind}_num_cpus"),
                f"an actor bundle needs some resource: {kind}_num_cpus + {kind}_num_gpus must be > 0",
            )
    if ap.enabled and 0 <= ap.max_policy_lag < ap.weight_sync_interval - 1:
        warnings.warn(
            ConfigWarning(
                f"policy.async_pipeline.weight_sync_interval={ap.weight_sync_interval} has no effect with "
                f"policy.async_pipeline.max_policy_lag={ap.max_policy_lag}: the lag rule publishes every "
                f"{ap.max_policy_lag + 1} train_iter first (the gap is min(weight_sync_interval, "
                f"max_policy_lag + 1)); set max_policy_lag >= {ap.weight_sync_interval - 1} or -1 (off) "
                f"for the interval to apply"
            ),
            stacklevel=2,
        )
    from muzero_tune.policies.registry import check_policy_type  # light: no torch import

    check_policy_type(cfg.policy.type)
    if check_env:
        from muzero_tune.envs.factory import validate_env_id

        try:
            validate_env_id(cfg.env.env_id)
        except ImportError:
            raise
        except ValueError as e:
            raise ConfigError("env.env_id", cfg.env.env_id, str(e)) from None
    return cfg
