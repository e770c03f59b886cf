"""Atari (ALE ``-v5``) construction with MuZero-style preprocessing.

This module owns how an ``ALE/<Game>-v5`` id becomes an environment that emits ONE preprocessed frame per
agent step. It does not import ``ale_py`` itself: :mod:`muzero_tune.envs.factory` checks the optional
dependency and registers the ids before calling :func:`make_atari_env`.

What the agent sees (see :class:`AtariFramePreprocessing`):

* the ALE ``-v5`` defaults are kept: 4 emulator frames per agent step (skipped inside the ALE), sticky
  actions with ``repeat_action_probability=0.25`` (Machado et al. 2018), minimal action set, and the
  ALE's own cap of 108,000 frames per episode (27,000 agent steps, reported as ``truncated``);
* each frame is the ALE's grayscale (luminance) or RGB screen, area-resized to ``frame_size_px`` square,
  uint8, channel-first: ``[1, H, W]`` or ``[3, H, W]``;
* reset plays a uniform random number of no-ops in ``[1, noop_max]`` (0 disables), drawn from the env's
  seeded ``np_random``, so seeded resets stay reproducible.

Why not ``gymnasium.wrappers.AtariPreprocessing``: it needs OpenCV (``cv2``) only for the resize, and
OpenCV is not a dependency of this library. The wrapper below follows its semantics with ``frame_skip=1``
(no-op reset drawn as ``np_random.integers(1, noop_max + 1)``, ``terminal_on_life_loss``, the ALE
grayscale screen, INTER_AREA-style area averaging) and does the resize as two small matrix products.
Two deliberate differences: there is no max-pooling over the last two emulator frames (the ALE does the
skipping, as in the brief's v5 design; flickering games may hide sprites on some frames), and the frame
returned on the final step of an episode is the real final screen (gymnasium's wrapper with
``frame_skip=1`` returns the previous frame there).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box

__all__ = [
    "ATARI_FRAME_SIZES_PX",
    "AtariFramePreprocessing",
    "area_resize",
    "make_atari_env",
    "sign_reward",
]

# Square output sizes the model zoo is built for; other sizes would need other encoder strides.
ATARI_FRAME_SIZES_PX: tuple[int, ...] = (64, 96)


@lru_cache(maxsize=16)
def _area_weights(src_px: int, dst_px: int) -> np.ndarray:
    """Row-stochastic ``[dst_px, src_px]`` float32 matrix: output pixel i averages the source it covers.

    Source pixel j spans ``[j, j + 1)``; output pixel i spans ``[i * s, (i + 1) * s)`` with
    ``s = src_px / dst_px``; the weight is the overlap length divided by ``s`` (OpenCV's INTER_AREA rule
    for downscaling, made separable).
    """
    if dst_px > src_px:
        raise ValueError(f"area resize only downscales, got {src_px} -> {dst_px} px")
    scale = src_px / dst_px
    lo = np.arange(dst_px, dtype=np.float64)[:, None] * scale
    hi = lo + scale
    j = np.arange(src_px, dtype=np.float64)[None, :]
    overlap = np.clip(np.minimum(hi, j + 1.0) - np.maximum(lo, j), 0.0, None)
    weights = (overlap / scale).astype(np.float32)
    weights.setflags(write=False)  # shared through the cache
    return weights


def area_resize(image: np.ndarray, *, height_px: int, width_px: int) -> np.ndarray:
    """Area-average downscale of uint8 images.

    Args:
        image: ``[..., H_src, W_src]`` uint8 (any leading dims, e.g. a channel axis).
        height_px, width_px: output size; must not exceed the source size.

    Returns:
        ``[..., height_px, width_px]`` uint8, rounded to nearest (ties to even).
    """
    rows = _area_weights(image.shape[-2], height_px)  # [h, H_src]
    cols = _area_weights(image.shape[-1], width_px)  # [w, W_src]
    resized = rows @ image.astype(np.float32) @ cols.T
    # Weights are non-negative and sum to 1, so values stay in [0, 255] up to float error that
    # rounding absorbs: no clip needed before the uint8 cast.
    return np.rint(resized, out=resized).astype(np.uint8)


def sign_reward(reward: SupportsFloat) -> float:
    """DQN-style reward clipping to ``sign(reward)`` in {-1.0, 0.0, 1.0}; module-level so envs pickle."""
    return float(np.sign(float(reward)))


class AtariFramePreprocessing(gym.Wrapper):
    """Turns an ALE ``-v5`` env (obs_type ``grayscale`` or ``rgb``) into single channel-first frames.

    Observations: uint8 ``[1, frame_size_px, frame_size_px]`` (grayscale) or ``[3, ...]`` (RGB).

    Args:
        env: a gymnasium-made ALE env whose observation is the full screen ``[210, 160]`` (grayscale) or
            ``[210, 160, 3]`` (RGB); it keeps its own frame skip.
        frame_size_px: output height and width in pixels.
        noop_max: reset plays ``np_random.integers(1, noop_max + 1)`` NOOP actions; 0 disables.
        terminal_on_life_loss: report ``terminated=True`` when a life is lost. The next ``reset()`` then
            restarts the whole game (gymnasium's ``terminal_on_life_loss`` meaning, not the baselines
            ``EpisodicLifeEnv`` that continues the same game).
    """

    def __init__(
        self,
        env: gym.Env,
        *,
        frame_size_px: int,
        noop_max: int = 30,
        terminal_on_life_loss: bool = False,
    ) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, Box) or space.dtype != np.uint8 or len(space.shape) not in (2, 3):
            raise TypeError(f"expected an ALE screen observation space (uint8 [H, W(, 3)]), got {space}")
        if noop_max < 0:
            raise ValueError(f"noop_max must be >= 0, got {noop_max}")
        if noop_max > 0 and env.unwrapped.get_action_meanings()[0] != "NOOP":
            raise ValueError("noop reset needs action 0 to be NOOP")
        self.frame_size_px = int(frame_size_px)
        self.noop_max = int(noop_max)
        self.terminal_on_life_loss = bool(terminal_on_life_loss)
        self._rgb = len(space.shape) == 3
        channels = 3 if self._rgb else 1
        self.observation_space = Box(
            low=0, high=255, shape=(channels, self.frame_size_px, self.frame_size_px), dtype=np.uint8
        )
        self._lives = 0

    def _frame(self, screen: np.ndarray) -> np.ndarray:
        """Full screen ``[210, 160]`` / ``[210, 160, 3]`` -> ``[C, frame_size_px, frame_size_px]`` uint8."""
        # Channel-first before resizing so the resize runs as batched matmuls over channels.
        chw = np.moveaxis(screen, -1, 0) if self._rgb else screen[None]
        return area_resize(chw, height_px=self.frame_size_px, width_px=self.frame_size_px)

    def _ale_lives(self) -> int:
        return int(self.env.unwrapped.ale.lives())

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        screen, info = self.env.reset(seed=seed, options=options)
        if self.noop_max > 0:
            # Drawn from the env's RNG (re-seeded by reset(seed=...)), so seeded resets are reproducible.
            noops = int(self.env.unwrapped.np_random.integers(1, self.noop_max + 1))
            for _ in range(noops):
                screen, _, terminated, truncated, step_info = self.env.step(0)
                info.update(step_info)
                if terminated or truncated:
                    # Rare: the game ended during the no-ops; start a fresh one without re-seeding.
                    screen, info = self.env.reset(options=options)
        self._lives = self._ale_lives()
        return self._frame(screen), info

    def step(self, action: Any) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        screen, reward, terminated, truncated, info = self.env.step(action)
        if self.terminal_on_life_loss:
            lives = self._ale_lives()
            terminated = terminated or lives < self._lives
            self._lives = lives
        return self._frame(screen), reward, terminated, truncated, info


def make_atari_env(
    env_id: str,
    *,
    frame_size_px: int = 64,
    grayscale: bool = True,
    sticky_action_prob: float = 0.25,
    noop_max: int = 30,
    clip_rewards: bool = False,
    episodic_life: bool = False,
    max_episode_steps: int | None = None,
    make_kwargs: dict[str, Any] | None = None,
) -> gym.Env:
    """Build ``ALE/<Game>-v5`` emitting single uint8 frames ``[1 or 3, frame_size_px, frame_size_px]``.

    Arguments are assumed validated (and ``ale_py`` registered) by :func:`muzero_tune.envs.make_env`.

    Args:
        env_id: an ``ALE/<Game>-v5`` id.
        frame_size_px: output side length in pixels (64 or 96).
        grayscale: one luminance channel; ``False`` keeps RGB (3 channels).
        sticky_action_prob: ALE ``repeat_action_probability`` (per emulator frame); the v5 default 0.25.
        noop_max: at most this many random no-ops at reset (at least 1 when > 0; 0 disables).
        clip_rewards: replace rewards by their sign (off by default: MuZero scales values with an
            invertible transform instead of clipping).
        episodic_life: ``terminated=True`` on life loss; the next reset restarts the game (off by
            default, as Machado et al. 2018 recommend).
        max_episode_steps: extra cap in agent steps (a ``TimeLimit`` outside the no-op reset); ``None``
            keeps only the ALE's 108,000-frame cap (27,000 agent steps at frameskip 4).
        make_kwargs: more keyword arguments for ``gymnasium.make`` (``env.kwargs``; ALE settings such as
            ``difficulty`` or ``mode``).

    Returns:
        The wrapped env; ``env.unwrapped.spec.kwargs`` shows the ALE settings (frameskip,
        repeat_action_probability, ...).
    """
    # The ALE renders the grayscale screen itself, so ask for it and skip an RGB copy per step.
    base = gym.make(
        env_id,
        **{
            **(make_kwargs or {}),
            "obs_type": "grayscale" if grayscale else "rgb",
            "repeat_action_probability": float(sticky_action_prob),
        },
    )
    env: gym.Env = AtariFramePreprocessing(
        base, frame_size_px=frame_size_px, noop_max=noop_max, terminal_on_life_loss=episodic_life
    )
    if clip_rewards:
        env = gym.wrappers.TransformReward(env, sign_reward)
    if max_episode_steps is not None:
        env = gym.wrappers.TimeLimit(env, max_episode_steps=max_episode_steps)
    return env
