"""sampled_muzero and sampled_efficientzero: the policy loss against torch's tanh-Gaussian and categorical
log-probs, targets on a hand-built continuous segment (visit distributions over the K slots, the sampled
actions gathered along the unroll), acting (the env action is the chosen slot's action), reanalyze writing
both statistics back, clear config errors, and each type's short sync run on Pendulum (continuous actions,
each type's own continuous network) whose checkpoint re-evaluates to its reported reward. Their sync and async
runs on CartPole (discrete sampled search): their Tune trials in tests/test_every_policy_type.py."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from muzero_tune.config import ConfigError, make_config
from muzero_tune.pipeline.core import make_policy
from muzero_tune.policies.sampled import SampledEfficientZeroPolicy, SampledMuZeroPolicy
from muzero_tune.replay.buffer import SampledIndices
from muzero_tune.replay.segment import GameSegment
from muzero_tune.runs.checkpoint import latest_checkpoint, load_checkpoint

K = 4
SMALL = {
    "model.hidden_dim": 32,
    "model.latent_dim": 16,
    "mcts.num_simulations": 5,
    "learn.batch_size": 32,
    "env.collector_env_num": 4,
    "env.evaluator_env_num": 2,
    "eval.n_episodes": 2,
    "eval.eval_freq": 200,
    "replay.game_segment_length": 20,
    "max_envstep": 400,
    "stop_value": None,
    "logging.quiet": True,
    "policy.num_samples": K,
}


def _policy(preset="pendulum_sampled_muzero", **overrides):
    cfg = make_config(preset, overrides={**SMALL, **overrides})
    policy, _ = make_policy(cfg)
    return policy, policy.build_model()


def _tanh_normal(params: torch.Tensor) -> torch.distributions.Distribution:
    d = params.shape[-1] // 2
    mu, log_sigma = params[..., :d], params[..., d:].clamp(-20, 2)
    base = torch.distributions.Normal(mu, log_sigma.exp())
    return torch.distributions.TransformedDistribution(base, [torch.distributions.TanhTransform()])


class _Batch:
    def __init__(self, sampled):
        self.extras = {"sampled_actions": sampled}


def _step_loss(policy, logits, sampled, k, target):
    """``policy.policy_losses`` of unroll step k alone: ``logits`` [B, P], ``sampled`` [B, K+1, slots, ...]
    (numpy), ``target`` [B, slots] -> [B]."""
    return policy.policy_losses(logits[:, None], _Batch(sampled[:, k : k + 1]), target[:, None])[:, 0]


def test_continuous_policy_loss_is_the_tanh_gaussian_cross_entropy():
    policy, _ = _policy(**{"policy.policy_entropy_weight": 0.0})
    g = torch.Generator().manual_seed(0)
    params = torch.randn(5, 2, generator=g, dtype=torch.float64)  # [B, 2D], D = 1
    actions = torch.tanh(torch.randn(5, 2, K, 1, generator=g, dtype=torch.float64))  # [B, K+1=2, K, D]
    target = torch.softmax(torch.randn(5, K, generator=g, dtype=torch.float64), -1)
    loss = _step_loss(policy, params, actions.numpy(), 1, target)
    dist = _tanh_normal(params[:, None, :])  # batch [B, 1] -> broadcast over K
    log_prob = dist.log_prob(actions[:, 1].clamp(-1 + 1e-6, 1 - 1e-6)).sum(-1)  # [B, K]
    expected = -(target * log_prob).sum(-1)
    # ours adds 1e-6 inside log(1 - a^2): a relative difference far below the tolerance
    torch.testing.assert_close(loss, expected, rtol=1e-4, atol=1e-4)
    # the entropy bonus lowers the loss by weight x the pre-tanh Gaussian entropy
    bonus, _ = _policy(**{"policy.policy_entropy_weight": 0.5})
    entropy = torch.distributions.Normal(params[:, :1], params[:, 1:].clamp(-20, 2).exp()).entropy().sum(-1)
    torch.testing.assert_close(
        _step_loss(bonus, params, actions.numpy(), 1, target), loss - 0.5 * entropy
    )


def test_continuous_policy_loss_is_finite_from_bf16_heads_at_the_action_bounds():
    """Under ``learn.mixed_precision`` the policy head gives bf16 params; the tanh-Gaussian log-density is
    taken in fp32 (in bf16 the actions' clamp 1 - 1e-6 rounds to 1 and atanh(1) is inf): finite at actions on
    the bounds (where the search's tanh puts saturated samples), and the fp32 loss of the same params."""
    policy, _ = _policy()
    g = torch.Generator().manual_seed(0)
    params = torch.randn(5, 2, generator=g).to(torch.bfloat16)  # [B, 2D], D = 1
    actions = torch.tanh(torch.randn(5, 2, K, 1, generator=g))
    actions[:, 1, 0] = 1.0
    actions[:, 1, 1] = -1.0
    target = torch.softmax(torch.randn(5, K, generator=g), -1)
    loss = _step_loss(policy, params, actions.numpy(), 1, target)
    assert torch.isfinite(loss).all() and loss.dtype == torch.float32
    fp32 = _step_loss(policy, params.float(), actions.numpy(), 1, target)
    torch.testing.assert_close(loss, fp32)


def test_discrete_policy_loss_is_the_cross_entropy_at_the_sampled_ids():
    policy, _ = _policy(
        "cartpole_sampled_muzero", **{"policy.num_samples": 2, "policy.policy_entropy_weight": 0}
    )
    logits = torch.tensor([[0.3, -1.0], [2.0, 0.5]])
    ids = np.array([[[1, 0]], [[0, 1]]])  # [B, K+1 = 1, K = 2]
    target = torch.tensor([[0.25, 0.75], [1.0, 0.0]])
    loss = _step_loss(policy, logits, ids, 0, target)
    logp = F.log_softmax(logits, -1)
    expected = torch.stack([-(0.25 * logp[0, 1] + 0.75 * logp[0, 0]), -logp[1, 0]])
    torch.testing.assert_close(loss, expected)


def _continuous_segment(m: int, *, num_real: int, terminal: bool) -> GameSegment:
    """obs i = [i, -i, 0.5]; action i = [i / 100]; slot k of step i samples (k - i) / 10."""
    i = np.arange(m + 1, dtype=np.float32)
    frames = np.stack([i, -i, np.full(m + 1, 0.5, np.float32)], axis=1)
    sampled = ((np.arange(K)[None, :] - np.arange(m)[:, None]) / 10.0).astype(np.float32)[
        ..., None
    ]  # [M, K, 1]
    visits = np.tile(np.arange(1, K + 1, dtype=np.float32) / (K * (K + 1) / 2), (m, 1))
    visits[:, 0] += np.arange(m) / 1000.0  # recognisable per step
    return GameSegment(
        frames=frames,
        actions=(np.arange(m, dtype=np.float32)[:, None] / 100.0),
        rewards=np.ones(m, np.float32),
        stats={
            "child_visits": visits,
            "root_value": np.zeros(m, np.float32),
            "legal_mask": np.ones((m, 0), bool),
            "sampled_actions": sampled,
        },
        num_real=num_real,
        frame_stack=1,
        done=terminal,
        terminal_at_end=terminal,
    )


def test_targets_gather_the_visit_distributions_and_sampled_actions_along_the_unroll():
    policy, model = _policy(**{"replay.num_unroll_steps": 3, "replay.td_steps": 2})
    segs = (
        _continuous_segment(8, num_real=8, terminal=True),
        _continuous_segment(6, num_real=4, terminal=False),
    )
    sample = SampledIndices(
        flat_index=np.arange(2),
        segments=segs,
        positions=np.array([6, 1]),
        weights=np.ones(2, np.float32),
        make_time=0,
    )
    batch = policy.make_batch(sample, target_model=model, rng=np.random.default_rng(0))
    sa = batch.extras["sampled_actions"]
    assert sa.shape == (2, 4, K, 1) and batch.target_policy.shape == (2, 4, K)
    # sample 0 at t = 6 of an 8-step terminal segment: steps 6, 7 stored, 8 and 9 past the end (masked, zero)
    np.testing.assert_array_equal(sa[0, :2], segs[0].stats["sampled_actions"][6:8])
    np.testing.assert_array_equal(batch.target_policy[0, :2], segs[0].stats["child_visits"][6:8])
    assert (sa[0, 2:] == 0).all() and batch.policy_mask[0].tolist() == [1, 1, 0, 0]
    # sample 1 at t = 1: steps 1..4 all stored (4 and 5 are the padding continuation)
    np.testing.assert_array_equal(sa[1], segs[1].stats["sampled_actions"][1:5])
    np.testing.assert_array_equal(batch.actions[1], segs[1].actions[1:4])
    assert batch.actions.shape == (2, 3, 1) and batch.actions.dtype == np.float32
    # the loss runs on it and trains the Gaussian head
    out = policy.compute_loss(model, batch, train_iter=0)
    out.loss.backward()
    assert math.isfinite(float(out.loss.detach())) and model.pred_policy.weight.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "preset,cls",
    [
        ("pendulum_sampled_muzero", SampledMuZeroPolicy),
        ("pendulum_sampled_efficientzero", SampledEfficientZeroPolicy),
    ],
)
def test_acting_takes_the_chosen_slots_action_and_reanalyze_replaces_both(preset, cls):
    policy, model = _policy(preset)
    assert isinstance(policy, cls)
    obs = np.random.default_rng(0).normal(size=(3, 3)).astype(np.float32)
    legal = np.ones((3, 0), bool)
    act = policy.act(model, obs, legal, explore=False, temperature=0.25, rng=np.random.default_rng(0))
    sampled, visits = act.step_stats["sampled_actions"], act.step_stats["child_visits"]
    assert sampled.shape == (3, K, 1) and visits.shape == (3, K) and act.actions.shape == (3, 1)
    np.testing.assert_array_equal(act.actions, sampled[np.arange(3), visits.argmax(1)])  # eval: most visited
    assert (np.abs(act.actions) <= 1).all()
    explore = policy.act(model, obs, legal, explore=True, temperature=0.25, rng=np.random.default_rng(1))
    slot = [
        int(np.flatnonzero((explore.step_stats["sampled_actions"][b] == explore.actions[b]).all(-1))[0])
        for b in range(3)
    ]
    assert (explore.step_stats["child_visits"][np.arange(3), slot] > 0).all()  # a visited slot
    fresh = policy.reanalyze(model, obs, legal, np.random.default_rng(2))
    assert set(fresh) == {"child_visits", "sampled_actions"} and fresh["sampled_actions"].shape == (3, K, 1)


def test_config_errors():
    with pytest.raises(ConfigError, match="policy.num_samples"):
        _policy("cartpole_sampled_muzero", **{"policy.num_samples": 3})
    with pytest.raises(ConfigError, match="policy.sampled_prior"):
        make_config("pendulum_sampled_muzero", overrides={"policy.sampled_prior": "beta"})
    with pytest.raises(ConfigError, match="model.kind"):
        _policy(**{"model.kind": "conv"}).build_model()


# ---------------------------------------------------------------------------------------------- pipelines


def _check_snapshot(run_dir: str, ptype: str) -> None:
    """The run's latest checkpoint evaluated again (:func:`muzero_tune.api.evaluate`: its evaluation seed and
    episode count) gives exactly the reward it reported."""
    from muzero_tune.api import evaluate

    path = latest_checkpoint(run_dir)
    ckpt = load_checkpoint(path)
    assert ckpt["config"]["policy.type"] == ptype and ckpt["config"]["env.env_id"] == "Pendulum-v1"
    metrics = ckpt["evaluated"]["metrics"]
    again = evaluate(path)
    assert again.version == ckpt["evaluated"]["version"] > 0
    assert (again.reward_mean, again.reward_std) == (metrics["reward_mean"], metrics["reward_std"])


SHORT_EPISODES = {"env.max_episode_steps": 50, "eval.max_episode_steps": 50}


@pytest.mark.parametrize("preset", ["pendulum_sampled_muzero", "pendulum_sampled_efficientzero"])
def test_short_sync_run_on_pendulum(tmp_path, preset):
    from muzero_tune.pipeline.sync_driver import train_muzero_segment

    cfg = make_config(preset, overrides={**SMALL, "logging.output_dir": str(tmp_path), "exp_name": "s",
                                         "max_envstep": 160, **SHORT_EPISODES})  # fmt: skip
    summary = train_muzero_segment(cfg)
    assert summary.stop_reason == "max_envstep" and summary.train_iter > 0 and summary.evals
    assert all(-900 < e["reward_mean"] <= 0 for e in summary.evals)  # 50-step Pendulum returns: [-820, 0]
    _check_snapshot(os.path.join(str(tmp_path), "s"), cfg.policy.type)
