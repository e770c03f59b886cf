"""The trial's resources: a ``PlacementGroupFactory`` built from the same bundles the async driver uses.

Bundle 0 is the trial's own process (driver + learner, with a GPU when the learner uses CUDA); an async
trial adds one bundle per collector and evaluator actor, which its driver fills with explicit bundle
indices. A sync trial is bundle 0 alone.
"""

from __future__ import annotations

from muzero_tune.config import ExperimentConfig
from muzero_tune.pipeline.placement import bundles, driver_bundle, total_resources


def trial_bundles(cfg: ExperimentConfig) -> list[dict[str, float]]:
    if cfg.policy.async_pipeline.enabled:
        return bundles(cfg)
    return [driver_bundle(cfg)]


def placement_group_factory(cfg: ExperimentConfig):
    from ray import tune

    return tune.PlacementGroupFactory(trial_bundles(cfg), strategy="PACK")


def trial_resources(cfg: ExperimentConfig) -> dict[str, float]:
    return total_resources(trial_bundles(cfg))
