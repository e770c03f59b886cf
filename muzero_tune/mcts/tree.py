"""Preallocated numpy storage for a batch of MuZero search trees.

What this module owns
    The arrays the kernels in :mod:`muzero_tune.mcts.kernels` read and write, plus the staging buffers for
    network outputs, sized by (batch capacity, node capacity, num actions). Arrays are allocated once and
    only reallocated when a search needs a larger batch or more nodes than ever before, so repeated searches
    (every collect step) run without allocating.

What it must never do
    Hold search logic, torch tensors or results that outlive one search: callers must copy anything they
    return, because the next search overwrites these buffers. Arrays are always C-contiguous and passed to the
    kernels at full capacity (with a ``batch_size``), so the numba signatures stay fixed.
"""

from __future__ import annotations

import numpy as np


class TreeArrays:
    """Batch of trees stored as struct-of-arrays. ``Bc`` = batch capacity, ``Nc`` = node capacity.

    Fields (see the kernels module docstring for their meaning):
        children     [Bc, Nc, A] int32
        prior        [Bc, Nc, A] float64
        visit_count  [Bc, Nc]    int32
        value_sum    [Bc, Nc]    float64
        reward       [Bc, Nc]    float64
        min_value    [Bc]        float64
        max_value    [Bc]        float64
        root_legal   [Bc, A]     bool
        scores       [Bc, A]     float64 (scratch of the select kernel)
        path         [Bc, Nc]    int32
        path_len     [Bc]        int32
        sel_parent   [Bc]        int32
        sel_action   [Bc]        int32
    Staging buffers (network outputs converted to float64 once, so kernels have a single signature):
        root_logits  [Bc, A]     float64
        root_noise   [Bc, A]     float64
        leaf_reward  [Bc]        float64
        leaf_value   [Bc]        float64
        leaf_logits  [Bc, A]     float64
    """

    def __init__(self, *, num_actions: int, batch_capacity: int = 0, node_capacity: int = 0) -> None:
        if num_actions < 1:
            raise ValueError(f"num_actions must be >= 1, got {num_actions}")
        self.num_actions = int(num_actions)
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
        bc, nc, a = batch_capacity, node_capacity, self.num_actions
        self.children = np.full((bc, nc, a), -1, dtype=np.int32)  # [Bc, Nc, A]
        self.prior = np.zeros((bc, nc, a), dtype=np.float64)  # [Bc, Nc, A]
        self.visit_count = np.zeros((bc, nc), dtype=np.int32)  # [Bc, Nc]
        self.value_sum = np.zeros((bc, nc), dtype=np.float64)  # [Bc, Nc]
        self.reward = np.zeros((bc, nc), dtype=np.float64)  # [Bc, Nc]
        self.min_value = np.full(bc, np.inf, dtype=np.float64)  # [Bc]
        self.max_value = np.full(bc, -np.inf, dtype=np.float64)  # [Bc]
        self.root_legal = np.zeros((bc, a), dtype=np.bool_)  # [Bc, A]
        self.scores = np.zeros((bc, a), dtype=np.float64)  # [Bc, A]
        self.path = np.zeros((bc, nc), dtype=np.int32)  # [Bc, Nc]
        self.path_len = np.zeros(bc, dtype=np.int32)  # [Bc]
        self.sel_parent = np.zeros(bc, dtype=np.int32)  # [Bc]
        self.sel_action = np.zeros(bc, dtype=np.int32)  # [Bc]
        self.root_logits = np.zeros((bc, a), dtype=np.float64)  # [Bc, A]
        self.root_noise = np.zeros((bc, a), dtype=np.float64)  # [Bc, A]
        self.leaf_reward = np.zeros(bc, dtype=np.float64)  # [Bc]
        self.leaf_value = np.zeros(bc, dtype=np.float64)  # [Bc]
        self.leaf_logits = np.zeros((bc, a), dtype=np.float64)  # [Bc, A]
        self.batch_capacity = bc
        self.node_capacity = nc
        self.num_reallocations += 1

    @property
    def nbytes(self) -> int:
        """Total bytes held by all arrays (for logging memory use)."""
        return sum(v.nbytes for v in vars(self).values() if isinstance(v, np.ndarray))
