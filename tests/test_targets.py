"""Training targets: hand-computed n-step value / reward / policy targets and masks for the four kinds of
positions (deep inside, near a non-terminal end, terminated, truncated), an equivalence test of the
vectorised ``make_batch`` against a plain per-element loop, and the reanalyze write-back.
"""

from __future__ import annotations

import numpy as np
import pytest

from muzero_tune.replay.buffer import SampledIndices
from muzero_tune.replay.segment import GameSegment
from muzero_tune.replay.targets import make_batch, n_step_targets, reanalyze_positions

A = 2  # actions


def visits_for(m: int, salt: float = 0.0) -> np.ndarray:
    """Distinct, recognisable visit distributions: row i = [p, 1 - p] with p = (i + 1) / 100 + salt."""
    p = (np.arange(m) + 1) / 100.0 + salt
    return np.stack([p, 1.0 - p], axis=1).astype(np.float32)


def hand_segment(
    *,
    m: int,
    num_real: int,
    terminal: bool,
    done: bool,
    frame_stack: int = 1,
    frame0: float = 100.0,
    salt: float = 0.0,
) -> GameSegment:
    """rewards r_i = i + 1; observation i's frame = [frame0 + i, -1] (reset copies before position 0)."""
    fs = frame_stack
    vals = np.concatenate([np.full(fs - 1, frame0), frame0 + np.arange(m + 1)])
    frames = np.stack([vals, -np.ones_like(vals)], axis=1).astype(np.float32)
    return GameSegment(
        frames=frames,
        actions=(np.arange(m) % A).astype(np.int64),
        rewards=(np.arange(m) + 1).astype(np.float32),
        stats={"child_visits": visits_for(m, salt), "legal_mask": np.ones((m, A), dtype=bool)},
        num_real=num_real,
        frame_stack=fs,
        done=done,
        terminal_at_end=terminal,
    )


def sample_of(segments, positions) -> SampledIndices:
    b = len(segments)
    return SampledIndices(
        flat_index=np.arange(b, dtype=np.int64),
        segments=tuple(segments),
        positions=np.asarray(positions, dtype=np.int64),
        weights=np.linspace(0.5, 1.0, b).astype(np.float32),
        make_time=7,
    )


class RecordingValue:
    """value(obs) = first element of the stacked observation; records what it was asked."""

    def __init__(self):
        self.calls: list[np.ndarray] = []

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        self.calls.append(obs.copy())
        return obs[:, 0].astype(np.float32)


def test_hand_computed_targets():
    g = 0.5  # discount
    td, K = 3, 3
    # r_i = i + 1, v(o_i) = 100 + i for each segment (frame0 = 100)
    deep = hand_segment(m=10, num_real=4, terminal=False, done=False)  # 4 real + 6 padding
    near_end = hand_segment(m=7, num_real=4, terminal=False, done=False)  # 4 real + 3 padding
    terminated = hand_segment(m=5, num_real=5, terminal=True, done=True)
    truncated = hand_segment(m=5, num_real=5, terminal=False, done=True)
    padded_to_terminal = hand_segment(m=8, num_real=4, terminal=True, done=False)
    segs = [deep, near_end, terminated, truncated, padded_to_terminal]
    starts = [1, 3, 3, 3, 3]
    vf = RecordingValue()
    batch = make_batch(
        sample_of(segs, starts),
        num_unroll_steps=K,
        td_steps=td,
        discount=g,
        num_actions=A,
        value_fn=vf,
        rng=np.random.default_rng(0),
    )
    r = lambda i: i + 1.0  # noqa: E731 -- reward after action i
    v = lambda i: 100.0 + i  # noqa: E731 -- bootstrap value of observation i

    expect_value = np.array(
        [
            # deep, t = 1, full 3-step returns, bootstrap from o_{i+3}
            [
                r(1) + g * r(2) + g**2 * r(3) + g**3 * v(4),
                r(2) + g * r(3) + g**2 * r(4) + g**3 * v(5),
                r(3) + g * r(4) + g**2 * r(5) + g**3 * v(6),
                r(4) + g * r(5) + g**2 * r(6) + g**3 * v(7),
            ],
            # near a non-terminal end (M = 7), t = 3: n shrinks to 2 then 1, bootstrap from the last obs o_7
            [
                r(3) + g * r(4) + g**2 * r(5) + g**3 * v(6),
                r(4) + g * r(5) + g**2 * r(6) + g**3 * v(7),
                r(5) + g * r(6) + g**2 * v(7),
                r(6) + g * v(7),
            ],
            # terminated at M = 5, t = 3: no bootstrap at the terminal, absorbing zeros past it
            [r(3) + g * r(4), r(4), 0.0, 0.0],
            # truncated at M = 5, t = 3: bootstrap from the final obs o_5; past the end unknown
            [r(3) + g * r(4) + g**2 * v(5), r(4) + g * v(5), 0.0, 0.0],
            # padded predecessor whose data ends in a terminal o_8, t = 3
            [
                r(3) + g * r(4) + g**2 * r(5) + g**3 * v(6),
                r(4) + g * r(5) + g**2 * r(6) + g**3 * v(7),
                r(5) + g * r(6) + g**2 * r(7),
                r(6) + g * r(7),
            ],
        ]
    )
    # the written-out numbers, for the record: 2 + 1.5 + 1 + 13 = 17.5 etc.
    assert expect_value[0, 0] == 17.5 and expect_value[2, 0] == 6.5 and expect_value[3, 1] == 57.5
    expect_vmask = np.array([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1]])
    np.testing.assert_allclose(batch.target_value, expect_value, rtol=1e-6)
    np.testing.assert_array_equal(batch.value_mask, expect_vmask)

    expect_reward = np.array(
        [
            [r(1), r(2), r(3)],
            [r(3), r(4), r(5)],
            [r(3), r(4), 0.0],  # past a terminal: reward 0, trained on
            [r(3), r(4), 0.0],  # past a truncation: masked
            [r(3), r(4), r(5)],
        ]
    )
    expect_rmask = np.array([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 1]])
    np.testing.assert_array_equal(batch.target_reward, expect_reward)
    np.testing.assert_array_equal(batch.reward_mask, expect_rmask)

    expect_pmask = np.array([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    np.testing.assert_array_equal(batch.policy_mask, expect_pmask)
    for b, t in enumerate(starts):
        for k in range(K + 1):
            if expect_pmask[b, k]:
                p = (t + k + 1) / 100  # visits row i = [(i + 1) / 100, 1 - (i + 1) / 100]
                np.testing.assert_allclose(batch.target_policy[b, k], [p, 1 - p], rtol=1e-6)
            else:
                np.testing.assert_array_equal(batch.target_policy[b, k], np.zeros(A))

    # actions: stored where i < M, uniformly random (in range) past the end
    for b, (seg, t) in enumerate(zip(segs, starts)):
        for k in range(K):
            if t + k < seg.num_stored:
                assert batch.actions[b, k] == seg.actions[t + k]
            else:
                assert 0 <= batch.actions[b, k] < A
    # observations: o_{min(t+k, M)}; obs_mask 1 for i <= M
    np.testing.assert_array_equal(
        batch.obs[:, :, 0],
        [
            [101, 102, 103, 104],
            [103, 104, 105, 106],
            [103, 104, 105, 105],
            [103, 104, 105, 105],
            [103, 104, 105, 106],
        ],
    )
    np.testing.assert_array_equal(
        batch.obs_mask, [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    )
    # no bootstrap value was ever taken from a terminal observation (o_5 of `terminated`, o_8 of the last)
    asked = np.concatenate(vf.calls)[:, 0]
    assert 108.0 not in asked
    assert len(asked) == 4 + 4 + 0 + 2 + 2
    np.testing.assert_array_equal(batch.weights, np.linspace(0.5, 1.0, 5).astype(np.float32))
    assert batch.make_time == 7


def test_terminal_batch_never_calls_value_fn():
    seg = hand_segment(m=4, num_real=4, terminal=True, done=True)
    vf = RecordingValue()
    batch = make_batch(
        sample_of([seg], [1]),
        num_unroll_steps=2,
        td_steps=5,
        discount=0.9,
        num_actions=A,
        value_fn=vf,
        rng=np.random.default_rng(0),
    )
    assert vf.calls == []
    # i = 1: 2 + .9 * 3 + .81 * 4; i = 2: 3 + .9 * 4; i = 3: 4
    np.testing.assert_allclose(batch.target_value[0], [2 + 0.9 * 3 + 0.81 * 4, 3 + 0.9 * 4, 4.0], rtol=1e-6)


def test_bootstrap_uses_stacked_window():
    """frame_stack 2: the bootstrap observation is [o_{b-1}, o_b] (reset copies before position 0)."""
    seg = hand_segment(m=6, num_real=3, terminal=False, done=False, frame_stack=2)
    seen: list[np.ndarray] = []

    def vf(obs):
        seen.append(obs.copy())
        return 1000.0 * obs[:, 0] + obs[:, 2]  # oldest frame x 1000 + newest frame

    batch = make_batch(
        sample_of([seg], [0]),
        num_unroll_steps=1,
        td_steps=2,
        discount=1.0,
        num_actions=A,
        value_fn=vf,
        rng=np.random.default_rng(0),
    )
    # k=0: r0 + r1 + v([o1, o2]); k=1: r1 + r2 + v([o2, o3])
    np.testing.assert_allclose(batch.target_value[0], [1 + 2 + 101_000 + 102, 2 + 3 + 102_000 + 103])
    # position 0's window is [reset copy, o0]
    np.testing.assert_array_equal(batch.obs[0, 0], [100, -1, 100, -1])
    np.testing.assert_array_equal(batch.obs[0, 1], [100, -1, 101, -1])
    assert np.concatenate(seen).shape == (2, 4)


def test_n_step_targets_direct():
    seg = hand_segment(m=5, num_real=5, terminal=True, done=True)
    assert n_step_targets(seg, 4, td_steps=3, discount=0.5) == (5.0, None, 0.0, True)
    assert n_step_targets(seg, 7, td_steps=3, discount=0.5) == (0.0, None, 0.0, True)
    trunc = hand_segment(m=5, num_real=5, terminal=False, done=True)
    assert n_step_targets(trunc, 4, td_steps=3, discount=0.5) == (5.0, 5, 0.5, True)
    assert n_step_targets(trunc, 5, td_steps=3, discount=0.5)[3] is False


# ---------------------------------------------------------------------------------------------- equivalence


def random_segment(rng: np.random.Generator, frame_stack: int) -> GameSegment:
    m = int(rng.integers(1, 16))
    num_real = int(rng.integers(1, m + 1))
    ended = num_real == m and rng.random() < 0.7
    terminal = bool(rng.random() < 0.5) if (ended or num_real < m) else False
    frames = rng.normal(size=(frame_stack - 1 + m + 1, 2)).astype(np.float32)
    visits = rng.dirichlet(np.ones(3), size=m).astype(np.float32)
    return GameSegment(
        frames=frames,
        actions=rng.integers(0, 3, size=m).astype(np.int64),
        rewards=rng.normal(size=m).astype(np.float32),
        stats={"child_visits": visits, "legal_mask": np.ones((m, 3), dtype=bool)},
        num_real=num_real,
        frame_stack=frame_stack,
        done=ended,
        terminal_at_end=terminal,
    )


def loop_targets(seg: GameSegment, t: int, *, K: int, td: int, gamma: float, value):
    """A plain per-element implementation of the target rules (independent of the library's)."""
    m, fs = seg.num_stored, seg.frame_stack

    def stacked(i):
        return seg.frames[i : i + fs].reshape(-1)

    tv, vm, tp, pm, tr, rm, ob, om = [], [], [], [], [], [], [], []
    for k in range(K + 1):
        i = t + k
        if i < m:
            n = min(td, m - i)
            z = 0.0
            for j in range(n):
                z += gamma**j * float(seg.rewards[i + j])
            if not (i + n == m and seg.terminal_at_end):
                z += gamma**n * float(value(stacked(i + n)[None])[0])
            tv.append(z)
            vm.append(1.0)
            tp.append(seg.stats["child_visits"][i])
            pm.append(1.0)
        else:
            tv.append(0.0)
            vm.append(1.0 if seg.terminal_at_end else 0.0)
            tp.append(np.zeros(3))
            pm.append(0.0)
        if k < K:
            tr.append(float(seg.rewards[i]) if i < m else 0.0)
            rm.append(1.0 if i < m or seg.terminal_at_end else 0.0)
        ob.append(stacked(min(i, m)))
        om.append(1.0 if i <= m else 0.0)
    return [np.array(x) for x in (tv, vm, tp, pm, tr, rm, ob, om)]


def random_samples(rng: np.random.Generator, frame_stack: int, n: int):
    """``n`` random segments, one real position in each, and a value function (tanh of a fixed linear map of
    the stacked observation): the inputs of the make_batch-against-the-loop tests."""
    w = np.array([0.7, -1.3] * frame_stack)

    def value(obs):
        return np.tanh(obs @ w).astype(np.float32)

    segs = [random_segment(rng, frame_stack) for _ in range(n)]
    pos = [int(rng.integers(0, s.num_real)) for s in segs]
    return segs, pos, value


@pytest.mark.parametrize("frame_stack, td", [(1, 1), (1, 4), (3, 3), (3, 10)])
def test_make_batch_equals_plain_loop(frame_stack, td):
    rng = np.random.default_rng(100 * frame_stack + td)
    K, gamma = 4, 0.9
    segs, pos, value = random_samples(rng, frame_stack, 40)
    batch = make_batch(
        sample_of(segs, pos),
        num_unroll_steps=K,
        td_steps=td,
        discount=gamma,
        num_actions=3,
        value_fn=value,
        rng=np.random.default_rng(1),
    )
    assert any(s.terminal_at_end for s in segs) and any(not s.terminal_at_end for s in segs)
    assert any(t + K >= s.num_stored for s, t in zip(segs, pos))
    for b, (seg, t) in enumerate(zip(segs, pos)):
        tv, vm, tp, pm, tr, rm, ob, om = loop_targets(seg, t, K=K, td=td, gamma=gamma, value=value)
        np.testing.assert_allclose(batch.target_value[b], tv, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(batch.value_mask[b], vm)
        np.testing.assert_array_equal(batch.target_policy[b], tp)
        np.testing.assert_array_equal(batch.policy_mask[b], pm)
        np.testing.assert_array_equal(batch.target_reward[b], tr)
        np.testing.assert_array_equal(batch.reward_mask[b], rm)
        np.testing.assert_array_equal(batch.obs[b], ob)
        np.testing.assert_array_equal(batch.obs_mask[b], om)
        for k in range(K):
            if t + k < seg.num_stored:
                assert batch.actions[b, k] == seg.actions[t + k]
            else:
                assert 0 <= batch.actions[b, k] < 3
    # all_obs=False: only k = 0
    first = make_batch(
        sample_of(segs, pos),
        num_unroll_steps=K,
        td_steps=td,
        discount=gamma,
        num_actions=3,
        value_fn=value,
        rng=np.random.default_rng(1),
        all_obs=False,
    )
    assert first.obs.shape == (40, 1, 2 * frame_stack)
    np.testing.assert_array_equal(first.obs[:, 0], batch.obs[:, 0])
    np.testing.assert_array_equal(first.target_value, batch.target_value)


# ---------------------------------------------------------------------------------------------- reanalyze


def test_reanalyze_writes_back_and_is_the_target():
    K = 3
    segs = [
        hand_segment(m=10, num_real=6, terminal=False, done=False, frame0=100.0),  # t = 2: positions 2..5
        hand_segment(m=5, num_real=5, terminal=True, done=True, frame0=200.0),  # t = 3: positions 3..4 only
        hand_segment(m=10, num_real=6, terminal=False, done=False, frame0=300.0),
        hand_segment(m=6, num_real=6, terminal=False, done=True, frame0=400.0),
    ]
    segs[1].stats["legal_mask"][:, 1] = False  # the legal masks passed along are the stored ones
    before = [s.stats["child_visits"].copy() for s in segs]
    positions = [2, 3, 1, 4]
    calls = []

    def reanalyze_fn(obs, legal):
        calls.append((obs.copy(), legal.copy()))
        p = 0.05 + 0.9 * (obs[:, 0] % 100) / 100.0  # depends on the observation it was given
        return np.stack([p, 1 - p], axis=1).astype(np.float32)

    batch = make_batch(
        sample_of(segs, positions),
        num_unroll_steps=K,
        td_steps=2,
        discount=0.9,
        num_actions=A,
        value_fn=RecordingValue(),
        rng=np.random.default_rng(0),
        reanalyze_count=2,
        reanalyze_fn=reanalyze_fn,
    )
    assert len(calls) == 1
    obs, legal = calls[0]
    # positions searched: seg 0 at 2, 3, 4, 5 and seg 1 at 3, 4 (stored data ends at M = 5)
    np.testing.assert_array_equal(obs[:, 0], [102, 103, 104, 105, 203, 204])
    np.testing.assert_array_equal(legal, [[True, True]] * 4 + [[True, False]] * 2)

    def dist(frame):
        p = 0.05 + 0.9 * (frame % 100) / 100.0
        return np.array([p, 1 - p], dtype=np.float32)

    # written back into the segments' stored visits, nowhere else
    for b, (seg, t) in enumerate(zip(segs, positions)):
        cv = seg.stats["child_visits"]
        for i in range(seg.num_stored):
            if b < 2 and t <= i <= t + K and i < seg.num_stored:
                np.testing.assert_allclose(cv[i], dist(seg.frames[i, 0]), rtol=1e-6)
            else:
                np.testing.assert_array_equal(cv[i], before[b][i])
    # and the returned policy targets are the fresh ones (stored ones for the other samples)
    for b, (seg, t) in enumerate(zip(segs, positions)):
        for k in range(K + 1):
            i = t + k
            if i < seg.num_stored:
                expect = dist(seg.frames[i, 0]) if b < 2 else before[b][i]
                np.testing.assert_allclose(batch.target_policy[b, k], expect, rtol=1e-6)
                assert batch.policy_mask[b, k] == 1
            else:
                assert batch.policy_mask[b, k] == 0
    assert not np.allclose(batch.target_policy[0, 0], before[0][2])


def test_extra_stats_are_gathered_per_unroll_step():
    rng = np.random.default_rng(5)
    segs = [random_segment(rng, 1) for _ in range(6)]
    for s in segs:
        s.stats["improved_policy"] = rng.random((s.num_stored, 3)).astype(np.float32)
    positions = [int(rng.integers(s.num_real)) for s in segs]
    batch = make_batch(
        sample_of(segs, positions),
        num_unroll_steps=4,
        td_steps=3,
        discount=0.9,
        num_actions=3,
        value_fn=lambda o: np.zeros(len(o)),
        rng=rng,
        extra_stats=("improved_policy",),
    )
    got = batch.extras["improved_policy"]
    assert got.shape == (6, 5, 3)
    for b, (s, t) in enumerate(zip(segs, positions)):
        for k in range(5):
            want = s.stats["improved_policy"][t + k] if t + k < s.num_stored else np.zeros(3)
            np.testing.assert_array_equal(got[b, k], want)
            assert batch.policy_mask[b, k] == float(t + k < s.num_stored)


# ---------------------------------------------------------------------------------- continuous actions

D = 3  # continuous action dimension


def continuous_segment(*, m: int, num_real: int, terminal: bool, salt: float) -> GameSegment:
    """``hand_segment`` with float32 actions [M, D]: action i = [i, -i, salt] / 100 (recognisable)."""
    seg = hand_segment(m=m, num_real=num_real, terminal=terminal, done=terminal and m == num_real)
    i = np.arange(m, dtype=np.float32)
    seg.actions = (np.stack([i, -i, np.full(m, salt, np.float32)], axis=1) / 100.0).astype(np.float32)
    seg.stats["legal_mask"] = np.ones((m, 0), dtype=bool)
    return seg


def test_continuous_actions_in_the_batch():
    """[B, K, D] float32: the stored actions a_t..a_{t+K-1} where they exist, uniform in [-1, 1] past the
    data; the rest of the targets do not depend on the action kind."""
    K, td = 3, 2
    segs = [
        continuous_segment(m=10, num_real=6, terminal=False, salt=1.0),  # deep inside: all K stored
        continuous_segment(m=6, num_real=6, terminal=True, salt=2.0),  # t = 4: a_4, a_5, then random
    ]
    sample = sample_of(segs, [2, 4])
    batch = make_batch(sample, num_unroll_steps=K, td_steps=td, discount=0.9, num_actions=0, action_dim=D,
                       value_fn=lambda obs: np.zeros(len(obs), np.float32), rng=np.random.default_rng(0))
    assert batch.actions.shape == (2, K, D) and batch.actions.dtype == np.float32
    np.testing.assert_array_equal(batch.actions[0], segs[0].actions[2:5])
    np.testing.assert_array_equal(batch.actions[1, :2], segs[1].actions[4:6])
    past = batch.actions[1, 2]
    assert np.all(np.abs(past) <= 1.0) and not np.any(np.isin(past, segs[1].actions))
    assert batch.target_policy.shape == (2, K + 1, A)
    # the same sample with discrete actions gives the same targets
    for seg in segs:
        seg.actions = (np.arange(seg.num_stored) % A).astype(np.int64)
    ref = make_batch(sample, num_unroll_steps=K, td_steps=td, discount=0.9, num_actions=A,
                     value_fn=lambda obs: np.zeros(len(obs), np.float32), rng=np.random.default_rng(0))
    assert ref.actions.shape == (2, K) and ref.actions.dtype == np.int64
    for name in ("target_value", "target_reward", "target_policy", "value_mask", "reward_mask",
                 "policy_mask", "obs", "obs_mask"):
        np.testing.assert_array_equal(getattr(batch, name), getattr(ref, name), err_msg=name)


def test_action_dim_must_match_the_stored_actions():
    seg = continuous_segment(m=6, num_real=4, terminal=False, salt=0.0)
    with pytest.raises(ValueError, match="action_dim=0"):
        make_batch(sample_of([seg], [0]), num_unroll_steps=2, td_steps=2, discount=0.9, num_actions=2,
                   value_fn=lambda obs: np.zeros(len(obs), np.float32), rng=np.random.default_rng(0))


# ---------------------------------------------------------------------------------------------- the fast path


def numpy_value_targets(t_pos, stored, terminal, rewards, *, K: int, td: int, gamma: float, td_b=None):
    """The numpy definitions make_batch used before its kernels (they must agree bit for bit); ``td_b``
    [B]: per-sample horizons within the window ``td`` (default: all ``td``)."""
    i = t_pos[:, None] + np.arange(K + 1)[None, :]
    m = stored[:, None]
    horizon = np.full((len(t_pos), 1), td) if td_b is None else np.asarray(td_b)[:, None]
    n = np.clip(np.minimum(horizon, m - i), 0, None)
    windows = np.lib.stride_tricks.sliding_window_view(rewards, td, axis=1)[:, : K + 1]
    j = np.arange(td)
    reward_sum = np.sum(windows * (gamma**j) * (j[None, None, :] < n[:, :, None]), axis=-1)
    in_data = i < m
    boot_ok = in_data & ~((i + n == m) & terminal[:, None])
    step_in_data = i[:, :K] < m
    masks = [in_data | terminal[:, None], in_data, i <= m, step_in_data | terminal[:, None]]
    target_reward = (rewards[:, :K] * step_in_data).astype(np.float32)
    return reward_sum, n, boot_ok, [x.astype(np.float32) for x in masks], target_reward


@pytest.mark.parametrize("td,per_sample", [(1, False), (3, False), (8, False), (10, False), (50, False),
                                           (300, False), (10, True), (50, True)])
def test_value_target_kernel_equals_the_numpy_definition_bit_for_bit(td, per_sample):
    """``per_sample``: each sample its own horizon in 1..td (the off-policy correction's), else all td."""
    from muzero_tune.replay.target_kernels import value_targets

    rng = np.random.default_rng(td)
    B, K, gamma = 64, 5, 0.997
    stored = rng.integers(1, td + K + 4, size=B)
    t_pos = np.minimum(rng.integers(0, td + K + 4, size=B), stored - 1)
    terminal = rng.random(B) < 0.5
    # rewards of wildly different magnitudes, so a different summation order changes the last bits
    rewards = rng.normal(size=(B, K + td)) * 10.0 ** rng.integers(-3, 4, size=(B, K + td))
    rewards[np.arange(K + td)[None, :] >= (stored - t_pos)[:, None]] = 0.0  # zero past the data
    reward_sum = np.empty((B, K + 1))
    n = np.empty((B, K + 1), dtype=np.int64)
    boot_ok = np.empty((B, K + 1), dtype=bool)
    masks = np.zeros((4, B, K + 1), dtype=np.float32)
    target_reward = np.zeros((B, K), dtype=np.float32)
    td_b = rng.integers(1, td + 1, size=B) if per_sample else np.full(B, td)
    n_boot = value_targets(t_pos, stored, terminal, rewards, gamma ** np.arange(td), td_b, reward_sum, n,
                           boot_ok, masks, target_reward)  # fmt: skip
    want = numpy_value_targets(t_pos, stored, terminal, rewards, K=K, td=td, gamma=gamma, td_b=td_b)
    assert reward_sum.tobytes() == want[0].tobytes()  # bitwise, -0.0 included
    np.testing.assert_array_equal(n, want[1])
    np.testing.assert_array_equal(boot_ok, want[2])
    assert n_boot == int(want[2].sum()) > 0
    for got, exp in zip((masks[0], masks[1], masks[2], masks[3, :, :K]), want[3]):
        np.testing.assert_array_equal(got, exp)
    assert target_reward.tobytes() == want[4].tobytes()


def test_buffer_rows_give_the_batch_the_segments_give_through_evictions_and_moves():
    """Samples from the buffer's column blocks (rows) and the same samples gathered from the segments
    themselves build identical batches, after the blocks moved and segments were evicted; the segments'
    arrays stay their data; a reanalyze write-back into a segment is what the next batch reads."""
    import dataclasses

    from muzero_tune.replay.buffer import ReplayBuffer

    rng = np.random.default_rng(3)
    buf = ReplayBuffer(capacity_transitions=400)
    originals = {}
    for uid in range(1200):  # ~9,600 stored rows: the 4,096-row blocks move, old segments are evicted
        seg = random_segment(rng, 3)
        seg.stream_id, seg.policy_version = f"s{uid}", uid
        originals[uid] = (seg.rewards.copy(), seg.actions.copy(), seg.stats["child_visits"].copy(),
                          seg.frames.copy())  # fmt: skip
        buf.push([seg])
    assert buf.base_idx > 0 and buf._steps.moves > 0 and buf._ids.moves > 0
    for seg in buf.segments:
        r, a, v, f = originals[seg.policy_version]
        np.testing.assert_array_equal(seg.rewards, r)
        np.testing.assert_array_equal(seg.actions, a)
        np.testing.assert_array_equal(seg.stats["child_visits"], v)
        np.testing.assert_array_equal(seg.frames.materialize(), f)
        # views of the blocks as they are now (a stale view would miss later write-backs)
        assert np.shares_memory(seg.rewards, buf._steps.data["rewards"])
        assert np.shares_memory(seg.stats["child_visits"], buf._steps.data["stats.child_visits"])
        assert np.shares_memory(seg.frames.ids, buf._ids.data["ids"])

    def batch(sample, **kw):
        return make_batch(sample, num_unroll_steps=4, td_steps=5, discount=0.9, num_actions=3,
                          value_fn=lambda o: o.sum(axis=1).astype(np.float32), rng=np.random.default_rng(1),
                          **kw)  # fmt: skip

    sample = buf.sample(128, rng)
    assert sample.rows is not None
    fast, slow = batch(sample), batch(dataclasses.replace(sample, rows=None))
    for f in dataclasses.fields(fast):
        if f.name != "extras":
            np.testing.assert_array_equal(getattr(fast, f.name), getattr(slow, f.name), err_msg=f.name)
    seg, t = sample.segments[0], int(sample.positions[0])
    fresh = np.array([[0.25, 0.25, 0.5]], dtype=np.float32)
    reanalyze_positions([seg], np.array([t]), span=1, reanalyze_fn=lambda o, m: fresh)
    again = batch(sample)  # the same rows: the write-back went into the block through the segment's view
    np.testing.assert_array_equal(again.target_policy[0, 0], fresh[0])


@pytest.mark.parametrize("piece_rows", [0, 30, 7])
def test_deferred_bootstrap_resolves_to_the_same_targets_in_one_call_or_in_pieces(piece_rows):
    """A deferred bootstrap term asks ``value_fn`` for exactly the positions the immediate build asked, in
    one call or in consecutive pieces of ``piece_rows`` (``learn.bootstrap_piece_rows``); the targets are
    the same (this value_fn reads each row alone)."""
    import dataclasses

    from muzero_tune.replay.targets import resolve_bootstrap

    rng = np.random.default_rng(7)
    segs = [random_segment(rng, 2) for _ in range(30)]
    pos = [int(rng.integers(0, s.num_real)) for s in segs]
    value = RecordingValue()
    kw = dict(num_unroll_steps=4, td_steps=3, discount=0.9, num_actions=3, value_fn=value)
    now = make_batch(sample_of(segs, pos), rng=np.random.default_rng(1), **kw)
    asked_now = np.concatenate(value.calls)
    value.calls.clear()
    later = make_batch(sample_of(segs, pos), rng=np.random.default_rng(1), defer_bootstrap=True, **kw)
    assert not value.calls and np.isnan(later.target_value).all()
    n = len(later.bootstrap.obs)
    assert 30 < n < 30 * 5  # only positions that need one
    done = resolve_bootstrap(later, piece_rows)
    assert done.bootstrap is None
    rows = piece_rows or n
    assert [len(c) for c in value.calls] == [min(rows, n - lo) for lo in range(0, n, rows)]
    np.testing.assert_array_equal(np.concatenate(value.calls), asked_now)
    for f in dataclasses.fields(now):
        if f.name not in ("extras", "bootstrap"):
            np.testing.assert_array_equal(getattr(done, f.name), getattr(now, f.name), err_msg=f.name)


@pytest.mark.parametrize("preset", ["cartpole_muzero", "pong_muzero"])
def test_a_networks_bootstrap_values_in_pieces_match_one_call(preset):
    """The target network's values of N positions asked in pieces (``learn.bootstrap_piece_rows``) equal one
    call over all N to float32 rounding, for the MLP and the conv network (eval mode: each row alone; a
    matrix product may round a row by the rows beside it, which is why the split is configuration)."""
    import torch

    from muzero_tune.config import make_config
    from muzero_tune.models.layout import place_model
    from muzero_tune.pipeline.core import make_policy

    cfg = make_config(preset, overrides={"learn.batch_size": 8})
    policy, spec = make_policy(cfg)
    torch.manual_seed(0)
    model = place_model(policy.build_model(), device="cpu", channels_last=cfg.model.channels_last)
    obs_shape = spec.obs_shape
    gen = torch.Generator().manual_seed(1)
    obs = torch.rand((6 * 8, *obs_shape), generator=gen).mul(255 if len(obs_shape) == 3 else 1).numpy()
    obs = obs.astype(np.uint8) if len(obs_shape) == 3 else obs.astype(np.float32)
    fn = policy.value_fn(model)
    whole = fn(obs)
    pieces = np.concatenate([fn(obs[lo : lo + 8]) for lo in range(0, len(obs), 8)])
    np.testing.assert_allclose(pieces, whole, rtol=1e-6, atol=1e-5)


def test_a_segment_with_other_columns_warns_and_batches_still_build():
    """A segment whose columns differ from the first one's (here child_visits as float64) switches the buffer
    to gathering from the segments, says so once, naming the column, and the batch holds the same values
    as a buffer of uniform segments."""
    import warnings

    from muzero_tune.replay.buffer import ReplayBuffer

    rng = np.random.default_rng(5)
    segs = [random_segment(rng, 2) for _ in range(6)]
    uniform, mixed = ReplayBuffer(capacity_transitions=1000), ReplayBuffer(capacity_transitions=1000)
    uniform.push([_copy_segment(s) for s in segs])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, s in enumerate(segs):
            s = _copy_segment(s)
            if i >= 3:
                s.stats["child_visits"] = s.stats["child_visits"].astype(np.float64)
            mixed.push([s])
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1, messages
    assert "stats.child_visits" in messages[0] and "<f8" in messages[0] and "<f4" in messages[0]

    def batch(buf):
        sample = buf.sample(64, np.random.default_rng(2))
        return sample, make_batch(sample, num_unroll_steps=3, td_steps=4, discount=0.9, num_actions=3,
                                  value_fn=lambda o: o.sum(axis=1).astype(np.float32),
                                  rng=np.random.default_rng(1))  # fmt: skip

    (s_u, b_u), (s_m, b_m) = batch(uniform), batch(mixed)
    assert s_u.rows is not None and s_m.rows is None
    np.testing.assert_array_equal(s_u.flat_index, s_m.flat_index)
    for name in ("obs", "actions", "target_value", "target_reward", "target_policy", "value_mask",
                 "reward_mask", "policy_mask", "obs_mask", "weights"):  # fmt: skip
        np.testing.assert_array_equal(getattr(b_u, name), getattr(b_m, name), err_msg=name)


def _copy_segment(seg: GameSegment) -> GameSegment:
    """A deep copy of a fresh (not pushed) segment's arrays: pushing re-points a segment at the buffer."""
    import copy

    return copy.deepcopy(seg)


# --------------------------------------------------------------------------- past steps (context_steps)


def episode_segment(*, ep: int, step0: int, num_real: int, m: int, fs: int = 2) -> GameSegment:
    """A segment of stream "s", episode ``ep``, from episode step ``step0``: the frame of episode step e is
    [100 (ep + 1) + e, -1] (reset copies of step 0 before it), the action at e is 10 ep + e % 10."""
    e = np.maximum(np.arange(step0 - (fs - 1), step0 + m + 1), 0)
    frames = np.stack([100.0 * (ep + 1) + e, -np.ones(len(e))], axis=1).astype(np.float32)
    steps = np.arange(step0, step0 + m)
    return GameSegment(
        frames=frames,
        actions=(10 * ep + steps % 10).astype(np.int64),
        rewards=np.ones(m, np.float32),
        stats={"child_visits": visits_for(m), "legal_mask": np.ones((m, A), dtype=bool)},
        num_real=num_real,
        frame_stack=fs,
        done=num_real == m,
        terminal_at_end=False,
        stream_id="s",
        episode_index=ep,
        episode_step0=step0,
    )


def stacked(ep: int, e: int) -> np.ndarray:
    """The stacked observation (frame stack 2) at episode step ``e`` of episode ``ep``."""
    base = 100.0 * (ep + 1)
    return np.array([base + max(e - 1, 0), -1.0, base + e, -1.0], np.float32)


def expected_past(ep: int, e: int, h: int):
    """(obs [h, 4], actions [h], valid [h]) of the h steps before episode step e, cut at the episode start."""
    steps = np.arange(e - h, e)
    valid = steps >= 0
    obs = np.stack([stacked(ep, s) if s >= 0 else np.zeros(4, np.float32) for s in steps])
    return obs, np.where(valid, 10 * ep + steps % 10, 0), valid


class RecordingPastValue:
    """value(obs, past) = last frame's first element; records the past steps it was given."""

    def __init__(self):
        self.obs: list[np.ndarray] = []
        self.past: list = []

    def __call__(self, obs: np.ndarray, past) -> np.ndarray:
        self.obs.append(obs.copy())
        self.past.append(past)
        return obs[:, 2].astype(np.float32)


@pytest.mark.parametrize("from_buffer", [True, False])
def test_past_steps_reach_into_the_previous_segment_and_stop_at_the_episode_start(from_buffer):
    """With context_steps H = 3 every bootstrap and reanalyze position p comes with o_{p-3}..o_{p-1} and the
    actions taken there: across a segment start (read from the stream's previous segment of the episode),
    never across an episode start, in the order value_fn is asked (also in deferred pieces); H = 0 passes
    nothing. From the buffer's rows and from hand-built samples (rows_of_segments) alike."""
    import dataclasses

    from muzero_tune.replay.buffer import ReplayBuffer
    from muzero_tune.replay.targets import resolve_bootstrap

    h, K, td = 3, 2, 2
    a = episode_segment(ep=0, step0=0, num_real=4, m=8)  # 4 real + 4 padding (the next segment's start)
    b = episode_segment(ep=0, step0=4, num_real=4, m=4)
    c = episode_segment(ep=1, step0=0, num_real=4, m=4)  # the next episode of the same stream
    segs, pos = [a, b, b, c, c], [3, 0, 2, 0, 1]
    sample = sample_of(segs, pos)
    if from_buffer:
        buf = ReplayBuffer(capacity_transitions=100)
        buf.push([a, b, c])
        sample = dataclasses.replace(sample, rows=buf.step_rows(np.array([0, 1, 1, 2, 2])))
    kw = dict(num_unroll_steps=K, td_steps=td, discount=0.9, num_actions=A)
    value = RecordingPastValue()
    asked = []
    fresh = lambda o, m, past: asked.append((o.copy(), past)) or visits_for(len(o))  # noqa: E731
    batch = make_batch(sample, value_fn=value, rng=np.random.default_rng(0), context_steps=h,
                       reanalyze_count=len(segs), reanalyze_fn=fresh, **kw)  # fmt: skip
    for obs, past in [(value.obs[0], value.past[0]), asked[0]]:
        assert past.obs.shape == (len(obs), h, 4) and past.actions.shape == (len(obs), h)
        for n in range(len(obs)):
            ep, e = int(obs[n, 2] // 100) - 1, int(obs[n, 2] % 100)  # the position's own episode and step
            want_obs, want_act, want_valid = expected_past(ep, e, h)
            np.testing.assert_array_equal(past.valid[n], want_valid, err_msg=f"ep {ep} step {e}")
            np.testing.assert_array_equal(past.obs[n], want_obs, err_msg=f"ep {ep} step {e}")
            np.testing.assert_array_equal(past.actions[n], want_act, err_msg=f"ep {ep} step {e}")
    # reanalyze asked t..t+K of each sample; b's position 0 (episode step 4) has all three steps, c's none
    re_obs, re_past = asked[0]
    assert len(re_obs) == sum(min(t + K + 1, s.num_stored) - t for s, t in zip(segs, pos))
    assert re_past.valid[re_obs[:, 2] == 104.0].all() and not re_past.valid[re_obs[:, 2] == 200.0].any()
    # deferred, in pieces: the same positions and past steps, piece by piece
    later = RecordingPastValue()
    deferred = make_batch(sample, value_fn=later, rng=np.random.default_rng(0), context_steps=h,
                          defer_bootstrap=True, **kw)  # fmt: skip
    done = resolve_bootstrap(deferred, piece_rows=4)
    np.testing.assert_array_equal(done.target_value, batch.target_value)
    assert [len(o) for o in later.obs] == [len(p.valid) for p in later.past] and len(later.obs) > 1
    np.testing.assert_array_equal(np.concatenate([p.obs for p in later.past]), value.past[0].obs)
    np.testing.assert_array_equal(np.concatenate([p.valid for p in later.past]), value.past[0].valid)
    # H = 0: value_fn gets the observations alone, as it always did
    alone = RecordingValue()
    make_batch(sample, value_fn=alone, rng=np.random.default_rng(0), **kw)
    np.testing.assert_array_equal(np.concatenate(alone.calls), value.obs[0])


def test_past_steps_stop_where_the_previous_segment_was_evicted():
    """A segment whose previous segment left the buffer has no steps before its position 0."""
    from muzero_tune.replay.buffer import ReplayBuffer
    from muzero_tune.replay.targets import past_steps

    a = episode_segment(ep=0, step0=0, num_real=4, m=8)
    b = episode_segment(ep=0, step0=4, num_real=4, m=4)
    buf = ReplayBuffer(capacity_transitions=8)
    buf.push([a, b])
    held = past_steps(buf.step_rows(np.array([1, 1])), np.array([0, 2]), np.array([0, 1]), 3)
    np.testing.assert_array_equal(held.valid, [[1, 1, 1], [1, 1, 1]])
    buf.push([episode_segment(ep=1, step0=0, num_real=4, m=4)])  # a is evicted
    assert buf.base_idx == 1
    cut = past_steps(buf.step_rows(np.array([1, 1])), np.array([0, 2]), np.array([0, 1]), 3)
    np.testing.assert_array_equal(cut.valid, [[0, 0, 0], [0, 1, 1]])
    np.testing.assert_array_equal(cut.obs[1, 1:], held.obs[1, 1:])
    assert (cut.obs[0] == 0).all() and (cut.actions[0] == 0).all()
