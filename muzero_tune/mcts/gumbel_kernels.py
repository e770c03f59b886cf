"""Numba kernels for the batched Gumbel MuZero tree (Danihelka et al. 2022): one tree per batch element,
all trees advanced in lockstep, like :mod:`muzero_tune.mcts.kernels`.

What this module owns
    The per-simulation tree arithmetic of Gumbel MuZero: root preparation (Gumbel-top-k of the considered
    actions and the sequential-halving state), leaf selection (sequential halving at the root, the
    deterministic improved-policy rule inside the tree), expansion + backup, and the root read-out
    (completed Q-values, improved policy, the selected action). The rules are written out in
    :func:`muzero_tune.mcts.gumbel.reference_gumbel_search` (plain Python); these kernels reproduce it, and
    the floating-point operation order is the same there (float64, sequential sums, no fastmath).

What it must never do
    Allocate per simulation, call Python/torch/the network, or draw randomness (the Gumbel noise is drawn by
    the driver from the caller's Generator and staged in ``gumbel``; every tie is broken by the lowest
    action index, so the search is deterministic given that noise).

Array layout (``Bc`` batch capacity, ``Nc`` node capacity, ``A`` actions; see
:class:`muzero_tune.mcts.gumbel.GumbelTreeArrays`):

    children       [Bc, Nc, A] int32    child node, -1 = edge not expanded
    logits         [Bc, Nc, A] float64  policy logits of each node (root: raw, masked by root_legal on use)
    prior          [Bc, Nc, A] float64  softmax of the logits (root: over the legal actions, illegal 0)
    visit_count    [Bc, Nc]    int32    backups through the node
    value_sum      [Bc, Nc]    float64  sum of backed-up returns
    reward         [Bc, Nc]    float64  reward on the edge into the node (root 0)
    raw_value      [Bc, Nc]    float64  the network's value of the node (v_hat, used by the mixed value)
    min_value      [Bc]        float64  min-max stats: seeded with the root's network value, then every
    max_value      [Bc]        float64  non-root node's Q = reward + discount * mean value at backup
    root_legal     [Bc, A]     bool
    gumbel         [Bc, A]     float64  root Gumbel noise g (0 when evaluating)
    considered     [Bc, A]     bool     the Gumbel-top-k actions
    survivor       [Bc, A]     bool     the actions still in sequential halving
    num_considered [Bc] int32; num_survivors [Bc] int32; phase [Bc] int32;
    phase_target   [Bc] int32  visit count every survivor reaches by the end of the current phase
    cq, sigma, scores [Bc, A] float64  scratch (completed Q, sigma, scores)
    path [Bc, Nc] int32; path_len, sel_parent, sel_action [Bc] int32
    root_trace     [Bc, Nc] int32   root action of each simulation (for tests / diagnostics)
    phase_trace    [Bc, Nc] int32   sequential-halving phase of each simulation

Sequential-halving schedule (k = num considered, S = num simulations, P = ceil(log2 k)): phase p has n_p
survivors (n_0 = k, n_{p+1} = max(2, n_p // 2); only n_p > 2 halves) and each survivor gets
v_p = max(1, S // (P * n_p)) visits in it; phases continue (n stays 2) until the budget is spent, so the
last phase may be cut short. Within a phase the survivor with the fewest visits goes next (ties: higher
score g + logits + sigma(q_hat), then lower index). At a phase end the survivors are re-ranked by that
score and the top n_{p+1} kept. k = 1: the single action gets every simulation.
"""

from __future__ import annotations

import math

import numba
import numpy as np

TINY = 1e-30  # floor of the visited prior mass in the mixed value


@numba.njit(cache=True)
def phase_visits(num_considered, num_survivors, num_simulations):
    """Visits each survivor gets in a phase with ``num_survivors`` survivors (k = num_considered)."""
    if num_considered <= 1:
        return num_simulations
    log2max = 0
    while (1 << log2max) < num_considered:
        log2max += 1
    v = num_simulations // (log2max * num_survivors)
    return v if v > 1 else 1


@numba.njit(cache=True, inline="always")
def normalise(q, lo, hi, value_delta_max):
    """(q - lo) / max(hi - lo, value_delta_max), clipped to [0, 1]; 0 when that span is 0."""
    span = hi - lo
    if span < value_delta_max:
        span = value_delta_max
    if span <= 0.0:
        return 0.0
    x = (q - lo) / span
    if x < 0.0:
        x = 0.0
    elif x > 1.0:
        x = 1.0
    return x


@numba.njit(cache=True, inline="always")
def completed_sigma(children, prior, visit_count, value_sum, reward, raw_value, root_legal, cq, sigma, b,
                    node, lo, hi, discount, value_delta_max, c_visit, c_scale):
    """For every edge of ``node`` (legal edges at the root, all inside the tree) write the completed Q
    ``cq[b]`` (visited: reward + discount * mean value of the child; unvisited: the mixed value, with the
    node's prior probabilities ``prior[b, node]``) and ``sigma[b] = (c_visit + max_a N(a)) * c_scale *
    q_hat`` (q_hat = min-max normalised completed Q). Illegal root edges get cq 0, sigma -inf.
    Returns sum_a N(a). Inlined into its callers (no per-call array refcounting)."""
    num_actions = children.shape[2]
    is_root = node == 0
    sum_n = 0
    max_n = 0
    sum_p = 0.0
    sum_pq = 0.0
    for a in range(num_actions):
        child = children[b, node, a]
        if child >= 0:
            n = visit_count[b, child]
            q = reward[b, child] + discount * (value_sum[b, child] / n)
            cq[b, a] = q
            sum_n += n
            if n > max_n:
                max_n = n
            sum_p += prior[b, node, a]
            sum_pq += prior[b, node, a] * q
    if sum_n == 0:
        v_mix = raw_value[b, node]
    else:
        if sum_p < TINY:
            sum_p = TINY
        v_mix = (raw_value[b, node] + (sum_n / sum_p) * sum_pq) / (1.0 + sum_n)
    scale = (c_visit + max_n) * c_scale
    for a in range(num_actions):
        if is_root and not root_legal[b, a]:
            cq[b, a] = 0.0
            sigma[b, a] = -np.inf
        else:
            if children[b, node, a] < 0:
                cq[b, a] = v_mix
            sigma[b, a] = scale * normalise(cq[b, a], lo, hi, value_delta_max)
    return sum_n


@numba.njit(cache=True)
def prepare_roots(children, logits, prior, visit_count, value_sum, reward, raw_value, min_value, max_value,
                  root_legal, root_logits, root_value, gumbel, considered, survivor, num_considered,
                  num_survivors, phase, phase_target, batch_size, num_nodes, max_considered, num_simulations):
    """Reset nodes ``[0, num_nodes)`` of trees ``[0, batch_size)``, set the root (logits, network value,
    min-max seeded with that value) and pick the considered actions: the top min(max_considered, #legal) legal
    actions by gumbel + logits (ties: lowest index). They start as the survivors of phase 0."""
    num_actions = children.shape[2]
    for b in range(batch_size):
        for n in range(num_nodes):
            for a in range(num_actions):
                children[b, n, a] = -1
            visit_count[b, n] = 0
            value_sum[b, n] = 0.0
            reward[b, n] = 0.0
            raw_value[b, n] = 0.0
        raw_value[b, 0] = root_value[b]
        min_value[b] = root_value[b]
        max_value[b] = root_value[b]
        num_legal = 0
        for a in range(num_actions):
            logits[b, 0, a] = root_logits[b, a]
            considered[b, a] = False
            if root_legal[b, a]:
                num_legal += 1
        # root prior: softmax of the legal logits (illegal exactly 0)
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
            prior[b, 0, a] = prior[b, 0, a] / total
        k = max_considered if max_considered < num_legal else num_legal
        for _ in range(k):
            best = -np.inf
            pick = -1
            for a in range(num_actions):
                if root_legal[b, a] and not considered[b, a]:
                    s = gumbel[b, a] + root_logits[b, a]
                    if pick < 0 or s > best:
                        best = s
                        pick = a
            considered[b, pick] = True
        for a in range(num_actions):
            survivor[b, a] = considered[b, a]
        num_considered[b] = k
        num_survivors[b] = k
        phase[b] = 0
        phase_target[b] = phase_visits(k, k, num_simulations)


@numba.njit(cache=True)
def select_leaves(children, logits, prior, visit_count, value_sum, reward, raw_value, min_value, max_value,
                  root_legal, gumbel, survivor, num_considered, num_survivors, phase, phase_target, cq, sigma,
                  scores, path, path_len, sel_parent, sel_action, root_trace, phase_trace, sim,
                  batch_size, num_simulations, discount, value_delta_max, c_visit, c_scale):
    """Descend every tree: sequential halving at the root (advancing the phase first when every survivor
    has its phase visits), then argmax_a(pi'(a) - N(a) / (1 + sum N)) inside the tree, until an unexpanded
    edge. Writes path/path_len/sel_parent/sel_action and root_trace/phase_trace[b, sim]."""
    num_actions = children.shape[2]
    for b in range(batch_size):
        lo = min_value[b]
        hi = max_value[b]
        completed_sigma(children, prior, visit_count, value_sum, reward, raw_value, root_legal, cq, sigma, b,
                        0, lo, hi, discount, value_delta_max, c_visit, c_scale)
        for a in range(num_actions):
            if survivor[b, a]:
                scores[b, a] = gumbel[b, a] + logits[b, 0, a] + sigma[b, a]
            else:
                scores[b, a] = -np.inf
        target = phase_target[b]
        phase_done = True
        for a in range(num_actions):
            if survivor[b, a]:
                child = children[b, 0, a]
                n = visit_count[b, child] if child >= 0 else 0
                if n < target:
                    phase_done = False
                    break
        if phase_done:
            n_surv = num_survivors[b]
            if n_surv > 2:
                n_next = n_surv // 2
                if n_next < 2:
                    n_next = 2
                # keep the top n_next survivors by score (ties: lowest index): rank each one (cq is scratch
                # here, the root's completed Q is no longer needed), then drop those ranked n_next or worse
                for a in range(num_actions):
                    if survivor[b, a]:
                        rank = 0
                        for a2 in range(num_actions):
                            if survivor[b, a2] and (
                                scores[b, a2] > scores[b, a] or (scores[b, a2] == scores[b, a] and a2 < a)
                            ):
                                rank += 1
                        cq[b, a] = rank
                for a in range(num_actions):
                    if survivor[b, a] and cq[b, a] >= n_next:
                        survivor[b, a] = False
                        scores[b, a] = -np.inf
                num_survivors[b] = n_next
                n_surv = n_next
            phase[b] += 1
            target += phase_visits(num_considered[b], n_surv, num_simulations)
            phase_target[b] = target
        # the survivor with the fewest visits (below the phase target); ties: higher score, then lower index
        action = -1
        best_n = 0
        best_s = -np.inf
        for a in range(num_actions):
            if survivor[b, a]:
                child = children[b, 0, a]
                n = visit_count[b, child] if child >= 0 else 0
                if n < target:
                    if action < 0 or n < best_n or (n == best_n and scores[b, a] > best_s):
                        action = a
                        best_n = n
                        best_s = scores[b, a]
        root_trace[b, sim] = action
        phase_trace[b, sim] = phase[b]
        node = 0
        depth = 0
        path[b, 0] = 0
        child = children[b, 0, action]
        while child >= 0:
            depth += 1
            path[b, depth] = child
            node = child
            sum_n = completed_sigma(children, prior, visit_count, value_sum, reward, raw_value, root_legal,
                                    cq, sigma, b, node, lo, hi, discount, value_delta_max, c_visit, c_scale)
            # improved policy pi' = softmax(logits + sigma) over all actions
            m = -np.inf
            for a in range(num_actions):
                z = logits[b, node, a] + sigma[b, a]
                scores[b, a] = z
                if z > m:
                    m = z
            total = 0.0
            for a in range(num_actions):
                e = math.exp(scores[b, a] - m)
                scores[b, a] = e
                total += e
            action = -1
            best = -np.inf
            for a in range(num_actions):
                c = children[b, node, a]
                n = visit_count[b, c] if c >= 0 else 0
                s = scores[b, a] / total - n / (1.0 + sum_n)
                if action < 0 or s > best:
                    best = s
                    action = a
            child = children[b, node, action]
        path_len[b] = depth + 1
        sel_parent[b] = node
        sel_action[b] = action


@numba.njit(cache=True)
def expand_and_backup(children, logits, prior, visit_count, value_sum, reward, raw_value, min_value,
                      max_value, path, path_len, sel_parent, sel_action, leaf_reward, leaf_value, leaf_logits,
                      new_node, batch_size, discount):
    """Attach node ``new_node`` at (sel_parent, sel_action) in every tree (reward, logits, network value) and
    back its value up: value_sum += G, visit_count += 1, min-max update with reward + discount * mean value
    for non-root nodes, G = reward + discount * G."""
    num_actions = children.shape[2]
    for b in range(batch_size):
        children[b, sel_parent[b], sel_action[b]] = new_node
        reward[b, new_node] = leaf_reward[b]
        raw_value[b, new_node] = leaf_value[b]
        m = -np.inf
        for a in range(num_actions):
            logits[b, new_node, a] = leaf_logits[b, a]
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
def root_outputs(children, logits, prior, visit_count, value_sum, reward, raw_value, min_value, max_value,
                 root_legal, gumbel, survivor, cq, sigma, batch_size, discount, value_delta_max,
                 c_visit, c_scale, out_visits, out_root_value, out_completed_q, out_improved, out_selected):
    """Root read-out: visit counts [B, A] int32, root value (value_sum / visits) [B], completed Q [B, A]
    (illegal 0), improved policy softmax(logits + sigma(completed Q)) over the legal actions [B, A], and the
    selected action = argmax over the last survivors of g + logits + sigma (ties: lowest index) [B]."""
    num_actions = children.shape[2]
    for b in range(batch_size):
        completed_sigma(children, prior, visit_count, value_sum, reward, raw_value, root_legal, cq, sigma, b,
                        0, min_value[b], max_value[b], discount, value_delta_max, c_visit, c_scale)
        m = -np.inf
        for a in range(num_actions):
            child = children[b, 0, a]
            out_visits[b, a] = visit_count[b, child] if child >= 0 else 0
            out_completed_q[b, a] = cq[b, a]
            if root_legal[b, a]:
                z = logits[b, 0, a] + sigma[b, a]
                if z > m:
                    m = z
        total = 0.0
        for a in range(num_actions):
            if root_legal[b, a]:
                e = math.exp(logits[b, 0, a] + sigma[b, a] - m)
                out_improved[b, a] = e
                total += e
            else:
                out_improved[b, a] = 0.0
        for a in range(num_actions):
            out_improved[b, a] = out_improved[b, a] / total
        pick = -1
        best = -np.inf
        for a in range(num_actions):
            if survivor[b, a]:
                s = gumbel[b, a] + logits[b, 0, a] + sigma[b, a]
                if pick < 0 or s > best:
                    best = s
                    pick = a
        out_selected[b] = pick
        n_root = visit_count[b, 0]
        out_root_value[b] = value_sum[b, 0] / n_root if n_root > 0 else raw_value[b, 0]
