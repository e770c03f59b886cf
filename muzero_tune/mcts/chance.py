"""The chance-outcome rule of Stochastic MuZero's search (Antonoglou et al. 2022), as a numba piece.

What this module owns
    How a chance node (an afterstate; its edges are chance codes, its children decision nodes) picks the
    edge a simulation follows. :func:`muzero_tune.mcts.puct.select_leaves` calls it at chance nodes; the
    backup's chance-edge rule (no reward, no discount into a chance node) is in
    :mod:`muzero_tune.mcts.kernels`.

The rule
    * ``chance_mode`` 0 (``"sample"``, the default): draw ``u = random()`` from numba's seeded RNG and take
      the first code whose running sum of priors (over codes with prior > 0, in index order) exceeds ``u``
      (the last such code if rounding leaves none). One draw per chance node traversed, in the order trees
      (b = 0, 1, ...) and depths are visited. numba's streams after ``np.random.seed(seed)`` equal numpy's
      legacy ``RandomState(seed)``, which is how the reference reproduces them.
    * ``chance_mode`` 1 (``"prior_weighted"``): the paper's deterministic quasi-random rule
      ``argmax_c prior(c) / (1 + n(c))``, lowest index on ties, no draw.

What it must never do
    Allocate, or draw randomness other than numba's seeded RNG.
"""

from __future__ import annotations

import numba
import numpy as np

# fmt: off
# The kernels take every tree array explicitly (numba compiles one signature per kernel); one argument per
# line would make each signature and call 20-30 lines long, so the formatter leaves this module as written.

CHANCE_MODES = {"sample": 0, "prior_weighted": 1}


@numba.njit(cache=True, _nrt=False, inline="always")
def chance_edge(children, prior, visit_count, b, node, num_chances, chance_mode):
    """The chance code a simulation follows at chance node ``node`` of tree ``b`` (module rule)."""
    edge = -1
    if chance_mode == 0:
        u = np.random.random()
        cum = 0.0
        last = -1
        for c in range(num_chances):
            p = prior[b, node, c]
            if p > 0.0:
                cum += p
                last = c
                if u < cum:
                    edge = c
                    break
        if edge < 0:
            edge = last
    else:
        best = -np.inf
        for c in range(num_chances):
            child = children[b, node, c]
            n_child = visit_count[b, child] if child >= 0 else 0
            s = prior[b, node, c] / (1.0 + n_child)
            if s > best:
                best = s
                edge = c
    return edge
