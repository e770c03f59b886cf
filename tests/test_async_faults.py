"""Fault injection in the async pipeline: killed, raising and hung actors are restarted, their in-flight work
is dropped whole, and exhausted restarts stop the run cleanly with intact checkpoints and no leftover actors.
"""

from __future__ import annotations

import logging
import os

import pytest
import torch

from muzero_tune.distributed.actors import COLLECTOR_SEED_STRIDE, CollectorWorker
from muzero_tune.distributed.async_driver import ActorFailureError
from muzero_tune.envs.faults import FaultSpec
from muzero_tune.pipeline.collector import SegmentCollector
from muzero_tune.pipeline.core import make_policy
from muzero_tune.runs.checkpoint import FORMAT
from tests.oracles.replay_streams import partial_collects

AP = "policy.async_pipeline."
NEVER_ENDS = 10**9


def _assert_nothing_partial_was_pushed(run, *, dropped=frozenset()) -> dict:
    """Only whole collects are in the replay buffer (:func:`_partial_pushes` on its contents); returns which
    incarnations' streams it holds ({(actor, incarnation): [real transitions per env]})."""
    buf = run.driver.core.buffer
    assert buf.base_idx == 0  # nothing evicted: the buffer holds everything pushed
    assert buf.num_transitions == sum(s.num_real for s in buf.segments) == buf.pushed_transitions > 0
    problems, steps = partial_collects(run.cfg, buf.segments, run.driver.core.counters.env_steps,
                                      incarnations=run.stats.collector_restarts + 1, dropped=dropped)
    assert problems == []
    assert run.stats.digest_mismatches == 0
    return steps


def _assert_cleaned_up(run, ray, alive_after) -> None:
    """The placement group is removed and no incarnation of any actor is still running."""
    pings = run.probe.actor_pings()
    assert len(pings) >= len(run.driver.actors.collectors) + len(run.driver.actors.evaluators)
    assert ray.util.placement_group_table(run.driver.placement.placement_group)["state"] == "REMOVED"
    assert not alive_after({p["pid"] for p in pings})


def test_failed_collector_is_restarted_and_its_collect_dropped(run_async, tmp_path, ray_cluster, alive_after):
    """Collector 0's process dies during its first collect: that collect is dropped whole, the slot gets a
    fresh actor and the run reaches its budget on the healthy collector (a collector whose env raises takes
    the same path: the given-up and exhausted-restarts tests below)."""
    failed = 0
    # the tests' 400 env steps: the buffer check's positive controls below need a stream of 3 segments or more
    run = run_async(tmp_path, {AP + "num_collector_actors": 2},
                    fault=FaultSpec("collector", (failed,), 5, 5, "exit"))
    st = run.stats
    assert run.summary.stop_reason == "max_envstep" and run.summary.train_iter > 0
    assert st.collector_restarts >= 1 and st.collector_failures >= 1
    assert st.dropped_collects >= 1
    assert st.evaluator_restarts == 0
    steps = _assert_nothing_partial_was_pushed(run, dropped={(failed, 0)})
    assert (1 - failed, 0) in steps  # the healthy collector's streams are there
    # the slot got a fresh actor; the run does not wait for it, so on a loaded machine it may still be booting
    # when the run ends (and is then killed without answering)
    assert ("collector", failed, 1) in run.probe.spawns
    _partial_pushes_are_caught(run, failed)  # positive controls of the buffer check, on this run's buffer
    _assert_cleaned_up(run, ray_cluster, alive_after)


def _partial_pushes_are_caught(run, failed: int) -> None:
    """The buffer check reports the first segments the failed incarnation's envs produce (what a collect
    returned part-way would have pushed), a stream with one segment missing (a collect pushed without one
    of its segments), and a segment pushed twice."""
    cfg, segments = run.cfg, list(run.driver.core.buffer.segments)
    env_steps, inc = run.driver.core.counters.env_steps, run.stats.collector_restarts + 1
    policy, spec = make_policy(cfg)
    seed = cfg.seed + COLLECTOR_SEED_STRIDE * failed  # incarnation 0's
    collector = SegmentCollector(cfg, policy, spec, seed=seed, actor_id=failed)
    part = collector.collect(policy.build_model().eval(), temperature=1.0).segments[:2]
    problems, _ = partial_collects(cfg, segments + list(part), env_steps, incarnations=inc,
                                  dropped={(failed, 0)})  # fmt: skip
    for sid in {s.stream_id for s in part}:
        assert f"stream {sid} of collector {failed} incarnation 0, whose collect was dropped" in problems
    stream = max({s.stream_id for s in segments}, key=lambda sid: sum(s.stream_id == sid for s in segments))
    gap = [i for i, s in enumerate(segments) if s.stream_id == stream][1]
    problems, _ = partial_collects(cfg, segments[:gap] + segments[gap + 1:], env_steps, incarnations=inc)
    assert any(f"stream {stream}: episode/step" in p for p in problems)
    problems, _ = partial_collects(cfg, segments + [segments[gap]], env_steps, incarnations=inc)
    assert any(f"stream {stream}: episode/step" in p for p in problems)


def _why(run) -> str:
    """What a failed restart count needs to be read: the restarts and their reasons, the slowest healthy
    collect and evaluation, and the machine's load."""
    st, probe = run.stats, run.probe
    slowest = [max((r["duration_s"] for r in rows), default=0.0) for rows in (probe.collects, probe.evals)]
    return (f"restarts: {st.restart_reasons}; slowest healthy collect {slowest[0]:.1f} s, evaluation "
            f"{slowest[1]:.1f} s; load average {os.getloadavg()}")  # fmt: skip


class _Warnings(logging.Handler):
    """The messages of the WARNING records a logger handles while this is attached."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


HUNG_COLLECT_TIMEOUT_S = 16


@pytest.fixture(scope="module")
def hung_and_given_up(run_async, tmp_path_factory):
    """Two collectors, no restarts allowed, 160 env steps; collector 0 hangs in its first collect, so
    collect_timeout_s catches it, its actor is killed and given up, and collector 1 collects the budget (the
    run cannot end before the timeout fires: it waits for every collect in flight). The warnings the run
    logged are in ``extra["warnings"]``.

    The timeout is over five times the slowest healthy collect measured on a loaded 2-core machine (3.1 s
    over 19 runs at load averages 3-12, most of it an actor's first search), so it catches the hung collect
    and only that one."""
    logger, seen = logging.getLogger("muzero_tune"), _Warnings()
    level = logger.level
    logger.setLevel(logging.WARNING)
    logger.addHandler(seen)
    try:
        run = run_async(tmp_path_factory.mktemp("hung"), {
            AP + "num_collector_actors": 2, AP + "collect_timeout_s": HUNG_COLLECT_TIMEOUT_S,
            AP + "max_actor_restarts": 0, "max_envstep": 160,
        }, fault=FaultSpec("collector", (0,), 5, NEVER_ENDS, "hang"))
    finally:
        logger.removeHandler(seen)
        logger.setLevel(level)
    run.extra["warnings"] = seen.messages
    return run


def test_hung_collector_is_caught_by_collect_timeout_and_killed(hung_and_given_up, ray_cluster, alive_after):
    """The hung collect is the one the timeout catches, and the only one; it is dropped whole and the hung
    process killed. The slot then goes the way of any failed one (``ActorPool.restart``): restarted while
    restarts are left (the first test), given up here (the next test)."""
    run = hung_and_given_up
    st = run.stats
    assert run.summary.stop_reason == "max_envstep"
    hung = f"collector 0: no result within {HUNG_COLLECT_TIMEOUT_S} s (hung)"
    assert st.restart_reasons == [hung], _why(run)
    assert (st.collector_failures, st.collector_restarts, st.dropped_collects) == (1, 0, 1), _why(run)
    _assert_nothing_partial_was_pushed(run, dropped={(0, 0)})
    _assert_cleaned_up(run, ray_cluster, alive_after)  # the hung process was killed


def test_a_collector_given_up_leaves_the_run_going_on_the_others(hung_and_given_up, ray_cluster,
                                                                  alive_after):
    """Two collectors, no restarts allowed: collector 0 fails (its collect hangs past collect_timeout_s) and
    is given up, and the run reaches its budget on collector 1, reporting the reduced pool in its metrics
    and a warning."""
    run = hung_and_given_up
    st = run.stats
    assert run.summary.stop_reason == "max_envstep" and run.summary.train_iter > 0
    assert st.collector_failures == 1 and st.collector_restarts == 0 and st.dropped_collects == 1
    assert [s.state for s in run.driver.actors.collectors] == ["lost", "up"]
    # the run's last row holds its end state, however late in the run the failure was handled
    final = run.reporter.progress[-1]
    assert final["pipeline/collectors_up"] == 1 and final["pipeline/collectors_total"] == 2
    assert final["pipeline/collector_failures"] == 1 and final["envstep"] == run.summary.env_steps
    warned = [m for m in run.extra["warnings"] if "restarts are exhausted" in m]
    assert len(warned) == 1 and "the run goes on with 1 of 2 collectors" in warned[0]
    # every transition in the buffer came from collector 1
    assert set(_assert_nothing_partial_was_pushed(run, dropped={(0, 0)})) == {(1, 0)}
    _assert_cleaned_up(run, ray_cluster, alive_after)


def test_failed_evaluator_is_restarted(run_async, tmp_path, ray_cluster, alive_after):
    run = run_async(tmp_path, {"max_envstep": 160},
                    fault=FaultSpec("evaluator", (0,), 1, NEVER_ENDS, "raise"))
    st = run.stats
    assert run.summary.stop_reason == "max_envstep"
    assert st.evaluator_failures >= 1 and st.evaluator_restarts >= 1
    assert st.collector_restarts == 0 and st.dropped_collects == 0
    assert run.summary.evals  # the restarted evaluator evaluated (the final weights at least)
    assert run.summary.evals[-1]["policy_version"] == run.summary.train_iter
    assert set(_assert_nothing_partial_was_pushed(run)) == {(0, 0)}  # the one collector, never restarted
    _assert_cleaned_up(run, ray_cluster, alive_after)


def test_hung_evaluator_times_out_while_the_other_evaluates(run_async, tmp_path, ray_cluster, alive_after):
    """max_eval_inflight=2: while evaluator 0 hangs, evaluator 1 takes the next evaluation.

    Evaluations are due every 3 train steps and the run stops at 12. The timeout is over five times the
    slowest healthy evaluation measured on a loaded 2-core machine (3.1 s over 19 runs at load averages
    3-12, an evaluator's first; later ones take 0.01-0.1 s): it catches the hung evaluation and only that
    one, and the second evaluation is due long before it fires. The run cannot end before it fires: it
    waits for the evaluations in flight, then evaluates the final weights.
    """
    timeout_s = 16
    run = run_async(tmp_path, {AP + "num_evaluator_actors": 2, AP + "max_eval_inflight": 2,
                               AP + "eval_timeout_s": timeout_s, AP + "max_actor_restarts": 10,
                               "eval.eval_freq": 3, "max_train_iter": 12},
                    fault=FaultSpec("evaluator", (0,), 1, NEVER_ENDS, "hang"))
    st = run.stats
    assert run.summary.stop_reason == "max_train_iter"
    assert st.restart_reasons == [f"evaluator 0: no result within {timeout_s} s (hung)"], _why(run)
    assert (st.evaluator_failures, st.evaluator_restarts) == (1, 1), _why(run)
    assert st.max_evals_inflight == 2
    assert 1 in {r["actor_id"] for r in run.probe.evals}
    assert run.summary.evals[-1]["policy_version"] == 12  # the final weights were still evaluated
    _assert_cleaned_up(run, ray_cluster, alive_after)


def test_exhausted_restarts_stop_the_run_with_intact_checkpoints(run_async, tmp_path, ray_cluster,
                                                                  alive_after):
    """max_actor_restarts=1 and collector 0 fails on every incarnation: restarted once, then the run stops
    with the error, its checkpoints intact and the collects before each failure in the buffer whole."""
    # each incarnation of collector 0 raises at its first env step after the first evaluated checkpoint
    # (eval_at_start) is on disk, and not before its env 0 has stepped 36 times: a collect ends once every env
    # has a whole segment (20 steps plus 15 of lookahead at the latest), so its first collect is in the buffer
    overrides = {AP + "max_actor_restarts": 1, AP + "eval_at_start": True, "max_envstep": 20_000}
    ckpt_dir = os.path.join(str(tmp_path), "exhausted", "ckpt")
    fault = FaultSpec("collector", (0,), 36, NEVER_ENDS, "raise", incarnations=(0, 1), after_file_in=ckpt_dir)
    run = run_async(tmp_path, overrides, fault=fault, standalone=True, exp_name="exhausted",
                    expect_error=ActorFailureError)
    msg = str(run.error)
    assert "collector actor 0" in msg and "1 of policy.async_pipeline.max_actor_restarts=1" in msg
    assert "InjectedFault" in msg and "last checkpoint is intact" in msg
    assert run.stats.collector_restarts == 1 and run.stats.collector_failures == 2
    # the replacement answered and took work (then failed in turn)
    pings = run.probe.actor_pings()
    assert sorted(p["incarnation"] for p in pings if p["kind"] == "collector") == [0, 1]
    # the collects before the failing ones are in the buffer whole, nothing of the failing ones
    assert set(_assert_nothing_partial_was_pushed(run)) == {(0, 0), (0, 1)}
    assert ckpt_dir == os.path.join(run.run_dir, "ckpt")
    files = sorted(f for f in os.listdir(ckpt_dir) if f.endswith(".pt"))
    assert files and len(files) == run.driver.core.counters.eval_index
    assert not [f for f in os.listdir(ckpt_dir) if f.startswith(".tmp-")]
    for f in files:
        ckpt = torch.load(os.path.join(ckpt_dir, f), weights_only=True)
        assert ckpt["format"] == FORMAT and ckpt["evaluated"]["weights"]
        assert ckpt["resume"]["counters"]["env_steps"] <= run.driver.core.counters.env_steps
    _assert_cleaned_up(run, ray_cluster, alive_after)


@pytest.mark.parametrize("kind", ["collector", "evaluator"])
def test_an_actor_lost_while_starting_is_started_again_and_the_run_goes_on(kind, run_async, tmp_path,
                                                                          ray_cluster, alive_after):
    """An actor whose process dies in its constructor (as on a node lost while the run starts: the collectors
    are waited for at start, the evaluator boots while training runs) is restarted as one lost at work is,
    and the run reaches its budget; the launch queued behind the lost constructor is dropped without a
    second restart."""
    run = run_async(tmp_path, {"max_envstep": 160}, fault=FaultSpec(kind, (0,), 0, 0, "exit_on_start"))
    st = run.stats
    assert run.summary.stop_reason == "max_envstep" and run.summary.train_iter > 0
    assert (st.collector_restarts, st.evaluator_restarts) == ((1, 0) if kind == "collector" else (0, 1))
    assert len(st.restart_reasons) == 1 and st.restart_reasons[0].startswith(f"{kind} 0: lost while starting")
    incarnations = sorted(p["incarnation"] for p in run.probe.actor_pings() if p["actor_id"] == 0)
    # the other kind's actor 0, and the restarted one (the lost one never answered)
    assert incarnations == [0, 1]
    assert run.summary.evals  # the evaluator (restarted or not) evaluated
    _assert_cleaned_up(run, ray_cluster, alive_after)


@pytest.mark.parametrize("kind", ["collector", "evaluator"])
def test_an_actor_whose_constructor_raises_stops_the_run_with_that_error_and_no_restart(
        kind, run_async, tmp_path, ray_cluster, alive_after):
    """A constructor that raises (a setting or env the actor cannot use) would raise again in a replacement:
    the run stops with that error, restarting nothing, whether the actor is awaited at start (collectors) or
    boots while training runs with an evaluation queued behind it (the evaluator)."""
    run = run_async(tmp_path, {}, fault=FaultSpec(kind, (0,), 0, 0, "raise_on_start"), expect_error=Exception)
    assert f"injected constructor error in {kind} 0" in str(run.error)
    st = run.stats
    assert (st.collector_restarts, st.evaluator_restarts) == (0, 0) and st.restart_reasons == []
    assert (kind, 0, 1) not in run.probe.spawns  # no second incarnation was created
    assert ray_cluster.util.placement_group_table(run.driver.placement.placement_group)["state"] == "REMOVED"
    assert not alive_after({p["pid"] for p in run.probe.actor_pings()})


class _CorruptingCollector(CollectorWorker):
    """A collector whose results change after their segment digest was taken (a bit flipped in transit)."""

    def collect(self, snapshot_box, temperature):
        res = super().collect(snapshot_box, temperature)
        res.segments[0].rewards[0] += 1.0
        return res


def test_a_segment_changed_after_its_digest_is_counted_as_a_mismatch(tmp_path, async_small, monkeypatch):
    """The positive control of the segment digests: every result of a collector that alters a reward after
    digesting its segments is counted; the weights digests still match."""
    from muzero_tune.config import make_config
    from muzero_tune.distributed import actor_pool
    from muzero_tune.distributed.async_driver import train_muzero_segment_async
    from muzero_tune.runs.reporter import MemoryReporter

    monkeypatch.setattr(actor_pool, "CollectorWorker", _CorruptingCollector)
    cfg = make_config("cartpole_muzero", overrides={
        **async_small, "max_envstep": 200, "logging.output_dir": str(tmp_path),
        AP + "ray_local_mode": True, AP + "verify_segment_digests": True,
    })  # fmt: skip
    out: list = []
    train_muzero_segment_async(cfg, reporter=MemoryReporter(), driver_out=out)
    st = out[0].stats
    assert st.results >= 2 and st.segment_digest_checks == st.results
    assert st.segment_digest_mismatches == st.results and st.digest_mismatches == 0
