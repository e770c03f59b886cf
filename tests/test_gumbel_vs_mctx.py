"""Our Gumbel MuZero search against an independent implementation: DeepMind's ``mctx.gumbel_muzero_policy``.

Both searches run on the same small deterministic world models given as tables (random rewards, values and
logits; several batch rows with different legal masks; simulations below and above the number of considered
actions), with ``gumbel_scale=0`` so no noise differs, and mctx in float64. They must agree on the visit
counts, the executed action and the improved policy (mctx's ``action_weights``) within 1e-5. A rule misread
the same way in our kernels and in :mod:`muzero_tune.mcts.reference` fails here.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
mctx = pytest.importorskip("mctx")
jax.config.update("jax_enable_x64", True)
# XLA compile time dominates these tiny programs (one per case); the optimisation passes are not needed here
jax.config.update("jax_disable_most_optimizations", True)
jnp = jax.numpy

from muzero_tune.mcts.gumbel import GumbelMuZeroSearch  # noqa: E402
from tests.oracles.mctx_model import mctx_model  # noqa: E402
from tests.oracles.tables import NUM_STATES, Tables, legal_masks  # noqa: E402


@functools.partial(jax.jit, static_argnames=("sims", "considered", "discount", "epsilon"))
def _mctx_policy(next_state, reward, value, logits, states, invalid, *, sims, considered, discount, epsilon):
    """mctx's Gumbel MuZero search over the tables: one XLA program per case, not one per op."""

    root, recurrent_fn = mctx_model(next_state, reward, value, logits, states, discount=discount)
    return mctx.gumbel_muzero_policy(
        params=(),
        rng_key=jax.random.PRNGKey(0),
        root=root,
        recurrent_fn=recurrent_fn,
        num_simulations=sims,
        invalid_actions=invalid,
        max_num_considered_actions=considered,
        gumbel_scale=0.0,
        qtransform=functools.partial(mctx.qtransform_completed_by_mix_value, epsilon=epsilon),
    )


def _both(tables: Tables, states, legal, *, sims, considered, discount, epsilon):
    search = GumbelMuZeroSearch(
        num_actions=legal.shape[1],
        num_simulations=sims,
        max_num_considered_actions=considered,
        discount=discount,
        value_delta_max=epsilon,
    )
    out = search.run(
        root_latent=torch.as_tensor(states, dtype=torch.float64)[:, None],
        root_policy_logits=tables.logits[states],
        legal_mask=legal,
        recurrent_fn=tables.ours,
        add_noise=False,
        deterministic=True,
        rng=np.random.default_rng(0),
        root_value=tables.value[states],
    )
    policy = _mctx_policy(
        jnp.asarray(tables.next_state),
        jnp.asarray(tables.reward),
        jnp.asarray(tables.value),
        jnp.asarray(tables.logits),
        jnp.asarray(states),
        jnp.asarray(~legal),
        sims=sims,
        considered=considered,
        discount=discount,
        epsilon=epsilon,
    )
    return out, policy


@pytest.mark.parametrize(
    "num_actions,batch,sims,considered,discount,epsilon",
    [
        (4, 5, 3, 4, 0.997, 1e-8),  # fewer simulations than considered actions
        (4, 5, 16, 4, 0.9, 1e-8),
        (6, 4, 5, 16, 0.997, 1e-8),  # considered capped by the legal actions
        (6, 4, 40, 3, 0.95, 1e-8),
        (9, 3, 20, 8, 0.997, 0.01),  # the value floor as our config's default
        (3, 6, 24, 2, 1.0, 1e-8),
        (5, 4, 31, 1, 0.99, 1e-8),  # one considered action takes every simulation
    ],
)
def test_gumbel_search_matches_mctx(num_actions, batch, sims, considered, discount, epsilon):
    rng = np.random.default_rng(num_actions * 1000 + sims)
    tables = Tables(num_actions=num_actions, seed=sims + considered)
    states = rng.integers(0, NUM_STATES, size=batch)
    legal = legal_masks(rng, batch, num_actions)
    out, policy = _both(
        tables, states, legal, sims=sims, considered=considered, discount=discount, epsilon=epsilon
    )
    tree = policy.search_tree
    np.testing.assert_array_equal(out.visit_counts, np.asarray(tree.summary().visit_counts))
    np.testing.assert_array_equal(out.extras["selected_action"], np.asarray(policy.action))
    np.testing.assert_allclose(
        out.extras["improved_policy"], np.asarray(policy.action_weights), rtol=0, atol=1e-5
    )
    # root value: mctx's running mean over the root's initial value and every backed-up return
    np.testing.assert_allclose(out.root_value, np.asarray(tree.node_values[:, 0]), rtol=1e-5, atol=1e-5)
    # the executed action was visited, and is one of the most-visited ones
    visits_of_action = out.visit_counts[np.arange(batch), out.extras["selected_action"]]
    assert (visits_of_action == out.visit_counts.max(axis=1)).all()


def test_value_scale_does_not_change_the_choice_relative_to_mctx():
    """Large returns (CartPole-like, ~100) with close Q values: mctx rescales each node's own completed Q,
    so the sigma gap between close children stays large; the improved policy must match mctx's."""
    tables = Tables(num_actions=3, seed=5, scale=1.0)
    tables.value = 100.0 + 0.5 * tables.value
    states = np.arange(4)
    legal = np.ones((4, 3), bool)
    out, policy = _both(tables, states, legal, sims=12, considered=3, discount=0.997, epsilon=1e-8)
    np.testing.assert_allclose(
        out.extras["improved_policy"], np.asarray(policy.action_weights), rtol=0, atol=1e-5
    )
    # the improved policy moved far from the prior (a tree-wide normalisation would leave it near the prior)
    prior = out.root_prior
    assert np.abs(out.extras["improved_policy"] - prior).max() > 0.1
