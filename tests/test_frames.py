"""Memory-lean replay: every frame stored once, stacks rebuilt at sample time, eviction frees frames."""

from __future__ import annotations

import numpy as np
import pytest

from muzero_tune.envs import stack_frames
from muzero_tune.replay.buffer import ReplayBuffer
from muzero_tune.replay.frames import FrameRef
from muzero_tune.replay.random_rollout import random_segments


def rollout_segments(
    env_id, *, steps, frame_stack, seg_len, pad, seed=0, stream="s0", max_episode_steps=None
):
    return random_segments(
        env_id,
        steps=steps,
        frame_stack=frame_stack,
        segment_length=seg_len,
        pad_length=pad,
        seed=seed,
        stream_id=stream,
        max_episode_steps=max_episode_steps,
    )


@pytest.mark.parametrize("frame_stack", [1, 4])
def test_frames_stored_once_and_read_back_exactly(frame_stack):
    segs = rollout_segments(
        "CartPole-v1", steps=3000, frame_stack=frame_stack, seg_len=20, pad=10, max_episode_steps=60
    )
    originals = [s.frames.copy() for s in segs]
    buf = ReplayBuffer(capacity_transitions=10**6)
    buf.push(segs)
    received = sum(len(o) for o in originals)
    real = sum(s.num_real for s in segs)
    episodes = len({s.episode_index for s in segs})
    # one frame per transition plus, per episode, its reset frame and the stack padding copies
    assert buf.num_frames <= real + episodes * frame_stack
    assert received > buf.num_frames  # the shipped segments overlap; the store does not
    for s, o in zip(buf.segments, originals):
        assert isinstance(s.frames, FrameRef)
        np.testing.assert_array_equal(s.frames.materialize(), o)
        pos = np.arange(s.num_stored + 1)
        np.testing.assert_array_equal(s.stacked_obs(pos), o[pos[:, None] + np.arange(frame_stack)])


def test_eviction_frees_frames_and_keeps_survivors_intact():
    segs = rollout_segments(
        "CartPole-v1", steps=4000, frame_stack=3, seg_len=20, pad=10, max_episode_steps=90
    )
    originals = {id(s): s.frames.copy() for s in segs}
    buf = ReplayBuffer(capacity_transitions=1000)
    for i in range(0, len(segs), 7):
        buf.push(segs[i : i + 7])
        assert buf.num_transitions <= 1000
        for s in buf.segments:
            np.testing.assert_array_equal(s.frames.materialize(), originals[id(s)])
    assert buf.num_frames < 1000 * 1.3 + 100  # frames freed with their segments


def test_streams_do_not_share_frames():
    a = rollout_segments("CartPole-v1", steps=200, frame_stack=2, seg_len=20, pad=10, seed=1, stream="a")
    b = rollout_segments("CartPole-v1", steps=200, frame_stack=2, seg_len=20, pad=10, seed=2, stream="b")
    mixed = [s for pair in zip(a, b) for s in pair]
    originals = [s.frames.copy() for s in mixed]
    buf = ReplayBuffer(capacity_transitions=10**6)
    buf.push(mixed)
    for s, o in zip(buf.segments, originals):
        np.testing.assert_array_equal(s.frames.materialize(), o)


def test_pong_bytes_per_transition_and_stack_reconstruction():
    segs = rollout_segments("ALE/Pong-v5", steps=1500, frame_stack=4, seg_len=20, pad=10)
    originals = [s.frames.copy() for s in segs]
    buf = ReplayBuffer(capacity_transitions=10**6)
    buf.push(segs)
    per_transition = buf.nbytes / buf.num_transitions
    assert per_transition < 5 * 2**30 / 1e6  # 1M transitions within 5 GiB
    for s, o in zip(buf.segments[:5], originals[:5]):
        obs = stack_frames(s.stacked_obs(np.arange(s.num_real)), frame_ndim=3)
        assert obs.shape == (s.num_real, 4, 64, 64) and obs.dtype == np.uint8
        np.testing.assert_array_equal(
            obs, stack_frames(o[np.arange(s.num_real)[:, None] + np.arange(4)], frame_ndim=3)
        )
