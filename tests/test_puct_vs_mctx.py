"""Our MuZero search with the per-node Q transform against an independent implementation: DeepMind's
``mctx.muzero_policy`` with ``qtransform_by_parent_and_siblings``.

Both searches run on the same small deterministic world models given as tables (random rewards, values and
logits, on several reward scales and signs; batch rows with different legal masks), with no root noise and
mctx in float64. They must agree on the root visit counts and on the executed action (the most visited
one). A rule misread the same way in our kernels and in :mod:`muzero_tune.mcts.reference` fails here.
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

from muzero_tune.mcts import MuZeroSearch, select_action  # noqa: E402
from muzero_tune.mcts.reference import reference_search  # noqa: E402
from tests.oracles.mctx_model import mctx_model  # noqa: E402
from tests.oracles.tables import NUM_STATES, Tables, legal_masks  # noqa: E402


@functools.partial(jax.jit, static_argnames=("sims", "discount"))
def _mctx_policy(next_state, reward, value, logits, states, invalid, *, sims, discount):
    """mctx's MuZero search over the tables: one XLA program per case, not one per op."""

    root, recurrent_fn = mctx_model(next_state, reward, value, logits, states, discount=discount)
    return mctx.muzero_policy(
        params=(),
        rng_key=jax.random.PRNGKey(0),
        root=root,
        recurrent_fn=recurrent_fn,
        num_simulations=sims,
        invalid_actions=invalid,
        qtransform=mctx.qtransform_by_parent_and_siblings,
        dirichlet_fraction=0.0,
        temperature=1e-4,  # the most visited action (mctx samples from visits ** (1 / temperature))
    )


def _run_ours(tables: Tables, states, legal, *, sims, discount):
    args = dict(
        root_latent=torch.as_tensor(states, dtype=torch.float64)[:, None],
        root_policy_logits=tables.logits[states],
        legal_mask=legal,
        recurrent_fn=tables.ours,
        add_noise=False,
        deterministic=True,
        rng=np.random.default_rng(0),
        root_value=tables.value[states],
    )
    knobs = dict(discount=discount, value_delta_max=1e-8, q_transform="parent_and_siblings")
    search = MuZeroSearch(num_actions=legal.shape[1], num_simulations=sims, **knobs)
    return search.run(**args), reference_search(num_simulations=sims, **knobs, **args)


@pytest.mark.parametrize(
    "num_actions,batch,sims,discount,scale,offset",
    [
        (4, 5, 16, 0.997, 1.0, 0.0),
        (4, 5, 40, 0.9, 1.0, 1.0),  # a constant positive reward on top (CartPole-like sign)
        (6, 4, 25, 0.997, 0.05, 1.0),  # values ~333 with small differences between actions
        (3, 6, 30, 0.99, 0.3, -1.0),  # a constant negative reward (Acrobot-like sign)
        (9, 3, 50, 0.997, 20.0, 0.0),  # large rewards
        (2, 4, 12, 1.0, 1.0, 0.0),
    ],
)
def test_parent_and_siblings_search_matches_mctx(num_actions, batch, sims, discount, scale, offset):
    rng = np.random.default_rng(num_actions * 1000 + sims)
    tables = Tables(num_actions=num_actions, seed=sims, scale=scale, offset=offset, discount=discount)
    states = rng.integers(0, NUM_STATES, size=batch)
    legal = legal_masks(rng, batch, num_actions)
    ours, reference = _run_ours(tables, states, legal, sims=sims, discount=discount)
    policy = _mctx_policy(
        jnp.asarray(tables.next_state),
        jnp.asarray(tables.reward),
        jnp.asarray(tables.value),
        jnp.asarray(tables.logits),
        jnp.asarray(states),
        jnp.asarray(~legal),
        sims=sims,
        discount=discount,
    )
    theirs = np.asarray(policy.search_tree.summary().visit_counts)
    np.testing.assert_array_equal(ours.visit_counts, theirs)
    np.testing.assert_array_equal(reference.visit_counts, ours.visit_counts)
    # the executed action: the most visited one (compared where the maximum is unique)
    chosen = select_action(ours.visit_counts, temperature=0.0, rng=rng, deterministic=True)
    unique = (ours.visit_counts == ours.visit_counts.max(axis=1, keepdims=True)).sum(axis=1) == 1
    assert unique.any()
    np.testing.assert_array_equal(chosen[unique], np.asarray(policy.action)[unique])
    assert legal[np.arange(batch), chosen].all()
    np.testing.assert_allclose(
        ours.root_value, np.asarray(policy.search_tree.node_values[:, 0]), rtol=1e-5, atol=1e-5
    )
