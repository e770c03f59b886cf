"""EfficientZero (Ye et al. 2021) as a policy plug-in: MuZero with an LSTM value-prefix head.

What differs from :class:`~muzero_tune.policies.muzero.MuZeroPolicy` (everything else is inherited):

* **Model** -- :mod:`muzero_tune.models.efficientzero_net`: the dynamics carries an LSTM state (h, c) and
  predicts the value prefix (undiscounted reward sum since the last LSTM reset) instead of the reward.
* **Search** -- the unchanged :class:`~muzero_tune.mcts.MuZeroSearch`. The per-node state it stores is the
  *packed* tensor ``[latent (flattened), h, c, depth, value prefix]`` (see :func:`pack_search_state`); the
  recurrent_fn unpacks the parent, resets its LSTM state when ``depth % lstm_horizon_len == 0`` (the root
  included), runs one dynamics step and hands the search the child's *reward*:
  ``prefix(child) - prefix(parent)``, or ``prefix(child)`` when the parent was a reset node.
* **Targets** -- MuZero's :func:`~muzero_tune.replay.targets.make_batch`, plus
  ``extras["target_value_prefix"]`` [B, K]: for unroll step k = 1..K the sum of the per-step reward targets
  since the last reset, resets after every ``lstm_horizon_len`` steps *of each sample's own unroll*
  (the reference implementation lets the reset phase drift across the batch; this one does not). Past the
  data the reward targets are 0 (absorbing) so the prefix is held; the mask is ``reward_mask``.
* **Loss** -- MuZero's, with the value-prefix cross-entropy in place of the reward cross-entropy and the
  LSTM state reset every ``lstm_horizon_len`` unroll steps, exactly as in the search. Metric names are
  MuZero's (``train/loss_reward`` is the value-prefix loss) so every policy reports the same keys.

Acting is stateless across environment steps: every root starts from a zero LSTM state.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from muzero_tune.models.efficientzero_net import LstmState, build_efficientzero_network
from muzero_tune.models.host import host_value_prefix_step
from muzero_tune.models.support import logits_to_scalar_np
from muzero_tune.models.traced import recurrent_state_outputs
from muzero_tune.policies.base import SearchRoots, model_device
from muzero_tune.policies.muzero import MuZeroPolicy
from muzero_tune.replay.targets import TrainBatch

VALUE_PREFIX_KEY = "target_value_prefix"


# ---------------------------------------------------------------------------------------------- search state


def pack_search_state(
    latent: torch.Tensor, lstm_state: LstmState, depth: torch.Tensor, prefix: torch.Tensor
) -> torch.Tensor:
    """One search node's state as one row: [B, prod(latent_shape) + 2H + 2] in ``latent``'s dtype.

    ``latent`` [B, *latent_shape], ``lstm_state`` (h, c) [B, H] each, ``depth`` [B] (root = 0), ``prefix``
    [B] (the node's predicted value prefix; 0 at the root). Depths are small integers, exact in float32.
    """
    b, dt = latent.shape[0], latent.dtype
    h, c = lstm_state
    return torch.cat(
        [latent.reshape(b, -1), h.to(dt), c.to(dt), depth.to(dt).view(b, 1), prefix.to(dt).view(b, 1)], dim=1
    )


def unpack_search_state(
    packed: torch.Tensor, latent_shape: tuple[int, ...], hidden: int
) -> tuple[torch.Tensor, LstmState, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`pack_search_state` -> (latent, (h, c), depth [B] float, prefix [B] float)."""
    b = packed.shape[0]
    n = packed.shape[1] - 2 * hidden - 2
    latent = packed[:, :n].reshape(b, *latent_shape)
    h = packed[:, n : n + hidden]
    c = packed[:, n + hidden : n + 2 * hidden]
    return latent, (h, c), packed[:, -2], packed[:, -1]


# ---------------------------------------------------------------------------------------------- targets


def value_prefix_targets(target_reward: np.ndarray, horizon: int) -> np.ndarray:
    """Per-step reward targets [B, K] (step k = 1..K in column k-1) -> value-prefix targets [B, K].

    Column k-1 holds the sum of the reward targets of steps ((k-1) // horizon) * horizon + 1 .. k: the
    running sum restarts after every ``horizon`` unroll steps, counted from each sample's own start.
    """
    r = np.asarray(target_reward, dtype=np.float64)
    out = np.empty_like(r)
    for k in range(r.shape[1]):
        out[:, k] = r[:, k] if k % horizon == 0 else out[:, k - 1] + r[:, k]
    return out.astype(np.float32)


# ---------------------------------------------------------------------------------------------- policy


class EfficientZeroPolicy(MuZeroPolicy):
    """EfficientZero on discrete actions (see the module docstring)."""

    name = "efficientzero"

    def __init__(self, cfg, spec):
        super().__init__(cfg, spec)
        self.horizon = int(cfg.policy.lstm_horizon_len)

    # ---------------------------------------------------------------- model

    def build_model(self) -> torch.nn.Module:
        mc = self.cfg.model
        common = dict(
            kind=mc.kind,
            obs_shape=tuple(self.spec.obs_shape),
            num_actions=self.spec.num_actions,
            value_support_size=mc.value_support_size,
            reward_support_size=mc.reward_support_size,
            projection_dim=mc.projection_dim,
            lstm_hidden_size=self.cfg.policy.lstm_hidden_size,
        )
        if mc.kind == "mlp":
            return build_efficientzero_network(
                **common,
                latent_dim=mc.latent_dim,
                hidden_dim=mc.hidden_dim,
                num_hidden_layers=mc.num_hidden_layers,
            )
        return build_efficientzero_network(
            **common, num_channels=mc.num_channels, num_res_blocks=mc.num_res_blocks, downsample=mc.downsample
        )

    # ---------------------------------------------------------------- search

    def recurrent_fn(self, model: torch.nn.Module):
        dev = model_device(model)
        shape, hidden, horizon = tuple(model.latent_shape), model.lstm_hidden_size, self.horizon
        rs, vs = model.reward_support_size, model.value_support_size
        host = self.cfg.mcts.host_kernel

        def fn(packed: torch.Tensor, actions: np.ndarray):
            if host:  # the whole step below as one numba kernel where the network allows it (models/host.py)
                step = host_value_prefix_step(
                    model, packed, actions, horizon=horizon, reward_support_size=rs, value_support_size=vs
                )
                if step is not None:
                    return step
            latent, (h, c), depth, parent_prefix = unpack_search_state(packed, shape, hidden)
            # a parent at depth % horizon == 0 (the root included) starts a new horizon: zero LSTM state,
            # and its children's rewards are their whole prefixes (depths are exact small floats)
            reset = torch.remainder(depth, horizon) == 0  # [B] bool, on the latent's device
            zero = torch.zeros((), dtype=h.dtype, device=h.device)
            state = (torch.where(reset[:, None], zero, h), torch.where(reset[:, None], zero, c))
            base = torch.where(reset, zero, parent_prefix).float().cpu().numpy()  # [B]
            # one traced call where the network allows it (models/traced.py)
            next_latent, prefix_logits, value_logits, policy, next_state = recurrent_state_outputs(
                model, latent, torch.as_tensor(actions, device=dev), state
            )
            prefix = logits_to_scalar_np(prefix_logits.float().cpu().numpy(), support_size=rs)
            value = logits_to_scalar_np(value_logits.float().cpu().numpy(), support_size=vs)
            child = pack_search_state(
                next_latent, next_state, depth + 1, torch.from_numpy(prefix).to(packed.device)
            )
            return child, prefix - base, value, policy.float().cpu().numpy()

        return fn

    def root_inference(self, model, obs, state, env_index) -> SearchRoots:
        """Each root's packed search state: its latent, a zero LSTM state, depth 0 and reward prefix 0."""
        root = model.initial_inference(obs)
        b = root.latent.shape[0]
        zeros = torch.zeros(b, dtype=root.latent.dtype, device=root.latent.device)
        packed = pack_search_state(root.latent, model.initial_lstm_state(b, like=root.latent), zeros, zeros)
        return SearchRoots(packed, root.policy_logits, root.value_logits)

    # ---------------------------------------------------------------- targets

    def make_batch(
        self, sample, *, target_model, rng, reanalyze_count=0, defer_bootstrap=False
    ) -> TrainBatch:
        batch = super().make_batch(
            sample, target_model=target_model, rng=rng, reanalyze_count=reanalyze_count,
            defer_bootstrap=defer_bootstrap,
        )
        prefix = value_prefix_targets(batch.target_reward, self.horizon)
        return dataclasses.replace(batch, extras={**batch.extras, VALUE_PREFIX_KEY: prefix})

    # ---------------------------------------------------------------- loss

    def reward_targets(self, batch: TrainBatch) -> np.ndarray:
        """The reward head predicts value prefixes: train it on the prefix targets."""
        return batch.extras[VALUE_PREFIX_KEY]

    def unroll_step(self, model, latent, action, carry, k: int):
        """Thread the LSTM state through the unroll, zeroed at the root and every ``lstm_horizon_len`` steps
        (as in the search)."""
        rec = model.recurrent_inference(latent, action, carry)
        return rec, (None if k % self.horizon == 0 else rec.lstm_state)
