"""Named Ray Tune search spaces, usable from Python and from ``muzero-tune sweep --space NAME``.

Each :class:`SearchSpace` holds a ``param_space`` of dotted config keys, the overrides it needs (e.g. the
async pipeline on), a default sample count and concurrency limit, and optional search algorithm and
scheduler factories (Optuna TPE, ASHA).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from muzero_tune.config import ConfigError


@dataclass(frozen=True)
class SearchSpace:
    name: str
    description: str
    param_space: Callable[[], dict[str, Any]]  # built lazily: importing this module does not import Ray
    base_overrides: dict[str, Any] = field(default_factory=dict)
    num_samples: int = 1  # grids multiply this by their size
    max_concurrent: int = 2
    search_alg: Callable[[int], Any] | None = None  # seed -> searcher (wrapped in a ConcurrencyLimiter)
    asha: bool = False  # ASHA by default (the CLI's --scheduler overrides): over env steps, up to the budget
    asha_grace_fraction: float = 0.1  # no trial stopped before this fraction of max_envstep


# The publish schedule depends on the two lag keys only through the gap min(weight_sync_interval,
# max_policy_lag + 1) (schedule.publish_interval; max_policy_lag < 0: weight_sync_interval), so a product
# grid over both keys repeats schedules ({1, 4, 16} x {0, 8, -1} was 9 trials and 4 schedules). The grid
# varies the gap once per trial through the interval, with the lag rule off.
POLICY_LAG_GRID_INTERVALS = (1, 2, 4, 8, 16)
LAG_SCHEDULE_NOTE = (
    "the publish gap is min(weight_sync_interval, max_policy_lag + 1) (max_policy_lag < 0: "
    "weight_sync_interval), so pairs with the same gap are the same schedule"
)


def _policy_lag_grid() -> dict[str, Any]:
    from ray import tune

    return {
        "policy.async_pipeline.weight_sync_interval": tune.grid_search(list(POLICY_LAG_GRID_INTERVALS)),
        "policy.async_pipeline.max_policy_lag": -1,
    }


def _policy_lag_optuna_space() -> dict[str, Any]:
    from ray import tune

    return {
        "policy.async_pipeline.weight_sync_interval": tune.choice([1, 2, 4, 8, 16, 32]),
        "policy.async_pipeline.max_policy_lag": tune.randint(
            -1, 33
        ),  # upper bound exclusive; -1: lag rule off
    }


def _optuna_tpe(seed: int):
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    return OptunaSearch(sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=3), seed=seed)


def _sync_vs_async(seeds: tuple[int, ...]) -> Callable[[], dict[str, Any]]:
    def space() -> dict[str, Any]:
        from ray import tune

        return {
            "policy.async_pipeline.enabled": tune.grid_search([False, True]),
            "seed": tune.grid_search(list(seeds)),
        }

    return space


_ASYNC = {"policy.async_pipeline.enabled": True}

SPACES: dict[str, SearchSpace] = {
    s.name: s
    for s in (
        SearchSpace(
            "policy_lag_grid",
            "async: grid over the publish gap, weight_sync_interval {1,2,4,8,16} with max_policy_lag=-1 "
            f"(5 trials, 5 distinct schedules; {LAG_SCHEDULE_NOTE})",
            _policy_lag_grid,
            base_overrides=_ASYNC,
            max_concurrent=2,
        ),
        SearchSpace(
            "policy_lag_optuna",
            "async: Optuna TPE over weight_sync_interval in {1..32} and max_policy_lag in [-1, 32], ASHA "
            f"(samples can repeat a schedule: {LAG_SCHEDULE_NOTE})",
            _policy_lag_optuna_space,
            base_overrides=_ASYNC,
            num_samples=8,
            max_concurrent=2,
            search_alg=_optuna_tpe,
            asha=True,
        ),
        SearchSpace(
            "sync_vs_async",
            "A/B: sync vs async pipeline over seeds 0, 1, 2 (6 trials), no early stopping",
            _sync_vs_async((0, 1, 2)),
            max_concurrent=2,
        ),
        SearchSpace(
            "blank",
            "nothing of its own: the keys --grid / --choice / --uniform / --loguniform / --randint sweep",
            dict,
            max_concurrent=2,
        ),
        SearchSpace(
            "quickstart",
            "A/B: sync vs async over seeds 0, 1 (4 small trials, a few minutes on 2 cores)",
            _sync_vs_async((0, 1)),
            max_concurrent=2,
            base_overrides={"max_envstep": 6000},
        ),
    )
}


def get_space(name: str) -> SearchSpace:
    if name not in SPACES:
        close = difflib.get_close_matches(name, list(SPACES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError("--space", name, f"allowed: {', '.join(SPACES)}{hint}")
    return SPACES[name]
