"""The shared numba core of every batched search: one tree per batch element, all trees advanced in lockstep.

What this module owns
    The tree arithmetic every variant shares, each rule written once:

    * :func:`normalise` -- the Q transform of the tree's min-max stats;
    * :func:`prepare_roots` -- reset, root priors (softmax over the legal actions, Dirichlet mix), and the
      root's counted visit (the initial inference is visit 1 with the network's root value);
    * :func:`expand_and_backup` -- attach the new node (its kind, reward, priors) and back its value up to
      the root: values, visits, min-max, discount, and the chance-edge rule as a flag;
    * :func:`store_expand_and_backup` -- the same after storing the new nodes' latents (bytes copied from
      the network output's address), so the whole expansion after the network call is one call;
    * :func:`gather_latents` -- a simulation's parent latents (as bytes) and actions, copied into the blocks
      the network call reads;
    * :func:`root_statistics` -- root visit counts and root value.

    The per-variant selection rules live beside it (:mod:`muzero_tune.mcts.puct` for MuZero's pUCT and
    chance nodes, :mod:`muzero_tune.mcts.gumbel_kernels` for Gumbel MuZero) and call the ``inline="always"``
    pieces here, which numba inlines at the call site. Every kernel and piece is compiled without numba's
    runtime (``_nrt=False``): inlining alone does not remove reference counting -- each inlined piece that
    takes arrays still cost atomic increfs/decrefs per call (28 and 29 NRT calls in the select and backup
    kernels, about 2x their time at B = 8); without the runtime there are none, and a kernel that tried to
    allocate would not compile (which is the rule below). :mod:`muzero_tune.mcts.reference` is the
    plain-Python executable specification of the same rules; the kernels reproduce its visit counts bit for
    bit, so the float operation order is the same there (float64 everywhere, sequential sums, no fastmath).

What it must never do
    * allocate per simulation: every kernel writes into the preallocated arrays of
      :class:`muzero_tune.mcts.tree.TreeArrays` (passed at full capacity plus a ``batch_size``, so the numba
      type signatures never change and each kernel compiles once);
    * call Python, torch or the network, or draw randomness from anywhere but numba's own RNG, which the
      caller seeds once per search via :func:`seed_rng` (a search is reproducible from a numpy Generator);
    * use ``fastmath`` / ``parallel``: both reorder float operations and break agreement with the reference.

The shared rules
    * Root: priors = softmax of the logits over the legal actions (illegal exactly 0); with noise,
      (1 - w) * prior + w * eta, eta = Gamma(alpha) draws normalised over the legal actions (= Dirichlet).
      The root's initial inference counts as its first visit (visit_count 1, value_sum = the network's root
      value), as in mctx and LightZero, so simulation 0 already weighs the prior (sqrt(N) = 1).
    * Q of a node as seen from its parent: ``reward(node) + d(node) * value_sum(node) / visit_count(node)``
      with ``d = discount``, except ``d = 1`` for a chance node (edges into chance nodes carry no reward and
      no discount) when chance edges are on.
    * Min-max stats (the ``tree_min_max`` Q transform): every non-root node on a backup path records its Q,
      and the root records its own mean value ``value_sum / visit_count`` -- the value its children's Qs
      estimate, so the root's entry lies inside their range (the MuZero pseudocode's ``node.value()``; mctx
      keeps the parent's value inside its children's range the same way). Recording the Q of an imaginary
      reward-0 edge into the root (``discount * V``) instead would sit about one reward ``|r|`` away from
      every child's ``r + discount * V(child)`` and dominate the span on any task with a constant reward.
      The root's counted visit records it at preparation, so the stats are never empty once a child has a
      value. ``normalise(q) = (q - min) / max(max - min, value_delta_max)`` clipped to [0, 1] (0 when that
      span is 0): a Q is never used unnormalised.
    * Expansion: the new node's kind is the opposite of its parent's when chance edges are on (decision
      otherwise); its priors are the softmax of the first ``num_actions`` (decision) or ``num_chances``
      (chance) leaf logits, the rest 0; it stores the staged reward, logits and network value.
    * Backup from leaf to root with ``G`` = leaf value: ``value_sum += G``, ``visit_count += 1``, min-max
      update with the node's Q, then ``G = reward + d * G``.

Array layout: see :class:`muzero_tune.mcts.tree.TreeArrays` (``Bc`` batch capacity, ``Nc`` node capacity,
``A`` root actions, ``W`` edge width). Only rows ``b < batch_size`` and nodes ``n < num_nodes`` are touched.
Node numbering: root = node 0; the node expanded at simulation ``s`` (0-based) is node ``s + 1``.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

# fmt: off
# The kernels take every tree array explicitly (numba compiles one signature per kernel); one argument per
# line would make each signature and call 20-30 lines long, so the formatter leaves this module as written.

DECISION = 0
CHANCE = 1
# Scores within this distance of the maximum count as tied under a random tie-break.
TIE_TOLERANCE = 1e-9


@numba.njit(cache=True, _nrt=False)
def seed_rng(seed):
    """Seed numba's internal RNG (random tie-breaks, chance sampling). ``seed``: int in [0, 2**31)."""
    np.random.seed(seed)


@numba.njit(cache=True, _nrt=False, inline="always")
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


@numba.njit(cache=True, _nrt=False, inline="always")
def softmax_into(out, b, node, src, width):
    """out[b, node, :width] = softmax(src[b, :width]) (max-shifted, sequential sum)."""
    m = -np.inf
    for a in range(width):
        if src[b, a] > m:
            m = src[b, a]
    total = 0.0
    for a in range(width):
        e = math.exp(src[b, a] - m)
        out[b, node, a] = e
        total += e
    for a in range(width):
        out[b, node, a] = out[b, node, a] / total


@numba.njit(cache=True, _nrt=False, inline="always")
def node_discount(kind, b, node, discount, chance_edges):
    """d(node): ``discount``, or 1 for a chance node when chance edges are on."""
    if chance_edges and kind[b, node] == CHANCE:
        return 1.0
    return discount


@numba.njit(cache=True, _nrt=False, inline="always")
def reset_tree(children, prior, kind, visit_count, value_sum, reward, raw_value, b, num_nodes):
    """Clear nodes ``[0, num_nodes)`` of tree ``b`` (every edge unexpanded, prior 0)."""
    width = children.shape[2]
    for n in range(num_nodes):
        for a in range(width):
            children[b, n, a] = -1
            prior[b, n, a] = 0.0
        visit_count[b, n] = 0
        value_sum[b, n] = 0.0
        reward[b, n] = 0.0
        raw_value[b, n] = 0.0
        kind[b, n] = DECISION


@numba.njit(cache=True, _nrt=False, inline="always")
def mix_root_noise(prior, root_noise, root_legal, b, num_edges, noise_weight):
    """prior[b, 0, e] = (1 - w) * prior + w * eta over the legal root edges, eta = the Gamma draws
    root_noise[b] normalised over them (a Dirichlet sample)."""
    noise_total = 0.0
    num_legal = 0
    for a in range(num_edges):
        if root_legal[b, a]:
            noise_total += root_noise[b, a]
            num_legal += 1
    for a in range(num_edges):
        if root_legal[b, a]:
            # All-zero Gamma draws (possible only through underflow) fall back to uniform noise.
            if noise_total > 0.0:
                eta = root_noise[b, a] / noise_total
            else:
                eta = 1.0 / num_legal
            prior[b, 0, a] = (1.0 - noise_weight) * prior[b, 0, a] + noise_weight * eta


@numba.njit(cache=True, _nrt=False, inline="always")
def count_root_visit(visit_count, value_sum, raw_value, min_value, max_value, root_value, b):
    """The initial inference is the root's first visit; its value seeds the min-max stats (module rules:
    the root's entry is its own value, on its children's scale)."""
    v = root_value[b]
    visit_count[b, 0] = 1
    value_sum[b, 0] = v
    raw_value[b, 0] = v
    min_value[b] = v
    max_value[b] = v


@numba.njit(cache=True, _nrt=False)
def prepare_roots(children, prior, logits, kind, visit_count, value_sum, reward, raw_value, min_value,
                  max_value, root_legal, root_logits, root_noise, root_value, batch_size, num_nodes,
                  num_actions, add_noise, noise_weight):
    """Reset nodes ``[0, num_nodes)`` of trees ``[0, batch_size)``, set the root priors and count the root's
    initial inference as its first visit (module rules).

    root_logits [Bc, A] float64; root_legal [Bc, A] bool (every row has a legal action); root_noise [Bc, A]
    float64 raw Gamma(alpha, 1) draws, read only when ``add_noise``; root_value [Bc] float64.
    """
    for b in range(batch_size):
        reset_tree(children, prior, kind, visit_count, value_sum, reward, raw_value, b, num_nodes)
        m = -np.inf
        for a in range(num_actions):
            logits[b, 0, a] = root_logits[b, a]
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
            mix_root_noise(prior, root_noise, root_legal, b, num_actions, noise_weight)
        count_root_visit(visit_count, value_sum, raw_value, min_value, max_value, root_value, b)


@numba.njit(cache=True, _nrt=False, inline="always")
def attach_leaf(children, kind, reward, raw_value, path, path_len, sel_parent, sel_action, leaf_reward,
                leaf_value, b, new_node, new_kind):
    """Make ``new_node`` (kind, staged reward and network value) the child at (sel_parent, sel_action) of
    tree ``b`` and append it to the current path."""
    children[b, sel_parent[b], sel_action[b]] = new_node
    kind[b, new_node] = new_kind
    reward[b, new_node] = leaf_reward[b]
    raw_value[b, new_node] = leaf_value[b]
    n = path_len[b]
    path[b, n] = new_node
    path_len[b] = n + 1


@numba.njit(cache=True, _nrt=False, inline="always")
def backup_path(kind, visit_count, value_sum, reward, min_value, max_value, path, path_len, b, g, discount,
                chance_edges):
    """Back the leaf value ``g`` up the current path of tree ``b`` (module rules: values, visits, min-max
    with every node's Q and the root's own value, discount, the chance-edge rule)."""
    lo = min_value[b]
    hi = max_value[b]
    for i in range(path_len[b] - 1, -1, -1):
        node = path[b, i]
        value_sum[b, node] += g
        visit_count[b, node] += 1
        r = reward[b, node]
        d = node_discount(kind, b, node, discount, chance_edges)
        if i == 0:  # the root: its value, not the Q of an edge into it (the reward-0 edge would sit |r| off)
            q = value_sum[b, node] / visit_count[b, node]
        else:
            q = r + d * (value_sum[b, node] / visit_count[b, node])
        if q < lo:
            lo = q
        if q > hi:
            hi = q
        g = r + d * g
    min_value[b] = lo
    max_value[b] = hi


@intrinsic
def _address(typingctx, array):
    """The integer address of ``array``'s first element."""
    if not isinstance(array, types.Array):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.ptrtoint(data, context.get_value_type(types.intp))

    return types.intp(array), codegen


@intrinsic
def _copy_bytes(typingctx, dst_address, src_address, num_bytes):
    """memcpy of ``num_bytes`` from ``src_address`` to ``dst_address`` (non-overlapping). Kernels without
    numba's runtime cannot build the array views a slice copy needs; this is one LLVM memcpy."""
    if not all(isinstance(x, types.Integer) for x in (dst_address, src_address, num_bytes)):
        return None

    def codegen(context, builder, signature, args):
        byte_ptr = context.get_value_type(types.CPointer(types.uint8))
        dst = builder.inttoptr(args[0], byte_ptr)
        src = builder.inttoptr(args[1], byte_ptr)
        cgutils.raw_memcpy(builder, dst, src, args[2], 1)
        return context.get_dummy_value()

    return types.void(dst_address, src_address, num_bytes), codegen


@numba.njit(cache=True, _nrt=False, inline="always")
def store_latents(store, node, address, batch_size):
    """store[node, :batch_size] = the C-contiguous [B, Z]-byte latent at ``address`` (store [Nc, Bc, Z] uint8,
    C-contiguous, so those B rows are one block); ``address`` 0 stores nothing (the caller stored it)."""
    if address != 0:
        width = store.shape[2]
        _copy_bytes(_address(store) + node * store.shape[1] * width, address, batch_size * width)


@numba.njit(cache=True, _nrt=False, inline="always")
def expand_and_backup_trees(children, prior, logits, kind, visit_count, value_sum, reward, raw_value,
                            min_value, max_value, path, path_len, sel_parent, sel_action, sel_kind,
                            leaf_reward, leaf_value, leaf_logits, new_node, batch_size, num_actions,
                            num_chances, discount, chance_edges):
    """Attach node ``new_node`` at (sel_parent, sel_action) in every tree and back its value up.

    leaf_reward [Bc], leaf_value [Bc], leaf_logits [Bc, W] float64: the network outputs for the new nodes
    (policy logits over A for a decision node, chance logits over C for a chance node). With
    ``chance_edges`` the new node's kind alternates with its parent's and chance nodes do not discount. The
    kernels below inline it with ``chance_edges`` a literal, so trees without chance nodes carry no kind
    checks. (They are module-level functions, not closures of a factory: numba keys a cached closure on its
    cells' pickled bytes, which changed with every process for a cell holding a dispatcher -- each process
    compiled the kernel again, 1.2 s, and added an entry to its cache index.)
    """
    for b in range(batch_size):
        width = num_actions
        new_kind = DECISION
        if chance_edges and sel_kind[b] == DECISION:
            width = num_chances
            new_kind = CHANCE
        attach_leaf(children, kind, reward, raw_value, path, path_len, sel_parent, sel_action,
                    leaf_reward, leaf_value, b, new_node, new_kind)
        for a in range(width):
            logits[b, new_node, a] = leaf_logits[b, a]
        softmax_into(prior, b, new_node, leaf_logits, width)
        backup_path(kind, visit_count, value_sum, reward, min_value, max_value, path, path_len, b,
                    leaf_value[b], discount, chance_edges)


@numba.njit(cache=True, _nrt=False)
def expand_and_backup(children, prior, logits, kind, visit_count, value_sum, reward, raw_value, min_value,
                      max_value, path, path_len, sel_parent, sel_action, sel_kind, leaf_reward, leaf_value,
                      leaf_logits, new_node, batch_size, num_actions, num_chances, discount):
    """:func:`expand_and_backup_trees` for trees of decision nodes only."""
    expand_and_backup_trees(children, prior, logits, kind, visit_count, value_sum, reward, raw_value,
                            min_value, max_value, path, path_len, sel_parent, sel_action, sel_kind,
                            leaf_reward, leaf_value, leaf_logits, new_node, batch_size, num_actions,
                            num_chances, discount, False)


@numba.njit(cache=True, _nrt=False)
def expand_and_backup_chance(children, prior, logits, kind, visit_count, value_sum, reward, raw_value,
                             min_value, max_value, path, path_len, sel_parent, sel_action, sel_kind,
                             leaf_reward, leaf_value, leaf_logits, new_node, batch_size, num_actions,
                             num_chances, discount):
    """:func:`expand_and_backup_trees` for trees of decision and chance nodes (Stochastic MuZero)."""
    expand_and_backup_trees(children, prior, logits, kind, visit_count, value_sum, reward, raw_value,
                            min_value, max_value, path, path_len, sel_parent, sel_action, sel_kind,
                            leaf_reward, leaf_value, leaf_logits, new_node, batch_size, num_actions,
                            num_chances, discount, True)


@numba.njit(cache=True, _nrt=False)
def store_expand_and_backup(children, prior, logits, kind, visit_count, value_sum, reward, raw_value,
                            min_value, max_value, path, path_len, sel_parent, sel_action, sel_kind,
                            leaf_reward, leaf_value, leaf_logits, store, latent_address, new_node,
                            batch_size, num_actions, num_chances, discount):
    """:func:`store_latents` of the new nodes' latents (``store`` [Nc, Bc, Z] uint8, ``latent_address`` of
    the network's C-contiguous [B, *latent_shape] output, or 0), then :func:`expand_and_backup`: the whole
    expansion after the network call in one call."""
    store_latents(store, new_node, latent_address, batch_size)
    expand_and_backup_trees(children, prior, logits, kind, visit_count, value_sum, reward, raw_value,
                            min_value, max_value, path, path_len, sel_parent, sel_action, sel_kind,
                            leaf_reward, leaf_value, leaf_logits, new_node, batch_size, num_actions,
                            num_chances, discount, False)


@numba.njit(cache=True, _nrt=False)
def store_expand_and_backup_chance(children, prior, logits, kind, visit_count, value_sum, reward, raw_value,
                                   min_value, max_value, path, path_len, sel_parent, sel_action, sel_kind,
                                   leaf_reward, leaf_value, leaf_logits, store, latent_address, new_node,
                                   batch_size, num_actions, num_chances, discount):
    """:func:`store_expand_and_backup` for trees of decision and chance nodes (Stochastic MuZero)."""
    store_latents(store, new_node, latent_address, batch_size)
    expand_and_backup_trees(children, prior, logits, kind, visit_count, value_sum, reward, raw_value,
                            min_value, max_value, path, path_len, sel_parent, sel_action, sel_kind,
                            leaf_reward, leaf_value, leaf_logits, new_node, batch_size, num_actions,
                            num_chances, discount, True)


@numba.njit(cache=True, _nrt=False, inline="always")
def end_descent(path_len, sel_parent, sel_action, sel_kind, kind, b, node, depth, edge):
    """Record the end of a descent: the path length, the parent of the unexpanded edge, the edge, its kind."""
    path_len[b] = depth + 1
    sel_parent[b] = node
    sel_action[b] = edge
    sel_kind[b] = kind[b, node]


@numba.njit(cache=True, _nrt=False)
def gather_latents(store, sel_parent, sel_action, batch_size, out, out_actions, sim):
    """out[sim, b] = store[sel_parent[b], b] and out_actions[sim, b] = sel_action[b] for b < batch_size: a
    simulation's parent latents and actions, copied into the run's blocks (the network's inputs).

    store [Nc, Bc, Z] uint8 (the latent store's bytes, Z bytes per latent); out [S, B, Z] uint8; both
    C-contiguous; out_actions [S, B] int64. Bytes, so one compiled signature serves every latent dtype and
    shape.
    """
    width = store.shape[2]
    store_at = _address(store)
    out_at = _address(out) + sim * out.shape[1] * width
    for b in range(batch_size):
        _copy_bytes(out_at + b * width, store_at + (sel_parent[b] * store.shape[1] + b) * width, width)
        out_actions[sim, b] = sel_action[b]


@numba.njit(cache=True, _nrt=False)
def root_statistics(
    children, visit_count, value_sum, batch_size, num_actions, out_visit_counts, out_root_value
):
    """out_visit_counts[b, a] = visits of root child a (0 if unexpanded), [>=batch_size, A] int32;
    out_root_value[b] = root value_sum / root visit_count (its network value included), [>=batch_size]."""
    for b in range(batch_size):
        for a in range(num_actions):
            child = children[b, 0, a]
            out_visit_counts[b, a] = visit_count[b, child] if child >= 0 else 0
        out_root_value[b] = value_sum[b, 0] / visit_count[b, 0]
