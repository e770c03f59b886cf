"""MuZero with a carried ("context") root latent: the ``muzero_context`` policy type.

What differs from :class:`~muzero_tune.policies.muzero.MuZeroPolicy` is acting only:

* **Acting** -- the root of each search is not always the representation of the current observation.
  Each env carries, in its acting state (:class:`CarriedActState`), the root latent it used at the previous
  step and the action it then took. The next root is that latent rolled forward with the dynamics,
  ``latent_t = g(latent_{t-1}, a_{t-1})``; it is re-encoded from the real observation at the episode start
  and every ``policy.context_length_init`` steps after it (steps 0, L, 2L, ... of the episode). The root's
  value and policy are the prediction of that root latent. The carried latent is the root the search was
  *given*: the search copies it into its own node storage and never writes back, so a searched child
  latent can never replace it (the reference system's search overwrote its stored latent with the last
  simulated leaf).
* **Training** -- MuZero's, unchanged: targets, loss, reanalyze and bootstrap values all start from the
  representation of real observations. The unroll loss already trains ``g^k(represent(o_t))`` (k <= K) to
  predict the targets of step t + k, which is exactly the job of a root carried k steps. So a carried root
  stays inside what the model was trained on as long as ``context_length_init - 1 <= num_unroll_steps``
  (a warning says when it is not); the SSL consistency loss (``learn.ssl_loss_weight``), which pulls
  ``g^k(represent(o_t))`` towards ``represent(o_{t+k})``, is the optional extra that makes carried latents
  closer to re-encoded ones.

The rolled-forward latent is computed at the start of the next step (lazily) with the weights in use at
that step.

The module also holds :class:`CarriedStatePolicy`, the shared acting loop of the policy types that carry
a model state per env across steps (this one and ``muzero_rnn_full_obs``).
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import torch

from muzero_tune.policies.base import SearchRoots
from muzero_tune.policies.muzero import MuZeroPolicy


@dataclasses.dataclass(frozen=True, eq=False)
class CarriedActState:
    """The acting state of all of a caller's envs (N of them); every update returns a new object.

    ``step`` [N] int64: act steps taken since the env's episode start (0 right after a reset).
    ``action`` [N] int64: the action taken at the previous step (-1: none yet).
    ``latent`` [N, *state_shape] or None: the root state the previous step searched from (None before the
    first step). Only the rows of envs that acted are meaningful.
    """

    step: np.ndarray
    action: np.ndarray
    latent: torch.Tensor | None = None

    @staticmethod
    def initial(num_envs: int) -> CarriedActState:
        return CarriedActState(
            step=np.zeros(num_envs, dtype=np.int64), action=np.full(num_envs, -1, dtype=np.int64)
        )

    @property
    def num_envs(self) -> int:
        return int(self.step.shape[0])

    def reset(self, env_index: int) -> CarriedActState:
        step, action = self.step.copy(), self.action.copy()
        step[env_index], action[env_index] = 0, -1
        return dataclasses.replace(self, step=step, action=action)

    def advanced(self, env_index: np.ndarray, root: torch.Tensor, actions: np.ndarray) -> CarriedActState:
        """The state after envs ``env_index`` [B] searched from ``root`` [B, ...] and took ``actions`` [B]."""
        step, action = self.step.copy(), self.action.copy()
        step[env_index] += 1
        action[env_index] = actions
        if self.latent is None or self.latent.shape[1:] != root.shape[1:]:
            latent = torch.zeros((self.num_envs, *root.shape[1:]), dtype=root.dtype, device=root.device)
        else:
            latent = self.latent.clone()
        latent[torch.as_tensor(env_index, device=latent.device)] = root
        return CarriedActState(step=step, action=action, latent=latent)


class CarriedStatePolicy(MuZeroPolicy):
    """MuZero whose search root is built from a per-env state carried across steps.

    Subclasses implement :meth:`carried_root` (the root state of each row from its observation and the
    carried state); MuZero's search runs from it unchanged, and the acting state advances to the root each
    env searched from and the action it took (:class:`CarriedActState`).
    """

    @property
    def context_length(self) -> int:
        return self.cfg.policy.context_length_init

    def initial_act_state(self, num_envs: int) -> CarriedActState:
        return CarriedActState.initial(num_envs)

    def reset_act_state(self, state: CarriedActState, env_index: int) -> CarriedActState:
        return state.reset(env_index)

    def save_act_state(self, state: CarriedActState) -> dict:
        saved = {"step": state.step.copy(), "action": state.action.copy()}
        if state.latent is not None:
            saved["latent"] = state.latent.detach().to("cpu", copy=True)
        return saved

    def load_act_state(self, saved: dict, num_envs: int, *, device="cpu") -> CarriedActState:
        latent = saved.get("latent")
        return CarriedActState(
            step=np.asarray(saved["step"], dtype=np.int64).copy(),
            action=np.asarray(saved["action"], dtype=np.int64).copy(),
            latent=None if latent is None else torch.as_tensor(latent).to(device),
        )

    def carried_root(
        self, model: torch.nn.Module, obs: torch.Tensor, state: CarriedActState, env_index: np.ndarray
    ) -> tuple[torch.Tensor, dict[str, np.ndarray]]:
        """Root states [B, *state_shape] of the rows ``env_index`` [B] at ``obs`` [B, *obs_shape] from the
        carried ``state``, and extra per-step stats [B, ...] (under eval mode, no grad)."""
        raise NotImplementedError

    def root_inference(self, model, obs, state, env_index) -> SearchRoots:
        """The carried root states (:meth:`carried_root`) and their prediction."""
        root, extra = self.carried_root(model, obs, state, env_index)
        value_logits, policy_logits = model.predict(root)
        return SearchRoots(root, policy_logits, value_logits, step_stats=extra)

    def advance_act_state(self, state, env_index, obs, actions, roots) -> CarriedActState:
        return state.advanced(env_index, roots.latent, actions)


def _rows(mask: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(np.flatnonzero(mask), device=device)


class MuZeroContextPolicy(CarriedStatePolicy):
    """MuZero acting from a dynamics-carried root latent (module docstring)."""

    name = "muzero_context"

    def __init__(self, cfg, spec):
        super().__init__(cfg, spec)
        if cfg.policy.context_length_init - 1 > cfg.replay.num_unroll_steps:
            warnings.warn(
                f"policy.context_length_init={cfg.policy.context_length_init}: roots are carried up to "
                f"{cfg.policy.context_length_init - 1} dynamics steps, more than the "
                f"replay.num_unroll_steps={cfg.replay.num_unroll_steps} the model is trained to unroll",
                stacklevel=2,
            )

    def carried_root(self, model, obs, state, env_index):
        encode = state.step[env_index] % self.context_length == 0  # [B]: episode start or context boundary
        if state.latent is None or encode.all():
            return model.represent(obs), {}
        dev = obs.device
        enc, roll = _rows(encode, dev), _rows(~encode, dev)
        src = env_index[~encode]  # the carrying envs' rows in the state
        rolled, _ = model.dynamics(
            state.latent[torch.as_tensor(src, device=dev)], torch.as_tensor(state.action[src], device=dev)
        )
        root = torch.empty((len(obs), *rolled.shape[1:]), dtype=rolled.dtype, device=dev)
        root[roll] = rolled
        if len(enc):
            root[enc] = model.represent(obs[enc])
        return root, {}
