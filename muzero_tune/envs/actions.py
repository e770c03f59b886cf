"""Continuous actions at the env boundary: the library's [-1, 1] actions <-> an env's ``Box`` bounds.

Inside the library a continuous action is a float32 vector ``[D]`` in [-1, 1] (policies, segments,
replay, targets never see the env's own bounds). :class:`UnitBoxActions` is the one place that maps it,
affinely and per component, to the env's ``[low, high]``::

    env_action = low + (unit + 1) / 2 * (high - low)        (unit clipped to [-1, 1] first)
    unit       = 2 * (env_action - low) / (high - low) - 1  (env_action clipped to [low, high] first)

This module owns that mapping and nothing else; it needs finite bounds (an env with an unbounded action
component is refused by the factory).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box

__all__ = ["UnitBoxActions", "bounds_to_unit", "unit_to_bounds"]


def unit_to_bounds(unit: Any, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Library actions ``[..., D]`` in [-1, 1] -> env actions ``[..., D]`` in [low, high] (float64).

    Out-of-range inputs are clipped to [-1, 1] first, so the result never leaves the env's bounds.
    """
    u = np.clip(np.asarray(unit, dtype=np.float64), -1.0, 1.0)
    low64, high64 = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
    # the final clip absorbs float rounding at the ends (low + 1.0 * (high - low) may exceed high by 1 ulp)
    return np.clip(low64 + (u + 1.0) * 0.5 * (high64 - low64), low64, high64)


def bounds_to_unit(action: Any, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Env actions ``[..., D]`` in [low, high] -> library actions ``[..., D]`` in [-1, 1] (float64).

    Out-of-range inputs are clipped to [low, high] first; a degenerate component (low == high) maps to 0.
    """
    low64, high64 = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
    a = np.clip(np.asarray(action, dtype=np.float64), low64, high64)
    span = high64 - low64
    safe = np.where(span > 0, span, 1.0)
    return np.where(span > 0, 2.0 * (a - low64) / safe - 1.0, 0.0)


class UnitBoxActions(gym.ActionWrapper):
    """Exposes a 1-D ``Box`` action space as ``Box(-1, 1, (D,), float32)`` and maps actions affinely to the
    wrapped env's bounds (see the module docstring)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.action_space
        if not isinstance(space, Box) or len(space.shape) != 1:
            raise ValueError(f"UnitBoxActions needs a 1-D Box action space, got {space}")
        if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
            raise ValueError(f"UnitBoxActions needs finite action bounds, got {space}")
        self._low = space.low.astype(np.float64)
        self._high = space.high.astype(np.float64)
        self._env_dtype = space.dtype
        self.action_space = Box(low=-1.0, high=1.0, shape=space.shape, dtype=np.float32)

    def action(self, action: Any) -> np.ndarray:
        """[-1, 1] ``[D]`` -> the env's bounds, in the env's action dtype."""
        return unit_to_bounds(action, self._low, self._high).astype(self._env_dtype)

    def reverse_action(self, action: Any) -> np.ndarray:
        """The env's bounds ``[D]`` -> [-1, 1], float32."""
        return bounds_to_unit(action, self._low, self._high).astype(np.float32)
