"""The trial's resources: a ``PlacementGroupFactory`` built from the same bundles the async driver uses.

Bundle 0 is the trial's own process (driver + learner, with a GPU when the learner uses CUDA -- including
``learn.device=auto`` on a cluster that has a GPU, so the GPU the learner takes is reserved); an async
trial adds one bundle per collector and evaluator actor, and ``learn.num_learners`` learner workers one each
(their GPUs there instead of bundle 0's), which its driver fills with explicit bundle indices. A sync trial
without learner workers is bundle 0 alone.
"""

from __future__ import annotations

from muzero_tune.config import ExperimentConfig
from muzero_tune.distributed.placement import bundles, total_resources


def learner_wants_gpu(cfg: ExperimentConfig, *, cluster_gpus: float | None = None) -> bool:
    """Whether bundle 0 reserves a GPU: ``learn.device`` cuda[:N], or ``auto`` on a cluster with a GPU.

    ``cluster_gpus``: the Ray cluster's GPUs (None: asked from the running Ray, 0 when none is running). A
    trial that would put its learner on ``cuda:0`` without reserving it would share a GPU Ray hands to others.
    """
    device = cfg.learn.device
    if device.startswith("cuda"):
        return True
    if device != "auto":
        return False
    if cluster_gpus is None:
        import ray

        cluster_gpus = ray.cluster_resources().get("GPU", 0.0) if ray.is_initialized() else 0.0
    return cluster_gpus >= 1.0


def trial_bundles(cfg: ExperimentConfig, *, cluster_gpus: float | None = None) -> list[dict[str, float]]:
    return bundles(cfg, learner_on_gpu=learner_wants_gpu(cfg, cluster_gpus=cluster_gpus))


def placement_group_factory(cfg: ExperimentConfig):
    from ray import tune

    return tune.PlacementGroupFactory(
        trial_bundles(cfg), strategy=cfg.policy.async_pipeline.placement_strategy
    )


def trial_resources(cfg: ExperimentConfig) -> dict[str, float]:
    return total_resources(trial_bundles(cfg))
