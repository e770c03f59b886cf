"""Environments: one-frame-per-step gymnasium envs, their shape contract, and frame stacking.

* :mod:`.spec` — :class:`EnvSpec` and :func:`stack_frames` (what the model sees).
* :mod:`.factory` — :func:`validate_env_id`, :func:`make_env`, :func:`env_spec`, errors.
* :mod:`.spaces` — any gymnasium space in the library's forms (image frames, flat vectors, flat or factored
  actions).
* :mod:`.actions` — :class:`UnitBoxActions`: the library's [-1, 1] continuous actions <-> env bounds.
* :mod:`.atari` — ``ALE/<Game>-v5`` preprocessing (imports nothing from ale-py itself).
"""

from muzero_tune.envs.actions import UnitBoxActions, bounds_to_unit, unit_to_bounds
from muzero_tune.envs.atari import ATARI_FRAME_SIZES_PX, AtariFramePreprocessing, area_resize
from muzero_tune.envs.factory import (
    SUPPORTED_FAMILIES,
    EnvConfigError,
    MissingDependencyError,
    SeedOnFirstReset,
    UnknownEnvError,
    UnsupportedEnvError,
    action_mask_from_info,
    env_family,
    env_spec,
    make_env,
    register_env,
    spec_of,
    validate_env_id,
)
from muzero_tune.envs.spec import EnvSpec, stack_frames

__all__ = [
    "ATARI_FRAME_SIZES_PX",
    "SUPPORTED_FAMILIES",
    "AtariFramePreprocessing",
    "EnvConfigError",
    "EnvSpec",
    "MissingDependencyError",
    "SeedOnFirstReset",
    "UnitBoxActions",
    "UnknownEnvError",
    "UnsupportedEnvError",
    "action_mask_from_info",
    "area_resize",
    "bounds_to_unit",
    "env_family",
    "env_spec",
    "make_env",
    "register_env",
    "spec_of",
    "stack_frames",
    "unit_to_bounds",
    "validate_env_id",
]
