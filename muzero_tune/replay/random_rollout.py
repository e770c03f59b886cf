"""Segments from a uniform-random policy: replay-memory benchmarks and frame-storage tests.

Uses the real environment factory and :class:`SegmentBuilder`, with the per-step statistics a MuZero
policy stores (a uniform visit distribution, a zero root value, an all-legal mask), but no network.
Continuous envs get float32 ``[D]`` actions uniform in [-1, 1] (the library's form) and, as a sampled
policy would store them, one "sampled" action per step (the one taken, ``sampled_actions`` [1, D]) holding
all the visits (``child_visits`` [1]) and an empty legal mask ``[0]``.
"""

from __future__ import annotations

import numpy as np

from muzero_tune.envs import env_spec, make_env
from muzero_tune.replay.segment import GameSegment, SegmentBuilder


def random_segments(
    env_id: str,
    *,
    steps: int,
    frame_stack: int,
    segment_length: int,
    pad_length: int,
    seed: int = 0,
    stream_id: str = "s0",
    max_episode_steps: int | None = None,
) -> list[GameSegment]:
    """Step one env ``steps`` times with random actions; return the segments completed."""
    spec = env_spec(env_id, frame_stack=frame_stack)
    env = make_env(env_id, seed=seed, max_episode_steps=max_episode_steps)
    rng = np.random.default_rng(seed)
    builder = SegmentBuilder(
        segment_length=segment_length,
        pad_length=pad_length,
        frame_stack=frame_stack,
        stream_id=stream_id,
        action_shape=spec.action_shape,
        action_dtype=spec.action_dtype,
    )
    frame, _ = env.reset()
    builder.reset(np.asarray(frame))
    n_actions = spec.num_actions
    continuous = spec.action_kind == "continuous"
    stats = {
        "child_visits": np.ones(1, np.float32)
        if continuous
        else np.full(n_actions, 1.0 / n_actions, np.float32),
        "root_value": np.float32(0.0),
        "legal_mask": np.ones(n_actions, bool),
    }
    segs: list[GameSegment] = []
    for _ in range(steps):
        if continuous:
            action = spec.random_actions(rng, ())  # [D] float32 in [-1, 1]
            step_stats = {**stats, "sampled_actions": action[None, :]}
        else:
            action, step_stats = int(rng.integers(n_actions)), stats
        frame, reward, term, trunc, _ = env.step(spec.env_action(action))
        segs += builder.step(
            action=action,
            reward=float(reward),
            next_frame=np.asarray(frame),
            stats=step_stats,
            terminated=term,
            truncated=trunc,
        )
        if term or trunc:
            frame, _ = env.reset()
            builder.reset(np.asarray(frame))
    env.close()
    return segs
