"""Numba kernels for the batched Stochastic MuZero tree (decision and chance nodes), one tree per batch row.

What this module owns
    The per-simulation tree arithmetic of :class:`muzero_tune.mcts.stochastic.StochasticMuZeroSearch`:
    root preparation, leaf selection (pUCT at decision nodes, chance-outcome selection at chance nodes),
    expansion + backup, root statistics. The plain-Python reference the tests compare against implements the
    same rules with the same float64 operation order, so visit counts agree bit for bit (no fastmath, no
    parallel, sequential sums). Randomness only from numba's RNG, seeded once per search by
    :func:`seed_rng`; numba's ``np.random.random`` / ``randint`` produce the same streams as numpy's legacy
    ``np.random.RandomState(seed)``, which is how the reference reproduces them.

The rules
    * Node kinds: ``0`` = decision node (a state; edges are actions, children are chance nodes), ``1`` =
      chance node (an afterstate; edges are chance codes, children are decision nodes). The root is a
      decision node. An edge into a chance node has no reward and no discount; an edge into a decision node
      carries the predicted reward and the discount.
    * ``d(node)`` = ``discount`` for a decision node, ``1`` for a chance node; the value of a node as seen
      from its parent is ``Q(node) = reward(node) + d(node) * value_sum(node) / visit_count(node)``.
    * Decision node with N visits: pUCT exactly as MuZero (``Q_norm(child) + prior * sqrt(N) / (1 + n) *
      (pb_c_init + log((N + pb_c_base + 1) / pb_c_base))``, Q_norm = 0 for unvisited children, min-max
      normalised with the ``value_delta_max`` floor, illegal root actions -inf, ties lowest index when
      deterministic else uniform among scores within 1e-9 of the max via ``randint``).
    * Chance node, ``chance_mode`` 0 (``"sample"``, the default): draw ``u = random()`` and take the first
      code whose running sum of priors (over codes with prior > 0, in index order) exceeds ``u`` (the last
      such code if rounding leaves none). One draw per chance node traversed, in the order trees
      (b = 0, 1, ...) and depths are visited. ``chance_mode`` 1 (``"prior_weighted"``): the deterministic
      quasi-random rule of the paper, ``argmax_c prior(c) / (1 + n(c))``, lowest index on ties, no draw.
    * Expansion: the new node's kind is the opposite of its parent's. Its priors are the softmax of the
      first ``num_actions`` (decision) or ``num_chances`` (chance) leaf logits; the rest are 0. Its reward
      is the staged leaf reward (the driver stages 0 for chance nodes).
    * Backup from leaf to root with ``G`` = leaf value: ``value_sum += G``, ``visit_count += 1``, for
      non-root nodes the min-max stats take ``Q(node)``, then ``G = reward(node) + d(node) * G``.
    * Root visit accounting as MuZero's: the root starts with 0 visits; the root value is the mean of the
      backed-up returns.

What it must never do
    Allocate per simulation, call Python/torch, or use randomness other than numba's seeded RNG.

Array layout (``Bc`` batch capacity, ``Nc`` node capacity, ``W = max(A, C)`` edge width):

    children    [Bc, Nc, W] int32    child node, -1 = not expanded
    prior       [Bc, Nc, W] float64  edge priors (decision: over A actions; chance: over C codes)
    kind        [Bc, Nc]    int8     0 decision, 1 chance
    visit_count [Bc, Nc] int32, value_sum [Bc, Nc] float64, reward [Bc, Nc] float64
    min_value, max_value [Bc] float64; root_legal [Bc, A] bool; scores [Bc, W] float64 (scratch)
    path [Bc, Nc] int32, path_len [Bc] int32; sel_parent, sel_action [Bc] int32; sel_kind [Bc] int8
    root_logits, root_noise [Bc, A] float64; leaf_reward, leaf_value [Bc] float64; leaf_logits [Bc, W] float64

Node numbering: root = node 0, the node expanded at simulation ``s`` is node ``s + 1`` in every tree.
"""

from __future__ import annotations

import math

import numba
import numpy as np

TIE_TOLERANCE = 1e-9
CHANCE_MODES = {"sample": 0, "prior_weighted": 1}
DECISION = 0
CHANCE = 1


@numba.njit(cache=True)
def seed_rng(seed):
    """Seed numba's RNG (chance sampling and random tie-breaks). ``seed``: int in [0, 2**32)."""
    np.random.seed(seed)


@numba.njit(cache=True)
def _normalise(q, lo, hi, value_delta_max):
    if hi > lo:
        span = hi - lo
        if span < value_delta_max:
            span = value_delta_max
        x = (q - lo) / span
        if x < 0.0:
            x = 0.0
        elif x > 1.0:
            x = 1.0
        return x
    return q


@numba.njit(cache=True)
def prepare_roots(children, prior, kind, visit_count, value_sum, reward, min_value, max_value, root_legal,
                  root_logits, root_noise, batch_size, num_nodes, num_actions, add_noise, noise_weight):
    """Reset nodes ``[0, num_nodes)`` of trees ``[0, batch_size)``; root = decision node with priors
    softmax(legal logits), mixed with the normalised Gamma draws when ``add_noise`` (as MuZero)."""
    width = children.shape[2]
    for b in range(batch_size):
        for n in range(num_nodes):
            for a in range(width):
                children[b, n, a] = -1
                prior[b, n, a] = 0.0
            visit_count[b, n] = 0
            value_sum[b, n] = 0.0
            reward[b, n] = 0.0
            kind[b, n] = DECISION
        min_value[b] = np.inf
        max_value[b] = -np.inf

        m = -np.inf
        for a in range(num_actions):
            if root_legal[b, a] and root_logits[b, a] > m:
                m = root_logits[b, a]
        total = 0.0
        for a in range(num_actions):
            if root_legal[b, a]:
                e = math.exp(root_logits[b, a] - m)
                prior[b, 0, a] = e
                total += e
        for a in range(num_actions):
            if root_legal[b, a]:
                prior[b, 0, a] = prior[b, 0, a] / total

        if add_noise:
            noise_total = 0.0
            num_legal = 0
            for a in range(num_actions):
                if root_legal[b, a]:
                    noise_total += root_noise[b, a]
                    num_legal += 1
            for a in range(num_actions):
                if root_legal[b, a]:
                    if noise_total > 0.0:
                        eta = root_noise[b, a] / noise_total
                    else:
                        eta = 1.0 / num_legal
                    prior[b, 0, a] = (1.0 - noise_weight) * prior[b, 0, a] + noise_weight * eta


@numba.njit(cache=True)
def select_leaves(children, prior, kind, visit_count, value_sum, reward, min_value, max_value, root_legal,
                  scores, path, path_len, sel_parent, sel_action, sel_kind, batch_size, num_actions,
                  num_chances, pb_c_base, pb_c_init, discount, value_delta_max, deterministic, chance_mode):
    """Descend every tree to an unexpanded edge (see the module rules); writes path, sel_parent,
    sel_action (action or chance code) and sel_kind (kind of sel_parent: which network call expands it)."""
    for b in range(batch_size):
        lo = min_value[b]
        hi = max_value[b]
        node = 0
        depth = 0
        path[b, 0] = 0
        while True:
            edge = -1
            if kind[b, node] == CHANCE:
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
            else:
                n_parent = visit_count[b, node]
                sqrt_n = math.sqrt(n_parent)
                pb_c = pb_c_init + math.log((n_parent + pb_c_base + 1.0) / pb_c_base)
                best_score = -np.inf
                second_score = -np.inf
                for a in range(num_actions):
                    if node == 0 and not root_legal[b, a]:
                        s = -np.inf
                    else:
                        child = children[b, node, a]
                        n_child = 0
                        q_norm = 0.0
                        if child >= 0:
                            n_child = visit_count[b, child]
                            d = discount if kind[b, child] == DECISION else 1.0
                            q = reward[b, child] + d * (value_sum[b, child] / n_child)
                            q_norm = _normalise(q, lo, hi, value_delta_max)
                        s = q_norm + prior[b, node, a] * sqrt_n / (1.0 + n_child) * pb_c
                    scores[b, a] = s
                    if s > best_score:
                        second_score = best_score
                        best_score = s
                        edge = a
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
                                edge = a
                                break
                            pick -= 1
            child = children[b, node, edge]
            if child < 0:
                break
            depth += 1
            path[b, depth] = child
            node = child
        path_len[b] = depth + 1
        sel_parent[b] = node
        sel_action[b] = edge
        sel_kind[b] = kind[b, node]


@numba.njit(cache=True)
def expand_and_backup(children, prior, kind, visit_count, value_sum, reward, min_value, max_value, path,
                      path_len, sel_parent, sel_action, sel_kind, leaf_reward, leaf_value, leaf_logits,
                      new_node, batch_size, num_actions, num_chances, discount):
    """Attach ``new_node`` at (sel_parent, sel_action) in every tree (kind opposite to its parent's) and back
    its value up to the root. leaf_reward / leaf_value [Bc], leaf_logits [Bc, W] (policy logits over A for a
    new decision node, chance logits over C for a new chance node)."""
    for b in range(batch_size):
        children[b, sel_parent[b], sel_action[b]] = new_node
        new_kind = CHANCE if sel_kind[b] == DECISION else DECISION
        kind[b, new_node] = new_kind
        reward[b, new_node] = leaf_reward[b]
        width = num_chances if new_kind == CHANCE else num_actions
        m = -np.inf
        for a in range(width):
            if leaf_logits[b, a] > m:
                m = leaf_logits[b, a]
        total = 0.0
        for a in range(width):
            e = math.exp(leaf_logits[b, a] - m)
            prior[b, new_node, a] = e
            total += e
        for a in range(width):
            prior[b, new_node, a] = prior[b, new_node, a] / total
        n = path_len[b]
        path[b, n] = new_node
        n += 1
        path_len[b] = n

        lo = min_value[b]
        hi = max_value[b]
        g = leaf_value[b]
        for i in range(n - 1, -1, -1):
            node = path[b, i]
            value_sum[b, node] += g
            visit_count[b, node] += 1
            r = reward[b, node]
            d = discount if kind[b, node] == DECISION else 1.0
            if i > 0:
                q = r + d * (value_sum[b, node] / visit_count[b, node])
                if q < lo:
                    lo = q
                if q > hi:
                    hi = q
            g = r + d * g
        min_value[b] = lo
        max_value[b] = hi


@numba.njit(cache=True)
def root_statistics(children, visit_count, value_sum, batch_size, num_actions, out_visit_counts,
                    out_root_value):
    """out_visit_counts[b, a] = visits of root action a (0 if unexpanded) [>=B, A] int32; out_root_value[b]
    = root value_sum / visit_count [>=B] float64."""
    for b in range(batch_size):
        for a in range(num_actions):
            child = children[b, 0, a]
            out_visit_counts[b, a] = visit_count[b, child] if child >= 0 else 0
        n_root = visit_count[b, 0]
        out_root_value[b] = value_sum[b, 0] / n_root if n_root > 0 else 0.0
