"""A stochastic-transition environment for Stochastic MuZero: CartPole with slipping actions.

``muzero_tune/StochasticCartPole-v1`` is gymnasium's CartPole-v1 (same dynamics, reward 1 per step, 500-step
time limit, 4-d float32 observation, 2 actions) except that the action the agent chooses is replaced, with
probability ``slip_prob`` (default 0.3), by an action drawn uniformly at random from {0, 1}. So the opposite
push is executed with probability ``slip_prob / 2`` = 0.15: the next state given (state, action) has two
possible outcomes, which a deterministic MuZero model can only average. The draw comes from the env's own
``np_random`` (seeded by ``reset(seed=...)``), so episodes are reproducible from the seed.

``info["executed_action"]`` and ``info["slipped"]`` expose the chance outcome; the training pipeline does not
use them (Stochastic MuZero learns its chance codes with an encoder over consecutive observations).

Solved threshold: eval mean return >= 195 over 8 episodes (the CartPole-v0 criterion, as for CartPole-v1
here). A hand-written linear controller, ``a = 1 if theta + 0.5*theta_dot + 0.05*x + 0.1*x_dot > 0``, scores
about 460 on average over 20 seeded episodes of this env (500 with slip_prob=0); a uniformly random policy
about 20.

Importing this module registers the id with gymnasium (the env factory imports it).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

STOCHASTIC_CARTPOLE_ID = "muzero_tune/StochasticCartPole-v1"
STOCHASTIC_CARTPOLE_SOLVED = 195.0  # eval mean return over 8 episodes


class StochasticCartPoleEnv(CartPoleEnv):
    """CartPole-v1 whose chosen action is replaced by a uniformly random one with prob. ``slip_prob``."""

    def __init__(self, slip_prob: float = 0.3, render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode)
        if not 0.0 <= float(slip_prob) <= 1.0:
            raise ValueError(f"slip_prob must be in [0, 1], got {slip_prob!r}")
        self.slip_prob = float(slip_prob)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        assert self.action_space.contains(action), f"{action!r} ({type(action)}) invalid"
        slipped = bool(self.np_random.random() < self.slip_prob)
        executed = int(self.np_random.integers(2)) if slipped else int(action)
        obs, reward, terminated, truncated, info = super().step(executed)
        info = {**info, "executed_action": executed, "slipped": slipped}
        return obs, reward, terminated, truncated, info


def register() -> None:
    """Register :data:`STOCHASTIC_CARTPOLE_ID` with gymnasium (idempotent)."""
    if STOCHASTIC_CARTPOLE_ID not in gym.registry:
        gym.register(
            id=STOCHASTIC_CARTPOLE_ID,
            entry_point="muzero_tune.envs.stochastic:StochasticCartPoleEnv",
            max_episode_steps=500,
            reward_threshold=STOCHASTIC_CARTPOLE_SOLVED,
        )


register()
