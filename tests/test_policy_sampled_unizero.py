"""sampled_unizero: UniZero with the sampled search. A hand-computed loss (continuous and discrete sampled
policy terms inside UniZero's loss, the entropy bonus counted once), fixed-shape sampled-action batches,
reanalyze writing both statistics back, KV-cache exactness (cached == uncached acting) and invalidation (new
weights mid-episode) with the sampled heads, and a short sync run on Pendulum (continuous actions) whose
checkpoint re-evaluates to its reported reward. Its sync and async runs on CartPole: its Tune trials in
tests/test_every_policy_type.py."""

from __future__ import annotations

import copy
import dataclasses
import math
import os

import gymnasium as gym
import numpy as np
import pytest
import torch
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
from muzero_tune.runs.checkpoint import latest_checkpoint, load_checkpoint
from tests.oracles import unizero_loss as oracle

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


def _batch(model, actions, sampled, visits, *, policy_mask, obs_dim: int) -> TrainBatch:
    """A loss batch whose value, reward and latent targets differ at every step (a misaligned one changes the
    loss): B = 2 samples of K = 3 unroll steps; sample 1's last reward and value steps are masked."""
    b, k = actions.shape[:2]
    rng = np.random.default_rng(0)
    with torch.no_grad():  # LayerNorm latents, one per step
        target_latent = model.latent_norm(torch.randn(b, k, model.embed_dim) * 2).numpy()
    value_mask, reward_mask = np.ones((b, k + 1), np.float32), np.ones((b, k), np.float32)
    value_mask[1, -1] = reward_mask[1, -1] = 0
    return TrainBatch(
        obs=rng.normal(size=(b, k + 1, obs_dim)).astype(np.float32),
        actions=actions,
        target_value=rng.uniform(-12, 12, size=(b, k + 1)).astype(np.float32),
        target_reward=rng.uniform(-4, 4, size=(b, k)).astype(np.float32),
        target_policy=visits,
        value_mask=value_mask,
        reward_mask=reward_mask,
        policy_mask=policy_mask,
        obs_mask=np.ones((b, k + 1), np.float32),
        weights=np.array([1.0, 0.5], np.float32)[:b],
        flat_index=np.arange(b),
        make_time=0,
        extras={TARGET_LATENT: target_latent, "sampled_actions": sampled},
    )


def _check_against_the_hand_computation(policy, model, batch, out, **kind) -> tuple[np.ndarray, dict, object]:
    """The package's per-sample loss, its IS-weighted mean and each term's batch mean equal the loss written
    out by hand from the model's raw head outputs (tests/oracles/unizero_loss.py). Returns the package's
    per-sample loss, the hand-computed terms and the raw outputs."""
    raw = oracle.raw_outputs(model, batch.obs, batch.actions)
    targets = oracle.batch_targets(batch, TARGET_LATENT)
    want = oracle.per_sample_loss(policy, model, raw, targets, batch, **kind)
    got = out.per_sample_loss.detach().double().numpy()
    np.testing.assert_allclose(got, want["total"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(out.loss.detach()), (want["total"] * batch.weights).mean(), rtol=1e-5)
    for term in ("value", "reward", "policy", "latent"):
        np.testing.assert_allclose(out.metrics[f"train/loss_{term}"], want[term].mean(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(out.metrics["train/policy_entropy"], want["entropy"].mean(), rtol=1e-5)
    return got, want, raw


def test_hand_computed_continuous_loss():
    """Live heads (random last layers: mu and log sigma differ at every observation token) against targets
    that differ per step. The policy term at step k is -sum_slots p log q(a) with q the tanh-Gaussian of o_k's
    head at that step's sampled actions, the entropy bonus the pre-tanh Gaussian's, subtracted once; every
    term is the mean over the steps its mask keeps. Positive controls: the hand computation with the visit
    targets and their actions, or only the actions, moved one unroll step, with the value targets moved,
    with value and reward targets swapped, or with the entropy bonus counted twice is far from the package's
    loss."""
    policy, model = _policy()
    assert isinstance(policy, SampledUniZeroPolicy) and model.policy_dim == 2
    oracle.randomize_heads(model, seed=1, policy_scale=0.3)  # log sigma in [-1.1, -0.3]: no density spikes
    b, k = 2, 3
    rng = np.random.default_rng(1)
    sampled = np.tanh(rng.normal(size=(b, k + 1, K, 1))).astype(np.float32)  # [B, K+1, K slots, D]
    visits = rng.dirichlet(np.full(K, 0.5), size=(b, k + 1)).astype(np.float32)
    pmask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], np.float32)  # sample 1: the mean over its 2 valid steps
    batch = _batch(model, rng.uniform(-1, 1, size=(b, k, 1)).astype(np.float32), sampled, visits,
                   policy_mask=pmask, obs_dim=3)  # fmt: skip
    out = policy.compute_loss(model, batch, train_iter=3)
    got, want, raw = _check_against_the_hand_computation(policy, model, batch, out, continuous=True)
    mu, log_sigma = raw.policy_params[..., 0], raw.policy_params[..., 1]
    assert np.abs(np.diff(mu, axis=1)).min() > 0.03 and np.abs(np.diff(log_sigma, axis=1)).min() > 0.01
    # positive controls (measured: 2.4 policy moved, 0.80 actions moved, 0.15 value moved, 3.7 swapped, 0.033
    # entropy twice; the two agree to 2e-6)
    targets = oracle.batch_targets(batch, TARGET_LATENT)
    for moved in (oracle.shifted(targets, policy=True, sampled=True), oracle.shifted(targets, sampled=True),
                  oracle.shifted(targets, value=True), oracle.swapped(targets)):  # fmt: skip
        wrong = oracle.per_sample_loss(policy, model, raw, moved, batch, continuous=True)
        assert np.abs(wrong["total"] - got).max() > 0.1
    twice = want["total"] - policy.cfg.policy.policy_entropy_weight * want["entropy"]
    assert np.abs(twice - got).max() > 0.01
    out.loss.backward()
    for head in (model.value_head, model.policy_head, model.reward_head, model.latent_head):
        assert head[-1].weight.grad.abs().sum() > 0


def test_hand_computed_discrete_sampled_loss():
    """CartPole, K = 2 of A = 2, the slots in a different order per sample and step, live heads: the policy
    term is the cross-entropy at the slots' action ids (log-softmax of o_k's logits gathered at the ids), the
    entropy the categorical's. Positive controls: the slots' ids swapped (visits on the other action) or the
    targets moved one unroll step is far from the package's loss."""
    policy, model = _policy("cartpole_sampled_unizero", {"policy.num_samples": 2})
    assert model.policy_dim == 2 and not policy.continuous
    oracle.randomize_heads(model, seed=2)
    b, k = 2, 3
    rng = np.random.default_rng(2)
    ids = np.array([[[1, 0], [0, 1], [1, 0], [0, 1]], [[0, 1], [0, 1], [1, 0], [1, 0]]])  # [B, K+1, 2] int64
    visits = np.stack([rng.dirichlet([0.3, 0.3], size=b) for _ in range(k + 1)], 1).astype(np.float32)
    pmask = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], np.float32)
    batch = _batch(model, rng.integers(0, 2, size=(b, k)), ids, visits, policy_mask=pmask, obs_dim=4)
    out = policy.compute_loss(model, batch, train_iter=0)
    got, want, raw = _check_against_the_hand_computation(policy, model, batch, out, sampled=True)
    logits = raw.policy_params
    assert np.abs(np.diff(logits[..., 0] - logits[..., 1], axis=1)).min() > 0.05  # a policy per token
    # positive controls (measured: 2.0 ids swapped, 0.65 targets moved; the two agree to 3e-6)
    targets = oracle.batch_targets(batch, TARGET_LATENT)
    swapped_ids = dataclasses.replace(targets, sampled=targets.sampled[..., ::-1])
    for moved in (swapped_ids, oracle.shifted(targets, policy=True, sampled=True)):
        wrong = oracle.per_sample_loss(policy, model, raw, moved, batch, sampled=True)
        assert np.abs(wrong["total"] - got).max() > 0.25


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
    """The run's latest checkpoint evaluated again (:func:`muzero_tune.api.evaluate`: its evaluation seed and
    episode count) gives exactly the reward it reported."""
    from muzero_tune.api import evaluate

    path = latest_checkpoint(run_dir)
    ckpt = load_checkpoint(path)
    assert (ckpt["config"]["policy.type"], ckpt["config"]["env.env_id"]) == ("sampled_unizero", "Pendulum-v1")
    metrics = ckpt["evaluated"]["metrics"]
    again = evaluate(path)
    assert again.version == ckpt["evaluated"]["version"] > 0
    assert (again.reward_mean, again.reward_std) == (metrics["reward_mean"], metrics["reward_std"])


def test_short_sync_run_on_pendulum(tmp_path):
    from muzero_tune.pipeline.sync_driver import train_muzero_segment

    cfg = make_config(PRESET, overrides={**SMALL, "logging.output_dir": str(tmp_path), "exp_name": "s",
                                         "replay.buffer_reanalyze_freq": 1.0, "replay.reanalyze_ratio": 0.25,
                                         "replay.reanalyze_batch_size": 8, "max_envstep": 160})  # fmt: skip
    summary = train_muzero_segment(cfg)
    assert summary.stop_reason == "max_envstep" and summary.train_iter > 0 and summary.evals
    assert all(-900 < e["reward_mean"] <= 0 for e in summary.evals)  # 50-step Pendulum returns
    _check_snapshot(os.path.join(str(tmp_path), "s"))


@pytest.mark.slow
def test_one_trial_tune_run_on_pendulum(ray_cluster, tmp_path):
    """A one-trial Tune sweep of the Pendulum preset: its checkpoint loads and re-evaluates to its reported
    reward. The Tune trainable never looks at the policy type or the env.

    Default-tier twin: this type through a Tune trial, every checkpoint re-evaluated exactly,
    tests/test_every_policy_type.py::test_tune_trial_checkpoints_reevaluate_to_the_reported_reward[sync-sampled_unizero]
    and this preset on Pendulum, its checkpoint re-evaluated,
    tests/test_policy_sampled_unizero.py::test_short_sync_run_on_pendulum
    """
    cfg = make_config(PRESET, overrides={**SMALL, "tune.storage_path": str(tmp_path)})
    result = fit_one_trial(cfg, tmp_path)
    assert result.metrics["train_iter"] > 0
    cfg2, policy, model, ckpt = trial_policy(result)
    assert cfg2.policy.type == "sampled_unizero" and cfg2.env.env_id == "Pendulum-v1"
    evaluator = Evaluator(cfg2, policy, policy.spec, seed=cfg2.seed + EVAL_SEED_OFFSET)
    res = evaluator.evaluate(model, policy_version=ckpt["evaluated"]["version"])
    assert res.reward_mean == pytest.approx(ckpt["evaluated"]["metrics"]["reward_mean"])
