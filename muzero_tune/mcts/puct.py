"""MuZero's selection rule (pUCT over min-max normalised Q) and the descent for decision and chance nodes.

What this module owns
    :func:`puct_edge`, the pUCT choice at one decision node, and :func:`select_leaves`, the batched descent
    that MuZero's and Stochastic MuZero's searches share: pUCT at decision nodes, the chance rule of
    :mod:`muzero_tune.mcts.chance` at chance nodes, until an unexpanded edge. Everything else (priors, the
    root's counted visit, backup, min-max, Q normalisation) is the shared core in
    :mod:`muzero_tune.mcts.kernels`; the plain-Python specification is :mod:`muzero_tune.mcts.reference`.

The rule
    Score of edge ``a`` at a decision node with ``N`` visits (the root's include its counted first visit):
    ``Q_norm(child) + prior(a) * sqrt(N) / (1 + n(a)) * (pb_c_init + log((N + pb_c_base + 1) / pb_c_base))``,
    ``Q_norm = normalise(Q(child))`` for a visited child; for an unvisited one either 0, the bottom of the
    span (``UNVISITED_MIN``: the MuZero paper's pseudocode, mctx's ``qtransform_by_parent_and_siblings``),
    or ``normalise(v(node))``, the node's own mean value ``value_sum / visit_count`` (``UNVISITED_PARENT``:
    an untried action is assumed worth what the state is worth so far; the reference system uses its
    visited children's mean Q). Illegal root edges score -inf.

    The span ``normalise`` uses (``q_transform``): ``Q_TREE_MIN_MAX``, the tree's min-max stats (every Q
    backed up in this tree, the root's own value included; :mod:`muzero_tune.mcts.kernels`), or
    ``Q_PARENT_AND_SIBLINGS``, per node: the node's own mean value and its visited children's Qs (mctx's
    ``qtransform_by_parent_and_siblings``, with ``value_delta_max`` as its epsilon). Both spans contain the
    node's value, so a child better than the state so far normalises above an unvisited sibling's 0 on
    every reward scale.
    Ties: lowest index if ``deterministic``, else uniform (numba RNG) among the edges within
    ``TIE_TOLERANCE`` of the maximum.

What it must never do
    Allocate per simulation, call Python/torch, or use randomness other than numba's seeded RNG.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from muzero_tune.mcts.chance import chance_edge
from muzero_tune.mcts.kernels import CHANCE, TIE_TOLERANCE, end_descent, node_discount, normalise

# The Q an unvisited child is scored with (``unvisited_q`` of the kernels): 0 after normalisation, or the
# normalised mean value of the node it hangs from.
UNVISITED_MIN = 0
UNVISITED_PARENT = 1
UNVISITED_Q = {"min": UNVISITED_MIN, "parent": UNVISITED_PARENT}

# The range a child's Q is normalised over (``q_transform`` of the kernels): the tree's min-max stats, or the
# node's own value and its visited children's Qs (mctx's ``qtransform_by_parent_and_siblings``).
Q_TREE_MIN_MAX = 0
Q_PARENT_AND_SIBLINGS = 1
Q_TRANSFORM = {"tree_min_max": Q_TREE_MIN_MAX, "parent_and_siblings": Q_PARENT_AND_SIBLINGS}

# fmt: off
# The kernels take every tree array explicitly (numba compiles one signature per kernel); one argument per
# line would make each signature and call 20-30 lines long, so the formatter leaves this module as written.

@numba.njit(cache=True, _nrt=False, inline="always")
def parent_and_siblings(children, kind, visit_count, value_sum, reward, b, node, num_actions, discount,
                        chance_edges):
    """(lo, hi): the range of decision node ``node``'s own mean value and its visited children's Qs."""
    lo = value_sum[b, node] / visit_count[b, node]
    hi = lo
    for a in range(num_actions):
        child = children[b, node, a]
        if child >= 0:
            d = node_discount(kind, b, child, discount, chance_edges)
            q = reward[b, child] + d * (value_sum[b, child] / visit_count[b, child])
            if q < lo:
                lo = q
            if q > hi:
                hi = q
    return lo, hi


@numba.njit(cache=True, _nrt=False, inline="always")
def puct_edge(children, prior, kind, visit_count, value_sum, reward, root_legal, scores, b, node, lo, hi,
              num_actions, pb_c_base, pb_c_init, discount, value_delta_max, deterministic, chance_edges,
              unvisited_q, q_transform):
    """The pUCT edge at decision node ``node`` of tree ``b`` (module rule); scores [Bc, W] is scratch.
    (lo, hi): the tree's min-max stats, read only under ``Q_TREE_MIN_MAX``."""
    if q_transform == Q_PARENT_AND_SIBLINGS:
        lo, hi = parent_and_siblings(children, kind, visit_count, value_sum, reward, b, node, num_actions,
                                     discount, chance_edges)
    n_parent = visit_count[b, node]
    sqrt_n = math.sqrt(n_parent)
    pb_c = pb_c_init + math.log((n_parent + pb_c_base + 1.0) / pb_c_base)
    q_unvisited = 0.0
    if unvisited_q == UNVISITED_PARENT:
        q_unvisited = normalise(value_sum[b, node] / n_parent, lo, hi, value_delta_max)
    best_score = -np.inf
    second_score = -np.inf
    action = -1
    for a in range(num_actions):
        if node == 0 and not root_legal[b, a]:
            s = -np.inf
        else:
            child = children[b, node, a]
            n_child = 0
            q_norm = q_unvisited
            if child >= 0:
                n_child = visit_count[b, child]
                d = node_discount(kind, b, child, discount, chance_edges)
                q = reward[b, child] + d * (value_sum[b, child] / n_child)
                q_norm = normalise(q, lo, hi, value_delta_max)
            # Left-to-right order matches the reference: prior * sqrt(N) / (1 + n) * c.
            s = q_norm + prior[b, node, a] * sqrt_n / (1.0 + n_child) * pb_c
        scores[b, a] = s
        if s > best_score:  # strict: the lowest index wins exact ties
            second_score = best_score
            best_score = s
            action = a
        elif s > second_score:
            second_score = s
    if not deterministic and second_score >= best_score - TIE_TOLERANCE:
        threshold = best_score - TIE_TOLERANCE
        num_tied = 0
        for a in range(num_actions):
            if scores[b, a] >= threshold:
                num_tied += 1
        pick = np.random.randint(0, num_tied)
        for a in range(num_actions):
            if scores[b, a] >= threshold:
                if pick == 0:
                    action = a
                    break
                pick -= 1
    return action


def _make_select_leaves(chance_edges):
    """The descent kernel with the chance-edge rule compiled in: ``chance_edges`` is a compile-time constant,
    so MuZero's kernel carries no chance branch at all; each variant is cached on its own."""

    @numba.njit(cache=True, _nrt=False)
    def select_leaves(children, prior, kind, visit_count, value_sum, reward, min_value, max_value,
                      root_legal, scores, path, path_len, sel_parent, sel_action, sel_kind, batch_size,
                      num_actions, num_chances, pb_c_base, pb_c_init, discount, value_delta_max,
                      deterministic, chance_mode, unvisited_q, q_transform):
        """Descend every tree from the root until an unexpanded edge is chosen.

        Writes path[b, :path_len[b]] (root .. parent), sel_parent[b], sel_action[b] and sel_kind[b] (the kind
        of sel_parent: which network call expands the edge) for b < batch_size. ``unvisited_q``: one of
        :data:`UNVISITED_Q`'s values; ``q_transform``: one of :data:`Q_TRANSFORM`'s. Without chance edges
        every node is a decision node and the chance rule is not compiled in.
        """
        for b in range(batch_size):
            lo = min_value[b]
            hi = max_value[b]
            node = 0
            depth = 0
            path[b, 0] = 0
            while True:
                if chance_edges and kind[b, node] == CHANCE:
                    edge = chance_edge(children, prior, visit_count, b, node, num_chances, chance_mode)
                else:
                    edge = puct_edge(children, prior, kind, visit_count, value_sum, reward, root_legal,
                                     scores, b, node, lo, hi, num_actions, pb_c_base, pb_c_init, discount,
                                     value_delta_max, deterministic, chance_edges, unvisited_q,
                                     q_transform)
                child = children[b, node, edge]
                if child < 0:
                    break
                depth += 1
                path[b, depth] = child
                node = child
            end_descent(path_len, sel_parent, sel_action, sel_kind, kind, b, node, depth, edge)

    return select_leaves


select_leaves = _make_select_leaves(False)  # MuZero, Sampled MuZero: decision nodes only
select_leaves_chance = _make_select_leaves(True)  # Stochastic MuZero: decision and chance nodes
