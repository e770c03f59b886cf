"""Stochastic MuZero (Antonoglou et al. 2022) as a policy plug-in: model, chance-node search, targets, loss.

Acting: :class:`~muzero_tune.mcts.stochastic.StochasticMuZeroSearch` with ``afterstate_fn`` (afterstate
dynamics + afterstate prediction) and ``recurrent_fn`` (dynamics from a chance code + prediction). Stored per
step: the MuZero statistics only (visit distribution, root value, legal mask); nothing chance-specific.

Targets: MuZero's (:func:`muzero_tune.replay.targets.make_batch`) with ``all_obs=True``, so the batch carries
the stacked observations o_t..o_{t+K}; the chance codes for training come from the learned chance encoder
applied to consecutive real observations (o_{t+k}, o_{t+k+1}), never from env-provided labels.

Loss of one sample, unrolling s_0 = repr(o_t), and for k = 0..K-1: as_k = phi(s_k, a_k),
(Q_k, sigma_k) = psi(as_k), c_k = onehot_st(e(o_{t+k}, o_{t+k+1})), (s_{k+1}, r_k) = g(as_k, c_k):

* policy CE(p(s_k), pi_{t+k}), value CE(v(s_k), z_{t+k}) for k = 0..K, reward CE(r_k, u_{t+k}) -- as MuZero
  (weights ``learn.*_loss_weight``; gradient into each dynamics step halved);
* afterstate value CE(Q_k, z_{t+k}) x ``policy.afterstate_value_loss_weight`` (Q(s_t+k, a_t+k) is
  estimated by the same n-step return as V(s_t+k), the one that followed a_t+k);
* afterstate chance-prior CE(sigma_k, stop_grad(c_k)) x ``policy.afterstate_policy_loss_weight``;
* commitment ||stop_grad(c_k) - softmax(e logits)||^2 x ``policy.commitment_loss_weight``;
  chance terms are masked where o_{t+k+1} is not a real observation.

Scale: as :meth:`MuZeroPolicy.compute_loss` -- every term is summed over its steps, the root's value and
policy terms weighted by :func:`~muzero_tune.policies.muzero.root_loss_weight` (1 under the default
``learn.unroll_loss_scale=whole``, LightZero's x 1/num_unroll_steps gradient hook; K under ``per_step``), and
the whole per-sample loss is multiplied by 1/K.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from muzero_tune.mcts.stochastic import StochasticMuZeroSearch
from muzero_tune.models.host import host_afterstate_step, host_chance_step
from muzero_tune.models.stochastic_net import build_stochastic_network
from muzero_tune.models.support import logits_to_scalar, logits_to_scalar_np, scalar_to_target
from muzero_tune.models.traced import traced_method
from muzero_tune.policies.base import LossOutput, loss_output, model_device
from muzero_tune.policies.muzero import MuZeroPolicy, root_loss_weight, scale_gradient, soft_cross_entropy
from muzero_tune.replay.targets import TrainBatch, make_batch

# the loss's metrics after train/loss_total, in the order compute_loss gathers their batch means
LOSS_METRICS = (
    "train/loss_policy",
    "train/loss_value",
    "train/loss_reward",
    "train/loss_afterstate_value",
    "train/loss_afterstate_policy",
    "train/loss_commitment",
    "train/chance_codes_used",
    "train/value_pred_mean",
    "train/value_target_mean",
)


class StochasticMuZeroPolicy(MuZeroPolicy):
    """Stochastic MuZero on discrete actions with a learned chance encoder."""

    name = "stochastic_muzero"
    ssl_latent_seam = False  # its own loss

    def make_search(self):
        return StochasticMuZeroSearch(num_chances=self.cfg.policy.chance_space_size, **self.search_knobs())

    # ---------------------------------------------------------------- model

    def build_model(self) -> torch.nn.Module:
        mc = self.cfg.model
        return build_stochastic_network(
            kind=mc.kind,
            obs_shape=tuple(self.spec.obs_shape),
            num_actions=self.spec.num_actions,
            chance_space_size=self.cfg.policy.chance_space_size,
            latent_dim=mc.latent_dim,
            hidden_dim=mc.hidden_dim,
            num_hidden_layers=mc.num_hidden_layers,
            value_support_size=mc.value_support_size,
            reward_support_size=mc.reward_support_size,
        )

    def search_fns(self, model) -> dict:
        dev = model_device(model)
        vs, rs = model.value_support_size, model.reward_support_size
        host = self.cfg.mcts.host_kernel

        def afterstate_fn(latent: torch.Tensor, actions: np.ndarray):
            # numba kernels where the network allows them (models/host.py), else traced calls (traced.py)
            if host:
                step = host_afterstate_step(model, latent, actions, value_support_size=vs)
                if step is not None:
                    return step
            afterstate, q_logits, chance_logits = traced_method(
                model, "afterstate_inference", latent, torch.as_tensor(actions, device=dev)
            )
            q = logits_to_scalar_np(q_logits.float().cpu().numpy(), support_size=vs)
            return afterstate, q, chance_logits.float().cpu().numpy()

        def recurrent_fn(afterstate: torch.Tensor, codes: np.ndarray):
            if host:
                step = host_chance_step(
                    model, afterstate, codes, reward_support_size=rs, value_support_size=vs
                )
                if step is not None:
                    return step
            latent, r_logits, v_logits, p_logits = traced_method(
                model, "chance_inference", afterstate, torch.as_tensor(codes, device=dev)
            )
            reward = logits_to_scalar_np(r_logits.float().cpu().numpy(), support_size=rs)
            value = logits_to_scalar_np(v_logits.float().cpu().numpy(), support_size=vs)
            return latent, reward, value, p_logits.float().cpu().numpy()

        return {"recurrent_fn": recurrent_fn, "afterstate_fn": afterstate_fn}

    # ---------------------------------------------------------------- targets

    def make_batch(
        self, sample, *, target_model, rng, reanalyze_count=0, defer_bootstrap=False
    ) -> TrainBatch:
        """MuZero targets plus the observations o_t..o_{t+K} (``all_obs=True``) for the chance encoder."""
        rc = self.cfg.replay
        return make_batch(
            sample,
            num_unroll_steps=rc.num_unroll_steps,
            td_steps=self.td_steps_of(sample),
            discount=self.cfg.mcts.discount,
            num_actions=self.spec.num_actions,
            value_fn=self.value_fn(target_model),
            rng=rng,
            all_obs=True,
            reanalyze_count=reanalyze_count,
            reanalyze_fn=lambda o, m: self.reanalyze(target_model, o, m, rng),
            defer_bootstrap=defer_bootstrap,
        )

    # ---------------------------------------------------------------- loss

    def compute_loss(self, model, batch: TrainBatch, *, train_iter: int) -> LossOutput:
        lc, pc = self.cfg.learn, self.cfg.policy
        dev = model_device(model)

        def t(x, dtype=torch.float32):
            return torch.as_tensor(x, device=dev, dtype=dtype)

        obs = torch.as_tensor(batch.obs, device=dev)  # [B, K+1, *obs_shape]
        actions = t(batch.actions, torch.long)
        tv, tr, tp = t(batch.value_targets()), t(batch.target_reward), t(batch.target_policy)
        vmask, rmask, pmask, omask = (
            t(batch.value_mask),
            t(batch.reward_mask),
            t(batch.policy_mask),
            t(batch.obs_mask),
        )
        vs, rs = model.value_support_size, model.reward_support_size
        k_steps = batch.actions.shape[1]
        if obs.shape[1] != k_steps + 1:
            raise ValueError(f"stochastic_muzero needs observations at t..t+K, got obs {tuple(obs.shape)}")
        v_targets = scalar_to_target(tv, support_size=vs)  # [B, K+1, 2Sv+1]

        root = model.initial_inference(obs[:, 0])
        latent, v_logits, p_logits = root.latent, root.value_logits, root.policy_logits
        value_loss = soft_cross_entropy(v_logits, v_targets[:, 0]) * vmask[:, 0]
        policy_loss = soft_cross_entropy(p_logits, tp[:, 0]) * pmask[:, 0]
        root_w = root_loss_weight(k_steps, lc.unroll_loss_scale)
        if root_w != 1.0:
            value_loss, policy_loss = root_w * value_loss, root_w * policy_loss
        pred_v0 = v_logits
        # chance codes of all K transitions (o_{t+k}, o_{t+k+1}) in one encoder call: [B, K, C]
        bsz, n_codes = obs.shape[0], model.chance_space_size
        flat = (bsz * k_steps, *obs.shape[2:])
        codes, enc_logits = model.encode_chance(obs[:, :-1].reshape(flat), obs[:, 1:].reshape(flat))
        codes, enc_logits = codes.view(bsz, k_steps, n_codes), enc_logits.view(bsz, k_steps, n_codes)
        target_codes = codes.detach()  # exact one-hots
        cmask = omask[:, 1:]  # [B, K] o_{t+k+1} is a real observation
        commit = (target_codes - F.softmax(enc_logits, dim=-1)).pow(2).sum(-1)  # [B, K]
        commit_loss = (commit * cmask).sum(1)
        r_targets = scalar_to_target(tr, support_size=rs)  # [B, K, 2Sr+1]
        zeros = torch.zeros_like(value_loss)
        reward_loss, q_loss, chance_loss = zeros, zeros, zeros
        for k in range(k_steps):
            afterstate = model.afterstate_dynamics(latent, actions[:, k])
            q_logits, chance_logits = model.afterstate_predict(afterstate)
            q_loss = q_loss + soft_cross_entropy(q_logits, v_targets[:, k]) * vmask[:, k]
            chance_loss = chance_loss + soft_cross_entropy(chance_logits, target_codes[:, k]) * cmask[:, k]
            next_latent, r_logits = model.dynamics(afterstate, codes[:, k])
            latent = scale_gradient(next_latent, 0.5)
            v_logits, p_logits = model.predict(next_latent)
            step_v = soft_cross_entropy(v_logits, v_targets[:, k + 1]) * vmask[:, k + 1]
            step_p = soft_cross_entropy(p_logits, tp[:, k + 1]) * pmask[:, k + 1]
            step_r = soft_cross_entropy(r_logits, r_targets[:, k]) * rmask[:, k]
            value_loss = value_loss + step_v
            policy_loss = policy_loss + step_p
            reward_loss = reward_loss + step_r

        # LightZero's whole-loss 1/K (see MuZeroPolicy.compute_loss), on each summed term
        policy_loss, value_loss, reward_loss, q_loss, chance_loss, commit_loss = (
            x / k_steps for x in (policy_loss, value_loss, reward_loss, q_loss, chance_loss, commit_loss)
        )
        per_sample = (
            lc.policy_loss_weight * policy_loss
            + lc.value_loss_weight * value_loss
            + lc.reward_loss_weight * reward_loss
            + pc.afterstate_value_loss_weight * q_loss
            + pc.afterstate_policy_loss_weight * chance_loss
            + pc.commitment_loss_weight * commit_loss
        )
        loss = (t(batch.weights) * per_sample).mean()
        with torch.no_grad():
            v0 = logits_to_scalar(pred_v0.float(), support_size=vs)
            priorities = (v0 - tv[:, 0]).abs() + 1e-6  # [B] float32
            usage = (target_codes * cmask[..., None]).sum((0, 1)) / cmask.sum().clamp_min(1.0)
            terms = [policy_loss, value_loss, reward_loss, q_loss, chance_loss, commit_loss]  # 6 of [B]
            means = torch.cat([
                torch.stack([x.float() for x in terms]).mean(1), (usage > 0.01).sum().float().reshape(1),
                torch.stack([v0.mean(), tv[:, 0].mean()]),
            ])  # fmt: skip
        return loss_output(loss, per_sample, priorities, means, LOSS_METRICS)
