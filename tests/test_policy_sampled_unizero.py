"""sampled_unizero: UniZero with the sampled search. A hand-computed loss (continuous and discrete sampled
policy terms inside UniZero's loss, the entropy bonus counted once), fixed-shape sampled-action batches,
reanalyze writing both statistics back, KV-cache exactness (cached == uncached acting) and invalidation (new
weights mid-episode) with the sampled heads, and short sync / async / Tune runs on Pendulum whose checkpoints
re-evaluate to their reported reward."""

from __future__ import annotations

import copy
import math
import os

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import fit_one_trial, trial_policy

from muzero_tune.config import make_config
from muzero_tune.models import logits_to_scalar
from muzero_tune.models.unizero_net import token_sequence
from muzero_tune.pipeline.core import EVAL_SEED_OFFSET, make_policy, setup_torch_threads
from muzero_tune.pipeline.evaluator import Evaluator
from muzero_tune.policies.sampled_unizero import SampledUniZeroPolicy
from muzero_tune.policies.unizero import TARGET_LATENT
from muzero_tune.replay.buffer import ReplayBuffer, SampledIndices
from muzero_tune.replay.segment import GameSegment, SegmentBuilder
from muzero_tune.replay.targets import TrainBatch, past_steps, reanalyze_positions
from muzero_tune.runs.checkpoint import latest_checkpoint, load_policy

PRESET = "pendulum_sampled_unizero"
K = 4  # sampled actions per node
SMALL = {
    "policy.world_model_embed_dim": 32,
    "policy.world_model_heads": 2,
    "model.hidden_dim": 32,
    "mcts.num_simulations": 5,
    "policy.num_samples": K,
    "replay.num_unroll_steps": 3,
    "learn.batch_size": 16,
    "env.collector_env_num": 4,
    "env.evaluator_env_num": 2,
    "eval.n_episodes": 2,
    "eval.eval_freq": 200,
    "replay.game_segment_length": 20,
    "max_envstep": 400,
    "env.max_episode_steps": 50,  # short Pendulum episodes: returns in [-820, 0]
    "eval.max_episode_steps": 50,
    "stop_value": None,
    "logging.quiet": True,
}


def _policy(preset: str = PRESET, overrides: dict | None = None, *, seed: int = 0):
    cfg = make_config(preset, overrides={**SMALL, **(overrides or {})})
    setup_torch_threads()
    policy, _ = make_policy(cfg)
    torch.manual_seed(seed)
    return policy, policy.build_model()


def _zero_heads(model) -> None:
    with torch.no_grad():
        for head in (model.value_head, model.policy_head, model.reward_head, model.latent_head):
            head[-1].weight.zero_()
            head[-1].bias.zero_()


def _batch(b, k, obs_dim, actions, sampled, visits, *, policy_mask, embed_dim) -> TrainBatch:
    rng = np.random.default_rng(0)
    return TrainBatch(
        obs=rng.normal(size=(b, k + 1, obs_dim)).astype(np.float32),
        actions=actions,
        target_value=np.zeros((b, k + 1), np.float32),
        target_reward=np.zeros((b, k), np.float32),
        target_policy=visits,
        value_mask=np.ones((b, k + 1), np.float32),
        reward_mask=np.ones((b, k), np.float32),
        policy_mask=policy_mask,
        obs_mask=np.ones((b, k + 1), np.float32),
        weights=np.ones(b, np.float32),
        flat_index=np.arange(b),
        make_time=0,
        extras={TARGET_LATENT: np.zeros((b, k, embed_dim), np.float32), "sampled_actions": sampled},
    )


def _non_policy_terms(policy, model) -> float:
    """Per-sample loss of zeroed value/reward/latent heads with zero targets: uniform CEs and MSE 0."""
    lc = policy.cfg.learn
    value_ce, reward_ce = (math.log(2 * n + 1) for n in (model.value_support_size, model.reward_support_size))
    return lc.value_loss_weight * value_ce + lc.reward_loss_weight * reward_ce


def test_hand_computed_continuous_loss():
    """Zeroed heads: the Gaussian is N(0, 1) (mu = 0, log sigma = 0) at every observation token, so the policy
    term at step k is -sum_slots p log q(a) with q the tanh-N(0, 1) density (written out here, independent of
    the library's), and the entropy bonus is w x 0.5 log(2 pi e) per real step -- once, not twice; both are
    means over the real steps (policy_mask), not over all K+1."""
    policy, model = _policy()
    assert isinstance(policy, SampledUniZeroPolicy) and model.policy_dim == 2
    _zero_heads(model)
    b, k = 2, 3
    rng = np.random.default_rng(1)
    sampled = np.tanh(rng.normal(size=(b, k + 1, K, 1))).astype(np.float32)  # [B, K+1, K slots, D]
    visits = rng.dirichlet(np.ones(K), size=(b, k + 1)).astype(np.float32)
    pmask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], np.float32)
    batch = _batch(b, k, 3, rng.uniform(-1, 1, size=(b, k, 1)).astype(np.float32), sampled, visits,
                   policy_mask=pmask, embed_dim=model.embed_dim)  # fmt: skip
    out = policy.compute_loss(model, batch, train_iter=3)
    a = np.clip(sampled[..., 0].astype(np.float64), -1 + 1e-6, 1 - 1e-6)
    u = np.arctanh(a)
    log_q = -0.5 * u * u - 0.5 * math.log(2 * math.pi) - np.log(1 - a * a + 1e-6)  # [B, K+1, K]
    ce = -(visits * log_q).sum(-1)  # [B, K+1]
    h = 0.5 * math.log(2 * math.pi * math.e)
    lc, pc = policy.cfg.learn, policy.cfg.policy
    policy_ce = (ce * pmask).sum(1) / pmask.sum(1)  # the mean over the valid steps (2 of sample 1's 4)
    want = _non_policy_terms(policy, model) + lc.policy_loss_weight * policy_ce - pc.policy_entropy_weight * h
    np.testing.assert_allclose(out.per_sample_loss.detach().numpy(), want, rtol=1e-5)
    np.testing.assert_allclose(out.metrics["train/loss_policy"], policy_ce.mean(), rtol=1e-5)
    out.loss.backward()
    assert model.policy_head[-1].weight.grad.abs().sum() > 0


def test_hand_computed_discrete_sampled_loss():
    """CartPole, K = 2 of A = 2, slots in either order: the policy term is the cross-entropy at the sampled
    ids (uniform logits: log 2 for any target), and a one-hot target on slot 1 of a non-uniform head gives
    -log softmax(logits)[id of slot 1]."""
    policy, model = _policy("cartpole_sampled_unizero", {"policy.num_samples": 2})
    assert model.policy_dim == 2 and not policy.continuous
    _zero_heads(model)
    b, k = 2, 3
    ids = np.array([[[1, 0]] * (k + 1), [[0, 1]] * (k + 1)])  # [B, K+1, K=2] int64
    visits = np.zeros((b, k + 1, 2), np.float32)
    visits[..., 1] = 1.0  # all visits on slot 1: action 0 for sample 0, action 1 for sample 1
    pmask = np.ones((b, k + 1), np.float32)
    batch = _batch(b, k, 4, np.zeros((b, k), np.int64), ids, visits, policy_mask=pmask,
                   embed_dim=model.embed_dim)  # fmt: skip
    lc, pc = policy.cfg.learn, policy.cfg.policy
    out = policy.compute_loss(model, batch, train_iter=0)
    want = _non_policy_terms(policy, model) + (lc.policy_loss_weight - pc.policy_entropy_weight) * math.log(2)
    np.testing.assert_allclose(out.per_sample_loss.detach().numpy(), [want, want], rtol=1e-5)
    with torch.no_grad():
        model.policy_head[-1].bias.copy_(torch.tensor([1.0, -1.0]))  # logits (1, -1) at every token
    out = policy.compute_loss(model, batch, train_iter=0)
    logp = F.log_softmax(torch.tensor([1.0, -1.0], dtype=torch.float64), -1).numpy()
    entropy = -(np.exp(logp) * logp).sum()
    want = _non_policy_terms(policy, model) - pc.policy_entropy_weight * entropy
    want = want + lc.policy_loss_weight * np.array([-logp[0], -logp[1]])
    np.testing.assert_allclose(out.per_sample_loss.detach().numpy(), want, rtol=1e-5)


def _segment(m: int, *, obs_dim: int = 3) -> GameSegment:
    """obs i = [i, -i, 0.5]; slot k of step i samples (k - i) / 10 (recognisable per step)."""
    i = np.arange(m + 1, dtype=np.float32)
    frames = np.stack([i, -i, np.full(m + 1, 0.5, np.float32)], axis=1)[:, :obs_dim]
    sampled = ((np.arange(K)[None, :] - np.arange(m)[:, None]) / 10.0).astype(np.float32)[..., None]
    visits = np.tile(np.full(K, 1.0 / K, np.float32), (m, 1))
    return GameSegment(
        frames=frames,
        actions=(np.arange(m, dtype=np.float32)[:, None] / 100.0),
        rewards=-np.ones(m, np.float32),
        stats={
            "child_visits": visits,
            "root_value": np.zeros(m, np.float32),
            "legal_mask": np.ones((m, 0), bool),
            "sampled_actions": sampled,
        },
        num_real=m,
        frame_stack=1,
        done=True,
        terminal_at_end=True,
    )


def test_batches_have_fixed_shapes_and_reanalyze_writes_both_statistics():
    policy, model = _policy(overrides={"replay.reanalyze_ratio": 1.0})
    segs = (_segment(8), _segment(8))
    sample = SampledIndices(flat_index=np.arange(2), segments=segs, positions=np.array([6, 1]),
                            weights=np.ones(2, np.float32), make_time=0)  # fmt: skip
    batch = policy.make_batch(sample, target_model=model, rng=np.random.default_rng(0))
    sa = batch.extras["sampled_actions"]
    assert sa.shape == (2, 4, K, 1) and batch.target_policy.shape == (2, 4, K)  # past the data: zero, masked
    np.testing.assert_array_equal(sa[1], segs[1].stats["sampled_actions"][1:5])
    assert (sa[0, 2:] == 0).all() and batch.policy_mask[0].tolist() == [1, 1, 0, 0]
    assert batch.extras[TARGET_LATENT].shape == (2, 3, model.embed_dim)
    before = segs[0].stats["sampled_actions"].copy()
    policy.make_batch(sample, target_model=model, rng=np.random.default_rng(1), reanalyze_count=2)
    after = segs[0].stats["sampled_actions"]
    assert not np.array_equal(after[6:8], before[6:8]) and np.array_equal(after[:6], before[:6])
    assert (np.abs(after) <= 1).all()
    np.testing.assert_allclose(segs[0].stats["child_visits"][6:8].sum(-1), 1.0, rtol=1e-5)
    out = policy.compute_loss(model, batch, train_iter=0)
    assert math.isfinite(float(out.loss.detach()))


# ------------------------------------------------------------------------------------------- caches


def _pendulum_obs(n_envs: int, steps: int, seed: int = 0) -> list[np.ndarray]:
    envs = [gym.make("Pendulum-v1") for _ in range(n_envs)]
    obs = [np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(envs)]).astype(np.float32)]
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        obs.append(np.stack([e.step(rng.uniform(-2, 2, size=1))[0] for e in envs]).astype(np.float32))
    return obs


def _act(policy, model, obs, state, seed=0):
    legal = np.ones((len(obs), 0), bool)
    return policy.act(model, obs, legal, explore=False, temperature=0.25, rng=np.random.default_rng(seed),
                      state=state, env_index=np.arange(len(obs)))  # fmt: skip


def _reference_root(policy, model, obs: list[np.ndarray], actions: list[np.ndarray]) -> torch.Tensor:
    """Uncached: the root's Gaussian params [N, 2] from each env's whole window [o, a, ..., o_t]."""
    w = min(policy.context_obs, len(obs))
    obs, actions = obs[-w:], actions[len(actions) - (w - 1) :] if w > 1 else []
    n = len(obs[0])
    with torch.no_grad():
        model.eval()
        z = model.encode(torch.as_tensor(np.stack(obs, 1)).flatten(0, 1)).view(n, w, -1)
        if actions:
            a = model.embed_action(torch.as_tensor(np.stack(actions, 1)).flatten(0, 1)).view(n, w - 1, -1)
            z = token_sequence(z, a)
        return model.obs_heads(model.forward_sequence(z)[:, -1])


def test_cached_and_uncached_acting_agree_with_the_gaussian_head():
    obs = _pendulum_obs(3, 7)
    outs = {}
    for cache in (True, False):
        policy, model = _policy(overrides={"policy.kv_cache": cache})
        state, rows = policy.initial_act_state(3), []
        for o in obs:
            act = _act(policy, model, o, state)
            state = act.state
            rows.append(np.concatenate([act.predicted_value, act.root_value, act.actions[:, 0]]))
        outs[cache] = np.stack(rows)
        assert (state.ctx.keys is not None) == cache
    np.testing.assert_allclose(outs[True], outs[False], atol=1e-5)


def test_root_is_the_uncached_window_and_new_weights_mid_episode_are_used_at_once():
    policy, model = _policy()
    # non-trivial Gaussian heads (the 3e-3 init would make every root near N(0, 1))
    with torch.no_grad():
        model.policy_head[-1].weight.normal_(0.0, 0.5)
    obs = _pendulum_obs(2, 6)
    state, taken = policy.initial_act_state(2), []
    for t, o in enumerate(obs[:5]):
        act = _act(policy, model, o, state)
        ref = _reference_root(policy, model, obs[: t + 1], taken)
        want = logits_to_scalar(ref.value_logits, support_size=model.value_support_size).numpy()
        np.testing.assert_allclose(act.predicted_value, want, atol=1e-5)
        state, taken = act.state, taken + [act.actions]
    old_model, new = copy.deepcopy(model), copy.deepcopy(model)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    model.load_state_dict(new.state_dict())  # a snapshot arrives mid-episode
    policy.on_weights_loaded(model)
    roots = policy.root_inference(model.eval(), torch.as_tensor(obs[5]), state, np.arange(2))
    fresh = _reference_root(policy, copy.deepcopy(new), obs[:6], taken)
    torch.testing.assert_close(roots.policy_logits, fresh.policy_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(roots.value_logits, fresh.value_logits, atol=1e-5, rtol=1e-5)
    # control: the old weights give other Gaussian params (the test can fail)
    old = _reference_root(policy, old_model, obs[:6], taken)
    assert (old.policy_logits - roots.policy_logits).abs().max() > 1e-3


def test_bootstrap_values_and_reanalyze_roots_are_the_acting_roots_with_continuous_actions():
    """As unizero's: at every stored observation of a Pendulum episode cut into segments of 4 steps (float
    actions [N, H, 1] in the windows), value_fn with the past steps the targets gather is the value acting
    computed there, and the buffer reanalyze searches from acting's roots (Gaussian params); the observation
    alone gives other values."""
    policy, model = _policy()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    model.eval()
    rc, length = policy.cfg.replay, 9
    builder = SegmentBuilder(segment_length=4, pad_length=rc.num_unroll_steps + rc.td_steps, frame_stack=1,
                             stream_id="p:0", action_shape=(1,), action_dtype="float32")  # fmt: skip
    env = gym.make("Pendulum-v1")
    builder.reset(np.asarray(env.reset(seed=0)[0], np.float32))
    searched, search = [], policy.run_search

    def spy(model, roots_, legal_mask, **kw):
        searched.append(roots_)
        return search(model, roots_, legal_mask, **kw)

    policy.run_search = spy
    state, values, segments = policy.initial_act_state(1), [], []
    for step in range(length + 1):
        act = _act(policy, model, builder.current_frames().astype(np.float32), state)
        state, values = act.state, values + [act.predicted_value[0]]
        if step == length:
            break
        frame, reward, *_ = env.step(2.0 * act.actions[0])
        segments += builder.step(action=act.actions[0], reward=float(reward),
                                 next_frame=np.asarray(frame, np.float32),
                                 stats={k: v[0] for k, v in act.step_stats.items()}, terminated=False,
                                 truncated=step + 1 == length)  # fmt: skip
    acting_roots = list(searched)
    buf = ReplayBuffer(capacity_transitions=100)
    buf.push(segments)
    assert policy.context_steps == 3 and len(buf.segments) == 3
    where = [(j, q) for j, seg in enumerate(buf.segments) for q in range(seg.num_stored + 1)]
    g = np.array([buf.base_idx + j for j, _ in where])
    pos = np.array([q for _, q in where])
    steps = np.array([buf.segments[j].episode_step0 + q for j, q in where])
    obs = np.stack([buf.segments[j].stacked_obs(np.array([q]))[0] for j, q in where]).reshape(len(where), -1)
    past = past_steps(buf.step_rows(g), pos, np.arange(len(where)), policy.context_steps)
    assert past.actions.shape == (len(where), 3, 1) and past.actions.dtype == np.float32
    got = policy.value_fn(model)(obs, past)
    np.testing.assert_allclose(got, np.array(values)[steps], rtol=1e-5, atol=1e-5)
    alone = policy.value_fn(model)(obs)  # control (the test can fail)
    assert np.abs(alone - np.array(values)[steps])[steps > 0].min() > 1e-4
    searched.clear()
    starts = np.array([1, 0, 0])  # episode steps 1, 4 and 8: segment starts whose windows reach back
    reanalyze_positions(list(buf.segments), starts, span=1,
                        reanalyze_fn=policy.reanalyze_fn(model, np.random.default_rng(0)),
                        context_steps=policy.context_steps,
                        rows=buf.step_rows(buf.base_idx + np.arange(3)))  # fmt: skip
    policy.run_search = search
    at = [s.episode_step0 + int(t) for s, t in zip(buf.segments, starts)]
    for name in ("policy_logits", "value_logits"):
        want = torch.cat([getattr(acting_roots[i], name) for i in at])
        torch.testing.assert_close(getattr(searched[0], name), want, rtol=1e-5, atol=1e-4)


# ---------------------------------------------------------------------------------------------- pipelines


def _check_snapshot(run_dir: str) -> None:
    path = latest_checkpoint(run_dir)
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["config"]["policy.type"] == "sampled_unizero"
    cfg, policy, model, _ = load_policy(path)
    evaluator = Evaluator(cfg, policy, policy.spec, seed=cfg.seed + EVAL_SEED_OFFSET)
    res = evaluator.evaluate(model, policy_version=ckpt["evaluated"]["version"])
    assert res.reward_mean == pytest.approx(ckpt["evaluated"]["metrics"]["reward_mean"])


def test_short_sync_run_on_pendulum(tmp_path):
    from muzero_tune.pipeline.sync_driver import train_muzero_segment

    cfg = make_config(PRESET, overrides={**SMALL, "logging.output_dir": str(tmp_path), "exp_name": "s",
                                         "replay.buffer_reanalyze_freq": 1.0, "replay.reanalyze_ratio": 0.25,
                                         "replay.reanalyze_batch_size": 8})  # fmt: skip
    summary = train_muzero_segment(cfg)
    assert summary.stop_reason == "max_envstep" and summary.train_iter > 0 and summary.evals
    assert all(-900 < e["reward_mean"] <= 0 for e in summary.evals)  # 50-step Pendulum returns
    _check_snapshot(os.path.join(str(tmp_path), "s"))


def test_short_async_run_on_pendulum(run_async, tmp_path):
    over = {
        **SMALL,
        "env.env_id": "Pendulum-v1",
        "policy.type": "sampled_unizero",
        "model.reward_support_size": 10,
        "eval.eval_freq": 200,
    }
    run = run_async(tmp_path, over, exp_name="sua", standalone=True)
    assert run.summary.train_iter > 0 and run.summary.env_steps >= 400
    _check_snapshot(run.run_dir)


# slow: the Tune trainable never looks at the policy type; test_tune.py runs it end to end (sync and
# async sweeps, checkpoints evaluated again), test_policy_sampled.py a one-trial sweep of a non-default
# policy on Pendulum, and this policy's own short sync and async runs above write and load its checkpoint
@pytest.mark.slow
def test_one_trial_tune_run_on_pendulum(ray_cluster, tmp_path):
    cfg = make_config(PRESET, overrides={**SMALL, "tune.storage_path": str(tmp_path)})
    result = fit_one_trial(cfg, tmp_path)
    assert result.metrics["train_iter"] > 0
    cfg2, policy, model, ckpt = trial_policy(result)
    assert cfg2.policy.type == "sampled_unizero" and cfg2.env.env_id == "Pendulum-v1"
    evaluator = Evaluator(cfg2, policy, policy.spec, seed=cfg2.seed + EVAL_SEED_OFFSET)
    res = evaluator.evaluate(model, policy_version=ckpt["evaluated"]["version"])
    assert res.reward_mean == pytest.approx(ckpt["evaluated"]["metrics"]["reward_mean"])
