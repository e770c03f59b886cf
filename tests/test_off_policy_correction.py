"""EfficientZero's off-policy correction: the buffer reports each sample's age, the age shortens its n-step
horizon (hand-computed), the batch's value targets follow each sample's own horizon (against the plain
per-element loop of ``test_targets``), and the config switches it through every policy's make_batch."""

from __future__ import annotations

import numpy as np
import pytest

from muzero_tune.config import ConfigError, make_config
from muzero_tune.pipeline.collector import SegmentCollector
from muzero_tune.pipeline.core import make_policy
from muzero_tune.replay.buffer import ReplayBuffer
from muzero_tune.replay.targets import make_batch, off_policy_td_steps
from tests.test_targets import loop_targets, random_samples, random_segment, sample_of


def test_horizon_shrinks_by_one_per_age_step_down_to_the_minimum():
    ages = np.array([0, 99, 100, 250, 450, 10_000])
    got = off_policy_td_steps(ages, td_steps=5, td_steps_min=2, transitions_per_step=100)
    np.testing.assert_array_equal(got, [5, 5, 4, 3, 2, 2])
    assert off_policy_td_steps(ages, td_steps=5, td_steps_min=2, transitions_per_step=0) == 5  # off
    assert off_policy_td_steps(None, td_steps=5, td_steps_min=2, transitions_per_step=100) == 5  # unknown


def test_buffer_ages_count_the_transitions_pushed_after_each_sample():
    rng = np.random.default_rng(0)
    buf = ReplayBuffer(capacity_transitions=10_000)
    segs = [random_segment(rng, 1) for _ in range(6)]
    for seg in segs:
        buf.push([seg])
    total = sum(s.num_real for s in segs)
    sample = buf.sample(64, np.random.default_rng(1))
    # the sample's own segment and position say how many real transitions came after it
    after = {id(s): sum(x.num_real for x in segs[i + 1:]) for i, s in enumerate(segs)}
    want = [after[id(seg)] + seg.num_real - 1 - int(t) for seg, t in zip(sample.segments, sample.positions)]
    np.testing.assert_array_equal(sample.age_transitions, want)
    assert sample.age_transitions.min() >= 0 and sample.age_transitions.max() <= total - 1


@pytest.mark.parametrize("frame_stack", [1, 3])
def test_per_sample_horizons_give_each_sample_its_own_n_step_targets(frame_stack):
    rng = np.random.default_rng(7 + frame_stack)
    K, gamma = 4, 0.9
    segs, pos, value = random_samples(rng, frame_stack, 60)
    td_b = rng.integers(1, 7, size=len(segs))
    batch = make_batch(sample_of(segs, pos), num_unroll_steps=K, td_steps=td_b, discount=gamma,
                       num_actions=3, value_fn=value, rng=np.random.default_rng(1))  # fmt: skip
    for b, (seg, t) in enumerate(zip(segs, pos)):
        tv, vm = loop_targets(seg, t, K=K, td=int(td_b[b]), gamma=gamma, value=value)[:2]
        np.testing.assert_allclose(batch.target_value[b], tv, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(batch.value_mask[b], vm)
    # one horizon for all equals the int form, bit for bit
    same = make_batch(sample_of(segs, pos), num_unroll_steps=K, td_steps=np.full(len(segs), 4),
                      discount=gamma, num_actions=3, value_fn=value, rng=np.random.default_rng(1))
    plain = make_batch(sample_of(segs, pos), num_unroll_steps=K, td_steps=4, discount=gamma,
                       num_actions=3, value_fn=value, rng=np.random.default_rng(1))  # fmt: skip
    assert same.target_value.tobytes() == plain.target_value.tobytes()


@pytest.mark.parametrize("ptype", ["muzero", "muzero_rnn_full_obs"])
def test_the_config_shortens_old_samples_targets_through_the_policy(ptype):
    """A buffer of CartPole-like segments; with the correction on, the policy's batch equals make_batch
    with the hand-derived per-sample horizons, and differs from the uncorrected batch."""
    common = {"policy.type": ptype, "replay.td_steps": 6, "model.hidden_dim": 16, "model.latent_dim": 8,
              "mcts.num_simulations": 2, "replay.game_segment_length": 10}
    on = make_config(overrides={**common, "replay.off_policy_transitions_per_step": 10,
                                "replay.td_steps_min": 2})  # fmt: skip
    pol_on, spec = make_policy(on)
    pol_off, _ = make_policy(make_config(overrides=common))
    sample = _cartpole_sample(pol_on, spec)
    horizon = pol_on.td_steps_of(sample)
    np.testing.assert_array_equal(horizon, np.clip(6 - sample.age_transitions // 10, 2, 6))
    assert horizon.min() == 2 and horizon.max() == 6
    assert pol_off.td_steps_of(sample) == 6
    model = pol_on.build_model()
    got = pol_on.make_batch(sample, target_model=model, rng=np.random.default_rng(0))
    uncorrected = pol_off.make_batch(sample, target_model=model, rng=np.random.default_rng(0))
    assert not np.allclose(got.target_value, uncorrected.target_value)
    if ptype == "muzero":
        want = make_batch(sample, num_unroll_steps=on.replay.num_unroll_steps, td_steps=horizon,
                          discount=on.mcts.discount, num_actions=spec.num_actions,
                          value_fn=pol_on.value_fn(model), rng=np.random.default_rng(0))  # fmt: skip
        np.testing.assert_array_equal(got.target_value, want.target_value)


def _cartpole_sample(policy, spec):
    """Segments collected by the policy's own collector on CartPole (so every policy's stats are there)."""
    collector = SegmentCollector(policy.cfg, policy, spec, seed=0, num_envs=3)
    model = policy.build_model()
    buf = ReplayBuffer(capacity_transitions=100_000)
    while buf.num_transitions < 200:
        buf.push(list(collector.collect(model, temperature=1.0).segments))
    collector.close()
    return buf.sample(128, np.random.default_rng(2))


def test_a_minimum_above_the_horizon_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"replay.td_steps_min.*must be <= replay.td_steps \(5\)"):
        make_config(overrides={"replay.td_steps": 5, "replay.td_steps_min": 6,
                               "replay.off_policy_transitions_per_step": 100})  # fmt: skip
    make_config(overrides={"replay.td_steps": 5, "replay.td_steps_min": 6})  # off: not checked
