"""Environment factory: id validation, construction, cached specs, and the errors they raise.

This module owns turning an ``env.*`` config into a gymnasium env that emits ONE frame per step, and into the
:class:`~muzero_tune.envs.spec.EnvSpec` the model is sized from.

Any registered gymnasium id works, whatever its entry point; ``module:EnvId`` imports ``module`` first (it
registers the id, gymnasium's own syntax). ``env.kwargs`` go to ``gymnasium.make`` and ``env.wrappers``
(import paths, with optional keyword arguments) wrap the env in order. What the agent then sees is decided
from the env's spaces (:mod:`muzero_tune.envs.spaces`): images become uint8 ``[C, S, S]`` frames, every
other supported observation a float32 ``[D]`` vector; ``Box`` actions are taken in [-1, 1], ``MultiDiscrete``
ones as one flat discrete action or by their factors (``env.multi_discrete_actions``).

Atari ``ALE/<Game>-v5`` ids (need ``ale-py``, the ``muzero-tune[atari]`` extra) get MuZero's preprocessing
(:mod:`muzero_tune.envs.atari`). Box2D and MuJoCo ids name their optional extras when missing.

Seeding: ``make_env(..., seed=s)`` wraps the env in :class:`SeedOnFirstReset`, which passes ``seed=s``
to the first ``reset()`` that does not bring its own seed and seeds ``action_space`` with ``s``. Later
resets continue the env's RNG stream (gymnasium's rule), so two envs made with the same seed give the same
observations, rewards and episode boundaries under the same actions, episode after episode.

Action legality: an env that publishes ``info["action_mask"]`` is honoured through
:func:`action_mask_from_info`; otherwise every action is legal at every step.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import yaml
from gymnasium.spaces import Discrete

from muzero_tune.envs import cartpole_novel as _cartpole_novel  # noqa: F401 (registers its env id)
from muzero_tune.envs import stochastic as _stochastic  # noqa: F401 (registers its env id)
from muzero_tune.envs.atari import ATARI_FRAME_SIZES_PX, make_atari_env, sign_reward
from muzero_tune.envs.spaces import (
    MULTI_DISCRETE_FORMS,
    FactoredMultiDiscreteActions,
    SpaceError,
    adapt_spaces,
)
from muzero_tune.envs.spec import EnvSpec
from muzero_tune.errors import UserError

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
    "creators_for",
    "install_creators",
    "parse_wrapper",
    "register_env",
    "registered_id",
    "spec_of",
    "validate_env_id",
]

SUPPORTED_FAMILIES = (
    "any registered gymnasium id (module:EnvId imports the module that registers it), e.g. CartPole-v1, "
    "FrozenLake-v1, LunarLander-v3 (the box2d extra), InvertedPendulum-v5 (the mujoco extra), "
    "MiniGrid-Empty-5x5-v0 (the minigrid extra), MinAtar/Breakout-v1 (the minatar extra), and Atari "
    "ALE/<Game>-v5, e.g. ALE/Pong-v5 (needs ale-py)"
)

_ATARI_ID = re.compile(r"ALE/[A-Za-z0-9]+-v5")
_BOX2D_ENTRY_PREFIX = "gymnasium.envs.box2d."
_MUJOCO_ENTRY_PREFIX = "gymnasium.envs.mujoco."

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


class EnvConfigError(UserError, ValueError):
    """A bad ``env.*`` config value; the message starts with the config key (e.g. ``env.frame_size_px``).
    A user error: the command line prints it as one line."""


class UnknownEnvError(EnvConfigError):
    """``env.env_id`` is not a registered gymnasium id; the message suggests close matches."""


class UnsupportedEnvError(EnvConfigError):
    """``env.env_id``'s env has a space the library cannot take (:mod:`muzero_tune.envs.spaces`), or a
    wrapper in ``env.wrappers`` cannot be loaded."""


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


# Envs whose ids a package registers when imported (or when one of its functions runs): id prefix ->
# (module, registering function or None, the extra that installs it)
_REGISTERING_PACKAGES = {
    "MinAtar/": ("minatar.gym", "register_envs", 'pip install -e ".[minatar]" (or: pip install MinAtar)'),
    "MiniGrid-": ("minigrid", None, 'pip install -e ".[minigrid]" (or: pip install minigrid)'),
    "BabyAI-": ("minigrid", None, 'pip install -e ".[minigrid]" (or: pip install minigrid)'),
}


def _ensure_package_registered(env_id: str) -> None:
    """Import the package that registers ``env_id`` (a known prefix) before the registry is read."""
    for prefix, (module, register, install) in _REGISTERING_PACKAGES.items():
        if not env_id.startswith(prefix) or env_id in gym.registry:
            continue
        try:
            mod = _import_module(module)
        except ImportError as err:
            raise MissingDependencyError(
                f"env.env_id: {env_id!r} needs the optional dependency {module.split('.')[0]}: {install}"
            ) from err
        if register is not None and env_id not in gym.registry:
            getattr(mod, register)()


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


# env ids registered from Python with a creator callable (register_env): shipped to the processes that
# build envs (Ray actors, Tune trials), which register them again there
_CREATORS: dict[str, Callable[..., gym.Env]] = {}


def register_env(env_id: str, creator: Callable[..., gym.Env]) -> None:
    """Register ``creator`` (``creator(**env.kwargs) -> gym.Env``) as the gymnasium id ``env_id``, for the
    sync driver, the async pipeline's actors and Tune's trials alike: they receive it with the run (it is
    pickled with cloudpickle, so a lambda or a closure works). Registering an id again replaces it."""
    if not isinstance(env_id, str) or not env_id or ":" in env_id:
        raise UnknownEnvError(f"env.env_id: register_env needs a plain id such as 'MyEnv-v0', got {env_id!r}")
    if not callable(creator):
        raise UnknownEnvError(f"env.env_id: register_env({env_id!r}, ...): the creator is not callable")
    if env_id in gym.registry:
        del gym.registry[env_id]
    gym.register(env_id, entry_point=creator)
    _CREATORS[env_id] = creator


def creators_for(env_id: str) -> dict[str, Callable[..., gym.Env]]:
    """``{env_id: creator}`` when ``env_id`` was registered by :func:`register_env` here, else ``{}``:
    what a run hands to the processes that build its envs."""
    return {env_id: _CREATORS[env_id]} if env_id in _CREATORS else {}


def install_creators(creators: Mapping[str, Callable[..., gym.Env]] | None) -> None:
    """Register creators received from the process that started the run (those not registered here)."""
    for env_id, creator in (creators or {}).items():
        if _CREATORS.get(env_id) is not creator:
            register_env(env_id, creator)


def registered_id(env_id: str) -> str:
    """The registry id of ``env_id`` (``module:EnvId`` -> ``EnvId``, after importing ``module``, which
    registers it); raises :class:`UnknownEnvError` when the module does not import."""
    if ":" not in env_id:
        return env_id
    module, name = env_id.split(":", 1)
    try:
        _import_with_cwd(module)
    except ImportError as err:
        raise UnknownEnvError(
            f"env.env_id: {env_id!r}: cannot import module {module!r} named before ':' "
            f"({type(err).__name__}: {err}); install its package, or run from the folder that holds it "
            f"(or put that folder on PYTHONPATH) wherever the run and its actors start"
        ) from None
    return name


def _import_with_cwd(module: str) -> Any:
    """Import ``module``; where it is not found, once more with the working folder on ``sys.path`` (a
    console script such as ``muzero-tune`` does not put it there, ``python -m`` and Ray's workers do)."""
    import os
    import sys

    try:
        return _import_module(module)
    except ModuleNotFoundError:
        cwd = os.getcwd()
        if cwd in sys.path:
            raise
        sys.path.append(cwd)
        return _import_module(module)


def env_family(env_id: str) -> str | None:
    """``"atari"`` for ``ALE/<Game>-v5`` ids, ``"gymnasium"`` for any other registered id, ``None`` when
    it is not registered (from the registry alone)."""
    if _ATARI_ID.fullmatch(env_id):
        return "atari" if env_id in gym.registry else None
    return "gymnasium" if registered_id(env_id) in gym.registry else None


def _suggestions(env_id: str) -> list[str]:
    return difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.6)


def _hint(env_id: str) -> str:
    matches = _suggestions(env_id)
    did_you_mean = f" Did you mean {' or '.join(repr(m) for m in matches)}?" if matches else ""
    return f"{did_you_mean} Supported: {SUPPORTED_FAMILIES}."


def validate_env_id(env_id: str) -> None:
    """Check ``env_id`` without building an env.

    Raises:
        MissingDependencyError: an ``ALE/`` id without ale-py, a Box2D id without the ``box2d`` extra, a
            MuJoCo id without the ``mujoco`` extra (one line naming the extra and how to install it).
        UnknownEnvError: not registered in gymnasium, or the module of ``module:EnvId`` does not import
            (message names ``env.env_id``, the value and close matches).
    """
    if not isinstance(env_id, str) or not env_id:
        raise UnknownEnvError(f"env.env_id: expected a non-empty gymnasium id string, got {env_id!r}.")
    if env_id.startswith("ALE/"):
        _ensure_ale_registered()
    name = registered_id(env_id)
    _ensure_package_registered(name)
    if name not in gym.registry:
        # Register the Atari ids (when available) so "Pong-v5" can be matched to "ALE/Pong-v5".
        try:
            _ensure_ale_registered()
        except MissingDependencyError:
            pass
        if name not in gym.registry:
            raise UnknownEnvError(f"env.env_id: unknown environment id {env_id!r}.{_hint(name)}")
    entry_point = gym.registry[name].entry_point
    for prefix, extra, modules, install in _OPTIONAL_EXTRAS:
        if not (isinstance(entry_point, str) and entry_point.startswith(prefix)):
            continue
        missing = _missing_modules(modules)
        if missing:
            raise MissingDependencyError(
                f"env.env_id: {env_id!r} needs the optional {extra} extra (missing: {', '.join(missing)}): "
                f"{install}"
            )


def parse_wrapper(spec: str) -> tuple[Callable[..., gym.Env], dict[str, Any]]:
    """``'module:Name'`` or ``'module:Name {key: value, ...}'`` (keyword arguments as a YAML mapping) ->
    (the imported callable, its keyword arguments); an :class:`UnsupportedEnvError` naming
    ``env.wrappers`` otherwise."""
    path, _, rest = spec.strip().partition(" ")
    module, sep, name = path.partition(":")
    if not sep or not module or not name:
        raise UnsupportedEnvError(f"env.wrappers: {spec!r}: expected 'module:Name' or 'module:Name {{k: v}}'")
    try:
        kwargs = yaml.safe_load(rest) if rest.strip() else {}
    except yaml.YAMLError as err:
        why = " ".join(str(err).split())
        raise UnsupportedEnvError(f"env.wrappers: {spec!r}: keyword arguments are not YAML ({why})") from None
    if not isinstance(kwargs, dict):
        raise UnsupportedEnvError(f"env.wrappers: {spec!r}: keyword arguments must be a mapping {{k: v}}")
    try:
        obj: Any = _import_with_cwd(module)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        why = f"{type(err).__name__}: {err}"
        raise UnsupportedEnvError(f"env.wrappers: {spec!r}: cannot load it ({why})") from None
    if not callable(obj):
        raise UnsupportedEnvError(f"env.wrappers: {spec!r} is not callable")
    return obj, kwargs


def _check_options(
    *,
    frame_size_px: int,
    sticky_action_prob: float,
    noop_max: int,
    max_episode_steps: int | None,
    seed: int | None,
    multi_discrete: str,
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
    if multi_discrete not in MULTI_DISCRETE_FORMS:
        raise EnvConfigError(
            f"env.multi_discrete_actions: must be one of {list(MULTI_DISCRETE_FORMS)}, got {multi_discrete!r}"
        )


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


def _make_gym_env(
    env_id: str,
    *,
    kwargs: Mapping[str, Any],
    wrappers: tuple[str, ...],
    clip_rewards: bool,
    max_episode_steps: int | None,
    frame_size_px: int,
    grayscale: bool,
    multi_discrete: str,
) -> gym.Env:
    # max_episode_steps None keeps the registered TimeLimit (CartPole-v1: 500 steps); a value replaces it
    try:
        env = gym.make(env_id, max_episode_steps=max_episode_steps, **dict(kwargs))
    except TypeError as err:
        raise EnvConfigError(
            f"env.kwargs: {dict(kwargs)!r}: gymnasium.make({env_id!r}) refused them ({err})"
        ) from None
    env = _apply_wrappers(env, wrappers)
    try:
        env = adapt_spaces(
            env, env_id, frame_size_px=frame_size_px, grayscale=grayscale, multi_discrete=multi_discrete
        )
    except SpaceError as err:
        raise UnsupportedEnvError(str(err)) from None
    if clip_rewards:
        env = gym.wrappers.TransformReward(env, sign_reward)
    return env


def _apply_wrappers(env: gym.Env, wrappers: tuple[str, ...]) -> gym.Env:
    for spec in wrappers:
        wrapper, wrapper_kwargs = parse_wrapper(spec)
        try:
            env = wrapper(env, **wrapper_kwargs)
        except Exception as err:
            env.close()
            why = f"{type(err).__name__}: {err}"
            raise UnsupportedEnvError(f"env.wrappers: {spec!r} failed on the env ({why})") from None
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
    kwargs: Mapping[str, Any] | None = None,
    wrappers: tuple[str, ...] = (),
    render_mode: str | None = None,
    multi_discrete_actions: str = "auto",
) -> gym.Env:
    """Build an env emitting ONE frame per step: float32 ``[D]`` (vectors) or uint8 ``[C, S, S]`` (images).

    Continuous-action envs take float32 ``[D]`` actions in [-1, 1]; see :mod:`muzero_tune.envs.spaces`
    for every space.

    Args:
        env_id: any registered gymnasium id, ``module:EnvId``, or ``ALE/<Game>-v5``.
        seed: if given, used by the first ``reset()`` without its own seed, and seeds ``action_space``
            (see :class:`SeedOnFirstReset`); ``None`` leaves seeding to the caller.
        frame_size_px: image frame side S in pixels, one of (64, 96). Validated for every id.
        grayscale: images: 1 luminance channel; ``False`` keeps their colour channels.
        sticky_action_prob: Atari ``repeat_action_probability``; 0.25 is the ALE v5 default.
        noop_max: Atari: up to this many random no-ops at reset (MuZero/DQN use 30); 0 disables.
        clip_rewards: replace rewards by their sign (any env). Off by default.
        episodic_life: Atari: ``terminated`` on life loss, next reset restarts the game. Off by default.
        max_episode_steps: cap in agent steps. ``None``: the registered cap (CartPole-v1: 500), the ALE's
            108,000 frames (27,000 agent steps) for Atari.
        kwargs: keyword arguments for ``gymnasium.make`` (``env.kwargs``).
        wrappers: ``env.wrappers``, applied in order after ``gymnasium.make`` (:func:`parse_wrapper`).
        render_mode: gymnasium's ``render_mode`` (``"rgb_array"`` for videos); ``None``: no rendering.
        multi_discrete_actions: a ``MultiDiscrete`` action space as one flat discrete action (``"flat"``, at
            most :data:`~muzero_tune.envs.spaces.MAX_FLAT_ACTIONS` combinations), by its factors
            (``"factored"``: int64 ``[D]`` actions), or ``"auto"``: flat up to the limit, factored above.

    The Atari-only knobs are ignored for other envs.

    Raises:
        UnknownEnvError, MissingDependencyError: from :func:`validate_env_id`.
        UnsupportedEnvError: a space the library cannot take, or a wrapper that does not load or apply.
        EnvConfigError: a knob out of range or refused ``env.kwargs`` (the message names its ``env.*`` key).
    """
    validate_env_id(env_id)
    _check_options(
        frame_size_px=frame_size_px,
        sticky_action_prob=sticky_action_prob,
        noop_max=noop_max,
        max_episode_steps=max_episode_steps,
        seed=seed,
        multi_discrete=multi_discrete_actions,
    )
    make_kwargs = {**(kwargs or {}), **({"render_mode": render_mode} if render_mode else {})}
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
            make_kwargs=make_kwargs,
        )
        env = _apply_wrappers(env, tuple(wrappers))
    else:
        env = _make_gym_env(
            env_id, kwargs=make_kwargs, wrappers=tuple(wrappers), clip_rewards=bool(clip_rewards),
            max_episode_steps=max_episode_steps, frame_size_px=int(frame_size_px), grayscale=bool(grayscale),
            multi_discrete=multi_discrete_actions,
        )  # fmt: skip
    if seed is not None:
        env = SeedOnFirstReset(env, int(seed))
    return env


def env_spec(
    env_id: str,
    *,
    frame_stack: int = 1,
    frame_size_px: int = 64,
    grayscale: bool = True,
    kwargs: Mapping[str, Any] | None = None,
    wrappers: tuple[str, ...] = (),
    multi_discrete_actions: str = "auto",
) -> EnvSpec:
    """The :class:`EnvSpec` of ``make_env(env_id, frame_size_px=..., grayscale=..., kwargs=...,
    wrappers=..., multi_discrete_actions=...)`` with ``frame_stack``.

    Builds and closes a throwaway env (never reset); cached per arguments because callers ask often.
    """
    if isinstance(frame_stack, bool) or not isinstance(frame_stack, int) or frame_stack < 1:
        raise EnvConfigError(f"env.frame_stack: must be an integer >= 1, got {frame_stack!r}")
    kwargs_json = json.dumps(dict(kwargs or {}), sort_keys=True, default=repr)
    return _cached_spec(
        env_id, frame_stack, int(frame_size_px), bool(grayscale), kwargs_json, tuple(wrappers),
        str(multi_discrete_actions),
    )  # fmt: skip


def spec_of(env_cfg: Any) -> EnvSpec:
    """The :class:`EnvSpec` of an ``env.*`` config section (``EnvConfig``), cached."""
    return env_spec(
        env_cfg.env_id, frame_stack=env_cfg.frame_stack, frame_size_px=env_cfg.frame_size_px,
        grayscale=env_cfg.grayscale, kwargs=env_cfg.kwargs, wrappers=env_cfg.wrappers,
        multi_discrete_actions=env_cfg.multi_discrete_actions,
    )  # fmt: skip


@functools.lru_cache(maxsize=256)
def _cached_spec(
    env_id: str, frame_stack: int, frame_size_px: int, grayscale: bool, kwargs_json: str, wrappers: tuple,
    multi_discrete_actions: str,
) -> EnvSpec:
    env = make_env(env_id, frame_size_px=frame_size_px, grayscale=grayscale, noop_max=0,
                   kwargs=json.loads(kwargs_json), wrappers=wrappers,
                   multi_discrete_actions=multi_discrete_actions)  # fmt: skip
    try:
        obs_space, action_space = env.observation_space, env.action_space
        factored = _factored_wrapper(env)
    finally:
        env.close()
    nvec, note = (), ""
    if isinstance(action_space, Discrete):
        num_actions, action_kind, action_dim = int(action_space.n), "discrete", 0
    elif factored is not None:
        nvec, note = factored.nvec, factored.note
        num_actions, action_kind, action_dim = 0, "factored", len(nvec)
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
        action_nvec=nvec,
        action_note=note,
    )


def _factored_wrapper(env: gym.Env) -> FactoredMultiDiscreteActions | None:
    """The :class:`FactoredMultiDiscreteActions` inside ``env``'s wrappers, or None."""
    while isinstance(env, gym.Wrapper):
        if isinstance(env, FactoredMultiDiscreteActions):
            return env
        env = env.env
    return None


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
