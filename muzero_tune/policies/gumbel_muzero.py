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

from muzero_tune.mcts.gumbel import GumbelMuZeroSearch
from muzero_tune.models import logits_to_scalar
from muzero_tune.policies.muzero import MuZeroPolicy
from muzero_tune.replay.targets import TrainBatch, make_batch

IMPROVED_POLICY = "improved_policy"


class GumbelMuZeroPolicy(MuZeroPolicy):
    """Gumbel MuZero on discrete actions (see the module docstring)."""

    name = "gumbel_muzero"

    def make_search(self):
        m, pc = self.cfg.mcts, self.cfg.policy
        return GumbelMuZeroSearch(
            num_actions=self.spec.num_actions,
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

    def run_search(self, model, roots, legal_mask, *, add_noise, deterministic, rng):
        """Sequential halving from ``roots``; ties are always broken by index (the Gumbel noise, drawn when
        ``add_noise``, is the search's only randomness)."""
        predicted = logits_to_scalar(roots.value_logits.float(), support_size=model.value_support_size)
        predicted = predicted.cpu().numpy().astype(np.float32)
        out = self.search.run(
            root_latent=roots.latent,
            root_policy_logits=roots.policy_logits.float().cpu().numpy(),
            legal_mask=np.asarray(legal_mask, dtype=bool),
            recurrent_fn=self.recurrent_fn(model),
            add_noise=add_noise,
            deterministic=True,
            rng=rng,
            root_value=predicted,
        )
        return out, predicted

    def choose_edges(self, out, *, explore, temperature, rng) -> np.ndarray:
        """The action sequential halving selected (exploring or not)."""
        return out.extras["selected_action"].astype(np.int64)

    def step_stats(self, out, legal_mask) -> dict[str, np.ndarray]:
        improved = out.extras[IMPROVED_POLICY].astype(np.float32)
        return {**super().step_stats(out, legal_mask), IMPROVED_POLICY: improved}

    def reanalyze_stats(self, out) -> dict[str, np.ndarray]:
        """Fresh improved policies (the policy target of this type) and visit distributions, searched with
        the Gumbel noise; both are written back into the segments' stats."""
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
