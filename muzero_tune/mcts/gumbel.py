"""Gumbel MuZero search (Danihelka et al. 2022, "Policy improvement by planning with Gumbel"), batched.

What this module owns
    :class:`GumbelMuZeroSearch`: the shared batched loop (:class:`~muzero_tune.mcts.search.TreeSearch`) with
    Gumbel's root noise, selection rules and read-out, and its tree storage :class:`GumbelTreeArrays`. The
    rules are written in :mod:`muzero_tune.mcts.gumbel_kernels` (docstring) and, in plain Python, in
    :func:`muzero_tune.mcts.reference.reference_gumbel_search`.

Randomness
    g = gumbel_scale * Gumbel(0, 1) noise, one ``rng.gumbel(size=(B, A))`` draw when ``add_noise``
    (collecting), g = 0 otherwise (evaluating). There is no random tie-break: ``deterministic`` is accepted
    for the interface and has no effect.

What it must never do
    Hold tree arithmetic in the driver, build autograd graphs, or return views into its reusable buffers.
"""

from __future__ import annotations

import numpy as np

from muzero_tune.mcts import gumbel_kernels as gk
from muzero_tune.mcts.search import Step, TreeSearch, fast
from muzero_tune.mcts.tree import TreeArrays


class GumbelTreeArrays(TreeArrays):
    """:class:`TreeArrays` plus Gumbel's per-tree state (layout: the gumbel_kernels docstring)."""

    def _allocate_extra(self, batch_capacity: int, node_capacity: int) -> None:
        bc, a = batch_capacity, self.num_actions
        self.gumbel = np.zeros((bc, a), dtype=np.float64)
        self.considered = np.zeros((bc, a), dtype=np.bool_)
        self.num_considered = np.zeros(bc, dtype=np.int32)
        self.cq = np.zeros((bc, a), dtype=np.float64)
        self.sigma = np.zeros((bc, a), dtype=np.float64)
        self.root_trace = np.zeros((bc, node_capacity), dtype=np.int32)


class GumbelMuZeroSearch(TreeSearch):
    """Gumbel MuZero search over discrete actions (rules: :mod:`muzero_tune.mcts.gumbel_kernels`).

    Randomness consumed from ``rng`` per :meth:`run`: one ``rng.gumbel(size=(B, A))`` call when
    ``add_noise`` (nothing otherwise). ``root_value`` [B] is the network's value of each root (its counted
    first visit, and v_hat of the root's mixed value).

    Output: ``visit_counts`` / ``visit_distribution`` of the root children, ``root_value`` (mean of the
    network's root value and the backed-up returns), ``root_prior`` (softmax of the legal root logits, no
    noise) and ``extras``: ``improved_policy`` [B, A] float32 (pi', the policy target), ``selected_action``
    [B] int64 (always a most-visited action), ``completed_q`` [B, A] float32 (raw, illegal 0),
    ``considered`` [B, A] bool (the Gumbel-top-k set), ``survivors`` [B, A] bool (the most-visited legal
    actions: the last phase's survivors, which the executed action is chosen from) and ``root_actions``
    [B, S] int64 (the root action of every simulation). Not thread-safe: one instance per thread/actor.
    """

    def __init__(
        self,
        *,
        num_actions: int,
        num_simulations: int,
        max_num_considered_actions: int = 16,
        gumbel_scale: float = 1.0,
        c_visit: float = 50.0,
        c_scale: float = 0.1,
        discount: float = 0.997,
        value_delta_max: float = 0.01,
    ) -> None:
        if max_num_considered_actions < 1:
            raise ValueError(f"max_num_considered_actions must be >= 1, got {max_num_considered_actions}")
        super().__init__(
            num_actions=num_actions,
            num_simulations=num_simulations,
            discount=discount,
            value_delta_max=value_delta_max,
            tree=GumbelTreeArrays(num_actions=num_actions),
        )
        self.max_num_considered_actions = int(max_num_considered_actions)
        self.gumbel_scale = float(gumbel_scale)
        self.c_visit = float(c_visit)
        self.c_scale = float(c_scale)
        # k is at most min(max considered, A): the rows of the visit schedule a search can use.
        self._visit_table = gk.considered_visit_table(
            min(self.max_num_considered_actions, self._num_actions), self._num_simulations
        )  # [k_max + 1, S] int32

    @property
    def tree(self) -> GumbelTreeArrays:
        return self._tree

    def _prepare(self, bsz: int, *, add_noise: bool, deterministic: bool, rng: np.random.Generator) -> None:
        t = self._tree
        if add_noise:
            t.gumbel[:bsz] = rng.gumbel(size=(bsz, self._num_actions)) * self.gumbel_scale
        else:
            t.gumbel[:bsz] = 0.0
        super()._prepare(bsz, add_noise=False, deterministic=deterministic, rng=rng)
        gk.prepare_considered(
            t.root_legal, t.root_logits, t.gumbel, t.considered, t.num_considered, bsz, self._num_actions,
            self.max_num_considered_actions,
        )  # fmt: skip

    def _knobs(self) -> tuple[float, float, float, float]:
        return self.discount, self.value_delta_max, self.c_visit, self.c_scale

    def _select_step(self, bsz: int, deterministic: bool) -> Step:
        t = self._tree
        kernel = fast(gk.select_leaves)
        head = (
            t.children, t.logits, t.prior, t.kind, t.visit_count, t.value_sum, t.reward, t.raw_value,
            t.root_legal, t.gumbel, t.num_considered, self._visit_table, t.cq, t.sigma, t.scores, t.path,
            t.path_len, t.sel_parent, t.sel_action, t.sel_kind, t.root_trace,
        )  # fmt: skip
        tail = (bsz, self._num_actions, *self._knobs())
        return lambda sim: kernel(*head, sim, *tail)

    def _extras(self, bsz: int, visit_counts: np.ndarray) -> dict[str, np.ndarray]:
        t = self._tree
        a = self._num_actions
        completed_q = np.empty((bsz, a), dtype=np.float64)
        improved = np.empty((bsz, a), dtype=np.float64)
        selected = np.empty(bsz, dtype=np.int64)
        most_visited = np.empty((bsz, a), dtype=np.bool_)
        gk.root_outputs(
            t.children, t.logits, t.prior, t.visit_count, t.value_sum, t.reward, t.raw_value, t.root_legal,
            t.gumbel, t.cq, t.sigma, bsz, a, *self._knobs(), completed_q, improved, selected, most_visited,
        )  # fmt: skip
        return {
            "improved_policy": improved.astype(np.float32),
            "selected_action": selected,
            "completed_q": completed_q.astype(np.float32),
            "considered": t.considered[:bsz].copy(),
            "survivors": most_visited,
            "root_actions": t.root_trace[:bsz, : self._num_simulations].astype(np.int64),
        }
