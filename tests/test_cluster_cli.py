"""The command line on a Ray cluster: ``--address`` / ``RAY_ADDRESS`` join a running cluster, and an
unreachable one is one line naming the address.

The real-cluster test starts a head and a worker with ``ray start --block`` in their own process sessions,
on free ports and a short temp dir of its own, and stops them by terminating exactly those two processes
(``ray stop`` would stop every Ray on the machine); it then checks that nothing of either session is left.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest
from conftest import CLI_SMALL, run_cli, set_args

RAY_BIN = os.path.join(os.path.dirname(sys.executable), "ray")
AP = "policy.async_pipeline."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_ports() -> list[str]:
    """Every port a node opens, chosen free, so this cluster never meets another one on the machine."""
    flags = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
             "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port")  # fmt: skip
    return [x for f in flags for x in (f, str(_free_port()))]


def _session_pids(leaders: list[int]) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.getsid(int(name)) in leaders:
                    out.append(int(name))
            except OSError:
                pass
    return out


def test_unreachable_address_is_one_line_naming_it_before_anything_is_written(tmp_path):
    out = tmp_path / "runs"
    paths = ["--set", f"logging.output_dir={out}", "--set", f"tune.storage_path={tmp_path / 'tune'}"]
    # train with --address, sweep with RAY_ADDRESS (resume takes the same path as sweep)
    for cmd, env in ((["train", "--async-pipeline", "--address", "127.0.0.1:9"], {}),
                     (["sweep"], {"RAY_ADDRESS": "127.0.0.1:9"})):  # fmt: skip
        res = run_cli([*cmd, "--connect-timeout-s", "2", *paths], cwd=tmp_path, env=env, timeout=120)
        assert res.returncode == 2, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "cannot reach the Ray cluster at 127.0.0.1:9 within 2 s" in lines[0]
    assert not out.exists()  # no run folder was claimed


@pytest.mark.slow  # about 90 s: two `ray start`, an async run through the CLI, the shutdown
def test_train_joins_a_cluster_started_with_ray_start_and_both_nodes_stop_at_the_end(tmp_path):
    """The proof this slow check makes at full size.

    Default-tier twin:
    tests/test_cluster_cli.py::test_unreachable_address_is_one_line_naming_it_before_anything_is_written
    tests/test_cluster.py::test_spread_puts_the_actors_on_other_nodes_and_data_crosses_them_unchanged
    """
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    temp_dir = tempfile.mkdtemp(prefix="mzt_ray_", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    gcs_port = _free_port()
    address = f"127.0.0.1:{gcs_port}"
    common = ["--block", "--disable-usage-stats", "--node-ip-address", "127.0.0.1"]
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen(
            [RAY_BIN, "start", "--head", "--port", str(gcs_port), "--num-cpus", "1", "--include-dashboard",
             "false", "--temp-dir", temp_dir, *common, *_node_ports()],
            env=env, start_new_session=True, stdout=open(tmp_path / "head.log", "w"),
            stderr=subprocess.STDOUT,
        ))  # fmt: skip
        deadline = time.monotonic() + 90
        while True:
            try:
                socket.create_connection(("127.0.0.1", gcs_port), timeout=1).close()
                break
            except OSError:
                up = time.monotonic() < deadline and procs[0].poll() is None
                assert up, (tmp_path / "head.log").read_text()
                time.sleep(0.5)
        procs.append(subprocess.Popen(
            [RAY_BIN, "start", "--address", address, "--num-cpus", "3", *common, *_node_ports()],
            env=env, start_new_session=True, stdout=open(tmp_path / "worker.log", "w"),
            stderr=subprocess.STDOUT,
        ))  # fmt: skip
        time.sleep(5)  # the worker registers with the head; the driver's placement group waits for it anyway
        res = run_cli(
            ["train", "--address", address, *set_args({
                **CLI_SMALL, "policy.async_pipeline.enabled": True, "max_envstep": 200, "exp_name": "joined",
                "logging.output_dir": str(tmp_path / "runs"), AP + "actor_start_timeout_s": 120,
            })],
            cwd=tmp_path, env=env, timeout=400,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr[-3000:]
        assert f"joined the Ray cluster at {address}" in res.stderr
        assert "stopped (max_envstep)" in res.stdout
        rows = [json.loads(x) for x in open(tmp_path / "runs" / "joined" / "metrics.jsonl")]
        # the head's one CPU holds the driver's bundle: the collector ran on the worker node
        assert rows and rows[-1]["pipeline/collect_nodes"] == 1 and rows[-1]["envstep"] >= 200
    finally:
        leaders = [p.pid for p in procs]
        for p in reversed(procs):  # the worker first, then the head
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
        deadline = time.monotonic() + 30
        while _session_pids(leaders) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _session_pids(leaders)
        for pid in left:  # only processes of the two sessions this test started
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert not left


def test_placement_strategy_and_cluster_fit_are_checked_before_anything_starts():
    from muzero_tune.config import ConfigError, make_config
    from muzero_tune.distributed.cluster import ClusterError, check_reachable
    from muzero_tune.tune.resources import trial_bundles
    from muzero_tune.tune.sweep import check_bundles_fit_nodes

    with pytest.raises(ConfigError, match=r"placement_strategy.*'SPRED'.*PACK.*SPREAD.*STRICT_SPREAD"):
        make_config("cartpole_muzero", overrides={AP + "placement_strategy": "SPRED"})
    cfg = make_config("cartpole_muzero", overrides={AP + "enabled": True,
                                                    AP + "placement_strategy": "STRICT_SPREAD"})  # fmt: skip
    bs = trial_bundles(cfg, cluster_gpus=0)  # driver, collector, evaluator: one CPU each
    nodes = [{"node_id": str(i), "resources": {"CPU": 4.0}} for i in range(3)]
    check_bundles_fit_nodes(cfg, bs, nodes)  # three nodes, three bundles: fits
    with pytest.raises(ConfigError, match="STRICT_SPREAD.*3 bundles.*2 nodes"):
        check_bundles_fit_nodes(cfg, bs, nodes[:2])
    spread = make_config("cartpole_muzero", overrides={AP + "enabled": True,
                                                       AP + "placement_strategy": "SPREAD"})  # fmt: skip
    check_bundles_fit_nodes(spread, bs, nodes[:2])  # SPREAD is best effort: two nodes are enough
    big = make_config("cartpole_muzero", overrides={AP + "enabled": True, AP + "collector_num_cpus": 8})
    with pytest.raises(ConfigError, match=r"bundle 1 .*fits no node"):
        check_bundles_fit_nodes(big, trial_bundles(big, cluster_gpus=0), nodes)
    with pytest.raises(ClusterError, match="expected HOST:PORT"):
        check_reachable("localhost")
