"""The async segment pipeline: a single-owner driver with collector and evaluator Ray actors.

Correctness boundary: this driver process alone owns the learner and the replay buffer (through
:class:`DriverCore`, shared with the sync driver, so training semantics are identical). Actors get
immutable, versioned weight snapshots -- one ``ray.put`` per version, the same reference reused for every
launch at that version -- and return frozen results tagged with the version they used.

Event loop (single thread, ``ray.wait`` based):
1. handle finished actor work: push collect results (one train budget per collect once trainable),
   record evaluations (checkpoint = the exact evaluated snapshot), restart failed or hung actors;
2. launch an evaluation when due, on an immutable snapshot;
3. launch collects on idle collectors (publishing a snapshot per weight_sync_interval / max_policy_lag),
   unless the train-budget queue is full while training can run (backpressure);
4. train a chunk of at most ``max_train_chunk_steps`` steps, then go back to 1;
5. if nothing trained, wait up to ``poll_interval_s`` for any actor.

The actors themselves (creation, start-up, restarts, shutdown) are an
:class:`~muzero_tune.distributed.actor_pool.ActorPool`; the weight snapshots a
:class:`~muzero_tune.distributed.weights.WeightPublisher`. This module owns the loop, the launches, the
results, the train budgets and the pipeline's metrics.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from muzero_tune.config import ExperimentConfig, resolved_async, to_flat_dict, validate
from muzero_tune.distributed.actor_pool import ActorFailureError, ActorPool, ActorSlot, resource_shortfall
from muzero_tune.distributed.placement import (
    ActorPlacement,
    LocalRay,
    current_placement,
    ensure_ray,
    local_placement,
    standalone_placement,
)
from muzero_tune.distributed.weights import WeightPublisher
from muzero_tune.envs.faults import FaultSpec
from muzero_tune.pipeline import schedule
from muzero_tune.pipeline.collector import visit_temperature
from muzero_tune.pipeline.core import (
    DriverCore,
    RunSummary,
    check_policy_env,
    one_torch_thread,
    video_name,
)
from muzero_tune.pipeline.learner import resolve_device
from muzero_tune.pipeline.messages import CollectResult, EvalResult, segments_digest
from muzero_tune.runs.checkpoint import load_checkpoint
from muzero_tune.runs.reporter import Reporter

__all__ = ["ActorFailureError", "AsyncDriver", "AsyncStats", "train_muzero_segment_async"]


@dataclass
class _Launch:
    """One piece of work handed to an actor: which slot, the snapshot version, when (its clock) and the
    learner's train_iter at launch."""

    slot: ActorSlot
    version: int
    t_launch: float
    train_iter: int
    weights: dict | None = None  # evals: the exact CPU snapshot, for the checkpoint
    incarnation: int = field(init=False)  # the slot's incarnation it was handed to

    def __post_init__(self) -> None:
        self.incarnation = self.slot.incarnation


@dataclass
class _Budget:
    """One collect's train budget: its steps, its reanalyze plan and how many steps were taken."""

    total: int
    plan: schedule.ReanalyzePlan
    progress: int = 0


@dataclass
class AsyncStats:
    """Counters the async driver reports (and tests read)."""

    results: int = 0
    result_transitions: int = 0
    # policy lag of each collect, in train_iter: at launch (learner train_iter when the collect was launched
    # minus the snapshot version it got; what max_policy_lag bounds) and at push (learner train_iter when its
    # segments were pushed minus that version; adds the training done while the collect ran)
    launch_lags: list[int] = field(default_factory=list)
    push_lags: list[int] = field(default_factory=list)
    publishes: int = 0
    collector_restarts: int = 0
    evaluator_restarts: int = 0
    collector_failures: int = 0
    evaluator_failures: int = 0
    dropped_collects: int = 0
    start_retries: int = 0  # replacement actors that died before answering their first ping, started again
    shutdown_s: float = 0.0  # seconds closing the actors took at the end of the run
    restart_reasons: list[str] = field(default_factory=list)  # "<kind> <index>: <why>" per failure
    learner_idle_s: float = 0.0
    digest_mismatches: int = 0
    segment_digest_checks: int = 0
    segment_digest_mismatches: int = 0
    collect_nodes: dict[str, int] = field(default_factory=dict)  # Ray node id -> collects received from it
    max_budget_queue: int = 0
    max_collects_inflight: int = 0
    max_evals_inflight: int = 0
    max_chunk_steps: int = 0
    publish_versions: list[int] = field(default_factory=list)
    eval_launch_iters: list[int] = field(default_factory=list)
    idle_waits: int = 0


class AsyncDriver:
    """See the module docstring. Use :func:`train_muzero_segment_async`."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        reporter: Reporter,
        *,
        placement: ActorPlacement | None = None,
        fault: FaultSpec | None = None,
    ):
        import ray

        self.cfg = cfg
        self.ap = resolved_async(cfg.policy.async_pipeline)
        self.ray = LocalRay() if self.ap.ray_local_mode else ray
        self.stats = AsyncStats()
        self.budgets: collections.deque[_Budget] = collections.deque()
        self.collects: dict[Any, _Launch] = {}
        self.evals: dict[Any, _Launch] = {}
        self.stop_requested = False
        self.last_eval_launch: int | None = None
        self.eval_rows: list[dict] = []
        self._rr_eval = 0
        self._rr_collect = 0
        self._window: collections.deque[tuple[float, int]] = collections.deque(maxlen=64)
        self._last_stats_iter = 0
        self._t0 = time.monotonic()
        self.actors = ActorPool(
            self.ray, self.ap, to_flat_dict(cfg), placement, stats=self.stats, fault=fault,
            where=lambda: f"envstep={self.core.counters.env_steps} train_iter={self.core.train_iter}",
            describe_resources=lambda: resource_shortfall(cfg),
        )  # fmt: skip
        if placement is not None:
            # The collectors need only the config: created now, they boot (a process importing torch, ~2.2 s
            # on 2 cores) while the learner is built below (~1.2 s, most of it torch.optim's first use
            # importing torch._dynamo), so the first collect, which training waits for, comes that much
            # sooner. The evaluators are created after it (start_actors): on two cores a third booting
            # process would slow the collectors by about what this saves.
            self.actors.spawn_all(self.actors.collectors)
        make_learner = None
        if cfg.learn.num_learners > 0:  # in the run's learner bundles
            from muzero_tune.distributed.learner_group import LearnerGroup

            def make_learner(c, policy):
                return LearnerGroup(c, policy, placement=placement)

        try:
            self.core = DriverCore(cfg, reporter, make_learner=make_learner)
        except BaseException:
            self.shutdown()
            raise
        self.weights = WeightPublisher(
            self.ray, self.core.learner, weight_sync_interval=self.ap.weight_sync_interval,
            max_policy_lag=self.ap.max_policy_lag, stats=self.stats,
        )  # fmt: skip

    @property
    def placement(self) -> ActorPlacement | None:
        """The placement group the actors run in (the driver removes it at shutdown)."""
        return self.actors.placement

    @placement.setter
    def placement(self, placement: ActorPlacement | None) -> None:
        self.actors.placement = placement

    # ------------------------------------------------------------------ actors

    def start_actors(self, *, before_wait: Callable[[], None] | None = None) -> None:
        """Create every actor not created yet and wait until the collectors answer (the evaluators too with
        ``eval_at_start``, else they finish booting while training runs: an evaluation due before then waits
        behind the constructor, its clock starting when the evaluator answers, :meth:`check_started`).

        ``before_wait`` runs once the actors are created and before the wait: the run's first launches go
        there, so Ray queues each collector's first collect behind its constructor and it starts the moment
        that actor is up, not after every actor has started (measured on CartPole: ~2.7 s to start a
        collector and an evaluator on 2 cores, the bulk of the async pipeline's start-up). Those launches'
        clocks (timeouts, busy time) restart when the wait ends: an actor's start-up is not its work."""
        self.actors.start(wait_for_evaluators=self.ap.eval_at_start, before_wait=before_wait)
        now = time.monotonic()
        for launch in (*self.collects.values(), *self.evals.values()):
            launch.t_launch = now

    def check_started(self, timeout: float = 0.0) -> None:
        """Take the evaluators that finished booting (waiting up to ``timeout``) and start the clocks of the
        evaluations queued behind their constructors."""
        now = time.monotonic()
        self.actors.take_restarted()
        for slot in self.actors.take_started(timeout):
            for launch in self.evals.values():
                if launch.slot is slot:
                    launch.t_launch = now

    # ------------------------------------------------------------------ launches

    def launch_eval(self, *, force: bool = False) -> None:
        """Launch an evaluation of the current weights on a free evaluator when one is due (or ``force``)."""
        if len(self.evals) >= self.ap.max_eval_inflight:
            return
        due = force or schedule.should_eval(
            train_iter=self.core.train_iter,
            last_eval_iter=self.last_eval_launch,
            eval_freq=self.cfg.eval.eval_freq,
            eval_at_start=self.ap.eval_at_start,
        )
        if not due:
            return
        busy = {launch.slot.index for launch in self.evals.values()}
        free = [s for s in self.actors.up("evaluator") if s.index not in busy]
        if not free:
            return
        slot = free[self._rr_eval % len(free)]
        self._rr_eval += 1
        snap, weights = self.weights.current()
        # the evaluation index this one will get (results are recorded in launch order)
        name = video_name(self.cfg, self.core.counters.eval_index + len(self.evals) + 1, snap.version)
        ref = slot.handle.evaluate.remote([snap], name)
        self.evals[ref] = _Launch(slot, snap.version, time.monotonic(), self.core.train_iter, weights)
        self.last_eval_launch = self.core.train_iter
        self.stats.eval_launch_iters.append(self.core.train_iter)
        self.stats.max_evals_inflight = max(self.stats.max_evals_inflight, len(self.evals))

    def launch_collects(self) -> None:
        """Launch a collect on every idle collector (within ``max_collect_inflight``), each with the snapshot
        due now, unless the env-step budget is spent or the train-budget queue is full (backpressure)."""
        c = self.core.counters
        if self.stop_requested or c.env_steps >= self.cfg.max_envstep:
            return
        if schedule.backpressure(
            queued_budgets=len(self.budgets),
            max_queue=self.ap.max_train_budget_queue_size,
            trainable=self.core.trainable(),
        ):
            return
        busy = {launch.slot.index for launch in self.collects.values()}
        collectors = self.actors.collectors
        n = len(collectors)
        # start after the last collector launched, so a cap below the pool size still uses every actor; the
        # order is fixed before the loop, which moves the start, so each collector is visited once
        order = [collectors[(self._rr_collect + k) % n] for k in range(n)]
        for slot in order:
            if len(self.collects) >= self.ap.max_collect_inflight:
                return
            if slot.index in busy or slot.state != "up":
                continue
            self._rr_collect = slot.index + 1
            snap = self.weights.publish_if_due()
            self.stats.launch_lags.append(self.core.train_iter - snap.version)
            temp = visit_temperature(self.cfg, self.core.train_iter)
            ref = slot.handle.collect.remote([snap], temp)
            self.collects[ref] = _Launch(slot, snap.version, time.monotonic(), self.core.train_iter)
            self.stats.max_collects_inflight = max(self.stats.max_collects_inflight, len(self.collects))

    # ------------------------------------------------------------------ results

    def on_collect(self, launch: _Launch, result: CollectResult) -> None:
        """A collect's result: checked against its snapshot's digest, pushed, its train budget queued."""
        st, core = self.stats, self.core
        st.results += 1
        st.result_transitions += result.real_transitions
        st.push_lags.append(core.train_iter - result.policy_version)
        if result.weights_digest and result.weights_digest != self.weights.digests.get(result.policy_version):
            st.digest_mismatches += 1
        if self.ap.verify_segment_digests:  # before the push: the buffer re-homes the segments' frames
            st.segment_digest_checks += 1
            if result.segments_digest != segments_digest(result.segments):
                st.segment_digest_mismatches += 1
        if result.node_id:
            st.collect_nodes[result.node_id] = st.collect_nodes.get(result.node_id, 0) + 1
        budget = core.push_collect(result)
        self._window.append((time.monotonic(), core.counters.env_steps))
        if core.trainable():
            self.budgets.append(_Budget(budget, core.reanalyze_plan(budget)))
            st.max_budget_queue = max(st.max_budget_queue, len(self.budgets))

    def on_eval(self, launch: _Launch, result: EvalResult) -> None:
        """An evaluation's result: reported with the exact snapshot it evaluated (the checkpoint)."""
        row = self.core.record_eval(
            result,
            launch.weights,
            train_iter_at_launch=launch.train_iter,
            extra={"pipeline": "async", **self.pipeline_metrics()},
        )
        self.eval_rows.append(row)
        if self.core.reached_stop_value(result.reward_mean):
            self.stop_requested = True

    def _handle(self, refs: list, table: dict, on_result) -> None:
        for ref in refs:
            launch = table.pop(ref)
            launch.slot.busy_s += time.monotonic() - launch.t_launch
            try:
                result = self.ray.get(ref)
            except Exception as e:  # actor died or raised: drop its in-flight work whole, restart it
                if launch.slot.kind == "collector":
                    self.stats.dropped_collects += 1
                if launch.incarnation != launch.slot.incarnation:
                    continue  # handed to an actor already replaced (e.g. lost while starting): restarted once
                self.actors.launch_failed(launch.slot, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
                continue
            on_result(launch, result)

    def _check_timeouts(self) -> None:
        now = time.monotonic()
        booting = list(self.actors.booting.values())  # their launches' clocks have not started
        for table, limit in (
            (self.collects, self.ap.collect_timeout_s),
            (self.evals, self.ap.eval_timeout_s),
        ):
            for ref, launch in list(table.items()):
                if now - launch.t_launch > limit and not any(launch.slot is b for b in booting):
                    if self.ray.wait([ref], timeout=0)[0]:  # finished meanwhile: handled next pass
                        continue
                    table.pop(ref)
                    if launch.slot.kind == "collector":
                        self.stats.dropped_collects += 1
                    self.actors.restart(launch.slot, f"no result within {limit:g} s (hung)")

    def process_completed(self, timeout: float = 0.0) -> None:
        """Handle the actors' finished work (waiting up to ``timeout`` for some), then hung launches and
        booting evaluators."""
        pending = list(self.collects) + list(self.evals)
        if not pending:  # nothing launched (every actor may be starting again): take those that answered
            if timeout > 0:
                time.sleep(timeout)
            self.check_started()
            return
        ready, _ = self.ray.wait(pending, num_returns=len(pending), timeout=timeout)
        if not ready and timeout > 0:
            ready, _ = self.ray.wait(pending, num_returns=1, timeout=0)
        self._handle([r for r in ready if r in self.collects], self.collects, self.on_collect)
        self._handle([r for r in ready if r in self.evals], self.evals, self.on_eval)
        self._check_timeouts()
        self.check_started()

    def wait_any(self, timeout: float) -> None:
        """Idle until any actor finishes (at most ``timeout`` s); counted as learner idle time."""
        t0 = time.monotonic()
        self.stats.idle_waits += 1
        pending = list(self.collects) + list(self.evals)
        if pending:
            self.ray.wait(pending, num_returns=1, timeout=timeout)
        else:
            time.sleep(timeout)
        self.stats.learner_idle_s += time.monotonic() - t0

    # ------------------------------------------------------------------ training

    def train_chunk(self) -> int:
        core, steps = self.core, 0
        while steps < self.ap.max_train_chunk_steps and self.budgets and core.trainable():
            if core.train_iter >= self.cfg.max_train_iter or self.stop_requested:
                break
            b = self.budgets[0]
            if b.progress == 0 and b.plan.at_epoch(core.counters.train_epoch):
                core.buffer_reanalyze()
            for _ in range(b.plan.calls_at_step(b.progress)):
                core.buffer_reanalyze()
            if b.progress < b.total:  # a 0-step budget (replay_ratio carry) is only counted
                # another step of this budget comes at once, in this chunk: build its batch ahead
                follows = b.plan.next_step_follows(b.progress) and steps + 1 < self.ap.max_train_chunk_steps
                core.train_step(prefetch_next=follows)
                b.progress += 1
                steps += 1
            if b.progress >= b.total:
                self.budgets.popleft()
                core.budget_done()
        self.stats.max_chunk_steps = max(self.stats.max_chunk_steps, steps)
        return steps

    # ------------------------------------------------------------------ metrics

    def pipeline_metrics(self) -> dict:
        """The async pipeline's metrics. Policy lags are over the last 100 collects, in train_iter:
        ``policy_lag_mean/max`` at launch (train_iter at launch minus the snapshot version the collect got;
        0 <= it <= max_policy_lag when the lag rule is on) and ``policy_lag_at_push_mean/max`` at push
        (train_iter when the collect's segments entered the buffer minus that version: the launch lag plus
        the train steps taken while the collect ran; not bounded by max_policy_lag)."""
        st = self.stats
        wall = max(time.monotonic() - self._t0, 1e-9)
        n_col = max(1, len(self.actors.collectors))
        busy = sum(s.busy_s for s in self.actors.collectors) + sum(
            time.monotonic() - launch.t_launch for launch in self.collects.values()
        )
        recent = 0.0
        if len(self._window) >= 2:
            (t_a, e_a), (t_b, e_b) = self._window[0], self._window[-1]
            recent = (e_b - e_a) / max(t_b - t_a, 1e-9)
        lags = st.launch_lags[-100:] or [0]
        push_lags = st.push_lags[-100:] or [0]
        return {
            "pipeline/envstep_per_s_recent": recent,
            "policy_lag_mean": float(np.mean(lags)),
            "policy_lag_max": int(np.max(lags)),
            "policy_lag_at_push_mean": float(np.mean(push_lags)),
            "policy_lag_at_push_max": int(np.max(push_lags)),
            "pipeline/budget_queue": len(self.budgets),
            "pipeline/learner_idle_frac": st.learner_idle_s / wall,
            "pipeline/collector_idle_frac": max(0.0, 1.0 - busy / (n_col * wall)),
            "pipeline/publishes": st.publishes,
            "pipeline/collector_restarts": st.collector_restarts,
            "pipeline/evaluator_restarts": st.evaluator_restarts,
            "pipeline/collector_failures": st.collector_failures,
            "pipeline/evaluator_failures": st.evaluator_failures,
            "pipeline/dropped_collects": st.dropped_collects,
            "pipeline/weights_digest_mismatches": st.digest_mismatches,
            "pipeline/segment_digest_mismatches": st.segment_digest_mismatches,
            "pipeline/collect_nodes": len(st.collect_nodes),
            "pipeline/collectors_up": len(self.actors.up("collector")),
            "pipeline/collectors_total": len(self.actors.collectors),
            "pipeline/evaluators_up": len(self.actors.up("evaluator")),
            "pipeline/evaluators_total": len(self.actors.evaluators),
        }

    # ------------------------------------------------------------------ main loop

    def _done(self) -> str | None:
        core = self.core
        if self.stop_requested:
            return "stop_value"
        if core.train_iter >= self.cfg.max_train_iter:
            return "max_train_iter"
        if core.out_of_time():
            return "max_wall_s"
        if core.counters.env_steps >= self.cfg.max_envstep and not self.collects:
            if not self.budgets or not core.trainable():
                return "max_envstep"
        return None

    def run(self) -> RunSummary:
        core = self.core

        def first_launches() -> None:
            if self.ap.eval_at_start and core.counters.eval_index == 0:
                self.launch_eval(force=True)
            self.launch_collects()

        self.start_actors(before_wait=first_launches)
        reason = None
        while reason is None:
            self.process_completed(0.0)
            self.launch_eval()
            self.launch_collects()
            trained = self.train_chunk()
            if core.train_iter - self._last_stats_iter >= self.ap.buffer_stats_interval:
                self._last_stats_iter = core.train_iter
                core.progress({"pipeline": "async", **self.pipeline_metrics()})
            reason = self._done()
            if reason is None and trained == 0:
                self.wait_any(self.ap.poll_interval_s)
                core.progress({"pipeline": "async", **self.pipeline_metrics()})
        self._finish_evals(reason)
        # the run's end state as its last row: an actor failure handled in the run's last moments (its
        # collect drained after the last evaluation) is in the metrics too
        core.progress({"pipeline": "async", **self.pipeline_metrics()})
        return RunSummary(reason, core.counters.env_steps, core.train_iter, self.eval_rows, core.wall_s())

    def _drain_evals(self) -> None:
        """Handle in-flight evaluations until none is left or eval_timeout_s has passed."""
        deadline = time.monotonic() + self.ap.eval_timeout_s
        while self.evals and time.monotonic() < deadline:
            self.process_completed(self.ap.poll_interval_s)

    def _finish_evals(self, reason: str) -> None:
        """Collect in-flight evaluations and, like the sync driver, evaluate the final weights once."""
        self._drain_evals()
        if (
            reason not in ("stop_value", "max_wall_s")
            and self.core.counters.last_eval_iter != self.core.train_iter
        ):
            self.last_eval_launch = None
            while not self.actors.up("evaluator"):  # a replacement booting: until it answers or none is left
                self.check_started(self.ap.poll_interval_s)
                time.sleep(self.ap.poll_interval_s)
            self.launch_eval(force=True)
            # its own timeout: a hung evaluation above (and its restart) may have used up the first one
            self._drain_evals()

    def shutdown(self) -> None:
        """Close actors within shutdown_timeout_s, then kill the rest (learner workers too); remove our
        placement group."""
        self.actors.shutdown()
        core = getattr(self, "core", None)  # None where building it failed
        if core is not None:
            core.close()
        if self.placement is not None:
            self.placement.remove()


@one_torch_thread
def train_muzero_segment_async(
    cfg: ExperimentConfig,
    *,
    reporter: Reporter | None = None,
    resume_from: str | dict | None = None,
    fault: FaultSpec | None = None,
    driver_out: list | None = None,
) -> RunSummary:
    """Train with the async pipeline (Ray actors) until stop_value, max_envstep or max_train_iter.

    Standalone it starts Ray if needed and creates its own placement group; inside a Tune trial it uses
    the trial's group. ``fault`` injects failures into chosen actors (tests, drills). ``driver_out``, if
    given, receives the driver object (tests read its stats).
    """
    from muzero_tune.runs.reporter import default_reporter

    validate(cfg)
    check_policy_env(cfg)
    local = cfg.policy.async_pipeline.ray_local_mode
    if not local:
        ensure_ray(cfg)
    reporter = reporter or default_reporter(cfg, resume_from=resume_from)
    placement = None
    try:
        placement = local_placement(cfg) if local else current_placement(cfg)
        if placement is None:
            placement = standalone_placement(
                cfg,
                learner_on_gpu=resolve_device(cfg.learn.device).type == "cuda",
                timeout_s=resolved_async(cfg.policy.async_pipeline).actor_start_timeout_s,
            )
        # its collectors boot while it builds the learner; if that fails, it shuts them down itself
        driver = AsyncDriver(cfg, reporter, placement=placement, fault=fault)
    except BaseException:
        if placement is not None:
            placement.remove()  # ours only, and only once (the driver's shutdown may have removed it)
        reporter.close()
        raise
    if driver_out is not None:
        driver_out.append(driver)
    try:
        if resume_from is not None:
            ckpt = load_checkpoint(resume_from) if isinstance(resume_from, str) else resume_from
            driver.core.load_resume_state(ckpt["resume"])
            # evaluations continue on their schedule, not at once at the restored train_iter
            driver.last_eval_launch = driver.core.counters.last_eval_iter
        return driver.run()
    finally:
        driver.shutdown()
        reporter.close()
