"""What the agent sees of any gymnasium env: its observation and action spaces in the library's forms.

What this module owns
    Deciding, from an env's spaces alone (never from its name), how its observations become the library's
    single frames and how the library's actions reach it:

    * observations: a picture (a ``Box`` ``[H, W]`` or ``[H, W, C]`` with C <= 4 and H, W >= 32, uint8 or
      float) becomes a uint8 ``[C, S, S]`` frame, S = ``env.frame_size_px`` (area-averaged down, repeated
      up; optionally grayscale), as Atari screens do (:class:`ImageFrames`); any other ``[H, W, C]`` ``Box``
      is a grid of C channels (MinAtar's binary planes, MiniGrid's symbolic cells) and becomes a uint8
      ``[C, H, W]`` frame at its own resolution, values scaled to 0..255 (:class:`GridFrames`); every other
      supported space -- ``Box`` of any other shape, ``Discrete`` (one-hot), ``MultiBinary``,
      ``MultiDiscrete`` (one-hot per factor) and ``Dict`` / ``Tuple`` of these -- becomes a flat float32
      ``[D]`` vector (:class:`FlatVectorFrames`, gymnasium's ``flatten`` rule: ``Dict`` entries in key
      order); a ``Dict`` / ``Tuple`` with one image among its entries becomes that image's uint8 frame with
      the other entries' D values as D constant planes after its channels (:class:`ImageWithPlanesFrames`);
    * actions: ``Discrete`` (offset by its ``start``), ``Box`` with finite bounds (``[-1, 1]`` mapped to
      them, :class:`~muzero_tune.envs.actions.UnitBoxActions`), ``MultiDiscrete`` either as one flat discrete
      action over its factors' product, up to :data:`MAX_FLAT_ACTIONS` (:class:`FlatMultiDiscreteActions`),
      or by its factors, one index per factor (:class:`FactoredMultiDiscreteActions`, for the policy types
      that act over factors): ``env.multi_discrete_actions`` chooses, and ``auto`` (the default) takes the
      flat action up to the limit and the factors above it (:func:`multi_discrete_form`);
    * anything else (``Text``, ``Graph``, ``Sequence``, unbounded ``Box`` actions, two images in one ``Dict``)
      is refused with one line naming the space and what is supported, before any work starts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from muzero_tune.envs.actions import UnitBoxActions
from muzero_tune.envs.atari import area_resize

__all__ = [
    "MAX_FLAT_ACTIONS",
    "MULTI_DISCRETE_FORMS",
    "FactoredMultiDiscreteActions",
    "FlatMultiDiscreteActions",
    "FlatVectorFrames",
    "GridFrames",
    "ImageFrames",
    "ImageWithPlanesFrames",
    "MAX_PLANES",
    "OffsetDiscreteActions",
    "SpaceError",
    "adapt_spaces",
    "is_grid_space",
    "is_image_space",
    "is_picture_space",
    "multi_discrete_form",
]

MAX_FLAT_ACTIONS = 4096  # the largest MultiDiscrete product taken as one flat discrete action
MULTI_DISCRETE_FORMS = ("auto", "flat", "factored")  # env.multi_discrete_actions
MAX_PLANES = 64  # the most values beside an image in a Dict / Tuple observation (one constant plane each)
_FLAT_LEAVES = (spaces.Box, spaces.Discrete, spaces.MultiBinary, spaces.MultiDiscrete)
_OBSERVATIONS = (
    "Box (vectors of any shape, pictures [H, W] / [H, W, C<=4], grids [H, W, C]), Discrete, MultiBinary, "
    "MultiDiscrete, and Dict / Tuple of these with at most one image, at their top level"
)
_ACTIONS = (
    "Discrete, Box with finite bounds, MultiDiscrete (one flat action up to {n} combinations, any size by "
    "its factors)"
)


class SpaceError(ValueError):
    """An env space the library cannot take; the message names the space and what is supported."""


PICTURE_MIN_PX = 32  # a Box image this large on both sides (C <= 4) is a picture: resized, maybe grayscale


def is_picture_space(space: gym.Space) -> bool:
    """A ``Box`` picture: ``[H, W]`` or ``[H, W, C]`` with C <= 4 and H, W >= 32."""
    if not isinstance(space, spaces.Box):
        return False
    shape = space.shape
    if len(shape) == 2:
        return min(shape) >= PICTURE_MIN_PX
    return len(shape) == 3 and shape[2] <= 4 and min(shape[:2]) >= PICTURE_MIN_PX


def is_grid_space(space: gym.Space) -> bool:
    """A ``Box`` ``[H, W, C]`` that is not a picture: C channels over a small grid."""
    return isinstance(space, spaces.Box) and len(space.shape) == 3 and not is_picture_space(space)


def is_image_space(space: gym.Space) -> bool:
    """A picture or a grid: what the conv network takes."""
    return is_picture_space(space) or is_grid_space(space)


def _check_flat(space: gym.Space, env_id: str, where: str = "observation space") -> None:
    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        for sub in space.spaces.values() if isinstance(space, spaces.Dict) else space.spaces:
            if is_image_space(sub):
                raise SpaceError(
                    f"env.env_id: {env_id!r} has a second or nested image in its {where} ({sub} in "
                    f"{space}); keep one with a wrapper (env.wrappers). Supported: {_OBSERVATIONS}"
                )
            _check_flat(sub, env_id, where)
        return
    if not isinstance(space, _FLAT_LEAVES):
        raise SpaceError(
            f"env.env_id: {env_id!r} has an unsupported {where} {space}. Supported: {_OBSERVATIONS}"
        )


def _value_range(space: spaces.Box) -> tuple[float, float]:
    """(low, span) of a Box's values, from its bounds; (0, 1) where they are unbounded or empty."""
    low, high = float(np.min(space.low)), float(np.max(space.high))
    return (low, high - low) if np.isfinite(low + high) and high > low else (0.0, 1.0)


class FlatVectorFrames(gym.ObservationWrapper):
    """Any flattenable observation space -> float32 ``[D]`` (gymnasium's ``spaces.flatten``)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._source = env.observation_space
        flat = spaces.flatten_space(self._source)
        self.observation_space = spaces.Box(
            low=flat.low.astype(np.float32), high=flat.high.astype(np.float32), dtype=np.float32
        )

    def observation(self, observation: Any) -> np.ndarray:
        return np.asarray(spaces.flatten(self._source, observation), dtype=np.float32)


class _PictureFrame:
    """An image ``[H, W]`` / ``[H, W, C]`` -> uint8 ``[C', S, S]`` (C' = 1 when ``grayscale``, else C).

    Float images are scaled from the space's bounds to 0..255 (or taken as 0..1 where unbounded); each side is
    area-averaged down to S, or repeated up to a multiple of S then averaged, so any size reaches S."""

    def __init__(self, space: spaces.Box, *, size_px: int, grayscale: bool) -> None:
        self.size_px, self.grayscale = int(size_px), bool(grayscale)
        channels = 1 if len(space.shape) == 2 else space.shape[2]
        self._to_gray = grayscale and channels in (3, 4)
        out_channels = 1 if self._to_gray else channels
        self._uint8 = space.dtype == np.uint8
        self._lo, self._span = _value_range(space)
        self.space = spaces.Box(0, 255, shape=(out_channels, self.size_px, self.size_px), dtype=np.uint8)

    def __call__(self, observation: Any) -> np.ndarray:
        img = np.asarray(observation)
        if not self._uint8:
            img = np.clip((img.astype(np.float32) - self._lo) / self._span * 255.0, 0.0, 255.0)
        img = img[..., None] if img.ndim == 2 else img
        if self._to_gray:  # ITU-R 601 luma, as the ALE's grayscale screen
            img = img[..., :3].astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
            img = img[..., None]
        chw = np.moveaxis(np.rint(img).astype(np.uint8) if img.dtype != np.uint8 else img, -1, 0)
        return _resize(chw, self.size_px)


class _GridFrame:
    """A grid ``[H, W, C]`` -> uint8 ``[C, H, W]`` at its own resolution: booleans as 0 / 255, other values
    scaled from the space's bounds to 0..255 (uint8 bounded 0..255 kept as they are; a grid whose declared
    bounds overstate its values takes :class:`~muzero_tune.envs.wrappers.ObservationBounds`)."""

    def __init__(self, space: spaces.Box) -> None:
        h, w, c = space.shape
        self._lo, self._span = _value_range(space)
        full_uint8 = space.dtype == np.uint8 and (self._lo, self._span) == (0.0, 255.0)
        self._kind = "bool" if space.dtype == np.bool_ else "uint8" if full_uint8 else "scaled"
        self.space = spaces.Box(0, 255, shape=(c, h, w), dtype=np.uint8)

    def __call__(self, observation: Any) -> np.ndarray:
        grid = np.asarray(observation)
        if self._kind == "bool":
            grid = grid.astype(np.uint8) * 255
        elif self._kind == "scaled":
            grid = np.rint(np.clip((grid.astype(np.float32) - self._lo) / self._span, 0.0, 1.0) * 255.0)
            grid = grid.astype(np.uint8)
        return np.ascontiguousarray(np.moveaxis(grid, -1, 0))


def _image_frame(space: spaces.Box, *, size_px: int, grayscale: bool) -> _PictureFrame | _GridFrame:
    if is_picture_space(space):
        return _PictureFrame(space, size_px=size_px, grayscale=grayscale)
    return _GridFrame(space)


class ImageFrames(gym.ObservationWrapper):
    """A picture observation -> uint8 ``[C', S, S]`` (:class:`_PictureFrame`)."""

    def __init__(self, env: gym.Env, *, size_px: int, grayscale: bool) -> None:
        super().__init__(env)
        self._frame = _PictureFrame(env.observation_space, size_px=size_px, grayscale=grayscale)
        self.size_px, self.grayscale = self._frame.size_px, self._frame.grayscale
        self.observation_space = self._frame.space

    def observation(self, observation: Any) -> np.ndarray:
        return self._frame(observation)


class GridFrames(gym.ObservationWrapper):
    """A grid observation -> uint8 ``[C, H, W]`` at its own resolution (:class:`_GridFrame`)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._frame = _GridFrame(env.observation_space)
        self.observation_space = self._frame.space

    def observation(self, observation: Any) -> np.ndarray:
        return self._frame(observation)


class ImageWithPlanesFrames(gym.ObservationWrapper):
    """A ``Dict`` / ``Tuple`` holding one image (picture or grid) and other flattenable entries -> uint8
    ``[C + D, H, W]``: the image's frame (C channels, :class:`ImageFrames` / :class:`GridFrames`' rule), then
    the D values of the other entries, flattened in order, each as one constant plane (AlphaZero's way of
    giving a conv network scalars). A value is scaled from its bounds to 0..255; an unbounded one is squashed
    by x / (1 + |x|) first. At most :data:`MAX_PLANES` values."""

    def __init__(self, env: gym.Env, image_key: Any, *, size_px: int, grayscale: bool) -> None:
        super().__init__(env)
        source = env.observation_space
        self._image_key = image_key
        self._frame = _image_frame(source.spaces[image_key], size_px=size_px, grayscale=grayscale)
        rest = _without(source, image_key)
        self._rest = rest
        flat = spaces.flatten_space(rest)
        low, high = flat.low.astype(np.float64), flat.high.astype(np.float64)
        self._squash = ~(np.isfinite(low) & np.isfinite(high))
        low, high = np.where(self._squash, -1.0, low), np.where(self._squash, 1.0, high)
        self._lo, self._span = low, np.where(high > low, high - low, 1.0)
        c, h, w = self._frame.space.shape
        self.observation_space = spaces.Box(0, 255, shape=(c + flat.shape[0], h, w), dtype=np.uint8)

    def observation(self, observation: Any) -> np.ndarray:
        image = self._frame(observation[self._image_key])
        rest = _without_value(observation, self._image_key)
        values = np.asarray(spaces.flatten(self._rest, rest), dtype=np.float64)
        values = np.where(self._squash, values / (1.0 + np.abs(values)), values)
        levels = np.rint(np.clip((values - self._lo) / self._span, 0.0, 1.0) * 255.0).astype(np.uint8)
        planes = np.broadcast_to(levels[:, None, None], (levels.shape[0], *image.shape[1:]))
        return np.ascontiguousarray(np.concatenate([image, planes], axis=0))


def _entries(space: spaces.Dict | spaces.Tuple) -> list[tuple[Any, gym.Space]]:
    return list(space.spaces.items()) if isinstance(space, spaces.Dict) else list(enumerate(space.spaces))


def _image_key(space: gym.Space) -> Any:
    """The key (Dict) or index (Tuple) of the first image entry of a ``Dict`` / ``Tuple``; else None."""
    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        return next((k for k, v in _entries(space) if is_image_space(v)), None)
    return None


def _without(space: spaces.Dict | spaces.Tuple, key: Any) -> spaces.Dict | spaces.Tuple:
    if isinstance(space, spaces.Dict):
        return spaces.Dict({k: v for k, v in space.spaces.items() if k != key})
    return spaces.Tuple([v for i, v in enumerate(space.spaces) if i != key])


def _without_value(observation: Any, key: Any) -> Any:
    if isinstance(observation, Mapping):
        return {k: v for k, v in observation.items() if k != key}
    return tuple(v for i, v in enumerate(observation) if i != key)


def _resize(chw: np.ndarray, size_px: int) -> np.ndarray:
    """uint8 ``[C, H, W]`` -> ``[C, S, S]``: repeat each axis up to a multiple of S where it is smaller,
    then area-average down."""
    for axis in (1, 2):
        n = chw.shape[axis]
        if n < size_px:
            chw = np.repeat(chw, -(-size_px // n), axis=axis)
    if chw.shape[1:] == (size_px, size_px):
        return np.ascontiguousarray(chw)
    return area_resize(chw, height_px=size_px, width_px=size_px)


class OffsetDiscreteActions(gym.ActionWrapper):
    """Actions 0..n-1 -> a ``Discrete(n, start)`` env's start..start+n-1."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._start = int(env.action_space.start)
        self.action_space = spaces.Discrete(int(env.action_space.n))

    def action(self, action: Any) -> int:
        return int(action) + self._start


class FlatMultiDiscreteActions(gym.ActionWrapper):
    """One flat discrete action over a ``MultiDiscrete(nvec)`` env's factors (row-major index)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.action_space
        self._nvec = tuple(int(n) for n in np.asarray(space.nvec).reshape(-1))
        self._shape = space.shape
        self._start = np.asarray(getattr(space, "start", 0))
        self.action_space = spaces.Discrete(int(np.prod(self._nvec)))

    def action(self, action: Any) -> np.ndarray:
        factors = np.array(np.unravel_index(int(action), self._nvec), dtype=np.int64).reshape(self._shape)
        return factors + self._start


class FactoredMultiDiscreteActions(gym.ActionWrapper):
    """A ``MultiDiscrete(nvec)`` env taken by its factors: the library's action is an int64 ``[D]`` vector of
    factor indices, ``0 <= a_d < n_d`` over the flattened ``nvec`` (row-major); the env receives it in its
    own shape with its ``start`` added, in its own dtype.

    ``note`` says why the actions are factored (the space, its number of combinations, the flat limit), for
    the messages of the policy types that cannot take them."""

    def __init__(self, env: gym.Env, *, note: str = "") -> None:
        super().__init__(env)
        space = env.action_space
        self._shape, self._dtype = space.shape, space.dtype
        self._start = np.asarray(getattr(space, "start", 0))
        self.nvec = tuple(int(n) for n in np.asarray(space.nvec).reshape(-1))
        self.note = note
        self.action_space = spaces.MultiDiscrete(np.array(self.nvec, dtype=np.int64))

    def action(self, action: Any) -> np.ndarray:
        factors = np.asarray(action, dtype=np.int64).reshape(self._shape)
        return (factors + self._start).astype(self._dtype)


def multi_discrete_form(space: spaces.MultiDiscrete, form: str) -> str:
    """``"flat"`` or ``"factored"``: how a ``MultiDiscrete`` action space is taken under
    ``env.multi_discrete_actions`` = ``form`` (``auto``: flat up to :data:`MAX_FLAT_ACTIONS` combinations,
    factored above)."""
    if form not in MULTI_DISCRETE_FORMS:
        raise ValueError(
            f"env.multi_discrete_actions: must be one of {list(MULTI_DISCRETE_FORMS)}, got {form!r}"
        )
    if form != "auto":
        return form
    return "flat" if _combinations(space) <= MAX_FLAT_ACTIONS else "factored"


def _combinations(space: spaces.MultiDiscrete) -> int:
    return math.prod(int(n) for n in np.asarray(space.nvec).reshape(-1))


def _multi_discrete_actions(env: gym.Env, env_id: str, form: str) -> gym.Env:
    act = env.action_space
    combos = _combinations(act)
    if multi_discrete_form(act, form) == "factored":
        why = (
            f"more than the {MAX_FLAT_ACTIONS} one flat discrete action may have"
            if form == "auto"
            else "taken by its factors (env.multi_discrete_actions=factored)"
        )
        return FactoredMultiDiscreteActions(env, note=f"{act} has {combos} action combinations, {why}")
    if combos > MAX_FLAT_ACTIONS:
        raise SpaceError(
            f"env.env_id: {env_id!r} has {combos} action combinations ({act}), more than the "
            f"{MAX_FLAT_ACTIONS} a flat discrete action may have; env.multi_discrete_actions=auto or "
            "factored takes it by its factors, for the sampled policy types"
        )
    return FlatMultiDiscreteActions(env)


def adapt_spaces(
    env: gym.Env, env_id: str, *, frame_size_px: int, grayscale: bool, multi_discrete: str = "auto"
) -> gym.Env:
    """``env`` wrapped so it emits the library's single frames and takes its actions (module docstring);
    ``multi_discrete``: ``env.multi_discrete_actions``, how a ``MultiDiscrete`` action space is taken.

    Raises :class:`SpaceError` (closing ``env``) for a space the library cannot take."""
    try:
        obs, act = env.observation_space, env.action_space
        if is_picture_space(obs):
            env = ImageFrames(env, size_px=frame_size_px, grayscale=grayscale)
        elif is_grid_space(obs):
            env = GridFrames(env)
        elif _image_key(obs) is not None:
            key = _image_key(obs)
            rest = _without(obs, key)
            _check_flat(rest, env_id)
            n_values = int(spaces.flatdim(rest))
            if n_values > MAX_PLANES:
                raise SpaceError(
                    f"env.env_id: {env_id!r} has {n_values} values beside the image in its observation space "
                    f"({obs}), more than the {MAX_PLANES} planes a conv frame takes; drop some with a wrapper"
                )
            env = ImageWithPlanesFrames(env, key, size_px=frame_size_px, grayscale=grayscale)
        else:
            _check_flat(obs, env_id)
            if not (isinstance(obs, spaces.Box) and len(obs.shape) == 1 and obs.dtype == np.float32):
                env = FlatVectorFrames(env)
        if isinstance(act, spaces.Discrete):
            if int(act.start) != 0:
                env = OffsetDiscreteActions(env)
        elif isinstance(act, spaces.Box) and len(act.shape) == 1:
            if not (np.all(np.isfinite(act.low)) and np.all(np.isfinite(act.high))):
                raise SpaceError(
                    f"env.env_id: {env_id!r} has unbounded continuous actions ({act}); only finite Box "
                    f"bounds can be mapped from the library's [-1, 1]"
                )
            env = UnitBoxActions(env)
        elif isinstance(act, spaces.MultiDiscrete):
            env = _multi_discrete_actions(env, env_id, multi_discrete)
        else:
            raise SpaceError(
                f"env.env_id: {env_id!r} has an unsupported action space {act}. Supported: "
                + _ACTIONS.format(n=MAX_FLAT_ACTIONS)
            )
    except BaseException:
        env.close()
        raise
    return env
