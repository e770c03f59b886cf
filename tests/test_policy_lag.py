"""weight_sync_interval vs max_policy_lag: the validation warning when the interval has no effect, and the
named search spaces holding no two trials with the same publish schedule (or saying so)."""

from __future__ import annotations

import itertools
import warnings

import pytest

from muzero_tune.config import ConfigWarning, make_config
from muzero_tune.pipeline.schedule import publish_interval

AP = "policy.async_pipeline."


def _warnings_for(**overrides) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_config("cartpole_muzero", overrides={AP + "enabled": True, **overrides})
    return [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]


@pytest.mark.parametrize("interval,lag", [(16, 0), (4, 2), (16, 14)])
def test_interval_without_effect_warns_naming_both_keys(interval, lag):
    (msg,) = _warnings_for(**{AP + "weight_sync_interval": interval, AP + "max_policy_lag": lag})
    assert f"{AP}weight_sync_interval={interval}" in msg and f"{AP}max_policy_lag={lag}" in msg
    assert "no effect" in msg and f"every {lag + 1} train_iter" in msg


@pytest.mark.parametrize("interval,lag", [(1, 0), (16, 15), (16, 40), (16, -1), (4, 3)])
def test_interval_that_matters_does_not_warn(interval, lag):
    assert _warnings_for(**{AP + "weight_sync_interval": interval, AP + "max_policy_lag": lag}) == []


def test_no_warning_when_the_async_pipeline_is_off():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_config("cartpole_muzero", overrides={AP + "weight_sync_interval": 16, AP + "max_policy_lag": 0})
    assert not [w for w in caught if issubclass(w.category, ConfigWarning)]


def _grid_trials(param_space: dict) -> list[dict]:
    """Every trial of a param_space's grid (non-grid entries fixed)."""
    grids = {k: v["grid_search"] for k, v in param_space.items()
             if isinstance(v, dict) and "grid_search" in v}
    fixed = {k: v for k, v in param_space.items() if k not in grids}
    return [{**fixed, **dict(zip(grids, combo))} for combo in itertools.product(*grids.values())]


def test_search_spaces_have_no_two_trials_with_the_same_publish_schedule():
    pytest.importorskip("ray")
    from search_spaces import SPACES

    defaults = make_config("cartpole_muzero").policy.async_pipeline
    checked = 0
    for space in SPACES.values():
        ps = space.param_space()
        if not {AP + "weight_sync_interval", AP + "max_policy_lag"} & set(ps):
            continue
        lag_values = [v for k, v in ps.items() if k.startswith(AP)]
        if not all(isinstance(v, int) or (isinstance(v, dict) and "grid_search" in v) for v in lag_values):
            # a sampled space (Optuna) cannot avoid repeats: its description must say which pairs coincide
            assert "min(weight_sync_interval, max_policy_lag + 1)" in space.description, space.name
            continue
        trials = _grid_trials(ps)
        gaps = [
            publish_interval(
                weight_sync_interval=t.get(AP + "weight_sync_interval", defaults.weight_sync_interval),
                max_policy_lag=t.get(AP + "max_policy_lag", defaults.max_policy_lag),
            )
            for t in trials
        ]
        assert len(set(gaps)) == len(gaps), (space.name, trials, gaps)
        assert str(len(trials)) + " trials" in space.description
        checked += 1
    assert checked >= 1  # policy_lag_grid
