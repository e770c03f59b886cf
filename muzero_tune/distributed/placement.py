"""Resources: placement-group bundles for the driver and its actor pools, and where each actor goes.

Bundle 0 is the driver and, in process, its learner (``learn.num_threads`` CPUs, with a GPU when that learner
uses CUDA); the async pipeline adds one bundle per collector actor, then one per evaluator actor; last come
the ``learn.num_learners`` learner workers' bundles (``learn.learner_resources``; their GPUs are there, not in
bundle 0). A standalone run creates this placement group itself (the sync pipeline only when it has learner
workers); under Tune the trial's ``PlacementGroupFactory`` is built from the same :func:`bundles` and the
actors go into the trial's group. Either way actors are created with explicit bundle indices, and every wait
has a timeout that says which resources are missing (Ray otherwise waits silently forever).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from muzero_tune.config import ExperimentConfig


class PlacementError(RuntimeError):
    """The actors' resources could not be placed; the message says what is missing."""


def _bundle(cpus: float, gpus: float) -> dict[str, float]:
    b = {}
    if cpus > 0:
        b["CPU"] = float(cpus)
    if gpus > 0:
        b["GPU"] = float(gpus)
    return b


def driver_bundle(cfg: ExperimentConfig, *, learner_on_gpu: bool | None = None) -> dict[str, float]:
    """The driver's bundle: ``learn.num_threads`` CPUs (the cores its learner's step uses), and a GPU when the
    learner runs on CUDA in the driver's process (``learn.num_learners=0``)."""
    if learner_on_gpu is None:
        learner_on_gpu = cfg.learn.device.startswith("cuda")
    in_process = cfg.learn.num_learners == 0
    return _bundle(float(cfg.learn.num_threads), 1.0 if learner_on_gpu and in_process else 0.0)


def learner_bundle(cfg: ExperimentConfig, *, learner_on_gpu: bool | None = None) -> dict[str, float]:
    """One learner worker's bundle: ``learn.learner_resources``, by default ``learn.num_threads`` CPUs and
    a GPU when the learner uses CUDA."""
    if learner_on_gpu is None:
        learner_on_gpu = cfg.learn.device.startswith("cuda")
    res = cfg.learn.learner_resources
    cpus = float(res.get("CPU", cfg.learn.num_threads))
    return _bundle(cpus, float(res.get("GPU", 1.0 if learner_on_gpu else 0.0)))


def bundles(cfg: ExperimentConfig, *, learner_on_gpu: bool | None = None) -> list[dict[str, float]]:
    """[driver, collector_0..n-1, evaluator_0..m-1 (the async pipeline's), learner_0..k-1] bundles."""
    ap = cfg.policy.async_pipeline
    out = [driver_bundle(cfg, learner_on_gpu=learner_on_gpu)]
    if ap.enabled:
        out += [_bundle(ap.collector_num_cpus, ap.collector_num_gpus)] * ap.num_collector_actors
        out += [_bundle(ap.evaluator_num_cpus, ap.evaluator_num_gpus)] * ap.num_evaluator_actors
    out += [learner_bundle(cfg, learner_on_gpu=learner_on_gpu)] * cfg.learn.num_learners
    return out


def total_resources(bs: list[dict[str, float]]) -> dict[str, float]:
    tot: dict[str, float] = {}
    for b in bs:
        for k, v in b.items():
            tot[k] = tot.get(k, 0.0) + v
    return tot


@dataclass
class ActorPlacement:
    """A placement group and the bundle index of every actor slot."""

    placement_group: Any  # ray.util.placement_group.PlacementGroup
    num_collectors: int
    num_evaluators: int
    owned: bool  # created by us (removed at shutdown) rather than Tune's
    removed: bool = False  # remove() has run
    num_learners: int = 0

    def collector_bundle(self, i: int) -> int:
        return 1 + i

    def evaluator_bundle(self, j: int) -> int:
        return 1 + self.num_collectors + j

    def learner_bundle(self, k: int) -> int:
        return 1 + self.num_collectors + self.num_evaluators + k

    @classmethod
    def of(cls, cfg: ExperimentConfig, placement_group: Any, *, owned: bool) -> ActorPlacement:
        """The slots ``cfg`` asks for (no collectors or evaluators on the sync pipeline) in a group."""
        ap = cfg.policy.async_pipeline
        actors = (ap.num_collector_actors, ap.num_evaluator_actors) if ap.enabled else (0, 0)
        return cls(placement_group, *actors, owned=owned, num_learners=cfg.learn.num_learners)

    def options(self, bundle_index: int) -> dict:
        if self.placement_group is None:  # local mode: actors run in this process
            return {}
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.placement_group,
                placement_group_bundle_index=bundle_index,
                placement_group_capture_child_tasks=False,
            )
        }

    def remove(self) -> None:
        """Remove the group if it is ours (Tune removes a trial's), once: later calls do nothing."""
        if self.owned and not self.removed:
            from ray.util import remove_placement_group

            self.removed = True
            remove_placement_group(self.placement_group)


def ensure_ray(cfg: ExperimentConfig) -> None:
    """Join the cluster in ``RAY_ADDRESS`` if set, else start a local Ray instance if none is running, with
    enough logical CPUs for the placement group.

    Not used with ``ray_local_mode`` (see :class:`LocalRay`): Ray 2.60's ``ray.init(local_mode=True)`` raises.
    """
    from muzero_tune.distributed.cluster import start_or_join

    need = total_resources(bundles(cfg, learner_on_gpu=False))
    start_or_join(num_cpus=max(os.cpu_count() or 1, int(need.get("CPU", 1) + 0.999)))


def describe_shortfall(bs: list[dict[str, float]], strategy: str = "PACK") -> str:
    import ray

    need = total_resources(bs)
    have = ray.cluster_resources()
    free = ray.available_resources()
    parts = [
        f"{k}: need {v:g}, cluster has {have.get(k, 0):g}, free {free.get(k, 0):g}" for k, v in need.items()
    ]
    if strategy == "STRICT_SPREAD":
        n_nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        parts.append(f"STRICT_SPREAD needs {len(bs)} nodes (one per bundle), the cluster has {n_nodes} alive")
    return "; ".join(parts)


def driver_node_selector(bs: list[dict[str, float]]) -> list[dict[str, str]] | None:
    """Bundle label selectors that put bundle 0 (the driver's) on this process's node, or None when that
    node cannot hold it (e.g. a head started with ``--num-cpus 0``; bundle 0 then goes where Ray puts it).

    A standalone driver runs where it was started, not in its bundle: without this, bundle 0 could be
    reserved on another node and SPREAD would count the driver's node as free for collectors.
    """
    import ray
    from ray.util.placement_group import NODE_ID_LABEL_KEY

    me = ray.get_runtime_context().get_node_id()
    node = next((n for n in ray.nodes() if n["NodeID"] == me), None)
    total = dict(node.get("Resources", {})) if node else {}
    if any(total.get(k, 0.0) + 1e-9 < v for k, v in bs[0].items()):
        return None
    return [{NODE_ID_LABEL_KEY: me}] + [{} for _ in bs[1:]]


def standalone_placement(cfg: ExperimentConfig, *, learner_on_gpu: bool, timeout_s: float) -> ActorPlacement:
    """Create (and wait for) this run's own placement group."""
    from ray.util import placement_group

    bs = bundles(cfg, learner_on_gpu=learner_on_gpu)
    strategy = cfg.policy.async_pipeline.placement_strategy
    pg = placement_group(bs, strategy=strategy, name="", bundle_label_selector=driver_node_selector(bs))
    if not pg.wait(timeout_seconds=timeout_s):
        short = describe_shortfall(bs, strategy)
        from ray.util import remove_placement_group

        remove_placement_group(pg)
        raise PlacementError(
            f"the run's {strategy} placement group ({len(bs)} bundles: {bs}, bundle 0 on the "
            f"driver's node) was not placed within "
            f"{timeout_s:g} s; resources: {short}. Reduce policy.async_pipeline.num_collector_actors / "
            f"num_evaluator_actors / *_num_cpus / *_num_gpus, learn.num_learners / learner_resources, or "
            f"give Ray more resources."
        )
    return ActorPlacement.of(cfg, pg, owned=True)


def current_placement(cfg: ExperimentConfig) -> ActorPlacement | None:
    """The placement group this process runs in (a Tune trial's), if any, checked to have our bundles."""
    from ray.util import get_current_placement_group

    pg = get_current_placement_group()
    if pg is None:
        return None
    want = bundles(cfg)
    have = pg.bundle_specs
    if len(have) < len(want):
        raise PlacementError(
            f"the trial's placement group has {len(have)} bundles but this config needs {len(want)} "
            f"(driver, the async pipeline's collectors and evaluators, {cfg.learn.num_learners} learners): "
            f"build the trainable with muzero_tune.tune.make_trainable(cfg)"
        )
    return ActorPlacement.of(cfg, pg, owned=False)


# ---------------------------------------------------------------------------------------------- local mode


class LocalRef:
    """Local mode: the finished result (or error) of a call, standing in for a Ray ObjectRef."""

    def __init__(self, value: Any = None, error: BaseException | None = None):
        self.value, self.error = value, error


class _LocalMethod:
    def __init__(self, fn):
        self._fn = fn

    def remote(self, *args, **kwargs) -> LocalRef:
        try:
            return LocalRef(self._fn(*args, **kwargs))
        except Exception as e:  # like Ray: the error surfaces at get()
            return LocalRef(error=e)


class _LocalHandle:
    def __init__(self, obj: Any):
        self._obj = obj

    def __getattr__(self, name: str) -> _LocalMethod:
        return _LocalMethod(getattr(self._obj, name))


class _LocalActorClass:
    def __init__(self, cls: type):
        self._cls = cls

    def options(self, **_: Any) -> _LocalActorClass:
        return self

    def remote(self, *args, **kwargs) -> _LocalHandle:
        return _LocalHandle(self._cls(*args, **kwargs))


class LocalRay:
    """``policy.async_pipeline.ray_local_mode``: the few ``ray`` calls the async driver makes, in-process.

    Ray 2.60 removed ``ray.init(local_mode=True)``, so local mode does not start Ray at all: actors are
    plain objects in the driver process and every call runs to completion when it is submitted (debugging).
    """

    def remote(self, cls: type) -> _LocalActorClass:
        return _LocalActorClass(cls)

    def put(self, value: Any) -> LocalRef:
        return LocalRef(value)

    def get(self, ref: Any) -> Any:
        if isinstance(ref, list):
            return [self.get(r) for r in ref]
        if ref.error is not None:
            raise ref.error
        return ref.value

    def wait(self, refs: list, *, num_returns: int = 1, timeout: float | None = None) -> tuple[list, list]:
        refs = list(refs)
        return refs[:num_returns], refs[num_returns:]

    def kill(self, handle: Any, *, no_restart: bool = True) -> None:
        pass


def local_placement(cfg: ExperimentConfig) -> ActorPlacement:
    """Local mode: no placement group (the actors live in the driver process)."""
    return ActorPlacement.of(cfg, None, owned=False)
