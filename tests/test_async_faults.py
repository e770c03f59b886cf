"""Fault injection in the async pipeline: killed, raising and hung actors are restarted, their in-flight work
is dropped whole, and exhausted restarts stop the run cleanly with intact checkpoints and no leftover actors.
"""

from __future__ import annotations

import os

import pytest
import torch

from muzero_tune.distributed.actors import CollectorWorker
from muzero_tune.distributed.async_driver import ActorFailureError
from muzero_tune.envs.faults import FaultSpec
from muzero_tune.runs.checkpoint import FORMAT

AP = "policy.async_pipeline."
NEVER_ENDS = 10**9


def _assert_nothing_partial_was_pushed(run) -> None:
    """Only whole results reached the buffer and the counters: a dropped collect left no trace."""
    core, st, rec = run.driver.core, run.stats, run.probe.collects
    assert st.results == len(rec) == core.counters.collects
    assert core.buffer.pushed_transitions == st.result_transitions == sum(r["real_transitions"] for r in rec)
    assert core.counters.env_steps == sum(r["envstep_delta"] for r in rec)
    assert st.digest_mismatches == 0


def _assert_cleaned_up(run, ray, alive_after) -> None:
    """The placement group is removed and no incarnation of any actor is still running."""
    pings = run.probe.actor_pings()
    assert len(pings) >= len(run.driver.actors.collectors) + len(run.driver.actors.evaluators)
    assert ray.util.placement_group_table(run.driver.placement.placement_group)["state"] == "REMOVED"
    assert not alive_after({p["pid"] for p in pings})


@pytest.mark.parametrize("mode, fault", [
    ("exit", FaultSpec("collector", (0,), 5, 5, "exit")),  # the process dies during its first collect
    ("raise", FaultSpec("collector", (1,), 3, 30, "raise")),  # env.step raises inside a window of steps
])
def test_failed_collector_is_restarted_and_its_collect_dropped(mode, fault, run_async, tmp_path, ray_cluster,
                                                               alive_after):
    run = run_async(tmp_path, {AP + "num_collector_actors": 2}, fault=fault)
    st = run.stats
    assert run.summary.stop_reason == "max_envstep" and run.summary.train_iter > 0
    assert st.collector_restarts >= 1 and st.collector_failures >= 1
    assert st.dropped_collects >= 1
    assert st.evaluator_restarts == 0
    _assert_nothing_partial_was_pushed(run)
    failed = fault.actor_ids[0]
    incarnations = {(p["actor_id"], p["incarnation"]) for p in run.probe.actor_pings()}
    assert (failed, 1) in incarnations  # the slot got a fresh actor, which came up before the run went on
    _assert_cleaned_up(run, ray_cluster, alive_after)


def test_hung_collector_is_caught_by_collect_timeout_and_restarted(run_async, tmp_path, ray_cluster,
                                                                   alive_after):
    # healthy collects took up to ~4 s on this (shared, 2-core) machine under load: a timeout above that, and
    # restarts to spare, so a slow healthy collect can neither fail the test nor exhaust a slot
    run = run_async(tmp_path, {AP + "num_collector_actors": 2, AP + "collect_timeout_s": 5,
                               AP + "max_actor_restarts": 10},
                    fault=FaultSpec("collector", (0,), 5, NEVER_ENDS, "hang"))
    st = run.stats
    assert run.summary.stop_reason == "max_envstep"
    assert st.collector_failures >= 1 and st.collector_restarts >= 1 and st.dropped_collects >= 1
    _assert_nothing_partial_was_pushed(run)
    _assert_cleaned_up(run, ray_cluster, alive_after)  # the hung process was killed


def test_failed_evaluator_is_restarted(run_async, tmp_path, ray_cluster, alive_after):
    run = run_async(tmp_path, {}, fault=FaultSpec("evaluator", (0,), 1, NEVER_ENDS, "raise"))
    st = run.stats
    assert run.summary.stop_reason == "max_envstep"
    assert st.evaluator_failures >= 1 and st.evaluator_restarts >= 1
    assert st.collector_restarts == 0 and st.dropped_collects == 0
    assert run.summary.evals  # the restarted evaluator evaluated (the final weights at least)
    assert run.summary.evals[-1]["policy_version"] == run.summary.train_iter
    _assert_nothing_partial_was_pushed(run)
    _assert_cleaned_up(run, ray_cluster, alive_after)


def test_hung_evaluator_times_out_while_the_other_evaluates(run_async, tmp_path, ray_cluster, alive_after):
    """max_eval_inflight=2: while evaluator 0 hangs, evaluator 1 takes the next evaluation.

    Evaluations are due every 3 train steps and the run stops at 12, so the second one is due well within
    the hung one's eval_timeout_s even on a loaded machine (healthy evaluations took up to ~3 s here).
    """
    run = run_async(tmp_path, {AP + "num_evaluator_actors": 2, AP + "max_eval_inflight": 2,
                               AP + "eval_timeout_s": 6, AP + "max_actor_restarts": 10, "eval.eval_freq": 3,
                               "max_train_iter": 12},
                    fault=FaultSpec("evaluator", (0,), 1, NEVER_ENDS, "hang"))
    st = run.stats
    assert run.summary.stop_reason == "max_train_iter"
    assert st.evaluator_failures >= 1 and st.evaluator_restarts >= 1
    assert st.max_evals_inflight == 2
    assert 1 in {r["actor_id"] for r in run.probe.evals}
    assert run.summary.evals[-1]["policy_version"] == 12  # the final weights were still evaluated
    _assert_cleaned_up(run, ray_cluster, alive_after)


def test_exhausted_restarts_stop_the_run_with_intact_checkpoints(run_async, tmp_path, ray_cluster,
                                                                  alive_after):
    # collector 0 raises once it has stepped its env 0 250 times (about 12 collects), long after the first
    # evaluation (eval_at_start) was saved
    overrides = {AP + "max_actor_restarts": 0, AP + "eval_at_start": True, "max_envstep": 20_000}
    run = run_async(tmp_path, overrides,
                    fault=FaultSpec("collector", (0,), 250, NEVER_ENDS, "raise"), standalone=True,
                    exp_name="exhausted", expect_error=ActorFailureError)
    msg = str(run.error)
    assert "collector actor 0" in msg and "max_actor_restarts=0" in msg
    assert "InjectedFault" in msg and "last checkpoint is intact" in msg
    assert run.stats.collector_restarts == 0 and run.stats.collector_failures == 1
    ckpt_dir = os.path.join(run.run_dir, "ckpt")
    files = sorted(f for f in os.listdir(ckpt_dir) if f.endswith(".pt"))
    assert files and len(files) == run.driver.core.counters.eval_index
    assert not [f for f in os.listdir(ckpt_dir) if f.startswith(".tmp-")]
    for f in files:
        ckpt = torch.load(os.path.join(ckpt_dir, f), weights_only=True)
        assert ckpt["format"] == FORMAT and ckpt["evaluated"]["weights"]
        assert ckpt["resume"]["counters"]["env_steps"] <= run.driver.core.counters.env_steps
    _assert_cleaned_up(run, ray_cluster, alive_after)


def test_a_collector_given_up_leaves_the_run_going_on_the_others(run_async, tmp_path, ray_cluster,
                                                                  alive_after, caplog):
    """Two collectors, no restarts allowed: collector 0 fails on every incarnation and is given up, and the
    run reaches its budget on collector 1, reporting the reduced pool in its metrics and a warning."""
    with caplog.at_level("WARNING", logger="muzero_tune"):
        run = run_async(tmp_path, {AP + "num_collector_actors": 2, AP + "max_actor_restarts": 0},
                        fault=FaultSpec("collector", (0,), 5, NEVER_ENDS, "raise"))
    st = run.stats
    assert run.summary.stop_reason == "max_envstep" and run.summary.train_iter > 0
    assert st.collector_failures == 1 and st.collector_restarts == 0 and st.dropped_collects == 1
    assert [s.state for s in run.driver.actors.collectors] == ["lost", "up"]
    assert {r["actor_id"] for r in run.probe.collects} == {1}  # every pushed collect came from collector 1
    assert run.summary.evals[-1]["pipeline/collectors_up"] == 1
    assert run.summary.evals[-1]["pipeline/collectors_total"] == 2
    warned = [r.getMessage() for r in caplog.records if "restarts are exhausted" in r.getMessage()]
    assert len(warned) == 1 and "the run goes on with 1 of 2 collectors" in warned[0]
    _assert_nothing_partial_was_pushed(run)
    _assert_cleaned_up(run, ray_cluster, alive_after)


def test_fault_on_every_incarnation_exhausts_max_actor_restarts(run_async, tmp_path, ray_cluster,
                                                                 alive_after):
    run = run_async(tmp_path, {AP + "max_actor_restarts": 1},
                    fault=FaultSpec("collector", (0,), 1, NEVER_ENDS, "raise", incarnations=(0, 1, 2, 3)),
                    expect_error=ActorFailureError)
    msg = str(run.error)
    assert "collector actor 0" in msg and "1 of policy.async_pipeline.max_actor_restarts=1" in msg
    assert "last checkpoint is intact" in msg
    assert run.stats.collector_restarts == 1 and run.stats.collector_failures == 2
    assert run.stats.results == 0 and run.driver.core.buffer.pushed_transitions == 0
    incarnations = sorted(p["incarnation"] for p in run.probe.actor_pings() if p["actor_id"] == 0)
    assert incarnations == [0, 0, 1]  # collector 0 twice, evaluator 0 once
    _assert_cleaned_up(run, ray_cluster, alive_after)


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
