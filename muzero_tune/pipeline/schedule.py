"""Scheduling decisions as small pure functions, shared by the sync and async drivers.

Each takes plain numbers and returns a decision; each has a table test. No state, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass


def update_per_collect(*, real_transitions: int, fixed: int | None, replay_ratio: float) -> int:
    """Train steps owed for one collect: ``fixed`` if set, else replay_ratio x real transitions (>= 1)."""
    if fixed is not None:
        return fixed
    return max(1, int(real_transitions * replay_ratio))


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


def backpressure(*, queued_budgets: int, max_queue: int, trainable: bool) -> bool:
    """Hold new collects? Only once training can run: during warm-up collectors are never throttled."""
    return trainable and queued_budgets >= max_queue


@dataclass(frozen=True)
class ReanalyzePlan:
    """When buffer reanalyze runs: every ``interval_steps`` train steps inside a budget, or once every
    ``period_epochs`` collect epochs, or never (both None)."""

    interval_steps: int | None
    period_epochs: int | None

    def at_step(self, step_in_budget: int) -> bool:
        return self.interval_steps is not None and step_in_budget % self.interval_steps == 0

    def at_epoch(self, train_epoch: int) -> bool:
        return self.period_epochs is not None and train_epoch % self.period_epochs == 0


def reanalyze_plan(*, buffer_reanalyze_freq: float, update_per_collect: int) -> ReanalyzePlan:
    """freq >= 1: freq times per budget (interval never 0); 0 < freq < 1: once every round(1/freq) epochs."""
    f = buffer_reanalyze_freq
    if f <= 0:
        return ReanalyzePlan(None, None)
    if f >= 1:
        return ReanalyzePlan(max(1, update_per_collect // int(f)), None)
    return ReanalyzePlan(None, max(1, round(1.0 / f)))


def resume_min_transitions(
    *, batch_size: int, configured: int | None, resumed_without_buffer: bool, warmup_transitions: int = 0
) -> int:
    """Real transitions needed before training: batch size (or configured), more after a bufferless resume."""
    base = configured or batch_size
    return max(base, warmup_transitions) if resumed_without_buffer else base
