"""The SSL loss's target encodings on the learner's helper thread, with exactly the serial step's results.

What this module owns
    :class:`SslOffload`: ``learn.helper_ssl_encodings`` = n moves the last n of the SSL consistency loss's K
    target encodings (``model.represent(o_{t+k})`` without grad, k = K-n+1..K) from the loss's thread to the
    learner's helper thread (``learn.overlap_bootstrap``), where they run while the loss unrolls the model.
    Why: with the next batch's bootstrap forward moved beside the previous backward (``DriverCore``'s
    prefetch), the loss's forward is the step's longest serial part on a conv network, and these encodings
    are half of it (Pong: ~44 ms each of a ~290 ms forward).

What it must never do
    Change a value. In train mode a BatchNorm layer normalises with the batch's own statistics, so an
    encoding's output does not depend on when it runs; but each BatchNorm layer also folds the batch's
    statistics into its running mean and variance, an exponential average whose result depends on the order
    of the batches. So the helper runs a *shadow* of the network: the same parameter tensors (an optimizer
    step or a weight load is seen at once), private BatchNorm buffers that it never updates, and a hook that
    records each BatchNorm layer's input. When the loss reaches step k, :meth:`PendingEncodings.latent` hands
    over the latent and folds each recorded input into its live layer's running statistics, in the recorded
    order, at the point where the serial loss would have run that layer: :func:`fold_batch_statistics`
    calls the kernel the training forward uses for that fold (``torch.batch_norm_update_stats``) on the same
    bits, so the running statistics and ``num_batches_tracked`` come out bit-identical
    (``tests/test_learner_overlap.py``), at a tenth of a BatchNorm forward (0.44 against 4.5 ms for Pong's
    largest layer). Folding recorded batch statistics instead is not exact: the kernel keeps its batch mean
    in double precision.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["PendingEncodings", "SslOffload", "fold_batch_statistics", "shadow_network"]

# (BatchNorm layer's name in the network, its input) in the order the shadow's forward called them
Records = list[tuple[str, torch.Tensor]]


def shadow_network(model: nn.Module) -> nn.Module:
    """A twin of ``model`` sharing every parameter tensor, with private BatchNorm buffers it never updates
    (train-mode BatchNorm then normalises with the batch's statistics only: the live layer's output)."""
    shadow = copy.deepcopy(model)
    live = dict(model.named_modules())
    for name, mod in shadow.named_modules():
        for pname in list(mod._parameters):
            mod._parameters[pname] = live[name]._parameters[pname]
        if isinstance(mod, _BatchNorm):
            mod.track_running_stats = False  # forward passes no running buffers: nothing to update
    return shadow


def fold_batch_statistics(bn: _BatchNorm, x: torch.Tensor) -> None:
    """What ``bn(x)`` does to ``bn``'s running statistics in train mode, without computing its output: the
    same ``num_batches_tracked`` step and averaging factor as ``_BatchNorm.forward``, and the same kernel."""
    if not (bn.training and bn.track_running_stats):
        return
    factor = 0.0 if bn.momentum is None else bn.momentum
    if bn.num_batches_tracked is not None:
        bn.num_batches_tracked.add_(1)
        if bn.momentum is None:  # a cumulative moving average
            factor = 1.0 / float(bn.num_batches_tracked)
    torch.batch_norm_update_stats(x, bn.running_mean, bn.running_var, factor)


class SslOffload:
    """The last ``count`` SSL target encodings of each step on ``submit`` (the helper thread's executor).

    ``model``: the learner's live network; ``in_context``: wraps the helper's work in the learner's precision
    and intra-op thread count (the loss thread's, so kernels round the same)."""

    def __init__(
        self,
        model: nn.Module,
        *,
        count: int,
        submit: Callable[..., Future],
        in_context: Callable[[Callable[[], dict]], dict],
    ) -> None:
        self.count = count
        self._submit = submit
        self._in_context = in_context
        self._device = next(model.parameters()).device
        self._live_bn = {n: m for n, m in model.named_modules() if isinstance(m, _BatchNorm)}
        self._shadow = shadow_network(model)
        self._shadow.train()
        self._records: Records | None = None  # set by the helper's job while it runs
        for name, mod in self._shadow.named_modules():
            if isinstance(mod, _BatchNorm):
                mod.register_forward_pre_hook(self._recorder(name))

    def _recorder(self, name: str):
        def hook(_module, inputs):
            if self._records is not None:
                self._records.append((name, inputs[0]))

        return hook

    def start(self, obs: np.ndarray, num_unroll_steps: int) -> PendingEncodings:
        """Submit the encodings of ``obs[:, k]`` ([B, K+1, *obs_shape]) for the last ``count`` steps k,
        one job each, in step order."""
        steps = range(max(1, num_unroll_steps - self.count + 1), num_unroll_steps + 1)
        jobs = {k: self._submit(self._in_context, lambda k=k: self._encode(obs, k)) for k in steps}
        return PendingEncodings(jobs, self._live_bn)

    def _encode(self, obs: np.ndarray, k: int) -> tuple[torch.Tensor, Records]:
        """(latent of ``obs[:, k]`` [B, *latent_shape], the BatchNorm inputs it recorded); helper thread."""
        records: Records = []
        self._records = records
        try:
            with torch.no_grad():
                latent = self._shadow.represent(torch.as_tensor(obs[:, k], device=self._device))
        finally:
            self._records = None
        return latent, records


class PendingEncodings:
    """One step's offloaded SSL target encodings: step k -> its running (or finished) helper job."""

    def __init__(self, jobs: dict[int, Future], live_bn: dict[str, _BatchNorm]) -> None:
        self._jobs = jobs
        self._live_bn = live_bn

    def latent(self, k: int) -> torch.Tensor | None:
        """The target latent of step ``k`` (None: not offloaded, encode it in place). Waits for the job, then
        runs the live BatchNorm layers on its recorded inputs (their running statistics as the serial
        encoding would leave them); call it where the serial loss encodes step k."""
        job = self._jobs.pop(k, None)
        if job is None:
            return None
        latent, records = job.result()
        with torch.no_grad():
            for name, x in records:
                fold_batch_statistics(self._live_bn[name], x)
        return latent

    def cancel(self) -> None:
        """Drop jobs the loss did not take (a loss that raised): cancel those not started, wait for the rest,
        so no helper job reads the network after the step moves on."""
        for job in self._jobs.values():
            if not job.cancel():
                try:
                    job.result()
                except Exception:  # noqa: BLE001 - the loss's own error is the one reported
                    pass
        self._jobs.clear()
