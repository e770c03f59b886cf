"""Preallocated numpy storage for a batch of search trees, shared by every search variant.

What this module owns
    The arrays the kernels read and write (:mod:`muzero_tune.mcts.kernels` and the variant rule modules),
    plus the staging buffers for network outputs, sized by (batch capacity, node capacity, edge width).
    Arrays are allocated once and only reallocated when a search needs a larger batch or more nodes than
    ever before, so repeated searches (every collect step) run without allocating. Variants that keep more
    per-tree state (Gumbel's noise and considered set) subclass :class:`TreeArrays` and add fields in
    :meth:`TreeArrays._allocate_extra`.

What it must never do
    Hold search logic, torch tensors or results that outlive one search: callers must copy anything they
    return, because the next search overwrites these buffers. Arrays are always C-contiguous and passed to the
    kernels at full capacity (with a ``batch_size``), so the numba signatures stay fixed.
"""

from __future__ import annotations

import numpy as np


class TreeArrays:
    """Batch of trees stored as struct-of-arrays. ``Bc`` = batch capacity, ``Nc`` = node capacity,
    ``A`` = root actions, ``W`` = edge width (``A``; ``max(A, C)`` with ``C`` chance codes).

    Fields (rules: the :mod:`muzero_tune.mcts.kernels` docstring):
        children     [Bc, Nc, W] int32    child node index, -1 = edge not expanded
        prior        [Bc, Nc, W] float64  edge priors (root: after legal mask and noise)
        logits       [Bc, Nc, W] float64  the network's logits of each node (root: raw)
        kind         [Bc, Nc]    int8     0 decision node, 1 chance node (always 0 without chance nodes)
        visit_count  [Bc, Nc]    int32
        value_sum    [Bc, Nc]    float64
        reward       [Bc, Nc]    float64  reward on the edge into the node (root 0)
        raw_value    [Bc, Nc]    float64  the network's value of the node
        min_value    [Bc]        float64  min-max stats of each tree
        max_value    [Bc]        float64
        root_legal   [Bc, A]     bool
        scores       [Bc, W]     float64  scratch of the select kernels
        path         [Bc, Nc]    int32    root..leaf of the current simulation
        path_len     [Bc]        int32
        sel_parent   [Bc]        int32    node whose unexpanded edge was selected
        sel_action   [Bc]        int32    that edge
        sel_kind     [Bc]        int8     kind of sel_parent (which network call expands the edge)
    Staging buffers (inputs converted to float64 once, so kernels have a single signature):
        root_logits  [Bc, A]     float64
        root_noise   [Bc, A]     float64  raw Gamma draws (Dirichlet noise before normalisation)
        root_value   [Bc]        float64  the network's value of each root
        leaf_reward  [Bc]        float64
        leaf_value   [Bc]        float64
        leaf_logits  [Bc, W]     float64
    """

    def __init__(
        self, *, num_actions: int, width: int | None = None, batch_capacity: int = 0, node_capacity: int = 0
    ) -> None:
        if num_actions < 1:
            raise ValueError(f"num_actions must be >= 1, got {num_actions}")
        self.num_actions = int(num_actions)
        self.width = int(num_actions if width is None else width)
        if self.width < self.num_actions:
            raise ValueError(f"width must be >= num_actions ({num_actions}), got {width}")
        self.batch_capacity = 0
        self.node_capacity = 0
        self.num_reallocations = 0  # for tests/benchmarks: how often the storage grew
        self._allocate(max(int(batch_capacity), 1), max(int(node_capacity), 1))
        self.num_reallocations = 0

    def ensure_capacity(self, *, batch_size: int, num_nodes: int) -> bool:
        """Grow (never shrink) so that ``batch_size`` trees of ``num_nodes`` nodes fit. True if reallocated.

        Contents are not preserved: a search resets the nodes it uses in ``prepare_roots``.
        """
        if batch_size <= self.batch_capacity and num_nodes <= self.node_capacity:
            return False
        self._allocate(max(batch_size, self.batch_capacity), max(num_nodes, self.node_capacity))
        return True

    def _allocate(self, batch_capacity: int, node_capacity: int) -> None:
        bc, nc, a, w = batch_capacity, node_capacity, self.num_actions, self.width
        self.children = np.full((bc, nc, w), -1, dtype=np.int32)
        self.prior = np.zeros((bc, nc, w), dtype=np.float64)
        self.logits = np.zeros((bc, nc, w), dtype=np.float64)
        self.kind = np.zeros((bc, nc), dtype=np.int8)
        self.visit_count = np.zeros((bc, nc), dtype=np.int32)
        self.value_sum = np.zeros((bc, nc), dtype=np.float64)
        self.reward = np.zeros((bc, nc), dtype=np.float64)
        self.raw_value = np.zeros((bc, nc), dtype=np.float64)
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
        self.root_value = np.zeros(bc, dtype=np.float64)
        self.leaf_reward = np.zeros(bc, dtype=np.float64)
        self.leaf_value = np.zeros(bc, dtype=np.float64)
        self.leaf_logits = np.zeros((bc, w), dtype=np.float64)
        self._allocate_extra(bc, nc)
        self.batch_capacity = bc
        self.node_capacity = nc
        self.num_reallocations += 1

    def _allocate_extra(self, batch_capacity: int, node_capacity: int) -> None:
        """Variant-specific arrays (none here)."""

    @property
    def nbytes(self) -> int:
        """Total bytes held by all arrays (for logging memory use)."""
        return sum(v.nbytes for v in vars(self).values() if isinstance(v, np.ndarray))
