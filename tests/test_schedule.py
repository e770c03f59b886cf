"""The drivers' decision functions, as tables."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from muzero_tune.pipeline import schedule as s


@pytest.mark.parametrize(
    "real,fixed,ratio,carry,expected",
    [
        (400, None, 0.25, 0.0, (100, 0.0)),
        (3, None, 0.25, 0.0, (0, 0.75)),  # below one step: owed to the next collect, not rounded up to 1
        (3, None, 0.25, 0.5, (1, 0.25)),
        (0, None, 0.25, 0.0, (0, 0.0)),
        (15, None, 0.1, 0.0, (1, 0.5)),
        (15, None, 0.1, 0.5, (2, 0.0)),
        (100, None, 0.57, 0.0, (57, 0.0)),  # 100 * 0.57 is 56.999... in floats
        (400, 7, 0.25, 0.5, (7, 0.5)),  # update_per_collect fixed: the carry passes through
        (1000, None, 1.0, 0.0, (1000, 0.0)),
    ],
)
def test_update_per_collect(real, fixed, ratio, carry, expected):
    steps, left = s.update_per_collect(real_transitions=real, fixed=fixed, replay_ratio=ratio, carry=carry)
    assert steps == expected[0] and left == pytest.approx(expected[1], abs=1e-12)


@pytest.mark.parametrize(
    "per_collect,ratio,collects",
    [(15, 0.1, 1000), (3, 0.25, 999), (7, 0.3, 1001), (1, 1e-3, 2500), (20, 0.57, 300), (9, 2.5, 50)],
)
def test_replay_ratio_fractions_add_up_over_collects(per_collect, ratio, collects):
    """The steps granted over many collects are floor(ratio x total transitions), exactly."""
    carry, total, granted = 0.0, 0, []
    for _ in range(collects):
        steps, carry = s.update_per_collect(
            real_transitions=per_collect, fixed=None, replay_ratio=ratio, carry=carry
        )
        total += per_collect
        granted.append(steps)
        assert 0.0 <= carry < 1.0
    assert sum(granted) == math.floor(Fraction(str(ratio)) * total)
    if (per_collect, ratio) == (15, 0.1):
        assert granted[:4] == [1, 2, 1, 2]


@pytest.mark.parametrize(
    "env_steps,n,start,min_n,expected",
    [
        (0, 0, 0, 256, False),
        (100, 255, 0, 256, False),
        (100, 256, 0, 256, True),
        (1999, 5000, 2000, 256, False),
        (2000, 5000, 2000, 256, True),
    ],
)
def test_can_train(env_steps, n, start, min_n, expected):
    assert (
        s.can_train(
            env_steps=env_steps, num_transitions=n, train_start_after_envsteps=start, min_transitions=min_n
        )
        is expected
    )


@pytest.mark.parametrize(
    "train_iter,last,freq,at_start,expected",
    [
        (0, None, 5, False, False),
        (4, None, 5, False, False),
        (5, None, 5, False, True),
        (5, 5, 5, False, False),
        (10, 5, 5, False, True),
        (0, None, 5, True, True),
        (3, None, 5, True, False),
    ],
)
def test_should_eval(train_iter, last, freq, at_start, expected):
    assert (
        s.should_eval(train_iter=train_iter, last_eval_iter=last, eval_freq=freq, eval_at_start=at_start)
        is expected
    )


@pytest.mark.parametrize(
    "current,last,interval,lag,force,expected",
    [
        (0, None, 1, 0, False, True),  # first publish
        (5, 5, 1, 0, False, False),  # nothing new
        (6, 5, 1, 0, False, True),  # lag 0, delta 1
        (6, 5, 4, 2, False, False),  # lag 2, delta 1
        (8, 5, 4, 2, False, True),  # lag 2, delta 3 > 2
        (14, 5, 10, -1, False, False),  # negative lag disables the lag rule: delta 9 < interval 10
        (15, 5, 10, -1, False, True),  # delta 10 >= interval
        (5, 5, 10, -1, True, True),  # forced
    ],
)
def test_should_publish(current, last, interval, lag, force, expected):
    assert (
        s.should_publish(
            current_version=current,
            last_published=last,
            weight_sync_interval=interval,
            max_policy_lag=lag,
            force=force,
        )
        is expected
    )


@pytest.mark.parametrize(
    "queued,cap,trainable,expected",
    [
        (5, 2, False, False),  # warm-up: never throttle
        (1, 2, True, False),
        (2, 2, True, True),
        (3, 2, True, True),
    ],
)
def test_backpressure_only_once_trainable(queued, cap, trainable, expected):
    assert s.backpressure(queued_budgets=queued, max_queue=cap, trainable=trainable) is expected


@pytest.mark.parametrize(
    "freq,budget,calls,period",
    [
        (0.0, 100, [], None),
        (1, 10, [0], None),
        (3, 100, [0, 33, 66], None),  # was 4 calls (steps 0, 33, 66, 99)
        (4, 5, [0, 1, 2, 3], None),  # was 5 calls (every step)
        (2.5, 10, [0, 5], None),  # int(freq) calls
        (10, 25, [0, 2, 5, 7, 10, 12, 15, 17, 20, 22], None),
        (10, 3, [0, 0, 0, 0, 1, 1, 1, 2, 2, 2], None),  # more calls than steps: several before one step
        (10, 1, [0] * 10, None),
        (3, 0, [0, 0, 0], None),  # a 0-step budget (replay_ratio carry) runs its calls at step 0
        (0.5, 100, [], 2),
        (0.25, 7, [], 4),
        (1e-5, 7, [], 100_000),
    ],
)
def test_reanalyze_plan_makes_exactly_freq_calls_per_budget(freq, budget, calls, period):
    plan = s.reanalyze_plan(buffer_reanalyze_freq=freq, update_per_collect=budget)
    assert plan.period_epochs == period
    # the drivers visit steps 0..budget-1, and step 0 alone for an empty budget
    got = [step for step in range(max(budget, 1)) for _ in range(plan.calls_at_step(step))]
    assert got == calls
    assert plan.calls_at_step(max(budget, 1)) == 0
    # a step's successor follows at once where it is in the budget and no call runs before it
    follows = [plan.next_step_follows(step) for step in range(max(budget, 1))]
    assert follows == [step + 1 < budget and step + 1 not in calls for step in range(max(budget, 1))]


@pytest.mark.parametrize(
    "interval,lag,gap",
    [(1, 0, 1), (16, 0, 1), (16, 8, 9), (16, 15, 16), (16, 30, 16), (16, -1, 16), (4, 2, 3), (1, -1, 1)],
)
def test_publish_interval_is_the_gap_should_publish_uses(interval, lag, gap):
    assert s.publish_interval(weight_sync_interval=interval, max_policy_lag=lag) == gap
    published = [
        d for d in range(1, 40)
        if s.should_publish(
            current_version=d, last_published=0, weight_sync_interval=interval, max_policy_lag=lag
        )
    ]
    assert published[0] == gap


@pytest.mark.parametrize(
    "bs,conf,no_buf,warm,expected",
    [
        (256, None, False, 10_000, 256),
        (256, 1000, False, 10_000, 1000),
        (256, None, True, 10_000, 10_000),
        (256, None, True, 0, 256),
    ],
)
def test_resume_min_transitions(bs, conf, no_buf, warm, expected):
    assert (
        s.resume_min_transitions(
            batch_size=bs, configured=conf, resumed_without_buffer=no_buf, warmup_transitions=warm
        )
        == expected
    )
