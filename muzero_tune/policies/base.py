"""The policy plug-in interface: what a MuZero-family policy type supplies to the pipelines.

A policy supplies its model, its search (and how the search calls the model), what it stores per
environment step (visit distributions, root values, later: sampled actions, improved policies, chance
codes), its targets and its loss, plus lifecycle hooks. It holds no weights: models are passed in, so one
policy object serves the learner, collectors, evaluators and reanalyze alike.

The collector, buffer, learner and drivers call only this interface and never branch on a policy name.

Acting. :meth:`Policy.act` is one skeleton for every type, a search from roots:

1. :meth:`Policy.root_inference`: the roots of the B acting rows (:class:`SearchRoots`: the search state,
   policy and value logits of each root), from their observations and the type's acting state;
2. :meth:`Policy.run_search`: the search from those roots (``mcts.SearchOutput``) and the network's
   decoded root values;
3. :meth:`Policy.choose_edges` (visit-count sampling, or the search's own choice) and
   :meth:`Policy.edge_actions` (root edges to env actions);
4. :meth:`Policy.step_stats` (what a step stores) and :meth:`Policy.advance_act_state` (the acting state
   after the step).

A type overrides the hooks it changes; a type whose acting is not a search from roots may override
``act`` itself. :meth:`Policy.search_observations` runs steps 1-2 from observations alone (a fresh acting
state); ``reanalyze`` uses it.

Context. A policy whose roots depend on the steps before them (a transformer world model acting over a window
of past observations and actions) declares how many past steps it wants, :attr:`Policy.context_steps` H;
its targets then get, with each bootstrap and reanalyze position, the H steps before it
(:class:`~muzero_tune.replay.targets.PastSteps`, cut at the episode start), so those roots are built in the
context acting used. Its ``reanalyze`` takes them as ``past``; H = 0 (the default) passes nothing.

Actions. A policy type declares the env action kinds it supports in :attr:`Policy.action_kinds`
(``EnvSpec.action_kind`` values: ``"discrete"``, ``"continuous"``, ``"factored"``); :func:`check_action_kind`
refuses any other env before anything starts (the drivers and the CLI call it through
``pipeline.core.check_policy_env``; :meth:`Policy.__init__` calls it too). Actions are in the library's form,
``EnvSpec.action_shape`` / ``EnvSpec.action_dtype``:

* ``act`` returns ``ActOutput.actions`` ``[B]`` int64 (discrete), ``[B, D]`` float32 in [-1, 1]
  (continuous; an env wrapper maps them to the env's bounds, see :mod:`muzero_tune.envs.actions`) or
  ``[B, D]`` int64 factor indices (factored: a ``MultiDiscrete`` taken by its factors);
* segments store ``actions`` ``[M]`` / ``[M, D]``; ``make_batch`` (``replay.targets.make_batch`` with
  ``action_dim=spec.action_dim``, ``action_nvec=spec.action_nvec``) gives the learner ``TrainBatch.actions``
  ``[B, K]`` int64 / ``[B, K, D]`` float32 / ``[B, K, D]`` int64: the actions a_t..a_{t+K-1} the unroll takes.
* a continuous or factored policy's per-step statistics (e.g. its sampled actions ``[K, D]`` and their visit
  distribution ``child_visits`` ``[K]``) go in ``step_stats`` like any other; ``legal_mask`` is
  ``[B, 0]`` for continuous and factored envs (there is nothing to mask).
"""

from __future__ import annotations

import contextlib
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from muzero_tune.errors import ConfigError
from muzero_tune.mcts import select_action

if TYPE_CHECKING:
    from muzero_tune.config import ExperimentConfig
    from muzero_tune.envs.spec import EnvSpec
    from muzero_tune.mcts import SearchOutput
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


@dataclass(frozen=True, eq=False)
class SearchRoots:
    """B roots as the network sees them: where one search starts (:meth:`Policy.root_inference`)."""

    latent: torch.Tensor  # [B, *state_shape]: each root's search state (a latent, or a type's packed state)
    policy_logits: torch.Tensor  # [B, P]
    value_logits: torch.Tensor  # [B, 2*Sv + 1] on the value support
    step_stats: dict[str, np.ndarray] = field(default_factory=dict)  # extra per-step stats, each [B, ...]
    context: Any = None  # a type's own root data that its run_search / advance_act_state read


@dataclass(frozen=True)
class LossOutput:
    """One learner step's loss."""

    loss: torch.Tensor  # scalar: mean over the batch of importance weight x per-sample loss
    per_sample_loss: torch.Tensor  # [B]
    priorities: np.ndarray  # [B] float32 new priorities for the samples
    metrics: dict[str, float] = field(default_factory=dict)


class LossTensors(NamedTuple):
    """A loss's outputs while ``torch.compile`` traces it (:func:`loss_output`): the graph returns these
    tensors, and :meth:`host_side` runs after it, eager."""

    loss: torch.Tensor  # []
    per_sample: torch.Tensor  # [B]
    priorities: torch.Tensor  # [B]
    means: torch.Tensor  # [M]
    names: tuple[str, ...]  # M metric names
    host_metrics: dict[str, float] | None

    def host_side(self) -> LossOutput:
        """:func:`loss_output` of these tensors, eager."""
        return loss_output(*self)


def loss_output(
    loss: torch.Tensor,
    per_sample: torch.Tensor,
    priorities: torch.Tensor,
    means: torch.Tensor,
    names: tuple[str, ...],
    host_metrics: dict[str, float] | None = None,
) -> LossOutput | LossTensors:
    """A loss's host side: ``priorities`` [B] to a float32 array, the metric means ``means`` [M] (named
    ``names``) and ``loss`` to floats in one tensor-to-list (``train/loss_total`` is the loss), ``loss`` []
    and ``per_sample`` [B] kept as tensors; ``host_metrics``: metrics the loss has as Python numbers, added as
    they are. While ``torch.compile`` traces the loss (``learn.compile``) it returns its inputs as
    :class:`LossTensors` instead, so the graph ends here without a break and
    :class:`~muzero_tune.pipeline.compiled_loss.CompiledLoss` runs this after the graph."""
    if torch.compiler.is_compiling():
        return LossTensors(loss, per_sample, priorities, means, names, host_metrics)
    values = torch.cat([loss.detach().reshape(1).float(), means.float()]).tolist()
    metrics = {"train/loss_total": values[0], **dict(zip(names, values[1:], strict=True))}
    metrics.update(host_metrics or {})
    return LossOutput(
        loss=loss, per_sample_loss=per_sample, priorities=priorities.cpu().numpy(), metrics=metrics
    )


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
        self.cfg = with_model_kind(cfg, spec)  # model.kind=auto resolved from the env's frames
        self.spec = spec

    # ---------------------------------------------------------------- model and acting

    @abstractmethod
    def build_model(self) -> torch.nn.Module:
        """A freshly initialised network for this policy and environment."""

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
        """Search from each observation and pick actions (explore: root noise + sampling at ``temperature``;
        otherwise the most visited edge, greedy evaluation).

        ``state`` is this policy's acting state for all of its caller's envs (from
        :meth:`initial_act_state`); ``env_index`` [B] says which env each batch row is. Stateless policies
        ignore both and return ``state=None``. The steps are the module docstring's.
        """
        state, env_index = self.acting_rows(len(obs), state, env_index)
        deterministic = (not explore) and self.cfg.mcts.deterministic_eval
        with eval_mode(model):
            obs_t = torch.as_tensor(obs, device=model_device(model))
            roots = self.root_inference(model, obs_t, state, env_index)
            out, predicted = self.run_search(
                model, roots, legal_mask, add_noise=explore, deterministic=deterministic, rng=rng
            )
        edges = self.choose_edges(out, explore=explore, temperature=temperature, rng=rng)
        actions = self.edge_actions(out, edges)
        return ActOutput(
            actions=actions,
            step_stats={**self.step_stats(out, legal_mask), **roots.step_stats},
            root_value=out.root_value,
            predicted_value=predicted,
            state=self.advance_act_state(state, env_index, np.asarray(obs), actions, roots),
        )

    def search_observations(
        self, model: torch.nn.Module, obs: np.ndarray, legal_mask: np.ndarray, *, add_noise: bool,
        deterministic: bool, rng: np.random.Generator,
    ) -> tuple[SearchOutput, np.ndarray]:  # fmt: skip
        """The search from observations ``obs`` [N, *obs_shape] alone (a fresh acting state: every row at
        its episode start) -> (SearchOutput, decoded network root values [N] float32)."""
        state, env_index = self.acting_rows(len(obs), None, None)
        with eval_mode(model):
            obs_t = torch.as_tensor(obs, device=model_device(model))
            roots = self.root_inference(model, obs_t, state, env_index)
            return self.run_search(
                model, roots, legal_mask, add_noise=add_noise, deterministic=deterministic, rng=rng
            )

    # ---------------------------------------------------------------- the acting hooks

    def root_inference(
        self, model: torch.nn.Module, obs: torch.Tensor, state: Any, env_index: np.ndarray
    ) -> SearchRoots:
        """The roots of the rows ``env_index`` [B] (int64) at observations ``obs`` [B, *obs_shape], with
        the acting ``state`` of all envs. Called in :func:`eval_mode`."""
        raise NotImplementedError(f"{type(self).__name__} implements root_inference or overrides act")

    def run_search(
        self, model: torch.nn.Module, roots: SearchRoots, legal_mask: np.ndarray, *, add_noise: bool,
        deterministic: bool, rng: np.random.Generator,
    ) -> tuple[SearchOutput, np.ndarray]:  # fmt: skip
        """The search from ``roots`` (B of them) with legal actions ``legal_mask`` [B, A] -> (SearchOutput:
        visit counts [B, E] over the root edges, searched root values [B], extras; the network's decoded
        root values [B] float32). ``add_noise``: root noise (collection, reanalyze); ``deterministic``:
        ties broken by index. Called in :func:`eval_mode`."""
        raise NotImplementedError(f"{type(self).__name__} implements run_search or overrides act")

    def choose_edges(
        self, out: SearchOutput, *, explore: bool, temperature: float, rng: np.random.Generator
    ) -> np.ndarray:
        """The root edge each row takes, [B] int64: exploring, sampled from the visit counts at
        ``temperature``; otherwise the most visited."""
        return select_action(
            out.visit_counts, temperature=temperature if explore else 0.0, rng=rng, deterministic=not explore
        )

    def edge_actions(self, out: SearchOutput, edges: np.ndarray) -> np.ndarray:
        """The env actions of the chosen root edges ``edges`` [B]: [B] int64 where the edges are the
        actions; a sampled type maps each edge to its sampled action ([B, D] float32 or [B] int64)."""
        return edges.astype(np.int64)

    def step_stats(self, out: SearchOutput, legal_mask: np.ndarray) -> dict[str, np.ndarray]:
        """What a step stores in its segment (:meth:`step_stat_names`), each [B, ...]; the roots'
        ``SearchRoots.step_stats`` are added to it."""
        return {
            "child_visits": out.visit_distribution.astype(np.float32),
            "root_value": out.root_value.astype(np.float32),
            "legal_mask": np.asarray(legal_mask, dtype=bool),
        }

    def advance_act_state(
        self, state: Any, env_index: np.ndarray, obs: np.ndarray, actions: np.ndarray, roots: SearchRoots
    ) -> Any:
        """The acting state after the rows ``env_index`` [B] searched from ``roots`` at ``obs`` [B, ...]
        and took ``actions`` [B, ...]; stateless types return ``state`` (None)."""
        return state

    def acting_rows(self, batch: int, state: Any, env_index: np.ndarray | None) -> tuple[Any, np.ndarray]:
        """(state, env_index [B] int64) for ``act``: a caller without acting state gets a fresh one in
        which every row starts an episode."""
        if state is None:
            state, env_index = self.initial_act_state(batch), None
        env_index = np.arange(batch) if env_index is None else np.asarray(env_index, dtype=np.int64)
        if env_index.shape != (batch,):
            raise ValueError(f"env_index must have shape ({batch},), got {env_index.shape}")
        return state, env_index

    def initial_act_state(self, num_envs: int) -> Any:
        """Per-env acting state carried across steps (e.g. a recurrent history); None when stateless."""
        return None

    def reset_act_state(self, state: Any, env_index: int) -> Any:
        """Reset one env's acting state at an episode start."""
        return state

    def save_act_state(self, state: Any) -> dict:
        """The acting ``state`` as a dict of arrays, tensors (on the CPU) and builtins, for a checkpoint
        (``torch.load(weights_only=True)`` reads it back); stateless types save ``{}``. What it leaves out
        must be rebuilt the same by the next :meth:`act` (e.g. caches that the weights' next change voids)."""
        return {}

    def load_act_state(self, saved: dict, num_envs: int, *, device: torch.device | str = "cpu") -> Any:
        """The acting state :meth:`save_act_state` saved, its tensors on ``device`` (the acting model's)."""
        return self.initial_act_state(num_envs)

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

    def eager_loss_inputs(self, model: torch.nn.Module, batch: TrainBatch) -> dict[str, torch.Tensor]:
        """Keyword inputs of :meth:`compute_loss` that a compiled loss computes before its graph, eager, on
        the batch as built (numpy arrays): the part of a loss whose indexing depends on the data, which a
        graph of fixed shapes cannot hold. Their autograd history joins the graph's, so gradients flow
        through them. Without them, ``compute_loss`` computes the same itself. Here: none."""
        return {}

    # ---------------------------------------------------------------- hooks (called for every policy)

    def on_weights_loaded(self, model: torch.nn.Module) -> None:  # noqa: B027 (optional hook)
        """Run in collectors/evaluators after they load a new snapshot (e.g. clear world-model caches)."""

    def on_train_budget_done(  # noqa: B027 (optional hook)
        self, model: torch.nn.Module, target_model: torch.nn.Module
    ) -> None:
        """Run by the driver after each completed train budget (one collect's worth of train steps)."""


def with_model_kind(cfg: ExperimentConfig, spec: EnvSpec) -> ExperimentConfig:
    """``cfg`` with ``model.kind=auto`` resolved (``conv`` for image frames ``[C, H, W]``, ``mlp`` for
    vectors) and ``model.downsample=None`` too (downsampled when the frames are 32 px or more); raises
    :class:`ConfigError` for ``mlp`` on images or ``conv`` on vectors."""
    import dataclasses

    image = len(spec.frame_shape) == 3
    kind = cfg.model.kind
    if kind != "auto" and (kind == "mlp") == image:
        what = f"{'image' if image else 'vector'} observations {spec.frame_shape}"
        want = "conv" if image else "mlp"
        raise ConfigError("model.kind", kind, f"{spec.env_id} has {what}: use model.kind={want} or auto")
    resolved = {}
    if kind == "auto":
        resolved["kind"] = "conv" if image else "mlp"
    if cfg.model.downsample is None:
        resolved["downsample"] = image and min(spec.frame_shape[1:]) >= 32
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **resolved)) if resolved else cfg


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's parameters."""
    return next(model.parameters()).device


# model -> its modules (itself included) where none overrides ``Module.train``, else False
_MODULES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def set_training(model: torch.nn.Module, mode: bool) -> None:
    """``model.train(mode)`` for a model whose module tree does not change after it is built.

    ``Module.train`` sets the flag through ``Module.__setattr__`` on every submodule (about 70 us per switch
    for the CartPole network, two switches per collect step in the sync pipeline, which acts with the
    learner's model: a tenth of a collect step on the host kernel); where no module overrides ``train`` the
    flags are written directly (about 2 us), the module list kept per model. A model with a module that
    overrides ``train`` gets ``model.train(mode)``.
    """
    modules = _MODULES.get(model)
    if modules is None:
        modules = list(model.modules())
        if any(type(m).train is not torch.nn.Module.train for m in modules):
            modules = False
        _MODULES[model] = modules
    if modules is False:
        model.train(mode)
        return
    for m in modules:
        m.__dict__["training"] = mode


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """``model.eval()`` and no autograd inside; the previous train/eval mode restored after.

    The mode is switched only when the model is training (the target model, always in eval, is called
    every step), by :func:`set_training`.
    """
    was_training = model.training
    if was_training:
        set_training(model, False)
    try:
        with torch.no_grad():
            yield
    finally:
        if was_training:
            set_training(model, True)


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
        f"{spec.action_kind} actions{f' ({spec.action_note})' if spec.action_note else ''}{others}",
    )
