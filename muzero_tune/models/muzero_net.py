"""MuZero networks: representation, dynamics, prediction and SSL projection.

This module owns the neural networks of the MuZero family and their output containers:

* ``InitialOutput`` / ``RecurrentOutput`` -- frozen dataclasses returned by inference.
* ``MuZeroNetwork`` -- the base class fixing the interface used by MCTS and the learner
  (``initial_inference``, ``recurrent_inference``, ``represent``, ``project``).
* ``MLPMuZeroNet`` -- fully connected variant for vector observations.
* ``ConvMuZeroNet`` -- residual conv variant with the MuZero Atari-style downsampling stem.
* ``build_network`` -- factory keyed by ``model.kind``.

Value and reward heads output logits over a categorical support (see ``support.py``); the
networks never decode them. Hidden states are min-max normalised to [0, 1] per sample after
representation and after every dynamics step (MuZero paper, Appendix G) so that the dynamics
input has the same scale as the representation output.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "ConvMuZeroNet",
    "InitialOutput",
    "MLPMuZeroNet",
    "MuZeroNetwork",
    "RecurrentOutput",
    "build_network",
    "normalize_latent",
]

NETWORK_KINDS = ("conv", "mlp")


# --------------------------------------------------------------------------------------------
# Output containers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InitialOutput:
    """Result of ``initial_inference`` (B = batch, A = actions, Sv = value support size)."""

    latent: Tensor  # [B, *latent_shape], values in [0, 1]
    value_logits: Tensor  # [B, 2Sv+1]
    policy_logits: Tensor  # [B, A]


@dataclass(frozen=True)
class RecurrentOutput:
    """Result of ``recurrent_inference`` (Sr = reward support size)."""

    latent: Tensor  # [B, *latent_shape], values in [0, 1]
    reward_logits: Tensor  # [B, 2Sr+1]
    value_logits: Tensor  # [B, 2Sv+1]
    policy_logits: Tensor  # [B, A]


# --------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------


def normalize_latent(latent: Tensor, *, eps: float = 1e-5) -> Tensor:
    """Min-max normalise each sample of ``latent`` to [0, 1].

    Shapes: [B, ...] -> [B, ...]. The range is floored at ``eps`` so a constant latent maps to
    zeros instead of dividing by zero.
    """
    flat = latent.flatten(1)  # [B, N]
    lo = flat.min(dim=1, keepdim=True).values  # [B, 1]
    hi = flat.max(dim=1, keepdim=True).values  # [B, 1]
    scaled = (flat - lo) / (hi - lo).clamp_min(eps)
    return scaled.view_as(latent)


def _zero_init(layer: nn.Linear) -> nn.Linear:
    """Zero the weights and bias so the logits start uniform, i.e. decode to exactly 0."""
    nn.init.zeros_(layer.weight)
    nn.init.zeros_(layer.bias)
    return layer


def _check_positive(name: str, value: int, *, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


class MuZeroNetwork(nn.Module):
    """Interface shared by every MuZero network.

    Subclasses implement ``represent``, ``dynamics``, ``predict`` and ``project`` and set the
    attributes ``latent_shape``, ``num_actions``, ``value_support_size``, ``reward_support_size``.
    The inference entry points are defined here once so that all variants behave the same.
    """

    latent_shape: tuple[int, ...]
    num_actions: int
    value_support_size: int
    reward_support_size: int
    # True where recurrent_inference's (initial_inference's) control flow depends on shapes only and never
    # on the batch size, so one traced graph of it is exact at every batch size (models/traced.py: the
    # search's recurrent call, the learner's bootstrap values); a network that branches on values keeps False
    traceable_recurrent: bool = False
    traceable_initial: bool = False
    # True where models/host.py may run recurrent_inference as its numba kernel (it checks the layout too)
    host_recurrent: bool = False

    # -- pieces implemented by subclasses ----------------------------------------------------

    def represent(self, obs: Tensor) -> Tensor:
        """Representation function: obs [B, *obs_shape] -> normalised latent [B, *latent_shape]."""
        raise NotImplementedError

    def dynamics(self, latent: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """Dynamics: (latent [B, *latent_shape], action [B]) -> (next latent, reward logits [B, 2Sr+1])."""
        raise NotImplementedError

    def predict(self, latent: Tensor) -> tuple[Tensor, Tensor]:
        """Prediction: latent [B, *latent_shape] -> (value logits [B, 2Sv+1], policy logits [B, A])."""
        raise NotImplementedError

    def project(self, latent: Tensor, *, with_prediction_head: bool) -> Tensor:
        """SimSiam-style projection for the SSL consistency loss: latent -> [B, P].

        The online branch (latent produced by dynamics) uses ``with_prediction_head=True``; the
        target branch (``represent`` of the true next observation, detached by the caller) uses
        ``False``.
        """
        raise NotImplementedError

    # -- common entry points -----------------------------------------------------------------

    def initial_inference(self, obs: Tensor) -> InitialOutput:
        """obs [B, *obs_shape] (uint8 or float) -> latent, value logits, policy logits."""
        latent = self.represent(obs)
        value_logits, policy_logits = self.predict(latent)
        return InitialOutput(latent=latent, value_logits=value_logits, policy_logits=policy_logits)

    def recurrent_inference(self, latent: Tensor, action: Tensor) -> RecurrentOutput:
        """latent [B, *latent_shape], action [B] (long) -> next latent, reward, value, policy."""
        next_latent, reward_logits = self.dynamics(latent, action)
        value_logits, policy_logits = self.predict(next_latent)
        return RecurrentOutput(
            latent=next_latent,
            reward_logits=reward_logits,
            value_logits=value_logits,
            policy_logits=policy_logits,
        )

    # -- input handling ----------------------------------------------------------------------

    def _prepare_obs(self, obs: Tensor) -> Tensor:
        """uint8 images -> float in [0, 1]; other inputs cast to the parameter dtype."""
        dtype = self._param_dtype()
        if obs.dtype == torch.uint8:
            return obs.to(dtype) / 255.0
        return obs.to(dtype)

    def _prepare_action(self, action: Tensor, batch: int) -> Tensor:
        """Accept [B] or [B, 1] integer actions; return [B] long."""
        action = action.reshape(-1).long()
        if action.shape[0] != batch:
            raise ValueError(f"action batch {action.shape[0]} does not match latent batch {batch}")
        return action

    def _param_dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype


# --------------------------------------------------------------------------------------------
# MLP variant
# --------------------------------------------------------------------------------------------


def _mlp_trunk(in_dim: int, hidden_dim: int, num_layers: int) -> tuple[nn.Sequential, int]:
    """``num_layers`` x (Linear -> LayerNorm -> ReLU); returns the module and its output width."""
    layers: list[nn.Module] = []
    width = in_dim
    for _ in range(num_layers):
        layers += [nn.Linear(width, hidden_dim), nn.LayerNorm(hidden_dim), nn.ReLU()]
        width = hidden_dim
    return nn.Sequential(*layers), width


class MLPMuZeroNet(MuZeroNetwork):
    """Fully connected MuZero network for flat (or flattenable) vector observations.

    * representation: obs [B, obs_dim] -> trunk -> Linear -> latent [B, latent_dim]
    * dynamics: concat(latent, one-hot action) -> trunk -> hidden; next latent and reward
      logits are both linear heads on that hidden feature
    * prediction: latent -> trunk -> value logits / policy logits (linear heads)
    * projection: latent -> Linear -> LN -> ReLU -> Linear -> LN  (-> predictor bottleneck)

    The value and reward heads are zero-initialised so the first predictions decode to 0.
    """

    # shape-only control flow: the search and the bootstrap values call traced twins (models/traced.py)
    traceable_recurrent = True
    traceable_initial = True
    # the search's call runs as one numba kernel on CPU (models/host.py; a subclass that overrides the
    # dynamics or prediction falls back to the traced call by itself)
    host_recurrent = True

    def __init__(
        self,
        *,
        obs_dim: int,
        num_actions: int,
        latent_dim: int = 64,
        hidden_dim: int = 128,
        num_hidden_layers: int = 1,
        value_support_size: int = 300,
        reward_support_size: int = 300,
        projection_dim: int = 128,
    ) -> None:
        super().__init__()
        _check_positive("obs_dim", obs_dim)
        _check_positive("num_actions", num_actions)
        _check_positive("latent_dim", latent_dim)
        _check_positive("hidden_dim", hidden_dim)
        _check_positive("num_hidden_layers", num_hidden_layers, minimum=0)
        _check_positive("value_support_size", value_support_size)
        _check_positive("reward_support_size", reward_support_size)
        _check_positive("projection_dim", projection_dim)

        self.obs_dim = obs_dim
        self.num_actions = num_actions
        self.latent_shape = (latent_dim,)
        self.value_support_size = value_support_size
        self.reward_support_size = reward_support_size
        self.projection_dim = projection_dim

        self.repr_trunk, width = _mlp_trunk(obs_dim, hidden_dim, num_hidden_layers)
        self.repr_out = nn.Linear(width, latent_dim)

        self.dyn_trunk, width = _mlp_trunk(latent_dim + num_actions, hidden_dim, num_hidden_layers)
        self.dyn_latent = nn.Linear(width, latent_dim)
        self.dyn_reward = _zero_init(nn.Linear(width, 2 * reward_support_size + 1))

        self.pred_trunk, width = _mlp_trunk(latent_dim, hidden_dim, num_hidden_layers)
        self.pred_value = _zero_init(nn.Linear(width, 2 * value_support_size + 1))
        self.pred_policy = nn.Linear(width, num_actions)

        self.projection = nn.Sequential(
            nn.Linear(latent_dim, hidden_dim),
            nn.LayerNorm(hidden_dim),
            nn.ReLU(),
            nn.Linear(hidden_dim, projection_dim),
            nn.LayerNorm(projection_dim),
        )
        # SimSiam predictor: a bottleneck (P -> P/4 -> P) on the online branch only.
        bottleneck = max(1, projection_dim // 4)
        self.projection_head = nn.Sequential(
            nn.Linear(projection_dim, bottleneck),
            nn.LayerNorm(bottleneck),
            nn.ReLU(),
            nn.Linear(bottleneck, projection_dim),
        )

    def represent(self, obs: Tensor) -> Tensor:
        x = self._prepare_obs(obs).flatten(1)  # [B, obs_dim]
        if x.shape[1] != self.obs_dim:
            raise ValueError(f"expected {self.obs_dim} observation features, got shape {tuple(obs.shape)}")
        return normalize_latent(self.repr_out(self.repr_trunk(x)))  # [B, latent_dim]

    def action_features(self, action: Tensor, latent: Tensor) -> Tensor:
        """The dynamics' action input: one-hot [B, A] of [B] integer actions (continuous-action networks
        override this to take the action vector, see :mod:`muzero_tune.models.sampled_net`)."""
        action = self._prepare_action(action, latent.shape[0])
        return F.one_hot(action, self.num_actions).to(latent.dtype)  # [B, A]

    def dynamics(self, latent: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        hidden = self.dyn_trunk(torch.cat([latent, self.action_features(action, latent)], dim=1))  # [B, H]
        next_latent = normalize_latent(self.dyn_latent(hidden))  # [B, latent_dim]
        return next_latent, self.dyn_reward(hidden)  # [B, 2Sr+1]

    def predict(self, latent: Tensor) -> tuple[Tensor, Tensor]:
        hidden = self.pred_trunk(latent)  # [B, H]
        return self.pred_value(hidden), self.pred_policy(hidden)  # [B, 2Sv+1], [B, A]

    def project(self, latent: Tensor, *, with_prediction_head: bool) -> Tensor:
        z = self.projection(latent.flatten(1))  # [B, P]
        return self.projection_head(z) if with_prediction_head else z


# --------------------------------------------------------------------------------------------
# Convolutional variant
# --------------------------------------------------------------------------------------------


def _conv3x3(in_ch: int, out_ch: int, *, stride: int = 1) -> nn.Conv2d:
    # No bias: every conv is followed by BatchNorm, whose shift makes a bias redundant.
    return nn.Conv2d(in_ch, out_ch, kernel_size=3, stride=stride, padding=1, bias=False)


class _ResBlock(nn.Module):
    """Post-activation residual block: conv-BN-ReLU-conv-BN, + skip, ReLU. [B,C,H,W] -> same."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = _conv3x3(channels, channels)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = _conv3x3(channels, channels)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: Tensor) -> Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(x + y)


def _res_stack(channels: int, n: int) -> nn.Sequential:
    return nn.Sequential(*[_ResBlock(channels) for _ in range(n)])


class _ConvHead(nn.Module):
    """1x1 conv to ``reduced`` channels -> BN -> ReLU -> flatten -> fc -> ReLU -> fc.

    [B, C, h, w] -> [B, out_dim]. ``zero_last`` zero-initialises the final fc (value/reward).
    """

    def __init__(
        self, *, channels: int, reduced: int, spatial: int, fc_hidden: int, out_dim: int, zero_last: bool
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, reduced, kernel_size=1, bias=False)
        self.bn = nn.BatchNorm2d(reduced)
        self.fc1 = nn.Linear(reduced * spatial, fc_hidden)
        self.fc2 = nn.Linear(fc_hidden, out_dim)
        if zero_last:
            _zero_init(self.fc2)

    def forward(self, x: Tensor) -> Tensor:
        y = F.relu(self.bn(self.conv(x))).flatten(1)  # [B, reduced * h * w]
        return self.fc2(F.relu(self.fc1(y)))


def _halve(n: int) -> int:
    """Output size of a 3x3 stride-2 conv / pool with padding 1: ceil(n / 2)."""
    return (n + 1) // 2


class ConvMuZeroNet(MuZeroNetwork):
    """Residual convolutional MuZero network for image observations [B, C_stacked, H, W].

    Representation (``downsample=True``, MuZero Atari layout): conv 3x3 s2 (C/2) -> res blocks
    -> conv 3x3 s2 (C) -> res blocks -> avg-pool s2 -> res blocks -> avg-pool s2, so the latent
    is [B, C, ceil(H/16), ceil(W/16)]: 96 px -> 6x6, 64 px -> 4x4. With ``downsample=False`` a
    3x3 stride-1 conv plus res blocks keeps the input resolution.

    Dynamics: concat(latent, action plane = action / A broadcast to h x w) -> conv 3x3 -> BN,
    plus a skip from the latent (so an untrained dynamics starts near the identity) -> ReLU ->
    res blocks -> next latent; the reward head reads that feature map.
    Prediction: res blocks -> value head and policy head (``_ConvHead``).
    Projection: flatten latent -> Linear-BN-ReLU x2 -> Linear-BN (SimSiam projector), predictor
    bottleneck P -> P/4 -> P on the online branch.
    """

    # shape-only control flow (the dynamics' action plane takes its batch size from the latent's shape, which
    # a trace records): the search and the bootstrap values call traced twins (models/traced.py)
    traceable_recurrent = True
    traceable_initial = True

    def __init__(
        self,
        *,
        obs_shape: Sequence[int],
        num_actions: int,
        num_channels: int = 64,
        num_res_blocks: int = 1,
        downsample: bool = True,
        value_support_size: int = 300,
        reward_support_size: int = 300,
        reduced_channels: int = 16,
        fc_hidden: int = 32,
        projection_dim: int = 256,
    ) -> None:
        super().__init__()
        obs_shape = tuple(int(d) for d in obs_shape)
        if len(obs_shape) != 3 or min(obs_shape) < 1:
            raise ValueError(f"obs_shape must be (C, H, W) with positive sizes, got {obs_shape!r}")
        _check_positive("num_actions", num_actions)
        _check_positive("num_channels", num_channels, minimum=2 if downsample else 1)
        _check_positive("num_res_blocks", num_res_blocks, minimum=0)
        _check_positive("value_support_size", value_support_size)
        _check_positive("reward_support_size", reward_support_size)
        _check_positive("reduced_channels", reduced_channels)
        _check_positive("fc_hidden", fc_hidden)
        _check_positive("projection_dim", projection_dim)

        in_ch, height, width = obs_shape
        c = num_channels
        self.obs_shape = obs_shape
        self.num_actions = num_actions
        self.value_support_size = value_support_size
        self.reward_support_size = reward_support_size
        self.projection_dim = projection_dim

        if downsample:
            # First stage runs at half resolution with half the channels: it is the most
            # expensive stage per channel, and the paper uses the same narrowing.
            half = c // 2
            self.representation = nn.Sequential(
                _conv3x3(in_ch, half, stride=2),
                nn.BatchNorm2d(half),
                nn.ReLU(),
                _res_stack(half, num_res_blocks),
                _conv3x3(half, c, stride=2),
                nn.BatchNorm2d(c),
                nn.ReLU(),
                _res_stack(c, num_res_blocks),
                nn.AvgPool2d(kernel_size=3, stride=2, padding=1),
                _res_stack(c, num_res_blocks),
                nn.AvgPool2d(kernel_size=3, stride=2, padding=1),
            )
            h, w = height, width
            for _ in range(4):
                h, w = _halve(h), _halve(w)
        else:
            self.representation = nn.Sequential(
                _conv3x3(in_ch, c), nn.BatchNorm2d(c), nn.ReLU(), _res_stack(c, num_res_blocks)
            )
            h, w = height, width
        self.latent_shape = (c, h, w)
        spatial = h * w

        self.dyn_conv = _conv3x3(c + 1, c)
        self.dyn_bn = nn.BatchNorm2d(c)
        self.dyn_res = _res_stack(c, num_res_blocks)
        self.reward_head = _ConvHead(
            channels=c,
            reduced=reduced_channels,
            spatial=spatial,
            fc_hidden=fc_hidden,
            out_dim=2 * reward_support_size + 1,
            zero_last=True,
        )

        self.pred_res = _res_stack(c, num_res_blocks)
        self.value_head = _ConvHead(
            channels=c,
            reduced=reduced_channels,
            spatial=spatial,
            fc_hidden=fc_hidden,
            out_dim=2 * value_support_size + 1,
            zero_last=True,
        )
        self.policy_head = _ConvHead(
            channels=c,
            reduced=reduced_channels,
            spatial=spatial,
            fc_hidden=fc_hidden,
            out_dim=num_actions,
            zero_last=False,
        )

        flat = c * spatial
        self.projection = nn.Sequential(
            nn.Linear(flat, projection_dim),
            nn.BatchNorm1d(projection_dim),
            nn.ReLU(),
            nn.Linear(projection_dim, projection_dim),
            nn.BatchNorm1d(projection_dim),
            nn.ReLU(),
            nn.Linear(projection_dim, projection_dim),
            nn.BatchNorm1d(projection_dim),
        )
        bottleneck = max(1, projection_dim // 4)
        self.projection_head = nn.Sequential(
            nn.Linear(projection_dim, bottleneck),
            nn.BatchNorm1d(bottleneck),
            nn.ReLU(),
            nn.Linear(bottleneck, projection_dim),
        )

    def represent(self, obs: Tensor) -> Tensor:
        x = self._prepare_obs(obs)  # [B, C_in, H, W] float
        if tuple(x.shape[1:]) != self.obs_shape:
            raise ValueError(f"expected observations of shape [B, *{self.obs_shape}], got {tuple(obs.shape)}")
        return normalize_latent(self.representation(x))  # [B, C, h, w]

    def dynamics(self, latent: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        b, _, h, w = latent.shape
        action = self._prepare_action(action, b)
        plane = (action.to(latent.dtype) / self.num_actions).view(b, 1, 1, 1).expand(b, 1, h, w)
        x = self.dyn_bn(self.dyn_conv(torch.cat([latent, plane], dim=1)))  # [B, C, h, w]
        x = self.dyn_res(F.relu(x + latent))
        return normalize_latent(x), self.reward_head(x)  # [B, C, h, w], [B, 2Sr+1]

    def predict(self, latent: Tensor) -> tuple[Tensor, Tensor]:
        x = self.pred_res(latent)  # [B, C, h, w]
        return self.value_head(x), self.policy_head(x)  # [B, 2Sv+1], [B, A]

    def project(self, latent: Tensor, *, with_prediction_head: bool) -> Tensor:
        z = self.projection(latent.flatten(1))  # [B, P]
        return self.projection_head(z) if with_prediction_head else z


# --------------------------------------------------------------------------------------------
# Factory
# --------------------------------------------------------------------------------------------


def build_network(*, kind: str, obs_shape: Sequence[int], num_actions: int, **kwargs) -> MuZeroNetwork:
    """Build a network from ``model.kind``.

    ``'mlp'`` flattens ``obs_shape`` into ``obs_dim``; ``'conv'`` needs ``obs_shape = (C, H, W)``.
    Extra keyword arguments go to the chosen constructor.
    """
    if kind == "mlp":
        return MLPMuZeroNet(obs_dim=math.prod(int(d) for d in obs_shape), num_actions=num_actions, **kwargs)
    if kind == "conv":
        return ConvMuZeroNet(obs_shape=tuple(obs_shape), num_actions=num_actions, **kwargs)
    raise ValueError(f"model.kind must be one of {list(NETWORK_KINDS)}, got {kind!r}")
