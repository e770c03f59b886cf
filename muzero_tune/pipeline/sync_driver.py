"""The sync segment pipeline: collect -> push -> reanalyze per schedule -> train -> evaluate, in one process.

It never starts Ray itself (with ``learn.num_learners`` > 0 the distributed layer starts it and passes the
learner group's constructor in). Training semantics live in :class:`DriverCore` and are shared with the
async driver.
"""

from __future__ import annotations

import copy
import time

from muzero_tune.config import ExperimentConfig, validate
from muzero_tune.pipeline.collector import SegmentCollector, visit_temperature
from muzero_tune.pipeline.core import (
    EVAL_SEED_OFFSET,
    DriverCore,
    MakeLearner,
    RunSummary,
    check_policy_env,
    one_torch_thread,
    video_name,
)
from muzero_tune.pipeline.evaluator import Evaluator
from muzero_tune.runs.checkpoint import load_checkpoint, to_numpy_tree
from muzero_tune.runs.reporter import Reporter, default_reporter


@one_torch_thread
def train_muzero_segment(
    cfg: ExperimentConfig,
    *,
    reporter: Reporter | None = None,
    resume_from: str | dict | None = None,
    make_learner: MakeLearner | None = None,
) -> RunSummary:
    """Train with the sync pipeline until stop_value, max_envstep or max_train_iter.

    ``resume_from``: a checkpoint path (or loaded checkpoint dict) whose ``resume`` state is continued
    with exact counters. ``make_learner``: see :class:`DriverCore`.
    """
    validate(cfg)
    check_policy_env(cfg)
    reporter = reporter or default_reporter(cfg, resume_from=resume_from)
    try:
        core = DriverCore(cfg, reporter, make_learner=make_learner)
    except BaseException:
        reporter.close()
        raise
    try:
        resume = None
        if resume_from is not None:
            ckpt = load_checkpoint(resume_from) if isinstance(resume_from, str) else resume_from
            resume = ckpt["resume"]
            core.load_resume_state(resume)
        collector = SegmentCollector(cfg, core.policy, core.spec, seed=cfg.seed)
        if resume is not None and "collector" in resume:  # the episodes in flight at the checkpoint go on
            collector.load_state_dict(to_numpy_tree(resume["collector"]), device=core.learner.device)
        core.collector_state = collector.state_dict
        evaluator = Evaluator(
            cfg, core.policy, core.spec, seed=cfg.seed + EVAL_SEED_OFFSET, video=cfg.eval.video_every > 0
        )
    except BaseException:
        core.close()
        reporter.close()
        raise
    eval_model = copy.deepcopy(core.learner.model)
    evals: list[dict] = []
    stop_reason = "max_envstep"
    timings = {"collect_s": 0.0, "train_s": 0.0, "eval_s": 0.0}

    def evaluate() -> bool:
        """Evaluate an immutable snapshot of the current weights; True when stop_value is reached."""
        t0 = time.perf_counter()
        weights = core.learner.weights_snapshot()
        eval_model.load_state_dict(weights)
        core.policy.on_weights_loaded(eval_model)
        name = video_name(cfg, core.counters.eval_index + 1, core.train_iter)
        result = evaluator.evaluate(eval_model, policy_version=core.train_iter, video_name=name)
        evals.append(
            core.record_eval(
                result, weights, train_iter_at_launch=core.train_iter, extra={"pipeline": "sync"}
            )
        )
        timings["eval_s"] += time.perf_counter() - t0
        return core.reached_stop_value(result.reward_mean)

    try:
        if cfg.policy.async_pipeline.eval_at_start and core.counters.eval_index == 0 and evaluate():
            stop_reason = "stop_value"
            return RunSummary(
                stop_reason, core.counters.env_steps, core.train_iter, evals, core.wall_s(), timings
            )
        while True:
            if core.counters.env_steps >= cfg.max_envstep:
                stop_reason = "max_envstep"
                break
            if core.train_iter >= cfg.max_train_iter:
                stop_reason = "max_train_iter"
                break
            if core.out_of_time():
                stop_reason = "max_wall_s"
                break
            t0 = time.perf_counter()
            result = collector.collect(
                core.learner.model,
                temperature=visit_temperature(cfg, core.train_iter),
                policy_version=core.train_iter,
            )
            budget = core.push_collect(result)
            t1 = time.perf_counter()
            timings["collect_s"] += t1 - t0
            plan = core.reanalyze_plan(budget)
            if core.trainable():
                if plan.at_epoch(core.counters.train_epoch):
                    core.buffer_reanalyze()
                for step in range(max(budget, 1)):  # a 0-step budget still runs its reanalyze calls
                    for _ in range(plan.calls_at_step(step)):
                        core.buffer_reanalyze()
                    if step >= budget:
                        break
                    # the next step's batch is built ahead only where that step follows at once
                    core.train_step(prefetch_next=plan.next_step_follows(step))
                    if core.train_iter >= cfg.max_train_iter:
                        break
                core.budget_done()
            timings["train_s"] += time.perf_counter() - t1
            core.progress({"pipeline": "sync"})
            if core.should_eval() and evaluate():
                stop_reason = "stop_value"
                break
        if core.counters.last_eval_iter != core.train_iter and stop_reason not in (
            "stop_value",
            "max_wall_s",
        ):
            if evaluate():
                stop_reason = "stop_value"
    finally:
        collector.close()
        evaluator.close()
        core.close()
        reporter.close()
    return RunSummary(stop_reason, core.counters.env_steps, core.train_iter, evals, core.wall_s(), timings)
