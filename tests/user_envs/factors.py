"""A ``MultiDiscrete`` action space too large for one flat action, written as a user would, registered on
import: ``env.env_id`` names it as ``tests.user_envs.factors:FactorMatch-v0``.

``FactorMatch-v0``: each step shows a cue c in ``0 .. num_cues - 1`` (a ``Discrete`` observation) and takes a
``MultiDiscrete(nvec)`` action (default ``[8] * 5``: 32,768 combinations); factor d's right value is
``(c + d) % n_d``, and the reward is the fraction of factors right (0 .. 1). An episode lasts
``episode_steps`` steps: a uniform random policy returns ``episode_steps * mean_d(1 / n_d)`` on average (1.0
with the defaults), the rule ``episode_steps`` (8.0). The env raises on an action outside its space, so a run
that finishes has sent only actions inside ``nvec``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class FactorMatch(gym.Env):
    def __init__(self, nvec=(8, 8, 8, 8, 8), num_cues: int = 4, episode_steps: int = 8):
        self.nvec = np.array(nvec, dtype=np.int64)
        self.num_cues, self.episode_steps = int(num_cues), int(episode_steps)
        self.observation_space = spaces.Discrete(self.num_cues)
        self.action_space = spaces.MultiDiscrete(self.nvec)
        self._cue = self._t = 0

    def right_action(self, cue: int) -> np.ndarray:
        """The action the rule rewards fully at ``cue``: [D] int64."""
        return (cue + np.arange(len(self.nvec))) % self.nvec

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        self._cue = int(self.np_random.integers(self.num_cues))
        return self._cue, {}

    def step(self, action):
        action = np.asarray(action)
        if action.shape != self.nvec.shape or not self.action_space.contains(action.astype(np.int64)):
            raise ValueError(f"action {action!r} is outside {self.action_space}")
        reward = float(np.mean(action == self.right_action(self._cue)))
        self._t += 1
        self._cue = int(self.np_random.integers(self.num_cues))
        return self._cue, reward, self._t >= self.episode_steps, False, {}


if "FactorMatch-v0" not in gym.registry:
    gym.register("FactorMatch-v0", entry_point=f"{__name__}:FactorMatch")
