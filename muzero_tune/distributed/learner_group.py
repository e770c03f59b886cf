"""Data-parallel learner workers, owned by the driver: ``learn.num_learners`` Ray actors training one model.

What this module owns
    :class:`LearnerWorker`, the Ray actor: an in-process :class:`~muzero_tune.pipeline.learner.Learner`
    whose loss runs through ``torch.nn.parallel.DistributedDataParallel`` over a ``torch.distributed``
    process group (gloo on CPU, NCCL on GPU) that the driver sets up: rank 0 names a free port on its node,
    every worker joins ``tcp://<rank 0's node>:<port>``. DDP averages the gradients in the backward (nothing
    here averages them by hand), so every rank clips, steps its optimizer and updates its target network on
    the same gradients and stays bit-identical to the others. Networks with BatchNorm use ``SyncBatchNorm``
    on GPUs; on CPUs, where torch has no SyncBatchNorm, each learner normalises over its own rows.

    :class:`LearnerGroup`, the driver's side, with the in-process learner's interface, so
    :class:`~muzero_tune.pipeline.core.DriverCore` drives either. The driver stays the single owner of the
    replay buffer: it samples the whole batch, computes its bootstrap values on its own copy of the target
    network (the deferred forward the in-process learner runs), sends learner i rows ``i*B/N .. (i+1)*B/N``
    (one ``ray.put`` per shard), gathers their priorities after the forward -- writing them back, and
    building the next batch, while the learners run their backward -- and their metrics after the step.
    Weights come from rank 0: snapshots for actors and evaluation, the driver's copies of the model (pulled
    when the driver next reads it) and of the target network (pulled at every target update, so the driver's
    bootstrap values and reanalyze see what the learners' would). Checkpoints hold rank 0's learner state in
    the in-process learner's format with the driver's RNG states: a run resumes on any number of learners,
    or in process.

    Faults: a learner that dies, or does not answer within ``learn.learner_timeout_s``, fails the step with
    :class:`LearnerFailureError` naming it and the train_iter; the run stops there and its checkpoints stay
    as they were (the group is not restarted).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import socket
import time
import warnings
from typing import Any

import numpy as np
import torch

from muzero_tune.config import ExperimentConfig, from_flat_dict, to_flat_dict
from muzero_tune.errors import RunFault
from muzero_tune.pipeline.learner import Learner, LearnOutput, StepInProgress, resolve_device, rng_state
from muzero_tune.policies.base import Policy
from muzero_tune.replay.targets import TrainBatch, resolve_bootstrap

__all__ = ["LearnerFailureError", "LearnerGroup", "LearnerWorker", "shard_batch"]


class LearnerFailureError(RunFault):
    """A learner worker died or did not answer; the run stopped (its checkpoints are intact)."""


def shard_batch(batch: TrainBatch, n: int) -> list[TrainBatch]:
    """``batch`` (bootstrap values resolved) split into ``n`` equal row ranges, in order: every array with
    B leading rows (extras included) is sliced, anything else is shared."""
    rows = batch.batch_size
    if rows % n != 0:
        raise ValueError(f"a batch of {rows} rows does not split into {n} equal shards")
    if batch.bootstrap is not None:
        raise ValueError("shard_batch takes a batch whose bootstrap values are resolved")
    size = rows // n

    def cut(value: Any, lo: int) -> Any:
        if isinstance(value, np.ndarray) and value.ndim > 0 and value.shape[0] == rows:
            return value[lo : lo + size]
        return value

    shards = []
    for i in range(n):
        lo = i * size
        fields = {f.name: cut(getattr(batch, f.name), lo) for f in dataclasses.fields(batch)}
        fields["extras"] = {k: cut(v, lo) for k, v in batch.extras.items()}
        shards.append(TrainBatch(**fields))
    return shards


def _worker_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """The config a learner worker's own in-process learner runs with: its batches arrive with their
    bootstrap values, so no helper thread (nor SSL encodings on it, nor batches built ahead)."""
    learn = dataclasses.replace(
        cfg.learn, num_learners=0, overlap_bootstrap=False, helper_ssl_encodings=0, prefetch_next_batch=False
    )
    return dataclasses.replace(cfg, learn=learn)


class _Loss(torch.nn.Module):
    """The policy's loss as a module, so DistributedDataParallel's forward runs it: its output's first
    element is the loss tensor DDP follows the graph of."""

    def __init__(self, model: torch.nn.Module, loss_fn: Any):
        super().__init__()
        self.model = model
        self._loss_fn = loss_fn

    def forward(self, batch: TrainBatch, train_iter: int, kwargs: dict) -> tuple[torch.Tensor, Any]:
        out = self._loss_fn(self.model, batch, train_iter=train_iter, **kwargs)
        return out.loss, out


class LearnerWorker:
    """One rank of the learner group (a Ray actor; plain Python, wrapped with ``ray.remote`` by the group)."""

    def __init__(self, flat_cfg: dict, rank: int, world_size: int, env_creators: dict | None = None):
        from muzero_tune.envs.factory import install_creators
        from muzero_tune.pipeline.core import make_policy, setup_torch_threads

        setup_torch_threads()
        # a shard's arrays arrive read-only from the object store (zero-copy); the loss reads them only
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        install_creators(env_creators)  # an env registered from Python in the driver (register_env)
        self.cfg = _worker_config(from_flat_dict(flat_cfg))
        self.rank, self.world_size = int(rank), int(world_size)
        self.policy, _ = make_policy(self.cfg)
        self.learner = Learner(self.cfg, self.policy)
        self._step: StepInProgress | None = None
        self._ddp: torch.nn.parallel.DistributedDataParallel | None = None

    def ping(self) -> dict:
        import ray

        ctx = ray.get_runtime_context()
        return {
            "pid": os.getpid(), "rank": self.rank, "node_id": ctx.get_node_id(),
            "placement_group_id": ctx.get_placement_group_id(), "device": str(self.learner.device),
        }  # fmt: skip

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's address and a free TCP port on it (asked of rank 0: the group meets there)."""
        import ray

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), int(port)

    def join(self, host: str, port: int, timeout_s: float) -> bool:
        """Join the process group at ``tcp://host:port`` and wrap the loss in DistributedDataParallel."""
        import torch.distributed as dist

        cuda = self.learner.device.type == "cuda"
        dist.init_process_group(
            "nccl" if cuda else "gloo", init_method=f"tcp://{host}:{port}", rank=self.rank,
            world_size=self.world_size, timeout=datetime.timedelta(seconds=timeout_s),
        )  # fmt: skip
        model = self.learner.model
        if cuda and any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            # the model's BatchNorm children are replaced in place (the model is never a BatchNorm itself):
            # the optimizer and the target network keep the same parameter tensors
            torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        ids = [self.learner.device.index or 0] if cuda else None
        # find_unused_parameters: a policy's loss may leave a head unused (an SSL projection at weight 0)
        self._ddp = torch.nn.parallel.DistributedDataParallel(
            _Loss(model, self.learner.loss_fn), device_ids=ids, find_unused_parameters=True
        )
        ddp = self._ddp

        def loss_fn(model, batch, *, train_iter, **kwargs):
            return ddp(batch, train_iter, kwargs)[1]

        self.learner.loss_fn = loss_fn
        return True

    def forward(self, shard: TrainBatch) -> tuple[np.ndarray, dict[str, float]]:
        """The loss's forward on this rank's rows: (priorities [b] float32, the loss's metrics)."""
        self._step = self.learner.forward_loss(shard)
        return self._step.out.priorities, dict(self._step.out.metrics)

    def backward(self) -> dict[str, float]:
        """The rest of the step (DDP averages the gradients in the backward): gradient norm and LR."""
        step, self._step = self._step, None
        out = self.learner.finish_step(step)
        return {"train/grad_norm": out.metrics["train/grad_norm"], "train/lr": out.metrics["train/lr"]}

    def weights(self) -> dict[str, torch.Tensor]:
        return self.learner.weights_snapshot()

    def target_weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu", copy=True) for k, v in self.learner.target_model.state_dict().items()}

    def state(self) -> dict:
        """The learner's state (CPU tensors), as the in-process learner's ``state_dict``."""
        return _to_cpu(self.learner.state_dict())

    def load_state(self, state: dict) -> bool:
        self.learner.load_state_dict(state)
        return True

    def train_budget_done(self) -> bool:
        self.learner.train_budget_done()
        return True

    def close(self) -> bool:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        return True


def _to_cpu(tree: Any) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, dict):
        return {k: _to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_to_cpu(v) for v in tree]
    return tree


class LearnerGroup:
    """The driver's side of ``learn.num_learners`` learner workers (see the module docstring): the in-process
    :class:`Learner`'s interface, over the workers and the driver's copies of the model and target network.

    ``placement``: the run's :class:`~muzero_tune.distributed.placement.ActorPlacement` (each worker goes into
    its learner bundle)."""

    def __init__(self, cfg: ExperimentConfig, policy: Policy, *, placement: Any):
        import ray

        from muzero_tune.envs.factory import creators_for

        self.cfg, self.policy, self.ray = cfg, policy, ray
        lc = cfg.learn
        self.num_learners = lc.num_learners
        self.timeout_s = lc.learner_timeout_s
        # the driver's copies (model, target network, bootstrap helper), on the CPU: the learners own the GPUs
        mirror_learn = dataclasses.replace(lc, num_learners=0, device="cpu", mixed_precision=False)
        self.mirror = Learner(dataclasses.replace(cfg, learn=mirror_learn), policy)
        flat = to_flat_dict(cfg)
        remote = ray.remote(LearnerWorker)
        self.train_iter = 0
        self.train_time_s = 0.0
        # seconds summed over steps: the driver's own work in them (bootstrap values, shards, priorities and
        # what after_forward does), the waits for the learners' forward and backward, and whole steps
        self.step_timing_s = {"driver": 0.0, "forward_wait": 0.0, "backward_wait": 0.0, "step": 0.0}
        self._model_iter = 0
        self.workers = []
        for rank in range(self.num_learners):
            index = placement.learner_bundle(rank)
            bundle = placement.placement_group.bundle_specs[index]  # what the run reserved for it
            opts = {"num_cpus": bundle.get("CPU", 0.0), "num_gpus": bundle.get("GPU", 0.0), "max_restarts": 0,
                    **placement.options(index)}  # fmt: skip
            self.workers.append(
                remote.options(**opts).remote(flat, rank, self.num_learners, creators_for(cfg.env.env_id))
            )
        try:
            self.info = self._get([w.ping.remote() for w in self.workers], "start")
            host, port = self._get(self.workers[0].rendezvous_address.remote(), "start")
            self._get([w.join.remote(host, port, self.timeout_s) for w in self.workers], "join the group")
            self._pull_model()
            self._pull_target()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ the in-process learner's interface

    @property
    def model(self) -> torch.nn.Module:
        """The driver's copy of the model, with rank 0's current weights."""
        if self._model_iter != self.train_iter:
            self._pull_model()
        return self.mirror.model

    @property
    def target_model(self) -> torch.nn.Module:
        """The driver's copy of the target network (current after every step)."""
        return self.mirror.target_model

    @property
    def bootstrap_helper(self):
        return self.mirror.bootstrap_helper

    @property
    def target_version(self) -> int:
        return self.mirror.target_version

    @property
    def device(self) -> torch.device:
        return self.mirror.device

    def start_bootstrap(self, batch: TrainBatch) -> TrainBatch:
        return self.mirror.start_bootstrap(batch)

    def target_stays(self) -> bool:
        return self.mirror.target_stays()

    def in_precision(self, fn, *args, **kwargs):
        return self.mirror.in_precision(fn, *args, **kwargs)

    def train_step(self, batch: TrainBatch, *, after_forward=None) -> LearnOutput:
        """One step of every learner on its shard of ``batch`` (see :meth:`Learner.train_step`)."""
        t0 = time.perf_counter()
        batch = self.mirror.in_precision(resolve_bootstrap, batch, self.cfg.learn.bootstrap_piece_rows)
        refs = [self.ray.put(s) for s in shard_batch(batch, self.num_learners)]
        t_sent = time.perf_counter()
        outs = self._get([w.forward.remote(r) for w, r in zip(self.workers, refs)], "forward")
        t_fwd = time.perf_counter()
        backward = [w.backward.remote() for w in self.workers]
        priorities = np.concatenate([p for p, _ in outs]).astype(np.float32)
        if after_forward is not None:
            after_forward(priorities)  # beside the learners' backward
        t_driver = time.perf_counter()
        (step_metrics, *_) = self._get(backward, "backward")
        t_end = time.perf_counter()
        self.train_iter += 1
        self.mirror.train_iter = self.train_iter
        if self.mirror.target_changed_at(self.train_iter):
            self._pull_target()
        metrics = {k: float(np.mean([m[k] for _, m in outs])) for k in outs[0][1]}
        metrics.update(step_metrics)
        t_done = time.perf_counter()
        self.train_time_s += t_done - t0
        for key, seconds in (("driver", (t_sent - t0) + (t_driver - t_fwd) + (t_done - t_end)),
                             ("forward_wait", t_fwd - t_sent), ("backward_wait", t_end - t_driver),
                             ("step", t_done - t0)):  # fmt: skip
            self.step_timing_s[key] += seconds
        return LearnOutput(priorities=priorities, metrics=metrics)

    def target_changed_at(self, train_iter: int) -> bool:
        return self.mirror.target_changed_at(train_iter)

    def train_budget_done(self) -> None:
        self._get([w.train_budget_done.remote() for w in self.workers], "train_budget_done")
        self.policy.on_train_budget_done(self.mirror.model, self.mirror.target_model)

    def weights_snapshot(self) -> dict[str, torch.Tensor]:
        """Rank 0's weights as CPU tensors (a new copy: immutable for actors and evaluation)."""
        if self._model_iter != self.train_iter:
            self._pull_model()
        return {k: v.detach().clone() for k, v in self.mirror.model.state_dict().items()}

    def state_dict(self) -> dict:
        """Rank 0's learner state, with the driver's RNG states: the in-process learner's format."""
        state = self._get(self.workers[0].state.remote(), "state")
        state["rng"] = rng_state()
        return state

    def load_state_dict(self, state: dict) -> None:
        ref = self.ray.put(state)
        self._get([w.load_state.remote(ref) for w in self.workers], "load_state")
        self.mirror.load_state_dict(state)  # the driver's copies, and the driver's RNG states
        self.train_iter = self.mirror.train_iter
        self.train_time_s = self.mirror.train_time_s
        self._model_iter = self.train_iter

    def close(self) -> None:
        """End the workers (their process group with them)."""
        for w in getattr(self, "workers", []):
            try:
                self.ray.kill(w, no_restart=True)
            except Exception:  # already dead
                pass
        self.workers = []
        self.mirror.close()

    # ------------------------------------------------------------------ rank 0's weights

    def _pull_model(self) -> None:
        weights = self._get(self.workers[0].weights.remote(), "weights")
        self.mirror.model.load_state_dict(weights)
        self._model_iter = self.train_iter

    def _pull_target(self) -> None:
        weights = self._get(self.workers[0].target_weights.remote(), "weights")
        self.mirror.target_model.load_state_dict(weights)
        self.mirror.target_version += 1

    def _get(self, refs: Any, what: str) -> Any:
        """``ray.get`` within ``learn.learner_timeout_s``; a dead or silent learner: LearnerFailureError."""
        import ray.exceptions as rex

        try:
            return self.ray.get(refs, timeout=self.timeout_s)
        except (rex.RayActorError, rex.GetTimeoutError, rex.RayTaskError) as err:
            batch = refs if isinstance(refs, list) else [refs]
            which = self._which_failed(batch)
            why = " ".join(str(err).split())[:300]
            raise LearnerFailureError(
                f"learner {which} failed ({what}) at train_iter {self.train_iter}: {why}; "
                f"the run stops here, its checkpoints as they were"
            ) from None

    def _which_failed(self, refs: list) -> str:
        import ray.exceptions as rex

        failed = []
        for rank, ref in enumerate(refs):
            try:
                self.ray.get(ref, timeout=0.1)
            except (rex.RayActorError, rex.RayTaskError):
                failed.append(str(rank))
            except rex.GetTimeoutError:
                failed.append(f"{rank} (no answer)")
        return ", ".join(failed) or "?"


def train_sync_with_learners(
    cfg: ExperimentConfig, *, reporter: Any = None, resume_from: str | dict | None = None
) -> Any:
    """The sync pipeline with ``learn.num_learners`` learner workers: Ray started (or joined) and the run's
    placement group made (inside a Tune trial: the trial's), then
    :func:`~muzero_tune.pipeline.sync_driver.train_muzero_segment` with the group as its learner."""
    from muzero_tune.config import validate
    from muzero_tune.distributed.placement import current_placement, ensure_ray, standalone_placement
    from muzero_tune.pipeline.sync_driver import train_muzero_segment

    validate(cfg)
    ensure_ray(cfg)
    placement = current_placement(cfg)
    if placement is None:
        on_gpu = resolve_device(cfg.learn.device).type == "cuda"  # auto: cuda where this machine has one
        placement = standalone_placement(cfg, learner_on_gpu=on_gpu, timeout_s=cfg.learn.learner_timeout_s)
    try:
        return train_muzero_segment(
            cfg, reporter=reporter, resume_from=resume_from,
            make_learner=lambda c, policy: LearnerGroup(c, policy, placement=placement),
        )  # fmt: skip
    finally:
        placement.remove()
