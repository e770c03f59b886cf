"""The ``muzero_context`` policy: a dynamics-carried root latent, re-encoded every context_length_init steps.

Acting is checked on scripted act() sequences against the model called directly (the root each search is
given is recorded by wrapping the search's ``run``); the search against the plain-Python reference from
the same root. The type's sync and async runs: its Tune trials in tests/test_every_policy_type.py, every
checkpoint re-evaluated exactly.
"""

from __future__ import annotations

import numpy as np
import torch

from muzero_tune.config import make_config
from muzero_tune.mcts.reference import reference_search
from muzero_tune.models.support import logits_to_scalar_np
from muzero_tune.pipeline.core import make_policy, setup_torch_threads
from muzero_tune.policies.muzero import MuZeroPolicy
from muzero_tune.policies.muzero_context import CarriedActState, MuZeroContextPolicy
from muzero_tune.policies.registry import get_policy_class

PRESET = "cartpole_muzero_context"
SMALL = {
    "model.hidden_dim": 32, "model.latent_dim": 16, "mcts.num_simulations": 4, "learn.batch_size": 32,
    "env.collector_env_num": 4, "env.evaluator_env_num": 2, "eval.n_episodes": 2, "eval.eval_freq": 20,
    "replay.game_segment_length": 20, "max_envstep": 400, "stop_value": None, "logging.quiet": True,
}
L = 3  # context_length_init in the acting tests


def _policy(**overrides):
    cfg = make_config(PRESET, overrides={**SMALL, "policy.context_length_init": L, **overrides})
    setup_torch_threads()  # one torch thread, as every pipeline process runs (two are far slower here)
    policy, _ = make_policy(cfg)
    torch.manual_seed(0)
    model = policy.build_model().eval()
    return policy, model


class RootSpy:
    """Wraps ``policy.search.run``: records the root latent and logits each search was given."""

    def __init__(self, policy):
        self.roots: list[torch.Tensor] = []
        self.logits: list[np.ndarray] = []
        self.search = policy.search
        run = self.search.run

        def spy(**kw):
            self.roots.append(kw["root_latent"].clone())
            self.logits.append(np.array(kw["root_policy_logits"]))
            return run(**kw)

        self.search.run = spy


def _obs(rng, n):
    return rng.normal(size=(n, 4)).astype(np.float32)


def _act(policy, model, obs, state, env_index, *, rng, explore=False):
    mask = np.ones((len(obs), 2), dtype=bool)
    return policy.act(model, obs, mask, explore=explore, temperature=1.0, rng=rng, state=state,
                      env_index=np.asarray(env_index))


@torch.no_grad()
def test_registered_and_training_is_muzero():
    assert get_policy_class("muzero_context") is MuZeroContextPolicy
    for name in ("make_batch", "compute_loss", "reanalyze", "value_fn", "build_model", "step_stat_names"):
        assert getattr(MuZeroContextPolicy, name) is getattr(MuZeroPolicy, name), name


@torch.no_grad()
def test_root_is_carried_by_the_dynamics_and_reencoded_every_context_length_steps():
    policy, model = _policy()
    spy = RootSpy(policy)
    rng = np.random.default_rng(0)
    state = policy.initial_act_state(2)
    prev_root, prev_action = None, None
    encoded, carried = 0, 0
    for t in range(3 * L + 2):
        obs = _obs(rng, 2)
        out = _act(policy, model, obs, state, [0, 1], rng=rng, explore=True)
        root = spy.roots[-1]
        if t % L == 0:
            expected = model.represent(torch.as_tensor(obs))
            encoded += 1
        else:
            expected, _ = model.dynamics(prev_root, torch.as_tensor(prev_action))
            carried += 1
            # not the representation of the real observation
            assert not torch.allclose(root, model.represent(torch.as_tensor(obs)), atol=1e-3)
        torch.testing.assert_close(root, expected, rtol=0, atol=1e-6)
        # prediction at the root comes from the carried latent
        np.testing.assert_allclose(spy.logits[-1], model.predict(root)[1].numpy(), atol=1e-6)
        # the carried latent is the root the search was given, for both envs independently
        assert torch.equal(out.state.latent, root) and out.state.step.tolist() == [t + 1, t + 1]
        assert out.state.action.tolist() == out.actions.tolist()
        prev_root, prev_action, state = root, out.actions, out.state
    assert encoded == 4 and carried == 7


@torch.no_grad()
def test_search_expanding_children_never_changes_the_carried_latent():
    policy, model = _policy(**{"mcts.num_simulations": 8})
    spy = RootSpy(policy)
    rng = np.random.default_rng(1)
    state = policy.initial_act_state(2)
    for _ in range(L + 1):
        before = None if state.latent is None else state.latent.clone()
        out = _act(policy, model, _obs(rng, 2), state, [0, 1], rng=rng, explore=True)
        # the search expanded children whose latents differ from the root
        children = policy.search.node_latents[1:9, :2]
        assert children.shape[0] == 8
        assert all(not torch.allclose(children[s], spy.roots[-1], atol=1e-4) for s in range(8))
        # the new state holds the root the search was given; the old state object is untouched
        assert torch.equal(out.state.latent, spy.roots[-1])
        if before is not None:
            assert torch.equal(state.latent, before)
        state = out.state


@torch.no_grad()
def test_two_envs_keep_independent_carried_latents_and_reset_reencodes_next_step():
    policy, model = _policy()
    spy = RootSpy(policy)
    rng = np.random.default_rng(2)
    state = policy.initial_act_state(2)
    out = _act(policy, model, _obs(rng, 2), state, [0, 1], rng=rng)
    state = out.state
    # env 1 starts a new episode after step 0: it re-encodes at step 1, env 0 carries
    state = policy.reset_act_state(state, 1)
    assert state.step.tolist() == [1, 0]
    prev_root, prev_action = spy.roots[-1], out.actions
    obs = _obs(rng, 2)
    out = _act(policy, model, obs, state, [0, 1], rng=rng)
    root = spy.roots[-1]
    torch.testing.assert_close(root[0], model.dynamics(prev_root, torch.as_tensor(prev_action))[0][0],
                               rtol=0, atol=1e-6)
    torch.testing.assert_close(root[1], model.represent(torch.as_tensor(obs))[1], rtol=0, atol=1e-6)
    state = out.state
    # the evaluator passes only its live envs: env 1 alone acts, env 0's carried latent and step stay
    latent0 = state.latent[0].clone()
    prev1, a1 = state.latent[1:2].clone(), torch.as_tensor(state.action[1:2])
    out = _act(policy, model, _obs(rng, 1), state, [1], rng=rng)
    torch.testing.assert_close(spy.roots[-1], model.dynamics(prev1, a1)[0], rtol=0, atol=1e-6)
    assert torch.equal(out.state.latent[0], latent0) and out.state.step.tolist() == [2, 2]
    assert torch.equal(out.state.latent[1], spy.roots[-1][0])


@torch.no_grad()
def test_acting_without_state_encodes_every_step():
    policy, model = _policy()
    spy = RootSpy(policy)
    rng = np.random.default_rng(3)
    obs = _obs(rng, 3)
    out = policy.act(model, obs, np.ones((3, 2), bool), explore=False, temperature=0.0, rng=rng)
    torch.testing.assert_close(spy.roots[-1], model.represent(torch.as_tensor(obs)), rtol=0, atol=1e-6)
    assert isinstance(out.state, CarriedActState) and out.state.step.tolist() == [1, 1, 1]


@torch.no_grad()
def test_search_from_a_carried_root_matches_the_reference_search():
    policy, model = _policy(**{"mcts.num_simulations": 24})
    spy = RootSpy(policy)
    rng = np.random.default_rng(4)
    state = policy.initial_act_state(3)
    state = _act(policy, model, _obs(rng, 3), state, [0, 1, 2], rng=rng).state
    out = _act(policy, model, _obs(rng, 3), state, [0, 1, 2], rng=rng)  # step 1: a carried root
    root = model.dynamics(state.latent, torch.as_tensor(state.action))[0]
    torch.testing.assert_close(spy.roots[-1], root, rtol=0, atol=1e-6)
    m = policy.cfg.mcts
    ref = reference_search(
        root_latent=spy.roots[-1], root_policy_logits=model.predict(spy.roots[-1])[1].numpy(),
        legal_mask=np.ones((3, 2), bool), recurrent_fn=policy.recurrent_fn(model),
        num_simulations=m.num_simulations, add_noise=False, deterministic=True, rng=np.random.default_rng(0),
        root_value=logits_to_scalar_np(
            model.predict(spy.roots[-1])[0].numpy(), support_size=model.value_support_size
        ),
        pb_c_base=m.pb_c_base, pb_c_init=m.pb_c_init, discount=m.discount, value_delta_max=m.value_delta_max,
    )
    np.testing.assert_array_equal(out.step_stats["child_visits"], ref.visit_distribution)
    np.testing.assert_allclose(out.root_value, ref.root_value, rtol=1e-5, atol=1e-6)
    assert ref.visit_counts.sum() == 3 * 24 and (ref.visit_counts > 0).sum() > 3  # a real search
