"""The policy plug-in interface: what a MuZero-family policy type supplies to the pipelines.

A policy supplies its model, its search (and how the search calls the model), what it stores per
environment step (visit distributions, root values, later: sampled actions, improved policies, chance
codes), its targets and its loss, plus lifecycle hooks. It holds no weights: models are passed in, so one
policy object serves the learner, collectors, evaluators and reanalyze alike.

The collector, buffer, learner and drivers call only this interface and never branch on a policy name.

Context. A policy whose roots depend on the steps before them (a transformer world model acting over a window
of past observations and actions) declares how many past steps it wants, :attr:`Policy.context_steps` H;
its targets then get, with each bootstrap and reanalyze position, the H steps before it
(:class:`~muzero_tune.replay.targets.PastSteps`, cut at the episode start), so those roots are built in the
context acting used. Its ``reanalyze`` takes them as ``past``; H = 0 (the default) passes nothing.

Actions. A policy type declares the env action kinds it supports in :attr:`Policy.action_kinds`
(``EnvSpec.action_kind`` values: ``"discrete"``, ``"continuous"``); :func:`check_action_kind` refuses any
other env before anything starts (the drivers and the CLI call it through
``pipeline.core.check_policy_env``; :meth:`Policy.__init__` calls it too). Actions are in the library's form,
``EnvSpec.action_shape`` / ``EnvSpec.action_dtype``:

* ``act`` returns ``ActOutput.actions`` ``[B]`` int64 (discrete) or ``[B, D]`` float32 in [-1, 1]
  (continuous; an env wrapper maps them to the env's bounds, see :mod:`muzero_tune.envs.actions`);
* segments store ``actions`` ``[M]`` / ``[M, D]``; ``make_batch`` (``replay.targets.make_batch`` with
  ``action_dim=spec.action_dim``) gives the learner ``TrainBatch.actions`` ``[B, K]`` int64 /
  ``[B, K, D]`` float32: the actions a_t..a_{t+K-1} the unroll takes.
* a continuous policy's per-step statistics (e.g. its sampled actions ``[K, D]`` and their visit
  distribution ``child_visits`` ``[K]``) go in ``step_stats`` like any other; ``legal_mask`` is
  ``[B, 0]`` for continuous envs (there is nothing to mask).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from muzero_tune.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from muzero_tune.config import ExperimentConfig
    from muzero_tune.envs.spec import EnvSpec
    from muzero_tune.replay.buffer import SampledIndices
    from muzero_tune.replay.targets import ReanalyzeFn, TrainBatch


@dataclass(frozen=True)
class ActOutput:
    """One batched acting step."""

    actions: np.ndarray  # [B] int64 (discrete) or [B, D] float32 in [-1, 1] (continuous): spec.action_shape
    step_stats: dict[str, np.ndarray]  # name -> [B, ...]: stored with the transition in its segment
    root_value: np.ndarray  # [B] float32, searched value of the root
    predicted_value: np.ndarray  # [B] float32, the network's value of the root
    state: Any = None  # the policy's per-env acting state after this step (recurrent / context types)


@dataclass(frozen=True)
class LossOutput:
    """One learner step's loss."""

    loss: torch.Tensor  # scalar: mean over the batch of importance weight x per-sample loss
    per_sample_loss: torch.Tensor  # [B]
    priorities: np.ndarray  # [B] float32 new priorities for the samples
    metrics: dict[str, float] = field(default_factory=dict)


class Policy(ABC):
    """A MuZero-family policy type (see the module docstring)."""

    name: str = ""
    # the EnvSpec.action_kind values ("discrete", "continuous") this policy type supports
    action_kinds: tuple[str, ...] = ("discrete",)
    # compute_loss takes ``ssl_latent`` (the SSL targets' encodings of the learner's live model may run on
    # its helper thread: learn.helper_ssl_encodings)
    ssl_latent_seam: bool = False
    # H: past steps (observations and the actions taken) each bootstrap / reanalyze position comes with
    # (module docstring); 0: the observation alone
    context_steps: int = 0

    def __init__(self, cfg: ExperimentConfig, spec: EnvSpec):
        check_action_kind(type(self), spec, policy_type=self.name or type(self).__name__)
        self.cfg = cfg
        self.spec = spec

    # ---------------------------------------------------------------- model and acting

    @abstractmethod
    def build_model(self) -> torch.nn.Module:
        """A freshly initialised network for this policy and environment."""

    @abstractmethod
    def act(
        self,
        model: torch.nn.Module,
        obs: np.ndarray,  # [B, *obs_shape] stacked observations
        legal_mask: np.ndarray,  # [B, A] bool ([B, 0] for continuous actions)
        *,
        explore: bool,
        temperature: float,
        rng: np.random.Generator,
        state: Any = None,
        env_index: np.ndarray | None = None,
    ) -> ActOutput:
        """Search from each observation and pick actions (explore: root noise + sampling).

        ``state`` is this policy's acting state for all of its caller's envs (from
        :meth:`initial_act_state`); ``env_index`` [B] says which env each batch row is. Stateless policies
        ignore both and return ``state=None``.
        """

    def initial_act_state(self, num_envs: int) -> Any:
        """Per-env acting state carried across steps (e.g. a recurrent history); None when stateless."""
        return None

    def reset_act_state(self, state: Any, env_index: int) -> Any:
        """Reset one env's acting state at an episode start."""
        return state

    def step_stat_names(self) -> tuple[str, ...]:
        """Names of the per-step arrays this policy stores in segments."""
        return ("child_visits", "root_value", "legal_mask")

    # ---------------------------------------------------------------- learning

    @abstractmethod
    def make_batch(
        self,
        sample: SampledIndices,
        *,
        target_model: torch.nn.Module,
        rng: np.random.Generator,
        reanalyze_count: int = 0,
        defer_bootstrap: bool = False,
    ) -> TrainBatch:
        """Targets for a prioritized sample (bootstrap values from the target model).

        Besides ``rng``'s draws, building a batch may change the buffer only through ``reanalyze_count`` > 0
        (fresh search statistics written into the sampled segments): the driver builds the next batch ahead
        of time (``learn.prefetch_next_batch``) only without it, and throws it away unused if anything
        changed since.

        ``defer_bootstrap``: leave the target model's bootstrap values to the learner's step
        (``batch.bootstrap``, see :class:`~muzero_tune.replay.targets.Bootstrap`; the driver passes True);
        the values are the same, only who runs the target network's forward changes."""

    @abstractmethod
    def reanalyze(
        self, target_model: torch.nn.Module, obs: np.ndarray, legal_mask: np.ndarray, rng: np.random.Generator
    ) -> np.ndarray | dict[str, np.ndarray]:
        """Fresh search results for stacked observations [N, *obs_shape] (reanalyze): visit distributions
        [N, A] (written back to ``stats['child_visits']``) or a dict of per-step statistics by name, each
        [N, ...], written back to ``stats[name]`` (e.g. a Gumbel policy's improved policy). A policy with
        :attr:`context_steps` > 0 takes a keyword ``past`` (``PastSteps`` of the N rows) too."""

    def reanalyze_fn(self, target_model: torch.nn.Module, rng: np.random.Generator) -> ReanalyzeFn:
        """:meth:`reanalyze` with ``target_model`` and ``rng`` bound, in the form
        :func:`~muzero_tune.replay.targets.reanalyze_positions` calls it: ``(obs, legal)``, or
        ``(obs, legal, past)`` when :attr:`context_steps` > 0."""
        if self.context_steps > 0:
            return lambda obs, legal, past: self.reanalyze(target_model, obs, legal, rng, past=past)
        return lambda obs, legal: self.reanalyze(target_model, obs, legal, rng)

    @abstractmethod
    def compute_loss(self, model: torch.nn.Module, batch: TrainBatch, *, train_iter: int) -> LossOutput:
        """The weighted training loss of one batch; ``train_iter`` is always given (schedules use it)."""

    # ---------------------------------------------------------------- hooks (called for every policy)

    def on_weights_loaded(self, model: torch.nn.Module) -> None:  # noqa: B027 (optional hook)
        """Run in collectors/evaluators after they load a new snapshot (e.g. clear world-model caches)."""

    def on_train_budget_done(  # noqa: B027 (optional hook)
        self, model: torch.nn.Module, target_model: torch.nn.Module
    ) -> None:
        """Run by the driver after each completed train budget (one collect's worth of train steps)."""


def check_action_kind(
    policy_cls: type[Policy], spec: EnvSpec, *, policy_type: str, alternatives: tuple[str, ...] | None = None
) -> None:
    """Raise :class:`ConfigError` (key ``env.env_id``) when ``policy_cls`` does not support the env's action
    kind; ``alternatives`` names the policy types that do (``None``: not listed)."""
    kinds = tuple(getattr(policy_cls, "action_kinds", ()))
    if spec.action_kind in kinds:
        return
    if alternatives is None:
        others = ""
    else:
        others = (
            f"; policy types for {spec.action_kind} actions: {', '.join(alternatives)}"
            if alternatives
            else f"; no implemented policy type supports {spec.action_kind} actions yet"
        )
    raise ConfigError(
        "env.env_id",
        spec.env_id,
        f"policy.type '{policy_type}' supports {' or '.join(kinds) or 'no'} actions and this env has "
        f"{spec.action_kind} actions{others}",
    )
