"""Numba kernels for the batched MuZero tree: one tree per batch element, all trees advanced in lockstep.

What this module owns
    The per-simulation tree arithmetic and nothing else: root preparation (masked softmax + Dirichlet mix),
    leaf selection (pUCT with min-max normalised Q), expansion + backup, and read-out of root statistics.
    The exact rules are documented (and implemented in plain Python) in :mod:`muzero_tune.mcts.reference`;
    these kernels must reproduce the reference visit counts bit for bit, so the floating-point operation
    order here is deliberately the same as there (float64 everywhere, sequential sums, no fastmath).

What it must never do
    * allocate per simulation: every kernel writes into the preallocated arrays of
      :class:`muzero_tune.mcts.tree.TreeArrays` (passed at full capacity plus a ``batch_size``, so the numba
      type signature never changes and each kernel compiles exactly once);
    * call Python, torch or the network, or draw randomness from anywhere but numba's own RNG, which the
      caller seeds once per search via :func:`seed_rng` (so a search is reproducible from a numpy Generator);
    * use ``fastmath`` / ``parallel``: both would reorder float operations and break bit-exact agreement with
      the reference.

Array layout shared by all kernels (``Bc`` = batch capacity, ``Nc`` = node capacity, ``A`` = num actions;
only rows ``b < batch_size`` and nodes ``n < num_nodes`` are touched):

    children     [Bc, Nc, A] int32    child node index, -1 = edge not expanded yet
    prior        [Bc, Nc, A] float64  prior of each outgoing edge (root: after legal mask and noise)
    visit_count  [Bc, Nc]    int32    number of backups through the node
    value_sum    [Bc, Nc]    float64  sum of backed-up returns (discounted from the node onward)
    reward       [Bc, Nc]    float64  reward predicted on the edge *into* the node (root: 0)
    min_value    [Bc]        float64  min-max stats of the tree (+inf while nothing recorded)
    max_value    [Bc]        float64  (-inf while nothing recorded)
    root_legal   [Bc, A]     bool     legal mask, applied at the root only
    scores       [Bc, A]     float64  scratch: pUCT scores at the node being descended
    path         [Bc, Nc]    int32    node indices root..leaf of the current simulation
    path_len     [Bc]        int32    number of valid entries in ``path``
    sel_parent   [Bc]        int32    node whose unexpanded edge was selected
    sel_action   [Bc]        int32    the selected edge (action) at ``sel_parent``

Node numbering: root = node 0; the node expanded at simulation ``s`` (0-based) is node ``s + 1`` in every
tree.
"""

from __future__ import annotations

import math

import numba
import numpy as np

# Scores within this distance of the maximum count as tied under the random tie-break.
TIE_TOLERANCE = 1e-9


@numba.njit(cache=True)
def seed_rng(seed):
    """Seed numba's internal RNG (used only for random tie-breaks). ``seed``: int in [0, 2**32)."""
    np.random.seed(seed)


@numba.njit(cache=True)
def _normalise(q, lo, hi, value_delta_max):
    """Min-max normalise ``q``; unchanged while ``hi <= lo`` (MuZero paper). Span floored at value_delta_max
    so that near-constant value estimates do not blow tiny differences up to the full [0, 1] range.
    Scalars only: helpers taking arrays would pay numba's atomic refcounting on every call."""
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
def prepare_roots(children, prior, visit_count, value_sum, reward, min_value, max_value, root_legal,
                  root_logits, root_noise, batch_size, num_nodes, add_noise, noise_weight):
    """Reset nodes ``[0, num_nodes)`` of trees ``[0, batch_size)`` and set the root priors.

    root_logits: [Bc, A] float64 policy logits of the root; root_legal: [Bc, A] bool (already staged, every
    row has at least one legal action); root_noise: [Bc, A] float64 raw Gamma(alpha, 1) draws (only read when
    ``add_noise``; normalising them over the legal actions gives a Dirichlet(alpha) sample on that face).
    Root priors = softmax over legal actions (illegal exactly 0), then (1 - w) * prior + w * noise.
    """
    num_actions = children.shape[2]
    for b in range(batch_size):
        for n in range(num_nodes):
            for a in range(num_actions):
                children[b, n, a] = -1
            visit_count[b, n] = 0
            value_sum[b, n] = 0.0
            reward[b, n] = 0.0
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
            else:
                prior[b, 0, a] = 0.0
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
                    # All-zero Gamma draws (possible only through underflow) fall back to uniform noise.
                    if noise_total > 0.0:
                        eta = root_noise[b, a] / noise_total
                    else:
                        eta = 1.0 / num_legal
                    prior[b, 0, a] = (1.0 - noise_weight) * prior[b, 0, a] + noise_weight * eta


@numba.njit(cache=True)
def select_leaves(children, prior, visit_count, value_sum, reward, min_value, max_value, root_legal, scores,
                  path, path_len, sel_parent, sel_action, batch_size, pb_c_base, pb_c_init, discount,
                  value_delta_max, deterministic):
    """Descend every tree from the root by pUCT until an unexpanded edge is chosen.

    Writes path[b, :path_len[b]] (root .. parent), sel_parent[b] and sel_action[b] for b < batch_size;
    scores: [Bc, A] float64 scratch. The caller reads sel_parent / sel_action ([Bc] int32) to gather parent
    latents and call the network.

    Score of edge a at a node with N visits: Q_norm(child) + prior * sqrt(N) / (1 + n_child) *
    (pb_c_init + log((N + pb_c_base + 1) / pb_c_base)), Q_norm = 0 for unvisited children; at the root
    illegal edges score -inf. Ties: lowest index if ``deterministic``, else uniform (numba RNG) among the
    edges within TIE_TOLERANCE of the max. The score loop is written out here rather than in a helper
    taking arrays because numba increments/decrements array refcounts (atomics) on every such call.
    """
    num_actions = children.shape[2]
    for b in range(batch_size):
        lo = min_value[b]
        hi = max_value[b]
        node = 0
        depth = 0
        path[b, 0] = 0
        while True:
            n_parent = visit_count[b, node]
            sqrt_n = math.sqrt(n_parent)
            pb_c = pb_c_init + math.log((n_parent + pb_c_base + 1.0) / pb_c_base)
            best_score = -np.inf
            second_score = -np.inf
            action = -1
            for a in range(num_actions):
                if node == 0 and not root_legal[b, a]:
                    s = -np.inf
                else:
                    child = children[b, node, a]
                    n_child = 0
                    q_norm = 0.0
                    if child >= 0:
                        n_child = visit_count[b, child]
                        q = reward[b, child] + discount * (value_sum[b, child] / n_child)
                        q_norm = _normalise(q, lo, hi, value_delta_max)
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
                # Random tie-break among the edges within TIE_TOLERANCE of the max (illegal ones are -inf).
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
            child = children[b, node, action]
            if child < 0:
                break
            depth += 1
            path[b, depth] = child
            node = child
        path_len[b] = depth + 1
        sel_parent[b] = node
        sel_action[b] = action


@numba.njit(cache=True)
def expand_and_backup(children, prior, visit_count, value_sum, reward, min_value, max_value, path, path_len,
                      sel_parent, sel_action, leaf_reward, leaf_value, leaf_logits, new_node, batch_size,
                      discount):
    """Attach node ``new_node`` at (sel_parent, sel_action) in every tree and back its value up to the root.

    leaf_reward: [Bc] float64, leaf_value: [Bc] float64, leaf_logits: [Bc, A] float64 (network outputs for
    the new nodes). Backup from leaf to root: value_sum += G, visit_count += 1, min-max update with
    reward + discount * mean value for non-root nodes, then G = reward + discount * G.
    """
    num_actions = children.shape[2]
    for b in range(batch_size):
        children[b, sel_parent[b], sel_action[b]] = new_node
        reward[b, new_node] = leaf_reward[b]
        # Priors of the new node: softmax over all actions (inside the tree every action is legal).
        m = -np.inf
        for a in range(num_actions):
            if leaf_logits[b, a] > m:
                m = leaf_logits[b, a]
        total = 0.0
        for a in range(num_actions):
            e = math.exp(leaf_logits[b, a] - m)
            prior[b, new_node, a] = e
            total += e
        for a in range(num_actions):
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
            if i > 0:
                q = r + discount * (value_sum[b, node] / visit_count[b, node])
                if q < lo:
                    lo = q
                if q > hi:
                    hi = q
            g = r + discount * g
        min_value[b] = lo
        max_value[b] = hi


@numba.njit(cache=True)
def root_statistics(children, visit_count, value_sum, batch_size, out_visit_counts, out_root_value):
    """out_visit_counts[b, a] = visits of root child a (0 if unexpanded), [>=batch_size, A] int32;
    out_root_value[b] = root value_sum / root visit_count, [>=batch_size] float64."""
    num_actions = children.shape[2]
    for b in range(batch_size):
        for a in range(num_actions):
            child = children[b, 0, a]
            out_visit_counts[b, a] = visit_count[b, child] if child >= 0 else 0
        n_root = visit_count[b, 0]
        out_root_value[b] = value_sum[b, 0] / n_root if n_root > 0 else 0.0
