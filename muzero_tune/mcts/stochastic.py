"""Stochastic MuZero search driver (Antonoglou et al. 2022): batched trees with decision and chance nodes.

What this module owns
    :class:`StochasticMuZeroSearch`: MuZero's search (:class:`~muzero_tune.mcts.search.MuZeroSearch`) with
    the shared core's chance-edge rule on and its own expansion step. Selection is
    :func:`muzero_tune.mcts.puct.select_leaves` (pUCT at decision nodes, :mod:`muzero_tune.mcts.chance` at
    chance nodes); the plain-Python specification is
    :func:`muzero_tune.mcts.reference.reference_stochastic_search`.

Network calls per simulation
    The selected unexpanded edge of a tree is either an action edge of a decision node (expanded by
    ``afterstate_fn``: state, action -> afterstate, Q, chance logits) or a chance edge of a chance node
    (expanded by ``recurrent_fn``: afterstate, chance code -> next state, reward, value, policy logits).
    When every tree expands the same kind, that callable is called once on the whole batch; when the batch
    mixes kinds, each callable is called once on its subset of trees (two batched calls). Computing both on
    the whole batch would waste half of the network work; splitting by kind costs one index gather and one
    scatter per kind.

Chance nodes
    ``chance_selection="sample"`` (default): the outcome is sampled from the afterstate's chance prior
    sigma with numba's RNG (seeded from ``rng`` once per run), one draw per chance node traversed, so a
    simulation follows the model's own distribution over outcomes. ``"prior_weighted"``: the paper's
    deterministic quasi-random rule ``argmax_c sigma(c) / (1 + N(c))``. Chance nodes add no reward and no
    discount on the way up; min-max normalisation is MuZero's.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from muzero_tune.mcts import kernels
from muzero_tune.mcts.chance import CHANCE_MODES
from muzero_tune.mcts.search import MuZeroSearch, RecurrentFn, SearchOutput, Step, _check_shape
from muzero_tune.mcts.tree import TreeArrays

AfterstateFn = Callable[[torch.Tensor, np.ndarray], tuple[torch.Tensor, np.ndarray, np.ndarray]]
"""``afterstate_fn(latent [n, *latent_shape], actions [n] int64) -> (afterstate [n, *latent_shape],
value [n] float32 (afterstate Q, decoded), chance_logits [n, C] float32)``."""

ChanceRecurrentFn = RecurrentFn
"""``recurrent_fn(afterstate [n, *latent_shape], chance_codes [n] int64) -> (next_latent, reward [n],
value [n], policy_logits [n, A])`` -- the MuZero ``RecurrentFn`` signature with chance codes for actions."""


class StochasticMuZeroSearch(MuZeroSearch):
    """Batched Stochastic MuZero search (see the module docstring).

    Randomness consumed from ``rng`` per :meth:`run`: if ``add_noise``, one
    ``rng.standard_gamma(dirichlet_alpha, size=(B, A))`` call; then always one ``rng.integers(0, 2**31 - 1)``
    call that seeds numba's RNG (chance sampling needs it even when ``deterministic``, which only fixes
    decision-node tie-breaks to the lowest index). Not thread-safe; buffers are reused across runs.

    :meth:`run` takes ``afterstate_fn`` (see :data:`AfterstateFn`) besides MuZero's arguments;
    ``SearchOutput.extras["network_calls"]`` [B] int32 is the number of batched network calls of the run
    (the same for every row; between ``num_simulations`` and ``2 * num_simulations``).
    """

    chance_edges = True

    def __init__(
        self, *, num_actions: int, num_chances: int, chance_selection: str = "sample", **knobs
    ) -> None:
        if num_chances < 1:
            raise ValueError(f"num_chances must be >= 1, got {num_chances}")
        if chance_selection not in CHANCE_MODES:
            raise ValueError(
                f"chance_selection must be one of {list(CHANCE_MODES)}, got {chance_selection!r}"
            )
        tree = TreeArrays(num_actions=num_actions, width=max(num_actions, num_chances))
        super().__init__(num_actions=num_actions, tree=tree, **knobs)
        self._num_chances = int(num_chances)
        self.chance_selection = chance_selection
        self._chance_mode = CHANCE_MODES[chance_selection]
        self._calls = 0

    @property
    def num_chances(self) -> int:
        return self._num_chances

    def _seed_numba(self, deterministic: bool, rng: np.random.Generator) -> None:
        self._calls = 0
        kernels.seed_rng(int(rng.integers(0, 2**31 - 1)))

    def _expand_step(self, bsz, recurrent_fn, network_fns) -> Step:
        return self._expand_then_backup(bsz, recurrent_fn, network_fns)

    def _expand(self, bsz, sim, recurrent_fn, *, afterstate_fn: AfterstateFn) -> None:
        """Expand every tree's selected edge, with one batched call per edge kind present in the batch."""
        t = self._tree
        chance_rows = t.sel_kind[:bsz] == kernels.CHANCE  # [B] parent is a chance node
        n_chance = int(chance_rows.sum())
        groups = []
        if n_chance < bsz:
            groups.append((kernels.DECISION, None if n_chance == 0 else np.flatnonzero(~chance_rows)))
        if n_chance > 0:
            groups.append((kernels.CHANCE, None if n_chance == bsz else np.flatnonzero(chance_rows)))
        for kind, rows in groups:
            sel = slice(0, bsz) if rows is None else rows
            parent_latent = self._store.gather(t.sel_parent[sel], rows)  # [n, *latent_shape]
            edges = t.sel_action[sel].astype(np.int64)  # [n]
            n = len(edges)
            if kind == kernels.DECISION:
                nxt, value, logits = afterstate_fn(parent_latent, edges)
                reward, width = np.zeros(n), self._num_chances
            else:
                nxt, reward, value, logits = recurrent_fn(parent_latent, edges)
                width = self._num_actions
            _check_shape("reward", reward, (n,))
            _check_shape("value", value, (n,))
            _check_shape("logits", logits, (n, width))
            self._store.put(sim + 1, nxt, rows)
            t.leaf_reward[sel] = reward
            t.leaf_value[sel] = value
            t.leaf_logits[sel, :width] = logits
            self._calls += 1

    def _extras(self, bsz: int, visit_counts: np.ndarray) -> dict[str, np.ndarray]:
        return {"network_calls": np.full(bsz, self._calls, dtype=np.int32)}


__all__ = ["AfterstateFn", "ChanceRecurrentFn", "SearchOutput", "StochasticMuZeroSearch"]
