"""Networks for continuous actions: the MLP MuZero / EfficientZero networks with a Gaussian policy head.

What this module owns
    :class:`MLPGaussianMuZeroNet`, :class:`MLPGaussianEfficientZeroNet` and :class:`ConvGaussianMuZeroNet`
    (image observations: the action vector enters the dynamics as D constant planes): the networks of
    :mod:`muzero_tune.models.muzero_net` / :mod:`~muzero_tune.models.efficientzero_net` whose dynamics takes
    the action vector ``[B, D]`` in [-1, 1] (instead of a one-hot) and whose policy head outputs the
    parameters of a tanh-squashed diagonal Gaussian, ``[mu (D), log_sigma (D)]`` ``[B, 2D]``. The sampled
    search (:mod:`muzero_tune.mcts.sampled`) reads those parameters; :func:`tanh_gaussian_log_prob` is the
    density the policy loss uses. Discrete sampled policies use the plain networks (logits over A).

What it must never do
    Squash or clamp inside the network: ``mu`` is unbounded and ``log_sigma`` is clamped where it is used
    (:data:`LOG_SIGMA_MIN` .. :data:`LOG_SIGMA_MAX`, the same bounds as the search's), so the search and
    the loss see one distribution.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from muzero_tune.mcts.sampled_kernels import LOG_SIGMA_MAX, LOG_SIGMA_MIN, TANH_EPS
from muzero_tune.models.efficientzero_net import MLPEfficientZeroNet
from muzero_tune.models.muzero_net import ConvMuZeroNet, MLPMuZeroNet, _conv3x3, normalize_latent

ACTION_CLAMP = 1.0 - 1e-6  # atanh of stored actions is taken inside (-1, 1)


def gaussian_head(in_features: int, action_dim: int, *, init_scale: float = 3e-3) -> nn.Linear:
    """Linear [in] -> [2D] (mu, log_sigma) with small uniform weights and zero bias: a near-standard
    Gaussian at initialisation (mu ~ 0, sigma ~ 1), as the reference's reparameterisation head."""
    layer = nn.Linear(in_features, 2 * action_dim)
    nn.init.uniform_(layer.weight, -init_scale, init_scale)
    nn.init.zeros_(layer.bias)
    return layer


def split_gaussian(params: Tensor) -> tuple[Tensor, Tensor]:
    """[..., 2D] -> (mu [..., D], log_sigma [..., D] clamped to the search's bounds)."""
    d = params.shape[-1] // 2
    return params[..., :d], params[..., d:].clamp(LOG_SIGMA_MIN, LOG_SIGMA_MAX)


def tanh_gaussian_log_prob(params: Tensor, actions: Tensor) -> Tensor:
    """log q(a) of actions [..., K, D] in [-1, 1] under tanh(N(mu, sigma)) with params [..., 2D] -> [..., K].

    q(a) = N(atanh a; mu, sigma) / prod_d (1 - a_d^2), with the search's 1e-6 in the correction and the
    actions clamped to +-(1 - 1e-6) before atanh. Computed in at least fp32 (the result's dtype): in bf16 that
    clamp rounds to 1 and atanh(1) is inf, so bf16 params (a head under ``learn.mixed_precision``) are
    promoted; fp32 and fp64 inputs run as they are."""
    dtype = torch.promote_types(params.dtype, torch.float32)
    params, actions = params.to(dtype), actions.to(dtype)
    mu, log_sigma = split_gaussian(params)
    mu, log_sigma = mu.unsqueeze(-2), log_sigma.unsqueeze(-2)  # [..., 1, D]
    a = actions.clamp(-ACTION_CLAMP, ACTION_CLAMP)
    z = (torch.atanh(a) - mu) * torch.exp(-log_sigma)
    log_normal = -0.5 * z * z - log_sigma - 0.5 * math.log(2.0 * math.pi)
    return (log_normal - torch.log(1.0 - a * a + TANH_EPS)).sum(-1)


def gaussian_entropy(params: Tensor) -> Tensor:
    """Entropy of the pre-tanh diagonal Gaussian, summed over D: [..., 2D] -> [...]."""
    _, log_sigma = split_gaussian(params)
    return (0.5 + 0.5 * math.log(2.0 * math.pi) + log_sigma).sum(-1)


class _ContinuousActions:
    """Dynamics input = the action vector [B, D]; policy head = :func:`gaussian_head`."""

    action_dim: int

    def action_features(self, action: Tensor, latent: Tensor) -> Tensor:
        b = latent.shape[0]
        action = action.reshape(b, -1).to(latent.dtype)
        if action.shape[1] != self.action_dim:
            raise ValueError(f"expected actions [B, {self.action_dim}], got {tuple(action.shape)}")
        return action

    def _gaussian_policy(self, action_dim: int) -> None:
        self.action_dim = action_dim
        self.pred_policy = gaussian_head(self.pred_policy.in_features, action_dim)


class MLPGaussianMuZeroNet(_ContinuousActions, MLPMuZeroNet):
    """MLP MuZero network over continuous actions (``num_actions`` is the action input width D)."""

    def __init__(self, *, action_dim: int, **kwargs) -> None:
        super().__init__(num_actions=action_dim, **kwargs)
        self._gaussian_policy(action_dim)


class MLPGaussianEfficientZeroNet(_ContinuousActions, MLPEfficientZeroNet):
    """MLP EfficientZero network (value-prefix LSTM) over continuous actions."""

    def __init__(self, *, action_dim: int, **kwargs) -> None:
        super().__init__(num_actions=action_dim, **kwargs)
        self._gaussian_policy(action_dim)


class ConvGaussianMuZeroNet(ConvMuZeroNet):
    """Residual conv MuZero network (image observations) over continuous actions: the action vector
    [B, D] in [-1, 1] enters the dynamics as D constant planes beside the latent [B, C, h, w]; the policy
    head ends in :func:`gaussian_head` ([B, 2D])."""

    def __init__(self, *, action_dim: int, **kwargs) -> None:
        super().__init__(num_actions=action_dim, **kwargs)
        self.action_dim = action_dim
        c = self.latent_shape[0]
        self.dyn_conv = _conv3x3(c + action_dim, c)
        self.policy_head.fc2 = gaussian_head(self.policy_head.fc2.in_features, action_dim)

    def dynamics(self, latent: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        b, _, h, w = latent.shape
        action = action.reshape(b, -1).to(latent.dtype)
        if action.shape[1] != self.action_dim:
            raise ValueError(f"expected actions [B, {self.action_dim}], got {tuple(action.shape)}")
        planes = action[:, :, None, None].expand(b, self.action_dim, h, w)
        x = self.dyn_bn(self.dyn_conv(torch.cat([latent, planes], dim=1)))  # [B, C, h, w]
        x = self.dyn_res(torch.relu(x + latent))
        return normalize_latent(x), self.reward_head(x)  # [B, C, h, w], [B, 2Sr+1]
