"""Batched tree search front-end: the ``Search`` interface, the shared batched loop, MuZero's search, actions.

What this module owns
    :class:`Search` (the plug-in interface callers see), :class:`TreeSearch` (the one driver loop every tree
    search specialises: stage and check the roots, prepare them, then per simulation one select kernel call,
    one batched ``recurrent_fn`` call and one expand+backup kernel call, then the root read-out),
    :class:`MuZeroSearch`, latent storage, randomness plumbing from the caller's ``np.random.Generator``,
    and packaging results as :class:`SearchOutput`.

What it must never do
    Hold tree arithmetic (that lives in :mod:`muzero_tune.mcts.kernels` and the variant rule modules, whose
    rules are written out in :mod:`muzero_tune.mcts.reference`), build autograd graphs (searches run under
    ``torch.no_grad()``), decode network outputs (``recurrent_fn`` returns already-decoded scalars), or
    return views into its reusable buffers (the next search overwrites them).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from muzero_tune.errors import DivergedError
from muzero_tune.mcts import kernels, puct
from muzero_tune.mcts.tree import TreeArrays

Step = Callable[[int], None]
"""One phase of a simulation, bound once per run: ``step(sim)`` with ``sim`` the 0-based simulation."""

RecurrentFn = Callable[[torch.Tensor, np.ndarray], tuple[torch.Tensor, np.ndarray, np.ndarray, np.ndarray]]
"""``recurrent_fn(latent [B, *latent_shape], actions [B] int64) ->
(next_latent [B, *latent_shape], reward [B] float32, value [B] float32, policy_logits [B, A] float32)``.
Rewards and values are already decoded to scalars; the policy owns the network and any caches. The input
latent may be a row of a block the search reuses (:meth:`LatentStore.run_gather`): copy it to keep it past
the search."""


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
      parent's cache and store the child's; the search itself never touches the cache. :class:`TreeSearch`
      does so for a ``recurrent_fn`` whose attribute ``wants_node_ids`` is True (:func:`call_recurrent`).
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
            root_value: [B] the network's value of each root: the root's counted first visit (every tree
                search requires it) and Gumbel's v_hat.
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

    On the CPU, for dtypes numpy has, the gather and the store go through a numpy view of the same memory:
    a torch advanced index costs tens of microseconds per call at B = 8, numpy's about one (the per-simulation
    Python overhead of the search was mostly this). Elsewhere (CUDA, bfloat16) they are torch ops.
    """

    def __init__(self) -> None:
        self.buf: torch.Tensor | None = None  # [Nc, Bc, *latent_shape]
        self.batch_index: torch.Tensor | None = None  # [Bc] int64 arange on the latent device
        self._np: np.ndarray | None = None  # numpy view of ``buf`` (CPU, numpy dtype) or None
        self._rows: np.ndarray = np.arange(0)  # [B] int64 arange for the numpy path
        self._bytes: np.ndarray | None = None  # [Nc, Bc, Z] uint8 byte view of ``_np`` (the gather kernel's)
        self._bsz = 0  # B of the current run
        self._full_shape: tuple[int, ...] = ()
        self._block_key: tuple | None = None  # (S, [B, *latent_shape], dtype) of ``_block``
        self._block: tuple[tuple[torch.Tensor, ...], np.ndarray] = ((), np.empty((0, 0, 0), np.uint8))

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
            self._np = None
            self._bytes = None
            self._bsz = 0  # the node views below belong to the old buffer
            if self.buf.device.type == "cpu" and self.buf.dtype in _NUMPY_DTYPES:
                self._np = self.buf.numpy()  # shares memory with ``buf``
                self._bytes = self._np.reshape(self._np.shape[0], self._np.shape[1], -1).view(np.uint8)
        if batch_size != self._bsz:
            self._rows = np.arange(batch_size)
            self._bsz = batch_size
            self._full_shape = (batch_size, *self.buf.shape[2:])  # [B, *latent_shape]
        return self.buf, self.batch_index[:batch_size]

    @property
    def latent_shape(self) -> tuple[int, ...]:
        return tuple(self.buf.shape[2:])

    def gather(self, parent_node: np.ndarray, rows: np.ndarray | None = None) -> torch.Tensor:
        """Latents of nodes ``parent_node`` [n] in trees ``rows`` [n] (None: all B trees, n = B) -> a fresh
        [n, *latent_shape] tensor on the buffer's device."""
        if self._np is not None:
            return torch.from_numpy(self._np[parent_node, self._rows if rows is None else rows])  # a copy
        dev = self.buf.device
        idx = self.batch_index[: len(parent_node)] if rows is None else torch.from_numpy(rows).to(dev)
        return self.buf[torch.from_numpy(np.asarray(parent_node, dtype=np.int64)).to(dev), idx]

    def put(self, node: int, latent: torch.Tensor, rows: np.ndarray | None = None) -> None:
        """Store ``latent`` [n, *latent_shape] as node ``node`` of trees ``rows`` [n] (None: all B trees)."""
        if rows is None:
            if latent.shape != self._full_shape:
                _check_latent(latent, self._full_shape)
            if self._np is not None and latent.dtype == self.buf.dtype and latent.device.type == "cpu":
                self._np[node, : self._bsz] = (latent.detach() if latent.requires_grad else latent).numpy()
            else:
                self.buf[node, : self._bsz].copy_(latent)
            return
        _check_latent(latent, (len(rows), *self.buf.shape[2:]))
        self.buf[node, torch.from_numpy(rows).to(self.buf.device)] = latent.to(self.buf.dtype)

    def run_gather(
        self, sel_parent: np.ndarray, sel_action: np.ndarray, num_simulations: int
    ) -> Callable[[int], tuple[torch.Tensor, np.ndarray]]:
        """``gather(sim) -> (parent_latent [B, *latent_shape], actions [B] int64)`` for one run of all B
        trees: the latents of nodes ``sel_parent[:B]`` and the edges ``sel_action[:B]`` (the select kernel's
        output).

        The actions are rows of a block ``[S, B]`` allocated per run: the network may keep them. On the numpy
        path the latents are rows of a block ``[S, B, *latent_shape]`` kept across runs (its row views cost
        more to make than a whole search's gathers): valid during the call and until the same simulation of
        the next run -- a network that keeps its input latent past the search must copy it. One
        :func:`~muzero_tune.mcts.kernels.gather_latents` call copies both. Elsewhere (CUDA, bfloat16) the
        latents are fresh tensors from :meth:`gather`.
        """
        bsz = self._bsz
        actions = np.empty((num_simulations, bsz), dtype=np.int64)  # [S, B]
        if self._bytes is None:

            def gather_torch(sim: int) -> tuple[torch.Tensor, np.ndarray]:
                row = actions[sim]
                row[...] = sel_action[:bsz]
                return self.gather(sel_parent[:bsz]), row

            return gather_torch
        latent_rows, block_bytes = self._input_block(num_simulations)
        kernel, store = fast(kernels.gather_latents), self._bytes

        def gather(sim: int) -> tuple[torch.Tensor, np.ndarray]:
            kernel(store, sel_parent, sel_action, bsz, block_bytes, actions, sim)
            return latent_rows[sim], actions[sim]

        return gather

    def _input_block(self, num_simulations: int) -> tuple[tuple[torch.Tensor, ...], np.ndarray]:
        """The network-input block of the numpy path: its S row tensors [B, *latent_shape] and its bytes
        [S, B, Z] uint8; made again only when S, B, or the latent's shape or dtype change."""
        key = (num_simulations, self._full_shape, self.buf.dtype)
        if self._block_key != key:
            block = torch.empty((num_simulations, *self._full_shape), dtype=self.buf.dtype)  # [S, B, *latent]
            self._block = (
                block.unbind(0),
                block.numpy().reshape(num_simulations, self._bsz, -1).view(np.uint8),
            )
            self._block_key = key
        return self._block

    def run_store(self) -> tuple[np.ndarray, Callable[[int, torch.Tensor], int]]:
        """``(store_bytes, stage)`` for all B trees of this run. ``stage(node, latent) -> address`` checks the
        network's new latents [B, *latent_shape]: a C-contiguous CPU tensor of the store's dtype on the numpy
        path is left where it is and its address returned, for the expansion kernel to copy into
        ``store_bytes`` [Nc, Bc, Z] uint8 (:func:`~muzero_tune.mcts.kernels.store_latents`; a numpy view of
        the tensor costs more than the whole copy); anything else is stored now by :meth:`put` and 0
        returned."""
        put = self.put
        if self._bytes is None:

            def stage_torch(node: int, latent: torch.Tensor) -> int:
                put(node, latent)
                return 0

            return _NO_BYTES, stage_torch
        full_shape, dtype = torch.Size(self._full_shape), self.buf.dtype

        def stage(node: int, latent: torch.Tensor) -> int:
            if latent.shape != full_shape:
                _check_latent(latent, full_shape)
            if latent.dtype is dtype and latent.is_cpu and latent.is_contiguous():
                return latent.data_ptr()
            put(node, latent)  # casts, copies strided or grad-carrying tensors
            return 0

        return self._bytes, stage


_NO_BYTES = np.zeros((1, 1, 1), dtype=np.uint8)  # store_bytes where the latents are not numpy-viewable


_NUMPY_DTYPES = (torch.float32, torch.float64, torch.float16)


class TreeSearch(Search):
    """The batched loop every tree search shares; a variant supplies its selection rule and read-out.

    :meth:`run`: stage and check the roots, prepare them (:meth:`_prepare`), then per simulation select one
    unexpanded edge per tree (:meth:`_select_step`), expand all of them with one batched network call and
    back the new values up (:meth:`_expand_step`, the shared core's), and finally read the root out
    (:meth:`_outputs`). The per-simulation hooks return a :data:`Step` bound once per run (entry points and
    argument tuples resolved), so a simulation is two Python calls besides the network's, with no attribute
    look-ups or allocations.
    Variants override the hooks, never the loop. ``chance_edges`` (class
    attribute) switches the core's chance-edge rule on for trees with chance nodes.
    """

    chance_edges = False

    def __init__(
        self,
        *,
        num_actions: int,
        num_simulations: int,
        discount: float,
        value_delta_max: float,
        tree: TreeArrays | None = None,
    ) -> None:
        if num_actions < 1:
            raise ValueError(f"num_actions must be >= 1, got {num_actions}")
        if num_simulations < 1:
            raise ValueError(f"num_simulations must be >= 1, got {num_simulations}")
        if value_delta_max < 0.0:
            raise ValueError(f"value_delta_max must be >= 0, got {value_delta_max}")
        self._num_actions = int(num_actions)
        self._num_simulations = int(num_simulations)
        self.discount = float(discount)
        self.value_delta_max = float(value_delta_max)
        self._tree = TreeArrays(num_actions=self._num_actions) if tree is None else tree
        self._store = LatentStore()

    @property
    def num_actions(self) -> int:
        return self._num_actions

    @property
    def num_simulations(self) -> int:
        return self._num_simulations

    @property
    def num_chances(self) -> int:
        """Edge count of chance nodes (equal to ``num_actions`` where there are none)."""
        return self._num_actions

    @property
    def tree(self) -> TreeArrays:
        """The reusable tree storage (contents are only meaningful right after :meth:`run`)."""
        return self._tree

    @property
    def node_latents(self) -> torch.Tensor | None:
        """The latent of every expanded node of the last :meth:`run`, [N, B, *latent_shape] (node 0: the
        roots; node s + 1: the one simulation s expanded; rows past the run's sizes are stale)."""
        return self._store.buf

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
        **network_fns: Callable,
    ) -> SearchOutput:
        """Search from B roots (arguments: :meth:`Search.run`; ``root_value`` is required here: the root's
        initial inference is its first visit). ``network_fns``: extra callables a variant's
        :meth:`_expand_step` takes (Stochastic MuZero's ``afterstate_fn``)."""
        bsz = self._stage_roots(root_latent, root_policy_logits, legal_mask, root_value)
        deterministic = bool(deterministic)
        self._prepare(bsz, add_noise=bool(add_noise), deterministic=deterministic, rng=rng)
        with torch.no_grad():
            self._store.ensure(root_latent, num_nodes=self._num_simulations + 1, batch_size=bsz)
            self._store.put(0, root_latent)
            # Each step is built once per run (kernel entry points and argument tuples bound), so a
            # simulation's Python work is two calls plus the network's.
            select = self._select_step(bsz, deterministic)
            expand = self._expand_step(bsz, recurrent_fn, network_fns)  # network call, expansion and backup
            for sim in range(self._num_simulations):
                select(sim)
                expand(sim)
        return self._outputs(bsz)

    # ------------------------------------------------------------------------------------------- hooks

    def _stage_roots(self, root_latent, root_policy_logits, legal_mask, root_value) -> int:
        """Check the root inputs and copy them into the float64 staging buffers. Returns B."""
        bsz = int(root_latent.shape[0])
        num_actions = self._num_actions
        legal_mask = np.asarray(legal_mask)
        _check_shape("root_policy_logits", root_policy_logits, (bsz, num_actions))
        _check_shape("legal_mask", legal_mask, (bsz, num_actions))
        if legal_mask.dtype != np.bool_:
            raise TypeError(f"legal_mask must be bool, got {legal_mask.dtype}")
        if not legal_mask.any(axis=1).all():
            raise ValueError("every legal_mask row needs at least one legal action")
        if root_value is None:
            raise ValueError("root_value [B] is required: the root's initial inference is its first visit")
        check_finite_roots(root_policy_logits, root_value)
        t = self._tree
        t.ensure_capacity(batch_size=bsz, num_nodes=self._num_simulations + 1)
        b = slice(0, bsz)
        t.root_logits[b] = root_policy_logits  # float64 staging, exact for float32 inputs
        t.root_legal[b] = legal_mask
        _stage("root_value", t.root_value[b], np.asarray(root_value))
        return bsz

    def _prepare(self, bsz: int, *, add_noise: bool, deterministic: bool, rng: np.random.Generator) -> None:
        """Reset the trees, set the root priors (noise staged in ``root_noise`` when ``add_noise``) and
        count the roots' first visits."""
        t = self._tree
        fast(kernels.prepare_roots)(
            t.children, t.prior, t.logits, t.kind, t.visit_count, t.value_sum, t.reward, t.raw_value,
            t.min_value, t.max_value, t.root_legal, t.root_logits, t.root_noise, t.root_value, bsz,
            self._num_simulations + 1, self._num_actions, add_noise, self._noise_weight(),
        )  # fmt: skip

    def _noise_weight(self) -> float:
        return 0.0

    @abc.abstractmethod
    def _select_step(self, bsz: int, deterministic: bool) -> Step:
        """``select(sim)``: write the path and ``sel_parent``/``sel_action``/``sel_kind`` of every tree (a
        select kernel call)."""

    def _expand_step(self, bsz: int, recurrent_fn: RecurrentFn, network_fns: Mapping[str, Callable]) -> Step:
        """``expand(sim)``: one batched ``recurrent_fn`` call on every tree's selected edge, then one kernel
        call that stores the new latents (node ``sim + 1``), attaches the new nodes and backs their values up
        (:func:`~muzero_tune.mcts.kernels.store_expand_and_backup`). The network's inputs are rows of
        blocks (:meth:`LatentStore.run_gather`). A variant with its own expansion composes it with
        :meth:`_backup_step` (:meth:`_expand_then_backup`)."""
        t = self._tree
        gather = self._store.run_gather(t.sel_parent, t.sel_action, self._num_simulations)
        store_bytes, stage_latent = self._store.run_store()
        leaf_reward, leaf_value = t.leaf_reward[:bsz], t.leaf_value[:bsz]  # [B] float64 staging views
        leaf_logits = t.leaf_logits[:bsz, : self._num_actions]  # [B, A]
        shapes = ((bsz,), (bsz,), (bsz, self._num_actions))
        plain_call = not getattr(recurrent_fn, "wants_node_ids", False)
        kernel = fast(
            kernels.store_expand_and_backup_chance if self.chance_edges else kernels.store_expand_and_backup
        )
        head = (
            t.children, t.prior, t.logits, t.kind, t.visit_count, t.value_sum, t.reward, t.raw_value,
            t.min_value, t.max_value, t.path, t.path_len, t.sel_parent, t.sel_action, t.sel_kind,
            t.leaf_reward, t.leaf_value, t.leaf_logits, store_bytes,
        )  # fmt: skip
        tail = (bsz, self._num_actions, self.num_chances, self.discount)

        def expand(sim: int) -> None:
            parent_latent, actions = gather(sim)  # [B, *latent_shape], [B] int64
            if plain_call:
                next_latent, reward, value, logits = recurrent_fn(parent_latent, actions)
            else:
                next_latent, reward, value, logits = call_recurrent(
                    recurrent_fn, parent_latent, actions, t, bsz, sim
                )
            address = stage_latent(sim + 1, next_latent)  # next_latent stays referenced until the kernel ran
            try:
                ok = (reward.shape, value.shape, logits.shape) == shapes
            except AttributeError:
                ok = False
            if ok:
                leaf_reward[...] = reward
                leaf_value[...] = value
                leaf_logits[...] = logits
            else:  # names the output whose shape is wrong
                _stage("reward", leaf_reward, reward)
                _stage("value", leaf_value, value)
                _stage("policy_logits", leaf_logits, logits)
            kernel(*head, address, sim + 1, *tail)

        return expand

    def _expand_then_backup(
        self, bsz: int, recurrent_fn: RecurrentFn, network_fns: Mapping[str, Callable]
    ) -> Step:
        """An :meth:`_expand_step` for variants that expand in their own per-simulation method
        ``_expand(bsz, sim, recurrent_fn, **network_fns)`` (storing latents and staging the outputs), followed
        by :meth:`_backup_step`."""
        expand_sim, backup = self._expand, self._backup_step(bsz)

        def step(sim: int) -> None:
            expand_sim(bsz, sim, recurrent_fn, **network_fns)
            backup(sim)

        return step

    def _backup_step(self, bsz: int) -> Step:
        """``backup(sim)``: attach node ``sim + 1`` in every tree and back its value up (the shared core), its
        latent stored and its outputs staged by the variant's own ``_expand``."""
        t = self._tree
        kernel = fast(kernels.expand_and_backup_chance if self.chance_edges else kernels.expand_and_backup)
        head = (
            t.children, t.prior, t.logits, t.kind, t.visit_count, t.value_sum, t.reward, t.raw_value,
            t.min_value, t.max_value, t.path, t.path_len, t.sel_parent, t.sel_action, t.sel_kind,
            t.leaf_reward, t.leaf_value, t.leaf_logits,
        )  # fmt: skip
        tail = (bsz, self._num_actions, self.num_chances, self.discount)
        return lambda sim: kernel(*head, sim + 1, *tail)

    def _outputs(self, bsz: int) -> SearchOutput:
        """Root visit counts, value and priors, plus the variant's :meth:`_extras`."""
        t = self._tree
        visit_counts = np.empty((bsz, self._num_actions), dtype=np.int32)  # [B, A]
        root_value = np.empty(bsz, dtype=np.float64)  # [B]
        fast(kernels.root_statistics)(
            t.children, t.visit_count, t.value_sum, bsz, self._num_actions, visit_counts, root_value
        )
        totals = visit_counts.sum(axis=1, keepdims=True)  # [B, 1], == num_simulations
        return SearchOutput(
            visit_counts=visit_counts,
            visit_distribution=(visit_counts / totals).astype(np.float32),
            root_value=root_value.astype(np.float32),
            root_prior=t.prior[:bsz, 0, : self._num_actions].astype(np.float32),
            extras=self._extras(bsz, visit_counts),
        )

    def _extras(self, bsz: int, visit_counts: np.ndarray) -> dict[str, np.ndarray]:
        """Variant-specific outputs, each with a leading [B] axis (none here)."""
        return {}


class MuZeroSearch(TreeSearch):
    """MuZero pUCT search over discrete actions (Schrittwieser et al. 2020), batched via numba kernels.

    Rules: :mod:`muzero_tune.mcts.kernels` (root priors and noise, the root's counted first visit, backup,
    min-max) and :mod:`muzero_tune.mcts.puct` (selection); :func:`muzero_tune.mcts.reference.reference_search`
    is the plain-Python specification. The root's initial inference is its first visit (visit_count 1,
    value_sum = ``root_value``), so the children's visits sum to ``num_simulations``, simulation 0 follows
    the prior, and ``root_value`` of the output is the mean over the network's root value and the
    ``num_simulations`` backed-up returns.

    ``unvisited_q`` scores an unvisited child with the bottom of the span (``"min"``, the MuZero paper's
    rule) or with its parent's mean value (``"parent"``); ``q_transform`` normalises Q over the tree's
    min-max stats (``"tree_min_max"``) or per node over its value and its visited children's Qs
    (``"parent_and_siblings"``, mctx's rule); :mod:`muzero_tune.mcts.puct` states them.

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
        unvisited_q: str = "min",
        q_transform: str = "tree_min_max",
        tree: TreeArrays | None = None,
    ) -> None:
        run_unvisited = _unvisited_code(unvisited_q)  # checked before any storage is allocated
        if q_transform not in puct.Q_TRANSFORM:
            raise ValueError(f"q_transform must be one of {sorted(puct.Q_TRANSFORM)}, got {q_transform!r}")
        if dirichlet_alpha <= 0.0:
            raise ValueError(f"dirichlet_alpha must be > 0, got {dirichlet_alpha}")
        if not 0.0 <= noise_weight <= 1.0:
            raise ValueError(f"noise_weight must be in [0, 1], got {noise_weight}")
        super().__init__(
            num_actions=num_actions,
            num_simulations=num_simulations,
            discount=discount,
            value_delta_max=value_delta_max,
            tree=tree,
        )
        self.pb_c_base = float(pb_c_base)
        self.pb_c_init = float(pb_c_init)
        self.dirichlet_alpha = float(dirichlet_alpha)
        self.noise_weight = float(noise_weight)
        self.unvisited_q = unvisited_q
        self._run_unvisited = run_unvisited
        self.q_transform = q_transform

    def run(self, *, unvisited_q: str | None = None, **kwargs) -> SearchOutput:
        """:meth:`TreeSearch.run`; ``unvisited_q`` (``"min"`` or ``"parent"``) overrides the instance's rule
        for this run (a policy's evaluation searches use their own)."""
        self._run_unvisited = _unvisited_code(self.unvisited_q if unvisited_q is None else unvisited_q)
        return super().run(**kwargs)

    _chance_mode = 0  # unused without chance edges

    def _noise_weight(self) -> float:
        return self.noise_weight

    def _seed_numba(self, deterministic: bool, rng: np.random.Generator) -> None:
        """numba's RNG serves only random tie-breaks here."""
        if not deterministic:
            fast(kernels.seed_rng)(int(rng.integers(0, 2**31 - 1)))

    def _prepare(self, bsz: int, *, add_noise: bool, deterministic: bool, rng: np.random.Generator) -> None:
        if add_noise:
            self._tree.root_noise[:bsz] = rng.standard_gamma(
                self.dirichlet_alpha, size=(bsz, self._num_actions)
            )
        self._seed_numba(deterministic, rng)
        super()._prepare(bsz, add_noise=add_noise, deterministic=deterministic, rng=rng)

    def _select_step(self, bsz: int, deterministic: bool) -> Step:
        t = self._tree
        kernel = fast(puct.select_leaves_chance if self.chance_edges else puct.select_leaves)
        args = (
            t.children, t.prior, t.kind, t.visit_count, t.value_sum, t.reward, t.min_value, t.max_value,
            t.root_legal, t.scores, t.path, t.path_len, t.sel_parent, t.sel_action, t.sel_kind, bsz,
            self._num_actions, self.num_chances, self.pb_c_base, self.pb_c_init, self.discount,
            self.value_delta_max, deterministic, self._chance_mode, self._run_unvisited,
            puct.Q_TRANSFORM[self.q_transform],
        )  # fmt: skip
        return lambda sim: kernel(*args)


def _unvisited_code(rule: str) -> int:
    """The kernels' code of an ``unvisited_q`` rule name; a clear error for any other name."""
    if rule not in puct.UNVISITED_Q:
        raise ValueError(f"unvisited_q must be one of {sorted(puct.UNVISITED_Q)}, got {rule!r}")
    return puct.UNVISITED_Q[rule]


_FAST: dict = {}


def fast(kernel):
    """``kernel``'s compiled entry point, once it has its one compiled signature (the kernels are written to
    compile exactly once: full-capacity arrays, fixed scalar types). Calling it skips numba's per-call
    argument typing, about a quarter of a per-simulation kernel call at B = 8. Before the first compile,
    or should numba's internals differ, the dispatcher itself."""
    entry = _FAST.get(kernel)
    if entry is not None:
        return entry
    try:
        (signature,) = kernel.signatures
        entry = kernel.overloads[signature].entry_point
    except (AttributeError, KeyError, ValueError):
        return kernel
    _FAST[kernel] = entry
    return entry


def call_recurrent(recurrent_fn, parent_latent, actions, tree: TreeArrays, bsz: int, sim: int):
    """``recurrent_fn(parent_latent, actions)``; a ``recurrent_fn`` with the attribute ``wants_node_ids =
    True`` (transformer world models with per-node caches, see :class:`Search`) also receives
    ``parent_node`` [B] int32 (the node whose edge is expanded), ``new_node`` (int, ``sim + 1``: the node
    being created) and ``depth`` [B] int32 (the new node's depth, root = 0), as fresh arrays."""
    if getattr(recurrent_fn, "wants_node_ids", False):
        return recurrent_fn(
            parent_latent,
            actions,
            parent_node=tree.sel_parent[:bsz].copy(),
            new_node=sim + 1,
            depth=tree.path_len[:bsz].copy(),
        )
    return recurrent_fn(parent_latent, actions)


def _check_shape(name: str, array: np.ndarray, shape: tuple[int, ...]) -> None:
    if tuple(np.shape(array)) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(np.shape(array))}")


def _check_latent(latent: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(latent.shape) != shape:
        raise ValueError(f"network latent shape {tuple(latent.shape)} does not match the root's {shape}")


def check_finite_roots(root_policy_logits: np.ndarray, root_value) -> None:
    """Refuse roots whose network outputs are not finite (weights a diverged training step wrote nan into):
    the search's scores would all be nan and no action could be chosen."""
    if not (np.isfinite(root_policy_logits).all() and np.isfinite(np.asarray(root_value)).all()):
        raise DivergedError(
            "the network's outputs at the search's roots are not finite: training diverged (a step's size "
            "comes from learn.learning_rate, learn.weight_decay, learn.grad_clip_norm and the loss weights)"
        )


def _stage(name: str, dst: np.ndarray, src: np.ndarray) -> None:
    """Copy a network output into its float64 staging view, refusing silent broadcasting."""
    if getattr(src, "shape", None) != dst.shape:
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
