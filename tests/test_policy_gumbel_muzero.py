"""Gumbel MuZero: the kernel search against the plain-Python reference and against hand-computed values
(Gumbel-top-k, the sequential-halving visit schedule, per-node completed Q, improved policy, selected action),
and the improved policy as the buffer's policy target. tests/test_gumbel_vs_mctx.py checks the same search
against mctx; the type's sync and async runs are its Tune trials in tests/test_every_policy_type.py, every
checkpoint re-evaluated exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from muzero_tune.config import make_config
from muzero_tune.mcts.gumbel import GumbelMuZeroSearch
from muzero_tune.mcts.gumbel_kernels import considered_visit_table
from muzero_tune.mcts.reference import reference_gumbel_search
from muzero_tune.pipeline.core import make_policy
from muzero_tune.replay.buffer import ReplayBuffer
from muzero_tune.replay.segment import GameSegment

PRESET = "cartpole_gumbel_muzero"
SMALL = {
    "model.hidden_dim": 32,
    "model.latent_dim": 16,
    "mcts.num_simulations": 6,
    "learn.batch_size": 32,
    "env.collector_env_num": 4,
    "env.evaluator_env_num": 2,
    "eval.n_episodes": 2,
    "eval.eval_freq": 20,
    "replay.game_segment_length": 20,
    "max_envstep": 400,
    "stop_value": None,
    "logging.quiet": True,
}
EXTRAS = (
    "improved_policy",
    "selected_action",
    "completed_q",
    "considered",
    "survivors",
    "root_actions",
)


class Tabular:
    """Deterministic toy world model: tables over ``num_states`` states drawn from ``seed``; latent [B, 2] =
    (state id, 0.5 * state id) so the search's latent gather is checked."""

    def __init__(self, *, num_actions: int, seed: int, num_states: int = 211):
        g = np.random.default_rng(seed)
        self.next_state = g.integers(0, num_states, size=(num_states, num_actions))
        self.reward = g.normal(size=(num_states, num_actions)).astype(np.float32)
        self.value = g.normal(size=num_states).astype(np.float32)
        self.logits = (2.0 * g.normal(size=(num_states, num_actions))).astype(np.float32)

    @staticmethod
    def latent(states) -> torch.Tensor:
        s = torch.as_tensor(np.asarray(states), dtype=torch.float32)
        return torch.stack([s, 0.5 * s], dim=1)

    def __call__(self, latent: torch.Tensor, actions: np.ndarray):
        assert torch.equal(latent[:, 1], 0.5 * latent[:, 0])
        s = latent[:, 0].long().numpy()
        ns = self.next_state[s, actions]
        return self.latent(ns), self.reward[s, actions], self.value[ns], self.logits[ns]


def _both(model, states, legal, *, sims, considered, add_noise, seed, **knobs):
    args = dict(
        root_latent=model.latent(states),
        root_policy_logits=model.logits[states],
        legal_mask=legal,
        recurrent_fn=model,
        add_noise=add_noise,
        root_value=model.value[states],
    )
    search = GumbelMuZeroSearch(
        num_actions=legal.shape[1], num_simulations=sims, max_num_considered_actions=considered, **knobs
    )
    out = search.run(**args, deterministic=True, rng=np.random.default_rng(seed))
    ref = reference_gumbel_search(
        **args,
        rng=np.random.default_rng(seed),
        num_simulations=sims,
        max_num_considered_actions=considered,
        **knobs,
    )
    return out, ref


@pytest.mark.parametrize(
    "num_actions,batch,sims,considered",
    [
        (2, 3, 8, 16),
        (4, 4, 7, 3),
        (6, 4, 20, 4),
        (18, 3, 50, 16),
        (5, 2, 3, 5),
        (3, 2, 10, 1),
    ],
)
def test_kernels_match_reference(num_actions, batch, sims, considered):
    rng = np.random.default_rng(num_actions * 100 + sims)
    model = Tabular(num_actions=num_actions, seed=num_actions)
    states = rng.integers(0, 211, size=batch)
    legal = rng.random((batch, num_actions)) < 0.6
    legal[np.arange(batch), rng.integers(0, num_actions, size=batch)] = True
    legal[0] = True
    for add_noise in (True, False):
        out, ref = _both(
            model,
            states,
            legal,
            sims=sims,
            considered=considered,
            add_noise=add_noise,
            seed=sims,
            gumbel_scale=1.0,
            c_visit=50.0,
            c_scale=0.1,
            discount=0.99,
        )
        np.testing.assert_array_equal(out.visit_counts, ref.visit_counts)
        np.testing.assert_array_equal(out.root_value, ref.root_value)
        np.testing.assert_array_equal(out.root_prior, ref.root_prior)
        for name in EXTRAS:
            np.testing.assert_array_equal(out.extras[name], ref.extras[name], err_msg=name)
        assert (out.visit_counts.sum(1) == sims).all()
        assert (out.visit_counts[~out.extras["considered"]] == 0).all() and not out.visit_counts[~legal].any()
        assert out.extras["survivors"][np.arange(batch), out.extras["selected_action"]].all()
        # the executed action was always visited, and is one of the most-visited ones
        chosen = out.visit_counts[np.arange(batch), out.extras["selected_action"]]
        assert (chosen > 0).all() and (chosen == out.visit_counts.max(1)).all()
        np.testing.assert_allclose(out.extras["improved_policy"].sum(1), 1.0, rtol=1e-6)
        assert (out.extras["improved_policy"][~legal] == 0).all()
        # every simulation visited an action whose count was the schedule's at that simulation
        table = considered_visit_table(min(considered, num_actions), sims)
        k = out.extras["considered"].sum(1)
        for b in range(batch):
            seen = np.zeros(num_actions, int)
            for sim, a in enumerate(out.extras["root_actions"][b]):
                assert seen[a] == table[k[b], sim]
                seen[a] += 1


def test_visit_schedule_is_sequential_halving():
    # k = 4, S = 16: P = 2 phases; 4 survivors x max(1, 16 // 8) = 2 visits, then 2 x (16 // 4) = 4 visits
    np.testing.assert_array_equal(
        considered_visit_table(4, 16)[4], [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    )
    # k = 3, S = 7: P = 2; 3 x max(1, 7 // 6) = 1; 2 x max(1, 7 // 4) = 1; then 2 survivors again
    np.testing.assert_array_equal(considered_visit_table(3, 7)[3], [0, 0, 0, 1, 1, 2, 2])
    # k = 1: every simulation to the one action; fewer simulations than k: one round, cut short
    np.testing.assert_array_equal(considered_visit_table(4, 5)[1], [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(considered_visit_table(8, 5)[8], [0, 0, 0, 0, 0])


class RootRewardModel:
    """Hand-checkable world: root (state 0) action a gives reward r[a] and leads to state a + 1; every other
    reward and every value is 0. So a visited root child's Q is exactly r[a] and the tree's min-max range is
    [0, max visited r]."""

    def __init__(self, r, num_actions):
        self.r = np.asarray(r, dtype=np.float32)
        self.num_actions = num_actions

    def __call__(self, latent, actions):
        s = latent[:, 0].long().numpy()
        reward = np.where(s == 0, self.r[actions], 0.0).astype(np.float32)
        ns = np.where(s == 0, actions + 1, s)
        z = torch.as_tensor(ns, dtype=torch.float32)
        zeros = np.zeros(len(s), np.float32)
        return torch.stack([z, 0.5 * z], 1), reward, zeros, np.zeros((len(s), self.num_actions), np.float32)


def test_hand_computed_gumbel_search():
    """One tree, 5 actions (action 4 illegal), k = 3 considered, S = 7, values 0, rewards only at the root:
    a visited root child's Q is exactly r[a]. Each step below is the paper's rule written out with numpy."""
    a_n, sims, k, c_visit, c_scale, gamma = 5, 7, 3, 50.0, 0.1, 0.9
    logits = np.array([[0.5, 0.2, 0.0, -0.3, 0.1]], np.float32)
    legal = np.array([[True, True, True, True, False]])
    r = np.array([0.1, 0.9, 0.5, 0.3, 0.7], np.float32)
    model = RootRewardModel(r, a_n)
    search = GumbelMuZeroSearch(
        num_actions=a_n,
        num_simulations=sims,
        max_num_considered_actions=k,
        c_visit=c_visit,
        c_scale=c_scale,
        discount=gamma,
        value_delta_max=1e-8,
    )
    out = search.run(
        root_latent=torch.zeros(1, 2),
        root_policy_logits=logits,
        legal_mask=legal,
        recurrent_fn=model,
        add_noise=True,
        deterministic=True,
        rng=np.random.default_rng(3),
        root_value=np.zeros(1),
    )
    ref = reference_gumbel_search(
        root_latent=torch.zeros(1, 2),
        root_policy_logits=logits,
        legal_mask=legal,
        recurrent_fn=model,
        num_simulations=sims,
        add_noise=True,
        rng=np.random.default_rng(3),
        root_value=np.zeros(1),
        max_num_considered_actions=k,
        c_visit=c_visit,
        c_scale=c_scale,
        discount=gamma,
        value_delta_max=1e-8,
    )
    # Gumbel-top-k with the same Generator
    g = np.random.default_rng(3).gumbel(size=(1, a_n))[0]
    gl = np.where(legal[0], g + logits[0].astype(np.float64), -np.inf)
    considered = sorted(np.argsort(-gl, kind="stable")[:k].tolist())
    assert np.flatnonzero(out.extras["considered"][0]).tolist() == considered
    pi = np.where(legal[0], np.exp(logits[0] - logits[0][legal[0]].max()), 0.0)
    pi /= pi.sum()

    def sigma_of(visits):
        """Completed Q of the root (visited: r[a]; unvisited: the mixed value with v_hat = 0), rescaled over
        the node's own completed Q values (the illegal action's imputed value included, as mctx)."""
        seen = visits > 0
        n = visits.sum()
        v_mix = 0.0 if n == 0 else (0.0 + n / pi[seen].sum() * (pi[seen] * r[seen]).sum()) / (1 + n)
        cq = np.where(seen, r, v_mix).astype(np.float64)
        lo, hi = cq.min(), cq.max()
        return cq, (c_visit + visits.max()) * c_scale * (cq - lo) / max(hi - lo, 1e-8)

    # schedule [0, 0, 0, 1, 1, 2, 2]: simulations 0-2 visit the considered actions once each; 3 and 4 the best
    # two of them by g + logits + sigma (sigma recomputed after each visit); 5 and 6 those two again.
    visits = np.zeros(a_n, int)
    visits[considered] = 1
    first = max(considered, key=lambda a: (gl[a] + sigma_of(visits)[1][a], -a))
    visits[first] += 1
    second = max(
        (a for a in considered if visits[a] == 1), key=lambda a: (gl[a] + sigma_of(visits)[1][a], -a)
    )
    visits[second] += 1
    assert out.extras["root_actions"][0, 3:5].tolist() == [first, second]
    assert sorted(out.extras["root_actions"][0, 5:].tolist()) == sorted(
        [first, second]
    )  # 2 visits each, once more
    visits[[first, second]] += 1
    np.testing.assert_array_equal(out.visit_counts[0], visits)
    cq, sigma = sigma_of(visits)
    np.testing.assert_allclose(
        out.extras["completed_q"][0], np.where(legal[0], cq, 0.0), rtol=1e-6, atol=1e-7
    )
    z = np.where(legal[0], logits[0] + sigma, -np.inf)
    improved = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    np.testing.assert_allclose(out.extras["improved_policy"][0], improved, rtol=1e-5, atol=1e-7)
    most = [a for a in range(a_n) if legal[0, a] and visits[a] == visits.max()]
    assert np.flatnonzero(out.extras["survivors"][0]).tolist() == sorted([first, second]) == most
    assert out.extras["selected_action"][0] == max(most, key=lambda a: (gl[a] + sigma[a], -a))
    np.testing.assert_array_equal(out.visit_counts, ref.visit_counts)
    for name in EXTRAS:
        np.testing.assert_array_equal(out.extras[name], ref.extras[name], err_msg=name)
    # evaluation (no noise): considered = top-k logits, deterministic
    ev = search.run(
        root_latent=torch.zeros(1, 2),
        root_policy_logits=logits,
        legal_mask=legal,
        recurrent_fn=model,
        add_noise=False,
        deterministic=True,
        rng=np.random.default_rng(0),
        root_value=np.zeros(1),
    )
    assert np.flatnonzero(ev.extras["considered"][0]).tolist() == [0, 1, 2]


def test_fewer_simulations_than_considered_never_executes_an_unvisited_action():
    """k = 4 considered, S = 2: only two actions get a visit; the executed action is one of them even when an
    unvisited action has the larger g + logits + sigma (its completed Q, the mixed value, can be the best)."""
    logits = np.array([[0.0, 0.0, 1.0, 0.9]], np.float32)  # actions 2, 3 considered first
    r = np.array([-1.0, -1.0, -5.0, -5.0], np.float32)  # ...but their Q is bad
    model = RootRewardModel(r, 4)
    search = GumbelMuZeroSearch(num_actions=4, num_simulations=2, max_num_considered_actions=4, discount=0.9)
    out = search.run(
        root_latent=torch.zeros(1, 2),
        root_policy_logits=logits,
        legal_mask=np.ones((1, 4), bool),
        recurrent_fn=model,
        add_noise=False,
        deterministic=True,
        rng=np.random.default_rng(0),
        root_value=np.zeros(1),
    )
    np.testing.assert_array_equal(out.visit_counts[0], [0, 0, 1, 1])
    assert out.extras["selected_action"][0] in (2, 3)


# ---------------------------------------------------------------------------------------------- targets


def _segment(m: int, num_real: int, *, terminal: bool, salt: float) -> GameSegment:
    a = 2
    frames = (np.arange(m + 1)[:, None] * np.array([1.0, -1.0, 0.5, 0.0]) * 0.01 + salt).astype(np.float32)
    p = (np.arange(m) + 1) / 100.0 + salt
    visits = np.stack([p, 1 - p], 1).astype(np.float32)
    improved = np.stack([1 - p / 2, p / 2], 1).astype(np.float32)
    return GameSegment(
        frames=frames,
        actions=(np.arange(m) % a).astype(np.int64),
        rewards=np.ones(m, np.float32),
        stats={
            "child_visits": visits,
            "root_value": np.zeros(m, np.float32),
            "legal_mask": np.ones((m, a), bool),
            "improved_policy": improved,
        },
        num_real=num_real,
        frame_stack=1,
        done=terminal,
        terminal_at_end=terminal,
    )


def test_buffer_returns_stored_improved_policy_as_policy_target():
    cfg = make_config(PRESET, overrides={**SMALL, "replay.num_unroll_steps": 3, "replay.td_steps": 2})
    policy, _ = make_policy(cfg)
    target_model = policy.build_model()
    assert "improved_policy" in policy.step_stat_names()
    buf = ReplayBuffer(capacity_transitions=1000, use_priority=False)
    segs = [_segment(8, 5, terminal=False, salt=0.0), _segment(4, 4, terminal=True, salt=0.2)]
    buf.push(segs)
    rng = np.random.default_rng(0)
    checked_masked = 0
    for _ in range(5):
        sample = buf.sample(16, rng)
        batch = policy.make_batch(sample, target_model=target_model, rng=rng)
        for b, (seg, t) in enumerate(zip(sample.segments, sample.positions)):
            for k in range(4):
                i = int(t) + k
                if i < seg.num_stored:
                    np.testing.assert_array_equal(batch.target_policy[b, k], seg.stats["improved_policy"][i])
                    assert not np.array_equal(batch.target_policy[b, k], seg.stats["child_visits"][i])
                    assert batch.policy_mask[b, k] == 1
                else:
                    assert batch.policy_mask[b, k] == 0 and not batch.target_policy[b, k].any()
                    checked_masked += 1
    assert checked_masked > 0
    # per-batch reanalyze refreshes the improved policy (what is trained on), and the visit distribution
    sample = buf.sample(4, rng)
    before = [s.stats["improved_policy"].copy() for s in sample.segments]
    batch = policy.make_batch(sample, target_model=target_model, rng=rng, reanalyze_count=1)
    seg, t = sample.segments[0], int(sample.positions[0])
    assert not np.array_equal(seg.stats["improved_policy"][t], before[0][t])
    np.testing.assert_array_equal(batch.target_policy[0, 0], seg.stats["improved_policy"][t])
    np.testing.assert_allclose(seg.stats["child_visits"][t].sum(), 1.0, rtol=1e-6)
