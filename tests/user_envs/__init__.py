"""Envs written as a user would write their own, registered on import: ``env.env_id`` names them as
``tests.user_envs:<EnvId>``, and gymnasium imports this module first.

``UserCorridor-v0``: walk right along a corridor of ``length`` cells to its end (reward 1, episode over);
each step costs ``step_cost``. Observations are a ``Dict``: the position as ``Discrete(length)`` and the
steps left as a ``Box``; actions a ``MultiDiscrete([2, 2])`` (direction, and a flag that does nothing), so
the library's flattening of both is exercised.

``UserTextObs-v0``: an env whose observations are ``Text`` (a space the library refuses).

:class:`StepsTaken` is a wrapper with keyword arguments: it adds the steps taken so far to ``info``.
:class:`CellGrid` turns FrozenLake's cell index into a ``[4, 4, 2]`` bool grid (the agent, the holes).
:class:`GridAndClock` makes that grid one entry of a ``Dict`` beside the cell index (``Discrete(16)``) and an
unbounded clock (the steps taken, a ``Box(-inf, inf, (1,))``): an image with values beside it.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class UserCorridor(gym.Env):
    def __init__(self, length: int = 5, step_cost: float = 0.0, max_steps: int = 50):
        self.length, self.step_cost, self.max_steps = int(length), float(step_cost), int(max_steps)
        self.observation_space = spaces.Dict({
            "position": spaces.Discrete(self.length),
            "steps_left": spaces.Box(0.0, float(self.max_steps), shape=(1,), dtype=np.float32),
        })
        self.action_space = spaces.MultiDiscrete([2, 2])
        self._pos = self._t = 0

    def _obs(self):
        return {"position": self._pos, "steps_left": np.array([self.max_steps - self._t], np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._pos, self._t = 0, 0
        return self._obs(), {}

    def step(self, action):
        direction = int(np.asarray(action)[0])
        self._pos = int(np.clip(self._pos + (1 if direction == 1 else -1), 0, self.length - 1))
        self._t += 1
        done = self._pos == self.length - 1
        reward = (1.0 if done else 0.0) - self.step_cost
        return self._obs(), reward, done, self._t >= self.max_steps and not done, {}


class UserTextObs(gym.Env):
    observation_space = spaces.Text(8)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "a", {}

    def step(self, action):
        return "a", 0.0, True, False, {}


class StepsTaken(gym.Wrapper):
    def __init__(self, env: gym.Env, key: str = "steps_taken"):
        super().__init__(env)
        self.key, self._n = key, 0

    def reset(self, **kwargs):
        self._n = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._n += 1
        return obs, reward, terminated, truncated, {**info, self.key: self._n}


class BreaksAfter(gym.Wrapper):
    """An env that raises after ``steps`` steps of this instance (a user's env with a bug that shows late)."""

    def __init__(self, env: gym.Env, steps: int = 50):
        super().__init__(env)
        self.steps, self._n = steps, 0

    def step(self, action):
        self._n += 1
        if self._n > self.steps:
            raise RuntimeError(f"the env broke after {self.steps} steps")
        return self.env.step(action)


class CellGrid(gym.ObservationWrapper):
    HOLES = (5, 7, 11, 12)  # FrozenLake 4x4's holes

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.observation_space = spaces.Box(0, 1, shape=(4, 4, 2), dtype=bool)

    def observation(self, cell):
        grid = np.zeros((4, 4, 2), dtype=bool)
        grid[int(cell) // 4, int(cell) % 4, 0] = True
        for h in self.HOLES:
            grid[h // 4, h % 4, 1] = True
        return grid


class GridAndClock(gym.ObservationWrapper):
    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._grid = CellGrid(env)
        self.observation_space = spaces.Dict({
            "grid": self._grid.observation_space,
            "cell": spaces.Discrete(16),
            "clock": spaces.Box(-np.inf, np.inf, shape=(1,), dtype=np.float32),
        })
        self._t = 0

    def reset(self, **kwargs):
        self._t = 0
        return super().reset(**kwargs)

    def step(self, action):
        self._t += 1
        return super().step(action)

    def observation(self, cell):
        clock = np.array([self._t], np.float32)
        return {"grid": self._grid.observation(cell), "cell": int(cell), "clock": clock}


for _name, _cls in (("UserCorridor-v0", "UserCorridor"), ("UserTextObs-v0", "UserTextObs")):
    if _name not in gym.registry:
        gym.register(_name, entry_point=f"{__name__}:{_cls}")
