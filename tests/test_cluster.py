"""Multi-node: the async pipeline and the Tune trainable on a Ray cluster of three nodes on this machine.

A ``ray.cluster_utils.Cluster`` (a head and two workers, every node bound to this machine's address) needs
its own ``ray.init``, so this module disconnects from the session's local Ray first and starts it again
afterwards for the modules that follow. Every assertion is on where things ran (node ids the actors report,
not assumed) and on exact counters; none on rewards or timings.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

import pytest
from conftest import RAY_TEST_CPUS, DriverProbe, _async_config

from tests.oracles.replay_streams import partial_collects

AP = "policy.async_pipeline."
HEAD_CPUS, WORKER_CPUS = 2, 1


@pytest.fixture(scope="module")
def three_nodes():
    """A head (2 CPUs: the driver's bundle plus room for one rescheduled bundle) and two 1-CPU workers."""
    import ray
    from ray.cluster_utils import Cluster

    was_local = ray.is_initialized()
    if was_local:
        ray.shutdown()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": HEAD_CPUS, "include_dashboard": False},
    )
    workers = [cluster.add_node(num_cpus=WORKER_CPUS) for _ in range(2)]
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    yield {"cluster": cluster, "workers": workers, "ray": ray}
    ray.shutdown()
    cluster.shutdown()
    if was_local:  # the session fixture's local Ray, as conftest.ray_cluster starts it
        ray.init(num_cpus=RAY_TEST_CPUS, include_dashboard=False, log_to_driver=False)


def _nodes_alive(ray) -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


def _seen_dead(ray, node_id: str, timeout_s: float = 120.0) -> bool:
    """Whether Ray's node table reports ``node_id`` dead within ``timeout_s``: a node removed without a
    graceful stop is marked dead by the control store's health checks, seconds after it is gone, and a
    short run can end before that."""
    deadline = time.monotonic() + timeout_s
    while node_id in _nodes_alive(ray):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def _check_exact_counters(driver, probe) -> None:
    """Only whole results reached the buffer and the counters (a collect lost with its node left no trace):
    the counters agree with what the driver handled, and the buffer's own contents hold whole collects only
    (:func:`~tests.oracles.replay_streams.partial_collects`)."""
    core, st, buf = driver.core, driver.stats, driver.core.buffer
    assert st.results == len(probe.collects) == core.counters.collects
    assert buf.pushed_transitions == st.result_transitions
    assert st.result_transitions == sum(r["real_transitions"] for r in probe.collects)
    assert core.counters.env_steps == sum(r["envstep_delta"] for r in probe.collects)
    assert buf.base_idx == 0 and buf.num_transitions == sum(s.num_real for s in buf.segments) > 0
    problems, _ = partial_collects(driver.cfg, buf.segments, core.counters.env_steps,
                                   incarnations=st.collector_restarts + 1)  # fmt: skip
    assert problems == []


def _run(tmp_path, overrides, probe, *, exp_name):
    from muzero_tune.distributed.async_driver import train_muzero_segment_async
    from muzero_tune.runs.reporter import MemoryReporter

    cfg = _async_config(tmp_path, overrides, exp_name=exp_name)
    return train_muzero_segment_async(cfg, reporter=MemoryReporter(), driver_out=probe)


def test_spread_puts_the_actors_on_other_nodes_and_data_crosses_them_unchanged(three_nodes, tmp_path):
    ray = three_nodes["ray"]
    me = ray.get_runtime_context().get_node_id()
    probe = DriverProbe()
    summary = _run(
        tmp_path,
        {AP + "placement_strategy": "SPREAD", AP + "verify_segment_digests": True, "max_envstep": 300},
        probe,
        exp_name="spread",
    )
    driver, st = probe.driver, probe.driver.stats
    assert summary.stop_reason == "max_envstep" and summary.train_iter > 0
    nodes = [i["node_id"] for i in driver.actors.actor_info]  # [collector, evaluator], as they report
    assert len(nodes) == 2 and me not in nodes and len(set(nodes)) == 2
    assert set(st.collect_nodes) == {nodes[0]}  # every collect came from the collector's (other) node
    assert st.results >= 3 and st.segment_digest_checks == st.results
    assert st.segment_digest_mismatches == 0 and st.digest_mismatches == 0
    assert all(r["digest"] == driver.weights.digests[r["version"]] for r in probe.collects + probe.evals)
    _check_exact_counters(driver, probe)


@contextlib.contextmanager
def _a_collectors_node_removed(three_nodes, probe, *, collectors: int):
    """While the block runs: once the run has two collects, remove (not gracefully) the worker node of its
    first collector that is not on the head, recording its node id in the yielded dict; afterwards, add a
    worker back so the next test has three nodes again."""
    ray, cluster, workers = three_nodes["ray"], three_nodes["cluster"], three_nodes["workers"]
    me = ray.get_runtime_context().get_node_id()
    removed: dict = {}

    def remove() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and len(probe.collects) < 2:
            time.sleep(0.05)
        info = probe[0].actors.actor_info if probe else None
        if info is None:
            return
        off_head = [i for i in info[:collectors] if i["node_id"] != me]
        node = next(w for w in workers if w.node_id == off_head[0]["node_id"])
        removed["node_id"] = node.node_id
        cluster.remove_node(node, allow_graceful=False)
        workers.remove(node)

    killer = threading.Thread(target=remove, daemon=True)
    killer.start()
    try:
        yield removed
    finally:
        killer.join(timeout=300)
        workers.append(cluster.add_node(num_cpus=WORKER_CPUS))  # three nodes again for the next test
        cluster.wait_for_nodes()


@pytest.mark.slow  # about 65 s on top of the cluster's start-up (2 loaded cores)
def test_losing_the_collectors_node_restarts_it_where_its_bundle_is_rescheduled(three_nodes, tmp_path):
    """The proof this slow check makes at full size.

    Default-tier twin:
    tests/test_async_faults.py::test_failed_collector_is_restarted_and_its_collect_dropped
    tests/test_cluster.py::test_spread_puts_the_actors_on_other_nodes_and_data_crosses_them_unchanged
    """
    ray = three_nodes["ray"]
    me = ray.get_runtime_context().get_node_id()
    probe = DriverProbe()
    with _a_collectors_node_removed(three_nodes, probe, collectors=1) as removed:
        summary = _run(
            tmp_path,
            {AP + "placement_strategy": "SPREAD", "max_envstep": 600, AP + "actor_start_timeout_s": 120},
            probe,
            exp_name="node_lost",
        )
    driver, st = probe.driver, probe.driver.stats
    assert removed and removed["node_id"] != me and _seen_dead(ray, removed["node_id"])
    assert summary.stop_reason == "max_envstep" and summary.env_steps >= 600
    assert st.collector_restarts == 1 and st.collector_failures == 1 and st.dropped_collects <= 1
    assert st.evaluator_restarts == 0
    after = {p["node_id"] for p in probe.actor_pings() if p["kind"] == "collector" and p["incarnation"] == 1}
    assert len(after) == 1 and removed["node_id"] not in after  # the new collector lives on a live node
    assert set(st.collect_nodes) == {removed["node_id"], *after}
    _check_exact_counters(driver, probe)


@pytest.mark.slow  # about two minutes on top of the cluster's start-up
def test_a_collector_lost_with_no_room_left_leaves_the_run_going_on_the_other(three_nodes, tmp_path, caplog):
    """Every CPU of the three nodes is taken (the driver, two collectors and an evaluator, SPREAD): a worker
    holding a collector is removed, its bundle has nowhere to go, and the run reaches its budget on the
    other collector, reporting the reduced pool.

    The start timeout is five times what starting the actors takes here under load (about 3 s), and the
    run's remaining 23,800 env steps on one collector take four times that timeout or more on 2 cores (6,000
    took about the timeout itself on an idle machine), so the replacement is reported once as not started
    while the run goes on, and killed at the end without waiting out the shutdown timeout.

    Default-tier twin:
    tests/test_async_faults.py::test_a_collector_given_up_leaves_the_run_going_on_the_others
    tests/test_cluster.py::test_spread_puts_the_actors_on_other_nodes_and_data_crosses_them_unchanged
    """
    ray = three_nodes["ray"]
    probe = DriverProbe()
    with _a_collectors_node_removed(three_nodes, probe, collectors=2) as removed:
        with caplog.at_level("WARNING", logger="muzero_tune"):
            summary = _run(
                tmp_path,
                {AP + "placement_strategy": "SPREAD", AP + "num_collector_actors": 2, "max_envstep": 24_000,
                 AP + "actor_start_timeout_s": 15, AP + "shutdown_timeout_s": 60},
                probe,
                exp_name="no_room",
            )  # fmt: skip
    driver, st = probe.driver, probe.driver.stats
    assert removed and _seen_dead(ray, removed["node_id"])
    assert summary.stop_reason == "max_envstep" and summary.env_steps >= 24_000
    assert st.collector_failures == 1 and st.collector_restarts == 1 and st.evaluator_restarts == 0
    assert sorted(s.state for s in driver.actors.collectors) == ["starting", "up"]  # still waited for
    assert st.shutdown_s < 30  # the one still starting is killed at the end, not asked to close (60 s wait)
    assert summary.evals[-1]["pipeline/collectors_up"] == 1
    waiting = [r.getMessage() for r in caplog.records if "did not start again" in r.getMessage()]
    assert len(waiting) == 1 and "the run goes on with 1 of 2 collectors" in waiting[0]
    _check_exact_counters(driver, probe)


@pytest.mark.slow  # about 2 min: two async trials at once on the three nodes
def test_a_two_trial_sweep_spreads_over_the_three_nodes(three_nodes, tmp_path):
    """The proof this slow check makes at full size.

    Default-tier twin:
    tests/test_cluster.py::test_spread_puts_the_actors_on_other_nodes_and_data_crosses_them_unchanged
    tests/test_tune.py::test_async_trials_run_concurrently_with_their_actors_in_their_own_bundles
    """
    from mlflow.tracking import MlflowClient
    from ray import tune

    from muzero_tune.runs.mlflow_log import TRIAL_TAG
    from muzero_tune.tune.sweep import run_sweep

    ray = three_nodes["ray"]
    overrides = {
        "model.hidden_dim": 32, "model.latent_dim": 16, "mcts.num_simulations": 4, "learn.batch_size": 32,
        "env.collector_env_num": 4, "env.evaluator_env_num": 2, "eval.n_episodes": 2, "eval.eval_freq": 20,
        "replay.game_segment_length": 20, "max_envstep": 300, "stop_value": None, "logging.quiet": True,
        "tune.storage_path": str(tmp_path / "tune"), AP + "placement_strategy": "SPREAD",
        AP + "collector_num_cpus": 0.5, AP + "evaluator_num_cpus": 0.5,  # a trial: 1 + 0.5 + 0.5 CPUs
    }  # fmt: skip
    res = run_sweep(
        "policy_lag_grid", overrides=overrides, max_concurrent=2, name="cluster_sweep",
        param_space_extra={AP + "weight_sync_interval": tune.grid_search([1, 4])},
    )  # fmt: skip
    results = list(res.results)
    assert len(results) == 2 and not res.results.errors
    used: set[str] = set()
    for r in results:
        df = r.metrics_dataframe
        first = df.iloc[0]
        assert first["placement/strategy"] == "SPREAD" and first["placement/actors_in_trial_pg"] == 1
        used |= {first["placement/driver_node"], *first["placement/actor_nodes"].split()}
        assert r.metrics["envstep"] >= 300
    assert used == _nodes_alive(ray)  # the two trials' drivers and actors covered all three nodes
    client = MlflowClient(res.tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name(res.experiment_name).experiment_id])
    assert sorted(run.data.tags[TRIAL_TAG] for run in runs) == sorted(r.metrics["trial_id"] for r in results)
    assert all(run.info.status == "FINISHED" for run in runs)


@pytest.mark.slow  # about 2 min: a trial, its node removed after its first checkpoint, the retry elsewhere
def test_losing_the_trials_own_node_retries_it_from_its_checkpoint_with_one_mlflow_run(three_nodes, tmp_path):
    """The proof this slow check makes at full size.

    Default-tier twin:
    tests/test_tune.py::test_trial_error_is_retried_from_its_last_checkpoint_and_counters_continue
    tests/test_cluster.py::test_spread_puts_the_actors_on_other_nodes_and_data_crosses_them_unchanged
    """
    import csv
    import glob

    from mlflow.tracking import MlflowClient
    from ray import tune
    from ray.util import placement_group, placement_group_table, remove_placement_group
    from ray.util.placement_group import NODE_ID_LABEL_KEY

    from muzero_tune.runs.mlflow_log import TRIAL_TAG
    from muzero_tune.tune.sweep import run_sweep

    ray, cluster = three_nodes["ray"], three_nodes["cluster"]
    head = cluster.head_node.node_id
    # the head's CPUs taken, and one 2-CPU node added: the trial (1 + 0.5 + 0.5 CPUs, PACK) lands there
    blocker = placement_group([{"CPU": HEAD_CPUS}], bundle_label_selector=[{NODE_ID_LABEL_KEY: head}])
    assert blocker.wait(60)
    big = cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    storage = tmp_path / "tune"
    removed: dict = {}

    def remove_trial_node() -> None:
        deadline = time.monotonic() + 300
        pattern = str(storage / "node_lost" / "*" / "checkpoint_*")
        while time.monotonic() < deadline and not glob.glob(pattern):
            time.sleep(0.2)
        for pg in placement_group_table().values():
            if pg["state"] == "CREATED" and pg["placement_group_id"] != blocker.id.hex():
                if pg["bundles_to_node_id"].get(0) == big.node_id:
                    removed["node_id"] = big.node_id
                    cluster.remove_node(big, allow_graceful=False)
                    return

    killer = threading.Thread(target=remove_trial_node, daemon=True)
    killer.start()
    overrides = {
        "model.hidden_dim": 32, "model.latent_dim": 16, "mcts.num_simulations": 4, "learn.batch_size": 32,
        "env.collector_env_num": 4, "env.evaluator_env_num": 2, "eval.n_episodes": 2, "eval.eval_freq": 20,
        # collectors run ahead of the learner: the first checkpoint (when the node goes) can come after 600
        # env steps, so the run is longer than that and the retry has env steps left to collect and train on
        "replay.game_segment_length": 20, "max_envstep": 1500, "stop_value": None, "logging.quiet": True,
        "tune.storage_path": str(storage), "tune.max_failures": 1, "tune.checkpoint_num_to_keep": None,
        "learn.resume_warmup_transitions": 64,  # the retry trains again (and reports) soon after it resumes
        AP + "collector_num_cpus": 0.5, AP + "evaluator_num_cpus": 0.5,
    }  # fmt: skip
    try:
        res = run_sweep("policy_lag_grid", overrides=overrides, max_concurrent=1, name="node_lost",
                        param_space_extra={AP + "weight_sync_interval": tune.grid_search([4])})  # fmt: skip
    finally:
        killer.join(timeout=300)
        remove_placement_group(blocker)
    assert removed.get("node_id") == big.node_id and _seen_dead(ray, big.node_id)
    (result,) = list(res.results)
    assert not res.results.errors and result.metrics["envstep"] >= overrides["max_envstep"]
    with open(os.path.join(result.path, "progress.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    n = len(rows)
    starts = [i for i, r in enumerate(rows) if r["iterations_since_restore"] == "1"]
    assert len(starts) == 2  # one retry (the first process may report again before its node goes)
    retry = starts[1]
    assert [int(float(r["training_iteration"])) for r in rows] == list(range(1, n + 1))
    assert [int(float(r["eval_index"])) for r in rows] == list(range(1, n + 1))  # no gap, no repeat
    assert {r["pid"] for r in rows[:retry]} == {rows[0]["pid"]}
    assert rows[retry]["pid"] != rows[0]["pid"]  # the retry: a new trial process, on a live node
    for key in ("envstep", "train_iter"):  # continued from the checkpoint (two reports may share counters:
        vals = [int(float(r[key])) for r in rows]  # an evaluation finishing as the final one is launched)
        assert all(a <= b for a, b in zip(vals, vals[1:])) and vals[retry] > vals[retry - 1], (key, vals)
    client = MlflowClient(res.tracking_uri)
    exp = client.get_experiment_by_name(res.experiment_name)
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1 and runs[0].data.tags[TRIAL_TAG] == result.metrics["trial_id"]
    assert runs[0].info.status == "FINISHED"
    hist = client.get_metric_history(runs[0].info.run_id, "eval_index")
    assert sorted(int(m.value) for m in hist) == list(range(1, n + 1))
