"""Gumbel MuZero's selection rules (Danihelka et al. 2022) as numba kernels over the shared tree core.

What this module owns
    The rules that make a search Gumbel MuZero, on top of :mod:`muzero_tune.mcts.kernels` (root
    preparation, expansion, backup, root statistics are the shared core's):

    * the considered actions: Gumbel-top-k of ``g + logits`` over the legal root actions;
    * the completed-Q transform sigma at one node (:func:`completed_sigma`);
    * root selection by sequential halving, interior selection by the improved-policy rule;
    * the root read-out: completed Q, improved policy, the executed action.

    The plain-Python specification is :func:`muzero_tune.mcts.reference.reference_gumbel_search`; the
    differential test against ``mctx.gumbel_muzero_policy`` (tests/test_gumbel_vs_mctx.py) pins these rules
    to an independent implementation.

The rules
    * Completed Q at a node: visited child ``q(a) = reward + discount * value_sum / N(a)``; unvisited: the
      mixed value ``v_mix = (v_hat + (sum_b N(b) / sum_{b visited} pi(b)) * sum_{a visited} pi(a) q(a)) /
      (1 + sum_b N(b))`` (``v_hat`` the node's network value, ``pi`` the softmax of its logits: over the legal
      actions at the root, over all actions inside the tree). The node's own completed Q values are rescaled
      to [0, 1]: ``q_hat = (q - min_a q) / max(max_a q - min_a q, value_delta_max)``, and
      ``sigma(a) = (c_visit + max_b N(b)) * c_scale * q_hat(a)`` (mctx's
      ``qtransform_completed_by_mix_value``). As in mctx, the min and max run over every edge, so an illegal
      root edge's imputed ``v_mix`` takes part in them (the node's value estimate widens the range, as the
      parent value does in mctx's MuZero transform); illegal root edges then get completed Q 0 and sigma
      -inf, so they are never chosen and carry no improved-policy mass.
    * Root (sequential halving as a visit schedule): simulation ``s`` may only visit an action whose visit
      count equals ``table[k, s]`` (:func:`considered_visit_table`, k = number of considered actions); among
      those the one with the largest ``g + logits + sigma`` (lowest index on ties). The considered set is
      implicit: unvisited actions tie on sigma, so the first ``k`` visits go to the Gumbel-top-k.
    * Inside the tree (every action legal): ``argmax_a(pi'(a) - N(a) / (1 + sum_b N(b)))`` with the improved
      policy ``pi' = softmax(logits + sigma)``, lowest index on ties.
    * Read-out: improved policy ``softmax(logits + sigma)`` over the legal actions; the executed action is
      the argmax of ``g + logits + sigma`` among the most-visited legal actions, so it was always visited.

What it must never do
    Allocate per simulation, call Python/torch/the network, or draw randomness (the Gumbel noise is drawn by
    the driver from the caller's Generator and staged in ``gumbel``; every tie is broken by the lowest
    action index, so the search is deterministic given that noise).

Arrays beyond the shared layout (:class:`muzero_tune.mcts.gumbel.GumbelTreeArrays`):
    gumbel [Bc, A] float64 (g; 0 when evaluating), considered [Bc, A] bool, num_considered [Bc] int32,
    cq, sigma [Bc, W] float64 (scratch), root_trace [Bc, Nc] int32 (root action of each simulation),
    visit_table [A + 1, S] int32 (see :func:`considered_visit_table`).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from muzero_tune.mcts.kernels import end_descent

# fmt: off
# The kernels take every tree array explicitly (numba compiles one signature per kernel); one argument per
# line would make each signature and call 20-30 lines long, so the formatter leaves this module as written.

TINY = 1e-30  # floor of the visited prior mass in the mixed value


def considered_visit_table(max_considered: int, num_simulations: int) -> np.ndarray:
    """``table[k, s]``: the visit count an action must have to be visited at simulation ``s`` when ``k``
    actions are considered. [max_considered + 1, S] int32.

    Sequential halving as a schedule: with ``k`` considered actions and ``P = ceil(log2 k)`` planned phases,
    a phase with ``n`` survivors gives each ``max(1, S // (P * n))`` visits, one round of all ``n`` at a
    time, then halves to ``max(2, n // 2)``; ``k = 1`` sends every simulation to the one action.
    """
    table = np.zeros((max_considered + 1, num_simulations), dtype=np.int32)
    for k in range(max_considered + 1):
        if k <= 1:
            table[k] = np.arange(num_simulations)
            continue
        phases = math.ceil(math.log2(k))
        sequence: list[int] = []
        visits = 0  # every survivor has this many visits at the start of a round
        survivors = k
        while len(sequence) < num_simulations:
            rounds = max(1, num_simulations // (phases * survivors))
            for _ in range(rounds):
                sequence.extend([visits] * survivors)
                visits += 1
            survivors = max(2, survivors // 2)
        table[k] = sequence[:num_simulations]
    return table


@numba.njit(cache=True, _nrt=False)
def prepare_considered(
    root_legal, root_logits, gumbel, considered, num_considered, batch_size, num_actions, max_considered
):
    """considered[b] = the top min(max_considered, #legal) legal actions by gumbel + logits (ties: lowest
    index); num_considered[b] = their number."""
    for b in range(batch_size):
        num_legal = 0
        for a in range(num_actions):
            considered[b, a] = False
            if root_legal[b, a]:
                num_legal += 1
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
        num_considered[b] = k


@numba.njit(cache=True, _nrt=False, inline="always")
def completed_sigma(children, prior, visit_count, value_sum, reward, raw_value, root_legal, cq, sigma, b,
                    node, num_actions, discount, value_delta_max, c_visit, c_scale):
    """Write the completed Q ``cq[b, :A]`` and ``sigma[b, :A]`` of ``node``'s edges (module rules). Returns
    sum_a N(a)."""
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
    # As mctx: the range runs over every edge's completed Q, an illegal root edge's imputed v_mix included.
    lo = np.inf
    hi = -np.inf
    for a in range(num_actions):
        if children[b, node, a] < 0:
            cq[b, a] = v_mix
        if cq[b, a] < lo:
            lo = cq[b, a]
        if cq[b, a] > hi:
            hi = cq[b, a]
    span = hi - lo
    if span < value_delta_max:
        span = value_delta_max
    scale = (c_visit + max_n) * c_scale
    for a in range(num_actions):
        if is_root and not root_legal[b, a]:
            cq[b, a] = 0.0
            sigma[b, a] = -np.inf
        elif span > 0.0:
            sigma[b, a] = scale * ((cq[b, a] - lo) / span)
        else:
            sigma[b, a] = 0.0
    return sum_n


@numba.njit(cache=True, _nrt=False)
def select_leaves(children, logits, prior, kind, visit_count, value_sum, reward, raw_value, root_legal,
                  gumbel, num_considered, visit_table, cq, sigma, scores, path, path_len, sel_parent,
                  sel_action, sel_kind, root_trace, sim, batch_size, num_actions, discount, value_delta_max,
                  c_visit, c_scale):
    """Descend every tree: sequential halving at the root, the improved-policy rule inside the tree, until an
    unexpanded edge (module rules). Writes path/path_len/sel_parent/sel_action/sel_kind and
    root_trace[b, sim]."""
    for b in range(batch_size):
        completed_sigma(children, prior, visit_count, value_sum, reward, raw_value, root_legal, cq, sigma, b,
                        0, num_actions, discount, value_delta_max, c_visit, c_scale)
        target = visit_table[num_considered[b], sim]
        action = -1
        best = -np.inf
        for a in range(num_actions):
            if root_legal[b, a]:
                child = children[b, 0, a]
                n = visit_count[b, child] if child >= 0 else 0
                if n == target:
                    s = gumbel[b, a] + logits[b, 0, a] + sigma[b, a]
                    if action < 0 or s > best:
                        best = s
                        action = a
        root_trace[b, sim] = action
        node = 0
        depth = 0
        path[b, 0] = 0
        child = children[b, 0, action]
        while child >= 0:
            depth += 1
            path[b, depth] = child
            node = child
            sum_n = completed_sigma(children, prior, visit_count, value_sum, reward, raw_value, root_legal,
                                    cq, sigma, b, node, num_actions, discount, value_delta_max, c_visit,
                                    c_scale)
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
        end_descent(path_len, sel_parent, sel_action, sel_kind, kind, b, node, depth, action)


@numba.njit(cache=True, _nrt=False)
def root_outputs(children, logits, prior, visit_count, value_sum, reward, raw_value, root_legal, gumbel, cq,
                 sigma, batch_size, num_actions, discount, value_delta_max, c_visit, c_scale, out_completed_q,
                 out_improved, out_selected, out_most_visited):
    """Root read-out (module rules): completed Q [B, A] (illegal 0), improved policy [B, A] (illegal 0), the
    executed action [B] and the most-visited legal actions it was chosen from [B, A] bool."""
    for b in range(batch_size):
        completed_sigma(children, prior, visit_count, value_sum, reward, raw_value, root_legal, cq, sigma, b,
                        0, num_actions, discount, value_delta_max, c_visit, c_scale)
        m = -np.inf
        max_n = 0
        for a in range(num_actions):
            out_completed_q[b, a] = cq[b, a]
            if root_legal[b, a]:
                z = logits[b, 0, a] + sigma[b, a]
                if z > m:
                    m = z
                child = children[b, 0, a]
                n = visit_count[b, child] if child >= 0 else 0
                if n > max_n:
                    max_n = n
        total = 0.0
        for a in range(num_actions):
            if root_legal[b, a]:
                e = math.exp(logits[b, 0, a] + sigma[b, a] - m)
                out_improved[b, a] = e
                total += e
            else:
                out_improved[b, a] = 0.0
        pick = -1
        best = -np.inf
        for a in range(num_actions):
            out_improved[b, a] = out_improved[b, a] / total
            out_most_visited[b, a] = False
            if root_legal[b, a]:
                child = children[b, 0, a]
                n = visit_count[b, child] if child >= 0 else 0
                if n == max_n:
                    out_most_visited[b, a] = True
                    s = gumbel[b, a] + logits[b, 0, a] + sigma[b, a]
                    if pick < 0 or s > best:
                        best = s
                        pick = a
        out_selected[b] = pick
