"""The UniZero world model (Pu et al. 2024): a tokenizer and a causal transformer over [o0, a0, o1, a1, ...].

What this module owns
    :class:`UniZeroNet`: the tokenizer (an MLP for vector observations, MuZero's residual conv encoder for
    images) that maps each observation to one latent token of size E (LayerNorm or SimNorm output), the action
    embedding (an embedding table for discrete actions [B] int64, a linear map for continuous actions [B, D]
    float32), a GPT-style pre-LayerNorm causal transformer built on
    ``torch.nn.functional.scaled_dot_product_attention`` with learned absolute positions or RoPE, and the
    heads: reward and next latent on action tokens, value and "policy params" [B, P] on observation tokens
    (P = A logits for a discrete policy; a Gaussian head would emit its mean / log-std here).

    Two ways to run the transformer, which must agree within float rounding:

    * :meth:`UniZeroNet.forward_sequence` -- uncached, over whole token sequences [B, T, E] with a validity
      mask (any padding: left, right, or holes); used by training and as the reference.
    * :meth:`UniZeroNet.extend` -- append tokens to the windows of a :class:`TokenContext`, reusing each row's
      cached keys/values when they are valid for the current weights, else recomputing the row's window from
      its raw tokens. When a window would exceed ``limit`` tokens its oldest (observation, action) pairs are
      dropped and the row is recomputed (exact; cached keys are never shifted). Its index plan is made on the
      host and its tensor work (:meth:`UniZeroNet.window_step`, :meth:`UniZeroNet.attend_cached`, and the
      search's :meth:`UniZeroNet.cached_step`) runs as traced graphs where autograd is off
      (:mod:`muzero_tune.models.traced`), bit for bit the eager results.

What it must never do
    Decide when caches are cleared (the policy does) or hold per-env state (contexts are values passed in and
    returned).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from muzero_tune.models.kv_cache import TokenContext, weights_tag
from muzero_tune.models.muzero_net import _conv3x3, _halve, _res_stack, _zero_init
from muzero_tune.models.traced import traced_method


class SimNorm(nn.Module):
    """Simplicial normalisation: softmax over consecutive groups of ``group_size`` features; [.., E]."""

    def __init__(self, group_size: int) -> None:
        super().__init__()
        self.group_size = int(group_size)

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        return F.softmax(x.reshape(*shape[:-1], -1, self.group_size), dim=-1).reshape(shape)


def _latent_norm(kind: str, embed_dim: int, group_size: int) -> nn.Module:
    if kind == "layernorm":
        # no affine: the tokenizer and the next-latent head must land in the same space (MSE between them)
        return nn.LayerNorm(embed_dim, elementwise_affine=False)
    if kind == "simnorm":
        if embed_dim % group_size:
            raise ValueError(
                f"embed_dim {embed_dim} must be a multiple of the SimNorm group size {group_size}"
            )
        return SimNorm(group_size)
    raise ValueError(f"latent_norm must be layernorm or simnorm, got {kind!r}")


def _head(embed_dim: int, hidden: int, out_dim: int, *, zero_last: bool) -> nn.Sequential:
    last = nn.Linear(hidden, out_dim)
    if zero_last:
        _zero_init(last)
    return nn.Sequential(nn.Linear(embed_dim, hidden), nn.GELU(), last)


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class _Block(nn.Module):
    """Pre-LN transformer block; attention over optional cached keys plus the new tokens."""

    def __init__(self, embed_dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.ln1 = nn.LayerNorm(embed_dim)
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.ln2 = nn.LayerNorm(embed_dim)
        self.mlp = nn.Sequential(
            nn.Linear(embed_dim, 4 * embed_dim), nn.GELU(), nn.Linear(4 * embed_dim, embed_dim)
        )

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None, past_k: Tensor | None,
                past_v: Tensor | None, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        """x [B, n, E]; rope (cos, sin) [B, 1, n, dh] or None; past_k/v [B, H, Tp, dh] or None;
        mask [B, 1, n, Tp + n] bool (True: attend). Returns (x', k, v) with k, v [B, H, n, dh] of the new
        tokens."""
        bsz, n, e = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(bsz, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if rope is not None:
            cos, sin = rope
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
        keys = k if past_k is None else torch.cat([past_k, k], dim=2)
        vals = v if past_v is None else torch.cat([past_v, v], dim=2)
        a = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask)  # [B, H, n, dh]
        x = x + self.proj(a.transpose(1, 2).reshape(bsz, n, e))
        x = x + self.mlp(self.ln2(x))
        return x, k, v

    def attend_into(self, x: Tensor, rope, keys: Tensor, values: Tensor, bi: Tensor, pos: Tensor,
                    mask: Tensor) -> Tensor:  # fmt: skip
        """The block on new tokens x [B, n, E] whose keys/values are written into the cache views
        ``keys``/``values`` [B, H, T, dh] at window positions ``pos`` [B, n] (``bi`` [B, n] the row index);
        the queries attend over the whole cache under ``mask`` [B, 1, n, T]. Returns x'."""
        bsz, n, e = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(bsz, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if rope is not None:
            cos, sin = rope
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
        # [B, n, H, dh] into [B, H, T, dh] at (b, :, pos); index_put_ keeps the batch size open in a trace
        keys.transpose(1, 2).index_put_((bi, pos), k.permute(0, 2, 1, 3))
        values.transpose(1, 2).index_put_((bi, pos), v.permute(0, 2, 1, 3))
        a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)  # [B, H, n, dh]
        x = x + self.proj(a.transpose(1, 2).reshape(bsz, n, e))
        return x + self.mlp(self.ln2(x))


@dataclass(frozen=True)
class ObsHeads:
    """Outputs at observation tokens."""

    value_logits: Tensor  # [B, 2Sv+1]
    policy_logits: Tensor  # [B, P] policy params (P = A logits for discrete actions)


@dataclass(frozen=True)
class ActionHeads:
    """Outputs at action tokens."""

    reward_logits: Tensor  # [B, 2Sr+1]
    next_latent_logits: Tensor  # [B, E] before the latent norm (the SimNorm group-KL needs the logits)
    next_latent: Tensor  # [B, E] the predicted next observation token (after the latent norm)


class UniZeroNet(nn.Module):
    """Tokenizer + causal transformer world model (module docstring).

    Sizes: E = ``embed_dim``, L = ``num_layers``, H = ``num_heads``, T = ``max_tokens`` (the longest
    sequence the transformer sees; positions 0..T-1). Observations [B, *obs_shape]; actions [B] int64
    (``action_dim=0``, ``num_actions`` A) or [B, D] float32 (``action_dim=D``).
    """

    def __init__(
        self,
        *,
        obs_shape: Sequence[int],
        num_actions: int,
        action_dim: int = 0,
        policy_dim: int | None = None,
        kind: str = "mlp",
        embed_dim: int = 64,
        num_layers: int = 2,
        num_heads: int = 2,
        max_tokens: int = 11,
        positional: str = "learned",
        latent_norm: str = "layernorm",
        simnorm_group_size: int = 8,
        hidden_dim: int = 128,
        num_channels: int = 64,
        num_res_blocks: int = 1,
        downsample: bool = True,
        value_support_size: int = 50,
        reward_support_size: int = 50,
    ) -> None:
        super().__init__()
        if embed_dim % num_heads or (embed_dim // num_heads) % 2:
            raise ValueError(f"embed_dim {embed_dim} must split into {num_heads} heads of even size")
        if positional not in ("learned", "rope"):
            raise ValueError(f"positional must be learned or rope, got {positional!r}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.num_actions = int(num_actions)
        self.action_dim = int(action_dim)
        self.policy_dim = int(policy_dim if policy_dim is not None else num_actions)
        self.embed_dim = int(embed_dim)
        self.num_layers = int(num_layers)
        self.num_heads = int(num_heads)
        self.head_dim = self.embed_dim // self.num_heads
        self.max_tokens = int(max_tokens)
        self.positional = positional
        self.latent_norm_kind = latent_norm
        self.simnorm_group_size = int(simnorm_group_size)
        self.value_support_size = int(value_support_size)
        self.reward_support_size = int(reward_support_size)
        self.cache_epoch = 0  # bumped by the policy hooks (kv_cache.bump_cache_epoch); not a weight

        e = self.embed_dim
        if kind == "mlp":
            obs_dim = int(np.prod(self.obs_shape))
            self.tokenizer = nn.Sequential(
                nn.Flatten(), nn.Linear(obs_dim, hidden_dim), nn.LayerNorm(hidden_dim), nn.GELU(),
                nn.Linear(hidden_dim, e),
            )  # fmt: skip
        elif kind == "conv":
            self.tokenizer = self._conv_tokenizer(num_channels, num_res_blocks, downsample)
        else:
            raise ValueError(f"kind must be mlp or conv, got {kind!r}")
        self.latent_norm = _latent_norm(latent_norm, e, self.simnorm_group_size)
        if self.action_dim > 0:
            self.action_embed: nn.Module = nn.Linear(self.action_dim, e)
        else:
            self.action_embed = nn.Embedding(self.num_actions, e)
        self.pos_embed = nn.Embedding(self.max_tokens, e) if positional == "learned" else None
        if positional == "rope":
            inv = 1.0 / (10000.0 ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
            ang = torch.arange(self.max_tokens).float()[:, None] * inv[None, :]  # [T, dh/2]
            ang = torch.cat([ang, ang], dim=-1)  # [T, dh]
            self.register_buffer("rope_cos", ang.cos(), persistent=False)
            self.register_buffer("rope_sin", ang.sin(), persistent=False)
        self.blocks = nn.ModuleList(_Block(e, self.num_heads) for _ in range(self.num_layers))
        self.ln_f = nn.LayerNorm(e)
        self.value_head = _head(e, e, 2 * self.value_support_size + 1, zero_last=True)
        self.policy_head = _head(e, e, self.policy_dim, zero_last=False)
        self.reward_head = _head(e, e, 2 * self.reward_support_size + 1, zero_last=True)
        self.latent_head = _head(e, e, e, zero_last=False)

    def _conv_tokenizer(self, channels: int, num_res_blocks: int, downsample: bool) -> nn.Sequential:
        """MuZero's residual encoder (see ConvMuZeroNet), flattened and projected to one token."""
        if len(self.obs_shape) != 3:
            raise ValueError(f"conv tokenizer needs (C, H, W) observations, got {self.obs_shape}")
        in_ch, h, w = self.obs_shape
        c = channels
        if downsample:
            half = max(c // 2, 1)
            layers: list[nn.Module] = [
                _conv3x3(in_ch, half, stride=2), nn.BatchNorm2d(half), nn.ReLU(),
                _res_stack(half, num_res_blocks),
                _conv3x3(half, c, stride=2), nn.BatchNorm2d(c), nn.ReLU(), _res_stack(c, num_res_blocks),
                nn.AvgPool2d(kernel_size=3, stride=2, padding=1), _res_stack(c, num_res_blocks),
                nn.AvgPool2d(kernel_size=3, stride=2, padding=1),
            ]  # fmt: skip
            for _ in range(4):
                h, w = _halve(h), _halve(w)
        else:
            layers = [_conv3x3(in_ch, c), nn.BatchNorm2d(c), nn.ReLU(), _res_stack(c, num_res_blocks)]
        return nn.Sequential(*layers, nn.Flatten(), nn.Linear(c * h * w, self.embed_dim))

    # ------------------------------------------------------------------------------------------ tokens

    def encode(self, obs: Tensor) -> Tensor:
        """Observation tokens [B, E] of observations [B, *obs_shape] (after the latent norm)."""
        dtype = self.ln_f.weight.dtype
        x = obs.to(dtype) / 255.0 if obs.dtype == torch.uint8 else obs.to(dtype)  # uint8 images -> [0, 1]
        return self.latent_norm(self.tokenizer(x))

    def embed_action(self, actions: Tensor) -> Tensor:
        """Action tokens [B, E] of actions [B] int64 (discrete) or [B, D] float32 (continuous)."""
        if self.action_dim > 0:
            return self.action_embed(actions.float().reshape(-1, self.action_dim))
        return self.action_embed(actions.long().reshape(-1))

    def obs_heads(self, hidden: Tensor) -> ObsHeads:
        """Value and policy params from transformer outputs at observation tokens [B, E]."""
        return ObsHeads(self.value_head(hidden), self.policy_head(hidden))

    def action_heads(self, hidden: Tensor) -> ActionHeads:
        """Reward and the next observation token from transformer outputs at action tokens [B, E]."""
        logits = self.latent_head(hidden)
        return ActionHeads(self.reward_head(hidden), logits, self.latent_norm(logits))

    # ------------------------------------------------------------------------------------- transformer

    def _inputs(self, tokens: Tensor, pos: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        """Layer-0 input and RoPE tables for tokens [B, n, E] at positions pos [B, n] (long, < T)."""
        if self.pos_embed is not None:
            return tokens + self.pos_embed(pos), None
        return tokens, (self.rope_cos[pos][:, None], self.rope_sin[pos][:, None])

    def forward_sequence(self, tokens: Tensor, valid: Tensor | None = None) -> Tensor:
        """Uncached causal transformer over token sequences [B, T', E] (T' <= T); ``valid`` [B, T'] bool
        marks the real tokens (None: all). Each row's real tokens get positions 0, 1, ... in order and
        attend to the real tokens up to themselves; padding (anywhere) is ignored. Returns [B, T', E]
        (rows at padding are meaningless)."""
        bsz, n, _ = tokens.shape
        if n > self.max_tokens:
            raise ValueError(f"{n} tokens exceed max_tokens={self.max_tokens}")
        if valid is None:
            valid = torch.ones((bsz, n), dtype=torch.bool, device=tokens.device)
        pos = (valid.long().cumsum(1) - 1).clamp(min=0)
        causal = torch.ones((n, n), dtype=torch.bool, device=tokens.device).tril()
        eye = torch.eye(n, dtype=torch.bool, device=tokens.device)
        mask = ((valid[:, None, :] & causal) | eye)[:, None]  # [B, 1, T', T']: padding attends to itself
        x, rope = self._inputs(tokens, pos)
        for block in self.blocks:
            x, _, _ = block(x, rope, None, None, mask)
        return self.ln_f(x)

    def extend(
        self,
        ctx: TokenContext,
        new: Tensor,
        new_len: np.ndarray | None = None,
        *,
        limit: int,
        use_cache: bool = True,
        tag: tuple | None = None,
    ) -> tuple[Tensor, TokenContext]:
        """Append tokens to each row's window: (outputs at the new tokens [B, n, E], the new context).

        ``new`` [B, n, E] holds row b's new tokens in ``new[b, :new_len[b]]`` (None: all n). A row whose
        window would exceed ``limit`` (<= T) tokens drops its oldest tokens two at a time (an observation and
        its action, so windows start at an observation) and is recomputed from its raw tokens; so is any row
        whose cached keys are missing, marked invalid, or from other weights (the context's tag), and every
        row when ``use_cache`` is False (the result then carries no keys). Other rows attend to their cached
        keys and only the new tokens are computed. Outputs at padded slots (j >= new_len[b]) are meaningless.
        ``tag``: this model's :func:`weights_tag` if the caller already has it (a search computes it once).
        """
        bsz, n, _ = new.shape
        big_t = self.max_tokens
        if limit > big_t:
            raise ValueError(f"limit {limit} exceeds max_tokens={big_t}")
        dev = new.device
        new_len = np.full(bsz, n, dtype=np.int64) if new_len is None else np.asarray(new_len, dtype=np.int64)
        tag = weights_tag(self) if tag is None else tag
        same = ctx.tag == tag
        old_len = (
            ctx.length if same else np.zeros(bsz, dtype=np.int64)
        )  # other weights: their tokens are void
        over = np.maximum(old_len + new_len - limit, 0)
        drop = np.minimum(over + over % 2, old_len)
        if np.any(old_len - drop + new_len > limit):
            raise ValueError(f"cannot fit {new_len.max()} new tokens in a window of {limit}")
        keep = old_len - drop
        cached = (
            (ctx.kv_valid & (drop == 0))
            if (use_cache and same and ctx.keys is not None)
            else np.zeros(bsz, bool)
        )
        if cached.all() and (new_len == n).all():
            return self._extend_cached(ctx, new, old_len, tag)
        start = np.where(cached, old_len, drop)  # first raw token fed to the transformer
        past_len = np.where(cached, old_len, 0)
        fed_raw = old_len - start  # raw window tokens fed (0 for cached rows)
        fed_len = fed_raw + new_len
        width = int(fed_len.max())

        combined = torch.cat([ctx.tokens.to(new.dtype), new], dim=1)  # [B, T + n, E]
        j = np.arange(width)[None, :]
        src = np.where(j < fed_raw[:, None], start[:, None] + j, big_t + j - fed_raw[:, None])
        src = np.clip(src, 0, big_t + n - 1)
        pos = np.clip(past_len[:, None] + j, 0, big_t - 1)
        out_idx = np.clip(fed_len[:, None] - new_len[:, None] + np.arange(n)[None, :], 0, width - 1)
        length = keep + new_len
        jj = np.arange(big_t)[None, :]
        tok_src = np.clip(
            np.where(jj < keep[:, None], drop[:, None] + jj, big_t + jj - keep[:, None]), 0, big_t + n - 1
        )
        kv_src = np.where(jj < past_len[:, None], jj, big_t + jj - past_len[:, None])
        kv_src = np.clip(kv_src, 0, big_t + width - 1)
        plan = [torch.as_tensor(a, device=dev) for a in (src, pos, fed_len, out_idx, tok_src, kv_src)]
        shape = (width, n)  # one trace per shape fed
        if cached.any():  # some rows attend to their cached keys
            out, tokens, keys, values = traced_method(
                self, "window_step_past", combined, *plan, ctx.keys, ctx.values,
                torch.as_tensor(past_len, device=dev), variant=shape,
            )  # fmt: skip
        else:
            out, tokens, keys, values = traced_method(self, "window_step", combined, *plan, variant=shape)
        kv_valid = np.full(bsz, use_cache, dtype=bool)
        if not use_cache:
            keys = values = None
        return out, TokenContext(tokens, length, keys, values, kv_valid, tag)

    # the tensor-only steps of extend and of the search below run as traced graphs where autograd is off
    # (models/traced.py: ``traced_method``, one trace per shape fed)
    traceable_window_step = True
    traceable_window_step_past = True
    traceable_attend_cached = True
    traceable_cached_step = True

    def window_step(
        self, combined: Tensor, src: Tensor, pos: Tensor, fed_len: Tensor, out_idx: Tensor, tok_src: Tensor,
        kv_src: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
        """:meth:`extend`'s transformer work for rows that all recompute their windows (no cached keys):
        see :meth:`window_step_past`."""
        return self._window_step(combined, src, pos, fed_len, out_idx, tok_src, kv_src, None, None, None)

    def window_step_past(
        self, combined: Tensor, src: Tensor, pos: Tensor, fed_len: Tensor, out_idx: Tensor, tok_src: Tensor,
        kv_src: Tensor, keys: Tensor, values: Tensor, past_len: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
        """:meth:`extend`'s transformer work, its index plan made on the host (W = the widest row fed).

        combined [B, T + n, E]: the rows' window tokens then the new ones; src [B, W]: the tokens fed (indices
        into combined) at window positions pos [B, W], of which the first fed_len [B] are real; out_idx
        [B, n]: where each new token's output is among those fed; tok_src [B, T]: the new windows' tokens
        (indices into combined); kv_src [B, T]: the new windows' keys (indices into [cached ; fed]); keys,
        values [B, L, H, T, dh] cached, of which each row's first past_len [B] are attended to.
        Returns (outputs at the new tokens [B, n, E], tokens [B, T, E], keys, values [B, L, H, T, dh])."""
        plan = (combined, src, pos, fed_len, out_idx, tok_src, kv_src)
        return self._window_step(*plan, keys, values, past_len)

    def _window_step(self, combined, src, pos, fed_len, out_idx, tok_src, kv_src, keys, values, past_len):
        bsz, width = src.shape
        dev = combined.device
        fed = _gather_rows(combined, src)  # [B, W, E]
        jt = torch.arange(width, device=dev)
        fed_valid = jt[None, :] < fed_len[:, None]  # [B, W]
        causal = jt[None, :] <= jt[:, None]  # [W(query), W(key)]
        new_mask = (fed_valid[:, None, :] & causal) | torch.eye(width, dtype=torch.bool, device=dev)
        use_past = keys is not None
        if use_past:
            big_t = self.max_tokens
            past_mask = torch.arange(big_t, device=dev)[None, :] < past_len[:, None]
            mask = torch.cat([past_mask[:, None, :].expand(bsz, width, big_t), new_mask], dim=2)[:, None]
        else:
            mask = new_mask[:, None]
        x, rope = self._inputs(fed, pos)
        ks, vs = [], []
        for layer, block in enumerate(self.blocks):
            pk = keys[:, layer].to(x.dtype) if use_past else None
            pv = values[:, layer].to(x.dtype) if use_past else None
            x, k, v = block(x, rope, pk, pv, mask)
            ks.append(k)
            vs.append(v)
        out = _gather_rows(self.ln_f(x), out_idx)  # [B, n, E]
        tokens = _gather_rows(combined, tok_src)  # [B, T, E]
        new_keys = torch.stack([_merge(keys, i, k, use_past, kv_src) for i, k in enumerate(ks)], 1)
        new_values = torch.stack([_merge(values, i, v, use_past, kv_src) for i, v in enumerate(vs)], 1)
        return out, tokens, new_keys, new_values

    def _extend_cached(
        self, ctx: TokenContext, new: Tensor, old_len: np.ndarray, tag
    ) -> tuple[Tensor, TokenContext]:
        """:meth:`extend` when every row reuses its cache and gets all n new tokens without sliding: the new
        keys are written into a copy of the cache and the n queries attend over it (no re-gathering)."""
        bsz, n, _ = new.shape
        pos = torch.as_tensor(old_len[:, None] + np.arange(n)[None, :], device=new.device)  # [B, n]
        cache = (ctx.tokens, ctx.keys, ctx.values)
        hidden, tokens, keys, values = traced_method(self, "attend_cached", *cache, pos, new, variant=n)
        return hidden, TokenContext(tokens, old_len + n, keys, values, np.ones(bsz, dtype=bool), tag)

    def attend_cached(
        self, tokens: Tensor, keys: Tensor, values: Tensor, pos: Tensor, new: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """New tokens [B, n, E] written at window positions ``pos`` [B, n] of copies of a cache (tokens
        [B, T, E], keys/values [B, L, H, T, dh]), their queries attending over it: (outputs [B, n, E], tokens,
        keys, values). Tensors only (traceable: its control flow depends on shapes, never on the batch)."""
        bsz, n, _ = new.shape
        bi = torch.arange(bsz, device=new.device)[:, None].expand(bsz, n)
        keys, values = keys.to(new.dtype).clone(), values.to(new.dtype).clone()
        tokens = tokens.to(new.dtype).clone()
        tokens.index_put_((bi, pos), new)
        mask = (torch.arange(self.max_tokens, device=new.device)[None, None, :] <= pos[:, :, None])[:, None]
        x, rope = self._inputs(new, pos)
        for layer, block in enumerate(self.blocks):
            x = block.attend_into(x, rope, keys[:, layer], values[:, layer], bi, pos, mask)
        return self.ln_f(x), tokens, keys, values

    def cached_step(
        self, tokens: Tensor, keys: Tensor, values: Tensor, length: Tensor, action: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """One search step in context for rows whose cached keys hold and whose windows have room for two
        more tokens: :meth:`extend` by the action token, then by the predicted next observation token, at
        window positions ``length[b]`` and ``length[b] + 1`` (the same arithmetic, as one call).

        tokens [B, T, E] and keys/values [B, L, H, T, dh] of the rows' contexts, length [B] int64, action
        [B] int64 or [B, D] float32. Returns (next latent [B, E], reward logits [B, 2Sr+1], value logits
        [B, 2Sv+1], policy params [B, P], and the contexts' tokens, keys and values after both appends)."""
        a = self.embed_action(action)[:, None].to(tokens.dtype)
        h1, tokens, keys, values = self.attend_cached(tokens, keys, values, length[:, None], a)
        act = self.action_heads(h1[:, 0])
        h2, tokens, keys, values = self.attend_cached(tokens, keys, values, length[:, None] + 1,
                                                       act.next_latent[:, None])  # fmt: skip
        obs = self.obs_heads(h2[:, 0])
        return act.next_latent, act.reward_logits, obs.value_logits, obs.policy_logits, tokens, keys, values

    # ------------------------------------------------------------------------------ context-free roots

    def root_outputs(self, obs: Tensor) -> tuple[Tensor, ObsHeads]:
        """The observation token [B, E] and heads of roots without context (a single observation each)."""
        z = self.encode(obs)
        return z, self.obs_heads(self.forward_sequence(z[:, None])[:, 0])


def _gather_rows(x: Tensor, index: Tensor) -> Tensor:
    """x [B, S, E] gathered along S by index [B, n] -> [B, n, E]."""
    return torch.gather(x, 1, index[:, :, None].expand(-1, -1, x.shape[2]))


def _merge(past: Tensor | None, layer: int, new: Tensor, use_past: bool, src: Tensor) -> Tensor:
    """Row b's cached keys at positions < past_len[b] then its fed keys: [B, H, T, dh] (``src`` [B, T]
    indexes the concatenation [past (T) ; fed (width)])."""
    bsz, heads, width, dh = new.shape
    big_t = src.shape[1]
    base = past[:, layer].to(new.dtype) if use_past else new.new_zeros((bsz, heads, big_t, dh))
    both = torch.cat([base, new], dim=2)  # [B, H, T + width, dh]
    return torch.gather(both, 2, src[:, None, :, None].expand(bsz, heads, big_t, dh))


def token_sequence(obs_tokens: Tensor, action_tokens: Tensor) -> Tensor:
    """Interleave [B, K+1, E] observation tokens and [B, K, E] action tokens -> [B, 2K+1, E]
    = [o0, a0, o1, ..., a_{K-1}, o_K]."""
    bsz, k1, e = obs_tokens.shape
    k = action_tokens.shape[1]
    if k != k1 - 1:
        raise ValueError(f"need K+1 observation tokens for K action tokens, got {k1} and {k}")
    pairs = torch.stack([obs_tokens[:, :k], action_tokens], dim=2).reshape(bsz, 2 * k, e)
    return torch.cat([pairs, obs_tokens[:, k:]], dim=1)


def default_max_tokens(num_unroll_steps: int, context_tokens: int) -> int:
    """T: the training sequence (2K+1 tokens) and a full root context plus one search step (C + 1)."""
    return max(2 * num_unroll_steps + 1, context_tokens + 1)


__all__ = ["ActionHeads", "ObsHeads", "SimNorm", "UniZeroNet", "default_max_tokens", "token_sequence"]
