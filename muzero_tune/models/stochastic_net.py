"""Stochastic MuZero network (Antonoglou et al. 2022), MLP variant for vector observations.

Functions (B = batch, L = latent size, A = actions, C = chance codes, Sv/Sr = value/reward support sizes):

* representation ``represent(obs [B, D]) -> s [B, L]``
* prediction ``predict(s) -> (value logits [B, 2Sv+1], policy logits [B, A])``
* afterstate dynamics ``afterstate_dynamics(s, action [B]) -> as [B, L]``
* afterstate prediction ``afterstate_predict(as) -> (Q logits [B, 2Sv+1], chance logits sigma [B, C])``
* dynamics ``dynamics(as, code [B, C] one-hot, float) -> (s' [B, L], reward logits [B, 2Sr+1])``
* chance encoder ``encode_chance(obs_t [B, D], obs_t1 [B, D]) -> (code [B, C], logits [B, C])``: the code is
  the one-hot argmax of the logits with a straight-through estimator (forward: one-hot; backward: the
  gradient of softmax(logits)).

States and afterstates are min-max normalised to [0, 1] per sample (as MuZero's hidden states) and share
the latent size, so the search stores both in one latent buffer. Value, Q and reward heads are
zero-initialised (first predictions decode to 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from muzero_tune.models.muzero_net import InitialOutput, RecurrentOutput, normalize_latent


def _trunk(in_dim: int, hidden_dim: int, num_layers: int) -> tuple[nn.Sequential, int]:
    layers: list[nn.Module] = []
    width = in_dim
    for _ in range(num_layers):
        layers += [nn.Linear(width, hidden_dim), nn.LayerNorm(hidden_dim), nn.ReLU()]
        width = hidden_dim
    return nn.Sequential(*layers), width


def _zero(layer: nn.Linear) -> nn.Linear:
    nn.init.zeros_(layer.weight)
    nn.init.zeros_(layer.bias)
    return layer


def straight_through_one_hot(logits: Tensor) -> Tensor:
    """One-hot of argmax(logits) in the forward pass, gradient of softmax(logits) in the backward pass."""
    probs = F.softmax(logits, dim=-1)
    one_hot = F.one_hot(logits.argmax(dim=-1), logits.shape[-1]).to(probs.dtype)
    return one_hot + (probs - probs.detach())  # exactly one-hot: probs - probs.detach() is exactly 0


class MLPStochasticMuZeroNet(nn.Module):
    """MLP Stochastic MuZero network (see the module docstring)."""

    # shape-only control flow: the search calls traced twins of its two steps (models/traced.py)
    traceable_afterstate_inference = True
    traceable_chance_inference = True
    # both steps run as numba kernels on CPU (models/host.py; a subclass that overrides them falls back)
    host_recurrent = True

    def __init__(
        self,
        *,
        obs_dim: int,
        num_actions: int,
        chance_space_size: int,
        latent_dim: int = 64,
        hidden_dim: int = 128,
        num_hidden_layers: int = 1,
        value_support_size: int = 300,
        reward_support_size: int = 300,
    ) -> None:
        super().__init__()
        for name, v in (("obs_dim", obs_dim), ("num_actions", num_actions), ("chance_space_size",
                        chance_space_size), ("latent_dim", latent_dim), ("hidden_dim", hidden_dim)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        self.obs_dim = obs_dim
        self.num_actions = num_actions
        self.chance_space_size = chance_space_size
        self.latent_shape = (latent_dim,)
        self.value_support_size = value_support_size
        self.reward_support_size = reward_support_size
        nv, nr = 2 * value_support_size + 1, 2 * reward_support_size + 1

        self.repr_trunk, w = _trunk(obs_dim, hidden_dim, num_hidden_layers)
        self.repr_out = nn.Linear(w, latent_dim)

        self.pred_trunk, w = _trunk(latent_dim, hidden_dim, num_hidden_layers)
        self.pred_value = _zero(nn.Linear(w, nv))
        self.pred_policy = nn.Linear(w, num_actions)

        self.after_trunk, w = _trunk(latent_dim + num_actions, hidden_dim, num_hidden_layers)
        self.after_out = nn.Linear(w, latent_dim)

        self.after_pred_trunk, w = _trunk(latent_dim, hidden_dim, num_hidden_layers)
        self.after_pred_value = _zero(nn.Linear(w, nv))
        self.after_pred_chance = nn.Linear(w, chance_space_size)

        self.dyn_trunk, w = _trunk(latent_dim + chance_space_size, hidden_dim, num_hidden_layers)
        self.dyn_latent = nn.Linear(w, latent_dim)
        self.dyn_reward = _zero(nn.Linear(w, nr))

        self.enc_trunk, w = _trunk(2 * obs_dim, hidden_dim, num_hidden_layers)
        self.enc_out = nn.Linear(w, chance_space_size)

    def _obs(self, obs: Tensor) -> Tensor:
        dtype = next(self.parameters()).dtype
        x = (obs.to(dtype) / 255.0 if obs.dtype == torch.uint8 else obs.to(dtype)).flatten(1)
        if x.shape[1] != self.obs_dim:
            raise ValueError(f"expected {self.obs_dim} observation features, got shape {tuple(obs.shape)}")
        return x

    # ---------------------------------------------------------------- the six functions

    def represent(self, obs: Tensor) -> Tensor:
        return normalize_latent(self.repr_out(self.repr_trunk(self._obs(obs))))

    def predict(self, latent: Tensor) -> tuple[Tensor, Tensor]:
        h = self.pred_trunk(latent)
        return self.pred_value(h), self.pred_policy(h)

    def afterstate_dynamics(self, latent: Tensor, action: Tensor) -> Tensor:
        one_hot = F.one_hot(action.reshape(-1).long(), self.num_actions).to(latent.dtype)
        return normalize_latent(self.after_out(self.after_trunk(torch.cat([latent, one_hot], dim=1))))

    def afterstate_predict(self, afterstate: Tensor) -> tuple[Tensor, Tensor]:
        h = self.after_pred_trunk(afterstate)
        return self.after_pred_value(h), self.after_pred_chance(h)

    def dynamics(self, afterstate: Tensor, code: Tensor) -> tuple[Tensor, Tensor]:
        h = self.dyn_trunk(torch.cat([afterstate, code.to(afterstate.dtype)], dim=1))
        return normalize_latent(self.dyn_latent(h)), self.dyn_reward(h)

    def encode_chance(self, obs_t: Tensor, obs_t1: Tensor) -> tuple[Tensor, Tensor]:
        logits = self.enc_out(self.enc_trunk(torch.cat([self._obs(obs_t), self._obs(obs_t1)], dim=1)))
        return straight_through_one_hot(logits), logits

    # ---------------------------------------------------------------- search entry points

    def initial_inference(self, obs: Tensor) -> InitialOutput:
        """obs -> latent, value logits, policy logits (MuZero's container)."""
        latent = self.represent(obs)
        value_logits, policy_logits = self.predict(latent)
        return InitialOutput(latent=latent, value_logits=value_logits, policy_logits=policy_logits)

    def afterstate_inference(self, latent: Tensor, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(latent, action [B]) -> (afterstate, Q logits, chance logits)."""
        afterstate = self.afterstate_dynamics(latent, action)
        q_logits, chance_logits = self.afterstate_predict(afterstate)
        return afterstate, q_logits, chance_logits

    def chance_inference(self, afterstate: Tensor, code: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(afterstate, chance code index [B]) -> (latent, reward logits, value logits, policy logits)."""
        one_hot = F.one_hot(code.reshape(-1).long(), self.chance_space_size).to(afterstate.dtype)
        latent, reward_logits = self.dynamics(afterstate, one_hot)
        value_logits, policy_logits = self.predict(latent)
        return latent, reward_logits, value_logits, policy_logits

    def recurrent_inference(self, latent: Tensor, action: Tensor) -> RecurrentOutput:
        """A MuZero-shaped step for tools written against the MuZero network interface (e.g. the bare
        forward+backward of ``scripts/bench/bench_learner.py``): afterstate, then the chance prior's most
        likely code, then dynamics and prediction. The search and the loss never use it."""
        afterstate = self.afterstate_dynamics(latent, action)
        _, chance_logits = self.afterstate_predict(afterstate)
        code = F.one_hot(chance_logits.argmax(-1), self.chance_space_size).to(afterstate.dtype)
        next_latent, reward_logits = self.dynamics(afterstate, code)
        value_logits, policy_logits = self.predict(next_latent)
        return RecurrentOutput(
            latent=next_latent,
            reward_logits=reward_logits,
            value_logits=value_logits,
            policy_logits=policy_logits,
        )


def build_stochastic_network(*, kind: str, obs_shape: Sequence[int], **kwargs) -> MLPStochasticMuZeroNet:
    """``kind='mlp'`` only (vector observations); other kinds raise ValueError."""
    if kind != "mlp":
        raise ValueError(f"stochastic_muzero supports model.kind='mlp' only, got {kind!r}")
    return MLPStochasticMuZeroNet(obs_dim=math.prod(int(d) for d in obs_shape), **kwargs)
