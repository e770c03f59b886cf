"""Search-space entries written on the command line: ``muzero-tune sweep --grid KEY=V1,V2 --choice ...``.

What this module owns
    Turning ``--grid``, ``--choice``, ``--uniform``, ``--loguniform`` and ``--randint`` arguments into Ray
    Tune ``param_space`` entries over any config key, each value typed as the key's setting is (``1e-3``
    for a float, ``true`` for a bool, ``[1, 2]`` for a list), with a one-line error naming the flag, the key
    and what is allowed. The values after ``=`` are read as a YAML flow sequence, so a list value keeps its
    brackets: ``--grid learn.lr_milestones=[1000],[2000,4000]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from muzero_tune.config import ConfigError, ExperimentConfig, apply_overrides, leaf_keys, to_flat_dict

KINDS = ("grid", "choice", "uniform", "loguniform", "randint")
_RANGES = {"uniform": "LOW,HIGH", "loguniform": "LOW,HIGH (both > 0)", "randint": "LOW,HIGH (HIGH excluded)"}


def _typed(flag: str, key: str, value: Any) -> Any:
    """``value`` as the setting ``key`` takes it (the ``--set`` coercion)."""
    try:
        return to_flat_dict(apply_overrides(ExperimentConfig(), {key: value}))[key]
    except ConfigError as err:
        raise ConfigError(f"--{flag} {key}", value, err.allowed) from None


def _values(flag: str, text: str) -> tuple[str, list[Any]]:
    key, sep, rhs = text.partition("=")
    key = key.strip()
    if not sep or not key or not rhs.strip():
        raise ConfigError(f"--{flag}", text, "expected KEY=V1,V2,... (e.g. learn.learning_rate=1e-3,3e-3)")
    if key not in leaf_keys():
        apply_overrides(ExperimentConfig(), {key: None})  # the unknown-key error, with suggestions
    try:
        values = yaml.safe_load(f"[{rhs}]")
    except yaml.YAMLError:
        raise ConfigError(f"--{flag} {key}", rhs, "values must read as a YAML list, V1,V2,...") from None
    return key, values


def param_space_from_flags(flags: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """``{kind: ["KEY=...", ...]}`` (kinds: :data:`KINDS`) -> a Tune ``param_space`` over dotted keys.

    grid: every value, a trial each (a product with the other grids); choice: one value drawn per trial;
    uniform / loguniform: a float drawn from [LOW, HIGH] (loguniform: on a log scale); randint: an integer in
    [LOW, HIGH). A key given twice is an error."""
    from ray import tune

    space: dict[str, Any] = {}
    for kind in KINDS:
        for text in flags.get(kind, ()):
            key, values = _values(kind, text)
            if key in space:
                raise ConfigError(f"--{kind}", text, f"{key} is already swept by another flag")
            if kind in ("grid", "choice"):
                if len(values) < 1:
                    raise ConfigError(f"--{kind} {key}", text, "give at least one value")
                typed = [_typed(kind, key, v) for v in values]
                space[key] = tune.grid_search(typed) if kind == "grid" else tune.choice(typed)
                continue
            bounds = [_typed(kind, key, v) for v in values]
            numeric = all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds)
            if len(bounds) != 2 or not numeric or not bounds[0] < bounds[1]:
                rhs = text.partition("=")[2]
                raise ConfigError(f"--{kind} {key}", rhs, f"expected {_RANGES[kind]}, LOW < HIGH")
            low, high = bounds
            if kind == "uniform":
                space[key] = tune.uniform(float(low), float(high))
            elif kind == "loguniform":
                if low <= 0:
                    raise ConfigError(f"--{kind} {key}", low, "LOW must be > 0 on a log scale")
                space[key] = tune.loguniform(float(low), float(high))
            else:
                if int(low) != low or int(high) != high:
                    raise ConfigError(f"--{kind} {key}", text.partition("=")[2], "expected integers")
                space[key] = tune.randint(int(low), int(high))
    return space
