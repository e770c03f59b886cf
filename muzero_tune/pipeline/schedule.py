"""Scheduling decisions as small pure functions, shared by the sync and async drivers.

Each takes plain numbers and returns a decision; each has a table test. No state, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction


def update_per_collect(
    *, real_transitions: int, fixed: int | None, replay_ratio: float, carry: float = 0.0
) -> tuple[int, float]:
    """Train steps owed for one collect, and the fraction of a step carried to the next collect.

    ``fixed`` (``learn.update_per_collect``) if set: that many, the carry passes through unchanged.
    Otherwise ``carry + replay_ratio x real_transitions`` split into whole steps and the remainder in
    [0, 1), so over any run of collects the steps granted are floor(ratio x transitions) (plus the carry
    at the start): 15 transitions at ratio 0.1 give 1, 2, 1, 2, ... steps, never 1 each. A collect can owe
    0 steps. The ratio is taken as the decimal it prints as (0.1 is exactly 1/10), so no float rounding
    makes a step go missing.
    """
    if fixed is not None:
        return fixed, carry
    ratio = Fraction(str(replay_ratio))
    owed = Fraction(carry).limit_denominator(ratio.denominator) + real_transitions * ratio
    steps = math.floor(owed)
    return steps, float(owed - steps)


def can_train(
    *, env_steps: int, num_transitions: int, train_start_after_envsteps: int, min_transitions: int
) -> bool:
    """Training may start once enough env steps were taken and enough real transitions are stored."""
    return env_steps >= train_start_after_envsteps and num_transitions >= min_transitions


def should_eval(
    *, train_iter: int, last_eval_iter: int | None, eval_freq: int, eval_at_start: bool = False
) -> bool:
    """Evaluate every ``eval_freq`` train steps; at train_iter 0 only with ``eval_at_start``.

    ``last_eval_iter`` is None before the first evaluation.
    """
    if last_eval_iter is None:
        return train_iter >= eval_freq or (eval_at_start and train_iter == 0)
    return train_iter - last_eval_iter >= eval_freq


def should_publish(
    *,
    current_version: int,
    last_published: int | None,
    weight_sync_interval: int,
    max_policy_lag: int,
    force: bool = False,
) -> bool:
    """Publish a new weights snapshot? (spec 2.3)

    Yes when forced or nothing is published yet; when the learner advanced by >= weight_sync_interval;
    or when the lag exceeds max_policy_lag (a negative max_policy_lag disables that rule).
    """
    if force or last_published is None:
        return True
    delta = current_version - last_published
    if delta >= max(1, weight_sync_interval):
        return True
    return max_policy_lag >= 0 and delta > max_policy_lag


def publish_interval(*, weight_sync_interval: int, max_policy_lag: int) -> int:
    """The train_iter gap at which :func:`should_publish` publishes: the whole publish schedule.

    ``min(weight_sync_interval, max_policy_lag + 1)``, or ``weight_sync_interval`` when the lag rule is
    off (max_policy_lag < 0). Two settings with the same gap are the same schedule; with
    0 <= max_policy_lag < weight_sync_interval - 1 the interval has no effect.
    """
    interval = max(1, weight_sync_interval)
    return interval if max_policy_lag < 0 else min(interval, max_policy_lag + 1)


def backpressure(*, queued_budgets: int, max_queue: int, trainable: bool) -> bool:
    """Hold new collects? Only once training can run: during warm-up collectors are never throttled."""
    return trainable and queued_budgets >= max_queue


@dataclass(frozen=True)
class ReanalyzePlan:
    """When buffer reanalyze runs within one collect's train budget.

    ``calls_per_budget`` calls spread evenly over the budget's ``budget_steps`` train steps (call i runs
    before step floor(i x budget_steps / calls_per_budget)); a budget of 0 steps runs them all at its
    step 0, which the drivers visit once without training. Or once every ``period_epochs`` collect epochs
    (before the budget's first step); or never (0 calls, period None).
    """

    calls_per_budget: int
    budget_steps: int
    period_epochs: int | None

    def calls_at_step(self, step_in_budget: int) -> int:
        """Reanalyze calls to run before train step ``step_in_budget`` (0-based) of the budget."""
        n, b = self.calls_per_budget, self.budget_steps
        if n == 0:
            return 0
        if b == 0:
            return n if step_in_budget == 0 else 0
        if not 0 <= step_in_budget < b:
            return 0
        # calls i with floor(i * b / n) == step: i in [ceil(step * n / b), ceil((step + 1) * n / b))
        return -(-(step_in_budget + 1) * n // b) - -(-step_in_budget * n // b)

    def next_step_follows(self, step_in_budget: int) -> bool:
        """Whether train step ``step_in_budget + 1`` of the budget comes right after this one, with no
        reanalyze call between (so its batch can be built ahead: ``learn.prefetch_next_batch``)."""
        return step_in_budget + 1 < self.budget_steps and self.calls_at_step(step_in_budget + 1) == 0

    def at_epoch(self, train_epoch: int) -> bool:
        return self.period_epochs is not None and train_epoch % self.period_epochs == 0


def reanalyze_plan(*, buffer_reanalyze_freq: float, update_per_collect: int) -> ReanalyzePlan:
    """The plan for one budget of ``update_per_collect`` train steps.

    freq >= 1: exactly int(freq) calls per budget (2.5 -> 2), whatever the budget's size (more calls than
    steps: several before one step); 0 < freq < 1: once every round(1/freq) collect epochs; 0: off.
    """
    f = buffer_reanalyze_freq
    if f <= 0:
        return ReanalyzePlan(0, update_per_collect, None)
    if f >= 1:
        return ReanalyzePlan(int(f), update_per_collect, None)
    return ReanalyzePlan(0, update_per_collect, max(1, round(1.0 / f)))


def resume_min_transitions(
    *, batch_size: int, configured: int | None, resumed_without_buffer: bool, warmup_transitions: int = 0
) -> int:
    """Real transitions needed before training: batch size (or configured), more after a bufferless resume."""
    base = configured or batch_size
    return max(base, warmup_transitions) if resumed_without_buffer else base
