"""MuZero (Schrittwieser et al. 2020) as a policy plug-in: model, batched pUCT search, targets, loss.

Loss per sample: policy cross-entropy, value and reward cross-entropy on categorical supports of h(x),
optional SSL consistency (negative cosine between the projected unrolled latent and the stop-gradient
projection of the real next observation's latent). The scale convention is LightZero's (see
:meth:`MuZeroPolicy.compute_loss`): the root and all K unrolled steps are summed and the whole loss is
multiplied by 1/K, so a learning rate and a gradient clip taken from a LightZero config mean the same here;
the gradient flowing back through each dynamics step is halved (MuZero paper, Appendix G).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from muzero_tune.mcts import MuZeroSearch, SearchOutput
from muzero_tune.models import build_network, logits_to_scalar, logits_to_scalar_np, two_hot_cross_entropy
from muzero_tune.models.host import host_search_step
from muzero_tune.models.traced import initial_value_logits, recurrent_outputs
from muzero_tune.policies.base import LossOutput, Policy, SearchRoots, eval_mode, loss_output, model_device
from muzero_tune.replay.targets import TrainBatch, make_batch, off_policy_td_steps

# the loss's metrics after train/loss_total, in the order compute_loss stacks their batch means
LOSS_METRICS = (
    "train/loss_policy",
    "train/loss_value",
    "train/loss_reward",
    "train/loss_ssl",
    "train/policy_entropy",
    "train/value_pred_mean",
    "train/value_target_mean",
)


def scale_gradient(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Identity forward; gradient multiplied by ``scale`` backward."""
    return x * scale + x.detach() * (1.0 - scale)


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """[B, C] logits, [B, C] target distribution -> [B]."""
    return -(target * F.log_softmax(logits, dim=-1)).sum(-1)


def root_loss_weight(k_steps: int, convention: str) -> float:
    """Weight of the root's (k = 0) loss terms relative to one unrolled step's, before the whole sum is
    multiplied by 1/K (``learn.unroll_loss_scale``): 1 for ``whole`` (LightZero's gradient hook: x 1/K on the
    whole sum, root included; the reference's SGD lr 0.2 / clip 10 of ``pong_muzero`` is then the same step),
    K for ``per_step`` (MuZero's pseudocode: the root x 1, each recurrent step x 1/K).

    With Adam the overall scale hardly matters but the root's share does. ``whole`` is the default: on
    CartPole, ``per_step`` made MuZero slower (seed 2: 12,464 env steps to eval 195 against 2,328). The
    ``cartpole_gumbel_muzero`` preset sets ``per_step``: its policy target, the improved policy, learns faster
    with the root at full weight (seeds 0-16: median 2,280 env steps, worst 8,600, against 2,936 / 4,984 with
    ``whole``).
    """
    if convention == "whole":
        return 1.0
    if convention == "per_step":
        return float(k_steps)
    raise ValueError(f"unroll_loss_scale must be 'whole' or 'per_step', got {convention!r}")


class MuZeroPolicy(Policy):
    """MuZero on discrete actions."""

    name = "muzero"
    ssl_latent_seam = True

    def __init__(self, cfg, spec):
        super().__init__(cfg, spec)
        self.search = self.make_search()  # the type's MCTS, built once and reused by every search call

    def search_knobs(self) -> dict:
        """The pUCT search settings every MuZero-style search takes (keyword arguments of its search)."""
        m = self.cfg.mcts
        return dict(
            num_actions=self.spec.num_actions,
            num_simulations=m.num_simulations,
            pb_c_base=m.pb_c_base,
            pb_c_init=m.pb_c_init,
            discount=m.discount,
            dirichlet_alpha=m.root_dirichlet_alpha,
            noise_weight=m.root_noise_weight,
            value_delta_max=m.value_delta_max,
            unvisited_q=m.unvisited_q,
            q_transform=m.q_transform,
        )

    def make_search(self):
        """This type's search object (an ``mcts`` search class); kept as :attr:`search`."""
        return MuZeroSearch(**self.search_knobs())

    def search_fns(self, model: torch.nn.Module) -> dict:
        """The network functions the search calls (keyword arguments of ``search.run``)."""
        return {"recurrent_fn": self.recurrent_fn(model)}

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
        )
        if mc.kind == "mlp":
            return build_network(
                **common,
                latent_dim=mc.latent_dim,
                hidden_dim=mc.hidden_dim,
                num_hidden_layers=mc.num_hidden_layers,
            )
        return build_network(
            **common, num_channels=mc.num_channels, num_res_blocks=mc.num_res_blocks, downsample=mc.downsample
        )

    def recurrent_fn(self, model: torch.nn.Module):
        """The search's model step: ``fn(latent [B, *state_shape], actions [B] int64)`` -> (next latent
        [B, *state_shape], rewards [B] float32, values [B] float32, policy logits [B, A] float32)."""
        dev = model_device(model)
        rs, vs = model.reward_support_size, model.value_support_size
        host = self.cfg.mcts.host_kernel

        def fn(latent: torch.Tensor, actions: np.ndarray):
            # the network call and the decoding as one numba kernel where the network allows it
            # (models/host.py: about a fifth of the traced graph's time at the collect batch)
            if host:
                step = host_search_step(model, latent, actions, reward_support_size=rs, value_support_size=vs)
                if step is not None:
                    return step
            # else one traced call where the network allows it (models/traced.py: ~0.55x the eager call)
            next_latent, reward_logits, value_logits, policy = recurrent_outputs(
                model, latent, torch.as_tensor(actions, device=dev)
            )
            # decoded in numba: per-op torch overhead would otherwise rival the network call
            reward = logits_to_scalar_np(reward_logits.float().cpu().numpy(), support_size=rs)
            value = logits_to_scalar_np(value_logits.float().cpu().numpy(), support_size=vs)
            return next_latent, reward, value, policy.float().cpu().numpy()

        return fn

    def root_inference(self, model, obs, state, env_index) -> SearchRoots:
        """The representation of each observation and its prediction."""
        root = model.initial_inference(obs)
        return SearchRoots(root.latent, root.policy_logits, root.value_logits)

    def run_search(self, model, roots: SearchRoots, legal_mask, *, add_noise, deterministic, rng):
        """The pUCT search (:attr:`search`) from ``roots`` with :meth:`search_fns`. The root value is the
        root's counted first visit. A search with root noise (collect, reanalyze) scores unvisited children
        by ``mcts.unvisited_q``, one without (evaluation) by ``eval.unvisited_q``."""
        predicted = logits_to_scalar(roots.value_logits.float(), support_size=model.value_support_size)
        out = self.search.run(
            root_latent=roots.latent,
            root_policy_logits=roots.policy_logits.float().cpu().numpy(),
            legal_mask=np.asarray(legal_mask, dtype=bool),
            add_noise=add_noise,
            deterministic=deterministic,
            rng=rng,
            root_value=predicted.cpu().numpy(),
            unvisited_q=self.cfg.mcts.unvisited_q if add_noise else self.cfg.eval.unvisited_q,
            **self.search_fns(model),
        )
        return out, predicted.cpu().numpy().astype(np.float32)

    def reanalyze(self, target_model, obs, legal_mask, rng) -> np.ndarray | dict[str, np.ndarray]:
        out, _ = self.search_observations(
            target_model, obs, legal_mask, add_noise=True, deterministic=False, rng=rng
        )
        return self.reanalyze_stats(out)

    def reanalyze_stats(self, out: SearchOutput) -> np.ndarray | dict[str, np.ndarray]:
        """What a reanalyze search ``out`` writes back (:meth:`Policy.reanalyze`): here the visit
        distributions [N, A]; a type that stores more per search (e.g. its sampled actions) returns a dict."""
        return out.visit_distribution.astype(np.float32)

    # ---------------------------------------------------------------- targets

    def value_fn(self, model: torch.nn.Module, *, chunk: int = 2048):
        dev = model_device(model)

        def fn(obs: np.ndarray) -> np.ndarray:
            vals = []
            with eval_mode(model):
                for lo in range(0, len(obs), chunk):
                    # traced where the network allows it (models/traced.py): on the learner's helper thread
                    # a traced graph runs without holding the GIL the loss's forward needs
                    logits = initial_value_logits(model, torch.as_tensor(obs[lo : lo + chunk], device=dev))
                    vals.append(logits_to_scalar(logits.float(), support_size=model.value_support_size))
            return torch.cat(vals).cpu().numpy()

        return fn

    def td_steps_of(self, sample) -> np.ndarray | int:
        """The n-step horizon of each sample's value targets: ``replay.td_steps``, or [B] int64 shortened by
        the data's age under the off-policy correction (``replay.off_policy_transitions_per_step``)."""
        rc = self.cfg.replay
        return off_policy_td_steps(
            sample.age_transitions,
            td_steps=rc.td_steps,
            td_steps_min=rc.td_steps_min,
            transitions_per_step=rc.off_policy_transitions_per_step,
        )

    def make_batch(
        self, sample, *, target_model, rng, reanalyze_count=0, defer_bootstrap=False
    ) -> TrainBatch:
        rc = self.cfg.replay
        return make_batch(
            sample,
            num_unroll_steps=rc.num_unroll_steps,
            td_steps=self.td_steps_of(sample),
            discount=self.cfg.mcts.discount,
            num_actions=self.spec.num_actions,
            action_dim=self.spec.action_dim,  # continuous: actions [B, K, D] float32
            action_nvec=self.spec.action_nvec,  # factored: actions [B, K, D] int64
            value_fn=self.value_fn(target_model),
            rng=rng,
            all_obs=self.cfg.learn.ssl_loss_weight > 0,
            reanalyze_count=reanalyze_count,
            reanalyze_fn=lambda o, m: self.reanalyze(target_model, o, m, rng),
            extra_stats=self.batch_extra_stats(),
            defer_bootstrap=defer_bootstrap,
        )

    def batch_extra_stats(self) -> tuple[str, ...]:
        """Per-step statistics besides the policy target that ``make_batch`` gathers into
        ``TrainBatch.extras`` [B, K+1, ...] (none for MuZero; e.g. sampled actions)."""
        return ()

    # ---------------------------------------------------------------- loss

    def policy_losses(self, policy_logits: torch.Tensor, batch: TrainBatch, target: torch.Tensor):
        """[B, K+1] policy loss of every unroll step (0 = root) before masking, from the heads' outputs
        ``policy_logits`` [B, K+1, P] and the targets ``target`` [B, K+1, A] (= ``batch.target_policy``):
        here :meth:`policy_cross_entropies` (a type with an entropy bonus subtracts it here)."""
        return self.policy_cross_entropies(policy_logits, batch, target)

    def policy_cross_entropies(self, policy_logits: torch.Tensor, batch: TrainBatch, target: torch.Tensor):
        """[B, K+1] cross-entropy of every unroll step's policy ``policy_logits`` [B, K+1, P] against its
        target ``target`` [B, K+1, A]: here all steps at once (one log-softmax over the stacked logits, the
        same values and gradients as one per step); a type whose cross-entropy needs per-step data (the
        sampled types: each step's sampled actions) overrides it."""
        return soft_cross_entropy(policy_logits, target)

    def policy_entropy(self, policy_logits: torch.Tensor) -> torch.Tensor:
        """[B] entropy of the policy that ``policy_logits`` [B, P] describe (``train/policy_entropy``)."""
        probs = F.softmax(policy_logits.float(), dim=-1)
        return -(probs * torch.log(probs + 1e-12)).sum(-1)

    def reward_targets(self, batch: TrainBatch) -> np.ndarray:
        """[B, K] raw targets of the reward head along the unroll (EfficientZero: value prefixes)."""
        return batch.target_reward

    def unroll_step(self, model, latent: torch.Tensor, action: torch.Tensor, carry, k: int):
        """One dynamics step of the training unroll (k = 1..K): (recurrent output, carry for step k + 1).

        ``carry`` is state the type threads through the unroll besides the latent (None for MuZero; the
        value-prefix LSTM state for EfficientZero)."""
        return model.recurrent_inference(latent, action), None

    def compute_loss(
        self,
        model,
        batch: TrainBatch,
        *,
        train_iter: int,
        ssl_latent: Callable[[int], torch.Tensor | None] | None = None,
    ) -> LossOutput:
        """The training loss of one batch.

        Per sample, with steps k = 0 (root, s_0 = repr(o_t)) .. K (unrolled) and the root's weight
        w_0 = :func:`root_loss_weight` (``learn.unroll_loss_scale``: 1 for ``whole``, the default; K for
        ``per_step``):

            per_sample = (1/K) * (w_0 [w_p CE(p_0, pi_t) + w_v CE(v_0, z_t)]
                                  + sum_{k=1..K} [w_p CE(p_k, pi_{t+k}) + w_v CE(v_k, z_{t+k})])
                       + (1/K) * sum_{k=1..K} [w_r CE(r_k, u_{t+k-1}) + w_ssl (-cos_k)]

        and ``loss = mean(IS weight x per_sample)`` over the batch. With ``whole`` the 1/K scales the root
        terms too, as LightZero's gradient hook (x 1/num_unroll_steps on the weighted total loss) does; the
        ``pong_muzero`` preset's SGD lr 0.2 and clip 10 are then the same step as there. The gradient into
        each dynamics step's input latent is halved (MuZero Appendix G). Metrics ``train/loss_policy`` /
        ``_value`` / ``_reward`` / ``_ssl`` are the batch means of each term's (weighted) sum over the steps
        x 1/K, so with uniform IS weights ``train/loss_total`` = sum of weight x term (LightZero logs the
        sums without the 1/K: K x these figures).

        ``ssl_latent(k)``: the SSL target latent of step k computed elsewhere (the learner's helper thread,
        :class:`~muzero_tune.pipeline.ssl_offload.SslOffload`), or None to encode ``o_{t+k}`` here.
        """
        lc = self.cfg.learn
        dev = model_device(model)

        def t(x, dtype=torch.float32):
            return torch.as_tensor(x, device=dev, dtype=dtype)

        obs = torch.as_tensor(batch.obs, device=dev)
        # [B, K] indices (discrete) or [B, K, D] float32 in [-1, 1] (continuous)
        actions = torch.as_tensor(batch.actions, device=dev)  # arrays or tensors (a compiled loss's batch)
        actions = actions.float() if actions.is_floating_point() else actions.long()
        tr, tp = t(self.reward_targets(batch)), t(batch.target_policy)
        vmask, rmask, pmask, omask = (
            t(batch.value_mask),
            t(batch.reward_mask),
            t(batch.policy_mask),
            t(batch.obs_mask),
        )
        vs, rs = model.value_support_size, model.reward_support_size
        k_steps = batch.actions.shape[1]

        root_w = root_loss_weight(k_steps, lc.unroll_loss_scale)

        root = model.initial_inference(obs[:, 0])
        ssl_loss = torch.zeros(obs.shape[0], device=dev)
        use_ssl = lc.ssl_loss_weight > 0 and obs.shape[1] == k_steps + 1
        # K+1, K+1 and K of [B, C]: each head's outputs, for one loss call over all steps after the unroll
        policy_logits, value_logits, reward_logits = [root.policy_logits], [root.value_logits], []
        latent = root.latent
        carry = None
        for k in range(1, k_steps + 1):
            rec, carry = self.unroll_step(model, latent, actions[:, k - 1], carry, k)
            latent = scale_gradient(rec.latent, 0.5)
            value_logits.append(rec.value_logits)
            reward_logits.append(rec.reward_logits)
            policy_logits.append(rec.policy_logits)
            if use_ssl:
                with torch.no_grad():
                    target_latent = ssl_latent(k) if ssl_latent is not None else None
                    if target_latent is None:
                        target_latent = model.represent(obs[:, k])
                    target_proj = model.project(target_latent, with_prediction_head=False)
                online = model.project(rec.latent, with_prediction_head=True)
                cos = F.cosine_similarity(online, target_proj.detach(), dim=-1)
                ssl_loss = ssl_loss + (-cos) * omask[:, k]
        policy_ce = self.policy_losses(torch.stack(policy_logits, 1), batch, tp) * pmask  # [B, K+1]
        # read last: a bootstrap forward on the learner's helper thread ran alongside the unroll above
        tv = t(batch.value_targets())  # [B, K+1]
        # the value and reward cross-entropies of all steps at once: one log-softmax and gather each
        value_ce = two_hot_cross_entropy(torch.stack(value_logits, 1), tv, support_size=vs) * vmask  # [B,K+1]
        if root_w != 1.0:
            policy_ce, value_ce = (torch.cat([root_w * x[:, :1], x[:, 1:]], 1) for x in (policy_ce, value_ce))
        policy_loss, value_loss = policy_ce.sum(1), value_ce.sum(1)  # [B]
        reward_loss = (
            two_hot_cross_entropy(torch.stack(reward_logits, 1), tr, support_size=rs) * rmask
        ).sum(1)  # [B]

        # LightZero's whole-loss 1/K, on each summed term so the metrics below add up to the loss
        policy_loss, value_loss, reward_loss, ssl_loss = (
            x / k_steps for x in (policy_loss, value_loss, reward_loss, ssl_loss)
        )
        per_sample = (
            lc.policy_loss_weight * policy_loss
            + lc.value_loss_weight * value_loss
            + lc.reward_loss_weight * reward_loss
            + lc.ssl_loss_weight * ssl_loss
        )
        weights = t(batch.weights)
        loss = (weights * per_sample).mean()
        # priorities and metrics off the autograd graph, every metric read in one tensor-to-list (one small
        # op and sync each would cost about what the reward loss does at batch 256). The priorities stay in
        # torch's fp32 arithmetic: a decode in numba's float64 moves them by ~1e-7, and through prioritized
        # sampling that changes which samples a run trains on
        with torch.no_grad():
            pred_v0 = logits_to_scalar(root.value_logits.float(), support_size=vs)  # [B]
            priorities = (pred_v0 - tv[:, 0]).abs() + 1e-6  # [B] float32
            entropy = self.policy_entropy(root.policy_logits)  # [B]
            terms = [policy_loss, value_loss, reward_loss, ssl_loss, entropy, pred_v0, tv[:, 0]]  # 7 of [B]
            means = torch.stack(terms).mean(1)
        return loss_output(loss, per_sample, priorities, means, LOSS_METRICS)
