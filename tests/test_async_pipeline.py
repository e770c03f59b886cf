"""Integration: the async pipeline (Ray collector/evaluator actors) on tiny CartPole runs.

One Ray cluster serves the whole session (``ray_cluster`` in conftest). Every assertion is on an invariant
of the run (counts, bounds, equalities), never on timing beyond generous upper bounds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from muzero_tune.pipeline.messages import weights_digest
from muzero_tune.runs.reporter import MemoryReporter

AP = "policy.async_pipeline."


def _pg_state(ray, pg) -> str:
    return ray.util.placement_group_table(pg)["state"]


def _ckpts(run_dir: str) -> list[str]:
    d = os.path.join(run_dir, "ckpt")
    return [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.startswith("eval_") and f.endswith(".pt")]


# ---------------------------------------------------------------------------------------------- the basic run


@pytest.fixture(scope="module")
def basic(run_async, tmp_path_factory):
    """2 collectors, 1 evaluator, other keys at their defaults; the standalone reporter writes checkpoints.
    320 env steps: more than the two first collects can take (a collect ends once every env holds a whole
    segment, 35 steps, so 140 env steps at most), so a collect is launched once training has started."""
    return run_async(tmp_path_factory.mktemp("basic"), {AP + "num_collector_actors": 2, "max_envstep": 320},
                     standalone=True, exp_name="basic")


def test_run_completes_trains_evaluates_and_writes_evaluated_snapshot(basic):
    s = basic.summary
    assert s.stop_reason == "max_envstep" and s.env_steps >= 320
    assert s.train_iter > 0
    assert len(s.evals) >= 1 and all(row["pipeline"] == "async" for row in s.evals)
    files = _ckpts(basic.run_dir)
    assert len(files) == len(s.evals)
    for path, row in zip(files, s.evals):
        ckpt = torch.load(path, weights_only=True)
        assert ckpt["evaluated"]["version"] == row["policy_version"] <= s.train_iter
        assert ckpt["evaluated"]["metrics"]["reward_mean"] == pytest.approx(row["reward_mean"])
    last = torch.load(files[-1], weights_only=True)
    assert last["evaluated"]["version"] == s.train_iter  # the final weights are evaluated once at the end
    rows = [json.loads(line) for line in open(os.path.join(basic.run_dir, "metrics.jsonl"))]
    assert [r["pipeline"] for r in rows] == ["async"] * len(s.evals)


def test_buffer_and_env_steps_equal_the_results_received(basic):
    d, st, rec = basic.driver, basic.stats, basic.probe.collects
    assert st.results == len(rec) == d.core.counters.collects > 0
    real = sum(r["real_transitions"] for r in rec)
    assert d.core.buffer.pushed_transitions == st.result_transitions == real
    assert d.core.counters.env_steps == basic.summary.env_steps == sum(r["envstep_delta"] for r in rec)
    assert st.dropped_collects == st.collector_restarts == st.evaluator_restarts == 0


def test_collectors_and_evaluators_use_the_published_weights_bit_for_bit(basic):
    d, st = basic.driver, basic.stats
    assert st.digest_mismatches == 0
    for r in basic.probe.collects:
        assert r["digest"] and r["digest"] == d.weights.digests[r["version"]]
        assert r["version"] == r["launch_version"]  # the version fixed at launch is the one reported
    assert basic.probe.evals
    for r in basic.probe.evals:
        assert r["digest"] and r["digest"] == d.weights.digests[r["version"]]
    for path in _ckpts(basic.run_dir):  # the checkpoint holds exactly the evaluated weights
        ev = torch.load(path, weights_only=True)["evaluated"]
        assert weights_digest(ev["weights"]) == d.weights.digests[ev["version"]]


def test_actor_counts_placement_and_cleanup(basic, ray_cluster, alive_after):
    ray, d = ray_cluster, basic.driver
    pg = d.placement.placement_group
    pids = {a["pid"] for a in d.actors.actor_info}
    assert len(pids) == 3 and os.getpid() not in pids  # num_collector_actors=2 + num_evaluator_actors=1
    assert sorted((a["actor_id"]) for a in d.actors.actor_info) == [0, 0, 1]
    assert {r["actor_id"] for r in basic.probe.collects} == {0, 1}  # results from every collector
    assert {r["slot"] for r in basic.probe.collects} == {0, 1}
    assert all(a["placement_group_id"] == pg.id.hex() for a in d.actors.actor_info)
    # the driver's bundle (learn.num_threads), then the collectors' and the evaluator's (the tests' 0.25 each)
    assert ray.util.placement_group_table(pg)["bundles"] == {
        0: {"CPU": 1.0}, 1: {"CPU": 0.25}, 2: {"CPU": 0.25}, 3: {"CPU": 0.25}}
    assert _pg_state(ray, pg) == "REMOVED"
    assert not alive_after(pids)


def test_defaults_max_collect_inflight_policy_lag_and_stats_interval(basic):
    st, s = basic.stats, basic.summary
    assert st.max_collects_inflight == 2  # max_collect_inflight None -> num_collector_actors
    assert st.launch_lags and set(st.launch_lags) == {0}  # max_policy_lag 0: every launch sees the latest
    assert st.max_chunk_steps == 4  # max_train_chunk_steps default
    assert st.max_evals_inflight == 1
    assert st.eval_launch_iters[0] > 0  # no eval_at_start
    # the default budget cap (2 x 2 collectors); collects in flight may each add one budget past it
    assert st.max_budget_queue <= 4 + 2 - 1
    assert s.train_iter > 0


# ------------------------------------------------------------------------------------------ weight publishing


def test_no_collect_launched_beyond_max_policy_lag_and_cpu_bundles(run_async, tmp_path, ray_cluster):
    run = run_async(tmp_path, {
        AP + "max_policy_lag": 2, AP + "weight_sync_interval": 1000, "max_envstep": 240,
        # amounts other than the tests' 0.25 and each other's; the run's 1 + 0.5 + 0.125 fits in 2 CPUs
        AP + "collector_num_cpus": 0.5, AP + "evaluator_num_cpus": 0.125, AP + "max_train_chunk_steps": 3,
        # once trainable, a launch waits for an empty budget queue, so the learner is ahead by then
        AP + "max_train_budget_queue_size": 1,
    })
    st = run.stats
    assert run.summary.stop_reason == "max_envstep"
    assert st.launch_lags and max(st.launch_lags) <= 2
    assert st.publishes > 1 and st.publishes == len(st.publish_versions)
    # with the interval out of reach, each publish was forced by the lag rule: more than 2 versions apart
    assert all(b - a > 2 for a, b in zip(st.publish_versions, st.publish_versions[1:]))
    # max_train_chunk_steps
    assert st.max_chunk_steps == 3
    # collector_num_cpus / evaluator_num_cpus: the placement group's bundles carry those amounts
    pg = run.driver.placement.placement_group
    assert ray_cluster.util.placement_group_table(pg)["bundles"] == {
        0: {"CPU": 1.0}, 1: {"CPU": 0.5}, 2: {"CPU": 0.125}}
    assert _pg_state(ray_cluster, pg) == "REMOVED"


def test_lag_rule_off_publishes_once_and_collect_inflight_and_budget_cap(run_async, tmp_path):
    run = run_async(tmp_path, {
        AP + "num_collector_actors": 2, AP + "max_collect_inflight": 1, AP + "max_policy_lag": -1,
        AP + "weight_sync_interval": 1000, AP + "max_train_budget_queue_size": 1, "max_envstep": 240,
    })
    st = run.stats
    assert run.summary.stop_reason == "max_envstep" and run.summary.train_iter > 0
    assert st.publishes == 1 and st.publish_versions == [0]
    assert max(st.launch_lags) > 0  # collects were launched on stale weights: no lag rule
    assert all(r["version"] == 0 for r in run.probe.collects)
    assert st.max_collects_inflight == 1  # 2 collectors, max_collect_inflight=1
    assert st.max_budget_queue <= 1  # max_train_budget_queue_size=1 (one collect in flight at a time)
    # buffer_stats_interval=100 (default): at most one stats row per 100 train steps besides idle-wait rows
    # and the run's final row
    assert len(run.reporter.progress) - st.idle_waits - 1 <= run.summary.train_iter // 100


@pytest.fixture(scope="module")
def tuned(run_async, tmp_path_factory):
    """One collector, 2 evaluators, 240 env steps, and the keys the two tests below read set away from their
    defaults (each test's keys leave what the other's decide alone)."""
    return run_async(tmp_path_factory.mktemp("tuned"), {
        AP + "max_policy_lag": -1, AP + "weight_sync_interval": 10, AP + "max_train_budget_queue_size": 1,
        AP + "num_evaluator_actors": 2, AP + "max_eval_inflight": 1, AP + "eval_at_start": True,
        AP + "buffer_stats_interval": 5, AP + "max_train_chunk_steps": 1, "eval.eval_freq": 10,
        "max_envstep": 240,
    })


def test_weight_sync_interval_spaces_publishes(tuned):
    st = tuned.stats
    # a launch publishes as soon as the learner is 10 versions ahead, never sooner
    assert st.publishes >= 2
    assert all(b - a >= 10 for a, b in zip(st.publish_versions, st.publish_versions[1:]))
    assert max(st.launch_lags) < 10
    assert st.max_budget_queue <= 1


# ---------------------------------------------------------------------------------------------- other keys


def test_evaluators_eval_at_start_stats_interval_and_chunk(tuned, alive_after):
    run = tuned
    st, rep, s = run.stats, run.reporter, run.summary
    why = f"{st} train_iter={s.train_iter} progress_rows={len(rep.progress)}"  # shown if an assert fails
    # num_evaluator_actors=2 (+1 collector): three processes, and both evaluators evaluated
    pids = {a["pid"] for a in run.driver.actors.actor_info}
    assert len(pids) == 3
    assert {r["actor_id"] for r in run.probe.evals} == {0, 1}, why
    # max_eval_inflight=1 although two evaluators are free
    assert st.max_evals_inflight == 1 and len(st.eval_launch_iters) >= 2, why
    # eval_at_start: the first evaluation is launched at train_iter 0, on the initial weights
    assert st.eval_launch_iters[0] == 0 and rep.evals[0]["policy_version"] == 0, why
    # max_train_chunk_steps=1
    assert st.max_chunk_steps == 1, why
    # buffer_stats_interval=5 with 1-step chunks: one stats row at every multiple of 5, plus one per idle wait
    # and the run's final row
    assert s.train_iter >= 20, why
    assert len(rep.progress) == st.idle_waits + s.train_iter // 5 + 1, why
    iters = {row["train_iter"] for row in rep.progress}
    assert all(k in iters for k in range(5, s.train_iter + 1, 5)), why
    assert not alive_after(pids)


def test_poll_interval_s_is_the_idle_wait(tmp_path, async_config):
    from muzero_tune.distributed.async_driver import AsyncDriver

    took = {}
    for poll in (0.05, 1.0):
        d = AsyncDriver(async_config(tmp_path, {AP + "poll_interval_s": poll}), MemoryReporter())
        t0 = time.monotonic()
        d.wait_any(d.ap.poll_interval_s)  # no actors: nothing pending, so it sleeps the whole interval
        took[poll] = time.monotonic() - t0
        # counted as learner idle time: the whole sleep, measured inside the span timed here
        assert d.stats.idle_waits == 1 and poll <= d.stats.learner_idle_s <= took[poll]
    # it sleeps the interval, not a fixed one: the short wait ends before the long one's interval (a 0.05 s
    # sleep took at most 0.066 s over 200 tries at load average 9 on 2 cores; 1.0 s is 15 times that)
    assert took[0.05] < 1.0 <= took[1.0]


def test_enabled_dispatches_to_the_async_driver(ray_cluster, tmp_path, capsys, async_config, async_small):
    from muzero_tune.api import train
    from muzero_tune.cli import main as cli_main

    small = {k: v for k, v in async_small.items() if k != AP + "enabled"}
    args = ["train", "--async-pipeline"]  # the CLI flag sets policy.async_pipeline.enabled
    for k, v in {**small, "max_envstep": 80, "logging.output_dir": tmp_path, "exp_name": "cli"}.items():
        args += ["--set", f"{k}={'none' if v is None else v}"]
    assert cli_main(args) == 0
    assert "stopped (max_envstep)" in capsys.readouterr().out
    rows = [json.loads(line) for line in open(os.path.join(tmp_path, "cli", "metrics.jsonl"))]
    assert rows and all(r["pipeline"] == "async" for r in rows)
    # and without the flag the same entry point runs the sync driver
    cfg = async_config(tmp_path, {"max_envstep": 80, AP + "enabled": False}, exp_name="sync")
    rep = MemoryReporter()
    train(cfg, reporter=rep)
    assert rep.evals and all(r["pipeline"] == "sync" for r in rep.evals)


@pytest.mark.parametrize("kind", ["collector", "evaluator"])
def test_num_gpus_cannot_be_placed_on_a_cpu_cluster(kind, ray_cluster, tmp_path, async_config):
    from muzero_tune.distributed.async_driver import train_muzero_segment_async
    from muzero_tune.distributed.placement import PlacementError

    cfg = async_config(tmp_path, {AP + f"{kind}_num_gpus": 0.5, AP + "actor_start_timeout_s": 1})
    out: list = []
    t0 = time.monotonic()
    with pytest.raises(PlacementError) as info:
        train_muzero_segment_async(cfg, reporter=MemoryReporter(), driver_out=out)
    took = time.monotonic() - t0
    msg = str(info.value)
    assert "GPU" in msg and "num_gpus" in msg and "policy.async_pipeline" in msg
    assert "'GPU': 0.5" in msg  # the bundle that asked for it
    # it waited actor_start_timeout_s, then failed (Ray alone would wait forever): the 1 s set here, not the
    # default 120 s (the test takes 1.0 s at load averages 4-9 on 2 cores; it took 3.0-3.1 s with a 3 s one)
    assert "not placed within 1 s" in msg and 1 <= took < 60
    gpu_groups = [t for t in ray_cluster.util.placement_group_table().values()
                  if any("GPU" in b for b in t["bundles"].values())]
    assert gpu_groups and all(t["state"] == "REMOVED" for t in gpu_groups)  # the unplaceable group is gone


SHUTDOWN_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def by_hand(ray_cluster, tmp_path_factory, async_config):
    """A driver taken through its start-up step by step, with an evaluation queued behind its evaluator's
    constructor, then a collect that hangs in env.step, then shut down: what it showed at each step."""
    from muzero_tune.distributed.async_driver import AsyncDriver
    from muzero_tune.distributed.placement import standalone_placement
    from muzero_tune.envs.faults import FaultSpec

    ray = ray_cluster
    cfg = async_config(tmp_path_factory.mktemp("by_hand"), {
        AP + "eval_at_start": False, AP + "shutdown_timeout_s": SHUTDOWN_TIMEOUT_S})
    placement = standalone_placement(cfg, learner_on_gpu=False, timeout_s=30)
    d = AsyncDriver(cfg, MemoryReporter(), placement=placement,
                    fault=FaultSpec("collector", (0,), 1, 10**9, "hang"))
    seen: dict = {"placement": placement}
    try:
        seen["created_with_the_learner"] = {
            "collectors": [s.handle is not None for s in d.actors.collectors],
            "evaluators": [s.handle is not None for s in d.actors.evaluators]}
        d.start_actors()
        seen["answered_at_start"] = [a["kind"] for a in d.actors.actor_info]
        seen["booting_at_start"] = [s.index for s in d.actors.booting.values()]
        d.launch_eval(force=True)
        (launch,) = d.evals.values()
        launched_at = launch.t_launch
        d.check_started(timeout=60)
        seen["booting_after"] = list(d.actors.booting)
        seen["answered_after"] = sorted(a["kind"] for a in d.actors.actor_info)
        seen["eval_clock_restarted"] = launch.t_launch > launched_at
        (ref,) = d.evals
        seen["eval_version"] = ray.get(ref, timeout=120).policy_version
        d.launch_collects()
        (seen["collect"],) = list(d.collects)
        seen["collect_done_within_1s"] = bool(ray.wait([seen["collect"]], timeout=1.0)[0])
    finally:
        t0 = time.monotonic()
        d.shutdown()
        seen["shutdown_s"] = time.monotonic() - t0
    seen["pids"] = [a["pid"] for a in d.actors.actor_info]
    return seen


def test_shutdown_timeout_s_bounds_closing_hung_actors(by_hand, ray_cluster, alive_after):
    """The collector's close() is queued behind its hung collect: the shutdown waits shutdown_timeout_s (the
    1 s set here, not the default 30 s), then kills every actor (1.01 s over 4 runs at load averages 2-4 on
    2 cores; the bound below the default is 25 times that)."""
    ray = ray_cluster
    assert not by_hand["collect_done_within_1s"]  # the collect hangs in env.step
    assert SHUTDOWN_TIMEOUT_S - 0.1 <= by_hand["shutdown_s"] < 25
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(by_hand["collect"], timeout=30)
    assert _pg_state(ray, by_hand["placement"].placement_group) == "REMOVED"
    assert len(by_hand["pids"]) == 2 and not alive_after(by_hand["pids"])


def test_collectors_boot_beside_the_learner_and_evaluators_while_it_trains(by_hand):
    """Start-up: the collectors are created before the learner is built, the evaluators after it; without
    eval_at_start only the collectors' pings are awaited; an evaluation due meanwhile is queued behind the
    evaluator's constructor, and its clock (busy time, eval_timeout_s) starts when the evaluator answers."""
    assert by_hand["created_with_the_learner"] == {"collectors": [True], "evaluators": [False]}
    assert by_hand["answered_at_start"] == ["collector"]
    assert by_hand["booting_at_start"] == [0]  # the evaluator, booting
    assert by_hand["booting_after"] == []
    assert by_hand["answered_after"] == ["collector", "evaluator"]
    assert by_hand["eval_clock_restarted"]  # its clock restarted when the evaluator was up
    assert by_hand["eval_version"] == 0  # and it evaluated


def test_a_learner_that_fails_to_build_takes_its_booting_collectors_down(monkeypatch, ray_cluster, tmp_path,
                                                                          async_config):
    """The collectors start before the learner is built: when that build raises, the error reaches the
    caller and the collectors and the run's placement group are gone."""
    from muzero_tune.distributed import actor_pool, async_driver

    spawned = []
    spawn = actor_pool.ActorPool.spawn

    def recording_spawn(self, slot):
        spawn(self, slot)
        spawned.append(slot.handle)

    def broken_core(*args, **kwargs):
        raise RuntimeError("the learner could not be built")

    monkeypatch.setattr(actor_pool.ActorPool, "spawn", recording_spawn)
    monkeypatch.setattr(async_driver, "DriverCore", broken_core)
    before = set(ray_cluster.util.placement_group_table())
    # a short shutdown_timeout_s: the booting collector's close() would wait for its constructor
    cfg = async_config(tmp_path, {AP + "shutdown_timeout_s": 0.5})
    with pytest.raises(RuntimeError, match="the learner could not be built"):
        async_driver.train_muzero_segment_async(cfg, reporter=MemoryReporter())
    groups = {k: v for k, v in ray_cluster.util.placement_group_table().items() if k not in before}
    assert len(groups) == 1 and all(g["state"] == "REMOVED" for g in groups.values())
    assert spawned  # the collectors had been created
    for handle in spawned:
        with pytest.raises(ray_cluster.exceptions.RayActorError):
            ray_cluster.get(handle.ping.remote(), timeout=30)


def test_ray_local_mode_runs_actors_in_the_driver_process(fresh_process):
    out = fresh_process["local"]
    assert out["stop"] == "max_envstep" and out["train_iter"] > 0 and out["evals"] >= 1
    assert len(out["actors"]) == 2 and all(a["pid"] == out["pid"] for a in out["actors"])
    assert all(a["placement_group_id"] is None for a in out["actors"])
    assert out["ray_up"] is False  # no Ray instance at all
    assert out["results"] > 0 and out["mismatches"] == 0


# ---------------------------------------------------------------------------------------- policy lag, budgets


def test_policy_lag_is_reported_at_launch_and_at_push(basic):
    """max_policy_lag=0 bounds the lag at launch (policy_lag_*: 0 here); the lag at push adds the train steps
    taken while the collect ran (policy_lag_at_push_*), which no setting bounds."""
    st = basic.stats
    m = basic.driver.pipeline_metrics()
    assert m["policy_lag_max"] == 0 and m["policy_lag_mean"] == 0.0
    assert len(st.push_lags) == st.results and len(st.launch_lags) >= st.results
    assert m["policy_lag_at_push_max"] == max(st.push_lags[-100:]) > 0
    assert m["policy_lag_at_push_mean"] == pytest.approx(sum(st.push_lags[-100:]) / len(st.push_lags[-100:]))


def test_zero_step_budgets_train_nothing_and_still_reanalyze(run_async, tmp_path):
    """80 transitions per collect at replay_ratio 0.01 owe 0.8 steps: budgets of 0 and 1 steps. A 0-step
    budget must train nothing (steps never exceed the ratio's total) and still run its reanalyze calls."""
    run = run_async(tmp_path, {
        "learn.replay_ratio": 0.01, "replay.buffer_reanalyze_freq": 2, "replay.reanalyze_batch_size": 4,
    })
    core, st = run.driver.core, run.stats
    assert run.summary.stop_reason == "max_envstep"
    assert 0 < run.summary.train_iter <= int(0.01 * st.result_transitions)
    assert core.counters.train_epoch >= 3
    assert core.counters.reanalyze_calls == 2 * core.counters.train_epoch


ACTING = """
import json, sys
import numba.typed.typedlist as typedlist
from numba.core.dispatcher import Dispatcher
from muzero_tune.config import make_config, to_flat_dict
from muzero_tune.distributed.actors import CollectorWorker, EvaluatorWorker
from muzero_tune.policies.registry import POLICY_CLASSES
small = {"logging.quiet": True, "mcts.num_simulations": 2, "env.collector_env_num": 1,
         "env.evaluator_env_num": 1, "eval.n_episodes": 1, "env.max_episode_steps": 8, "model.hidden_dim": 16,
         "model.latent_dim": 8, "replay.game_segment_length": 8}
for ptype in POLICY_CLASSES:
    preset = "pendulum_sampled_unizero" if ptype == "sampled_unizero" else f"cartpole_{ptype}"
    flat = to_flat_dict(make_config(preset, overrides=small))
    collector, evaluator = CollectorWorker(flat, 0), EvaluatorWorker(flat, 0)
    assert collector.worker.collect(collector.model, temperature=1.0, policy_version=0).segments, ptype
    evaluator.worker.evaluate(evaluator.model, policy_version=0)
methods = {n: getattr(typedlist, n) for n in dir(typedlist)}
compiled = [n for n, f in methods.items() if isinstance(f, Dispatcher) and f.signatures]
acting = {"dynamo": "torch._dynamo" in sys.modules, "typed_list_methods_compiled": compiled}
print(json.dumps({"acting": acting}))
"""

# a tiny local-mode async run (its learner imports torch._dynamo: after the acting check above)
LOCAL_MODE = """
import os
from muzero_tune.distributed.async_driver import train_muzero_segment_async
from muzero_tune.runs.reporter import MemoryReporter
cfg = make_config("cartpole_muzero", overrides=OVERRIDES)
out = []
s = train_muzero_segment_async(cfg, reporter=MemoryReporter(), driver_out=out)
import ray
st = out[0].stats
print(json.dumps({"local": {"pid": os.getpid(), "actors": out[0].actors.actor_info, "stop": s.stop_reason,
                            "evals": len(s.evals), "train_iter": s.train_iter, "ray_up": ray.is_initialized(),
                            "mismatches": st.digest_mismatches, "results": st.results}}))
"""


@pytest.fixture(scope="module")
def fresh_process(tmp_path_factory, async_small):
    """One fresh Python process (no Ray, nothing imported): every policy type's collector and evaluator
    built and acting as their Ray actors do (``ACTING``), then a 80-env-step async run in Ray local mode
    (``LOCAL_MODE``); what each printed."""
    overrides = {**async_small, "max_envstep": 80, AP + "ray_local_mode": True,
                 "logging.output_dir": str(tmp_path_factory.mktemp("local_mode"))}
    code = ACTING + LOCAL_MODE.replace("OVERRIDES", repr(overrides))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {k: v for line in lines for k, v in line.items()}


def test_acting_processes_start_without_compiling(fresh_process):
    """A collector's and an evaluator's process (every type's, built and acting as its Ray actor does) never
    import ``torch._dynamo`` (about a second of a start, which only a compiled learner needs) and compile no
    method of numba's typed list (the host kernel's layer lists come from numba's disk cache; compiled from
    Python they cost about 0.3 s of each actor's first search)."""
    out = fresh_process["acting"]
    assert out == {"dynamo": False, "typed_list_methods_compiled": []}, out
