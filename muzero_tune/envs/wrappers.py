"""Wrappers the library ships for users' envs (``env.wrappers``: ``muzero_tune.envs.wrappers:Name``).

What this module owns
    Small corrections an env's own spaces need before :mod:`muzero_tune.envs.spaces` reads them. Today one:
    :class:`ObservationBounds`, for a ``Box`` observation whose declared bounds overstate its values (MiniGrid
    declares its symbolic cells 0..255 while they hold 0..10): the grid and picture paths scale values from
    the bounds, so true bounds give the network inputs that span 0..255 rather than a few steps of it.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = ["ObservationBounds"]


class ObservationBounds(gym.ObservationWrapper):
    """A ``Box`` observation with its bounds declared as ``[low, high]`` (same shape and dtype; values clipped
    into them).

        env.wrappers:
          - minigrid.wrappers:ImgObsWrapper
          - "muzero_tune.envs.wrappers:ObservationBounds {high: 10}"
    """

    def __init__(self, env: gym.Env, low: float = 0.0, high: float = 1.0) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, spaces.Box):
            raise TypeError(f"ObservationBounds takes a Box observation space, not {space}")
        if not (np.isfinite(low) and np.isfinite(high) and high > low):
            raise ValueError(f"ObservationBounds: low={low!r}, high={high!r}; allowed: finite, high > low")
        self._low, self._high = space.dtype.type(low), space.dtype.type(high)
        self.observation_space = spaces.Box(self._low, self._high, shape=space.shape, dtype=space.dtype)

    def observation(self, observation: Any) -> np.ndarray:
        return np.clip(np.asarray(observation), self._low, self._high)
