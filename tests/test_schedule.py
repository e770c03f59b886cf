"""The drivers' decision functions, as tables."""

from __future__ import annotations

import pytest

from muzero_tune.pipeline import schedule as s


@pytest.mark.parametrize(
    "real,fixed,ratio,expected",
    [
        (400, None, 0.25, 100),
        (3, None, 0.25, 1),
        (0, None, 0.25, 1),
        (400, 7, 0.25, 7),
        (1000, None, 1.0, 1000),
    ],
)
def test_update_per_collect(real, fixed, ratio, expected):
    assert s.update_per_collect(real_transitions=real, fixed=fixed, replay_ratio=ratio) == expected


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
    "freq,upc,interval,period",
    [
        (0.0, 100, None, None),
        (1, 10, 10, None),
        (10, 25, 2, None),
        (10, 3, 1, None),  # upc < freq: the interval is 1, never 0 (the reference's ZeroDivision)
        (10, 1, 1, None),
        (0.5, 100, None, 2),
        (0.25, 7, None, 4),
        (1e-5, 7, None, 100_000),
    ],
)
def test_reanalyze_plan_never_divides_by_zero(freq, upc, interval, period):
    plan = s.reanalyze_plan(buffer_reanalyze_freq=freq, update_per_collect=upc)
    assert (plan.interval_steps, plan.period_epochs) == (interval, period)
    assert all(isinstance(plan.at_step(i), bool) for i in range(upc))
    if interval is not None:
        assert sum(plan.at_step(i) for i in range(upc)) == len(range(0, upc, interval))


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
