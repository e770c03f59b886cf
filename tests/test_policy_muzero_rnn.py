"""The ``muzero_rnn_full_obs`` policy: a GRU history h carried per env, packed with z in the search.

Checks: h enters prediction and dynamics; acting carries h and resets it every context_length_init steps;
the packed search equals the reference search run with an independently written unpacking recurrent_fn;
the targets of a hand-built case; the learner's reconstructed root history equals what the collector
searched with. The type's sync and async runs: its Tune trials in tests/test_every_policy_type.py, every
checkpoint re-evaluated exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from muzero_tune.config import make_config
from muzero_tune.mcts.reference import reference_search
from muzero_tune.models import logits_to_scalar_np
from muzero_tune.models.rnn_net import RNNMuZeroNet
from muzero_tune.pipeline.collector import SegmentCollector
from muzero_tune.pipeline.core import make_policy, setup_torch_threads
from muzero_tune.policies import muzero_rnn as mr
from muzero_tune.policies.registry import get_policy_class
from muzero_tune.replay.buffer import ReplayBuffer, SampledIndices
from muzero_tune.replay.segment import GameSegment

PRESET = "cartpole_muzero_rnn_full_obs"
SMALL = {
    "model.hidden_dim": 32, "model.latent_dim": 16, "mcts.num_simulations": 4, "learn.batch_size": 32,
    "env.collector_env_num": 4, "env.evaluator_env_num": 2, "eval.n_episodes": 2, "eval.eval_freq": 20,
    "replay.game_segment_length": 20, "max_envstep": 400, "stop_value": None, "logging.quiet": True,
    "policy.rnn_hidden_size": 8,
}
L = 3  # context_length_init in the acting and target tests
H = 8


def _policy(**overrides):
    cfg = make_config(PRESET, overrides={**SMALL, "policy.context_length_init": L, **overrides})
    setup_torch_threads()  # one torch thread, as every pipeline process runs (two are far slower here)
    policy, _ = make_policy(cfg)
    torch.manual_seed(0)
    model = policy.build_model().eval()
    return policy, model


class RootSpy:
    """Wraps ``policy.search.run``: records the (packed) root each search was given."""

    def __init__(self, policy):
        self.roots: list[torch.Tensor] = []
        run = policy.search.run

        def spy(**kw):
            self.roots.append(kw["root_latent"].clone())
            return run(**kw)

        policy.search.run = spy


def _obs(rng, n):
    return rng.normal(size=(n, 4)).astype(np.float32)


def _act(policy, model, obs, state, env_index, *, rng, explore=True):
    return policy.act(model, obs, np.ones((len(obs), 2), bool), explore=explore, temperature=1.0, rng=rng,
                      state=state, env_index=np.asarray(env_index))


def test_registered():
    assert get_policy_class("muzero_rnn_full_obs") is mr.MuZeroRNNFullObsPolicy


@torch.no_grad()
def test_prediction_and_dynamics_depend_on_the_history():
    _, model = _policy()
    assert isinstance(model, RNNMuZeroNet) and model.latent_shape == (16 + H,)
    g = torch.Generator().manual_seed(0)
    z = torch.rand(5, 16, generator=g)
    h1, h2 = torch.randn(5, H, generator=g), torch.randn(5, H, generator=g)
    s1, s2 = model.pack(z, h1), model.pack(z, h2)
    a = torch.tensor([0, 1, 0, 1, 1])
    v1, p1 = model.predict(s1)
    v2, p2 = model.predict(s2)
    assert not torch.allclose(p1, p2, atol=1e-4)
    n1, n2 = model.dynamics(s1, a)[0], model.dynamics(s2, a)[0]
    z1, hn1 = model.unpack(n1)
    z2, hn2 = model.unpack(n2)
    assert not torch.allclose(z1, z2, atol=1e-4) and not torch.allclose(hn1, hn2, atol=1e-4)
    # the zero-initialised value/reward heads start constant; give them weights to see h through them
    torch.nn.init.normal_(model.base.pred_value.weight)
    torch.nn.init.normal_(model.base.dyn_reward.weight)
    assert not torch.allclose(model.predict(s1)[0], model.predict(s2)[0], atol=1e-4)
    assert not torch.allclose(model.dynamics(s1, a)[1], model.dynamics(s2, a)[1], atol=1e-4)
    # the same history gives the same outputs; unpack inverts pack
    torch.testing.assert_close(model.predict(model.pack(z, h1))[1], p1)
    zz, hh = model.unpack(s1)
    assert torch.equal(zz, z) and torch.equal(hh, h1)


@torch.no_grad()
def test_history_is_carried_and_reset_every_context_length_steps():
    policy, model = _policy()
    spy = RootSpy(policy)
    rng = np.random.default_rng(0)
    state = policy.initial_act_state(2)
    prev_root, prev_action = None, None
    for t in range(3 * L + 1):
        obs = _obs(rng, 2)
        out = _act(policy, model, obs, state, [0, 1], rng=rng)
        z, h = model.unpack(spy.roots[-1])
        # the root's z is always the representation of the real observation
        torch.testing.assert_close(z, model.represent_z(torch.as_tensor(obs)), rtol=0, atol=1e-6)
        if t % L == 0:
            assert torch.equal(h, torch.zeros(2, H))
        else:
            expected = model.history(prev_root, torch.as_tensor(prev_action))
            torch.testing.assert_close(h, expected, rtol=0, atol=1e-6)
            assert h.abs().sum() > 0
        assert out.step_stats["context_step"].tolist() == [t % L] * 2
        np.testing.assert_array_equal(out.step_stats["history"], h.numpy())
        assert torch.equal(out.state.latent, spy.roots[-1])
        prev_root, prev_action, state = spy.roots[-1], out.actions, out.state


@torch.no_grad()
def test_reset_and_env_subsets_keep_per_env_histories():
    policy, model = _policy()
    spy = RootSpy(policy)
    rng = np.random.default_rng(1)
    state = _act(policy, model, _obs(rng, 2), policy.initial_act_state(2), [0, 1], rng=rng).state
    state = policy.reset_act_state(state, 0)  # env 0 starts an episode: empty history next step
    prev = state.latent.clone()
    out = _act(policy, model, _obs(rng, 2), state, [0, 1], rng=rng)
    _, h = model.unpack(spy.roots[-1])
    assert torch.equal(h[0], torch.zeros(H))
    torch.testing.assert_close(h[1:], model.history(prev[1:], torch.as_tensor(state.action[1:])),
                               rtol=0, atol=1e-6)
    assert out.step_stats["context_step"].tolist() == [0, 1]
    # env 1 acts alone (the evaluator passes live envs only): env 0's row is untouched
    state = out.state
    row0 = state.latent[0].clone()
    out = _act(policy, model, _obs(rng, 1), state, [1], rng=rng)
    _, h = model.unpack(spy.roots[-1])
    torch.testing.assert_close(h, model.history(state.latent[1:2], torch.as_tensor(state.action[1:2])),
                               rtol=0, atol=1e-6)
    assert torch.equal(out.state.latent[0], row0) and out.state.step.tolist() == [1, 3]


@torch.no_grad()
def test_packed_search_matches_the_reference_with_an_unpacking_recurrent_fn():
    policy, model = _policy(**{"mcts.num_simulations": 24})
    spy = RootSpy(policy)
    rng = np.random.default_rng(2)
    state = _act(policy, model, _obs(rng, 3), policy.initial_act_state(3), [0, 1, 2], rng=rng).state
    out = _act(policy, model, _obs(rng, 3), state, [0, 1, 2], rng=rng, explore=False)  # step 1: h != 0
    root = spy.roots[-1]
    base = model.base

    def cond(z, h):  # c(z, h) = z + W h, written out from the parts
        return z + F.linear(h, model.history_in.weight, model.history_in.bias)

    def recurrent_fn(packed, actions):
        z, h = packed[:, :16], packed[:, 16:]
        a = torch.as_tensor(actions)
        h_next = model.gru(torch.cat([z, F.one_hot(a, 2).float()], 1), h)
        z_next, reward_logits = base.dynamics(cond(z, h), a)
        value_logits, policy_logits = base.predict(cond(z_next, h_next))
        return (torch.cat([z_next, h_next], 1),
                logits_to_scalar_np(reward_logits.numpy(), support_size=base.reward_support_size),
                logits_to_scalar_np(value_logits.numpy(), support_size=base.value_support_size),
                policy_logits.numpy())

    m = policy.cfg.mcts
    ref = reference_search(
        root_latent=root, root_policy_logits=base.predict(cond(root[:, :16], root[:, 16:]))[1].numpy(),
        legal_mask=np.ones((3, 2), bool), recurrent_fn=recurrent_fn, num_simulations=24, add_noise=False,
        deterministic=True, rng=np.random.default_rng(0), pb_c_base=m.pb_c_base, pb_c_init=m.pb_c_init,
        discount=m.discount, value_delta_max=m.value_delta_max,
        root_value=logits_to_scalar_np(base.predict(cond(root[:, :16], root[:, 16:]))[0].numpy(),
                                       support_size=base.value_support_size),
    )
    np.testing.assert_array_equal(out.step_stats["child_visits"], ref.visit_distribution)
    np.testing.assert_allclose(out.root_value, ref.root_value, rtol=1e-5, atol=1e-5)
    assert (ref.visit_counts > 0).sum() > 3


# ---------------------------------------------------------------------------------------------- targets


def _segment(rng, *, m, num_real, step0, terminal, td_pad=True):
    """A hand-built segment (frame_stack 1) whose stored histories follow the acting rule's zeros."""
    ctx = (step0 + np.arange(m)) % L
    hist = rng.normal(size=(m, H)).astype(np.float32)
    hist[ctx == 0] = 0.0
    visits = rng.random((m, 2)).astype(np.float32)
    return GameSegment(
        frames=rng.normal(size=(m + 1, 4)).astype(np.float32),
        actions=rng.integers(0, 2, size=m).astype(np.int64),
        rewards=rng.normal(size=m).astype(np.float32),
        stats={"child_visits": visits / visits.sum(1, keepdims=True), "root_value": np.zeros(m, np.float32),
               "legal_mask": np.ones((m, 2), bool), "context_step": ctx.astype(np.int64), "history": hist},
        num_real=num_real, frame_stack=1, done=not td_pad, terminal_at_end=terminal, episode_step0=step0,
    )


def replayed_history(model, seg, p):
    """The history at position p (<= M) rebuilt the collector's way, one step at a time (the spec)."""
    ctx = np.append(seg.stats["context_step"], (seg.stats["context_step"][-1] + 1) % L)
    s = p - ctx[p]
    h = torch.zeros(1, H)
    if s < 0:  # the window began in an earlier segment: start from the stored history at 0
        s = 0
        h = torch.as_tensor(seg.stats["history"][:1]) if ctx[0] != 0 else h
    for q in range(s, p):
        obs = torch.as_tensor(seg.frames[q : q + 1])
        h = model.history(model.represent(obs, h), torch.as_tensor(seg.actions[q : q + 1]))
    return h[0].numpy()


@torch.no_grad()
def test_make_batch_targets_and_history_replay_on_a_hand_built_case():
    policy, target = _policy(**{"replay.num_unroll_steps": 2, "replay.td_steps": 2, "mcts.discount": 0.9})
    torch.nn.init.normal_(target.base.pred_value.weight)  # non-trivial bootstrap values
    rng = np.random.default_rng(3)
    full = _segment(rng, m=9, num_real=5, step0=4, terminal=False)  # ctx at 0..: 1 2 0 1 2 0 1 2 0
    trunc = _segment(rng, m=4, num_real=4, step0=7, terminal=False, td_pad=False)  # a truncated ending
    term = _segment(rng, m=3, num_real=3, step0=2, terminal=True, td_pad=False)
    segs = (full, full, full, trunc, term)
    pos = np.array([0, 1, 4, 3, 2])
    sample = SampledIndices(flat_index=np.arange(5), segments=segs, positions=pos,
                            weights=np.ones(5, np.float32), make_time=0)
    batch = policy.make_batch(sample, target_model=target, rng=np.random.default_rng(0))
    g = 0.9

    def v(seg, b):  # the target model's value at (represent(o_b), replayed h_b)
        h = torch.as_tensor(replayed_history(target, seg, b)[None])
        root = target.initial_inference(torch.as_tensor(seg.frames[b : b + 1]), h)
        value = logits_to_scalar_np(root.value_logits.numpy(), support_size=target.value_support_size)
        return float(value[0])

    expected = np.zeros((5, 3))
    mask = np.ones((5, 3))
    for row, (seg, t) in enumerate(zip(segs, pos)):
        r, m = seg.rewards, seg.num_stored
        for k in range(3):
            i = t + k
            if i >= m:
                expected[row, k], mask[row, k] = 0.0, float(seg.terminal_at_end)
                continue
            n = min(2, m - i)
            z = sum(g**j * r[i + j] for j in range(n))
            b = i + n
            if not (b == m and seg.terminal_at_end):  # trunc: b = M = 4, one past its last step
                z += g**n * v(seg, b)
            expected[row, k] = z
    np.testing.assert_allclose(batch.target_value, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(batch.value_mask, mask)
    np.testing.assert_allclose(batch.target_reward[0], full.rewards[0:2])
    np.testing.assert_array_equal(batch.target_policy[2], full.stats["child_visits"][4:7])
    np.testing.assert_array_equal(batch.actions[1], full.actions[1:3])

    # each root's window, left-aligned in L = 3 slots:
    # row 0: t=0, ctx 1 -> the window began before the segment: slot 0 = position 0 with its stored history
    # row 1: t=1, ctx 2 -> positions 0..1; row 2: t=4, ctx 2 -> positions 2..4 (reset at 2)
    # row 3: trunc t=3, ctx 1 -> positions 2..3; row 4: term t=2, ctx (2+2)%3=1 -> positions 1..2
    ex = batch.extras
    np.testing.assert_array_equal(ex[mr.BURN_LEN], [1, 2, 3, 2, 2])
    np.testing.assert_array_equal(ex[mr.BURN_RESET][:, 0], [False, False, True, True, True])
    assert not ex[mr.BURN_RESET][:, 1:].any()
    np.testing.assert_array_equal(ex[mr.HISTORY0][0], full.stats["history"][0])
    np.testing.assert_array_equal(ex[mr.HISTORY0][1], full.stats["history"][0])
    np.testing.assert_array_equal(ex[mr.HISTORY0][2:], np.zeros((3, H)))
    np.testing.assert_array_equal(ex[mr.BURN_OBS][2], full.frames[2:5])
    np.testing.assert_array_equal(ex[mr.BURN_ACTIONS][2], full.actions[2:5])
    np.testing.assert_array_equal(ex[mr.BURN_OBS][4, :2], term.frames[1:3])
    # the learner's root history is that window replayed
    h = policy.root_history(target, batch).numpy()
    for row, (seg, t) in enumerate(zip(segs, pos)):
        np.testing.assert_allclose(h[row], replayed_history(target, seg, t), rtol=1e-5, atol=1e-6)


def test_bootstrap_values_in_pieces_read_the_histories_in_order():
    """``history_value_fn`` pairs the n observations of each call with the next n histories (the batch's
    bootstrap positions asked in order, in pieces: ``Bootstrap.values``), starts over once all are read, and
    refuses a call reaching past the last."""
    policy, model = _policy()
    torch.nn.init.normal_(model.base.pred_value.weight)  # values that depend on the history
    rng = np.random.default_rng(0)
    n = 7
    obs = rng.standard_normal((n, *policy.spec.obs_shape)).astype(np.float32)
    history = rng.standard_normal((n, H)).astype(np.float32)
    fn = policy.history_value_fn(model, history)
    whole = fn(obs)
    assert np.unique(whole).size == n
    pieces = np.concatenate([fn(obs[:3]), fn(obs[3:6]), fn(obs[6:])])
    np.testing.assert_allclose(pieces, whole, rtol=1e-4)  # the GRU's matmuls round by batch size
    fn(obs[:5])
    with pytest.raises(RuntimeError, match="3 observations from position 5 of 7 histories"):
        fn(obs[:3])


def test_learner_root_history_equals_what_the_collector_searched_with():
    # segments of 7 (not a multiple of L: some windows begin in the previous segment), short padding
    policy, model = _policy(**{"replay.game_segment_length": 7, "replay.num_unroll_steps": 2,
                               "replay.td_steps": 2, "mcts.num_simulations": 2})
    collector = SegmentCollector(policy.cfg, policy, policy.spec, seed=0, num_envs=3)
    buffer = ReplayBuffer(capacity_transitions=10_000)
    while buffer.num_transitions < 60:
        buffer.push(list(collector.collect(model, temperature=1.0).segments))
    collector.close()
    rng = np.random.default_rng(0)
    sample = buffer.sample(48, rng)
    batch = policy.make_batch(sample, target_model=model, rng=rng)
    stored = np.stack([s.stats["history"][t] for s, t in zip(sample.segments, sample.positions)])
    assert (np.abs(stored).sum(1) > 0).sum() > 15 and (batch.extras[mr.BURN_LEN] > 1).any()
    crossing = [t < s.stats["context_step"][t] for s, t in zip(sample.segments, sample.positions)]
    assert any(crossing)  # some windows begin before their segment: replayed from the stored history
    model.train()
    h = policy.root_history(model, batch)
    np.testing.assert_allclose(h.detach().numpy(), stored, rtol=1e-5, atol=1e-5)
    # bootstrap observations too (td 2: b = i + 2 inside the stored data for these samples)
    boot = policy.bootstrap_histories(sample, model)
    want = [s.stats["history"][b] for s, t in zip(sample.segments, sample.positions)
            for b in range(t + 2, t + 5) if b < s.num_stored]
    assert len(boot) == len(want)
    np.testing.assert_allclose(boot, np.stack(want), rtol=1e-5, atol=1e-5)
    # MuZero's loss from that root: gradients reach the GRU through the root history as well
    out = policy.compute_loss(model, batch, train_iter=0)
    out.loss.backward()
    assert model.gru.weight_ih.grad.abs().sum() > 0 and model.history_in.weight.grad.abs().sum() > 0
