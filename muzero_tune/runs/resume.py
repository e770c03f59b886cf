"""What a resumed run's config is: the checkpoint's own config, with the user's overrides on top.

A resume continues the run that wrote the checkpoint -- its env, policy type, network, seed, pipeline --
not whatever preset the command line defaults to. Overrides may change how the run goes on (budgets, stop
conditions, learning rate, pipeline, actors), but not what the saved state is made of: the keys in
:data:`FIXED_ON_RESUME` (and every ``model.*`` key) shape the weights, optimizer state or observations, so
changing them is refused with a :class:`~muzero_tune.errors.ResumeConfigError` naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from muzero_tune.config import ExperimentConfig, apply_overrides, from_flat_dict, to_flat_dict, validate
from muzero_tune.errors import ResumeConfigError

FIXED_ON_RESUME = (
    "env.env_id",
    "env.frame_stack",
    "env.frame_size_px",
    "env.grayscale",
    "policy.type",
    "policy.lstm_hidden_size",
    "policy.rnn_hidden_size",
    "policy.chance_space_size",
    "learn.optimizer",
)
FIXED_PREFIXES = ("model.",)


def is_fixed(key: str) -> bool:
    return key in FIXED_ON_RESUME or key.startswith(FIXED_PREFIXES)


def config_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{dotted key: (old, new)} for every setting that differs (keys missing before count as defaults)."""
    defaults = to_flat_dict(ExperimentConfig())
    return {
        k: (before.get(k, defaults.get(k)), v)
        for k, v in after.items()
        if before.get(k, defaults.get(k)) != v
    }


def resume_config(
    checkpoint_config: Mapping[str, Any], overrides: Mapping[str, Any]
) -> tuple[ExperimentConfig, dict[str, tuple[Any, Any]]]:
    """The resumed run's validated config and what the overrides changed; refuses fixed keys."""
    base = from_flat_dict(checkpoint_config)
    cfg = validate(apply_overrides(base, overrides))
    changes = config_changes(to_flat_dict(base), to_flat_dict(cfg))
    fixed = [k for k in changes if is_fixed(k)]
    if fixed:
        k = fixed[0]
        old, new = changes[k]
        raise ResumeConfigError(
            f"--set {k}={new}: the checkpointed run has {k}={old!r} and cannot continue with another value "
            f"(env id, frame stack, policy type, network shape and optimizer are fixed for a run); "
            f"start a new run without --resume instead"
        )
    return cfg, changes


def describe_changes(changes: Mapping[str, tuple[Any, Any]]) -> str:
    if not changes:
        return "config unchanged"
    return "changed: " + ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changes.items())
