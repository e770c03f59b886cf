"""Stochastic MuZero search driver (Antonoglou et al. 2022): batched trees with decision and chance nodes.

What this module owns
    :class:`StochasticMuZeroSearch` (the :class:`~muzero_tune.mcts.search.Search` variant with chance nodes)
    and its preallocated storage :class:`StochasticTreeArrays`. Per simulation: one select kernel call, the
    network call(s), one expand+backup kernel call. Tree arithmetic lives in
    :mod:`muzero_tune.mcts.stochastic_kernels` (rules written out in its docstring).

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

from muzero_tune.mcts import stochastic_kernels as sk
from muzero_tune.mcts.search import LatentStore, RecurrentFn, Search, SearchOutput

AfterstateFn = Callable[[torch.Tensor, np.ndarray], tuple[torch.Tensor, np.ndarray, np.ndarray]]
"""``afterstate_fn(latent [n, *latent_shape], actions [n] int64) -> (afterstate [n, *latent_shape],
value [n] float32 (afterstate Q, decoded), chance_logits [n, C] float32)``."""

ChanceRecurrentFn = RecurrentFn
"""``recurrent_fn(afterstate [n, *latent_shape], chance_codes [n] int64) -> (next_latent, reward [n],
value [n], policy_logits [n, A])`` -- the MuZero ``RecurrentFn`` signature with chance codes for actions."""


class StochasticTreeArrays:
    """Struct-of-arrays storage of a batch of chance-node trees (layout: stochastic_kernels docstring)."""

    def __init__(self, *, num_actions: int, num_chances: int) -> None:
        self.num_actions = int(num_actions)
        self.num_chances = int(num_chances)
        self.width = max(self.num_actions, self.num_chances)
        self.batch_capacity = 0
        self.node_capacity = 0
        self.num_reallocations = 0
        self._allocate(1, 1)
        self.num_reallocations = 0

    def ensure_capacity(self, *, batch_size: int, num_nodes: int) -> bool:
        if batch_size <= self.batch_capacity and num_nodes <= self.node_capacity:
            return False
        self._allocate(max(batch_size, self.batch_capacity), max(num_nodes, self.node_capacity))
        return True

    def _allocate(self, bc: int, nc: int) -> None:
        a, w = self.num_actions, self.width
        self.children = np.full((bc, nc, w), -1, dtype=np.int32)
        self.prior = np.zeros((bc, nc, w), dtype=np.float64)
        self.kind = np.zeros((bc, nc), dtype=np.int8)
        self.visit_count = np.zeros((bc, nc), dtype=np.int32)
        self.value_sum = np.zeros((bc, nc), dtype=np.float64)
        self.reward = np.zeros((bc, nc), dtype=np.float64)
        self.min_value = np.full(bc, np.inf, dtype=np.float64)
        self.max_value = np.full(bc, -np.inf, dtype=np.float64)
        self.root_legal = np.zeros((bc, a), dtype=np.bool_)
        self.scores = np.zeros((bc, w), dtype=np.float64)
        self.path = np.zeros((bc, nc), dtype=np.int32)
        self.path_len = np.zeros(bc, dtype=np.int32)
        self.sel_parent = np.zeros(bc, dtype=np.int32)
        self.sel_action = np.zeros(bc, dtype=np.int32)
        self.sel_kind = np.zeros(bc, dtype=np.int8)
        self.root_logits = np.zeros((bc, a), dtype=np.float64)
        self.root_noise = np.zeros((bc, a), dtype=np.float64)
        self.leaf_reward = np.zeros(bc, dtype=np.float64)
        self.leaf_value = np.zeros(bc, dtype=np.float64)
        self.leaf_logits = np.zeros((bc, w), dtype=np.float64)
        self.batch_capacity, self.node_capacity = bc, nc
        self.num_reallocations += 1


class StochasticMuZeroSearch(Search):
    """Batched Stochastic MuZero search (see the module docstring).

    Randomness consumed from ``rng`` per :meth:`run`: if ``add_noise``, one
    ``rng.standard_gamma(dirichlet_alpha, size=(B, A))`` call; then always one ``rng.integers(0, 2**31 - 1)``
    call that seeds numba's RNG (chance sampling needs it even when ``deterministic``, which only fixes
    decision-node tie-breaks to the lowest index). Not thread-safe; buffers are reused across runs.

    ``SearchOutput.extras["network_calls"]`` [B] int32 is the number of batched network calls of the run
    (the same for every row; between ``num_simulations`` and ``2 * num_simulations``).
    """

    def __init__(
        self,
        *,
        num_actions: int,
        num_chances: int,
        num_simulations: int,
        pb_c_base: float = 19652.0,
        pb_c_init: float = 1.25,
        discount: float = 0.997,
        dirichlet_alpha: float = 0.3,
        noise_weight: float = 0.25,
        value_delta_max: float = 0.01,
        chance_selection: str = "sample",
    ) -> None:
        if num_actions < 1 or num_chances < 1 or num_simulations < 1:
            raise ValueError(
                f"num_actions, num_chances and num_simulations must be >= 1, got "
                f"{num_actions}, {num_chances}, {num_simulations}"
            )
        if chance_selection not in sk.CHANCE_MODES:
            raise ValueError(
                f"chance_selection must be one of {list(sk.CHANCE_MODES)}, got {chance_selection!r}"
            )
        if dirichlet_alpha <= 0.0 or not 0.0 <= noise_weight <= 1.0:
            raise ValueError("dirichlet_alpha must be > 0 and noise_weight in [0, 1]")
        self._num_actions = int(num_actions)
        self.num_chances = int(num_chances)
        self._num_simulations = int(num_simulations)
        self.pb_c_base = float(pb_c_base)
        self.pb_c_init = float(pb_c_init)
        self.discount = float(discount)
        self.dirichlet_alpha = float(dirichlet_alpha)
        self.noise_weight = float(noise_weight)
        self.value_delta_max = float(value_delta_max)
        self.chance_selection = chance_selection
        self._chance_mode = sk.CHANCE_MODES[chance_selection]
        self._tree = StochasticTreeArrays(num_actions=self._num_actions, num_chances=self.num_chances)
        self._store = LatentStore()  # [Nc, Bc, *latent_shape]: states and afterstates

    @property
    def num_actions(self) -> int:
        return self._num_actions

    @property
    def num_simulations(self) -> int:
        return self._num_simulations

    @property
    def tree(self) -> StochasticTreeArrays:
        return self._tree

    def run(
        self,
        *,
        root_latent: torch.Tensor,
        root_policy_logits: np.ndarray,
        legal_mask: np.ndarray,
        recurrent_fn: ChanceRecurrentFn,
        afterstate_fn: AfterstateFn,
        add_noise: bool,
        deterministic: bool,
        rng: np.random.Generator,
    ) -> SearchOutput:
        """Search from B roots. ``recurrent_fn`` expands chance edges, ``afterstate_fn`` action edges (see the
        type aliases); other arguments as :meth:`muzero_tune.mcts.search.Search.run`."""
        bsz = int(root_latent.shape[0])
        num_actions, num_chances = self._num_actions, self.num_chances
        legal_mask = np.asarray(legal_mask)
        if np.shape(root_policy_logits) != (bsz, num_actions) or legal_mask.shape != (bsz, num_actions):
            raise ValueError(
                f"root_policy_logits and legal_mask must be [{bsz}, {num_actions}], got "
                f"{np.shape(root_policy_logits)} and {legal_mask.shape}"
            )
        if legal_mask.dtype != np.bool_ or not legal_mask.any(axis=1).all():
            raise ValueError("legal_mask must be bool with at least one legal action per row")

        tree = self._tree
        num_nodes = self._num_simulations + 1
        tree.ensure_capacity(batch_size=bsz, num_nodes=num_nodes)
        b = slice(0, bsz)
        tree.root_logits[b] = root_policy_logits
        tree.root_legal[b] = legal_mask
        if add_noise:
            tree.root_noise[b] = rng.standard_gamma(self.dirichlet_alpha, size=(bsz, num_actions))
        sk.seed_rng(int(rng.integers(0, 2**31 - 1)))
        sk.prepare_roots(
            tree.children,
            tree.prior,
            tree.kind,
            tree.visit_count,
            tree.value_sum,
            tree.reward,
            tree.min_value,
            tree.max_value,
            tree.root_legal,
            tree.root_logits,
            tree.root_noise,
            bsz,
            num_nodes,
            num_actions,
            bool(add_noise),
            self.noise_weight,
        )
        calls = 0
        with torch.no_grad():
            latents, _ = self._store.ensure(root_latent, num_nodes=self._num_simulations + 1, batch_size=bsz)
            latents[0, :bsz].copy_(root_latent)
            dev = latents.device
            for sim in range(self._num_simulations):
                sk.select_leaves(
                    tree.children,
                    tree.prior,
                    tree.kind,
                    tree.visit_count,
                    tree.value_sum,
                    tree.reward,
                    tree.min_value,
                    tree.max_value,
                    tree.root_legal,
                    tree.scores,
                    tree.path,
                    tree.path_len,
                    tree.sel_parent,
                    tree.sel_action,
                    tree.sel_kind,
                    bsz,
                    num_actions,
                    num_chances,
                    self.pb_c_base,
                    self.pb_c_init,
                    self.discount,
                    self.value_delta_max,
                    bool(deterministic),
                    self._chance_mode,
                )
                chance_rows = tree.sel_kind[b] == sk.CHANCE  # [B] parent is a chance node
                n_chance = int(chance_rows.sum())
                groups = []
                if n_chance < bsz:
                    groups.append((sk.DECISION, None if n_chance == 0 else np.flatnonzero(~chance_rows)))
                if n_chance > 0:
                    groups.append((sk.CHANCE, None if n_chance == bsz else np.flatnonzero(chance_rows)))
                for kind, rows in groups:
                    idx = np.arange(bsz) if rows is None else rows
                    parent = torch.from_numpy(tree.sel_parent[idx].astype(np.int64)).to(dev)
                    col = torch.from_numpy(idx.astype(np.int64)).to(dev)
                    parent_latent = latents[parent, col]  # [n, *latent_shape]
                    edges = tree.sel_action[idx].astype(np.int64)  # [n]
                    if kind == sk.DECISION:
                        nxt, value, logits = afterstate_fn(parent_latent, edges)
                        reward, width = 0.0, num_chances
                    else:
                        nxt, reward, value, logits = recurrent_fn(parent_latent, edges)
                        width = num_actions
                    if tuple(nxt.shape) != (len(idx), *root_latent.shape[1:]):
                        raise ValueError(f"network latent shape {tuple(nxt.shape)} does not match the root's")
                    _check("value", value, (len(idx),))
                    _check("logits", logits, (len(idx), width))
                    if rows is None:
                        latents[sim + 1, :bsz].copy_(nxt)
                        tree.leaf_value[b] = value
                        tree.leaf_logits[b, :width] = logits
                        tree.leaf_reward[b] = reward
                    else:
                        latents[sim + 1, col] = nxt.to(latents.dtype)
                        tree.leaf_value[idx] = value
                        tree.leaf_logits[idx, :width] = logits
                        tree.leaf_reward[idx] = reward
                    calls += 1
                sk.expand_and_backup(
                    tree.children,
                    tree.prior,
                    tree.kind,
                    tree.visit_count,
                    tree.value_sum,
                    tree.reward,
                    tree.min_value,
                    tree.max_value,
                    tree.path,
                    tree.path_len,
                    tree.sel_parent,
                    tree.sel_action,
                    tree.sel_kind,
                    tree.leaf_reward,
                    tree.leaf_value,
                    tree.leaf_logits,
                    sim + 1,
                    bsz,
                    num_actions,
                    num_chances,
                    self.discount,
                )

        visit_counts = np.empty((bsz, num_actions), dtype=np.int32)
        root_value = np.empty(bsz, dtype=np.float64)
        sk.root_statistics(
            tree.children, tree.visit_count, tree.value_sum, bsz, num_actions, visit_counts, root_value
        )
        totals = visit_counts.sum(axis=1, keepdims=True)
        return SearchOutput(
            visit_counts=visit_counts,
            visit_distribution=(visit_counts / totals).astype(np.float32),
            root_value=root_value.astype(np.float32),
            root_prior=tree.prior[b, 0, :num_actions].astype(np.float32),
            extras={"network_calls": np.full(bsz, calls, dtype=np.int32)},
        )


def _check(name: str, array, shape: tuple[int, ...]) -> None:
    if tuple(np.shape(array)) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(np.shape(array))}")
