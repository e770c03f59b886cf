"""A cluster's storage: an MLflow tracking server (a real ``mlflow server`` process, its ``http://`` URI) for
sweeps and standalone runs, and ``tune.storage_path`` as a ``file://`` URI (an object store's URI goes to Ray
Tune and ``pyarrow.fs`` the same way; none runs here)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from muzero_tune.config import ConfigError, make_config

TINY = {
    "model.hidden_dim": 32, "model.latent_dim": 16, "mcts.num_simulations": 4, "learn.batch_size": 32,
    "env.collector_env_num": 4, "env.evaluator_env_num": 2, "eval.n_episodes": 2, "eval.eval_freq": 20,
    "replay.game_segment_length": 20, "max_envstep": 100, "stop_value": None, "logging.quiet": True,
}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A real ``mlflow server`` process, started at once; :meth:`uri` waits until it answers."""

    def __init__(self, root):
        self.root, port = root, _free_port()
        cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
               "--backend-store-uri", f"sqlite:///{root}/server.db", "--artifacts-destination",
               str(root / "art"), "--workers", "1"]  # fmt: skip
        # the tracking API alone: no job runner beside it (a second interpreter importing MLflow, for
        # server-side jobs no test here runs)
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self.log = open(root / "server.log", "w")
        # its own process group: the CLI and the uvicorn process it starts end together at teardown
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        self._uri, self._up = f"http://127.0.0.1:{port}", False

    def uri(self) -> str:
        deadline = time.monotonic() + 240  # it answers 10-20 s after its start on 2 busy cores
        while not self._up:
            try:
                with urllib.request.urlopen(self._uri + "/health", timeout=5) as r:
                    self._up = r.status == 200
            except OSError:
                pass
            if not self._up and (self.proc.poll() is not None or time.monotonic() > deadline):
                self.kill()
                pytest.fail(f"mlflow server did not start: {(self.root / 'server.log').read_text()[-2000:]}")
            time.sleep(0 if self._up else 0.2)
        return self._uri

    def kill(self) -> None:
        """SIGKILL the server's processes (a scratch store: nothing to shut down cleanly)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # all gone already
            pass
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module", autouse=True)
def mlflow_server(tmp_path_factory):
    """``mlflow server`` on a free local port (its own sqlite store and artifact folder), started as the
    module's first test starts, so its start overlaps the work before the first test that calls ``uri()``."""
    server = Server(tmp_path_factory.mktemp("mlflow_server"))
    yield server
    server.kill()
    server.log.close()


def test_storage_paths_and_uris_are_read_before_any_work():
    from muzero_tune.tune.storage import default_tracking_uri_for, storage_of

    assert storage_of("file:///tmp/a%20b").local == "/tmp/a b"
    assert storage_of("rel/dir").local == os.path.abspath("rel/dir")
    with pytest.raises(ConfigError, match="names this machine"):
        storage_of("file://elsewhere/x")
    with pytest.raises(ConfigError, match="pyarrow can open"):
        storage_of("nosuchscheme://bucket/x")
    remote = storage_of("mock://bucket/sweeps")  # pyarrow's in-memory filesystem: a remote URI
    assert remote.local is None and remote.join("a", "b") == "mock://bucket/sweeps/a/b"
    with pytest.raises(ConfigError, match="is remote, where an sqlite store cannot live"):
        default_tracking_uri_for(remote)


def test_a_sweep_logs_to_a_tracking_server_and_stores_at_a_file_uri(mlflow_server, ray_cluster, tmp_path):
    from mlflow.tracking import MlflowClient

    from muzero_tune.tune.sweep import SWEEP_FILE, run_sweep

    uri = mlflow_server.uri()
    storage = tmp_path / "sweeps"
    res = run_sweep("blank", name="served", overrides={
        **TINY, "tune.storage_path": f"file://{storage}", "tune.mlflow_tracking_uri": uri,
    }, param_space_extra={"seed": 0})  # fmt: skip
    (trial,) = list(res.results)
    assert trial.error is None and trial.metrics["eval_index"] >= 1
    assert res.experiment_path == str(storage / "served")  # the URI's folder, not the URI made relative
    with open(storage / "served" / SWEEP_FILE) as f:
        assert json.load(f)["tracking_uri"] == uri
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("served").experiment_id])
    assert run.data.tags["seed"] == "0"
    assert len(client.get_metric_history(run.info.run_id, "reward_mean")) >= 1
    assert not os.path.exists(storage / "mlflow.db")  # no sqlite store beside the trials


def test_a_standalone_run_logs_to_a_tracking_server(mlflow_server, tmp_path):
    from mlflow.tracking import MlflowClient

    from muzero_tune.api import train

    uri = mlflow_server.uri()
    cfg = make_config("cartpole_muzero", overrides={
        **TINY, "logging.output_dir": str(tmp_path), "logging.mlflow": True,
        "logging.mlflow_tracking_uri": uri,
    })  # fmt: skip
    summary = train(cfg)
    with open(tmp_path / cfg.exp_name / "run.json") as f:
        run_id = json.load(f)["mlflow_run_id"]
    history = MlflowClient(uri).get_metric_history(run_id, "reward_mean")
    assert len(history) == len(summary.evals) >= 1

