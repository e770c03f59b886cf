"""Gumbel MuZero search (Danihelka et al. 2022, "Policy improvement by planning with Gumbel"), batched.

What this module owns
    :class:`GumbelMuZeroSearch`, the driver loop (per simulation: one select kernel call, one batched
    ``recurrent_fn`` call, one expand+backup kernel call; latents stored per node as ``[N, B, *latent]``),
    its tree storage :class:`GumbelTreeArrays`, and :func:`reference_gumbel_search`, a slow plain-Python
    implementation of the same rules (the executable specification the kernels are tested against; tests and
    documentation only, never called by production code).

The rules (kernels in :mod:`muzero_tune.mcts.gumbel_kernels`)
    * Root: g = gumbel_scale * Gumbel(0, 1) noise, one ``rng.gumbel(size=(B, A))`` draw when ``add_noise``
      (collecting), g = 0 otherwise (evaluating). The considered actions are the top
      k = min(max_num_considered_actions, #legal) legal actions by g + logits (Gumbel-top-k).
    * Sequential halving over the simulation budget S among the considered actions, with P = ceil(log2 k)
      phases planned: phase p has n_p survivors (n_0 = k, then n_{p+1} = max(2, n_p // 2)), each visited
      v_p = max(1, S // (P * n_p)) times in the phase (fewest visits first; ties by the score below, then
      the lowest index). At a phase end the survivors are ranked by g + logits + sigma(q_hat) and the top
      n_{p+1} kept. When the planned phases do not use the budget, further phases with 2 survivors follow;
      the last phase may be cut short. k = 1: all simulations go to that action.
    * Completed Q at a node: visited child: q(a) = reward + discount * value_sum / N(a); unvisited: the
      mixed value v_mix = (v_hat + (sum_b N(b) / sum_{b visited} pi(b)) * sum_{a visited} pi(a) q(a)) /
      (1 + sum_b N(b)) (v_hat = the network's value of the node, pi = softmax of its logits over the legal
      actions at the root, all actions inside the tree). q_hat = (q - min) / max(max - min,
      value_delta_max) clipped to [0, 1], with the tree's min-max stats (seeded with the root's network value,
      updated at every backup with each non-root node's reward + discount * mean value).
      sigma(q) = (c_visit + max_b N(b)) * c_scale * q_hat.
    * Improved policy pi' = softmax(logits + sigma(completed Q)) (root: over the legal actions).
    * Inside the tree (every action legal): argmax_a(pi'(a) - N(a) / (1 + sum_b N(b))), lowest index on ties.
    * Selected action: argmax of g + logits + sigma(q_hat) among the last survivors (lowest index on ties).
    * Root visit accounting and backup as in :class:`muzero_tune.mcts.search.MuZeroSearch` (root starts
      with 0 visits; root value = mean backed-up return).
    There is no random tie-break: ``deterministic`` is accepted for the interface and has no effect.

What it must never do
    Hold tree arithmetic in the driver, build autograd graphs, or return views into its reusable buffers.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from muzero_tune.mcts import gumbel_kernels as gk
from muzero_tune.mcts.search import LatentStore, RecurrentFn, Search, SearchOutput, _check_shape, _stage


class GumbelTreeArrays:
    """Struct-of-arrays storage for a batch of Gumbel search trees (layout: the kernels module docstring).

    Reallocated only when a search needs a larger batch or more nodes than ever before.
    """

    def __init__(self, *, num_actions: int) -> None:
        self.num_actions = int(num_actions)
        self.batch_capacity = 0
        self.node_capacity = 0
        self.num_reallocations = 0

    def ensure_capacity(self, *, batch_size: int, num_nodes: int) -> bool:
        if batch_size <= self.batch_capacity and num_nodes <= self.node_capacity:
            return False
        bc, nc, a = max(batch_size, self.batch_capacity), max(num_nodes, self.node_capacity), self.num_actions
        self.children = np.full((bc, nc, a), -1, dtype=np.int32)
        self.logits = np.zeros((bc, nc, a), dtype=np.float64)
        self.prior = np.zeros((bc, nc, a), dtype=np.float64)
        self.visit_count = np.zeros((bc, nc), dtype=np.int32)
        self.value_sum = np.zeros((bc, nc), dtype=np.float64)
        self.reward = np.zeros((bc, nc), dtype=np.float64)
        self.raw_value = np.zeros((bc, nc), dtype=np.float64)
        self.min_value = np.zeros(bc, dtype=np.float64)
        self.max_value = np.zeros(bc, dtype=np.float64)
        self.root_legal = np.zeros((bc, a), dtype=np.bool_)
        self.gumbel = np.zeros((bc, a), dtype=np.float64)
        self.considered = np.zeros((bc, a), dtype=np.bool_)
        self.survivor = np.zeros((bc, a), dtype=np.bool_)
        self.num_considered = np.zeros(bc, dtype=np.int32)
        self.num_survivors = np.zeros(bc, dtype=np.int32)
        self.phase = np.zeros(bc, dtype=np.int32)
        self.phase_target = np.zeros(bc, dtype=np.int32)
        self.cq = np.zeros((bc, a), dtype=np.float64)
        self.sigma = np.zeros((bc, a), dtype=np.float64)
        self.scores = np.zeros((bc, a), dtype=np.float64)
        self.path = np.zeros((bc, nc), dtype=np.int32)
        self.path_len = np.zeros(bc, dtype=np.int32)
        self.sel_parent = np.zeros(bc, dtype=np.int32)
        self.sel_action = np.zeros(bc, dtype=np.int32)
        self.root_trace = np.zeros((bc, nc), dtype=np.int32)
        self.phase_trace = np.zeros((bc, nc), dtype=np.int32)
        self.root_logits = np.zeros((bc, a), dtype=np.float64)
        self.root_value = np.zeros(bc, dtype=np.float64)
        self.leaf_reward = np.zeros(bc, dtype=np.float64)
        self.leaf_value = np.zeros(bc, dtype=np.float64)
        self.leaf_logits = np.zeros((bc, a), dtype=np.float64)
        self.batch_capacity, self.node_capacity = bc, nc
        self.num_reallocations += 1
        return True


class GumbelMuZeroSearch(Search):
    """Gumbel MuZero search over discrete actions (rules: the module docstring).

    Randomness consumed from ``rng`` per :meth:`run`: one ``rng.gumbel(size=(B, A))`` call when
    ``add_noise`` (nothing otherwise). ``run`` also takes ``root_value`` [B] (the network's value of each
    root, v_hat of the mixed value; 0 if omitted).

    Output: ``visit_counts`` / ``visit_distribution`` of the root children, ``root_value`` (mean backed-up
    return), ``root_prior`` (softmax of the legal root logits, no noise) and ``extras``:
    ``improved_policy`` [B, A] float32 (pi', the policy target), ``selected_action`` [B] int64,
    ``completed_q`` [B, A] float32 (raw, illegal 0), ``considered`` / ``survivors`` [B, A] bool (the
    Gumbel-top-k set / the last phase's survivors), ``root_actions`` [B, S] int64 and ``phases`` [B, S]
    int32 (root action and halving phase of every simulation).
    Not thread-safe: one instance per thread/actor.
    """

    def __init__(
        self,
        *,
        num_actions: int,
        num_simulations: int,
        max_num_considered_actions: int = 16,
        gumbel_scale: float = 1.0,
        c_visit: float = 50.0,
        c_scale: float = 0.1,
        discount: float = 0.997,
        value_delta_max: float = 0.01,
    ) -> None:
        if num_actions < 1:
            raise ValueError(f"num_actions must be >= 1, got {num_actions}")
        if num_simulations < 1:
            raise ValueError(f"num_simulations must be >= 1, got {num_simulations}")
        if max_num_considered_actions < 1:
            raise ValueError(f"max_num_considered_actions must be >= 1, got {max_num_considered_actions}")
        self._num_actions = int(num_actions)
        self._num_simulations = int(num_simulations)
        self.max_num_considered_actions = int(max_num_considered_actions)
        self.gumbel_scale = float(gumbel_scale)
        self.c_visit = float(c_visit)
        self.c_scale = float(c_scale)
        self.discount = float(discount)
        self.value_delta_max = float(value_delta_max)
        self._tree = GumbelTreeArrays(num_actions=self._num_actions)
        self._store = LatentStore()

    @property
    def num_actions(self) -> int:
        return self._num_actions

    @property
    def num_simulations(self) -> int:
        return self._num_simulations

    @property
    def tree(self) -> GumbelTreeArrays:
        return self._tree

    def run(
        self,
        *,
        root_latent: torch.Tensor,
        root_policy_logits: np.ndarray,
        legal_mask: np.ndarray,
        recurrent_fn: RecurrentFn,
        add_noise: bool,
        deterministic: bool = True,
        rng: np.random.Generator,
        root_value: np.ndarray | None = None,
    ) -> SearchOutput:
        bsz = int(root_latent.shape[0])
        num_actions, num_sims = self._num_actions, self._num_simulations
        legal_mask = np.asarray(legal_mask)
        _check_shape("root_policy_logits", root_policy_logits, (bsz, num_actions))
        _check_shape("legal_mask", legal_mask, (bsz, num_actions))
        if legal_mask.dtype != np.bool_:
            raise TypeError(f"legal_mask must be bool, got {legal_mask.dtype}")
        if not legal_mask.any(axis=1).all():
            raise ValueError("every legal_mask row needs at least one legal action")

        t = self._tree
        num_nodes = num_sims + 1
        t.ensure_capacity(batch_size=bsz, num_nodes=num_nodes)
        b = slice(0, bsz)
        t.root_logits[b] = root_policy_logits
        t.root_legal[b] = legal_mask
        if root_value is None:
            t.root_value[b] = 0.0
        else:
            _stage("root_value", t.root_value[b], np.asarray(root_value))
        if add_noise:
            t.gumbel[b] = rng.gumbel(size=(bsz, num_actions)) * self.gumbel_scale
        else:
            t.gumbel[b] = 0.0
        gk.prepare_roots(
            t.children,
            t.logits,
            t.prior,
            t.visit_count,
            t.value_sum,
            t.reward,
            t.raw_value,
            t.min_value,
            t.max_value,
            t.root_legal,
            t.root_logits,
            t.root_value,
            t.gumbel,
            t.considered,
            t.survivor,
            t.num_considered,
            t.num_survivors,
            t.phase,
            t.phase_target,
            bsz,
            num_nodes,
            self.max_num_considered_actions,
            num_sims,
        )
        knobs = (self.discount, self.value_delta_max, self.c_visit, self.c_scale)
        with torch.no_grad():
            latents, batch_index = self._store.ensure(root_latent, num_nodes=num_sims + 1, batch_size=bsz)
            latents[0, :bsz].copy_(root_latent)
            for sim in range(num_sims):
                gk.select_leaves(
                    t.children,
                    t.logits,
                    t.prior,
                    t.visit_count,
                    t.value_sum,
                    t.reward,
                    t.raw_value,
                    t.min_value,
                    t.max_value,
                    t.root_legal,
                    t.gumbel,
                    t.survivor,
                    t.num_considered,
                    t.num_survivors,
                    t.phase,
                    t.phase_target,
                    t.cq,
                    t.sigma,
                    t.scores,
                    t.path,
                    t.path_len,
                    t.sel_parent,
                    t.sel_action,
                    t.root_trace,
                    t.phase_trace,
                    sim,
                    bsz,
                    num_sims,
                    *knobs,
                )
                parent_node = torch.from_numpy(t.sel_parent[b]).to(device=latents.device, dtype=torch.long)
                parent_latent = latents[parent_node, batch_index]
                actions = t.sel_action[b].astype(np.int64)
                next_latent, reward, value, logits = recurrent_fn(parent_latent, actions)
                if tuple(next_latent.shape) != tuple(root_latent.shape):
                    raise ValueError(
                        f"recurrent_fn next_latent shape {tuple(next_latent.shape)} "
                        f"!= root_latent shape {tuple(root_latent.shape)}"
                    )
                latents[sim + 1, :bsz].copy_(next_latent)
                _stage("reward", t.leaf_reward[b], reward)
                _stage("value", t.leaf_value[b], value)
                _stage("policy_logits", t.leaf_logits[b], logits)
                gk.expand_and_backup(
                    t.children,
                    t.logits,
                    t.prior,
                    t.visit_count,
                    t.value_sum,
                    t.reward,
                    t.raw_value,
                    t.min_value,
                    t.max_value,
                    t.path,
                    t.path_len,
                    t.sel_parent,
                    t.sel_action,
                    t.leaf_reward,
                    t.leaf_value,
                    t.leaf_logits,
                    sim + 1,
                    bsz,
                    self.discount,
                )

        visits = np.empty((bsz, num_actions), dtype=np.int32)
        root_val = np.empty(bsz, dtype=np.float64)
        completed_q = np.empty((bsz, num_actions), dtype=np.float64)
        improved = np.empty((bsz, num_actions), dtype=np.float64)
        selected = np.empty(bsz, dtype=np.int64)
        gk.root_outputs(
            t.children,
            t.logits,
            t.prior,
            t.visit_count,
            t.value_sum,
            t.reward,
            t.raw_value,
            t.min_value,
            t.max_value,
            t.root_legal,
            t.gumbel,
            t.survivor,
            t.cq,
            t.sigma,
            bsz,
            *knobs,
            visits,
            root_val,
            completed_q,
            improved,
            selected,
        )
        return SearchOutput(
            visit_counts=visits,
            visit_distribution=(visits / visits.sum(axis=1, keepdims=True)).astype(np.float32),
            root_value=root_val.astype(np.float32),
            root_prior=t.prior[b, 0].astype(np.float32),
            extras={
                "improved_policy": improved.astype(np.float32),
                "selected_action": selected,
                "completed_q": completed_q.astype(np.float32),
                "considered": t.considered[b].copy(),
                "survivors": t.survivor[b].copy(),
                "root_actions": t.root_trace[b, :num_sims].astype(np.int64),
                "phases": t.phase_trace[b, :num_sims].copy(),
            },
        )


# ---------------------------------------------------------------------------------------------- reference


def sequential_halving_visits(num_considered: int, num_survivors: int, num_simulations: int) -> int:
    """v_p: visits per survivor in a phase with ``num_survivors`` survivors (k = num_considered)."""
    if num_considered <= 1:
        return num_simulations
    log2max = math.ceil(math.log2(num_considered))
    return max(1, num_simulations // (log2max * num_survivors))


class _RefNode:
    def __init__(self, *, reward: float, logits: list[float], value: float, latent: torch.Tensor) -> None:
        self.reward = reward
        self.logits = logits
        self.raw_value = value
        self.children: list[_RefNode | None] = [None] * len(logits)
        self.visit_count = 0
        self.value_sum = 0.0
        self.latent = latent


def _normalise(q: float, lo: float, hi: float, value_delta_max: float) -> float:
    span = max(hi - lo, value_delta_max)
    if span <= 0.0:
        return 0.0
    return min(max((q - lo) / span, 0.0), 1.0)


def _completed_sigma(
    node: _RefNode,
    legal: list[bool],
    lo: float,
    hi: float,
    *,
    discount: float,
    value_delta_max: float,
    c_visit: float,
    c_scale: float,
):
    """(prior probs, completed Q, sigma, sum N) of ``node``'s edges; illegal: 0, 0, -inf."""
    m = -math.inf
    for x, ok in zip(node.logits, legal):
        if ok and x > m:
            m = x
    prob, total = [], 0.0
    for x, ok in zip(node.logits, legal):
        e = math.exp(x - m) if ok else 0.0
        prob.append(e)
        if ok:
            total += e
    prob = [p / total for p in prob]
    num_actions = len(legal)
    cq = [0.0] * num_actions
    sum_n, max_n, sum_p, sum_pq = 0, 0, 0.0, 0.0
    for a, child in enumerate(node.children):
        if child is not None:
            q = child.reward + discount * (child.value_sum / child.visit_count)
            cq[a] = q
            sum_n += child.visit_count
            max_n = max(max_n, child.visit_count)
            sum_p += prob[a]
            sum_pq += prob[a] * q
    if sum_n == 0:
        v_mix = node.raw_value
    else:
        v_mix = (node.raw_value + (sum_n / max(sum_p, gk.TINY)) * sum_pq) / (1.0 + sum_n)
    scale = (c_visit + max_n) * c_scale
    sigma = [-math.inf] * num_actions
    for a in range(num_actions):
        if legal[a]:
            if node.children[a] is None:
                cq[a] = v_mix
            sigma[a] = scale * _normalise(cq[a], lo, hi, value_delta_max)
        else:
            cq[a] = 0.0
    return prob, cq, sigma, sum_n


def reference_gumbel_search(
    *,
    root_latent: torch.Tensor,
    root_policy_logits: np.ndarray,
    legal_mask: np.ndarray,
    recurrent_fn: RecurrentFn,
    num_simulations: int,
    add_noise: bool,
    rng: np.random.Generator,
    root_value: np.ndarray | None = None,
    max_num_considered_actions: int = 16,
    gumbel_scale: float = 1.0,
    c_visit: float = 50.0,
    c_scale: float = 0.1,
    discount: float = 0.997,
    value_delta_max: float = 0.01,
) -> SearchOutput:
    """The Gumbel search rules in plain Python (object per node); same arguments, randomness and output as
    :meth:`GumbelMuZeroSearch.run`, plus ``extras["phase_survivors"]``: per tree, the list of survivor sets
    (sorted action lists) of every phase."""
    bsz, num_actions = np.shape(root_policy_logits)
    knobs = dict(discount=discount, value_delta_max=value_delta_max, c_visit=c_visit, c_scale=c_scale)
    gumbel = rng.gumbel(size=(bsz, num_actions)) * gumbel_scale if add_noise else np.zeros((bsz, num_actions))
    rv = np.zeros(bsz) if root_value is None else np.asarray(root_value, dtype=np.float64)
    roots, legal_rows, minmax, considered, survivors, k_of = [], [], [], [], [], []
    phase, target, history = [0] * bsz, [0] * bsz, []
    for b in range(bsz):
        legal = [bool(x) for x in legal_mask[b]]
        logits = [float(x) for x in root_policy_logits[b]]
        roots.append(_RefNode(reward=0.0, logits=logits, value=float(rv[b]), latent=root_latent[b]))
        legal_rows.append(legal)
        minmax.append([float(rv[b]), float(rv[b])])
        k = min(max_num_considered_actions, sum(legal))
        order = sorted(
            (a for a in range(num_actions) if legal[a]),
            key=lambda a, b=b, lg=logits: (-(float(gumbel[b, a]) + lg[a]), a),
        )
        considered.append(set(order[:k]))
        survivors.append(set(order[:k]))
        k_of.append(k)
        target[b] = sequential_halving_visits(k, k, num_simulations)
        history.append([sorted(order[:k])])
    root_actions = np.zeros((bsz, num_simulations), dtype=np.int64)
    phases = np.zeros((bsz, num_simulations), dtype=np.int32)

    def visits(node: _RefNode, a: int) -> int:
        c = node.children[a]
        return 0 if c is None else c.visit_count

    with torch.no_grad():
        for sim in range(num_simulations):
            paths, actions = [], []
            for b in range(bsz):
                root, legal = roots[b], legal_rows[b]
                lo, hi = minmax[b]
                _, _, sigma, _ = _completed_sigma(root, legal, lo, hi, **knobs)
                score = {a: float(gumbel[b, a]) + root.logits[a] + sigma[a] for a in survivors[b]}
                if all(visits(root, a) >= target[b] for a in survivors[b]):
                    if len(survivors[b]) > 2:
                        n_next = max(2, len(survivors[b]) // 2)
                        ranked = sorted(survivors[b], key=lambda a, s=score: (-s[a], a))
                        survivors[b] = set(ranked[:n_next])
                        history[b].append(sorted(survivors[b]))
                    else:
                        history[b].append(sorted(survivors[b]))
                    phase[b] += 1
                    target[b] += sequential_halving_visits(k_of[b], len(survivors[b]), num_simulations)
                candidates = [a for a in sorted(survivors[b]) if visits(root, a) < target[b]]
                action = min(candidates, key=lambda a: (visits(root, a), -score[a], a))
                root_actions[b, sim] = action
                phases[b, sim] = phase[b]
                node, path = root, [root]
                while node.children[action] is not None:
                    node = node.children[action]
                    path.append(node)
                    _, _, sigma, sum_n = _completed_sigma(node, [True] * num_actions, lo, hi, **knobs)
                    z = [x + s for x, s in zip(node.logits, sigma)]
                    m = max(z)
                    e = [math.exp(x - m) for x in z]
                    total = 0.0
                    for x in e:
                        total += x
                    sel = [e[a] / total - visits(node, a) / (1.0 + sum_n) for a in range(num_actions)]
                    action = sel.index(max(sel))
                paths.append(path)
                actions.append(action)

            parent_latent = torch.stack([p[-1].latent for p in paths])
            action_array = np.array(actions, dtype=np.int64)
            next_latent, reward, value, logits = recurrent_fn(parent_latent, action_array)
            for b in range(bsz):
                path = paths[b]
                leaf = _RefNode(
                    reward=float(reward[b]),
                    logits=[float(x) for x in logits[b]],
                    value=float(value[b]),
                    latent=next_latent[b].clone(),
                )
                path[-1].children[actions[b]] = leaf
                path.append(leaf)
                g = float(value[b])
                for depth in range(len(path) - 1, -1, -1):
                    node = path[depth]
                    node.value_sum += g
                    node.visit_count += 1
                    if depth > 0:
                        q = node.reward + discount * (node.value_sum / node.visit_count)
                        minmax[b][0] = min(minmax[b][0], q)
                        minmax[b][1] = max(minmax[b][1], q)
                    g = node.reward + discount * g

    visit_counts = np.zeros((bsz, num_actions), dtype=np.int32)
    improved = np.zeros((bsz, num_actions))
    completed = np.zeros((bsz, num_actions))
    prior = np.zeros((bsz, num_actions))
    selected = np.zeros(bsz, dtype=np.int64)
    for b in range(bsz):
        root, legal = roots[b], legal_rows[b]
        prob, cq, sigma, _ = _completed_sigma(root, legal, *minmax[b], **knobs)
        prior[b], completed[b] = prob, cq
        for a in range(num_actions):
            visit_counts[b, a] = visits(root, a)
        z = [root.logits[a] + sigma[a] if legal[a] else -math.inf for a in range(num_actions)]
        m = max(z)
        e = [math.exp(x - m) if legal[a] else 0.0 for a, x in enumerate(z)]
        total = 0.0
        for a in range(num_actions):
            if legal[a]:
                total += e[a]
        improved[b] = [x / total for x in e]
        selected[b] = max(
            sorted(survivors[b]),
            key=lambda a, b=b, s=sigma, r=root: (float(gumbel[b, a]) + r.logits[a] + s[a], -a),
        )
    return SearchOutput(
        visit_counts=visit_counts,
        visit_distribution=(visit_counts / visit_counts.sum(axis=1, keepdims=True)).astype(np.float32),
        root_value=np.array([r.value_sum / r.visit_count for r in roots], dtype=np.float32),
        root_prior=prior.astype(np.float32),
        extras={
            "improved_policy": improved.astype(np.float32),
            "selected_action": selected,
            "completed_q": completed.astype(np.float32),
            "considered": np.array([[a in c for a in range(num_actions)] for c in considered]),
            "survivors": np.array([[a in s for a in range(num_actions)] for s in survivors]),
            "root_actions": root_actions,
            "phases": phases,
            "phase_survivors": history,
        },
    )
