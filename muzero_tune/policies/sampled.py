"""Sampled MuZero and Sampled EfficientZero (Hubert et al. 2021) as policy plug-ins: discrete, continuous or
factored actions (a ``MultiDiscrete`` taken by its factors).

What differs from :class:`~muzero_tune.policies.muzero.MuZeroPolicy` /
:class:`~muzero_tune.policies.efficientzero.EfficientZeroPolicy` (everything else is inherited; the sampled
part is one mixin, :class:`SampledPolicyMixin`, so both types share it):

* **Search** -- :class:`~muzero_tune.mcts.sampled.SampledSearch`: K = ``policy.num_samples`` actions
  sampled at every node (tanh-Gaussian for continuous actions, Gumbel-top-K without replacement for
  discrete ones, independent draws from the product of per-factor categoricals for factored ones), pUCT
  with ``policy.sampled_prior`` (``auto``, the default: 1/K for continuous and factored draws, the paper's
  beta_hat/beta*pi for independent samples from pi; pi renormalised over the K distinct discrete actions,
  drawn without replacement), Dirichlet noise over the K edges (factored actions: also mixed into each
  factor's distribution for the root's draws).
* **Model** -- discrete: the type's usual network (logits over A). Continuous: the MLP network with the
  action vector as dynamics input and a Gaussian head ``[mu, log_sigma]``
  (:mod:`muzero_tune.models.sampled_net`). Factored: the network with the factors' logits end to end
  (sum(nvec) of them) and the one-hot per factor as dynamics input (:mod:`muzero_tune.models.factored_net`).
* **Stored per step** -- ``child_visits`` [K] (the visit distribution over the K sampled slots: the policy
  target), ``sampled_actions`` [K, D] float32 (continuous) / [K] int64 (discrete) / [K, D] int64
  (factored), ``root_value``, ``legal_mask``. Reanalyze replaces both ``child_visits`` and
  ``sampled_actions``.
* **Acting** -- collect samples a slot with probability proportional to visits^(1/T); evaluation takes the
  most-visited slot. The env action is that slot's sampled action.
* **Policy loss** -- at every unroll step ``-sum_k p_k log pi(a_k)`` over the stored slots (continuous: the
  tanh-Gaussian log-density, checked against torch's ``TransformedDistribution``; discrete: log-softmax at
  the sampled ids; factored: the joint log-probability, the sum over factors of each factor's log-softmax at
  its index), minus ``policy.policy_entropy_weight`` x the policy's entropy (pre-tanh Gaussian / categorical
  / the sum of the factors' entropies).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from muzero_tune.errors import ConfigError
from muzero_tune.mcts.sampled import SampledSearch
from muzero_tune.models.factored_net import (
    ConvFactoredMuZeroNet,
    MLPFactoredEfficientZeroNet,
    MLPFactoredMuZeroNet,
    factored_entropy,
    factored_log_prob,
)
from muzero_tune.models.sampled_net import (
    ConvGaussianMuZeroNet,
    MLPGaussianEfficientZeroNet,
    MLPGaussianMuZeroNet,
    gaussian_entropy,
    tanh_gaussian_log_prob,
)
from muzero_tune.policies.efficientzero import EfficientZeroPolicy
from muzero_tune.policies.muzero import MuZeroPolicy
from muzero_tune.replay.targets import TrainBatch

SAMPLED_ACTIONS = "sampled_actions"


class SampledPolicyMixin:
    """The sampled part of a MuZero-style policy (module docstring); put it before the base policy class."""

    action_kinds = ("discrete", "continuous", "factored")

    def __init__(self, cfg, spec):
        if spec.action_kind == "discrete" and cfg.policy.num_samples > spec.num_actions:
            raise ConfigError(
                "policy.num_samples", cfg.policy.num_samples, f"at most the env's {spec.num_actions} actions"
            )
        super().__init__(cfg, spec)

    @property
    def continuous(self) -> bool:
        return self.spec.action_kind == "continuous"

    @property
    def factored(self) -> bool:
        return self.spec.action_kind == "factored"

    def make_search(self):
        knobs = self.search_knobs()
        knobs["num_actions"] = self.spec.num_actions if self.spec.action_kind == "discrete" else 1
        return SampledSearch(
            num_samples=self.cfg.policy.num_samples,
            action_kind=self.spec.action_kind,
            action_dim=max(1, self.spec.action_dim),
            action_nvec=self.spec.action_nvec,
            sampled_prior=self.cfg.policy.sampled_prior,
            **knobs,
        )

    def _continuous_network(self) -> type:
        raise NotImplementedError

    def _factored_network(self) -> type:
        raise NotImplementedError

    def build_model(self) -> torch.nn.Module:
        if self.continuous:
            return self._build_continuous_model()
        return self._build_factored_model() if self.factored else super().build_model()

    def _build_continuous_model(self) -> torch.nn.Module:
        """The network for continuous actions: the base type's MLP network with the action vector as the
        dynamics input and a Gaussian policy head (:meth:`_continuous_network`); for image observations the
        conv network with the action as dynamics planes (:meth:`_continuous_conv_network`)."""
        return self._build_action_model(
            "continuous", self._continuous_network, self._continuous_conv_network(),
            action_dim=self.spec.action_dim,
        )  # fmt: skip

    def _build_factored_model(self) -> torch.nn.Module:
        """The network for factored actions: the base type's network with the factors' logits end to end as
        its policy and the one-hot per factor as its dynamics input (:meth:`_factored_network`; for image
        observations :meth:`_factored_conv_network`)."""
        return self._build_action_model(
            "factored", self._factored_network, self._factored_conv_network(), nvec=self.spec.action_nvec
        )

    def _factored_conv_network(self) -> type | None:
        """The network for image observations and factored actions (None: this type has none)."""
        return None

    def _continuous_conv_network(self) -> type | None:
        """The network for image observations and continuous actions (None: this type has none)."""
        return None

    def _build_action_model(
        self, kind: str, mlp_network: Callable[[], type], conv_network: type | None, **action: Any
    ) -> torch.nn.Module:
        """The network for ``kind`` actions (``action``: the keyword that describes them to the network):
        ``conv_network`` for image observations (refused where the type has none), else the MLP network
        ``mlp_network()`` returns, with the value-prefix LSTM where the type has one."""
        mc = self.cfg.model
        sizes = dict(value_support_size=mc.value_support_size, reward_support_size=mc.reward_support_size,
                     projection_dim=mc.projection_dim)  # fmt: skip
        if mc.kind == "conv":
            if conv_network is None:
                raise ConfigError("model.kind", mc.kind, f"{self.name} has no conv network for {kind} "
                                  f"actions yet: use sampled_muzero for images with {kind} actions")
            return conv_network(
                obs_shape=tuple(self.spec.obs_shape), num_channels=mc.num_channels,
                num_res_blocks=mc.num_res_blocks, downsample=mc.downsample, **action, **sizes,
            )  # fmt: skip
        extra = {"lstm_hidden_size": self.cfg.policy.lstm_hidden_size} if self._uses_lstm() else {}
        return mlp_network()(
            obs_dim=int(np.prod(self.spec.obs_shape)), latent_dim=mc.latent_dim, hidden_dim=mc.hidden_dim,
            num_hidden_layers=mc.num_hidden_layers, **action, **sizes, **extra,
        )  # fmt: skip

    def _uses_lstm(self) -> bool:
        return False

    # ---------------------------------------------------------------- acting

    def step_stat_names(self) -> tuple[str, ...]:
        return (*super().step_stat_names(), SAMPLED_ACTIONS)

    def edge_actions(self, out, edges: np.ndarray) -> np.ndarray:
        """The chosen slots' sampled actions: [B, D] float32, [B] int64 or [B, D] int64 (factored)."""
        return out.extras[SAMPLED_ACTIONS][np.arange(len(edges)), edges]

    def step_stats(self, out, legal_mask) -> dict[str, np.ndarray]:
        return {**super().step_stats(out, legal_mask), SAMPLED_ACTIONS: out.extras[SAMPLED_ACTIONS]}

    def reanalyze_stats(self, out) -> dict[str, np.ndarray]:
        """Fresh visit distributions and the sampled actions they are over (both written back)."""
        return {
            "child_visits": out.visit_distribution.astype(np.float32),
            SAMPLED_ACTIONS: out.extras[SAMPLED_ACTIONS],
        }

    # ---------------------------------------------------------------- loss

    def batch_extra_stats(self) -> tuple[str, ...]:
        return (*super().batch_extra_stats(), SAMPLED_ACTIONS)

    def policy_losses(self, policy_logits, batch: TrainBatch, target: torch.Tensor) -> torch.Tensor:
        """[B, K+1] ``-sum_slots p log pi(a_slot) - w_entropy * H(pi)`` of each unroll step (module
        docstring): ``policy_logits`` [B, K+1, P], ``target`` [B, K+1, slots]."""
        cross_entropy = self.policy_cross_entropies(policy_logits, batch, target)
        return cross_entropy - self.cfg.policy.policy_entropy_weight * self.policy_entropy(policy_logits)

    def policy_cross_entropies(self, policy_logits, batch: TrainBatch, target: torch.Tensor) -> torch.Tensor:
        """[B, K+1] :meth:`policy_cross_entropy` of each unroll step (each step's slots hold other sampled
        actions): ``policy_logits`` [B, K+1, P], ``target`` [B, K+1, slots]."""
        ce, steps = self.policy_cross_entropy, range(target.shape[1])
        return torch.stack([ce(policy_logits[:, k], batch, k, target[:, k]) for k in steps], 1)

    def policy_cross_entropy(self, policy_logits, batch: TrainBatch, k: int, target: torch.Tensor):
        """[B] ``-sum_slots p_slot log pi(a_slot)`` at unroll step k: ``policy_logits`` [B, P] (Gaussian
        params [B, 2D], logits [B, A], or the factors' logits [B, sum(nvec)]), ``target`` [B, K] the visit
        distribution over the K slots whose actions are ``batch.extras["sampled_actions"][:, k]`` ([B, K, D]
        float32, [B, K] int64 or [B, K, D] int64; empty slots hold action 0 with target 0, so every batch
        has one fixed shape)."""
        actions = torch.as_tensor(batch.extras[SAMPLED_ACTIONS][:, k], device=policy_logits.device)
        if self.continuous:
            log_prob = tanh_gaussian_log_prob(policy_logits, actions)  # [B, K], in at least fp32
        elif self.factored:
            log_prob = factored_log_prob(policy_logits, actions, self.spec.action_nvec)  # [B, K], >= fp32
        else:
            log_prob = F.log_softmax(policy_logits, dim=-1).gather(-1, actions.long())  # [B, K]
        return -(target * log_prob).sum(-1)

    def policy_entropy(self, policy_logits: torch.Tensor) -> torch.Tensor:
        if self.continuous:
            return gaussian_entropy(policy_logits.float())
        if self.factored:
            return factored_entropy(policy_logits, self.spec.action_nvec)
        return super().policy_entropy(policy_logits)


class SampledMuZeroPolicy(SampledPolicyMixin, MuZeroPolicy):
    """Sampled MuZero: MuZero with the sampled search (discrete or continuous actions)."""

    name = "sampled_muzero"

    def _continuous_network(self) -> type:
        return MLPGaussianMuZeroNet

    def _continuous_conv_network(self) -> type | None:
        return ConvGaussianMuZeroNet

    def _factored_network(self) -> type:
        return MLPFactoredMuZeroNet

    def _factored_conv_network(self) -> type | None:
        return ConvFactoredMuZeroNet


class SampledEfficientZeroPolicy(SampledPolicyMixin, EfficientZeroPolicy):
    """Sampled EfficientZero: EfficientZero's value-prefix LSTM with the sampled search."""

    name = "sampled_efficientzero"

    def _continuous_network(self) -> type:
        return MLPGaussianEfficientZeroNet

    def _factored_network(self) -> type:
        return MLPFactoredEfficientZeroNet

    def _uses_lstm(self) -> bool:
        return True
