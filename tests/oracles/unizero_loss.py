"""The UniZero training loss written out by hand, for the loss tests of ``unizero`` and ``sampled_unizero``.

Everything after the world model's forward pass is plain numpy in float64 and shares no code with the
package's loss: the support transform h(x), its two-hot target and its inverse (the textbook closed form, not
the package's), the cross-entropies, the tanh-Gaussian density, the masked means. The forward pass builds the
token sequence [o_0, a_0, o_1, ..., a_{K-1}, o_K] itself and reads the heads' raw outputs at the observation
tokens (value, policy) and the action tokens (reward, next latent), so a loss that pairs a head with the wrong
tokens or a target with the wrong step disagrees with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

EPS = 0.001  # h(x) = sign(x)(sqrt(|x| + 1) - 1) + EPS x


@dataclass(frozen=True)
class RawOutputs:
    """The heads' raw outputs over a batch's teacher-forced sequence, float64."""

    value_logits: np.ndarray  # [B, K+1, 2Sv+1] at o_0..o_K
    policy_params: np.ndarray  # [B, K+1, P] at o_0..o_K (logits, or the Gaussian's [mu, log_sigma])
    reward_logits: np.ndarray  # [B, K, 2Sr+1] at a_0..a_{K-1}
    next_latent: np.ndarray  # [B, K, E] at a_0..a_{K-1}, after the latent norm


@dataclass(frozen=True)
class Targets:
    """What a per-sample loss is measured against (taken from a batch, or moved around for a control)."""

    value: np.ndarray  # [B, K+1] raw scalars
    reward: np.ndarray  # [B, K] raw scalars
    policy: np.ndarray  # [B, K+1, A] or [B, K+1, slots]
    latent: np.ndarray  # [B, K, E]
    sampled: np.ndarray | None = None  # [B, K+1, slots(, D)] the actions of the slots (sampled types)


def randomize_heads(model, seed: int, scale: float = 1.0, policy_scale: float | None = None) -> None:
    """Random last layers (N(0, scale^2) weights and biases; ``policy_scale`` for the policy head, default
    ``scale``) for the value, policy, reward and next-latent heads (value and reward start at zero, the
    Gaussian head near N(0, 1)): every token then predicts a distribution of its own."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for head in (model.value_head, model.policy_head, model.reward_head, model.latent_head):
            layer = head[-1]
            sd = policy_scale if head is model.policy_head and policy_scale is not None else scale
            layer.weight.copy_(sd * torch.randn(layer.weight.shape, generator=g))
            layer.bias.copy_(sd * torch.randn(layer.bias.shape, generator=g))


def raw_outputs(model, obs: np.ndarray, actions: np.ndarray) -> RawOutputs:
    """The heads' outputs over [o_0, a_0, ..., o_K] for observations ``obs`` [B, K+1, *obs_shape] and actions
    ``actions`` [B, K] (discrete) or [B, K, D] (continuous)."""
    b, k1 = obs.shape[:2]
    k = k1 - 1
    with torch.no_grad():
        z = model.encode(torch.as_tensor(obs).reshape(b * k1, *obs.shape[2:])).reshape(b, k1, -1)
        act = torch.as_tensor(actions)
        a = model.embed_action(act.reshape(b * k, *act.shape[2:])).reshape(b, k, -1)
        tokens = torch.zeros(b, 2 * k + 1, z.shape[-1])
        tokens[:, 0::2], tokens[:, 1::2] = z, a
        h = model.forward_sequence(tokens)
        h_obs, h_act = h[:, 0::2], h[:, 1::2]
        return RawOutputs(
            value_logits=model.value_head(h_obs).double().numpy(),
            policy_params=model.policy_head(h_obs).double().numpy(),
            reward_logits=model.reward_head(h_act).double().numpy(),
            next_latent=model.latent_norm(model.latent_head(h_act)).double().numpy(),
        )


def h(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * (np.sqrt(np.abs(x) + 1.0) - 1.0) + EPS * x


def h_inverse(y: np.ndarray) -> np.ndarray:
    """The textbook inverse: sign(y) (((sqrt(1 + 4 EPS (|y| + 1 + EPS)) - 1) / (2 EPS))^2 - 1)."""
    r = (np.sqrt(1.0 + 4.0 * EPS * (np.abs(y) + 1.0 + EPS)) - 1.0) / (2.0 * EPS)
    return np.sign(y) * (r * r - 1.0)


def two_hot(x: np.ndarray, support_size: int) -> np.ndarray:
    """[...] raw scalars -> [..., 2S+1]: h(x) clipped to [-S, S] split between its two neighbouring bins."""
    s = support_size
    y = np.clip(h(np.asarray(x, np.float64)), -s, s)
    out = np.zeros((*y.shape, 2 * s + 1))
    for idx in np.ndindex(*y.shape):
        low = math.floor(y[idx])
        w = y[idx] - low
        out[(*idx, low + s)] += 1.0 - w
        if w > 0:
            out[(*idx, low + s + 1)] += w
    return out


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def cross_entropy(logits: np.ndarray, target: np.ndarray) -> np.ndarray:
    """[..., C] logits and target distributions -> [...]."""
    return -(target * log_softmax(logits)).sum(-1)


def scalar(logits: np.ndarray, support_size: int) -> np.ndarray:
    """[..., 2S+1] -> [...]: h^-1 of the expected bin."""
    p = np.exp(log_softmax(logits))
    return h_inverse((p * np.arange(-support_size, support_size + 1)).sum(-1))


def masked_mean(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """[B, K] -> [B]: the mean over the steps ``mask`` keeps, 0 where it keeps none."""
    return (x * mask).sum(1) / np.maximum(mask.sum(1), 1.0)


def tanh_gaussian_log_prob(params: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """log density of tanh(N(mu, sigma)) at ``actions`` [..., slots, D] for ``params`` [..., 2D] =
    [mu, log_sigma] (log_sigma clamped to [-20, 2], actions to +-(1 - 1e-6)) -> [..., slots]."""
    d = params.shape[-1] // 2
    mu, log_sigma = params[..., None, :d], np.clip(params[..., None, d:], -20.0, 2.0)
    a = np.clip(actions.astype(np.float64), -1 + 1e-6, 1 - 1e-6)
    u = np.arctanh(a)
    log_n = -0.5 * ((u - mu) / np.exp(log_sigma)) ** 2 - log_sigma - 0.5 * math.log(2 * math.pi)
    return (log_n - np.log(1.0 - a * a + 1e-6)).sum(-1)


def policy_terms(params: np.ndarray, targets: Targets, *, continuous: bool, sampled: bool):
    """([B, K+1] policy cross-entropy, [B, K+1] entropy) of each observation token's policy."""
    if continuous:
        d = params.shape[-1] // 2
        log_q = tanh_gaussian_log_prob(params, targets.sampled)
        log_sigma = np.clip(params[..., d:], -20.0, 2.0)
        entropy = (0.5 + 0.5 * math.log(2 * math.pi) + log_sigma).sum(-1)  # of the pre-tanh Gaussian
        return -(targets.policy * log_q).sum(-1), entropy
    logp = log_softmax(params)
    entropy = -(np.exp(logp) * logp).sum(-1)
    if sampled:  # the log-probabilities of the slots' actions
        logp = np.take_along_axis(logp, targets.sampled.astype(np.int64), -1)
    return -(targets.policy * logp).sum(-1), entropy


def per_sample_loss(policy, model, out: RawOutputs, targets: Targets, batch, *, continuous: bool = False,
                    sampled: bool = False) -> dict[str, np.ndarray]:
    """Each term's [B] masked mean and the weighted per-sample total ``"total"``, as the loss docstrings
    define them: w_lat L_lat + w_v CE_v + w_r CE_r + w_p CE_p - w_ent H."""
    lc, pc = policy.cfg.learn, policy.cfg.policy
    vs, rs = model.value_support_size, model.reward_support_size
    value_ce = cross_entropy(out.value_logits, two_hot(targets.value, vs))  # [B, K+1]
    reward_ce = cross_entropy(out.reward_logits, two_hot(targets.reward, rs))  # [B, K]
    policy_ce, entropy = policy_terms(out.policy_params, targets, continuous=continuous, sampled=sampled)
    latent = ((out.next_latent - targets.latent) ** 2).mean(-1)  # [B, K]
    terms = {
        "value": masked_mean(value_ce, batch.value_mask),
        "reward": masked_mean(reward_ce, batch.reward_mask),
        "policy": masked_mean(policy_ce, batch.policy_mask),
        "entropy": masked_mean(entropy, batch.policy_mask),
        "latent": masked_mean(latent, batch.obs_mask[:, 1:]),
    }
    terms["total"] = (pc.latent_loss_weight * terms["latent"] + lc.value_loss_weight * terms["value"]
                      + lc.reward_loss_weight * terms["reward"] + lc.policy_loss_weight * terms["policy"]
                      - pc.policy_entropy_weight * terms["entropy"])  # fmt: skip
    return terms


def batch_targets(batch, latent_key: str) -> Targets:
    """A batch's targets as its fields hold them (``latent_key``: the extras entry of the next latents)."""
    f64 = np.float64
    return Targets(value=batch.target_value.astype(f64), reward=batch.target_reward.astype(f64),
                   policy=batch.target_policy.astype(f64), latent=batch.extras[latent_key].astype(f64),
                   sampled=batch.extras.get("sampled_actions"))  # fmt: skip


def shifted(targets: Targets, **which: bool) -> Targets:
    """``targets`` with the named fields (value, reward, policy, latent, sampled) moved one unroll step later
    (step k gets step k - 1's target; step 0 the last one's): an off-by-one alignment."""
    fields = {name: getattr(targets, name) for name in ("value", "reward", "policy", "latent", "sampled")}
    for name, on in which.items():
        if on:
            fields[name] = np.roll(fields[name], 1, axis=1)
    return Targets(**fields)


def swapped(targets: Targets) -> Targets:
    """Value targets on the reward head and reward targets on the value head (the first K steps)."""
    value, reward = targets.value.copy(), targets.value[:, :-1].copy()
    value[:, :-1] = targets.reward
    return Targets(value=value, reward=reward, policy=targets.policy, latent=targets.latent,
                   sampled=targets.sampled)
