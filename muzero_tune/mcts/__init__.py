"""Batched tree search for MuZero-family agents.

Public API: :class:`Search` (plug-in interface), :class:`TreeSearch` (the batched loop variants specialise),
:class:`MuZeroSearch`, :class:`SearchOutput`, :func:`select_action`, :class:`TreeArrays` and the
:data:`RecurrentFn` callable type. Gumbel and Stochastic MuZero's searches are in :mod:`.gumbel` and
:mod:`.stochastic`.

Layers (mctx's shape: one backup and one Q transform that every variant shares, each variant a small rule)::

    shared core      kernels.py         normalise, root priors + noise + the root's counted first visit,
                                        expansion + backup (values, visits, min-max, discount, the
                                        chance-edge flag), root statistics (numba, inline="always" pieces)
    variant rules    puct.py            MuZero's pUCT; the descent through decision and chance nodes
                     chance.py          the chance-outcome rule (Stochastic MuZero)
                     gumbel_kernels.py  considered set, completed-Q sigma, sequential halving, improved policy
    storage          tree.py            TreeArrays: every variant's preallocated arrays (Gumbel adds fields)
    drivers          search.py          Search, TreeSearch (stage -> prepare -> per simulation: select, one
                                        batched network call, backup -> outputs), MuZeroSearch
                     stochastic.py      MuZeroSearch + chance edges, one network call per edge kind
                     gumbel.py          TreeSearch + Gumbel noise, rules and read-out
    specification    reference.py       plain-Python searches sharing one root preparation and one backup

Which tests pin which rule:

* ``tests/test_search_rules.py`` -- hand-worked MuZero trees derived from the published formulas: the first
  simulation follows the prior (root's counted visit), min-max with the root's own value, discount, rewards;
  the chance-node search shares the root rule.
* ``tests/test_search_scale.py`` -- every pUCT search (MuZero, chance nodes, sampled) follows its values on
  every reward scale and sign, and its visits are unchanged by shifting or scaling rewards and values.
* ``tests/test_puct_vs_mctx.py`` -- the per-node Q transform (``q_transform="parent_and_siblings"``) against
  ``mctx.muzero_policy`` with ``qtransform_by_parent_and_siblings`` (visit counts, executed action).
* ``tests/test_gumbel_vs_mctx.py`` -- Gumbel against ``mctx.gumbel_muzero_policy`` (visit counts, executed
  action, improved policy): per-node completed-Q rescaling, sequential halving, most-visited final action.
* ``tests/test_mcts.py``, ``tests/test_sampled_search.py``, ``tests/test_factored_actions.py``,
  ``tests/test_policy_stochastic_muzero.py``, ``tests/test_policy_gumbel_muzero.py``
  -- kernels equal :mod:`.reference` bit for bit (batch independence, masks, ties, noise, chance sampling
  frequencies), plus a hand-computed Gumbel tree and the visit schedule table.

The numba kernels and the plain-Python reference (tests and documentation only) are deliberately not
re-exported.
"""

from muzero_tune.mcts.search import MuZeroSearch, RecurrentFn, Search, SearchOutput, TreeSearch, select_action
from muzero_tune.mcts.tree import TreeArrays

__all__ = [
    "MuZeroSearch",
    "RecurrentFn",
    "Search",
    "SearchOutput",
    "TreeArrays",
    "TreeSearch",
    "select_action",
]
