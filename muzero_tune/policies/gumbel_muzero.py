"""Gumbel MuZero (Danihelka et al. 2022) as a policy plug-in: MuZero's model, targets and losses, with the
Gumbel search and the improved policy as the policy target.

* Acting: :class:`muzero_tune.mcts.gumbel.GumbelMuZeroSearch` (Gumbel-top-k + sequential halving at the root,
  the deterministic improved-policy rule inside the tree). The action taken is the search's selected action
  (the sequential-halving winner): with the root Gumbel noise (``policy.gumbel_scale``) when collecting,
  without it when evaluating. Gumbel-top-k sampling already explores, so the visit temperature and the
  Dirichlet noise of MuZero are not used.
* Stored per step: MuZero's ``child_visits`` (the root visit distribution), ``root_value``, ``legal_mask``,
  plus ``improved_policy`` (pi' = softmax(logits + sigma(completed Q)), [A] float32).
* Policy target: the stored ``improved_policy`` at t..t+K (gathered by ``make_batch(extra_stats=...)``),
  trained with MuZero's soft cross-entropy (= KL(pi' || p) + the target's entropy, a constant); the
  value, reward and SSL parts of the loss are MuZero's.
* Reanalyze (per batch and buffer) returns both ``improved_policy`` and ``child_visits``; the generic
  write-back stores each into the re-searched positions' stats.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from muzero_tune.mcts.gumbel import GumbelMuZeroSearch
from muzero_tune.models import logits_to_scalar
from muzero_tune.policies.base import ActOutput
from muzero_tune.policies.muzero import MuZeroPolicy
from muzero_tune.replay.targets import TrainBatch, make_batch

IMPROVED_POLICY = "improved_policy"


class GumbelMuZeroPolicy(MuZeroPolicy):
    """Gumbel MuZero on discrete actions (see the module docstring)."""

    name = "gumbel_muzero"

    def __init__(self, cfg, spec):
        super().__init__(cfg, spec)
        m, pc = cfg.mcts, cfg.policy
        self._search = GumbelMuZeroSearch(
            num_actions=spec.num_actions,
            num_simulations=m.num_simulations,
            max_num_considered_actions=pc.max_num_considered_actions,
            gumbel_scale=pc.gumbel_scale,
            c_visit=pc.gumbel_c_visit,
            c_scale=pc.gumbel_c_scale,
            discount=m.discount,
            value_delta_max=m.value_delta_max,
        )

    def step_stat_names(self) -> tuple[str, ...]:
        return (*super().step_stat_names(), IMPROVED_POLICY)

    # ---------------------------------------------------------------- search and acting

    @torch.no_grad()
    def _search_roots(self, model, obs, legal_mask, *, add_noise, deterministic, rng):
        was_training = model.training
        model.eval()
        dev = self._device(model)
        root = model.initial_inference(torch.as_tensor(obs, device=dev))
        predicted = logits_to_scalar(root.value_logits.float(), support_size=model.value_support_size)
        predicted = predicted.cpu().numpy().astype(np.float32)
        out = self._search.run(
            root_latent=root.latent,
            root_policy_logits=root.policy_logits.float().cpu().numpy(),
            legal_mask=np.asarray(legal_mask, dtype=bool),
            recurrent_fn=self._recurrent_fn(model),
            add_noise=add_noise,
            deterministic=deterministic,
            rng=rng,
            root_value=predicted,
        )
        model.train(was_training)
        return out, predicted

    def act(
        self, model, obs, legal_mask, *, explore, temperature, rng, state=None, env_index=None
    ) -> ActOutput:
        out, predicted = self._search_roots(
            model, obs, legal_mask, add_noise=explore, deterministic=True, rng=rng
        )
        stats = {
            "child_visits": out.visit_distribution.astype(np.float32),
            "root_value": out.root_value.astype(np.float32),
            "legal_mask": np.asarray(legal_mask, dtype=bool),
            IMPROVED_POLICY: out.extras[IMPROVED_POLICY].astype(np.float32),
        }
        return ActOutput(
            actions=out.extras["selected_action"].astype(np.int64),
            step_stats=stats,
            root_value=out.root_value,
            predicted_value=predicted,
        )

    def reanalyze(self, target_model, obs, legal_mask, rng) -> dict[str, np.ndarray]:
        """Fresh improved policies (the policy target of this type) and visit distributions, searched with
        the Gumbel noise; both are written back into the segments' stats."""
        return self._reanalyze_search(target_model, obs, legal_mask, rng)

    def _reanalyze_search(self, target_model, obs, legal_mask, rng) -> dict[str, np.ndarray]:
        out, _ = self._search_roots(
            target_model, obs, legal_mask, add_noise=True, deterministic=True, rng=rng
        )
        return {
            "child_visits": out.visit_distribution.astype(np.float32),
            IMPROVED_POLICY: out.extras[IMPROVED_POLICY].astype(np.float32),
        }

    # ---------------------------------------------------------------- targets

    def make_batch(
        self, sample, *, target_model, rng, reanalyze_count=0, defer_bootstrap=False
    ) -> TrainBatch:
        rc = self.cfg.replay
        batch = make_batch(
            sample,
            num_unroll_steps=rc.num_unroll_steps,
            td_steps=self.td_steps_of(sample),
            discount=self.cfg.mcts.discount,
            num_actions=self.spec.num_actions,
            value_fn=self.value_fn(target_model),
            rng=rng,
            all_obs=self.cfg.learn.ssl_loss_weight > 0,
            reanalyze_count=reanalyze_count,
            reanalyze_fn=lambda o, m: self.reanalyze(target_model, o, m, rng),
            extra_stats=(IMPROVED_POLICY,),
            defer_bootstrap=defer_bootstrap,
        )
        # the improved policy replaces the visit distribution as the policy target (zero where masked)
        return dataclasses.replace(batch, target_policy=batch.extras[IMPROVED_POLICY])
