"""Plain-Python reference searches: the executable specification of the rules the kernels implement.

What this module owns
    Slow, object-per-node, one-float-at-a-time implementations of exactly the searches
    :class:`~muzero_tune.mcts.search.MuZeroSearch`,
    :class:`~muzero_tune.mcts.stochastic.StochasticMuZeroSearch` and
    :class:`~muzero_tune.mcts.gumbel.GumbelMuZeroSearch` run. The tests require the kernels to agree with them
    bit for bit in deterministic mode; every float operation is done in Python float64 in the
    same order as the kernels, with explicit loops (no ``sum()``, no numpy reductions) so the rounding is
    identical. The three variants share one root preparation (:func:`_make_root`) and one backup
    (:func:`_backup`), as the kernels share :mod:`muzero_tune.mcts.kernels`.

    Agreement with the kernels only proves the two are written alike; the rules themselves are pinned by
    independent checks: hand-worked trees derived from the published formulas (tests/test_search_rules.py)
    and ``mctx.gumbel_muzero_policy`` as an oracle for Gumbel (tests/test_gumbel_vs_mctx.py).

What it must never do
    Be imported by production code paths (it is slow), or diverge from the kernels: when a rule changes,
    change it here and in the kernels together.

The rules (shared)
    * Trees: one per batch element, advanced in lockstep; one batched network call per simulation (two when
      a stochastic batch mixes edge kinds); every simulation expands exactly one node per tree.
    * Root: priors = softmax of the logits over the legal actions (illegal prior exactly 0, never selected);
      with noise, prior = (1 - w) * prior + w * eta where eta = Gamma(alpha) draws
      ``rng.standard_gamma(alpha, size=(B, A))`` normalised over the legal actions (= Dirichlet). Inside the
      tree every action is legal. The root's initial inference is its first visit: visit_count 1,
      value_sum = the network's root value (mctx, LightZero), so the children's visits sum to S.
    * Q(node) = reward(node) + d(node) * value_sum(node) / visit_count(node); d = discount, or 1 for a
      chance node (no reward, no discount into a chance node).
    * Min-max stats per tree (``q_transform="tree_min_max"``): every non-root node on a backup path records
      its Q, the root its own mean value value_sum / visit_count (on its children's scale); the root's
      counted visit records the root value at preparation.
      normalise(Q) = (Q - min) / max(max - min, value_delta_max) clipped to [0, 1], 0 when that span is 0.
      ``q_transform="parent_and_siblings"``: the same normalise over a per-node range instead, the node's
      own mean value and its visited children's Qs (mctx's ``qtransform_by_parent_and_siblings``).
    * Expansion: the new node stores the predicted reward, its logits and network value, and the softmax of
      its logits (over A actions for a decision node, C codes for a chance node).
    * Backup from leaf to root: G = value(leaf); for each node: value_sum += G, visit_count += 1,
      min-max.update(Q(node)); then G = reward + d * G.

MuZero selection (pUCT) at a decision node with visit count N
    score(a) = Q_norm(child) + prior(a) * sqrt(N) / (1 + n(a)) * (pb_c_init + log((N + pb_c_base + 1) /
    pb_c_base)); Q_norm = normalise(Q(child)) for visited children; for unvisited ones normalise(value_sum /
    visit_count) of the node itself (``unvisited_q="parent"``) or 0 (``"min"``). Ties: lowest
    action index when deterministic, else uniform among scores within 1e-9 of the max (here drawn from
    ``rng``; the kernels use numba's RNG, so only deterministic runs are comparable bit for bit).

Chance nodes and Gumbel: :mod:`muzero_tune.mcts.chance` and :mod:`muzero_tune.mcts.gumbel_kernels` state
their rules; :func:`reference_stochastic_search` and :func:`reference_gumbel_search` implement them.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from muzero_tune.mcts import sampled_kernels as smk
from muzero_tune.mcts.gumbel_kernels import TINY, considered_visit_table
from muzero_tune.mcts.sampled import resolved_sampled_prior
from muzero_tune.mcts.search import RecurrentFn, SearchOutput

_TIE_TOLERANCE = 1e-9
DECISION, CHANCE = 0, 1


class _MinMax:
    def __init__(self, q: float) -> None:
        self.minimum = q
        self.maximum = q

    def update(self, value: float) -> None:
        if value < self.minimum:
            self.minimum = value
        if value > self.maximum:
            self.maximum = value

    def normalise(self, value: float, value_delta_max: float) -> float:
        span = max(self.maximum - self.minimum, value_delta_max)
        if span <= 0.0:
            return 0.0
        return min(max((value - self.minimum) / span, 0.0), 1.0)


class _Node:
    """One tree node; ``priors``, ``logits`` and ``children`` are indexed by edge (None: not expanded)."""

    def __init__(
        self,
        *,
        kind: int,
        reward: float,
        logits: list[float],
        priors: list[float],
        value: float,
        latent: torch.Tensor,
    ) -> None:
        self.kind = kind
        self.reward = reward
        self.logits = logits
        self.priors = priors
        self.raw_value = value
        self.children: list[_Node | None] = [None] * len(priors)
        self.visit_count = 0
        self.value_sum = 0.0
        self.latent = latent  # [*latent_shape]

    def q(self, discount: float) -> float:
        d = 1.0 if self.kind == CHANCE else discount
        return self.reward + d * (self.value_sum / self.visit_count)


def _softmax(logits: list[float], legal: list[bool] | None = None) -> list[float]:
    legal = [True] * len(logits) if legal is None else legal
    m = -math.inf
    for x, ok in zip(logits, legal):
        if ok and x > m:
            m = x
    exps = [math.exp(x - m) if ok else 0.0 for x, ok in zip(logits, legal)]
    total = 0.0
    for e, ok in zip(exps, legal):
        if ok:
            total += e
    return [e / total if ok else 0.0 for e, ok in zip(exps, legal)]


def _make_root(
    *,
    logits: list[float],
    legal: list[bool],
    value: float,
    latent: torch.Tensor,
    noise: np.ndarray | None,
    noise_weight: float,
    priors: list[float] | None = None,
) -> tuple[_Node, _MinMax]:
    """The root with its priors (softmax of the legal logits unless ``priors`` is given; noise mixed in over
    the legal edges when ``noise`` [A] is given) and its counted first visit."""
    priors = _softmax(logits, legal) if priors is None else list(priors)
    if noise is not None:
        total = 0.0
        for a, ok in enumerate(legal):
            if ok:
                total += float(noise[a])
        num_legal = 0
        for ok in legal:
            num_legal += int(ok)
        for a, ok in enumerate(legal):
            if ok:
                eta = float(noise[a]) / total if total > 0.0 else 1.0 / num_legal
                priors[a] = (1.0 - noise_weight) * priors[a] + noise_weight * eta
    root = _Node(kind=DECISION, reward=0.0, logits=list(logits), priors=priors, value=value, latent=latent)
    root.visit_count = 1
    root.value_sum = value
    return root, _MinMax(value / 1.0)


def _expand(
    path: list[_Node],
    edge: int,
    *,
    kind: int,
    reward: float,
    value: float,
    logits: list[float],
    latent: torch.Tensor,
    priors: list[float] | None = None,
) -> _Node:
    """Attach the new leaf at ``edge`` of ``path[-1]`` (priors: the softmax of its logits unless given) and
    append it to ``path``."""
    priors = _softmax(logits) if priors is None else priors
    leaf = _Node(kind=kind, reward=reward, logits=logits, priors=priors, value=value, latent=latent)
    path[-1].children[edge] = leaf
    path.append(leaf)
    return leaf


def _backup(path: list[_Node], g: float, minmax: _MinMax, discount: float) -> None:
    """Back the leaf value ``g`` up ``path`` (root first) with the shared rules."""
    for i in range(len(path) - 1, -1, -1):
        node = path[i]
        node.value_sum += g
        node.visit_count += 1
        minmax.update(node.value_sum / node.visit_count if i == 0 else node.q(discount))
        d = 1.0 if node.kind == CHANCE else discount
        g = node.reward + d * g


def _visits(node: _Node, a: int) -> int:
    child = node.children[a]
    return 0 if child is None else child.visit_count


def _puct_edge(
    node: _Node,
    is_root: bool,
    legal: list[bool],
    minmax: _MinMax,
    *,
    pb_c_base: float,
    pb_c_init: float,
    discount: float,
    value_delta_max: float,
    deterministic: bool,
    unvisited_q: str,
    tie_break,
    q_transform: str = "tree_min_max",
) -> int:
    if q_transform == "parent_and_siblings":
        minmax = _MinMax(node.value_sum / node.visit_count)
        for child in node.children:
            if child is not None:
                minmax.update(child.q(discount))
    n_parent = node.visit_count
    pb_c = pb_c_init + math.log((n_parent + pb_c_base + 1.0) / pb_c_base)
    q_unvisited = 0.0
    if unvisited_q == "parent":
        q_unvisited = minmax.normalise(node.value_sum / n_parent, value_delta_max)
    scores = []
    for a in range(len(legal) if is_root else len(node.priors)):
        if is_root and not legal[a]:
            scores.append(-math.inf)
            continue
        child = node.children[a]
        if child is None:
            n_child, q_norm = 0, q_unvisited
        else:
            n_child, q_norm = child.visit_count, minmax.normalise(child.q(discount), value_delta_max)
        scores.append(q_norm + node.priors[a] * math.sqrt(n_parent) / (1.0 + n_child) * pb_c)
    best = max(scores)
    tied = [a for a, s in enumerate(scores) if s >= best - _TIE_TOLERANCE]
    if deterministic or len(tied) == 1:
        return scores.index(best)
    return tied[tie_break(len(tied))]


def _root_value(roots: list[_Node]) -> np.ndarray:
    return np.array([r.value_sum / r.visit_count for r in roots], dtype=np.float32)


def _prepare_batch(root_latent, root_policy_logits, legal_mask, root_value, noise, noise_weight):
    roots, bounds, legal_rows = [], [], []
    for b in range(np.shape(root_policy_logits)[0]):
        legal = [bool(x) for x in legal_mask[b]]
        root, minmax = _make_root(
            logits=[float(x) for x in root_policy_logits[b]], legal=legal, value=float(root_value[b]),
            latent=root_latent[b], noise=None if noise is None else noise[b], noise_weight=noise_weight,
        )  # fmt: skip
        roots.append(root)
        bounds.append(minmax)
        legal_rows.append(legal)
    return roots, bounds, legal_rows


def reference_search(
    *,
    root_latent: torch.Tensor,
    root_policy_logits: np.ndarray,
    legal_mask: np.ndarray,
    recurrent_fn: RecurrentFn,
    num_simulations: int,
    add_noise: bool,
    deterministic: bool,
    rng: np.random.Generator,
    root_value: np.ndarray,
    pb_c_base: float = 19652.0,
    pb_c_init: float = 1.25,
    discount: float = 0.997,
    dirichlet_alpha: float = 0.3,
    noise_weight: float = 0.25,
    value_delta_max: float = 0.01,
    unvisited_q: str = "min",
    q_transform: str = "tree_min_max",
) -> SearchOutput:
    """MuZero's search (module rules); same arguments, randomness consumption and output as
    :meth:`muzero_tune.mcts.search.MuZeroSearch.run`."""
    bsz, num_actions = np.shape(root_policy_logits)
    noise = rng.standard_gamma(dirichlet_alpha, size=(bsz, num_actions)) if add_noise else None
    roots, bounds, legal_rows = _prepare_batch(
        root_latent, root_policy_logits, legal_mask, root_value, noise, noise_weight
    )
    knobs = dict(
        pb_c_base=pb_c_base,
        pb_c_init=pb_c_init,
        discount=discount,
        value_delta_max=value_delta_max,
        deterministic=deterministic,
        unvisited_q=unvisited_q,
        q_transform=q_transform,
        tie_break=lambda n: int(rng.integers(0, n)),
    )
    with torch.no_grad():
        for _ in range(num_simulations):
            paths, actions = [], []
            for b in range(bsz):
                node, path = roots[b], [roots[b]]
                while True:
                    action = _puct_edge(node, node is roots[b], legal_rows[b], bounds[b], **knobs)
                    if node.children[action] is None:
                        break
                    node = node.children[action]
                    path.append(node)
                paths.append(path)
                actions.append(action)
            parent_latent = torch.stack([p[-1].latent for p in paths])
            next_latent, reward, value, logits = recurrent_fn(
                parent_latent, np.array(actions, dtype=np.int64)
            )
            for b in range(bsz):
                _expand(
                    paths[b],
                    actions[b],
                    kind=DECISION,
                    reward=float(reward[b]),
                    value=float(value[b]),
                    logits=[float(x) for x in logits[b]],
                    latent=next_latent[b].clone(),
                )
                _backup(paths[b], float(value[b]), bounds[b], discount)
    visit_counts = np.array([[_visits(r, a) for a in range(num_actions)] for r in roots], dtype=np.int32)
    return SearchOutput(
        visit_counts=visit_counts,
        visit_distribution=(visit_counts / visit_counts.sum(axis=1, keepdims=True)).astype(np.float32),
        root_value=_root_value(roots),
        root_prior=np.array([r.priors for r in roots], dtype=np.float32),
    )


def reference_stochastic_search(
    *,
    root_latent: torch.Tensor,
    root_policy_logits: np.ndarray,
    legal_mask: np.ndarray,
    recurrent_fn: RecurrentFn,
    afterstate_fn,
    num_simulations: int,
    add_noise: bool,
    deterministic: bool,
    rng: np.random.Generator,
    root_value: np.ndarray,
    chance_selection: str = "sample",
    pb_c_base: float = 19652.0,
    pb_c_init: float = 1.25,
    discount: float = 0.997,
    dirichlet_alpha: float = 0.3,
    noise_weight: float = 0.25,
    value_delta_max: float = 0.01,
    unvisited_q: str = "min",
    q_transform: str = "tree_min_max",
) -> tuple[np.ndarray, np.ndarray, list[_Node], int]:
    """Stochastic MuZero's search (module rules and :mod:`muzero_tune.mcts.chance`). Randomness: the same
    ``rng`` calls as :class:`~muzero_tune.mcts.stochastic.StochasticMuZeroSearch`, then a legacy
    ``RandomState(seed)``, whose streams equal numba's after ``np.random.seed(seed)``. Returns (visit counts
    [B, A] int32, root values [B] float64, the roots, the number of batched network calls)."""
    bsz, num_actions = np.shape(root_policy_logits)
    noise = rng.standard_gamma(dirichlet_alpha, size=(bsz, num_actions)) if add_noise else None
    rs = np.random.RandomState(int(rng.integers(0, 2**31 - 1)))
    roots, bounds, legal_rows = _prepare_batch(
        root_latent, root_policy_logits, legal_mask, root_value, noise, noise_weight
    )
    knobs = dict(
        pb_c_base=pb_c_base,
        pb_c_init=pb_c_init,
        discount=discount,
        value_delta_max=value_delta_max,
        deterministic=deterministic,
        unvisited_q=unvisited_q,
        q_transform=q_transform,
        tie_break=lambda n: rs.randint(0, n),
    )

    def chance_edge(node: _Node) -> int:
        if chance_selection == "sample":
            u, cum, edge, last = rs.random_sample(), 0.0, -1, -1
            for c, p in enumerate(node.priors):
                if p > 0.0:
                    cum += p
                    last = c
                    if u < cum:
                        edge = c
                        break
            return edge if edge >= 0 else last
        scores = [p / (1.0 + _visits(node, c)) for c, p in enumerate(node.priors)]
        return scores.index(max(scores))

    calls = 0
    with torch.no_grad():
        for _ in range(num_simulations):
            paths, edges = [], []
            for b in range(bsz):
                node, path = roots[b], [roots[b]]
                while True:
                    if node.kind == CHANCE:
                        edge = chance_edge(node)
                    else:
                        edge = _puct_edge(node, node is roots[b], legal_rows[b], bounds[b], **knobs)
                    if node.children[edge] is None:
                        break
                    node = node.children[edge]
                    path.append(node)
                paths.append(path)
                edges.append(edge)
            outs: dict[int, tuple] = {}
            for kind in (DECISION, CHANCE):
                rows = [b for b in range(bsz) if paths[b][-1].kind == kind]
                if not rows:
                    continue
                lat = torch.stack([paths[b][-1].latent for b in rows])
                e = np.array([edges[b] for b in rows], dtype=np.int64)
                calls += 1
                if kind == DECISION:
                    nxt, value, logits = afterstate_fn(lat, e)
                    reward = np.zeros(len(rows))
                else:
                    nxt, reward, value, logits = recurrent_fn(lat, e)
                for j, b in enumerate(rows):
                    outs[b] = (nxt[j], float(reward[j]), float(value[j]), [float(x) for x in logits[j]])
            for b in range(bsz):
                nxt, reward, value, logits = outs[b]
                _expand(
                    paths[b],
                    edges[b],
                    kind=1 - paths[b][-1].kind,
                    reward=reward,
                    value=value,
                    logits=logits,
                    latent=nxt.clone(),
                )
                _backup(paths[b], value, bounds[b], discount)
    visits = np.array([[_visits(r, a) for a in range(num_actions)] for r in roots], np.int32)
    return visits, np.array([r.value_sum / r.visit_count for r in roots]), roots, calls


def _completed_sigma(
    node: _Node, legal: list[bool], *, discount: float, value_delta_max: float, c_visit: float, c_scale: float
) -> tuple[list[float], list[float], int]:
    """(completed Q, sigma, sum N) of ``node``'s edges (gumbel_kernels rules); illegal root edges: 0, -inf."""
    num_actions = len(legal)
    cq = [0.0] * num_actions
    sum_n, max_n, sum_p, sum_pq = 0, 0, 0.0, 0.0
    for a, child in enumerate(node.children[:num_actions]):
        if child is not None:
            q = child.reward + discount * (child.value_sum / child.visit_count)
            cq[a] = q
            sum_n += child.visit_count
            max_n = max(max_n, child.visit_count)
            sum_p += node.priors[a]
            sum_pq += node.priors[a] * q
    if sum_n == 0:
        v_mix = node.raw_value
    else:
        v_mix = (node.raw_value + (sum_n / max(sum_p, TINY)) * sum_pq) / (1.0 + sum_n)
    lo, hi = math.inf, -math.inf
    for a in range(num_actions):
        if node.children[a] is None:
            cq[a] = v_mix  # illegal root edges too: their imputed value takes part in the range (as mctx)
        lo, hi = min(lo, cq[a]), max(hi, cq[a])
    span = max(hi - lo, value_delta_max)
    scale = (c_visit + max_n) * c_scale
    sigma = [-math.inf] * num_actions
    for a in range(num_actions):
        if legal[a]:
            sigma[a] = scale * ((cq[a] - lo) / span) if span > 0.0 else 0.0
        else:
            cq[a] = 0.0
    return cq, sigma, sum_n


def reference_gumbel_search(
    *,
    root_latent: torch.Tensor,
    root_policy_logits: np.ndarray,
    legal_mask: np.ndarray,
    recurrent_fn: RecurrentFn,
    num_simulations: int,
    add_noise: bool,
    rng: np.random.Generator,
    root_value: np.ndarray,
    max_num_considered_actions: int = 16,
    gumbel_scale: float = 1.0,
    c_visit: float = 50.0,
    c_scale: float = 0.1,
    discount: float = 0.997,
    value_delta_max: float = 0.01,
) -> SearchOutput:
    """Gumbel MuZero's search (rules: :mod:`muzero_tune.mcts.gumbel_kernels`); same arguments, randomness
    and output as :meth:`muzero_tune.mcts.gumbel.GumbelMuZeroSearch.run`."""
    bsz, num_actions = np.shape(root_policy_logits)
    knobs = dict(discount=discount, value_delta_max=value_delta_max, c_visit=c_visit, c_scale=c_scale)
    gumbel = rng.gumbel(size=(bsz, num_actions)) * gumbel_scale if add_noise else np.zeros((bsz, num_actions))
    roots, bounds, legal_rows = _prepare_batch(
        root_latent, root_policy_logits, legal_mask, root_value, None, 0.0
    )
    table = considered_visit_table(min(max_num_considered_actions, num_actions), num_simulations)
    considered, k_of = [], []
    for b in range(bsz):
        legal, logits = legal_rows[b], roots[b].logits
        k = min(max_num_considered_actions, sum(legal))
        order = sorted(
            (a for a in range(num_actions) if legal[a]), key=lambda a, b=b: (-(gumbel[b, a] + logits[a]), a)
        )
        considered.append(set(order[:k]))
        k_of.append(k)
    root_actions = np.zeros((bsz, num_simulations), dtype=np.int64)
    with torch.no_grad():
        for sim in range(num_simulations):
            paths, actions = [], []
            for b in range(bsz):
                root, legal = roots[b], legal_rows[b]
                _, sigma, _ = _completed_sigma(root, legal, **knobs)
                target = table[k_of[b], sim]
                candidates = [a for a in range(num_actions) if legal[a] and _visits(root, a) == target]
                action = max(candidates, key=lambda a: (gumbel[b, a] + root.logits[a] + sigma[a], -a))
                root_actions[b, sim] = action
                node, path = root, [root]
                while node.children[action] is not None:
                    node = node.children[action]
                    path.append(node)
                    _, sigma, sum_n = _completed_sigma(node, [True] * num_actions, **knobs)
                    z = [x + s for x, s in zip(node.logits, sigma)]
                    m = max(z)
                    e = [math.exp(x - m) for x in z]
                    total = 0.0
                    for x in e:
                        total += x
                    sel = [e[a] / total - _visits(node, a) / (1.0 + sum_n) for a in range(num_actions)]
                    action = sel.index(max(sel))
                paths.append(path)
                actions.append(action)
            parent_latent = torch.stack([p[-1].latent for p in paths])
            next_latent, reward, value, logits = recurrent_fn(
                parent_latent, np.array(actions, dtype=np.int64)
            )
            for b in range(bsz):
                _expand(
                    paths[b],
                    actions[b],
                    kind=DECISION,
                    reward=float(reward[b]),
                    value=float(value[b]),
                    logits=[float(x) for x in logits[b]],
                    latent=next_latent[b].clone(),
                )
                _backup(paths[b], float(value[b]), bounds[b], discount)

    visit_counts = np.zeros((bsz, num_actions), dtype=np.int32)
    improved, completed = np.zeros((bsz, num_actions)), np.zeros((bsz, num_actions))
    most_visited = np.zeros((bsz, num_actions), dtype=bool)
    selected = np.zeros(bsz, dtype=np.int64)
    for b in range(bsz):
        root, legal = roots[b], legal_rows[b]
        cq, sigma, _ = _completed_sigma(root, legal, **knobs)
        completed[b] = cq
        visit_counts[b] = [_visits(root, a) for a in range(num_actions)]
        z = [root.logits[a] + sigma[a] if legal[a] else -math.inf for a in range(num_actions)]
        m = max(z)
        e = [math.exp(x - m) if legal[a] else 0.0 for a, x in enumerate(z)]
        total = 0.0
        for a in range(num_actions):
            if legal[a]:
                total += e[a]
        improved[b] = [x / total for x in e]
        max_n = max(int(visit_counts[b, a]) for a in range(num_actions) if legal[a])
        most_visited[b] = [legal[a] and visit_counts[b, a] == max_n for a in range(num_actions)]
        selected[b] = max(
            np.flatnonzero(most_visited[b]), key=lambda a, b=b: (gumbel[b, a] + root.logits[a] + sigma[a], -a)
        )
    return SearchOutput(
        visit_counts=visit_counts,
        visit_distribution=(visit_counts / visit_counts.sum(axis=1, keepdims=True)).astype(np.float32),
        root_value=_root_value(roots),
        root_prior=np.array([r.priors for r in roots], dtype=np.float32),
        extras={
            "improved_policy": improved.astype(np.float32),
            "selected_action": selected,
            "completed_q": completed.astype(np.float32),
            "considered": np.array([[a in c for a in range(num_actions)] for c in considered]),
            "survivors": most_visited,
            "root_actions": root_actions,
        },
    )


def _sample_factored(
    params: list[float], *, nvec: tuple[int, ...], num_samples: int, uniform: np.ndarray,
    factor_noise: np.ndarray | None, mix_weight: float, uniform_prior: bool,
) -> tuple[list[list[int]], list[float]]:
    """(factor indices per slot, score per slot): K independent draws from beta = prod_d beta_d by inverse
    CDF with the uniforms ``uniform`` [K, D] (sampled_kernels rules)."""
    starts = [sum(nvec[:d]) for d in range(len(nvec))]
    lse, noise_total = [], []
    for d, n in enumerate(nvec):
        logits = params[starts[d] : starts[d] + n]
        m = max(logits)
        total = 0.0
        for x in logits:
            total += math.exp(x - m)
        lse.append(m + math.log(total))
        t = 0.0
        if mix_weight > 0.0:
            for v in range(n):
                t += float(factor_noise[starts[d] + v])
        noise_total.append(t)

    def beta(d: int, v: int) -> float:
        p = math.exp(params[starts[d] + v] - lse[d])
        if mix_weight == 0.0:
            return p
        eta = float(factor_noise[starts[d] + v]) / noise_total[d] if noise_total[d] > 0.0 else 1.0 / nvec[d]
        return (1.0 - mix_weight) * p + mix_weight * eta

    actions, scores = [], []
    for k in range(num_samples):
        log_pi, log_beta, action = 0.0, 0.0, []
        for d, n in enumerate(nvec):
            cdf, pick, last = 0.0, -1, 0
            for v in range(n):
                q = beta(d, v)
                if q > 0.0:
                    last = v
                cdf += q
                if float(uniform[k, d]) < cdf:
                    pick = v
                    break
            pick = last if pick < 0 else pick
            log_pi += params[starts[d] + pick] - lse[d]
            if mix_weight > 0.0:
                log_beta += math.log(beta(d, pick))
            action.append(pick)
        actions.append(action)
        scores.append(log_pi - log_beta if uniform_prior else log_pi)
    return actions, scores


def _sample_edges(
    params: list[float],
    *,
    continuous: bool,
    num_samples: int,
    action_dim: int,
    legal: list[bool],
    normal: np.ndarray,
    gumbel: np.ndarray,
    uniform_prior: bool,
    nvec: tuple[int, ...] = (),
    factor_noise: np.ndarray | None = None,
    mix_weight: float = 0.0,
) -> tuple[list, list[float], int]:
    """(actions per slot, priors per slot, number of valid slots) of one node (sampled_kernels rules; with
    ``nvec``, factored draws whose uniforms are ``normal`` [K, D])."""
    if nvec:
        actions, scores = _sample_factored(
            params, nvec=nvec, num_samples=num_samples, uniform=normal, factor_noise=factor_noise,
            mix_weight=mix_weight, uniform_prior=uniform_prior,
        )  # fmt: skip
        num_valid = num_samples
    elif continuous:
        actions, scores = [], []
        for k in range(num_samples):
            logp, action = 0.0, []
            for d in range(action_dim):
                log_sigma = min(max(params[action_dim + d], smk.LOG_SIGMA_MIN), smk.LOG_SIGMA_MAX)
                z = float(normal[k, d])
                a = math.tanh(params[d] + math.exp(log_sigma) * z)
                action.append(a)
                logp += -0.5 * z * z - log_sigma - smk.HALF_LOG_2PI - math.log(1.0 - a * a + smk.TANH_EPS)
            actions.append(action)
            scores.append(logp)
        num_valid = num_samples
    else:
        candidates = [a for a in range(len(params)) if legal[a]]
        ranked = sorted(candidates, key=lambda a: (-(float(gumbel[a]) + params[a]), a))
        actions = sorted(ranked[:num_samples])
        scores = [params[a] for a in actions]
        num_valid = len(actions)
        actions = actions + [0] * (num_samples - num_valid)
    if uniform_prior and mix_weight == 0.0:
        priors = [1.0 / num_valid] * num_valid
    else:
        priors = _softmax(scores)
    return actions, priors + [0.0] * (num_samples - num_valid), num_valid


def reference_sampled_search(
    *,
    root_latent: torch.Tensor,
    root_policy_logits: np.ndarray,
    legal_mask: np.ndarray | None,
    recurrent_fn: RecurrentFn,
    num_simulations: int,
    num_samples: int,
    action_kind: str,
    add_noise: bool,
    deterministic: bool,
    rng: np.random.Generator,
    root_value: np.ndarray,
    action_dim: int = 1,
    action_nvec: tuple[int, ...] = (),
    sampled_prior: str = "auto",
    pb_c_base: float = 19652.0,
    pb_c_init: float = 1.25,
    discount: float = 0.997,
    dirichlet_alpha: float = 0.3,
    noise_weight: float = 0.25,
    value_delta_max: float = 0.01,
    unvisited_q: str = "min",
    q_transform: str = "tree_min_max",
) -> SearchOutput:
    """Sampled MuZero's search (rules: :mod:`muzero_tune.mcts.sampled_kernels`; selection, noise, the root's
    counted visit and the backup as MuZero's); same arguments, randomness and output as
    :meth:`muzero_tune.mcts.sampled.SampledSearch.run`."""
    bsz, num_params = np.shape(root_policy_logits)
    continuous, factored = action_kind == "continuous", action_kind == "factored"
    nvec = tuple(int(n) for n in action_nvec) if factored else ()
    action_dim = len(nvec) if factored else action_dim
    num_env_actions = 1 if continuous or factored else num_params
    if continuous or factored or legal_mask is None:
        legal_mask = np.ones((bsz, num_env_actions), dtype=bool)
    noise = rng.standard_gamma(dirichlet_alpha, size=(bsz, num_samples)) if add_noise else None
    factor_noise = None
    if add_noise and factored:
        factor_noise = rng.standard_gamma(dirichlet_alpha, size=(bsz, num_params))
    rs = None if deterministic else np.random.RandomState(int(rng.integers(0, 2**31 - 1)))

    def draw() -> tuple[np.ndarray, np.ndarray]:
        if continuous:
            return rng.standard_normal(size=(bsz, num_samples, action_dim)), np.zeros((bsz, 1))
        if factored:
            return rng.random(size=(bsz, num_samples, action_dim)), np.zeros((bsz, 1))
        return np.zeros((bsz, num_samples, 1)), rng.gumbel(size=(bsz, num_env_actions))

    uniform_prior = resolved_sampled_prior(sampled_prior, action_kind) == "uniform"
    sampling = dict(continuous=continuous, num_samples=num_samples, action_dim=action_dim,
                    uniform_prior=uniform_prior, nvec=nvec)  # fmt: skip
    normal, gumbel = draw()
    roots, bounds, slot_legal = [], [], []
    for b in range(bsz):
        params = [float(x) for x in root_policy_logits[b]]
        actions, priors, num_valid = _sample_edges(
            params, legal=[bool(x) for x in legal_mask[b]], normal=normal[b], gumbel=gumbel[b],
            factor_noise=None if factor_noise is None else factor_noise[b],
            mix_weight=noise_weight if factor_noise is not None else 0.0, **sampling,
        )  # fmt: skip
        valid = [k < num_valid for k in range(num_samples)]
        root, minmax = _make_root(logits=params, legal=valid, value=float(root_value[b]),
                                  latent=root_latent[b],
                                  noise=None if noise is None else noise[b], noise_weight=noise_weight,
                                  priors=priors)  # fmt: skip
        root.actions = actions
        roots.append(root)
        bounds.append(minmax)
        slot_legal.append(valid)
    knobs = dict(
        pb_c_base=pb_c_base,
        pb_c_init=pb_c_init,
        discount=discount,
        value_delta_max=value_delta_max,
        deterministic=deterministic,
        unvisited_q=unvisited_q,
        q_transform=q_transform,
        tie_break=None if rs is None else (lambda n: rs.randint(0, n)),
    )
    with torch.no_grad():
        for _ in range(num_simulations):
            paths, slots = [], []
            for b in range(bsz):
                node, path = roots[b], [roots[b]]
                while True:
                    slot = _puct_edge(node, node is roots[b], slot_legal[b], bounds[b], **knobs)
                    if node.children[slot] is None:
                        break
                    node = node.children[slot]
                    path.append(node)
                paths.append(path)
                slots.append(slot)
            parent_latent = torch.stack([p[-1].latent for p in paths])
            chosen = [paths[b][-1].actions[slots[b]] for b in range(bsz)]
            actions = np.array(chosen, dtype=np.float32 if continuous else np.int64)
            next_latent, reward, value, params = recurrent_fn(parent_latent, actions)
            normal, gumbel = draw()
            for b in range(bsz):
                p = [float(x) for x in params[b]]
                acts, priors, _ = _sample_edges(
                    p, legal=[True] * num_env_actions, normal=normal[b], gumbel=gumbel[b], **sampling
                )
                leaf = _expand(paths[b], slots[b], kind=DECISION, reward=float(reward[b]),
                               value=float(value[b]),
                               logits=p, latent=next_latent[b].clone(), priors=priors)  # fmt: skip
                leaf.actions = acts
                _backup(paths[b], float(value[b]), bounds[b], discount)
    visit_counts = np.array([[_visits(r, k) for k in range(num_samples)] for r in roots], dtype=np.int32)
    sampled = np.array([r.actions for r in roots])
    return SearchOutput(
        visit_counts=visit_counts,
        visit_distribution=(visit_counts / visit_counts.sum(axis=1, keepdims=True)).astype(np.float32),
        root_value=_root_value(roots),
        root_prior=np.array([r.priors for r in roots], dtype=np.float32),
        extras={
            "sampled_actions": sampled.astype(np.float32 if continuous else np.int64),
            "sampled_mask": np.array(slot_legal),
        },
    )
