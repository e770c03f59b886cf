"""Batched tree search for MuZero-family agents.

Public API: :class:`Search` (plug-in interface), :class:`MuZeroSearch`, :class:`SearchOutput`,
:func:`select_action`, :class:`TreeArrays` and the :data:`RecurrentFn` callable type. The numba kernels
(:mod:`muzero_tune.mcts.kernels`) and the plain-Python reference (:mod:`muzero_tune.mcts.reference`, tests and
documentation only) are deliberately not re-exported.
"""

from muzero_tune.mcts.search import MuZeroSearch, RecurrentFn, Search, SearchOutput, select_action
from muzero_tune.mcts.tree import TreeArrays

__all__ = ["MuZeroSearch", "RecurrentFn", "Search", "SearchOutput", "TreeArrays", "select_action"]
