"""Batched tree search front-end: the ``Search`` interface, its MuZero implementation and action selection.

What this module owns
    The per-search driver loop (one select kernel call, one batched ``recurrent_fn`` call and one
    expand+backup kernel call per simulation), latent storage, input validation, randomness plumbing from the
    caller's ``np.random.Generator``, and packaging results as :class:`SearchOutput`.

What it must never do
    Hold tree arithmetic (that lives in :mod:`muzero_tune.mcts.kernels`, whose exact rules are written out
    in :mod:`muzero_tune.mcts.reference`), build autograd graphs (searches run under ``torch.no_grad()``),
    decode network outputs (``recurrent_fn`` returns already-decoded scalars), or return views into its
    reusable buffers (the next search overwrites them).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from muzero_tune.mcts import kernels
from muzero_tune.mcts.tree import TreeArrays

RecurrentFn = Callable[[torch.Tensor, np.ndarray], tuple[torch.Tensor, np.ndarray, np.ndarray, np.ndarray]]
"""``recurrent_fn(latent [B, *latent_shape], actions [B] int64) ->
(next_latent [B, *latent_shape], reward [B] float32, value [B] float32, policy_logits [B, A] float32)``.
Rewards and values are already decoded to scalars; the policy owns the network and any caches."""


@dataclass(frozen=True, eq=False)  # eq=False: numpy fields make field-wise ==/hash meaningless
class SearchOutput:
    """Result of one batched search. ``B`` = batch size, ``A`` = number of actions.

    Fields:
        visit_counts:       [B, A] int32   visits of each root child (0 for illegal actions).
        visit_distribution: [B, A] float32 visit_counts normalised per row (0 for illegal actions).
        root_value:         [B] float32    root value_sum / root visit_count (mean backed-up return).
        root_prior:         [B, A] float32 root priors actually used by the search (after legal mask + noise).
        extras:             variant-specific arrays, each with a leading [B] axis (e.g. Gumbel's
                            ``"improved_policy"`` [B, A] float32). Empty for plain MuZero.
    All arrays are owned by the output (never views into search buffers).
    """

    visit_counts: np.ndarray  # [B, A] int32
    visit_distribution: np.ndarray  # [B, A] float32
    root_value: np.ndarray  # [B] float32
    root_prior: np.ndarray  # [B, A] float32
    extras: Mapping[str, np.ndarray] = field(default_factory=dict)


class Search(abc.ABC):
    """Plug-in interface for batched tree searches; callers only see :meth:`run` and :class:`SearchOutput`.

    Contract shared by every variant: one tree per batch element, all trees advanced together, exactly one
    batched ``recurrent_fn`` call per simulation, node ``s + 1`` is the node expanded at simulation ``s``
    (root = node 0), randomness only from the ``rng`` argument (reproducible), results copied out.
    Knobs are keyword-only constructor arguments; :meth:`run` arguments are per-call data.

    How later variants plug in without changing callers:

    * **Sampled MuZero (continuous / large action spaces)**: the constructor takes ``num_samples`` K instead
      of relying on ``num_actions`` enumerating the space. Each node stores K sampled actions
      (``[B, N, K, action_dim]``) and their priors in the tree arrays; ``root_policy_logits`` / the policy
      part of ``recurrent_fn``'s output become distribution parameters from which the search samples K
      actions with ``rng``; ``actions`` passed to ``recurrent_fn`` become ``[B, action_dim]`` float arrays.
      ``visit_counts`` / ``visit_distribution`` are indexed by sample slot ``[B, K]`` and
      ``extras["sampled_actions"]`` ``[B, K, action_dim]`` maps slots back to actions, so
      :func:`select_action` keeps working (it picks a slot).
    * **Gumbel MuZero**: root selection by Gumbel-top-k plus sequential halving over the simulation budget,
      interior selection by the deterministic improved-policy rule. ``add_noise`` toggles the Gumbel noise
      (drawn from ``rng``) instead of Dirichlet noise. The output adds ``extras["improved_policy"]``
      ``[B, A] float32`` (the policy-learning target) and ``extras["selected_action"]`` ``[B] int64``.
    * **Stochastic MuZero (chance nodes)**: nodes get a kind flag (decision / chance) ``[B, N]`` and the
      variant takes a second callable, ``afterstate_fn(latent, actions) -> (afterstate, value,
      chance_logits)``, while ``recurrent_fn(afterstate, chance_outcomes)`` expands chance edges. Each
      simulation still ends in one batched network call (the kind of the selected leaf edge decides which
      callable; the variant groups by kind if a batch mixes them) and one expansion per tree.
    * **Transformer world models with caches**: ``recurrent_fn`` owns its key/value cache. Because node
      numbering is fixed (node ``s + 1`` at simulation ``s``), a variant can pass ``parent_node [B] int32``,
      ``new_node: int`` and ``depth [B] int32`` as extra keyword arguments so the model can look up the
      parent's cache and store the child's; the search itself never touches the cache.
    """

    @property
    @abc.abstractmethod
    def num_actions(self) -> int:
        """Size A of the (discrete) root action space."""

    @property
    @abc.abstractmethod
    def num_simulations(self) -> int:
        """Simulations (= network calls = expanded nodes per tree) per :meth:`run`."""

    @abc.abstractmethod
    def run(
        self,
        *,
        root_latent: torch.Tensor,
        root_policy_logits: np.ndarray,
        legal_mask: np.ndarray,
        recurrent_fn: RecurrentFn,
        add_noise: bool,
        deterministic: bool,
        rng: np.random.Generator,
        root_value: np.ndarray | None = None,
    ) -> SearchOutput:
        """Search from B roots.

        Args:
            root_latent: [B, *latent_shape] representation of each root (any dtype/device).
            root_value: [B] the network's value of each root, for variants that need it (Gumbel's mixed
                value); MuZero's search does not use it.
            root_policy_logits: [B, A] policy logits of the roots.
            legal_mask: [B, A] bool, at least one True per row; applied at the root only.
            recurrent_fn: see :data:`RecurrentFn`.
            add_noise: mix exploration noise into the root priors (training); False for evaluation.
            deterministic: break score ties by the lowest action index instead of at random.
            rng: the only source of randomness.
        """


class LatentStore:
    """Per-node latents of a batched search, shared by every search variant.

    One tensor ``[num_nodes, batch_capacity, *latent_shape]``: node n of every tree is written at row n (in
    these searches node n is created at simulation n - 1 in all trees), so a simulation's parent latents are
    gathered with one advanced index ``buf[parent_node, batch_index]``. Reallocated only when a run needs
    more nodes, a larger batch, or another latent shape, dtype or device.
    """

    def __init__(self) -> None:
        self.buf: torch.Tensor | None = None  # [Nc, Bc, *latent_shape]
        self.batch_index: torch.Tensor | None = None  # [Bc] int64 arange on the latent device

    def ensure(
        self, root_latent: torch.Tensor, *, num_nodes: int, batch_size: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The buffer [Nc >= num_nodes, Bc >= batch_size, *latent_shape] and ``arange(batch_size)`` [B]."""
        buf = self.buf
        if (
            buf is None
            or buf.shape[2:] != root_latent.shape[1:]
            or buf.dtype != root_latent.dtype
            or buf.device != root_latent.device
            or buf.shape[0] < num_nodes
            or buf.shape[1] < batch_size
        ):
            capacity = batch_size if buf is None else max(batch_size, buf.shape[1])
            nodes = num_nodes if buf is None else max(num_nodes, buf.shape[0])
            self.buf = torch.empty(
                (nodes, capacity, *root_latent.shape[1:]), dtype=root_latent.dtype, device=root_latent.device
            )
            self.batch_index = torch.arange(capacity, device=root_latent.device)
        return self.buf, self.batch_index[:batch_size]


class MuZeroSearch(Search):
    """MuZero pUCT search over discrete actions (Schrittwieser et al. 2020), batched via numba kernels.

    Root visit-count rule: the root starts with visit_count 0 and the initial inference does *not* count as a
    visit, so after ``num_simulations`` simulations the root has exactly ``num_simulations`` visits and its
    children's visits sum to ``num_simulations``. Consequence: in simulation 0 the exploration term is 0 for
    every child (sqrt(0) = 0) so the first root action is a tie (lowest legal index when deterministic).
    ``root_value`` is the mean of the backed-up returns and excludes the root's own network value.

    Randomness consumed from ``rng`` per :meth:`run`: if ``add_noise``, one
    ``rng.standard_gamma(dirichlet_alpha, size=(B, A))`` call (normalised over the legal actions of each row
    it is a Dirichlet sample); then, if not ``deterministic``, one ``rng.integers`` call that seeds numba's
    RNG for tie-breaks.

    Buffers (tree arrays, latent storage) are reused across calls and grown when B or num_simulations grows.
    Not thread-safe: use one instance per thread/actor.
    """

    def __init__(
        self,
        *,
        num_actions: int,
        num_simulations: int,
        pb_c_base: float = 19652.0,
        pb_c_init: float = 1.25,
        discount: float = 0.997,
        dirichlet_alpha: float = 0.3,
        noise_weight: float = 0.25,
        value_delta_max: float = 0.01,
    ) -> None:
        if num_actions < 1:
            raise ValueError(f"num_actions must be >= 1, got {num_actions}")
        if num_simulations < 1:
            raise ValueError(f"num_simulations must be >= 1, got {num_simulations}")
        if dirichlet_alpha <= 0.0:
            raise ValueError(f"dirichlet_alpha must be > 0, got {dirichlet_alpha}")
        if not 0.0 <= noise_weight <= 1.0:
            raise ValueError(f"noise_weight must be in [0, 1], got {noise_weight}")
        self._num_actions = int(num_actions)
        self._num_simulations = int(num_simulations)
        self.pb_c_base = float(pb_c_base)
        self.pb_c_init = float(pb_c_init)
        self.discount = float(discount)
        self.dirichlet_alpha = float(dirichlet_alpha)
        self.noise_weight = float(noise_weight)
        self.value_delta_max = float(value_delta_max)
        self._tree = TreeArrays(num_actions=self._num_actions)
        self._store = LatentStore()

    @property
    def num_actions(self) -> int:
        return self._num_actions

    @property
    def num_simulations(self) -> int:
        return self._num_simulations

    @property
    def tree(self) -> TreeArrays:
        """The reusable tree storage (contents are only meaningful right after :meth:`run`)."""
        return self._tree

    def run(
        self,
        *,
        root_latent: torch.Tensor,
        root_policy_logits: np.ndarray,
        legal_mask: np.ndarray,
        recurrent_fn: RecurrentFn,
        add_noise: bool,
        deterministic: bool,
        rng: np.random.Generator,
        root_value: np.ndarray | None = None,
    ) -> SearchOutput:
        batch_size = int(root_latent.shape[0])
        num_actions = self._num_actions
        legal_mask = np.asarray(legal_mask)
        _check_shape("root_policy_logits", root_policy_logits, (batch_size, num_actions))
        _check_shape("legal_mask", legal_mask, (batch_size, num_actions))
        if legal_mask.dtype != np.bool_:
            raise TypeError(f"legal_mask must be bool, got {legal_mask.dtype}")
        if not legal_mask.any(axis=1).all():
            raise ValueError("every legal_mask row needs at least one legal action")

        tree = self._tree
        num_nodes = self._num_simulations + 1
        tree.ensure_capacity(batch_size=batch_size, num_nodes=num_nodes)
        b = slice(0, batch_size)
        tree.root_logits[b] = root_policy_logits  # float64 staging, exact for float32 inputs
        tree.root_legal[b] = legal_mask
        if add_noise:
            tree.root_noise[b] = rng.standard_gamma(self.dirichlet_alpha, size=(batch_size, num_actions))
        if not deterministic:
            kernels.seed_rng(int(rng.integers(0, 2**31 - 1)))
        kernels.prepare_roots(
            tree.children,
            tree.prior,
            tree.visit_count,
            tree.value_sum,
            tree.reward,
            tree.min_value,
            tree.max_value,
            tree.root_legal,
            tree.root_logits,
            tree.root_noise,
            batch_size,
            num_nodes,
            bool(add_noise),
            self.noise_weight,
        )

        with torch.no_grad():
            latents, batch_index = self._store.ensure(
                root_latent, num_nodes=self._num_simulations + 1, batch_size=batch_size
            )  # [S + 1, Bc, *latent_shape], [B]
            latents[0, :batch_size].copy_(root_latent)
            for sim in range(self._num_simulations):
                kernels.select_leaves(
                    tree.children,
                    tree.prior,
                    tree.visit_count,
                    tree.value_sum,
                    tree.reward,
                    tree.min_value,
                    tree.max_value,
                    tree.root_legal,
                    tree.scores,
                    tree.path,
                    tree.path_len,
                    tree.sel_parent,
                    tree.sel_action,
                    batch_size,
                    self.pb_c_base,
                    self.pb_c_init,
                    self.discount,
                    self.value_delta_max,
                    bool(deterministic),
                )
                # One advanced-index gather of every tree's parent latent. from_numpy(...).long() copies,
                # so the reused sel_parent buffer is not aliased.
                parent_node = torch.from_numpy(tree.sel_parent[b]).to(device=latents.device, dtype=torch.long)
                parent_latent = latents[parent_node, batch_index]  # [B, *latent_shape]
                # A fresh int64 array: recurrent_fn may keep it (e.g. to log actions).
                actions = tree.sel_action[b].astype(np.int64)  # [B]
                next_latent, reward, value, logits = recurrent_fn(parent_latent, actions)
                if tuple(next_latent.shape) != tuple(root_latent.shape):
                    raise ValueError(
                        f"recurrent_fn next_latent shape {tuple(next_latent.shape)} "
                        f"!= root_latent shape {tuple(root_latent.shape)}"
                    )
                latents[sim + 1, :batch_size].copy_(next_latent)
                _stage("reward", tree.leaf_reward[b], reward)
                _stage("value", tree.leaf_value[b], value)
                _stage("policy_logits", tree.leaf_logits[b], logits)
                kernels.expand_and_backup(
                    tree.children,
                    tree.prior,
                    tree.visit_count,
                    tree.value_sum,
                    tree.reward,
                    tree.min_value,
                    tree.max_value,
                    tree.path,
                    tree.path_len,
                    tree.sel_parent,
                    tree.sel_action,
                    tree.leaf_reward,
                    tree.leaf_value,
                    tree.leaf_logits,
                    sim + 1,
                    batch_size,
                    self.discount,
                )

        visit_counts = np.empty((batch_size, num_actions), dtype=np.int32)  # [B, A]
        root_value = np.empty(batch_size, dtype=np.float64)  # [B]
        kernels.root_statistics(
            tree.children, tree.visit_count, tree.value_sum, batch_size, visit_counts, root_value
        )
        totals = visit_counts.sum(axis=1, keepdims=True)  # [B, 1], == num_simulations
        return SearchOutput(
            visit_counts=visit_counts,
            visit_distribution=(visit_counts / totals).astype(np.float32),
            root_value=root_value.astype(np.float32),
            root_prior=tree.prior[b, 0, :].astype(np.float32),
        )


def _check_shape(name: str, array: np.ndarray, shape: tuple[int, ...]) -> None:
    if tuple(np.shape(array)) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(np.shape(array))}")


def _stage(name: str, dst: np.ndarray, src: np.ndarray) -> None:
    """Copy a network output into its float64 staging view, refusing silent broadcasting."""
    _check_shape(name, src, dst.shape)
    dst[...] = src


def select_action(
    visit_counts: np.ndarray, *, temperature: float, rng: np.random.Generator, deterministic: bool
) -> np.ndarray:
    """Pick one action per row from root visit counts.

    Args:
        visit_counts: [B, A] non-negative counts (every row with a positive sum unless argmax is used).
        temperature: 0 (or ``deterministic``) -> argmax, lowest index on ties; otherwise sample from
            counts ** (1 / temperature), normalised per row. Actions with 0 visits are never sampled.
        rng: source of the uniform draws (one ``rng.random(B)`` call when sampling).
        deterministic: force argmax regardless of temperature.
    Returns:
        [B] int64 action indices.
    """
    counts = np.asarray(visit_counts, dtype=np.float64)  # [B, A]
    if counts.ndim != 2:
        raise ValueError(f"visit_counts must be [B, A], got shape {counts.shape}")
    if temperature < 0.0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if deterministic or temperature == 0.0:
        return np.argmax(counts, axis=1).astype(np.int64)
    row_max = counts.max(axis=1, keepdims=True)  # [B, 1]
    if np.any(row_max <= 0.0):
        raise ValueError("cannot sample from a row with no visits")
    # Divide by the row max before the power so small temperatures do not overflow.
    weights = (counts / row_max) ** (1.0 / temperature)  # [B, A]
    cdf = np.cumsum(weights, axis=1)  # [B, A]
    cdf /= cdf[:, -1:]  # last column is exactly 1
    u = rng.random(counts.shape[0])  # [B] in [0, 1)
    # Index of the first cdf entry > u; zero-weight actions share their predecessor's cdf and are skipped.
    return (cdf <= u[:, None]).sum(axis=1).astype(np.int64)
