"""Sampled MuZero search (Hubert et al. 2021, "Learning and Planning in Complex Action Spaces"), batched.

What this module owns
    :class:`SampledSearch`: MuZero's search (:class:`~muzero_tune.mcts.search.MuZeroSearch`, so pUCT,
    Dirichlet noise, the root's counted visit and the backup are the shared ones) over K actions sampled at
    every expanded node, for continuous actions (a tanh-squashed Gaussian policy), discrete ones (K
    distinct actions by Gumbel-top-K) and factored ones (a ``MultiDiscrete`` taken by its factors: K
    independent draws from a product of per-factor categoricals). Its storage :class:`SampledTreeArrays`.
    The expansion rule is written in :mod:`muzero_tune.mcts.sampled_kernels`; the plain-Python
    specification is :func:`muzero_tune.mcts.reference.reference_sampled_search`.

Randomness (all from the caller's Generator, so a run is reproducible from its seed)
    Per :meth:`run`, in this order: if ``add_noise``, ``rng.standard_gamma(dirichlet_alpha, size=(B, K))``
    (Dirichlet noise over the root's K edges) and, for factored actions,
    ``rng.standard_gamma(dirichlet_alpha, size=(B, P))`` (each factor's Dirichlet draw, mixed into the
    root's sampling distribution); if not ``deterministic``, one ``rng.integers`` that seeds numba's
    tie-break RNG; the root's sampling noise; then per simulation the new nodes' sampling noise. Sampling
    noise is ``rng.standard_normal(size=(B, K, D))`` for continuous actions, ``rng.gumbel(size=(B, A))``
    for discrete ones and ``rng.random(size=(B, K, D))`` for factored ones.

Interface
    ``root_policy_logits`` / the policy part of ``recurrent_fn``'s output are the policy's parameters
    ``[B, P]``: ``[mu (D), log_sigma (D)]`` for continuous actions (P = 2D), the logits for discrete ones
    (P = A), the factors' logits end to end for factored ones (P = sum(nvec)). ``recurrent_fn`` receives
    actions ``[B, D] float32`` in [-1, 1] (continuous), ``[B] int64`` (discrete) or ``[B, D] int64`` factor
    indices (factored). The output's ``visit_counts`` / ``visit_distribution`` / ``root_prior`` are indexed
    by sample slot ``[B, K]``; ``extras["sampled_actions"]`` maps slots to actions (``[B, K, D] float32``,
    ``[B, K] int64`` or ``[B, K, D] int64``) and ``extras["sampled_mask"]`` ``[B, K] bool`` marks the valid
    slots (fewer legal actions than K leave root slots empty), so
    :func:`~muzero_tune.mcts.search.select_action` picks a slot.
"""

from __future__ import annotations

import numpy as np

from muzero_tune.mcts import sampled_kernels as smk
from muzero_tune.mcts.search import (
    MuZeroSearch,
    Step,
    _check_shape,
    _stage,
    call_recurrent,
    check_finite_roots,
    fast,
)
from muzero_tune.mcts.tree import TreeArrays

SAMPLED_PRIORS = ("auto", "uniform", "density")
ACTION_KINDS = tuple(smk.KIND_CODES)


class SampledTreeArrays(TreeArrays):
    """:class:`TreeArrays` over K edges plus the sampled actions and staging (layout: sampled_kernels)."""

    def __init__(
        self, *, num_samples: int, action_dim: int, num_env_actions: int, num_params: int,
        num_factor_values: int = 1,
    ) -> None:  # fmt: skip
        self.action_dim = int(action_dim)
        self.num_env_actions = int(num_env_actions)
        self.num_params = int(num_params)
        self.num_factor_values = int(num_factor_values)
        super().__init__(num_actions=num_samples)

    def _allocate_extra(self, batch_capacity: int, node_capacity: int) -> None:
        bc, k, d, a, p = (
            batch_capacity,
            self.num_actions,
            self.action_dim,
            self.num_env_actions,
            self.num_params,
        )
        self.node_actions = np.zeros((bc, node_capacity, k, d), dtype=np.float64)
        self.slot_score = np.zeros((bc, k), dtype=np.float64)
        self.root_params = np.zeros((bc, p), dtype=np.float64)
        self.leaf_params = np.zeros((bc, p), dtype=np.float64)
        self.slot_noise = np.zeros((bc, k, d), dtype=np.float64)
        self.gumbel_noise = np.zeros((bc, a), dtype=np.float64)
        self.action_legal = np.ones((bc, a), dtype=np.bool_)
        self.taken = np.zeros((bc, a), dtype=np.bool_)
        self.factor_noise = np.zeros((bc, self.num_factor_values), dtype=np.float64)
        self.factor_stats = np.zeros((bc, d, 2), dtype=np.float64)


class SampledSearch(MuZeroSearch):
    """Batched Sampled MuZero search (see the module docstring).

    Args (keyword-only, besides MuZero's pUCT and noise knobs):
        num_samples: K, the edges sampled at every node (discrete: at most the number of actions).
        action_kind: ``"continuous"``, ``"discrete"`` or ``"factored"``.
        action_dim: D, the continuous action size (1 for discrete; factored: taken from ``action_nvec``).
        num_actions: A, the number of discrete actions (ignored for continuous and factored).
        action_nvec: factored actions: each factor's number of values ``(n_1, ..., n_D)``.
        sampled_prior: ``"uniform"`` (1/K per sampled edge), ``"density"`` (pi renormalised over the
            sampled actions) or ``"auto"``: the prior that is right for each sampling scheme. Continuous
            and factored actions are K independent draws from pi, for which the paper's beta_hat / beta * pi
            is 1/K (uniform; at a factored exploring root, whose draws come from a noised beta, pi / beta
            renormalised). Discrete actions are K distinct actions drawn without replacement, where 1/K
            would throw pi away (with K = A every action gets 1/K whatever pi says); pi renormalised over
            the sample (density) is right there, and with K = A it is MuZero's prior exactly.
    """

    def __init__(
        self,
        *,
        num_samples: int,
        action_kind: str,
        num_simulations: int,
        action_dim: int = 1,
        num_actions: int = 1,
        action_nvec: tuple[int, ...] = (),
        sampled_prior: str = "auto",
        **knobs,
    ) -> None:
        if action_kind not in ACTION_KINDS:
            raise ValueError(f"action_kind must be one of {list(ACTION_KINDS)}, got {action_kind!r}")
        if sampled_prior not in SAMPLED_PRIORS:
            raise ValueError(f"sampled_prior must be one of {list(SAMPLED_PRIORS)}, got {sampled_prior!r}")
        continuous, factored = action_kind == "continuous", action_kind == "factored"
        if num_samples < 1 or (action_kind == "discrete" and num_samples > num_actions):
            raise ValueError(
                f"num_samples must be >= 1 (and <= num_actions = {num_actions} for discrete actions), "
                f"got {num_samples}"
            )
        if action_dim < 1:
            raise ValueError(f"action_dim must be >= 1, got {action_dim}")
        nvec = tuple(int(n) for n in action_nvec)
        if factored != bool(nvec) or (nvec and min(nvec) < 1):
            raise ValueError(f"action_nvec must list each factor's size (>= 1) for factored actions only, "
                             f"got {action_nvec!r} with {action_kind} actions")  # fmt: skip
        self.continuous, self.factored = continuous, factored
        self.kind_code = smk.KIND_CODES[action_kind]
        self.action_nvec = nvec
        self.action_dim = len(nvec) if factored else int(action_dim) if continuous else 1
        self.num_env_actions = int(num_actions) if action_kind == "discrete" else 1
        self.num_params = (
            2 * self.action_dim if continuous else sum(nvec) if factored else self.num_env_actions
        )
        # factor d's size and where its logits start in the parameters (one dummy factor elsewhere)
        self.factor_sizes = np.array(nvec or (1,), dtype=np.int64)
        self.factor_starts = (np.cumsum(self.factor_sizes) - self.factor_sizes).astype(np.int64)
        self.sampled_prior = resolved_sampled_prior(sampled_prior, action_kind)
        tree = SampledTreeArrays(
            num_samples=num_samples,
            action_dim=self.action_dim,
            num_env_actions=self.num_env_actions,
            num_params=self.num_params,
            num_factor_values=int(self.factor_sizes.sum()),
        )
        super().__init__(num_actions=num_samples, num_simulations=num_simulations, tree=tree, **knobs)

    @property
    def num_samples(self) -> int:
        return self._num_actions

    def _stage_roots(self, root_latent, root_policy_logits, legal_mask, root_value) -> int:
        bsz = int(root_latent.shape[0])
        _check_shape("root_policy_logits", root_policy_logits, (bsz, self.num_params))
        if root_value is None:
            raise ValueError("root_value [B] is required: the root's initial inference is its first visit")
        check_finite_roots(root_policy_logits, root_value)
        t = self._tree
        t.ensure_capacity(batch_size=bsz, num_nodes=self._num_simulations + 1)
        if self.continuous or self.factored:
            if legal_mask is not None and np.size(legal_mask) and not np.all(legal_mask):
                raise ValueError("legal_mask must be None or all True for continuous and factored actions")
            t.action_legal[:bsz] = True
        else:
            legal_mask = np.asarray(legal_mask)
            _check_shape("legal_mask", legal_mask, (bsz, self.num_env_actions))
            if legal_mask.dtype != np.bool_ or not legal_mask.any(axis=1).all():
                raise ValueError("legal_mask must be bool with at least one legal action per row")
            t.action_legal[:bsz] = legal_mask
        t.root_params[:bsz] = root_policy_logits
        _stage("root_value", t.root_value[:bsz], np.asarray(root_value))
        return bsz

    def _draw_sampling_noise(self, bsz: int, rng: np.random.Generator) -> None:
        t = self._tree
        if self.continuous:
            t.slot_noise[:bsz] = rng.standard_normal(size=(bsz, self._num_actions, self.action_dim))
        elif self.factored:
            t.slot_noise[:bsz] = rng.random(size=(bsz, self._num_actions, self.action_dim))
        else:
            t.gumbel_noise[:bsz] = rng.gumbel(size=(bsz, self.num_env_actions))

    def _prepare(self, bsz: int, *, add_noise: bool, deterministic: bool, rng: np.random.Generator) -> None:
        t = self._tree
        if add_noise:
            t.root_noise[:bsz] = rng.standard_gamma(self.dirichlet_alpha, size=(bsz, self._num_actions))
            if self.factored:
                t.factor_noise[:bsz] = rng.standard_gamma(self.dirichlet_alpha, size=(bsz, self.num_params))
        self._seed_numba(deterministic, rng)
        self._draw_sampling_noise(bsz, rng)
        self._rng = rng  # the expansions of this run draw their sampling noise from it
        smk.prepare_roots(
            t.children, t.prior, t.kind, t.visit_count, t.value_sum, t.reward, t.raw_value, t.min_value,
            t.max_value, t.root_legal, t.root_noise, t.root_value, t.node_actions, t.slot_score,
            t.root_params,
            t.slot_noise, t.gumbel_noise, t.action_legal, t.taken, self.factor_sizes, self.factor_starts,
            t.factor_noise, t.factor_stats, bsz, self._num_simulations + 1, self._num_actions,
            self.action_dim, self.num_env_actions, self.kind_code, self.sampled_prior == "uniform", add_noise,
            self.noise_weight,
        )  # fmt: skip

    def _env_actions(self, bsz: int, nodes: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """The actions of edges (nodes[b], slots[b]): [B, D] float32, [B] int64 or [B, D] int64."""
        a = self._tree.node_actions[np.arange(bsz), nodes, slots]  # [B, D]
        return self._library_actions(a)

    def _library_actions(self, a: np.ndarray) -> np.ndarray:
        """Stored actions [..., D] float64 -> the library's form: float32 [..., D] (continuous), int64 [...]
        (discrete) or int64 [..., D] (factored)."""
        if self.continuous:
            return a.astype(np.float32)
        return a.astype(np.int64) if self.factored else a[..., 0].astype(np.int64)

    def _expand(self, bsz, sim, recurrent_fn, **network_fns) -> None:
        t = self._tree
        parent_latent = self._store.gather(t.sel_parent[:bsz])  # [B, *latent_shape]
        actions = self._env_actions(bsz, t.sel_parent[:bsz], t.sel_action[:bsz])
        next_latent, reward, value, params = call_recurrent(recurrent_fn, parent_latent, actions, t, bsz, sim)
        self._store.put(sim + 1, next_latent)
        _stage("reward", t.leaf_reward[:bsz], reward)
        _stage("value", t.leaf_value[:bsz], value)
        _stage("policy_params", t.leaf_params[:bsz], params)
        self._draw_sampling_noise(bsz, self._rng)

    def _expand_step(self, bsz, recurrent_fn, network_fns) -> Step:
        return self._expand_then_backup(bsz, recurrent_fn, network_fns)

    def _backup_step(self, bsz: int) -> Step:
        t = self._tree
        kernel = fast(smk.expand_and_backup)
        head = (
            t.children, t.prior, t.kind, t.visit_count, t.value_sum, t.reward, t.raw_value, t.min_value,
            t.max_value, t.path, t.path_len, t.sel_parent, t.sel_action, t.leaf_reward, t.leaf_value,
            t.node_actions, t.slot_score, t.leaf_params, t.slot_noise, t.gumbel_noise, t.action_legal,
            t.taken, self.factor_sizes, self.factor_starts, t.factor_noise, t.factor_stats,
        )  # fmt: skip
        tail = (bsz, self._num_actions, self.action_dim, self.num_env_actions, self.kind_code,
                self.sampled_prior == "uniform", self.discount)  # fmt: skip
        return lambda sim: kernel(*head, sim + 1, *tail)

    def _extras(self, bsz: int, visit_counts: np.ndarray) -> dict[str, np.ndarray]:
        t = self._tree
        sampled = self._library_actions(t.node_actions[:bsz, 0])  # from [B, K, D]
        return {"sampled_actions": sampled, "sampled_mask": t.root_legal[:bsz].copy()}


def resolved_sampled_prior(sampled_prior: str, action_kind: str) -> str:
    """``"uniform"`` or ``"density"``: ``sampled_prior`` with ``"auto"`` resolved for ``action_kind``
    (uniform for independent continuous and factored draws, density for discrete samples without
    replacement)."""
    if sampled_prior != "auto":
        return sampled_prior
    return "density" if action_kind == "discrete" else "uniform"
