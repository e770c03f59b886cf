"""ReplayBuffer: flat-index alignment through push / evict / sample / write-back, whole-segment eviction,
importance weights, priorities at push, stale write-backs, uniform and prioritized sampling frequencies,
and the state_dict round trip.

Every transition carries a unique id in its reward (``1000 * uid + position``), so any flat index can be
checked against the transition it was pushed for.
"""

from __future__ import annotations

import numpy as np
import pytest

from muzero_tune.replay.buffer import ReplayBuffer
from muzero_tune.replay.segment import GameSegment

NUM_ACTIONS = 3


def tid(uid: int, pos: int) -> float:
    return float(1000 * uid + pos)


def make_segment(uid: int, num_real: int, pad: int = 4, priorities=None,
                 terminal: bool = False) -> GameSegment:
    m = num_real + pad
    rewards = np.array([tid(uid, i) for i in range(m)], dtype=np.float32)
    frames = np.stack([np.array([uid, i], dtype=np.float32) for i in range(m + 1)])
    visits = np.full((m, NUM_ACTIONS), 1.0 / NUM_ACTIONS, dtype=np.float32)
    return GameSegment(
        frames=frames,
        actions=np.arange(m, dtype=np.int64) % NUM_ACTIONS,
        rewards=rewards,
        stats={"child_visits": visits, "legal_mask": np.ones((m, NUM_ACTIONS), dtype=bool)},
        num_real=num_real,
        frame_stack=1,
        done=terminal,
        terminal_at_end=terminal,
        env_id=uid % 4,
        episode_step0=3 * uid,
        policy_version=uid,
        priorities=None if priorities is None else np.asarray(priorities, dtype=np.float32),
    )


def unique_priorities(uid: int, n: int) -> np.ndarray:
    return np.array([0.5 + uid + 0.01 * i for i in range(n)], dtype=np.float32)


class Reference:
    """The expected flat layout, maintained independently: (uid, pos, priority) per real transition."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.segs: list[tuple[int, int]] = []  # (uid, num_real), oldest first
        self.rows: list[list] = []  # [uid, pos, priority]

    def push(self, uid: int, n: int, pri) -> list[int]:
        self.segs.append((uid, n))
        self.rows += [[uid, i, float(pri[i])] for i in range(n)]
        evicted = []
        while len(self.rows) > self.capacity:
            u, k = self.segs.pop(0)
            evicted.append(u)
            del self.rows[:k]
        return evicted


def check_alignment(buf: ReplayBuffer, ref: Reference) -> None:
    assert buf.num_transitions == len(ref.rows) <= buf.capacity_transitions
    assert [int(s.policy_version) for s in buf.segments] == [u for u, _ in ref.segs]
    flat = np.arange(buf.num_transitions)
    g, pos = buf.lookup(flat)
    ids = np.array([buf.segment(int(gi)).rewards[int(p)] for gi, p in zip(g, pos)])
    np.testing.assert_array_equal(ids, [tid(u, p) for u, p, _ in ref.rows])
    np.testing.assert_array_equal(pos, [p for _, p, _ in ref.rows])
    np.testing.assert_allclose(buf.priorities, [r[2] for r in ref.rows], rtol=1e-6)
    # positions index real transitions only
    assert all(int(p) < buf.segment(int(gi)).num_real for gi, p in zip(g, pos))


def test_alignment_through_push_evict_sample_writeback():
    rng = np.random.default_rng(0)
    cap = 60
    buf = ReplayBuffer(capacity_transitions=cap, alpha=0.6, beta=0.4)
    ref = Reference(cap)
    sizes = [7, 10, 3, 10, 1, 9, 10, 4, 10, 10, 2, 8, 10, 5, 10, 6, 10, 10]
    total_evicted = 0
    for uid, n in enumerate(sizes):
        pri = unique_priorities(uid, n)
        before_clock = buf.clock
        evicted = ref.push(uid, n, pri)
        added = buf.push([make_segment(uid, n, priorities=pri)])
        assert added == n
        total_evicted += sum(sizes[u] for u in evicted)
        assert buf.evicted_transitions == total_evicted
        # eviction drops the minimal number of whole oldest segments
        if evicted:
            assert buf.clock == before_clock + 1 and buf.clear_time == buf.clock
            assert buf.num_transitions + sizes[evicted[-1]] > cap
        else:
            assert buf.clock == before_clock
        assert buf.base_idx == len(sizes[: uid + 1]) - len(ref.segs)
        check_alignment(buf, ref)

        # sample: returned segments / positions are the ones the flat indices name
        s = buf.sample(16, rng)
        g, pos = buf.lookup(s.flat_index)
        np.testing.assert_array_equal(s.positions, pos)
        for b in range(16):
            u, p, _ = ref.rows[int(s.flat_index[b])]
            assert s.segments[b].rewards[s.positions[b]] == tid(u, p)
            assert s.segments[b] is buf.segment(int(g[b]))
        # write-back (fresh: no eviction since the sample) lands on the sampled transitions
        new = rng.uniform(0.1, 5.0, size=16)
        assert buf.update_priorities(s.flat_index, new, s.make_time) == 16
        for b in range(16):  # sequential semantics: a duplicated index keeps the last value
            ref.rows[int(s.flat_index[b])][2] = float(new[b])
        check_alignment(buf, ref)
    assert buf.base_idx > 3  # the run did evict several times


def test_eviction_drops_whole_oldest_segments():
    buf = ReplayBuffer(capacity_transitions=20)
    segs = [make_segment(u, n) for u, n in enumerate([8, 8, 8])]
    buf.push(segs[:2])
    assert buf.num_transitions == 16 and buf.base_idx == 0
    buf.push([segs[2]])  # 24 > 20: drop the oldest segment (8) -> 16
    assert buf.num_transitions == 16 and buf.base_idx == 1
    assert buf.segments == segs[1:]
    buf.push([make_segment(3, 13)])  # 29 > 20: dropping 8 leaves 21 > 20, so drop two -> 13
    assert buf.num_transitions == 13 and buf.base_idx == 3 and buf.evicted_transitions == 24
    g, pos = buf.lookup(np.arange(13))
    np.testing.assert_array_equal(g, np.full(13, 3))
    np.testing.assert_array_equal(pos, np.arange(13))


def test_importance_weights_recomputed_independently():
    rng = np.random.default_rng(1)
    alpha, beta = 0.7, 0.5
    buf = ReplayBuffer(capacity_transitions=1000, alpha=alpha, beta=beta)
    for uid in range(6):
        buf.push([make_segment(uid, 5 + uid, priorities=rng.uniform(0.05, 3.0, size=5 + uid))])
    pri = buf.priorities.copy()
    n = len(pri)
    for _ in range(5):
        s = buf.sample(32, rng)
        p = pri**alpha / np.sum(pri**alpha)
        w = (n * p[s.flat_index]) ** (-beta)
        w = w / w.max()
        np.testing.assert_allclose(s.weights, w, rtol=1e-5)
        assert s.weights.max() == pytest.approx(1.0)
        assert s.weights.dtype == np.float32 and s.weights.shape == (32,)
        # weights differ across the batch (a constant array would also pass the max == 1 check)
        assert len(np.unique(s.flat_index)) > 1 and np.ptp(s.weights) > 0


def test_push_priorities_and_max_priority_for_new_data():
    buf = ReplayBuffer(capacity_transitions=1000)
    buf.push([make_segment(0, 4)])  # empty buffer, no priorities: 1.0
    np.testing.assert_array_equal(buf.priorities, np.ones(4))
    given = np.array([0.3, 2.5, 0.7], dtype=np.float32)
    buf.push([make_segment(1, 3, priorities=given)])
    np.testing.assert_allclose(buf.priorities[4:], given)
    buf.push([make_segment(2, 2)])  # no priorities: the current max (2.5)
    np.testing.assert_allclose(buf.priorities[7:], [2.5, 2.5])
    s = buf.sample(4, np.random.default_rng(0))
    buf.update_priorities(np.array([0]), np.array([9.0]), s.make_time)
    buf.push([make_segment(3, 3), make_segment(4, 2, priorities=[0.1, 0.2])])
    np.testing.assert_allclose(buf.priorities[9:], [9.0, 9.0, 9.0, 0.1, 0.2], rtol=1e-6)


def test_stale_writeback_dropped_fresh_applied():
    rng = np.random.default_rng(2)
    buf = ReplayBuffer(capacity_transitions=30)
    for uid in range(3):
        buf.push([make_segment(uid, 10, priorities=unique_priorities(uid, 10))])
    old = buf.sample(8, rng)
    # a push without eviction does not make the sample stale
    s_ok = buf.sample(8, rng)
    assert buf.update_priorities(s_ok.flat_index, np.full(8, 4.0), s_ok.make_time) == 8
    buf.push([make_segment(3, 10, priorities=unique_priorities(3, 10))])  # evicts segment 0
    assert buf.base_idx == 1
    before = buf.priorities.copy()
    assert buf.update_priorities(old.flat_index, np.full(8, 77.0), old.make_time) == 0
    np.testing.assert_array_equal(buf.priorities, before)
    fresh = buf.sample(8, rng)
    assert fresh.make_time >= buf.clear_time
    vals = np.arange(8, dtype=np.float64) + 10.0
    assert buf.update_priorities(fresh.flat_index, vals, fresh.make_time) == 8
    expect = before.copy()
    for b in range(8):
        expect[fresh.flat_index[b]] = vals[b]
    np.testing.assert_array_equal(buf.priorities, expect)
    with pytest.raises(ValueError):
        buf.update_priorities(fresh.flat_index[:1], np.array([np.nan]), fresh.make_time)


def _chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    return float(np.sum((counts - expected) ** 2 / expected))


def test_uniform_sampling_without_priority():
    rng = np.random.default_rng(3)
    buf = ReplayBuffer(capacity_transitions=1000, use_priority=False)
    buf.push([make_segment(0, 10, priorities=np.geomspace(0.01, 100, 10)), make_segment(1, 10)])
    n = buf.num_transitions
    counts = np.zeros(n)
    for _ in range(20):
        s = buf.sample(1000, rng)
        np.testing.assert_array_equal(s.weights, np.ones(1000, dtype=np.float32))
        counts += np.bincount(s.flat_index, minlength=n)
    # df = 19: P(chi2 > 60) < 1e-5; a 100:1 priority skew would give a chi2 in the thousands
    assert _chi2(counts, np.full(n, 1.0 / n)) < 60


def test_sampling_follows_priority_alpha():
    rng = np.random.default_rng(4)
    alpha = 0.6
    buf = ReplayBuffer(capacity_transitions=1000, alpha=alpha)
    pri = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 0.5, 3.0, 10.0])
    buf.push([make_segment(0, 8, priorities=pri)])
    counts = np.zeros(8)
    for _ in range(20):
        counts += np.bincount(buf.sample(1000, rng).flat_index, minlength=8)
    expect = pri**alpha / np.sum(pri**alpha)
    assert _chi2(counts, expect) < 35  # df = 7
    # alpha matters: the frequencies are far from both uniform and proportional-to-priority
    assert _chi2(counts, np.full(8, 1 / 8)) > 200
    assert _chi2(counts, pri / pri.sum()) > 200


def test_state_dict_round_trip():
    rng = np.random.default_rng(5)
    buf = ReplayBuffer(capacity_transitions=25, alpha=0.8, beta=0.3)
    for uid in range(5):
        pri = unique_priorities(uid, 4 + uid)
        buf.push([make_segment(uid, 4 + uid, priorities=pri, terminal=uid % 2 == 0)])
    stale = buf.sample(6, rng)
    buf.push([make_segment(9, 6)])  # evicts: stale becomes stale
    s = buf.sample(6, rng)
    buf.update_priorities(s.flat_index, np.linspace(1, 3, 6), s.make_time)
    assert buf.base_idx >= 1
    state = buf.state_dict()

    other = ReplayBuffer(capacity_transitions=25, alpha=0.8, beta=0.3)
    other.push([make_segment(50, 3)])  # a non-empty buffer is replaced entirely
    other.load_state_dict(state)
    assert other.num_segments == buf.num_segments and other.base_idx == buf.base_idx
    for a, b in zip(buf.segments, other.segments):
        for name in ("frames", "actions", "rewards"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        for k in a.stats:
            np.testing.assert_array_equal(a.stats[k], b.stats[k])
        for name in ("num_real", "frame_stack", "done", "terminal_at_end", "env_id", "episode_step0",
                     "policy_version"):
            assert getattr(a, name) == getattr(b, name)
    np.testing.assert_array_equal(other.priorities, buf.priorities)
    flat = np.arange(buf.num_transitions)
    for x, y in zip(buf.lookup(flat), other.lookup(flat)):
        np.testing.assert_array_equal(x, y)
    for name in ("clock", "clear_time", "pushed_transitions", "evicted_transitions", "pushed_segments"):
        assert getattr(other, name) == getattr(buf, name), name
    # a write-back drawn before the eviction is still stale after loading
    assert other.update_priorities(stale.flat_index, np.full(6, 5.0), stale.make_time) == 0
    # identical draws from identical states
    a, b = buf.sample(32, np.random.default_rng(9)), other.sample(32, np.random.default_rng(9))
    np.testing.assert_array_equal(a.flat_index, b.flat_index)
    np.testing.assert_array_equal(a.weights, b.weights)
    assert a.make_time == b.make_time
    # global indices keep counting from where they were after more pushes
    other.push([make_segment(10, 20)])
    buf.push([make_segment(10, 20)])
    assert other.base_idx == buf.base_idx
    assert other.num_transitions == buf.num_transitions
    flat = np.arange(buf.num_transitions)
    for x, y in zip(buf.lookup(flat), other.lookup(flat)):
        np.testing.assert_array_equal(x, y)


def test_continuous_actions_through_push_sample_and_a_checkpoint(tmp_path):
    """[M, D] float32 actions survive push, sampling and the buffer state written into a checkpoint
    (tensors, ``torch.load(weights_only=True)``), bit for bit."""
    import torch

    from muzero_tune.runs.checkpoint import to_numpy_tree, to_torch_tree

    rng = np.random.default_rng(1)
    buf = ReplayBuffer(capacity_transitions=100)
    segs = []
    for uid in range(4):
        seg = make_segment(uid, 5 + uid)
        seg.actions = rng.uniform(-1, 1, size=(seg.num_stored, 2)).astype(np.float32)
        segs.append(seg)
    buf.push(segs)
    sample = buf.sample(16, rng)
    for seg, pos in zip(sample.segments, sample.positions):
        assert seg.actions.shape == (seg.num_stored, 2) and seg.actions.dtype == np.float32
        assert pos < seg.num_real
    torch.save(to_torch_tree(buf.state_dict()), tmp_path / "buf.pt")
    state = to_numpy_tree(torch.load(tmp_path / "buf.pt", weights_only=True))
    other = ReplayBuffer(capacity_transitions=100)
    other.load_state_dict(state)
    for a, b in zip(buf.segments, other.segments):
        assert b.actions.dtype == np.float32
        np.testing.assert_array_equal(a.actions, b.actions)


def test_cached_priority_powers_give_exactly_the_probabilities_of_the_priorities():
    """priority ** alpha is kept in step with the priorities (push, write-back with repeated indices,
    eviction, a state_dict round trip): the probabilities are bit-identical to computing it afresh."""
    rng = np.random.default_rng(0)
    buf = ReplayBuffer(capacity_transitions=40, alpha=0.6)

    def fresh(b):
        p = b.priorities**b.alpha
        return p / p.sum()

    for uid in range(30):
        buf.push([make_segment(uid, int(rng.integers(1, 8)), priorities=None if uid % 2 else
                               rng.random(8) * 10.0 ** rng.integers(-3, 3))])  # fmt: skip
        s = buf.sample(16, rng)
        idx = np.concatenate([s.flat_index, s.flat_index[:4]])  # repeated indices: the last write stays
        buf.update_priorities(idx, rng.random(20) * 5, s.make_time)
        assert buf.probabilities().tobytes() == fresh(buf).tobytes()
    assert buf.evicted_transitions > 0
    other = ReplayBuffer(capacity_transitions=40, alpha=0.6)
    other.load_state_dict(buf.state_dict())
    assert other.probabilities().tobytes() == fresh(buf).tobytes()


def _check_tree(arr) -> None:
    """Every inner node is exactly the sum of its children; leaves outside the live window are 0."""
    tree, cap = arr._tree, arr._tree.size // 2
    np.testing.assert_array_equal(tree[1:cap], tree[2:2 * cap:2] + tree[3:2 * cap:2])
    leaves = np.zeros(cap)
    leaves[arr._lo : arr._hi] = arr.view
    np.testing.assert_array_equal(tree[cap:], leaves)


@pytest.mark.parametrize("use_priority", [True, False])
def test_sum_tree_draw_is_numpy_choice_through_push_evict_writeback_growth_and_reload(use_priority):
    """The O(B log N) draw consumes the generator as ``rng.choice(n, p=P)`` did and returns the same flat
    indices and bit-identical weights, while pushes evict, write-backs repeat indices, the storage grows and
    is compacted (past its first 1,024 slots), and after a state_dict round trip."""
    rng = np.random.default_rng(7)
    buf = ReplayBuffer(capacity_transitions=1500, alpha=0.6, beta=0.4, use_priority=use_priority)
    draws = 0
    for uid in range(260):
        buf.push([make_segment(uid, int(rng.integers(1, 20)), priorities=None if uid % 3 == 0 else
                               rng.random(20) * 10.0 ** rng.integers(-3, 3))])  # fmt: skip
        seed = int(rng.integers(1 << 30))
        expect_flat, expect_w = buf.choice_draw(64, np.random.default_rng(seed))
        drawn = np.random.default_rng(seed)
        s = buf.sample(64, drawn)
        np.testing.assert_array_equal(s.flat_index, expect_flat)
        assert s.weights.tobytes() == expect_w.tobytes()
        # the generator is left where choice left it
        assert drawn.random() == np.random.default_rng(seed).random(65)[-1]
        draws += 64
        if use_priority:
            idx = np.concatenate([s.flat_index, s.flat_index[:5]])
            buf.update_priorities(idx, rng.random(69) * 3.0, s.make_time)
        _check_tree(buf._pri_alpha)
    assert buf.evicted_transitions > 1024 and buf.pushed_transitions > 2048  # evicted, grown, compacted
    other = ReplayBuffer(capacity_transitions=1500, alpha=0.6, beta=0.4, use_priority=use_priority)
    other.load_state_dict(buf.state_dict())
    _check_tree(other._pri_alpha)
    for seed in range(20):
        np.testing.assert_array_equal(
            other.sample(256, np.random.default_rng(seed)).flat_index,
            buf.choice_draw(256, np.random.default_rng(seed))[0],
        )
