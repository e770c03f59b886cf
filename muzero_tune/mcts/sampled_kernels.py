"""Sampled MuZero's expansion rule (Hubert et al. 2021) as numba kernels over the shared tree core.

What this module owns
    How a node of the sampled search gets its K edges: K actions drawn from the node's policy, stored per
    node, and their priors, for continuous, discrete and factored actions. Everything else is shared: the
    root's counted first visit, Dirichlet noise, backup and min-max come from :mod:`muzero_tune.mcts.kernels`,
    and selection is MuZero's pUCT over the K edges (:func:`muzero_tune.mcts.puct.select_leaves` with ``K``
    as the edge count; at the root, edges past the number of valid samples are masked like illegal actions).
    The plain-Python specification is :func:`muzero_tune.mcts.reference.reference_sampled_search`.

The rules
    * Continuous actions (D dims; the policy's parameters are ``[mu_1..mu_D, log_sigma_1..log_sigma_D]``):
      ``log_sigma`` is clamped to [-20, 2], ``u = mu + exp(log_sigma) * z`` with standard-normal ``z`` staged
      by the driver, the action is ``a = tanh(u)`` (actions live in [-1, 1]), and its log-density is
      ``sum_d [-z_d^2 / 2 - log_sigma_d - log(2 pi) / 2 - log(1 - a_d^2 + 1e-6)]`` (the tanh correction).
    * Discrete actions (A actions; parameters are the logits): K distinct actions without replacement by
      Gumbel-top-K of ``g + logits`` over the legal actions (the root's legal mask; every action inside the
      tree), with Gumbel draws ``g`` staged by the driver; ties to the lowest index. The chosen actions are
      stored in ascending order and a slot's score is its logit. Fewer legal actions than K leave the extra
      root slots invalid (never selected, visit count 0).
    * Factored actions (D factors of n_1..n_D values, a ``MultiDiscrete`` taken by its factors; the
      parameters are the factors' logits end to end, P = sum n_d, factor d's from ``factor_starts[d]``): the
      policy is the product of the per-factor categoricals pi_d = softmax(logits_d). Each of the K slots is
      one independent draw from beta = prod_d beta_d, factor by factor, by inverse CDF: the smallest value v
      with ``u < beta_d(0) + .. + beta_d(v)`` for the uniform ``u`` in [0, 1) staged by the driver (rounding
      past the end takes the last value of positive probability). Slots may repeat an action (independent
      draws, as the paper's). Inside the tree beta = pi; at an exploring root (``mix_weight`` w > 0) each
      factor's draw explores: ``beta_d = (1 - w) pi_d + w eta_d``, eta_d the staged Gamma draws of factor d
      normalised over its values (a Dirichlet sample; all zero: uniform). A slot's score is its joint
      log-probability ``log pi(a) = sum_d log pi_d(a_d)`` (density), or ``log pi(a) - log beta(a)``
      (uniform, where beta differs from pi).
    * Prior of the K edges (``uniform_prior``): ``uniform`` gives each valid slot 1/K_valid, the paper's
      ``beta_hat / beta * pi`` for samples drawn from ``beta = pi``; where beta is not pi (a factored
      exploring root) that is the softmax of ``log pi - log beta`` over the slots, pi / beta renormalised;
      ``density`` gives the softmax of the slots' scores (pi restricted to the sampled actions and
      renormalised; with discrete K = |A| this is MuZero's prior, so that search is reproduced exactly).

What it must never do
    Allocate per simulation, call Python/torch, or draw randomness: every draw is staged from the caller's
    Generator by :class:`muzero_tune.mcts.sampled.SampledSearch`, so a run is reproducible from its seed.

Arrays beyond the shared layout (:class:`muzero_tune.mcts.sampled.SampledTreeArrays`, ``K`` = edge width):
    node_actions [Bc, Nc, K, D] float64 (discrete: the action id in [..., 0]; factored: the factor indices),
    slot_score [Bc, K] float64, root_params / leaf_params [Bc, P] float64, slot_noise [Bc, K, D] float64
    (standard normal draws for continuous actions, uniform ones in [0, 1) for factored ones), gumbel_noise
    [Bc, A] float64, action_legal [Bc, A] bool (the root's legal actions), taken [Bc, A] bool (scratch);
    factored actions: factor_sizes [D] int64 (n_d), factor_starts [D] int64 (where factor d's logits start),
    factor_noise [Bc, P] float64 (the root's raw Gamma draws per factor value), factor_stats [Bc, D, 2]
    float64 (scratch: each factor's log-sum-exp and Gamma total).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from muzero_tune.mcts.kernels import (
    DECISION,
    attach_leaf,
    backup_path,
    count_root_visit,
    mix_root_noise,
    reset_tree,
    softmax_into,
)

# fmt: off
# The kernels take every tree array explicitly (numba compiles one signature per kernel); one argument per
# line would make each signature and call 20-30 lines long, so the formatter leaves this module as written.

# how a search's actions are sampled (the ``action_kind`` argument of the kernels)
DISCRETE = 0
CONTINUOUS = 1
FACTORED = 2
KIND_CODES = {"discrete": DISCRETE, "continuous": CONTINUOUS, "factored": FACTORED}

LOG_SIGMA_MIN = -20.0
LOG_SIGMA_MAX = 2.0
TANH_EPS = 1e-6
HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


@numba.njit(cache=True, _nrt=False, inline="always")
def factor_beta(params, factor_noise, factor_stats, b, d, start, n, v, mix_weight):
    """beta_d(v): factor d's probability of value v, pi_d(v) mixed with its Dirichlet draw by ``mix_weight``
    (module rules; factor_stats[b, d] must hold the factor's log-sum-exp and Gamma total)."""
    p = math.exp(params[b, start + v] - factor_stats[b, d, 0])
    if mix_weight == 0.0:
        return p
    total = factor_stats[b, d, 1]
    eta = factor_noise[b, start + v] / total if total > 0.0 else 1.0 / n
    return (1.0 - mix_weight) * p + mix_weight * eta


@numba.njit(cache=True, _nrt=False, inline="always")
def sample_factored(node_actions, slot_score, params, slot_noise, factor_sizes, factor_starts, factor_noise,
                    factor_stats, b, node, num_slots, action_dim, uniform_prior, mix_weight):
    """The K factored draws of ``node`` in tree ``b`` (module rules): factor indices into node_actions, each
    slot's score into slot_score."""
    for d in range(action_dim):
        start = factor_starts[d]
        n = factor_sizes[d]
        m = -np.inf
        for v in range(n):
            if params[b, start + v] > m:
                m = params[b, start + v]
        total = 0.0
        for v in range(n):
            total += math.exp(params[b, start + v] - m)
        factor_stats[b, d, 0] = m + math.log(total)
        noise_total = 0.0
        if mix_weight > 0.0:
            for v in range(n):
                noise_total += factor_noise[b, start + v]
        factor_stats[b, d, 1] = noise_total
    for k in range(num_slots):
        log_pi = 0.0
        log_beta = 0.0
        for d in range(action_dim):
            start = factor_starts[d]
            n = factor_sizes[d]
            u = slot_noise[b, k, d]
            cdf = 0.0
            pick = -1
            last = 0
            for v in range(n):
                q = factor_beta(params, factor_noise, factor_stats, b, d, start, n, v, mix_weight)
                if q > 0.0:
                    last = v
                cdf += q
                if u < cdf:
                    pick = v
                    break
            if pick < 0:
                pick = last
            log_pi += params[b, start + pick] - factor_stats[b, d, 0]
            if mix_weight > 0.0:
                log_beta += math.log(factor_beta(params, factor_noise, factor_stats, b, d, start, n, pick,
                                                 mix_weight))
            node_actions[b, node, k, d] = pick
        slot_score[b, k] = log_pi - log_beta if uniform_prior else log_pi


@numba.njit(cache=True, _nrt=False, inline="always")
def sample_node(node_actions, prior, slot_score, params, slot_noise, gumbel_noise, legal, taken, factor_sizes,
                factor_starts, factor_noise, factor_stats, b, node, num_slots, action_dim, num_env_actions,
                action_kind, uniform_prior, use_legal, mix_weight):
    """Draw the K edges of ``node`` in tree ``b`` from ``params[b]`` with the staged noise and write their
    actions and priors (module rules; ``mix_weight``: factored actions' root exploration, 0 elsewhere).
    Returns the number of valid slots."""
    num_valid = num_slots
    if action_kind == CONTINUOUS:
        for k in range(num_slots):
            logp = 0.0
            for d in range(action_dim):
                log_sigma = params[b, action_dim + d]
                if log_sigma < LOG_SIGMA_MIN:
                    log_sigma = LOG_SIGMA_MIN
                elif log_sigma > LOG_SIGMA_MAX:
                    log_sigma = LOG_SIGMA_MAX
                z = slot_noise[b, k, d]
                a = math.tanh(params[b, d] + math.exp(log_sigma) * z)
                node_actions[b, node, k, d] = a
                logp += -0.5 * z * z - log_sigma - HALF_LOG_2PI - math.log(1.0 - a * a + TANH_EPS)
            slot_score[b, k] = logp
    elif action_kind == FACTORED:
        sample_factored(node_actions, slot_score, params, slot_noise, factor_sizes, factor_starts,
                        factor_noise, factor_stats, b, node, num_slots, action_dim, uniform_prior, mix_weight)
    else:
        num_legal = 0
        for a in range(num_env_actions):
            taken[b, a] = False
            if not use_legal or legal[b, a]:
                num_legal += 1
        if num_legal < num_valid:
            num_valid = num_legal
        for _ in range(num_valid):
            best = -np.inf
            pick = -1
            for a in range(num_env_actions):
                if (not use_legal or legal[b, a]) and not taken[b, a]:
                    s = gumbel_noise[b, a] + params[b, a]
                    if pick < 0 or s > best:
                        best = s
                        pick = a
            taken[b, pick] = True
        k = 0
        for a in range(num_env_actions):
            if taken[b, a]:
                node_actions[b, node, k, 0] = a
                slot_score[b, k] = params[b, a]
                k += 1
        for k in range(num_valid, num_slots):
            node_actions[b, node, k, 0] = 0.0
    if uniform_prior and mix_weight == 0.0:
        for k in range(num_valid):
            prior[b, node, k] = 1.0 / num_valid
    else:
        softmax_into(prior, b, node, slot_score, num_valid)
    return num_valid


@numba.njit(cache=True, _nrt=False)
def prepare_roots(children, prior, kind, visit_count, value_sum, reward, raw_value, min_value, max_value,
                  root_legal, root_noise, root_value, node_actions, slot_score, root_params, slot_noise,
                  gumbel_noise, action_legal, taken, factor_sizes, factor_starts, factor_noise, factor_stats,
                  batch_size, num_nodes, num_slots, action_dim, num_env_actions, action_kind, uniform_prior,
                  add_noise, noise_weight):
    """Reset the trees, sample every root's K edges (``root_legal[b, k]`` = slot k is valid; factored
    actions drawn from the exploring beta when ``add_noise``), mix the Dirichlet noise (root_noise [Bc, K] raw
    Gamma draws) into their priors and count the roots' first visits."""
    mix_weight = noise_weight if add_noise and action_kind == FACTORED else 0.0
    for b in range(batch_size):
        reset_tree(children, prior, kind, visit_count, value_sum, reward, raw_value, b, num_nodes)
        num_valid = sample_node(node_actions, prior, slot_score, root_params, slot_noise, gumbel_noise,
                                action_legal, taken, factor_sizes, factor_starts, factor_noise, factor_stats,
                                b, 0, num_slots, action_dim, num_env_actions, action_kind, uniform_prior,
                                True, mix_weight)
        for k in range(num_slots):
            root_legal[b, k] = k < num_valid
        if add_noise:
            mix_root_noise(prior, root_noise, root_legal, b, num_slots, noise_weight)
        count_root_visit(visit_count, value_sum, raw_value, min_value, max_value, root_value, b)


@numba.njit(cache=True, _nrt=False)
def expand_and_backup(children, prior, kind, visit_count, value_sum, reward, raw_value, min_value, max_value,
                      path, path_len, sel_parent, sel_action, leaf_reward, leaf_value, node_actions,
                      slot_score, leaf_params, slot_noise, gumbel_noise, action_legal, taken, factor_sizes,
                      factor_starts, factor_noise, factor_stats, new_node, batch_size, num_slots, action_dim,
                      num_env_actions, action_kind, uniform_prior, discount):
    """Attach ``new_node`` in every tree, sample its K edges from leaf_params [Bc, P] with the staged noise,
    and back its value up (the shared core)."""
    for b in range(batch_size):
        attach_leaf(children, kind, reward, raw_value, path, path_len, sel_parent, sel_action, leaf_reward,
                    leaf_value, b, new_node, DECISION)
        sample_node(node_actions, prior, slot_score, leaf_params, slot_noise, gumbel_noise, action_legal,
                    taken, factor_sizes, factor_starts, factor_noise, factor_stats, b, new_node, num_slots,
                    action_dim, num_env_actions, action_kind, uniform_prior, False, 0.0)
        backup_path(kind, visit_count, value_sum, reward, min_value, max_value, path, path_len, b,
                    leaf_value[b], discount, False)
