"""A MuZero network with a recurrent (GRU) history state, for the ``muzero_rnn_full_obs`` policy type.

The model state at time t is the pair (z_t, h_t):

* z_t -- the latent of a base MuZero network (``MLPMuZeroNet`` or ``ConvMuZeroNet``): at the root the
  representation of the real ("full") observation, inside the search or the training unroll the latent
  the base dynamics produced;
* h_t -- a history vector [H] (``rnn_hidden_size``), zero at a context reset.

Transition on action a_t::

    h_{t+1}        = GRU(input = [flatten(z_t), one_hot(a_t)], state = h_t)
    z_{t+1}, r_t   = base.dynamics(c(z_t, h_t), a_t)
    value, policy  = base.predict(c(z_{t+1}, h_{t+1}))

where c(z, h) = z + W h (W h reshaped to the latent's shape) injects the history into every function of
the state. Prediction and dynamics therefore receive h as well, and the history path is the same for every
base network kind.

The state is exchanged **packed**: ``[B, Dz + H]`` = concat(flatten(z), h). The class implements the
:class:`MuZeroNetwork` interface on packed states (``latent_shape = (Dz + H,)``), so the MuZero search
stores one tensor per node and runs unchanged, and MuZero's unroll loss applies as is; only the root state
(its history) is chosen by the policy. ``project`` (SSL) reads z only.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from muzero_tune.models.muzero_net import InitialOutput, MuZeroNetwork

__all__ = ["RNNMuZeroNet"]


class RNNMuZeroNet(MuZeroNetwork):
    """``base`` (any :class:`MuZeroNetwork`) plus a GRU history of ``history_size`` (module docstring)."""

    def __init__(self, base: MuZeroNetwork, *, history_size: int) -> None:
        super().__init__()
        if isinstance(history_size, bool) or not isinstance(history_size, int) or history_size < 1:
            raise ValueError(f"history_size must be an int >= 1, got {history_size!r}")
        self.base = base
        self.num_actions = base.num_actions
        self.value_support_size = base.value_support_size
        self.reward_support_size = base.reward_support_size
        self.z_shape = tuple(base.latent_shape)
        self.z_dim = math.prod(self.z_shape)
        self.history_size = history_size
        self.latent_shape = (self.z_dim + history_size,)
        self.gru = nn.GRUCell(self.z_dim + self.num_actions, history_size)
        self.history_in = nn.Linear(history_size, self.z_dim)  # W of c(z, h) = z + W h
        # the search's call is traced (models/traced.py) where the base network's is: the history's GRU and
        # the packing add shape-only control flow
        self.traceable_recurrent = bool(getattr(base, "traceable_recurrent", False))

    # ------------------------------------------------------------------ packing

    def pack(self, z: Tensor, h: Tensor) -> Tensor:
        """z [B, *z_shape], h [B, H] -> packed state [B, Dz + H]."""
        return torch.cat([z.flatten(1), h.to(z.dtype)], dim=1)

    def unpack(self, state: Tensor) -> tuple[Tensor, Tensor]:
        """packed state [B, Dz + H] -> (z [B, *z_shape], h [B, H])."""
        if state.dim() != 2 or state.shape[1] != self.latent_shape[0]:
            raise ValueError(f"expected a packed state [B, {self.latent_shape[0]}], got {tuple(state.shape)}")
        z = state[:, : self.z_dim].reshape(state.shape[0], *self.z_shape)
        return z, state[:, self.z_dim :]

    def zero_history(self, batch: int, *, like: Tensor) -> Tensor:
        return torch.zeros(batch, self.history_size, dtype=like.dtype, device=like.device)

    def _condition(self, z: Tensor, h: Tensor) -> Tensor:
        """c(z, h) = z + W h: the history injected into a latent-shaped input."""
        return z + self.history_in(h.to(z.dtype)).view(z.shape)

    # ------------------------------------------------------------------ the functions

    def represent_z(self, obs: Tensor) -> Tensor:
        """Representation of real observations: obs -> z [B, *z_shape]."""
        return self.base.represent(obs)

    def represent(self, obs: Tensor, history: Tensor | None = None) -> Tensor:
        """obs -> packed state with history ``history`` [B, H] (None: an empty history, zeros)."""
        z = self.represent_z(obs)
        h = self.zero_history(z.shape[0], like=z) if history is None else history
        return self.pack(z, h)

    def history(self, state: Tensor, action: Tensor) -> Tensor:
        """h_{t+1} = GRU([flatten(z_t), one_hot(a_t)], h_t) for packed states [B, Dz + H] -> [B, H]."""
        z, h = self.unpack(state)
        action = self._prepare_action(action, state.shape[0])
        one_hot = F.one_hot(action, self.num_actions).to(state.dtype)
        return self.gru(torch.cat([z.flatten(1), one_hot], dim=1), h)

    def dynamics(self, latent: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """packed (z_t, h_t), a_t -> packed (z_{t+1}, h_{t+1}), reward logits [B, 2Sr+1]."""
        z, h = self.unpack(latent)
        next_h = self.history(latent, action)
        next_z, reward_logits = self.base.dynamics(self._condition(z, h), action)
        return self.pack(next_z, next_h), reward_logits

    def predict(self, latent: Tensor) -> tuple[Tensor, Tensor]:
        """packed (z, h) -> value logits, policy logits."""
        z, h = self.unpack(latent)
        return self.base.predict(self._condition(z, h))

    def project(self, latent: Tensor, *, with_prediction_head: bool) -> Tensor:
        """SSL projection of the z part of a packed state."""
        z, _ = self.unpack(latent)
        return self.base.project(z, with_prediction_head=with_prediction_head)

    # ------------------------------------------------------------------ entry points

    def initial_inference(self, obs: Tensor, history: Tensor | None = None) -> InitialOutput:
        """obs [B, *obs_shape], history [B, H] or None (zeros) -> packed latent, value and policy logits."""
        latent = self.represent(obs, history)
        value_logits, policy_logits = self.predict(latent)
        return InitialOutput(latent=latent, value_logits=value_logits, policy_logits=policy_logits)
