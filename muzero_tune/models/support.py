"""Categorical support transforms for value and reward heads.

This module owns the mapping between raw scalars (returns, rewards) and the categorical
distributions that MuZero-family networks predict:

* ``scalar_transform`` / ``inverse_scalar_transform`` -- the invertible squashing function
  h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps * x and its closed-form inverse.
* ``scalar_to_two_hot`` -- a value already in h-space onto integer bins -S..S (two-hot).
* ``scalar_to_target`` -- raw scalar -> two-hot of h(x), the cross-entropy training target.
* ``logits_to_scalar`` -- network logits -> softmax -> expectation over bins -> h^-1.
* ``two_hot_cross_entropy`` -- the cross-entropy of logits against ``scalar_to_target(x)`` without building
  the dense [..., 2S+1] target (two gathers of the log-softmax): the learner's value/reward loss.

A bin layout with ``support_size = S`` has ``2 * S + 1`` bins, bin ``i`` standing for the
integer ``i - S``. All functions work on arbitrary leading batch dimensions ``[...]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import torch
from torch import Tensor

from muzero_tune.models.ops import log_softmax_last

__all__ = [
    "Support",
    "inverse_scalar_transform",
    "logits_to_scalar",
    "scalar_to_target",
    "scalar_to_two_hot",
    "scalar_transform",
    "two_hot_cross_entropy",
]

DEFAULT_EPS = 0.001


def _check_support_size(support_size: int) -> None:
    if isinstance(support_size, bool) or not isinstance(support_size, int) or support_size < 1:
        raise ValueError(f"support_size must be a positive int, got {support_size!r}")


def scalar_transform(x: Tensor, *, eps: float = DEFAULT_EPS) -> Tensor:
    """h(x) = sign(x) * (sqrt(|x| + 1) - 1) + eps * x.

    Shapes: x [...] -> [...] (same dtype; integer input is promoted to float32).
    Compresses large magnitudes so a fixed support covers a wide range of returns
    (Pohlen et al. 2018; MuZero Appendix F).
    """
    x = x if x.is_floating_point() else x.float()
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + eps * x


def inverse_scalar_transform(y: Tensor, *, eps: float = DEFAULT_EPS) -> Tensor:
    """Closed-form h^-1(y).

    Shapes: y [...] -> [...].

    Derivation (why this form): for u = |x| let r = sqrt(u + 1) - 1 >= 0, so u = r^2 + 2r and
    |y| = r + eps * (r^2 + 2r) = eps * r^2 + (1 + 2 eps) * r. Solving the quadratic with the
    "multiply by the conjugate" form r = 2|y| / (b + sqrt(b^2 + 4 eps |y|)), b = 1 + 2 eps, has
    no catastrophic cancellation near y = 0 (unlike the textbook (sqrt(...) - 1) / (2 eps)), and
    stays valid for eps = 0.
    """
    y = y if y.is_floating_point() else y.float()
    a = y.abs()
    b = 1.0 + 2.0 * eps
    r = 2.0 * a / (b + torch.sqrt(b * b + 4.0 * eps * a))
    return torch.sign(y) * r * (r + 2.0)


def scalar_to_two_hot(y: Tensor, *, support_size: int) -> Tensor:
    """Two-hot encoding of ``y`` (already in h-space) over integer bins -S..S.

    Shapes: y [...] -> [..., 2 * S + 1]. Values outside [-S, S] are clipped to the edge bin.
    Each row is non-negative, sums to 1, has at most two non-zeros (adjacent bins) and its
    expectation over the bin values equals the clipped ``y``.
    """
    _check_support_size(support_size)
    y = y if y.is_floating_point() else y.float()
    s = support_size
    y = y.clamp(-s, s)
    low = torch.floor(y)
    upper_w = y - low  # [...] in [0, 1)
    lower_w = 1.0 - upper_w
    low_idx = (low + s).long()  # [...] in [0, 2S]
    # At y == S the upper bin would be 2S + 1 (out of range) but carries weight 0: clamp the index.
    high_idx = (low_idx + 1).clamp(max=2 * s)
    out = torch.zeros(*y.shape, 2 * s + 1, dtype=y.dtype, device=y.device)
    out.scatter_add_(-1, low_idx.unsqueeze(-1), lower_w.unsqueeze(-1))
    out.scatter_add_(-1, high_idx.unsqueeze(-1), upper_w.unsqueeze(-1))
    return out


def scalar_to_target(x: Tensor, *, support_size: int, eps: float = DEFAULT_EPS) -> Tensor:
    """Training target for a raw scalar: two-hot of h(x).

    Shapes: x [...] -> [..., 2 * S + 1].
    """
    return scalar_to_two_hot(scalar_transform(x, eps=eps), support_size=support_size)


def two_hot_cross_entropy(
    logits: Tensor, x: Tensor, *, support_size: int, eps: float = DEFAULT_EPS
) -> Tensor:
    """Cross-entropy of ``logits`` against the two-hot target of the raw scalar ``x``.

    Shapes: logits [..., 2S+1], x [...] -> [...]. Equal to
    ``-(scalar_to_target(x) * log_softmax(logits)).sum(-1)`` (gradient included), but reads the two bins
    of the log-softmax that carry weight instead of materialising the dense target: one log-softmax and
    one gather over all leading dims (the learner calls it once for all unroll steps).
    """
    _check_support_size(support_size)
    s = support_size
    y = scalar_transform(x, eps=eps).clamp(-s, s)
    low = torch.floor(y)
    upper_w = y - low  # [...] in [0, 1)
    low_idx = (low + s).long()
    high_idx = (low_idx + 1).clamp(max=2 * s)  # at y == S the upper bin carries weight 0
    logp = log_softmax_last(logits)  # [..., 2S+1] (ops.py: the faster CPU layout for short supports)
    picked = logp.gather(-1, torch.stack([low_idx, high_idx], dim=-1))  # [..., 2]
    return -((1.0 - upper_w) * picked[..., 0] + upper_w * picked[..., 1])


def logits_to_scalar(logits: Tensor, *, support_size: int, eps: float = DEFAULT_EPS) -> Tensor:
    """Decode categorical logits to a raw scalar: softmax -> expectation over bins -> h^-1.

    Shapes: logits [..., 2 * S + 1] -> [...].
    """
    _check_support_size(support_size)
    n_bins = 2 * support_size + 1
    if logits.shape[-1] != n_bins:
        raise ValueError(
            f"logits last dim must be 2 * support_size + 1 = {n_bins}, got shape {tuple(logits.shape)}"
        )
    probs = torch.softmax(logits, dim=-1)  # [..., 2S+1]
    bins = torch.arange(-support_size, support_size + 1, dtype=probs.dtype, device=probs.device)
    expectation = (probs * bins).sum(dim=-1)  # [...] in h-space
    return inverse_scalar_transform(expectation, eps=eps)


@dataclass(frozen=True)
class Support:
    """A categorical support of ``2 * size + 1`` integer bins -size..size (convenience wrapper).

    The module-level functions are the API; this just binds ``size`` and ``eps``.
    """

    size: int
    eps: float = DEFAULT_EPS

    def __post_init__(self) -> None:
        _check_support_size(self.size)

    @property
    def num_bins(self) -> int:
        return 2 * self.size + 1

    def transform(self, x: Tensor) -> Tensor:
        """h(x); [...] -> [...]."""
        return scalar_transform(x, eps=self.eps)

    def inverse_transform(self, y: Tensor) -> Tensor:
        """h^-1(y); [...] -> [...]."""
        return inverse_scalar_transform(y, eps=self.eps)

    def two_hot(self, y: Tensor) -> Tensor:
        """h-space value -> two-hot; [...] -> [..., num_bins]."""
        return scalar_to_two_hot(y, support_size=self.size)

    def to_target(self, x: Tensor) -> Tensor:
        """Raw scalar -> two-hot of h(x); [...] -> [..., num_bins]."""
        return scalar_to_target(x, support_size=self.size, eps=self.eps)

    def to_scalar(self, logits: Tensor) -> Tensor:
        """Logits -> raw scalar; [..., num_bins] -> [...]."""
        return logits_to_scalar(logits, support_size=self.size, eps=self.eps)


@numba.njit(cache=True)
def _logits_to_scalar_np(logits: np.ndarray, support_size: int, eps: float) -> np.ndarray:  # pragma: no cover
    n, bins = logits.shape
    out = np.empty(n, dtype=np.float32)
    for i in range(n):
        m = logits[i, 0]
        for j in range(1, bins):
            m = max(m, logits[i, j])
        z = 0.0
        e = 0.0
        for j in range(bins):
            p = np.exp(np.float64(logits[i, j]) - m)
            z += p
            e += p * (j - support_size)
        y = e / z
        # h^-1(y) = sign(y) * (((sqrt(1 + 4 eps (|y| + 1 + eps)) - 1) / (2 eps))^2 - 1)
        a = abs(y)
        x = ((np.sqrt(1.0 + 4.0 * eps * (a + 1.0 + eps)) - 1.0) / (2.0 * eps)) ** 2 - 1.0
        out[i] = x if y >= 0 else -x
    return out


def logits_to_scalar_np(logits: np.ndarray, *, support_size: int, eps: float = DEFAULT_EPS) -> np.ndarray:
    """numpy/numba twin of :func:`logits_to_scalar` for the search's hot loop (no per-op torch overhead).

    Shapes: logits [B, 2S+1] -> [B] float32.
    """
    if logits.ndim != 2 or logits.shape[1] != 2 * support_size + 1:
        raise ValueError(f"logits must be [B, {2 * support_size + 1}], got {logits.shape}")
    return _logits_to_scalar_np(np.ascontiguousarray(logits, dtype=np.float32), support_size, eps)
