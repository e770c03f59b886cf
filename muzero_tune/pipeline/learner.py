"""The learner: model, target model, optimizer, LR schedule, one train step, and its exact state.

It owns the weights being trained and nothing else: batches come in (built by the driver from the replay
buffer), priorities go out. A batch may leave its value targets' bootstrap term to the learner
(``batch.bootstrap``): the step then runs that one batched forward of the target network, on the learner's
device -- network work belongs to the learner, the driver's thread keeps the bookkeeping. With
``learn.overlap_bootstrap`` it runs on a helper thread while the loss's forward runs on the caller's (the
loss reads its value targets last); the values are the same, since the target network changes only after
the step. ``learn.num_threads`` is the cores the step may use: torch's intra-op threads for the loss's
forward less the helper's one, and for the backward and the optimizer step all of them (less the helper's
one, too, where the helper works beside the backward); ``learn.helper_ssl_encodings`` moves
the last SSL target encodings there too (:mod:`~muzero_tune.pipeline.ssl_offload`), and ``after_forward``
lets the driver start the next batch's bootstrap forward beside this step's backward (``DriverCore``'s
prefetch; :meth:`Learner.target_stays` says when the target network allows it). ``learn.mixed_precision``
autocasts both forwards (bf16 on CUDA and on CPUs with native bf16); the weights, gradients and optimizer
stay fp32. ``learn.compile`` runs the loss's forward and backward, and the optimizer's step, compiled
(:mod:`~muzero_tune.pipeline.compiled_loss`). ``state_dict()`` holds everything needed to continue exactly
-- model, target model, optimizer, scheduler, train_iter and the RNG states of torch, numpy and Python --
and is loadable with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import contextlib
import copy
import math
import random
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from muzero_tune.config import ConfigError, ConfigWarning, ExperimentConfig, LearnConfig
from muzero_tune.errors import DivergedError
from muzero_tune.models.layout import place_model
from muzero_tune.pipeline.compiled_loss import (
    CompiledLoss,
    CompiledOptimizerStep,
    optimizer_step_compiles,
    start_inductor_prework,
)
from muzero_tune.pipeline.ssl_offload import SslOffload
from muzero_tune.policies.base import LossOutput, Policy
from muzero_tune.replay.targets import TrainBatch, resolve_bootstrap, start_bootstrap


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when present else cpu; an explicit cuda without one is a clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError("learn.device", name, "no CUDA device is available here; use cpu or auto")
        idx = int(name.split(":")[1]) if ":" in name else 0
        if idx >= torch.cuda.device_count():
            raise ConfigError("learn.device", name, f"only {torch.cuda.device_count()} CUDA device(s) here")
    return torch.device(name)


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN runs bf16 natively on this CPU (AVX-512 BF16/AMX, or AVX-512 core), not emulated."""
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype ``learn.mixed_precision`` autocasts the learner's forward to on ``device``, or None for fp32.

    CUDA: bf16 where the GPU supports it, else fp16 (with a gradient scaler). CPU: bf16 where the CPU has
    native bf16 instructions (oneDNN's AVX-512 or AMX kernels); elsewhere bf16 is emulated and measured far
    slower (29x on an AVX2-only CPU), so the learner stays fp32 and says so. The weights and the optimizer
    stay fp32 either way (autocast casts per op)."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "cpu" and cpu_has_native_bf16():
        return torch.bfloat16
    warnings.warn(
        f"learn.mixed_precision=True: no native bf16 on this {device.type} (needs AVX-512 or AMX); "
        "the learner runs in fp32",
        ConfigWarning,
        stacklevel=3,
    )
    return None


def torch_thread_pool(name: str) -> ThreadPoolExecutor:
    """A one-thread pool whose thread runs torch's CPU ops with the creating thread's intra-op thread count.

    ``torch.set_num_threads`` (one per process here, :func:`~muzero_tune.pipeline.core.setup_torch_threads`)
    sets OpenMP's count for the calling thread only: OpenMP keeps it per thread, and a thread started later
    runs its ops on a team of OpenMP's default size, one thread per core, although ``torch.get_num_threads()``
    still reports the caller's count there. A helper thread left so would run its forward on every core,
    beside the caller's own work (a matmul loop on such a thread was seen using nearly two cores and
    starting an extra OS thread, slowing the same loop on the main thread beside it). The
    pool's thread sets the count first."""
    return ThreadPoolExecutor(
        max_workers=1,
        thread_name_prefix=name,
        initializer=torch.set_num_threads,
        initargs=(torch.get_num_threads(),),
    )


@contextlib.contextmanager
def intra_op_threads(n: int) -> Iterator[None]:
    """Torch's intra-op thread count on the calling thread set to ``n`` inside the block, restored after.

    The count is OpenMP's, kept per OS thread (see :func:`torch_thread_pool`), so only the caller's ops
    change. A no-op where the count is already ``n``. Results are deterministic for a given count, but a
    reduction split over 2 threads rounds differently from 1 (66 of a Pong loss's 78 gradient tensors differ
    between 1 and 2 threads; at either they are bit-identical run to run), so the count is configuration
    (``learn.num_threads``), never picked by timing."""
    before = torch.get_num_threads()
    if before == n:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def lr_factor(lc: LearnConfig, step: int) -> float:
    """Multiplier of the initial learning rate at train step ``step``."""
    if lc.lr_schedule == "piecewise":
        return float(lc.lr_decay_factor ** sum(step >= m for m in lc.lr_milestones))
    if lc.lr_schedule == "cosine":
        frac = min(step / lc.lr_total_train_iter, 1.0)
        return float(0.5 * (1.0 + np.cos(np.pi * frac)))
    return 1.0


def make_optimizer(lc: LearnConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The configured optimizer over ``params`` (torch's multi-tensor ``foreach`` implementation).

    ``foreach=True`` is what torch picks on CUDA by default; on the CPU its default is the per-tensor loop.
    Both do the same element-wise arithmetic in the same order: the parameters and optimizer state after 60
    steps are bit-identical for Adam, AdamW and SGD with momentum (``tests/test_learner.py``), and the
    foreach step is faster on the CPU (about 1.3x per Adam step on the CartPole MLP).

    ``fused=True`` measured several times faster per Adam step for the CartPole MLP on a CPU, but its other
    summation order changes the training trajectory: CartPole seeds 0-4 then needed a median of 3,640 env
    steps to 195 (worst 11,752) against 2,328 (worst 5,040) with this default, which reproduces the previous
    runs step for step. Left off until a wider seed comparison says the difference is chance.
    """
    if lc.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=lc.learning_rate, momentum=lc.momentum, weight_decay=lc.weight_decay, foreach=True
        )
    if lc.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lc.learning_rate, weight_decay=lc.weight_decay, foreach=True)
    return torch.optim.Adam(params, lr=lc.learning_rate, weight_decay=lc.weight_decay, foreach=True)


@torch.no_grad()
def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """Scale the gradients of ``params`` in place so their global L2 norm is at most ``max_norm``; returns
    the norm before scaling.

    The same operations as ``torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)`` for gradients
    of one device and dtype (one multi-tensor norm, their norm, ``min(max_norm / (norm + 1e-6), 1)``), so the
    gradients are bit-identical (``tests/test_learner.py``). On the CPU the multiply is skipped when that
    factor is 1 (x * 1.0 == x), which torch does unconditionally to spare an accelerator a host sync, and so
    is torch's per-call regrouping by device and dtype: 130 -> 70 us per call for the CartPole MLP. Other
    devices or mixed dtypes go to torch's function.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    first = grads[0]
    if first.device.type != "cpu" or any(g.dtype != first.dtype or g.device != first.device for g in grads):
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True))
    total_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
    clip_coef_clamped = torch.clamp(float(max_norm) / (total_norm + 1e-6), max=1.0)
    if float(clip_coef_clamped) < 1.0:
        torch._foreach_mul_(grads, clip_coef_clamped)
    return float(total_norm)


def rng_state() -> dict:
    """RNG states of torch, numpy's global generator and Python's random (weights_only-loadable)."""
    st = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {
            "key": torch.from_numpy(st[1].astype(np.int64)),
            "pos": int(st[2]),
            "gauss": [int(st[3]), float(st[4])],
        },
        "python": list(random.getstate()[1]),
        "python_version": int(random.getstate()[0]),
        "python_gauss": random.getstate()[2],
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(
        (
            "MT19937",
            state["numpy"]["key"].numpy().astype(np.uint32),
            state["numpy"]["pos"],
            state["numpy"]["gauss"][0],
            state["numpy"]["gauss"][1],
        )
    )
    random.setstate((state["python_version"], tuple(state["python"]), state["python_gauss"]))


@dataclass(frozen=True)
class StepInProgress:
    """A train step between its loss's forward and its backward (:meth:`Learner.forward_loss`)."""

    out: Any  # the policy's loss output: loss (a scalar tensor with its graph), priorities [B], metrics
    t0: float  # perf_counter when the step started
    # the loss's forward on the same batch again, as the learner now runs it (a compiled loss whose backward
    # does not compile runs eager from then on, and its step again); None without a compiled loss
    rerun_forward: Callable[[], Any] | None = None


@dataclass(frozen=True)
class LearnOutput:
    """What one train step returns to the driver."""

    priorities: np.ndarray  # [B] float32
    metrics: dict[str, float]


class Learner:
    """Trains one policy's model; the driver calls :meth:`train_step` with batches it built."""

    def __init__(self, cfg: ExperimentConfig, policy: Policy):
        self.cfg = cfg
        self.policy = policy
        lc = cfg.learn
        self.device = resolve_device(lc.device)
        torch.manual_seed(cfg.seed)
        self.model = place_model(
            policy.build_model(), device=self.device, channels_last=cfg.model.channels_last
        )
        self.target_model = copy.deepcopy(self.model)
        self.target_model.requires_grad_(False)
        self.target_model.eval()
        self._params = list(self.model.parameters())  # walked once: clip_grad_norm_ per step takes the list
        self.optimizer = make_optimizer(lc, self._params)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(lc, s))
        self.train_iter = 0
        self.train_time_s = 0.0
        # the loss forward's autocast dtype (learn.mixed_precision), None: fp32
        self.autocast_dtype = autocast_dtype(self.device) if lc.mixed_precision else None
        self._scaler = torch.amp.GradScaler("cuda", enabled=self.autocast_dtype == torch.float16)
        # learn.overlap_bootstrap: one helper thread for the target network's bootstrap forward (None: the
        # forward runs first, on the caller's thread)
        self.bootstrap_helper = torch_thread_pool("learner-bootstrap") if lc.overlap_bootstrap else None
        # learn.num_threads: the loss's forward gets all but the bootstrap helper's one (at least one), and so
        # does the backward where the helper works beside it too (the driver's next batch's bootstrap forward:
        # learn.prefetch_next_batch); else the backward and optimizer step get them all. Set by the config,
        # never by whether a step had a batch built ahead, so the gradients round the same either way
        helper_threads = int(self.bootstrap_helper is not None)
        self.forward_threads = max(1, lc.num_threads - helper_threads)
        busy_beside_backward = helper_threads and lc.prefetch_next_batch
        self.backward_threads = self.forward_threads if busy_beside_backward else lc.num_threads
        # learn.helper_ssl_encodings: the last SSL target encodings on the helper (None: all on this thread)
        self.ssl_offload = self._make_ssl_offload()
        self.target_version = 0  # counts the target network's changes (DriverCore's prefetch checks it)
        # the loss: policy.compute_loss(model, batch, train_iter=, ...); a data-parallel learner stands in
        # its DistributedDataParallel wrapper (muzero_tune.distributed.learner_group)
        self.loss_fn: Callable[..., Any] = policy.compute_loss
        # learn.compile: the loss compiled, and with learn.compile_optimizer_step the optimizer's step
        # (None: eager); their first calls' wall time is compile_s
        self.compiled_loss: CompiledLoss | None = None
        self.compiled_optimizer_step: CompiledOptimizerStep | None = None
        if lc.compile != "off":
            cpp_wrapper = lc.compile_cpp_wrapper and self.device.type == "cpu"
            if self.device.type == "cpu":  # beside the work before the first step
                start_inductor_prework()
            self.compiled_loss = CompiledLoss(
                policy.compute_loss,
                mode=lc.compile,
                device=self.device,
                policy_name=policy.name,
                cpp_wrapper=cpp_wrapper,
                eager_inputs=policy.eager_loss_inputs,
            )
            self.loss_fn = self.compiled_loss
            scaler_on = self._scaler.is_enabled()
            if lc.compile_optimizer_step and optimizer_step_compiles(lc.lr_schedule, scaler_on):
                self.compiled_optimizer_step = CompiledOptimizerStep(
                    self.optimizer, mode=lc.compile, policy_name=policy.name, cpp_wrapper=cpp_wrapper
                )

    def _make_ssl_offload(self) -> SslOffload | None:
        lc = self.cfg.learn
        if lc.helper_ssl_encodings == 0 or lc.ssl_loss_weight == 0 or lc.compile != "off":
            return None  # a compiled loss encodes its SSL targets in its graph
        if not self.policy.ssl_latent_seam:  # before anything runs: the driver builds the learner first
            raise ConfigError(
                "learn.helper_ssl_encodings",
                lc.helper_ssl_encodings,
                f"policy.type={self.policy.name}'s loss computes its SSL targets itself; set it to 0",
            )
        helper = self.bootstrap_helper
        if helper is None:  # learn.overlap_bootstrap=false: no helper thread (validate() warns)
            return None

        def in_context(fn):  # the loss thread's precision and intra-op threads: kernels round the same
            with intra_op_threads(self.forward_threads):
                return self.in_precision(fn)

        return SslOffload(
            self.model, count=lc.helper_ssl_encodings, submit=helper.submit, in_context=in_context
        )

    def start_bootstrap(self, batch: TrainBatch) -> TrainBatch:
        """``batch`` with its deferred bootstrap forward started on the helper thread (as is without one)."""
        helper = self.bootstrap_helper
        if helper is None:
            return batch
        return start_bootstrap(
            batch, lambda fn: helper.submit(self.in_precision, fn), self.cfg.learn.bootstrap_piece_rows
        )

    def target_stays(self) -> bool:
        """Whether the target network stays as it is through this step (no hard copy due, no soft update):
        then a batch built now, the next one's bootstrap values included, is the one the next step would
        build."""
        lc = self.cfg.learn
        return lc.target_update_tau == 0 and (self.train_iter + 1) % lc.target_update_interval != 0

    def train_step(
        self, batch: TrainBatch, *, after_forward: Callable[[np.ndarray], None] | None = None
    ) -> LearnOutput:
        """One optimizer step on ``batch`` (its deferred bootstrap values first, with the target network as
        it is before this step's update); updates the target network per its schedule.

        ``after_forward(priorities)``: called on this thread with the new priorities [B] float32 once the
        loss's forward is done, before the backward (the driver writes them back and may build the next
        batch there, its bootstrap forward then running on the helper beside this backward)."""
        step = self.forward_loss(batch)
        if after_forward is not None:
            after_forward(step.out.priorities)
        return self.finish_step(step)

    def forward_loss(self, batch: TrainBatch) -> StepInProgress:
        """The first half of :meth:`train_step`: the loss's forward on ``batch`` (with its bootstrap values);
        the priorities are known after it. :meth:`finish_step` does the rest."""
        lc = self.cfg.learn
        t0 = time.perf_counter()
        if not self.model.training:  # Module.train() walks every submodule: only when it changes
            self.model.train()
        kwargs = {}
        pending = None
        if self.ssl_offload is not None and batch.obs.shape[1] > 1:
            # queued on the helper before this batch's bootstrap forward (the loss needs them mid-unroll, its
            # value targets last), after it where the driver started that forward already
            pending = self.ssl_offload.start(batch.obs, batch.actions.shape[1])
            kwargs["ssl_latent"] = pending.latent
        # the target network's bootstrap forward, in the loss's precision: beside the loss's forward on the
        # helper thread (autocast is per thread, so it is entered there), or first on this one
        if self.bootstrap_helper is not None:
            batch = self.start_bootstrap(batch)
        else:
            batch = self.in_precision(resolve_bootstrap, batch, lc.bootstrap_piece_rows)
        train_iter = self.train_iter

        def run_forward() -> Any:
            with intra_op_threads(self.forward_threads):
                return self.in_precision(self.loss_fn, self.model, batch, train_iter=train_iter, **kwargs)

        try:
            out = run_forward()
        finally:
            if pending is not None:
                pending.cancel()  # a no-op after a loss that took them all
        self._check_finite(out)
        rerun = run_forward if self.compiled_loss is not None and self.compiled_loss.compiled else None
        return StepInProgress(out=out, t0=t0, rerun_forward=rerun)

    def _check_finite(self, out: LossOutput) -> None:
        """Stop at the first step whose loss or priorities are not finite: its backward would write nan into
        every weight, and the priorities into the buffer."""
        total = out.metrics.get("train/loss_total", 0.0)
        if math.isfinite(total) and np.isfinite(out.priorities).all():
            return
        lc = self.cfg.learn
        raise DivergedError(
            f"training diverged at train_iter {self.train_iter}: the loss is {total} (priorities finite: "
            f"{bool(np.isfinite(out.priorities).all())}); a step's size comes from "
            f"learn.learning_rate={lc.learning_rate}, learn.weight_decay={lc.weight_decay}, "
            f"learn.grad_clip_norm={lc.grad_clip_norm} and the loss weights: lower them"
        )

    def finish_step(self, step: StepInProgress) -> LearnOutput:
        """The second half of :meth:`train_step`: backward, gradient clipping, optimizer and LR steps, the
        target network's update."""
        lc = self.cfg.learn
        out = step.out
        with intra_op_threads(self.backward_threads):
            self.optimizer.zero_grad(set_to_none=True)
            if self.compiled_loss is not None:  # its first backward compiles the backward graph
                out = self._compiled_backward(step)
            else:
                self._scaler.scale(out.loss).backward()
            self._scaler.unscale_(self.optimizer)
            grad_norm = clip_grad_norm(self._params, lc.grad_clip_norm)
            if self.compiled_optimizer_step is not None:  # no gradient scaler: optimizer_step_compiles
                self.compiled_optimizer_step()
            else:
                self._scaler.step(self.optimizer)
                self._scaler.update()
        self.scheduler.step()
        self.train_iter += 1
        self._update_target()
        self.train_time_s += time.perf_counter() - step.t0
        metrics = dict(out.metrics)
        metrics["train/grad_norm"] = grad_norm
        metrics["train/lr"] = float(self.optimizer.param_groups[0]["lr"])
        compiled = (self.compiled_loss, self.compiled_optimizer_step)
        compile_s = [c.compile_s for c in compiled if c is not None and c.compile_s is not None]
        if compile_s:
            metrics["train/compile_s"] = sum(compile_s)
        return LearnOutput(priorities=step.out.priorities, metrics=metrics)

    def _compiled_backward(self, step: StepInProgress) -> Any:
        """The compiled loss's backward of ``step``; where its backward graph does not compile (the compiled
        loss warned and runs eager from now on), the step's forward again, eager, and its backward. Returns
        the loss output whose gradients the parameters hold."""
        assert self.compiled_loss is not None
        if self.compiled_loss.backward(self._scaler.scale(step.out.loss)):
            return step.out
        assert step.rerun_forward is not None  # set while the loss compiled
        out = step.rerun_forward()
        self._check_finite(out)
        self._scaler.scale(out.loss).backward()
        return out

    def target_changed_at(self, train_iter: int) -> bool:
        """Whether the step that made ``train_iter`` updated the target network."""
        lc = self.cfg.learn
        return lc.target_update_tau > 0 or train_iter % lc.target_update_interval == 0

    def train_budget_done(self) -> None:
        """One collect's train budget finished: the policy's hook on the trained and target models."""
        self.policy.on_train_budget_done(self.model, self.target_model)

    def in_precision(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` under the learner's autocast (``learn.mixed_precision``; fp32: as is)."""
        amp = self.autocast_dtype
        with torch.autocast(self.device.type, dtype=amp or torch.float32, enabled=amp is not None):
            return fn(*args, **kwargs)

    def _update_target(self) -> None:
        lc = self.cfg.learn
        if lc.target_update_tau > 0:
            with torch.no_grad():
                for p_t, p in zip(self.target_model.parameters(), self.model.parameters()):
                    p_t.lerp_(p, lc.target_update_tau)
                for b_t, b in zip(self.target_model.buffers(), self.model.buffers()):
                    b_t.copy_(b)
        elif self.target_changed_at(self.train_iter):
            self.target_model.load_state_dict(self.model.state_dict())
        else:
            return
        self.target_version += 1

    def close(self) -> None:
        """Stop the helper thread (the learner is not stepped after this)."""
        if self.bootstrap_helper is not None:
            self.bootstrap_helper.shutdown(wait=False, cancel_futures=True)

    def weights_snapshot(self) -> dict[str, torch.Tensor]:
        """A CPU copy of the model weights (immutable snapshot for actors and evaluation)."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "target_model": self.target_model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self._scaler.state_dict(),
            "train_iter": self.train_iter,
            "train_time_s": self.train_time_s,
            "rng": rng_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.target_model.load_state_dict(state["target_model"])
        self.target_version += 1
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            self._scaler.load_state_dict(state["scaler"])
        self.train_iter = int(state["train_iter"])
        self.train_time_s = float(state.get("train_time_s", 0.0))
        set_rng_state(state["rng"])
