"""Networks for factored actions: a ``MultiDiscrete(nvec)`` action taken by its D factors.

What this module owns
    The factored policy head and action input the sampled types use on a ``MultiDiscrete`` action space
    taken by its factors (``EnvSpec.action_kind == "factored"``; actions are int64 ``[..., D]`` vectors of
    factor indices, ``0 <= a_d < n_d``):

    * the policy is a product of D independent categoricals; its parameters are the factors' logits laid
      end to end, ``[..., P]`` with P = sum(nvec) (factor d's logits at ``offsets[d] .. offsets[d] + n_d``);
      :func:`factored_log_prob` is the joint log-probability ``sum_d log softmax(logits_d)[a_d]`` the policy
      loss uses, :func:`factored_entropy` the joint entropy ``sum_d H(softmax(logits_d))``;
    * the action fed to the dynamics is the concatenated one-hot per factor ``[B, P]``
      (:func:`factor_one_hot`), or per-factor embeddings summed for the transformer's action token
      (:class:`FactorEmbedding`);
    * :class:`MLPFactoredMuZeroNet`, :class:`MLPFactoredEfficientZeroNet` and :class:`ConvFactoredMuZeroNet`:
      the plain networks with P policy logits and that action input (the conv network takes the one-hot as
      P constant planes beside its latent).

    The search samples from the same parameters (:mod:`muzero_tune.mcts.sampled_kernels`), so the search and
    the loss see one distribution.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from muzero_tune.models.efficientzero_net import MLPEfficientZeroNet
from muzero_tune.models.muzero_net import ConvMuZeroNet, MLPMuZeroNet, _conv3x3, normalize_latent

__all__ = [
    "ConvFactoredMuZeroNet",
    "FactorEmbedding",
    "MLPFactoredEfficientZeroNet",
    "MLPFactoredMuZeroNet",
    "factor_offsets",
    "factor_one_hot",
    "factored_entropy",
    "factored_log_prob",
]


def _nvec(nvec: Sequence[int]) -> tuple[int, ...]:
    sizes = tuple(int(n) for n in nvec)
    if not sizes or min(sizes) < 1:
        raise ValueError(f"nvec must list one size >= 1 per factor, got {nvec!r}")
    return sizes


def factor_offsets(nvec: Sequence[int]) -> tuple[int, ...]:
    """Where each factor's logits start in the ``[P]`` parameters: ``(0, n_1, n_1 + n_2, ...)``, D of them."""
    sizes, out, total = _nvec(nvec), [], 0
    for n in sizes:
        out.append(total)
        total += n
    return tuple(out)


def _factor_log_softmax(logits: Tensor, nvec: Sequence[int]) -> list[Tensor]:
    """[..., P] -> D tensors [..., n_d] of per-factor log-probabilities, in at least fp32."""
    sizes = _nvec(nvec)
    if logits.shape[-1] != sum(sizes):
        raise ValueError(f"expected {sum(sizes)} factor logits (nvec {list(sizes)}), got {logits.shape[-1]}")
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return [F.log_softmax(part, dim=-1) for part in torch.split(logits, sizes, dim=-1)]


def factored_log_prob(logits: Tensor, actions: Tensor, nvec: Sequence[int]) -> Tensor:
    """Joint log-probabilities of K factored actions: ``logits`` [..., P], ``actions`` [..., K, D] (factor
    indices, any numeric dtype) -> [..., K], ``sum_d log softmax(logits_d)[a_d]``. Computed in at least
    fp32 (the result's dtype)."""
    actions = actions.long()
    if actions.shape[-1] != len(nvec):
        raise ValueError(f"expected actions [..., K, {len(nvec)}], got {tuple(actions.shape)}")
    total = None
    for d, logp in enumerate(_factor_log_softmax(logits, nvec)):
        index = actions[..., d]  # [..., K]
        term = logp.unsqueeze(-2).expand(*index.shape, logp.shape[-1]).gather(-1, index.unsqueeze(-1))[..., 0]
        total = term if total is None else total + term
    return total


def factored_entropy(logits: Tensor, nvec: Sequence[int]) -> Tensor:
    """Entropy of the product of categoricals, ``sum_d H(softmax(logits_d))``: [..., P] -> [...]."""
    return sum(-(logp.exp() * logp).sum(-1) for logp in _factor_log_softmax(logits, nvec))


def factor_one_hot(actions: Tensor, offsets: Tensor, width: int) -> Tensor:
    """The concatenated one-hot per factor: ``actions`` [B, D] factor indices, ``offsets`` [D] long (see
    :func:`factor_offsets`) -> [B, P] float32, a 1 at ``offsets[d] + a_d`` for every d."""
    return F.one_hot(actions.long() + offsets, width).sum(-2).float()


class _FactoredActions:
    """Dynamics input = :func:`factor_one_hot` [B, P]; policy head = the P factor logits (the base
    network's ``num_actions`` is P)."""

    num_actions: int
    factor_offsets: Tensor

    def _factored(self, nvec: Sequence[int]) -> None:
        self.nvec = _nvec(nvec)
        self.action_dim = len(self.nvec)
        # not a weight: a checkpoint's state dict holds only what training changes
        self.register_buffer("factor_offsets", torch.tensor(factor_offsets(self.nvec)), persistent=False)

    def factor_planes(self, action: Tensor, latent: Tensor) -> Tensor:
        b = latent.shape[0]
        action = action.reshape(b, -1)
        if action.shape[1] != self.action_dim:
            raise ValueError(f"expected actions [B, {self.action_dim}], got {tuple(action.shape)}")
        return factor_one_hot(action, self.factor_offsets, self.num_actions).to(latent.dtype)  # [B, P]

    def action_features(self, action: Tensor, latent: Tensor) -> Tensor:
        return self.factor_planes(action, latent)


class MLPFactoredMuZeroNet(_FactoredActions, MLPMuZeroNet):
    """MLP MuZero network over factored actions: P = sum(nvec) policy logits, one-hot per factor into the
    dynamics."""

    def __init__(self, *, nvec: Sequence[int], **kwargs) -> None:
        super().__init__(num_actions=sum(_nvec(nvec)), **kwargs)
        self._factored(nvec)


class MLPFactoredEfficientZeroNet(_FactoredActions, MLPEfficientZeroNet):
    """MLP EfficientZero network (value-prefix LSTM) over factored actions."""

    def __init__(self, *, nvec: Sequence[int], **kwargs) -> None:
        super().__init__(num_actions=sum(_nvec(nvec)), **kwargs)
        self._factored(nvec)


class ConvFactoredMuZeroNet(_FactoredActions, ConvMuZeroNet):
    """Residual conv MuZero network (image observations) over factored actions: the one-hot per factor
    [B, P] enters the dynamics as P constant planes beside the latent [B, C, h, w]; the policy head gives
    the P factor logits."""

    def __init__(self, *, nvec: Sequence[int], **kwargs) -> None:
        super().__init__(num_actions=sum(_nvec(nvec)), **kwargs)
        self._factored(nvec)
        c = self.latent_shape[0]
        self.dyn_conv = _conv3x3(c + self.num_actions, c)

    def dynamics(self, latent: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        b, _, h, w = latent.shape
        planes = self.factor_planes(action, latent)[:, :, None, None].expand(b, self.num_actions, h, w)
        x = self.dyn_bn(self.dyn_conv(torch.cat([latent, planes], dim=1)))  # [B, C, h, w]
        x = self.dyn_res(torch.relu(x + latent))
        return normalize_latent(x), self.reward_head(x)  # [B, C, h, w], [B, 2Sr+1]


class FactorEmbedding(nn.Module):
    """A factored action's token: the sum of one learned embedding per factor value, ``[N, D]`` factor
    indices (any numeric dtype) -> ``[N, E]`` (the transformer world model's action token)."""

    def __init__(self, nvec: Sequence[int], embed_dim: int) -> None:
        super().__init__()
        self.nvec = _nvec(nvec)
        self.table = nn.Embedding(sum(self.nvec), int(embed_dim))
        self.register_buffer("offsets", torch.tensor(factor_offsets(self.nvec)), persistent=False)

    def forward(self, actions: Tensor) -> Tensor:
        index = actions.reshape(-1, len(self.nvec)).long() + self.offsets  # [N, D]
        return self.table(index).sum(1)  # [N, E]
