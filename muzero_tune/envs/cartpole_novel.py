"""A partially observed environment: CartPole with its velocities hidden.

``muzero_tune/CartPoleNoVel-v1`` is gymnasium's CartPole-v1 (same dynamics, reward 1 per step, 500-step
time limit, 2 actions, same episodes for the same seed and actions) whose observation is only the cart
position and the pole angle: indices 0 and 2 of CartPole's 4-vector, a float32 ``Box`` of shape ``(2,)`` with
CartPole's bounds for those two. The cart velocity and the pole's angular velocity must be inferred from
consecutive observations, so a policy that sees one frame at a time needs a history (a recurrent state, a
context of past steps, or stacked frames) to balance the pole.

Solved threshold: eval mean return >= 195 over 8 episodes (the CartPole-v0 criterion, as for CartPole-v1
here).

Importing this module registers the id with gymnasium (the env factory imports it).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

CARTPOLE_NOVEL_ID = "muzero_tune/CartPoleNoVel-v1"
CARTPOLE_NOVEL_SOLVED = 195.0  # eval mean return over 8 episodes
OBSERVED_INDICES = (0, 2)  # cart position, pole angle (of x, x_dot, theta, theta_dot)


class CartPoleNoVelEnv(CartPoleEnv):
    """CartPole-v1 observing only ``obs[[0, 2]]`` (cart position and pole angle)."""

    def __init__(self, render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode)
        full = self.observation_space
        index = list(OBSERVED_INDICES)
        self.observation_space = spaces.Box(full.low[index], full.high[index], dtype=np.float32)

    @staticmethod
    def _observe(obs: np.ndarray) -> np.ndarray:
        return obs[list(OBSERVED_INDICES)]

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = super().step(action)
        return self._observe(obs), reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        obs, info = super().reset(seed=seed, options=options)
        return self._observe(obs), info


def register() -> None:
    """Register :data:`CARTPOLE_NOVEL_ID` with gymnasium (idempotent)."""
    if CARTPOLE_NOVEL_ID not in gym.registry:
        gym.register(
            id=CARTPOLE_NOVEL_ID,
            entry_point="muzero_tune.envs.cartpole_novel:CartPoleNoVelEnv",
            max_episode_steps=500,
            reward_threshold=CARTPOLE_NOVEL_SOLVED,
        )


register()
