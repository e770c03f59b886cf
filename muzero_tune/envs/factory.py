"""Environment factory: id validation, construction, cached specs, and the errors they raise.

This module owns turning an ``env.*`` config (an id plus a few keyword knobs) into a gymnasium env that
emits ONE frame per step, and into the :class:`~muzero_tune.envs.spec.EnvSpec` the model is sized from.

Supported families:

* vector envs: gymnasium classic control (``CartPole-v1``, ``Acrobot-v1``, ``MountainCar-v0``,
  ``Pendulum-v1``, ``MountainCarContinuous-v0``), Box2D vector envs (``LunarLander-v3``,
  ``LunarLanderContinuous-v3``, ...; the optional ``box2d`` extra: Box2D + pygame) and MuJoCo envs
  (``InvertedPendulum-v5``, ...; the optional ``mujoco`` extra: mujoco + imageio). Frames are float32 ``[D]``.
* Atari ``ALE/<Game>-v5`` (need ``ale-py``, the ``muzero-tune[atari]`` extra). Frames are uint8
  ``[1, H, W]`` (grayscale) or ``[3, H, W]`` (RGB); see :mod:`muzero_tune.envs.atari`.

Seeding: ``make_env(..., seed=s)`` wraps the env in :class:`SeedOnFirstReset`, which passes ``seed=s``
to the first ``reset()`` that does not bring its own seed and seeds ``action_space`` with ``s``. Later
resets continue the env's RNG stream (gymnasium's rule), so two envs made with the same seed give the same
observations, rewards and episode boundaries under the same actions, episode after episode.

Continuous actions: every env with a ``Box`` action space is wrapped in
:class:`~muzero_tune.envs.actions.UnitBoxActions`, so it takes float32 ``[D]`` actions in [-1, 1] (the
library's convention) and maps them affinely to its own bounds; unbounded action spaces are refused.

Action legality: every supported env has all actions legal at every step, so the collector uses an
all-ones mask; an env that publishes ``info["action_mask"]`` is honoured through
:func:`action_mask_from_info`.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import re
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box, Discrete

from muzero_tune.envs import cartpole_novel as _cartpole_novel  # noqa: F401 (registers its env id)
from muzero_tune.envs import stochastic as _stochastic  # noqa: F401 (registers its env id)
from muzero_tune.envs.actions import UnitBoxActions
from muzero_tune.envs.atari import ATARI_FRAME_SIZES_PX, make_atari_env, sign_reward
from muzero_tune.envs.spec import EnvSpec

__all__ = [
    "SUPPORTED_FAMILIES",
    "EnvConfigError",
    "MissingDependencyError",
    "SeedOnFirstReset",
    "UnknownEnvError",
    "UnsupportedEnvError",
    "action_mask_from_info",
    "env_family",
    "env_spec",
    "make_env",
    "validate_env_id",
]

SUPPORTED_FAMILIES = (
    "classic control (CartPole-v1, Acrobot-v1, MountainCar-v0, Pendulum-v1, MountainCarContinuous-v0); "
    "Box2D vector envs (LunarLander-v3, LunarLanderContinuous-v3; the box2d extra); "
    "MuJoCo envs (InvertedPendulum-v5, ...; the mujoco extra); "
    "Atari ALE/<Game>-v5, e.g. ALE/Pong-v5 (needs ale-py)"
)

_ATARI_ID = re.compile(r"ALE/[A-Za-z0-9]+-v5")
_VECTOR_ENTRY_PREFIXES = (
    "gymnasium.envs.classic_control.",
    "gymnasium.envs.box2d.",
    "gymnasium.envs.mujoco.",
    "muzero_tune.envs.cartpole_novel:",
    "muzero_tune.envs.stochastic:",
)
_BOX2D_ENTRY_PREFIX = "gymnasium.envs.box2d."
_MUJOCO_ENTRY_PREFIX = "gymnasium.envs.mujoco."
# CarRacing lives in box2d but emits 96x96 RGB images without the Atari preprocessing path.
_IMAGE_ENTRY_POINTS = ("gymnasium.envs.box2d.car_racing:CarRacing",)

_ATARI_INSTALL_HINT = 'pip install "muzero-tune[atari]" (or: pip install ale-py)'
# Optional extras per entry-point prefix: (extra name, modules it must provide, the install line).
# gymnasium's box2d package imports pygame (CarRacing) even for LunarLander; its MujocoEnv imports imageio.
_OPTIONAL_EXTRAS = (
    (
        _BOX2D_ENTRY_PREFIX,
        "box2d",
        ("Box2D", "pygame"),
        'pip install -e ".[box2d]" (or: pip install "muzero-tune[box2d]" / "gymnasium[box2d]")',
    ),
    (
        _MUJOCO_ENTRY_PREFIX,
        "mujoco",
        ("mujoco", "imageio"),
        'pip install -e ".[mujoco]" (or: pip install "muzero-tune[mujoco]" / mujoco imageio)',
    ),
)

# Indirections so tests can simulate a missing optional dependency without uninstalling it.
_import_module = importlib.import_module


class EnvConfigError(ValueError):
    """A bad ``env.*`` config value; the message starts with the config key (e.g. ``env.frame_size_px``)."""


class UnknownEnvError(EnvConfigError):
    """``env.env_id`` is not a registered gymnasium id; the message suggests close matches."""


class UnsupportedEnvError(EnvConfigError):
    """``env.env_id`` is registered but not in a supported family (e.g. ``Pong-v4``, ``FrozenLake-v1``)."""


class MissingDependencyError(ImportError):
    """An optional dependency needed by ``env.env_id`` is not installed; the message says what to install."""


def _ensure_ale_registered() -> None:
    """Import ``ale_py`` (which registers the ``ALE/`` ids) or raise :class:`MissingDependencyError`."""
    try:
        ale_py = _import_module("ale_py")
    except ImportError as err:
        raise MissingDependencyError(
            f"env.env_id: Atari ids need the optional dependency ale-py: {_ATARI_INSTALL_HINT}"
        ) from err
    gym.register_envs(ale_py)


def _missing_modules(modules: tuple[str, ...]) -> list[str]:
    """The modules that do not import (an import, not a path lookup: a broken or stubbed-out install counts
    as missing). Imports are cached, so this costs once per process."""
    missing = []
    for name in modules:
        try:
            _import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def env_family(env_id: str) -> str | None:
    """``"atari"``, ``"vector"`` or ``None`` (unsupported / unregistered), from the registry alone."""
    if _ATARI_ID.fullmatch(env_id):
        return "atari" if env_id in gym.registry else None
    registered = gym.registry.get(env_id)
    if registered is None or not isinstance(registered.entry_point, str):
        return None
    entry_point = registered.entry_point
    if entry_point.startswith(_VECTOR_ENTRY_PREFIXES) and entry_point not in _IMAGE_ENTRY_POINTS:
        return "vector"
    return None


def _suggestions(env_id: str, *, supported_only: bool) -> list[str]:
    """Close supported ids first (better advice), then, unless ``supported_only``, any registered id."""
    supported = [name for name in gym.registry if name != env_id and env_family(name) is not None]
    matches = difflib.get_close_matches(env_id, supported, n=3, cutoff=0.6)
    if matches or supported_only:
        return matches
    return difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.6)


def _hint(env_id: str, *, supported_only: bool = False) -> str:
    matches = _suggestions(env_id, supported_only=supported_only)
    did_you_mean = f" Did you mean {' or '.join(repr(m) for m in matches)}?" if matches else ""
    return f"{did_you_mean} Supported families: {SUPPORTED_FAMILIES}."


def validate_env_id(env_id: str) -> None:
    """Check ``env_id`` without building an env.

    Raises:
        MissingDependencyError: an ``ALE/`` id without ale-py, a Box2D id without the ``box2d`` extra, a
            MuJoCo id without the ``mujoco`` extra (one line naming the extra and how to install it).
        UnknownEnvError: not registered in gymnasium (message names ``env.env_id``, the value, close matches
            and the supported families).
        UnsupportedEnvError: registered but outside the supported families.
    """
    if not isinstance(env_id, str) or not env_id:
        raise UnknownEnvError(f"env.env_id: expected a non-empty gymnasium id string, got {env_id!r}.")
    if env_id.startswith("ALE/"):
        _ensure_ale_registered()
    if env_id not in gym.registry:
        # Register the Atari ids (when available) so "Pong-v5" can be matched to "ALE/Pong-v5".
        try:
            _ensure_ale_registered()
        except MissingDependencyError:
            pass
        if env_id not in gym.registry:
            raise UnknownEnvError(f"env.env_id: unknown environment id {env_id!r}.{_hint(env_id)}")
    family = env_family(env_id)
    if family is None:
        raise UnsupportedEnvError(
            f"env.env_id: {env_id!r} is registered but not supported.{_hint(env_id, supported_only=True)}"
        )
    entry_point = gym.registry[env_id].entry_point
    for prefix, extra, modules, install in _OPTIONAL_EXTRAS:
        if not (isinstance(entry_point, str) and entry_point.startswith(prefix)):
            continue
        missing = _missing_modules(modules)
        if missing:
            raise MissingDependencyError(
                f"env.env_id: {env_id!r} needs the optional {extra} extra (missing: {', '.join(missing)}): "
                f"{install}"
            )


def _check_options(
    *,
    frame_size_px: int,
    sticky_action_prob: float,
    noop_max: int,
    max_episode_steps: int | None,
    seed: int | None,
) -> None:
    def is_int(value: Any) -> bool:
        return isinstance(value, int | np.integer) and not isinstance(value, bool)

    if not is_int(frame_size_px) or int(frame_size_px) not in ATARI_FRAME_SIZES_PX:
        raise EnvConfigError(
            f"env.frame_size_px: must be one of {ATARI_FRAME_SIZES_PX}, got {frame_size_px!r}"
        )
    if not 0.0 <= float(sticky_action_prob) <= 1.0:
        raise EnvConfigError(f"env.sticky_action_prob: must be in [0, 1], got {sticky_action_prob!r}")
    if not is_int(noop_max) or noop_max < 0:
        raise EnvConfigError(f"env.noop_max: must be an integer >= 0, got {noop_max!r}")
    if max_episode_steps is not None and (not is_int(max_episode_steps) or max_episode_steps < 1):
        raise EnvConfigError(
            f"env.max_episode_steps: must be None or an integer >= 1, got {max_episode_steps!r}"
        )
    if seed is not None and (not is_int(seed) or seed < 0):
        raise EnvConfigError(f"env.seed: must be None or an integer >= 0, got {seed!r}")


class SeedOnFirstReset(gym.Wrapper):
    """Applies a stored seed to the first ``reset()`` that has none, and seeds ``action_space`` once.

    Later resets pass their own ``seed`` through (``None`` continues the RNG stream), so a run is
    reproducible from the construction seed alone.
    """

    def __init__(self, env: gym.Env, seed: int) -> None:
        super().__init__(env)
        self._pending_seed: int | None = int(seed)
        self.action_space.seed(int(seed))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        if seed is None:
            seed = self._pending_seed
        # An explicit seed on the first reset wins; either way the stored seed is used at most once.
        self._pending_seed = None
        return self.env.reset(seed=seed, options=options)


class _Float32Frames(gym.ObservationWrapper):
    """Casts vector observations to float32 ``[D]`` (the frame dtype replay and the models expect)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        self.observation_space = Box(
            low=space.low.astype(np.float32), high=space.high.astype(np.float32), dtype=np.float32
        )

    def observation(self, observation: Any) -> np.ndarray:
        return np.asarray(observation, dtype=np.float32)


def _make_vector_env(env_id: str, *, clip_rewards: bool, max_episode_steps: int | None) -> gym.Env:
    # None keeps the registered TimeLimit (e.g. 500 steps for CartPole-v1); a value replaces it.
    env = gym.make(env_id, max_episode_steps=max_episode_steps)
    space = env.observation_space
    if not isinstance(space, Box) or len(space.shape) != 1:
        env.close()
        raise UnsupportedEnvError(f"env.env_id: {env_id!r} does not emit a vector observation ({space}).")
    action_space = env.action_space
    if not (
        isinstance(action_space, Discrete) or (isinstance(action_space, Box) and len(action_space.shape) == 1)
    ):
        env.close()
        raise UnsupportedEnvError(f"env.env_id: {env_id!r} has an unsupported action space ({action_space}).")
    if space.dtype != np.float32:
        env = _Float32Frames(env)
    if isinstance(action_space, Box):
        if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
            env.close()
            raise UnsupportedEnvError(
                f"env.env_id: {env_id!r} has unbounded continuous actions ({action_space}); "
                "only finite Box bounds can be mapped from the library's [-1, 1]"
            )
        env = UnitBoxActions(env)
    if clip_rewards:
        env = gym.wrappers.TransformReward(env, sign_reward)
    return env


def make_env(
    env_id: str,
    *,
    seed: int | None = None,
    frame_size_px: int = 64,
    grayscale: bool = True,
    sticky_action_prob: float = 0.25,
    noop_max: int = 30,
    clip_rewards: bool = False,
    episodic_life: bool = False,
    max_episode_steps: int | None = None,
) -> gym.Env:
    """Build an env emitting ONE frame per step: float32 ``[D]`` (vector) or uint8 ``[C, H, W]`` (Atari).

    Continuous-action envs take float32 ``[D]`` actions in [-1, 1] (:class:`UnitBoxActions`).

    Args:
        env_id: a supported gymnasium id (see :data:`SUPPORTED_FAMILIES`).
        seed: if given, used by the first ``reset()`` without its own seed, and seeds ``action_space``
            (see :class:`SeedOnFirstReset`); ``None`` leaves seeding to the caller.
        frame_size_px: Atari frame side in pixels, one of (64, 96). Validated for every id.
        grayscale: Atari: 1 luminance channel; ``False`` keeps RGB (3 channels).
        sticky_action_prob: Atari ``repeat_action_probability``; 0.25 is the ALE v5 default.
        noop_max: Atari: up to this many random no-ops at reset (MuZero/DQN use 30); 0 disables.
        clip_rewards: replace rewards by their sign (any family). Off by default.
        episodic_life: Atari: ``terminated`` on life loss, next reset restarts the game. Off by default.
        max_episode_steps: cap in agent steps. ``None``: the registered cap for vector envs (CartPole-v1:
            500), the ALE's 108,000 frames (27,000 agent steps) for Atari.

    The Atari-only knobs are ignored for vector envs.

    Raises:
        UnknownEnvError, UnsupportedEnvError, MissingDependencyError: from :func:`validate_env_id`.
        EnvConfigError: a knob out of range (the message names its ``env.*`` key).
    """
    validate_env_id(env_id)
    _check_options(
        frame_size_px=frame_size_px,
        sticky_action_prob=sticky_action_prob,
        noop_max=noop_max,
        max_episode_steps=max_episode_steps,
        seed=seed,
    )
    if env_family(env_id) == "atari":
        env = make_atari_env(
            env_id,
            frame_size_px=int(frame_size_px),
            grayscale=bool(grayscale),
            sticky_action_prob=float(sticky_action_prob),
            noop_max=int(noop_max),
            clip_rewards=bool(clip_rewards),
            episodic_life=bool(episodic_life),
            max_episode_steps=max_episode_steps,
        )
    else:
        env = _make_vector_env(env_id, clip_rewards=bool(clip_rewards), max_episode_steps=max_episode_steps)
    if seed is not None:
        env = SeedOnFirstReset(env, int(seed))
    return env


@functools.lru_cache(maxsize=256)
def env_spec(
    env_id: str, *, frame_stack: int = 1, frame_size_px: int = 64, grayscale: bool = True
) -> EnvSpec:
    """The :class:`EnvSpec` of ``make_env(env_id, frame_size_px=..., grayscale=...)`` with ``frame_stack``.

    Builds and closes a throwaway env (never reset); cached per arguments because callers ask often.
    ``frame_size_px`` and ``grayscale`` only matter for Atari ids.
    """
    if isinstance(frame_stack, bool) or not isinstance(frame_stack, int) or frame_stack < 1:
        raise EnvConfigError(f"env.frame_stack: must be an integer >= 1, got {frame_stack!r}")
    env = make_env(env_id, frame_size_px=frame_size_px, grayscale=grayscale, noop_max=0)
    try:
        obs_space, action_space = env.observation_space, env.action_space
    finally:
        env.close()
    if isinstance(action_space, Discrete):
        num_actions, action_kind, action_dim = int(action_space.n), "discrete", 0
    else:
        num_actions, action_kind, action_dim = 0, "continuous", int(action_space.shape[0])
    return EnvSpec(
        env_id=env_id,
        frame_shape=tuple(int(d) for d in obs_space.shape),
        frame_dtype=np.dtype(obs_space.dtype).name,
        frame_stack=frame_stack,
        num_actions=num_actions,
        action_kind=action_kind,
        action_dim=action_dim,
    )


def action_mask_from_info(info: Mapping[str, Any] | None, num_actions: int) -> np.ndarray:
    """Legal-action mask ``[num_actions]`` bool: ``info["action_mask"]`` if published, else all True.

    Raises:
        ValueError: the published mask has the wrong size or allows no action (search would have no child).
    """
    if not info or info.get("action_mask") is None:
        return np.ones(num_actions, dtype=bool)
    mask = np.array(info["action_mask"], dtype=bool).reshape(-1)  # a copy: the env may reuse its buffer
    if mask.shape != (num_actions,):
        raise ValueError(f"info['action_mask'] has {mask.size} entries, expected {num_actions}")
    if not mask.any():
        raise ValueError("info['action_mask'] allows no action")
    return mask
