"""A world model as tables, for searches run side by side with mctx on the same model.

``Tables`` holds, over ``NUM_STATES`` states: next state and reward [S, A], value [S] and policy logits
[S, A]; rewards are ``offset + scale * N(0, 1)`` and values ``offset / (1 - discount) + scale * N(0, 1)``
(a constant reward with consistent values, plus noise). ``Tables.ours`` is the ``recurrent_fn`` our searches
call (latents are [B, 1] state ids); mctx reads the same arrays. ``legal_masks`` draws root masks with one
fully legal row and one row with a single legal action.
"""

from __future__ import annotations

import numpy as np
import torch

NUM_STATES = 97


def table_step(model, latent: torch.Tensor, actions: np.ndarray):
    """One step of a table model (``next_state`` [S, A], ``reward`` [S, A], ``value`` [S], ``logits`` [S, A])
    from latents [B, 1] of state ids: (next latent [B, 1], reward [B], value [B], logits [B, A])."""
    s = latent[:, 0].long().numpy()
    ns = model.next_state[s, actions]
    return (
        torch.as_tensor(ns, dtype=torch.float64)[:, None],
        model.reward[s, actions],
        model.value[ns],
        model.logits[ns],
    )


class Tables:
    def __init__(
        self, *, num_actions: int, seed: int, scale: float = 1.0, offset: float = 0.0, discount: float = 0.997
    ):
        g = np.random.default_rng(seed)
        self.next_state = g.integers(0, NUM_STATES, size=(NUM_STATES, num_actions))
        self.reward = offset + scale * g.normal(size=(NUM_STATES, num_actions))
        self.value = offset / max(1.0 - discount, 1e-3) + scale * g.normal(size=NUM_STATES)
        self.logits = 1.5 * g.normal(size=(NUM_STATES, num_actions))

    def ours(self, latent: torch.Tensor, actions: np.ndarray):
        """(next latent [B, 1], reward [B], value [B], logits [B, A]) of ``actions`` [B] from ``latent``."""
        return table_step(self, latent, actions)


def legal_masks(rng: np.random.Generator, batch: int, num_actions: int) -> np.ndarray:
    """[batch, num_actions] bool: random masks, every row with a legal action, row 0 fully legal and (for
    batch > 2) the last row with a single legal action."""
    legal = rng.random((batch, num_actions)) < 0.6
    legal[np.arange(batch), rng.integers(0, num_actions, size=batch)] = True
    legal[0] = True
    if batch > 2:
        legal[-1] = False
        legal[-1, rng.integers(0, num_actions)] = True
    return legal
