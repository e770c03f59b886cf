"""Sampled UniZero: UniZero's transformer world model with the sampled search: discrete, continuous or
factored actions.

A composition, nothing copied: :class:`~muzero_tune.policies.sampled.SampledPolicyMixin` (the sampled search,
the K sampled actions stored per step and rewritten by reanalyze, acting by slot, the sampled policy
cross-entropy) before :class:`~muzero_tune.policies.unizero.UniZeroPolicy` (the world model, its exact per-env
and per-node KV caches and their invalidation, the teacher-forced loss with its per-term means over the
valid steps, targets from the target world model inside the buffer owner: bootstrap values and reanalyze
searches from the root acting would build at each position, its window of the last ``context_tokens // 2``
observations and the actions between them, cut at the episode start).

* **Model** -- :class:`~muzero_tune.models.unizero_net.UniZeroNet`. Continuous actions: the action token is a
  linear map of the action vector [B, D] in [-1, 1] and the policy head on observation tokens outputs the
  tanh-Gaussian's ``[mu (D), log_sigma (D)]`` [B, 2D] (last layer initialised as the MLP types' Gaussian head,
  :func:`~muzero_tune.models.sampled_net.gaussian_head`). Discrete actions: an action embedding table and A
  logits, as ``unizero``. Factored actions (a ``MultiDiscrete`` taken by its factors): the action token is
  the sum of one embedding per factor value (:class:`~muzero_tune.models.factored_net.FactorEmbedding`) and
  the policy head outputs the factors' logits end to end, [B, sum(nvec)].
* **Stored per step** -- ``child_visits`` [K], ``sampled_actions`` [K, D] float32 / [K] int64 / [K, D]
  int64, ``root_value``,
  ``legal_mask``. Shapes are fixed whatever the env: slots left empty (fewer legal actions than K) hold action
  0 with visit share 0, and steps past a segment's data are zero and masked, so the bootstrap (training) batch
  ``extras["sampled_actions"]`` is always [B, K+1, K(, D)] (the reference's discrete branch leaves it ragged).
* **Loss** -- UniZero's teacher-forced loss; at every observation token k the policy term is the sampled
  cross-entropy ``-sum_slots p_slot log pi(a_slot)`` (tanh-Gaussian log-density, log-softmax at the sampled
  ids: the discrete-sampled loss the reference lacks, or the factors' joint log-probability), and UniZero's
  entropy bonus uses this head's entropy (pre-tanh Gaussian / categorical / the factors' summed entropies),
  subtracted once per step.
"""

from __future__ import annotations

from muzero_tune.models.factored_net import FactorEmbedding
from muzero_tune.models.sampled_net import gaussian_head
from muzero_tune.models.unizero_net import UniZeroNet
from muzero_tune.policies.sampled import SampledPolicyMixin
from muzero_tune.policies.unizero import UniZeroPolicy


class SampledUniZeroPolicy(SampledPolicyMixin, UniZeroPolicy):
    """Sampled UniZero (module docstring)."""

    name = "sampled_unizero"

    def _build_continuous_model(self) -> UniZeroNet:
        d = self.spec.action_dim
        net = self._build_world_model(policy_dim=2 * d)
        net.policy_head[-1] = gaussian_head(net.policy_head[-1].in_features, d)
        return net

    def _build_factored_model(self) -> UniZeroNet:
        nvec = self.spec.action_nvec
        net = self._build_world_model(policy_dim=sum(nvec))
        net.action_embed = FactorEmbedding(nvec, net.embed_dim)  # takes the [N, D] factor indices
        return net
