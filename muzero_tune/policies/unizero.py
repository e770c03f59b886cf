"""UniZero (Pu et al. 2024) as a policy plug-in: a transformer world model, MuZero's pUCT search through it.

* **Model** -- :class:`~muzero_tune.models.unizero_net.UniZeroNet` (tokenizer + causal transformer over
  [o0, a0, o1, a1, ...]).
* **Acting** -- each env's root is the transformer's output at its current observation token, with the env's
  last ``policy.context_tokens // 2`` observations and the actions between them as context (the window slides
  by one (observation, action) pair per step once full). The search is MuZero's (:class:`MuZeroSearch`);
  its ``recurrent_fn`` appends the edge's action token (reward and next latent heads) and then the predicted
  observation token (value and policy heads) to the parent node's context, found by node id
  (``wants_node_ids``, :func:`muzero_tune.mcts.search.call_recurrent`) in a per-node store.
* **Caches** (``policy.kv_cache``) -- exact by construction, never stale:

  - Per env (:class:`UniZeroActState`, one object per caller, so collectors and evaluators never share one),
    the context after the previous root is kept with its keys/values, and the next root only computes its two
    new tokens; per node, the search keeps each node's keys/values and a child computes only its own tokens.
  - A window that would overflow drops its oldest pair and is recomputed from its raw tokens (never by
    shifting keys). ``policy.kv_cache_clear_interval`` drops an env's keys every that many episode steps
    (recomputed from the raw window: outputs unchanged); an episode start empties that env's context.
  - Every context carries the fingerprint of the weights that computed it
    (:func:`~muzero_tune.models.kv_cache.weights_tag`: any in-place write to any parameter changes it), so a
    context from other weights is never used: the env's raw observations and actions of the window are kept
    and re-encoded with the current weights. :meth:`on_weights_loaded` (actors, after every snapshot) and
    :meth:`on_train_budget_done` (the driver, after each budget) bump the models' cache epochs and drop the
    search's node store on top.
* **Targets** -- MuZero's (:func:`~muzero_tune.replay.targets.make_batch`, all K+1 observations), inside the
  single buffer owner: bootstrap values and reanalyze searches run the *target* world model from the root
  acting would build at that position -- the window [o_{p-S+1}, a_{p-S+1}, ..., a_{p-1}, o_p] of the stored
  game (S = ``context_obs``; cut at the episode start as acting's window is emptied there, and where the
  steps before a segment are not held). The policy declares ``context_steps`` = S - 1, the target code
  gathers those steps (:class:`~muzero_tune.replay.targets.PastSteps`) and :meth:`window_roots` builds
  all N roots in one batched transformer call.
* **Loss** -- teacher-forced over the K-step sequence [o_t, a_t, ..., a_{t+K-1}, o_{t+K}] (one transformer
  pass): next-latent loss against the target model's tokenizer (MSE with LayerNorm latents, group KL with
  SimNorm), cross-entropy on reward, value and policy, minus a policy entropy bonus (:meth:`compute_loss`);
  each term is the mean over the steps its mask keeps (steps past the data do not dilute it).
  The policy terms go through :meth:`policy_cross_entropies` and :meth:`policy_entropy`, so a type with
  another policy head (``sampled_unizero``: K sampled actions, a Gaussian) plugs in without a second loss.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F

from muzero_tune.errors import ConfigError
from muzero_tune.models import logits_to_scalar, logits_to_scalar_np, scalar_to_target
from muzero_tune.models.kv_cache import NodeContextStore, TokenContext, bump_cache_epoch, weights_tag
from muzero_tune.models.traced import traced_method
from muzero_tune.models.unizero_net import UniZeroNet, default_max_tokens, token_sequence
from muzero_tune.policies.base import LossOutput, SearchRoots, eval_mode, loss_output, model_device
from muzero_tune.policies.muzero import MuZeroPolicy, soft_cross_entropy
from muzero_tune.replay.targets import PastSteps, TrainBatch, make_batch

TARGET_LATENT = "unizero_target_latent"  # TrainBatch.extras: [B, K, E] the target tokenizer's next latents

# the loss's metrics after train/loss_total, in the order compute_loss gathers their batch means
LOSS_METRICS = (
    "train/loss_latent",
    "train/loss_value",
    "train/loss_reward",
    "train/loss_policy",
    "train/policy_entropy",
    "train/value_pred_mean",
    "train/value_target_mean",
)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, K] per-step terms and their [B, K] 0/1 mask -> [B]: the mean over the steps the mask keeps
    (0 where it keeps none)."""
    return (x * mask).sum(1) / mask.sum(1).clamp_min(1.0)


@dataclasses.dataclass(frozen=True, eq=False)
class UniZeroActState:
    """The acting state of one caller's N envs (S = context_tokens // 2 observations per root window).

    step:     [N] int64 act steps since the env's episode start.
    obs_hist: [N, S-1, *obs_shape] the env's previous observations in the window, oldest first (None before
              the first step), with ``act_hist`` [N, S-1] int64 (or [N, S-1, D] float32) the action taken at
              each; ``hist_len`` [N] how many are real (0..S-1).
    ctx:      the env's context after its previous root ([o..., o_{t-1}] tokens and maybe keys), or None.
    """

    step: np.ndarray
    hist_len: np.ndarray
    obs_hist: np.ndarray | None = None
    act_hist: np.ndarray | None = None
    ctx: TokenContext | None = None

    @staticmethod
    def initial(num_envs: int) -> UniZeroActState:
        return UniZeroActState(step=np.zeros(num_envs, np.int64), hist_len=np.zeros(num_envs, np.int64))

    def reset(self, env_index: int) -> UniZeroActState:
        step, hist_len = self.step.copy(), self.hist_len.copy()
        step[env_index] = hist_len[env_index] = 0
        ctx = self.ctx
        if ctx is not None:
            length = ctx.length.copy()
            length[env_index] = 0
            ctx = dataclasses.replace(ctx, length=length).without_cache([env_index])
        return dataclasses.replace(self, step=step, hist_len=hist_len, ctx=ctx)


@dataclasses.dataclass(frozen=True, eq=False)
class RootContexts:
    """A UniZero ``SearchRoots.context``: the B root windows ending at o_t (the search's root contexts) and,
    when acting, the pre-root contexts of all N envs they were built from (None elsewhere)."""

    roots: TokenContext  # B rows
    all_envs: TokenContext | None = None  # N rows


class UniZeroPolicy(MuZeroPolicy):
    """UniZero on discrete actions (module docstring)."""

    name = "unizero"
    ssl_latent_seam = False  # its own loss

    def __init__(self, cfg, spec):
        super().__init__(cfg, spec)
        pc = cfg.policy
        e, h = pc.world_model_embed_dim, pc.world_model_heads
        if e % h or (e // h) % 2:
            raise ConfigError(
                "policy.world_model_heads", h, f"world_model_embed_dim={e} must split into heads of even size"
            )
        if pc.latent_norm == "simnorm" and e % pc.simnorm_group_size:
            raise ConfigError(
                "policy.simnorm_group_size", pc.simnorm_group_size, f"must divide world_model_embed_dim={e}"
            )
        self.context_obs = max(pc.context_tokens // 2, 1)  # S: observations in a root window
        self.root_limit = 2 * self.context_obs - 1  # tokens of a full root window
        self.context_steps = self.context_obs - 1  # past steps a target's root window holds (Policy)
        self.max_tokens = default_max_tokens(cfg.replay.num_unroll_steps, pc.context_tokens)
        self.use_cache = bool(pc.kv_cache)
        self.node_contexts = NodeContextStore()

    # ---------------------------------------------------------------- model

    def build_model(self) -> UniZeroNet:
        return self._build_world_model()

    def _build_world_model(self, *, policy_dim: int | None = None) -> UniZeroNet:
        """The world model for this env; ``policy_dim`` P: the width of the policy head (None: A logits)."""
        mc, pc = self.cfg.model, self.cfg.policy
        return UniZeroNet(
            obs_shape=tuple(self.spec.obs_shape),
            num_actions=self.spec.num_actions,
            action_dim=self.spec.action_dim,
            policy_dim=policy_dim,
            kind=mc.kind,
            embed_dim=pc.world_model_embed_dim,
            num_layers=pc.world_model_layers,
            num_heads=pc.world_model_heads,
            max_tokens=self.max_tokens,
            positional=pc.positional,
            latent_norm=pc.latent_norm,
            simnorm_group_size=pc.simnorm_group_size,
            hidden_dim=mc.hidden_dim,
            num_channels=mc.num_channels,
            num_res_blocks=mc.num_res_blocks,
            downsample=mc.downsample,
            value_support_size=mc.value_support_size,
            reward_support_size=mc.reward_support_size,
        )

    # ---------------------------------------------------------------- acting state and hooks

    def initial_act_state(self, num_envs: int) -> UniZeroActState:
        return UniZeroActState.initial(num_envs)

    def reset_act_state(self, state: UniZeroActState, env_index: int) -> UniZeroActState:
        return state.reset(env_index)

    def save_act_state(self, state: UniZeroActState) -> dict:
        """The raw windows only: the context (tokens and keys) carries the weights tag of the model that
        computed it, which any weight change voids, so the next root re-encodes it from the raw windows
        (:meth:`_rebuild`) whether or not it was saved."""
        saved = {"step": state.step.copy(), "hist_len": state.hist_len.copy()}
        if state.obs_hist is not None:
            saved["obs_hist"], saved["act_hist"] = state.obs_hist.copy(), state.act_hist.copy()
        return saved

    def load_act_state(self, saved: dict, num_envs: int, *, device="cpu") -> UniZeroActState:
        obs_hist, act_hist = saved.get("obs_hist"), saved.get("act_hist")
        return UniZeroActState(
            step=np.asarray(saved["step"], dtype=np.int64).copy(),
            hist_len=np.asarray(saved["hist_len"], dtype=np.int64).copy(),
            obs_hist=None if obs_hist is None else np.array(obs_hist),
            act_hist=None if act_hist is None else np.array(act_hist),
        )

    def on_weights_loaded(self, model) -> None:
        """After a snapshot load: no context or node of the old weights can be used again."""
        bump_cache_epoch(model)
        self.node_contexts.clear()

    def on_train_budget_done(self, model, target_model) -> None:
        """The driver's side after each train budget: the trained and target models' caches are void."""
        bump_cache_epoch(model)
        bump_cache_epoch(target_model)
        self.node_contexts.clear()

    # ---------------------------------------------------------------- roots

    def _action_tensor(self, actions: np.ndarray, dev: torch.device) -> torch.Tensor:
        dtype = torch.float32 if self.spec.action_dim > 0 else torch.long
        return torch.as_tensor(np.asarray(actions), device=dev, dtype=dtype)

    def _rebuild(self, model: UniZeroNet, state: UniZeroActState) -> TokenContext:
        """Every env's pre-root context re-encoded from its raw window with the current weights (no keys)."""
        n = state.step.shape[0]
        dev = model_device(model)
        dtype = model.ln_f.weight.dtype
        ctx = TokenContext.empty(n, max_tokens=model.max_tokens, embed_dim=model.embed_dim, device=dev,
                                 dtype=dtype)  # fmt: skip
        if state.obs_hist is None or not state.hist_len.any():
            return dataclasses.replace(ctx, tag=weights_tag(model))
        s1 = state.obs_hist.shape[1]
        z = model.encode(torch.as_tensor(state.obs_hist, device=dev).flatten(0, 1)).view(n, s1, -1)
        a = model.embed_action(self._action_tensor(state.act_hist, dev).flatten(0, 1)).view(n, s1, -1)
        seq = token_sequence(z, a[:, :-1]) if s1 > 1 else z  # [N, 2(S-1)-1, E]: o, a, ..., o
        tokens = ctx.tokens.clone()
        tokens[:, : seq.shape[1]] = seq
        length = np.where(state.hist_len > 0, 2 * state.hist_len - 1, 0)
        # rows with hist_len < S-1 keep their history left-aligned: obs_hist is filled from slot 0
        return TokenContext(tokens, length, None, None, np.zeros(n, bool), weights_tag(model))

    def root_inference(
        self, model: UniZeroNet, obs: torch.Tensor, state: UniZeroActState, env_index: np.ndarray
    ) -> SearchRoots:
        """Roots of the envs ``env_index`` [B] at observations ``obs`` [B, *obs_shape] (eval mode, no grad):
        the observation tokens [B, E], the heads' logits and (:class:`RootContexts`) the root windows and the
        pre-root contexts of all N envs they were built from (re-encoded from the raw windows when the
        state's were computed by other weights)."""
        ctx_all = state.ctx
        if ctx_all is None or ctx_all.tag != weights_tag(model):
            ctx_all = self._rebuild(model, state)
        ctx = ctx_all.rows(env_index)
        interval = self.cfg.policy.kv_cache_clear_interval
        step = state.step[env_index]
        if interval > 0:
            ctx = ctx.without_cache(np.flatnonzero((step > 0) & (step % interval == 0)))
        z = model.encode(obs)  # [B, E]
        bsz = z.shape[0]
        cont = (step > 0) & (state.hist_len[env_index] > 0)
        new = torch.zeros((bsz, 2, z.shape[1]), dtype=z.dtype, device=z.device)
        new_len = np.where(cont, 2, 1)
        rows = np.flatnonzero(cont)
        if rows.size:
            last = state.hist_len[env_index[rows]] - 1
            prev = state.act_hist[env_index[rows], last]  # a_{t-1}
            tr = torch.as_tensor(rows, device=z.device)
            new[tr, 0] = model.embed_action(self._action_tensor(prev, z.device)).to(z.dtype)
            new[tr, 1] = z[tr]
        start = np.flatnonzero(~cont)
        if start.size:
            new[torch.as_tensor(start, device=z.device), 0] = z[torch.as_tensor(start, device=z.device)]
            length = ctx.length.copy()
            length[start] = 0
            ctx = dataclasses.replace(ctx, length=length)
        hidden, root_ctx = model.extend(ctx, new, new_len, limit=self.root_limit, use_cache=self.use_cache)
        h = hidden[torch.arange(bsz, device=z.device), torch.as_tensor(new_len - 1, device=z.device)]
        heads = model.obs_heads(h)
        context = RootContexts(root_ctx, ctx_all)
        return SearchRoots(z, heads.policy_logits, heads.value_logits, context=context)

    def advance_act_state(self, state, env_index, obs, actions, roots: SearchRoots) -> UniZeroActState:
        """The state after envs ``env_index`` searched from ``roots`` at ``obs`` and took ``actions``: the
        raw windows move on by one step, the contexts are the roots' (computed with the acting weights)."""
        s1 = self.context_obs - 1
        n = state.step.shape[0]
        step, hist_len = state.step.copy(), state.hist_len.copy()
        step[env_index] += 1
        obs_hist, act_hist = state.obs_hist, state.act_hist
        if s1 > 0:
            if obs_hist is None:
                obs_hist = np.zeros((n, s1, *obs.shape[1:]), dtype=obs.dtype)
                act_hist = np.zeros((n, s1, *actions.shape[1:]), dtype=actions.dtype)
            else:
                obs_hist, act_hist = obs_hist.copy(), act_hist.copy()
            for r, i in enumerate(env_index):
                h = int(hist_len[i]) if state.step[i] > 0 else 0
                if h == s1:  # full: the oldest observation leaves the window
                    obs_hist[i, :-1], act_hist[i, :-1] = obs_hist[i, 1:].copy(), act_hist[i, 1:].copy()
                    h -= 1
                obs_hist[i, h], act_hist[i, h] = obs[r], actions[r]
                hist_len[i] = h + 1
        ctx = roots.context.all_envs.with_rows(env_index, roots.context.roots)
        return UniZeroActState(step, hist_len, obs_hist, act_hist, ctx)

    # ---------------------------------------------------------------- search

    def recurrent_fn(self, model: UniZeroNet):
        """The search's model step in the transformer's context: each new node's context is its parent's
        (:attr:`node_contexts`) extended by the action and the predicted next latent."""
        dev = model_device(model)
        nodes, use_cache, limit = self.node_contexts, self.use_cache, model.max_tokens
        tag = weights_tag(model)  # fixed for the whole search

        def fn(latent, actions, *, parent_node, new_node, depth):
            ctx = nodes.gather(parent_node)
            action = self._action_tensor(actions, dev)
            if (use_cache and ctx.tag == tag and ctx.keys is not None and ctx.kv_valid.all()
                    and (ctx.length + 2 <= limit).all()):  # fmt: skip
                # every row appends to its cached keys without sliding: one (traced) call for both tokens
                next_latent, reward_logits, value_logits, policy, tokens, keys, values = traced_method(
                    model, "cached_step", ctx.tokens, ctx.keys, ctx.values,
                    torch.as_tensor(ctx.length, device=dev), action,
                )  # fmt: skip
                ones = np.ones(len(ctx.length), dtype=bool)
                new_ctx = TokenContext(tokens, ctx.length + 2, keys, values, ones, tag)
            else:
                a = model.embed_action(action)[:, None].to(ctx.tokens.dtype)
                opts = dict(limit=limit, use_cache=use_cache, tag=tag)
                h1, ctx1 = model.extend(ctx, a, **opts)
                act = model.action_heads(h1[:, 0])
                h2, new_ctx = model.extend(ctx1, act.next_latent[:, None], **opts)
                obs_out = model.obs_heads(h2[:, 0])
                next_latent, reward_logits = act.next_latent, act.reward_logits
                value_logits, policy = obs_out.value_logits, obs_out.policy_logits
            nodes.put(new_node, new_ctx)
            rs, vs = model.reward_support_size, model.value_support_size
            reward = logits_to_scalar_np(reward_logits.float().cpu().numpy(), support_size=rs)
            value = logits_to_scalar_np(value_logits.float().cpu().numpy(), support_size=vs)
            return next_latent, reward, value, policy.float().cpu().numpy()

        fn.wants_node_ids = True
        return fn

    def run_search(self, model, roots: SearchRoots, legal_mask, *, add_noise, deterministic, rng):
        """MuZero's search from ``roots``, the node contexts starting from the root windows."""
        self.node_contexts.reset(roots.context.roots, num_nodes=self.cfg.mcts.num_simulations + 1)
        return super().run_search(
            model, roots, legal_mask, add_noise=add_noise, deterministic=deterministic, rng=rng
        )

    def window_roots(
        self, model: UniZeroNet, obs: torch.Tensor, past: PastSteps | None = None, *, use_cache: bool = True
    ) -> SearchRoots:
        """Roots of N stored positions p as acting builds them (eval mode, no grad): the window
        [o_{p-h}, a_{p-h}, ..., o_{p-1}, a_{p-1}, o_p] of observations ``obs`` [N, *obs_shape] and the h valid
        steps of ``past`` (:class:`PastSteps`, [N, H, ...] with H <= S - 1; None: h = 0, the observation
        alone), one transformer call for all N rows."""
        z = model.encode(obs)  # [N, E]
        n = z.shape[0]
        empty = TokenContext.empty(
            n, max_tokens=model.max_tokens, embed_dim=model.embed_dim, device=z.device, dtype=z.dtype
        )
        new, new_len = self._window_tokens(model, z, past)
        hidden, ctx = model.extend(empty, new, new_len, limit=self.root_limit, use_cache=use_cache)
        last = torch.as_tensor(new_len - 1, device=z.device)
        heads = model.obs_heads(hidden[torch.arange(n, device=z.device), last])
        return SearchRoots(z, heads.policy_logits, heads.value_logits, context=RootContexts(ctx))

    def _window_tokens(
        self, model: UniZeroNet, z: torch.Tensor, past: PastSteps | None
    ) -> tuple[torch.Tensor, np.ndarray]:
        """Each row's window [o_{p-h}, a_{p-h}, ..., a_{p-1}, o_p] left-aligned in [N, 2H+1, E] and its
        length 2h + 1 [N], from the observation tokens ``z`` [N, E] at p and ``past`` (None: [N, 1, E])."""
        n, e = z.shape
        if past is None or past.valid.shape[1] == 0:
            return z[:, None], np.ones(n, dtype=np.int64)
        h = past.valid.shape[1]
        zp = model.encode(torch.as_tensor(past.obs, device=z.device).flatten(0, 1)).view(n, h, e)
        ap = model.embed_action(self._action_tensor(past.actions, z.device).flatten(0, 1)).view(n, h, e)
        seq = token_sequence(torch.cat([zp, z[:, None]], 1), ap.to(z.dtype))  # [N, 2H+1, E]: valid suffix
        valid_steps = past.valid.sum(1)  # [N] h of each row
        skip = 2 * (h - valid_steps)  # [N] tokens before the row's window
        src = np.minimum(skip[:, None] + np.arange(2 * h + 1)[None, :], 2 * h)  # [N, 2H+1]
        idx = torch.as_tensor(src, device=z.device)
        return torch.gather(seq, 1, idx[:, :, None].expand(-1, -1, e)), 2 * valid_steps + 1

    def reanalyze(
        self, target_model, obs, legal_mask, rng, past: PastSteps | None = None
    ) -> np.ndarray | dict[str, np.ndarray]:
        """Fresh visit distributions [N, A] (:meth:`reanalyze_stats`): the target world model's search from
        the roots acting built (:meth:`window_roots` over ``obs`` [N, *obs_shape] and ``past``; None: the
        observations alone)."""
        with eval_mode(target_model):
            obs_t = torch.as_tensor(obs, device=model_device(target_model))
            roots = self.window_roots(target_model, obs_t, past, use_cache=self.use_cache)
            out, _ = self.run_search(
                target_model, roots, legal_mask, add_noise=True, deterministic=False, rng=rng
            )
        return self.reanalyze_stats(out)

    # ---------------------------------------------------------------- targets

    def value_fn(self, model: UniZeroNet, *, chunk: int = 2048):
        """``(obs [N, ...], past: PastSteps of N rows or None) -> value [N]``: the model's value at the roots
        acting built (:meth:`window_roots`; without ``past``, the observation alone)."""
        dev = model_device(model)

        def fn(obs: np.ndarray, past: PastSteps | None = None) -> np.ndarray:
            vals = []
            with eval_mode(model):
                for lo in range(0, len(obs), chunk):
                    hi = min(lo + chunk, len(obs))
                    rows = None if past is None else past.rows(lo, hi)
                    roots = self.window_roots(model, torch.as_tensor(obs[lo:hi], device=dev), rows,
                                              use_cache=False)  # fmt: skip
                    vals.append(
                        logits_to_scalar(roots.value_logits.float(), support_size=model.value_support_size)
                    )
            return torch.cat(vals).cpu().numpy() if vals else np.zeros(0, dtype=np.float32)

        return fn

    def make_batch(
        self, sample, *, target_model, rng, reanalyze_count=0, defer_bootstrap=False
    ) -> TrainBatch:
        """MuZero's targets with all K+1 observations, plus ``extras[TARGET_LATENT]`` [B, K, E] float32:
        the target world model's tokens of o_{t+1}..o_{t+K} (the next-latent targets), computed here in
        the buffer owner like the bootstrap values. Bootstrap values and reanalyze roots are the target
        model's at each position's acting window (``context_steps`` past steps, module docstring)."""
        rc = self.cfg.replay
        batch = make_batch(
            sample,
            num_unroll_steps=rc.num_unroll_steps,
            td_steps=self.td_steps_of(sample),
            discount=self.cfg.mcts.discount,
            num_actions=self.spec.num_actions,
            action_dim=self.spec.action_dim,
            action_nvec=self.spec.action_nvec,
            value_fn=self.value_fn(target_model),
            rng=rng,
            all_obs=True,  # teacher forcing reads every observation of the unroll
            reanalyze_count=reanalyze_count,
            reanalyze_fn=self.reanalyze_fn(target_model, rng),
            extra_stats=self.batch_extra_stats(),
            defer_bootstrap=defer_bootstrap,
            context_steps=self.context_steps,
        )
        dev = model_device(target_model)
        with eval_mode(target_model):
            nxt = torch.as_tensor(batch.obs[:, 1:], device=dev)
            z = target_model.encode(nxt.flatten(0, 1)).view(*nxt.shape[:2], -1)
        return dataclasses.replace(batch, extras={**batch.extras, TARGET_LATENT: z.float().cpu().numpy()})

    # ---------------------------------------------------------------- loss

    def latent_loss(
        self, model: UniZeroNet, pred_logits: torch.Tensor, pred: torch.Tensor, target: torch.Tensor
    ):
        """[...] per-step next-latent loss: MSE (mean over E) with LayerNorm latents; with SimNorm the mean
        over groups of KL(target group || predicted group)."""
        if model.latent_norm_kind == "simnorm":
            g = model.simnorm_group_size
            t = target.reshape(*target.shape[:-1], -1, g)
            logp = F.log_softmax(pred_logits.reshape(*pred_logits.shape[:-1], -1, g), dim=-1)
            kl = (t * (torch.log(t.clamp_min(1e-12)) - logp)).sum(-1)
            return kl.mean(-1)
        return ((pred - target) ** 2).mean(-1)

    def compute_loss(self, model, batch: TrainBatch, *, train_iter: int) -> LossOutput:
        """Teacher-forced loss over the K-step sequence [o_t, a_t, o_{t+1}, ..., a_{t+K-1}, o_{t+K}].

        Per sample, with observation steps k = 0..K (value v_k, policy p_k at o_{t+k}'s token) and action
        steps k = 0..K-1 (reward r_k and next latent z^_{k+1} at a_{t+k}'s token)::

            per_sample = w_lat * mean^o_k L(z^_{k+1}, sg(z'_{k+1}))
                       + w_r * mean^r_k CE(r_k, u_{t+k})
                       + w_v * mean^v_k CE(v_k, z_{t+k})
                       + w_p * mean^p_k CE(p_k, pi_{t+k}) - w_ent * mean^p_k H(p_k)

        where z' is the *target* model's tokenizer (``batch.extras[TARGET_LATENT]``, from :meth:`make_batch`),
        L the latent loss (:meth:`latent_loss`), ``mean^m_k x_k = sum_k m_k x_k / max(sum_k m_k, 1)`` the mean
        over the steps the batch mask m keeps (:func:`masked_mean`; m^o: ``obs_mask`` at k + 1), and
        ``loss = mean(IS weight x per_sample)``. ``train_iter`` is reported as ``train/train_iter``.
        """
        lc, pc = self.cfg.learn, self.cfg.policy
        dev = model_device(model)

        def t(x, dtype=torch.float32):
            return torch.as_tensor(x, device=dev, dtype=dtype)

        obs = torch.as_tensor(batch.obs, device=dev)  # [B, K+1, *obs_shape]
        bsz, k1 = obs.shape[:2]
        k_steps = batch.actions.shape[1]
        if k1 != k_steps + 1:
            raise ValueError(f"unizero needs all K+1 observations per sample, got {k1} for K={k_steps}")
        actions = self._action_tensor(batch.actions, dev)  # [B, K] or [B, K, D]
        tr, tp = t(batch.target_reward), t(batch.target_policy)
        vmask, rmask, pmask, omask = (t(batch.value_mask), t(batch.reward_mask), t(batch.policy_mask),
                                      t(batch.obs_mask))  # fmt: skip
        vs, rs = model.value_support_size, model.reward_support_size

        z = model.encode(obs.flatten(0, 1)).view(bsz, k1, -1)  # [B, K+1, E]
        a = model.embed_action(actions.flatten(0, 1)).view(bsz, k_steps, -1)  # [B, K, E]
        hidden = model.forward_sequence(token_sequence(z, a))  # [B, 2K+1, E]
        obs_out = model.obs_heads(hidden[:, 0::2])  # value [B, K+1, V], policy [B, K+1, P]
        act_out = model.action_heads(hidden[:, 1::2])  # reward [B, K, R], next latent [B, K, E]
        target_z = t(batch.extras[TARGET_LATENT])  # [B, K, E]

        def ce(logits, target):
            return soft_cross_entropy(logits.flatten(0, 1), target.flatten(0, 1)).view(target.shape[:2])

        tv = t(batch.value_targets())  # [B, K+1], read after the forward (a helper thread may compute it)
        value_loss = masked_mean(ce(obs_out.value_logits, scalar_to_target(tv, support_size=vs)), vmask)
        policy_ce = self.policy_cross_entropies(obs_out.policy_logits, batch, tp)  # [B, K+1]
        policy_loss = masked_mean(policy_ce, pmask)
        entropy = masked_mean(self.policy_entropy(obs_out.policy_logits), pmask)
        reward_loss = masked_mean(ce(act_out.reward_logits, scalar_to_target(tr, support_size=rs)), rmask)
        latent = self.latent_loss(model, act_out.next_latent_logits, act_out.next_latent, target_z.detach())
        latent_loss = masked_mean(latent, omask[:, 1:])
        per_sample = (
            pc.latent_loss_weight * latent_loss
            + lc.value_loss_weight * value_loss
            + lc.reward_loss_weight * reward_loss
            + lc.policy_loss_weight * policy_loss
            - pc.policy_entropy_weight * entropy
        )
        loss = (t(batch.weights) * per_sample).mean()
        with torch.no_grad():
            pred_v0 = logits_to_scalar(obs_out.value_logits[:, 0].float(), support_size=vs)
            priorities = (pred_v0 - tv[:, 0]).abs() + 1e-6  # [B] float32
            terms = [latent_loss, value_loss, reward_loss, policy_loss, entropy, pred_v0, tv[:, 0]]  # 7, [B]
            means = torch.stack([x.float() for x in terms]).mean(1)
        host = {"train/train_iter": float(train_iter)}
        return loss_output(loss, per_sample, priorities, means, LOSS_METRICS, host_metrics=host)
