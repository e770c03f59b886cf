"""Plain-Python reference MuZero search: the executable specification of the rules the kernels implement.

What this module owns
    A slow, object-per-node, one-float-at-a-time implementation of exactly the search
    :class:`muzero_tune.mcts.search.MuZeroSearch` runs, used by the tests (visit counts must agree bit for
    bit in deterministic mode) and as documentation. Every float operation is done in Python float64 in the
    same order as the kernels, with explicit loops (no ``sum()``, no numpy reductions) so the rounding is
    identical.

What it must never do
    Be imported by production code paths (it is slow), or diverge from the kernels: when a rule changes,
    change it here and in :mod:`muzero_tune.mcts.kernels` together.

The rules
    * Trees: one per batch element, advanced in lockstep; one batched ``recurrent_fn`` call per simulation;
      every simulation expands exactly one node per tree (MuZero has no terminal nodes inside the tree).
    * Root: visit_count starts at 0 (the initial inference is not a visit), so the root ends with
      ``num_simulations`` visits. Root priors = softmax of the logits over the legal actions (illegal prior
      exactly 0, never selected); with noise, prior = (1 - w) * prior + w * eta where eta = Gamma(alpha)
      draws ``rng.standard_gamma(alpha, size=(B, A))`` normalised over the legal actions (= Dirichlet).
      Inside the tree every action is legal.
    * Selection at a node with visit count N: score(a) = Q_norm(child) + prior(a) * sqrt(N) / (1 + n(a)) *
      (pb_c_init + log((N + pb_c_base + 1) / pb_c_base)); Q(child) = reward(child) + discount *
      value_sum(child) / n(child) for visited children, Q_norm = 0 for unvisited ones. Q_norm = (Q - min) /
      max(max - min, value_delta_max) clipped to [0, 1] when max > min, else Q unchanged. Ties: lowest action
      index when deterministic, else uniform among scores within 1e-9 of the max (here drawn from ``rng``;
      the kernels use numba's RNG, so only deterministic runs are comparable bit for bit).
    * Expansion: the new node stores the predicted reward and softmax(policy_logits) over all actions.
    * Backup from leaf to root: G = value(leaf); for each node: value_sum += G, visit_count += 1, and for
      non-root nodes min-max.update(reward + discount * value_sum / visit_count); then G = reward +
      discount * G.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from muzero_tune.mcts.search import RecurrentFn, SearchOutput

_TIE_TOLERANCE = 1e-9


class _MinMax:
    def __init__(self) -> None:
        self.minimum = math.inf
        self.maximum = -math.inf

    def update(self, value: float) -> None:
        if value < self.minimum:
            self.minimum = value
        if value > self.maximum:
            self.maximum = value

    def normalise(self, value: float, value_delta_max: float) -> float:
        if self.maximum > self.minimum:
            span = self.maximum - self.minimum
            if span < value_delta_max:
                span = value_delta_max
            x = (value - self.minimum) / span
            return min(max(x, 0.0), 1.0)
        return value


class _Node:
    """One tree node. ``priors``/``children`` are indexed by action; a child is None until expanded."""

    def __init__(self, *, reward: float, priors: list[float], latent: torch.Tensor) -> None:
        self.reward = reward
        self.priors = priors
        self.children: list[_Node | None] = [None] * len(priors)
        self.visit_count = 0
        self.value_sum = 0.0
        self.latent = latent  # [*latent_shape]


def _softmax(logits: list[float], legal: list[bool]) -> list[float]:
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


def _ucb(node: _Node, action: int, minmax: _MinMax, *, pb_c_base: float, pb_c_init: float, discount: float,
         value_delta_max: float) -> float:
    n_parent = node.visit_count
    pb_c = pb_c_init + math.log((n_parent + pb_c_base + 1.0) / pb_c_base)
    child = node.children[action]
    if child is None:
        n_child, q_norm = 0, 0.0
    else:
        n_child = child.visit_count
        q_norm = minmax.normalise(child.reward + discount * (child.value_sum / n_child), value_delta_max)
    return q_norm + node.priors[action] * math.sqrt(n_parent) / (1.0 + n_child) * pb_c


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
    pb_c_base: float = 19652.0,
    pb_c_init: float = 1.25,
    discount: float = 0.997,
    dirichlet_alpha: float = 0.3,
    noise_weight: float = 0.25,
    value_delta_max: float = 0.01,
) -> SearchOutput:
    """Run the reference search; arguments and output as :meth:`MuZeroSearch.run` (shapes: root_latent
    [B, *latent_shape], root_policy_logits [B, A], legal_mask [B, A] bool). Noise is drawn from ``rng``
    exactly like ``MuZeroSearch`` does, so equal Generator seeds give equal noise."""
    batch_size, num_actions = np.shape(root_policy_logits)
    knobs = dict(pb_c_base=pb_c_base, pb_c_init=pb_c_init, discount=discount, value_delta_max=value_delta_max)
    noise = rng.standard_gamma(dirichlet_alpha, size=(batch_size, num_actions)) if add_noise else None

    roots: list[_Node] = []
    minmaxes: list[_MinMax] = []
    legal_rows: list[list[bool]] = []
    for b in range(batch_size):
        legal = [bool(x) for x in legal_mask[b]]
        priors = _softmax([float(x) for x in root_policy_logits[b]], legal)
        if noise is not None:
            noise_total = 0.0
            for a in range(num_actions):
                if legal[a]:
                    noise_total += float(noise[b, a])
            num_legal = legal.count(True)
            for a in range(num_actions):
                if legal[a]:
                    eta = float(noise[b, a]) / noise_total if noise_total > 0.0 else 1.0 / num_legal
                    priors[a] = (1.0 - noise_weight) * priors[a] + noise_weight * eta
        roots.append(_Node(reward=0.0, priors=priors, latent=root_latent[b]))
        minmaxes.append(_MinMax())
        legal_rows.append(legal)

    with torch.no_grad():
        for _ in range(num_simulations):
            paths: list[list[_Node]] = []
            actions: list[int] = []
            for b in range(batch_size):
                node, path = roots[b], [roots[b]]
                while True:
                    candidates = [a for a in range(num_actions) if node is not roots[b] or legal_rows[b][a]]
                    scores = [_ucb(node, a, minmaxes[b], **knobs) for a in candidates]
                    best = max(scores)
                    if deterministic:
                        action = candidates[scores.index(best)]  # first (= lowest) maximiser
                    else:
                        tied = [a for a, s in zip(candidates, scores) if s >= best - _TIE_TOLERANCE]
                        action = tied[int(rng.integers(len(tied)))]
                    child = node.children[action]
                    if child is None:
                        break
                    node = child
                    path.append(node)
                paths.append(path)
                actions.append(action)

            parent_latent = torch.stack([path[-1].latent for path in paths])
            action_array = np.array(actions, dtype=np.int64)  # [B]
            next_latent, reward, value, logits = recurrent_fn(parent_latent, action_array)

            for b in range(batch_size):
                path = paths[b]
                leaf = _Node(
                    reward=float(reward[b]),
                    priors=_softmax([float(x) for x in logits[b]], [True] * num_actions),
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
                        minmaxes[b].update(node.reward + discount * (node.value_sum / node.visit_count))
                    g = node.reward + discount * g

    visit_counts = np.zeros((batch_size, num_actions), dtype=np.int32)
    for b in range(batch_size):
        for a in range(num_actions):
            child = roots[b].children[a]
            visit_counts[b, a] = 0 if child is None else child.visit_count
    return SearchOutput(
        visit_counts=visit_counts,
        visit_distribution=(visit_counts / visit_counts.sum(axis=1, keepdims=True)).astype(np.float32),
        root_value=np.array([r.value_sum / r.visit_count for r in roots], dtype=np.float32),
        root_prior=np.array([r.priors for r in roots], dtype=np.float32),
    )
