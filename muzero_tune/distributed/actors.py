"""Ray actor bodies: collectors and evaluators that own their environments and a read-only model.

Each worker loads a published :class:`WeightsSnapshot` only at a collect (or eval) boundary, so the
weights version is fixed for a whole call, runs the policy's ``on_weights_loaded`` hook after every load,
and returns a frozen result tagged with that version and the digest of the weights it actually used.
Workers never see the replay buffer or the learner. The classes are plain Python; the async driver wraps
them with ``ray.remote`` and places them in explicit placement-group bundles.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from muzero_tune.config import from_flat_dict
from muzero_tune.envs.factory import install_creators
from muzero_tune.envs.faults import FaultSpec, FaultyEnv
from muzero_tune.models.layout import place_model
from muzero_tune.pipeline.collector import SegmentCollector, env_factory
from muzero_tune.pipeline.core import EVAL_SEED_OFFSET, make_policy, setup_torch_threads
from muzero_tune.pipeline.evaluator import Evaluator
from muzero_tune.pipeline.messages import (
    CollectResult,
    EvalResult,
    WeightsSnapshot,
    segments_digest,
    weights_digest,
)

COLLECTOR_SEED_STRIDE = 1000


class _Worker:
    kind = ""

    def __init__(
        self,
        flat_cfg: dict,
        actor_id: int,
        incarnation: int = 0,
        fault: FaultSpec | None = None,
        num_gpus: float = 0.0,
        env_creators: dict | None = None,
    ):
        setup_torch_threads()
        install_creators(env_creators)  # an env registered from Python in the driver (register_env)
        self.cfg = from_flat_dict(flat_cfg)
        self.actor_id = actor_id
        self.incarnation = incarnation
        self.policy, self.spec = make_policy(self.cfg)
        device = "cuda" if num_gpus > 0 and torch.cuda.is_available() else "cpu"
        self.model = place_model(
            self.policy.build_model(), device=device, channels_last=self.cfg.model.channels_last
        ).eval()
        self.version: int | None = None
        self.digest = ""
        import ray

        self.node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
        base = env_factory(self.cfg, evaluation=self.kind == "evaluator")
        if fault is not None and fault.applies(self.kind, actor_id, incarnation):
            if fault.mode == "exit_on_start":  # the process dies while it boots (as on a node that dies)
                os._exit(17)
            if fault.mode == "raise_on_start":  # the actor's own code refuses to start
                raise RuntimeError(f"injected constructor error in {self.kind} {actor_id}")
            first = [True]

            def make(seed: int):
                env = base(seed)
                if first[0]:  # only env 0 of this actor fails
                    first[0] = False
                    return FaultyEnv(env, fault)
                return env

            self._make = make
        else:
            self._make = base
        self.worker = self._make_worker(actor_id, incarnation)

    def _make_worker(self, actor_id: int, incarnation: int):
        """The collector or evaluator this actor runs (built once the policy, model and env maker exist)."""
        raise NotImplementedError

    def ping(self) -> dict:
        """Liveness check; also tells where the actor runs (tests check the placement)."""
        import ray

        # local mode runs without Ray; get_runtime_context() would start a Ray instance
        ctx = ray.get_runtime_context() if ray.is_initialized() else None
        return {
            "pid": os.getpid(),
            "placement_group_id": ctx.get_placement_group_id() if ctx is not None else None,
            "node_id": ctx.get_node_id() if ctx is not None else "",
            "kind": self.kind,
            "actor_id": self.actor_id,
            "incarnation": self.incarnation,
        }

    def _load(self, snapshot: WeightsSnapshot) -> None:
        if snapshot.version == self.version:
            return
        import ray

        from muzero_tune.distributed.placement import LocalRef

        weights = snapshot.ref.value if isinstance(snapshot.ref, LocalRef) else ray.get(snapshot.ref)
        dev = next(self.model.parameters()).device
        # the object store's arrays are read-only: copy them into the model's own tensors
        self.model.load_state_dict({k: torch.tensor(v, device=dev) for k, v in weights.items()})
        self.digest = weights_digest(self.model.state_dict())
        self.policy.on_weights_loaded(self.model)
        self.version = snapshot.version

    def close(self) -> bool:
        self.worker.close()
        return True


class CollectorWorker(_Worker):
    kind = "collector"

    def _make_worker(self, actor_id: int, incarnation: int) -> SegmentCollector:
        seed = self.cfg.seed + COLLECTOR_SEED_STRIDE * actor_id + 100 * incarnation
        return SegmentCollector(
            self.cfg, self.policy, self.spec, seed=seed, make=self._make, actor_id=actor_id
        )

    def collect(self, snapshot_box: list[WeightsSnapshot], temperature: float) -> CollectResult:
        """One collect with the boxed snapshot's weights (boxed so Ray does not fetch it every call)."""
        self._load(snapshot_box[0])
        res = self.worker.collect(self.model, temperature=temperature, policy_version=snapshot_box[0].version)
        seg_digest = (
            segments_digest(res.segments) if self.cfg.policy.async_pipeline.verify_segment_digests else ""
        )
        return dataclasses.replace(
            res, weights_digest=self.digest, segments_digest=seg_digest, node_id=self.node_id
        )


class EvaluatorWorker(_Worker):
    kind = "evaluator"

    def _make_worker(self, actor_id: int, incarnation: int) -> Evaluator:
        # every evaluator uses the same episode seeds, so any of them reproduces a checkpoint's reward
        return Evaluator(
            self.cfg,
            self.policy,
            self.spec,
            seed=self.cfg.seed + EVAL_SEED_OFFSET,
            make=self._make,
            actor_id=actor_id,
            video=self.cfg.eval.video_every > 0,
        )

    def evaluate(self, snapshot_box: list[WeightsSnapshot], video_name: str | None = None) -> EvalResult:
        self._load(snapshot_box[0])
        res = self.worker.evaluate(self.model, policy_version=snapshot_box[0].version, video_name=video_name)
        return dataclasses.replace(res, weights_digest=self.digest, node_id=self.node_id)
