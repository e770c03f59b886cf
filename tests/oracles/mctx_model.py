"""The :mod:`tests.oracles.tables` world model in mctx's terms: its root output and recurrent function.

Import only after ``pytest.importorskip("jax")`` / ``pytest.importorskip("mctx")``: this module imports both.
Traced inside the callers' ``jax.jit`` programs, so the arrays are jax arrays there.
"""

from __future__ import annotations

import jax.numpy as jnp
import mctx


def mctx_model(next_state, reward, value, logits, states, *, discount: float):
    """(root, recurrent_fn) over the tables: ``next_state``/``reward``/``logits`` [S, A], ``value`` [S], the
    roots' states ``states`` [B]; latents (mctx's embeddings) are state ids."""

    def recurrent_fn(params, rng_key, action, embedding):
        del params, rng_key
        ns = next_state[embedding, action]
        out = mctx.RecurrentFnOutput(
            reward=reward[embedding, action],
            discount=jnp.full(ns.shape, discount),
            prior_logits=logits[ns],
            value=value[ns],
        )
        return out, ns

    root = mctx.RootFnOutput(prior_logits=logits[states], value=value[states], embedding=states)
    return root, recurrent_fn
