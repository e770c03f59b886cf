"""EfficientZero networks: MuZero networks whose dynamics predicts the *value prefix* with an LSTM.

EfficientZero (Ye et al. 2021) replaces MuZero's per-step reward head by a value-prefix head: an LSTM runs
along the unrolled (or searched) trajectory, and from its output a categorical head predicts the
undiscounted sum of the rewards since the LSTM state was last reset. The LSTM state ``(h, c)`` is therefore
part of the recurrent state next to the latent; whoever unrolls the dynamics (the search, the learner)
resets it to zeros every ``lstm_horizon_len`` steps.

* ``ValuePrefixOutput`` -- ``RecurrentOutput`` plus the LSTM state after the step; its ``reward_logits``
  are the value-prefix logits (categorical over h(prefix), ``reward_support_size``).
* ``MLPEfficientZeroNet`` / ``ConvEfficientZeroNet`` -- the MuZero MLP / conv networks with the reward head
  replaced by an ``LSTMCell`` and a value-prefix head. Representation, prediction and projection are the
  MuZero ones, unchanged.
* ``build_efficientzero_network`` -- factory keyed by ``model.kind``.

``recurrent_inference(latent, action)`` without a state starts from zeros, so code written against the
plain ``MuZeroNetwork`` interface (benchmarks, shape checks) still runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from muzero_tune.models.muzero_net import (
    NETWORK_KINDS,
    ConvMuZeroNet,
    MLPMuZeroNet,
    RecurrentOutput,
    _check_positive,
    _zero_init,
    normalize_latent,
)

__all__ = [
    "ConvEfficientZeroNet",
    "LstmState",
    "MLPEfficientZeroNet",
    "ValuePrefixOutput",
    "build_efficientzero_network",
]

LstmState = tuple[Tensor, Tensor]  # (h [B, H], c [B, H])


@dataclass(frozen=True)
class ValuePrefixOutput(RecurrentOutput):
    """``recurrent_inference`` of an EfficientZero network.

    ``reward_logits`` [B, 2Sr+1] are value-prefix logits (the running reward sum since the last LSTM
    reset, including this step's reward); ``lstm_state`` is (h, c) [B, H] each, after this step.
    """

    lstm_state: LstmState | None = None


class _ValuePrefixMixin:
    """The LSTM value-prefix part shared by the MLP and conv variants.

    Subclasses define ``lstm`` (an ``nn.LSTMCell``), ``value_prefix_head`` and
    ``_dynamics_features(latent, action) -> (next latent, LSTM input [B, F])``.
    """

    lstm_hidden_size: int
    lstm: nn.LSTMCell
    value_prefix_head: nn.Module

    def _dynamics_features(self, latent: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def initial_lstm_state(self, batch: int, *, like: Tensor) -> LstmState:
        """Zero (h, c), each [batch, H], with ``like``'s dtype and device."""
        z = torch.zeros(batch, self.lstm_hidden_size, dtype=like.dtype, device=like.device)
        return z, z.clone()

    def dynamics_with_state(
        self, latent: Tensor, action: Tensor, lstm_state: LstmState | None = None
    ) -> tuple[Tensor, Tensor, LstmState]:
        """(latent [B, *latent_shape], action [B], (h, c) or None = zeros) ->
        (next latent, value-prefix logits [B, 2Sr+1], next (h, c))."""
        next_latent, feature = self._dynamics_features(latent, action)
        if lstm_state is None:
            lstm_state = self.initial_lstm_state(latent.shape[0], like=feature)
        h, c = self.lstm(feature, lstm_state)
        return next_latent, self.value_prefix_head(h), (h, c)

    def dynamics(self, latent: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """MuZero interface: one step from a zero LSTM state -> (next latent, value-prefix logits)."""
        next_latent, prefix_logits, _ = self.dynamics_with_state(latent, action, None)
        return next_latent, prefix_logits

    def recurrent_inference(
        self, latent: Tensor, action: Tensor, lstm_state: LstmState | None = None
    ) -> ValuePrefixOutput:
        """latent, action [B], LSTM state (None: zeros) -> next latent, value prefix, value, policy, state."""
        next_latent, prefix_logits, state = self.dynamics_with_state(latent, action, lstm_state)
        value_logits, policy_logits = self.predict(next_latent)
        return ValuePrefixOutput(
            latent=next_latent,
            reward_logits=prefix_logits,
            value_logits=value_logits,
            policy_logits=policy_logits,
            lstm_state=state,
        )


def _prefix_head(hidden: int, support_size: int) -> nn.Sequential:
    """LSTM output [B, H] -> LayerNorm -> ReLU -> zero-initialised Linear -> logits [B, 2S+1]."""
    return nn.Sequential(nn.LayerNorm(hidden), nn.ReLU(), _zero_init(nn.Linear(hidden, 2 * support_size + 1)))


class MLPEfficientZeroNet(_ValuePrefixMixin, MLPMuZeroNet):
    """MLP EfficientZero: the LSTM reads the next latent (narrower than the trunk, so cheaper)."""

    # shape-only control flow with the LSTM state as well: the search calls a traced twin (models/traced.py)
    traceable_recurrent_state = True

    def __init__(self, *, lstm_hidden_size: int = 64, **kwargs) -> None:
        super().__init__(**kwargs)
        _check_positive("lstm_hidden_size", lstm_hidden_size)
        self.lstm_hidden_size = lstm_hidden_size
        del self.dyn_reward  # the per-step reward head is replaced by the value-prefix head
        self.lstm = nn.LSTMCell(self.latent_shape[0], lstm_hidden_size)
        self.value_prefix_head = _prefix_head(lstm_hidden_size, self.reward_support_size)

    def _dynamics_features(self, latent: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        hidden = self.dyn_trunk(torch.cat([latent, self.action_features(action, latent)], dim=1))  # [B, W]
        next_latent = normalize_latent(self.dyn_latent(hidden))  # [B, latent_dim]
        return next_latent, next_latent


class ConvEfficientZeroNet(_ValuePrefixMixin, ConvMuZeroNet):
    """Conv EfficientZero: the LSTM reads a 1x1-conv reduction of the dynamics feature map."""

    # shape-only control flow with the LSTM state as well: the search calls a traced twin (models/traced.py)
    traceable_recurrent_state = True

    def __init__(self, *, lstm_hidden_size: int = 64, reduced_channels: int = 16, **kwargs) -> None:
        super().__init__(reduced_channels=reduced_channels, **kwargs)
        _check_positive("lstm_hidden_size", lstm_hidden_size)
        self.lstm_hidden_size = lstm_hidden_size
        c, h, w = self.latent_shape
        del self.reward_head
        self.prefix_conv = nn.Conv2d(c, reduced_channels, kernel_size=1, bias=False)
        self.prefix_bn = nn.BatchNorm2d(reduced_channels)
        self.lstm = nn.LSTMCell(reduced_channels * h * w, lstm_hidden_size)
        self.value_prefix_head = _prefix_head(lstm_hidden_size, self.reward_support_size)

    def _dynamics_features(self, latent: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        b, _, h, w = latent.shape
        action = self._prepare_action(action, b)
        plane = (action.to(latent.dtype) / self.num_actions).view(b, 1, 1, 1).expand(b, 1, h, w)
        x = self.dyn_bn(self.dyn_conv(torch.cat([latent, plane], dim=1)))  # [B, C, h, w]
        x = self.dyn_res(F.relu(x + latent))
        feature = F.relu(self.prefix_bn(self.prefix_conv(x))).flatten(1)  # [B, reduced * h * w]
        return normalize_latent(x), feature


def build_efficientzero_network(
    *, kind: str, obs_shape: Sequence[int], num_actions: int, lstm_hidden_size: int, **kwargs
) -> MLPEfficientZeroNet | ConvEfficientZeroNet:
    """``build_network``'s twin for EfficientZero (same keyword arguments plus ``lstm_hidden_size``)."""
    if kind == "mlp":
        return MLPEfficientZeroNet(
            obs_dim=math.prod(int(d) for d in obs_shape),
            num_actions=num_actions,
            lstm_hidden_size=lstm_hidden_size,
            **kwargs,
        )
    if kind == "conv":
        return ConvEfficientZeroNet(
            obs_shape=tuple(obs_shape), num_actions=num_actions, lstm_hidden_size=lstm_hidden_size, **kwargs
        )
    raise ValueError(f"model.kind must be one of {list(NETWORK_KINDS)}, got {kind!r}")
