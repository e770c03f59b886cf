"""Sampled MuZero's expansion rule (Hubert et al. 2021) as numba kernels over the shared tree core.

What this module owns
    How a node of the sampled search gets its K edges: K actions drawn from the node's policy, stored per
    node, and their priors. Everything else is shared: the root's counted first visit, Dirichlet noise,
    backup and min-max come from :mod:`muzero_tune.mcts.kernels`, and selection is MuZero's pUCT over the K
    edges (:func:`muzero_tune.mcts.puct.select_leaves` with ``K`` as the edge count; at the root, edges past
    the number of valid samples are masked like illegal actions). The plain-Python specification is
    :func:`muzero_tune.mcts.reference.reference_sampled_search`.

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
    * Prior of the K edges (``uniform_prior``): ``uniform`` gives each valid slot 1/K_valid, the paper's
      ``beta_hat / beta * pi`` for samples drawn from ``beta = pi``; ``density`` gives the softmax of the
      slots' scores (pi restricted to the sampled actions and renormalised; with discrete K = |A| this is
      MuZero's prior, so that search is reproduced exactly).

What it must never do
    Allocate per simulation, call Python/torch, or draw randomness: every draw is staged from the caller's
    Generator by :class:`muzero_tune.mcts.sampled.SampledSearch`, so a run is reproducible from its seed.

Arrays beyond the shared layout (:class:`muzero_tune.mcts.sampled.SampledTreeArrays`, ``K`` = edge width):
    node_actions [Bc, Nc, K, D] float64 (discrete: the action id in [..., 0]), slot_score [Bc, K] float64,
    root_params / leaf_params [Bc, P] float64, normal_noise [Bc, K, D] float64, gumbel_noise [Bc, A] float64,
    action_legal [Bc, A] bool (the root's legal actions), taken [Bc, A] bool (scratch).
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

LOG_SIGMA_MIN = -20.0
LOG_SIGMA_MAX = 2.0
TANH_EPS = 1e-6
HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


@numba.njit(cache=True, _nrt=False, inline="always")
def sample_node(node_actions, prior, slot_score, params, normal_noise, gumbel_noise, legal, taken, b, node,
                num_slots, action_dim, num_env_actions, continuous, uniform_prior, use_legal):
    """Draw the K edges of ``node`` in tree ``b`` from ``params[b]`` with the staged noise and write their
    actions and priors (module rules). Returns the number of valid slots."""
    num_valid = num_slots
    if continuous:
        for k in range(num_slots):
            logp = 0.0
            for d in range(action_dim):
                log_sigma = params[b, action_dim + d]
                if log_sigma < LOG_SIGMA_MIN:
                    log_sigma = LOG_SIGMA_MIN
                elif log_sigma > LOG_SIGMA_MAX:
                    log_sigma = LOG_SIGMA_MAX
                z = normal_noise[b, k, d]
                a = math.tanh(params[b, d] + math.exp(log_sigma) * z)
                node_actions[b, node, k, d] = a
                logp += -0.5 * z * z - log_sigma - HALF_LOG_2PI - math.log(1.0 - a * a + TANH_EPS)
            slot_score[b, k] = logp
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
    if uniform_prior:
        for k in range(num_valid):
            prior[b, node, k] = 1.0 / num_valid
    else:
        softmax_into(prior, b, node, slot_score, num_valid)
    return num_valid


@numba.njit(cache=True, _nrt=False)
def prepare_roots(children, prior, kind, visit_count, value_sum, reward, raw_value, min_value, max_value,
                  root_legal, root_noise, root_value, node_actions, slot_score, root_params, normal_noise,
                  gumbel_noise, action_legal, taken, batch_size, num_nodes, num_slots, action_dim,
                  num_env_actions, continuous, uniform_prior, add_noise, noise_weight):
    """Reset the trees, sample every root's K edges (``root_legal[b, k]`` = slot k is valid), mix the
    Dirichlet noise (root_noise [Bc, K] raw Gamma draws) into their priors and count the roots' first
    visits."""
    for b in range(batch_size):
        reset_tree(children, prior, kind, visit_count, value_sum, reward, raw_value, b, num_nodes)
        num_valid = sample_node(node_actions, prior, slot_score, root_params, normal_noise, gumbel_noise,
                                action_legal, taken, b, 0, num_slots, action_dim, num_env_actions, continuous,
                                uniform_prior, True)
        for k in range(num_slots):
            root_legal[b, k] = k < num_valid
        if add_noise:
            mix_root_noise(prior, root_noise, root_legal, b, num_slots, noise_weight)
        count_root_visit(visit_count, value_sum, raw_value, min_value, max_value, root_value, b)


@numba.njit(cache=True, _nrt=False)
def expand_and_backup(children, prior, kind, visit_count, value_sum, reward, raw_value, min_value, max_value,
                      path, path_len, sel_parent, sel_action, leaf_reward, leaf_value, node_actions,
                      slot_score, leaf_params, normal_noise, gumbel_noise, action_legal, taken, new_node,
                      batch_size, num_slots, action_dim, num_env_actions, continuous, uniform_prior,
                      discount):
    """Attach ``new_node`` in every tree, sample its K edges from leaf_params [Bc, P] with the staged noise,
    and back its value up (the shared core)."""
    for b in range(batch_size):
        attach_leaf(children, kind, reward, raw_value, path, path_len, sel_parent, sel_action, leaf_reward,
                    leaf_value, b, new_node, DECISION)
        sample_node(node_actions, prior, slot_score, leaf_params, normal_noise, gumbel_noise, action_legal,
                    taken, b, new_node, num_slots, action_dim, num_env_actions, continuous, uniform_prior,
                    False)
        backup_path(kind, visit_count, value_sum, reward, min_value, max_value, path, path_len, b,
                    leaf_value[b], discount, False)
