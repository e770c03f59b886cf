"""Integration: SIGKILL of a tuning process mid-sweep, then ``muzero-tune resume PATH`` (``Tuner.restore``).

The sweep (2 small trials, one sync and one async) runs in its own process and its own Ray, started in a new
session, so every process it leaves behind is found by session id and nothing else is touched. Each trial's
process is frozen (SIGSTOP) once it has written 3 checkpoints, and the driver is SIGKILLed once the
experiment state synced to storage has all the trials' reports, so the newest checkpoint Tune registered is
that of the last report or, when Tune had not fetched that one yet, of the one before. The sweep is resumed by
``muzero-tune resume PATH`` in a new process of its own (in its own session too), started beside the sweep so
that its interpreter and its Ray start meanwhile, and told to resume once the sweep is killed. The resumed
sweep must finish every trial, each continuing from that checkpoint's counters with no gap in progress.csv,
and reopen the one MLflow run of each trial.
"""

from __future__ import annotations

import csv
import glob
import json
import os
import signal
import subprocess
import sys
import time

from muzero_tune.runs.checkpoint import load_checkpoint
from muzero_tune.runs.mlflow_log import TRIAL_TAG, default_tracking_uri
from muzero_tune.tune.trainable import CHECKPOINT_FILE

BENCH_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "bench")
sys.path.insert(0, BENCH_DIR)
import proc_cpu  # noqa: E402  (benchmark code, not part of the package)

HELPER = os.path.join(os.path.dirname(__file__), "tune_helpers", "sweep_proc.py")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# long enough that an async trial, whose evaluations (so checkpoints) can fall behind its learner on a fast
# machine, is still mid-run at its third checkpoint (at 1000 one reached its end first)
MAX_ENV_STEP = 1600
AP = "policy.async_pipeline."


def tiny(storage) -> dict:
    return {
        "model.hidden_dim": 32, "model.latent_dim": 16, "mcts.num_simulations": 4, "learn.batch_size": 32,
        "env.collector_env_num": 4, "env.evaluator_env_num": 2, "eval.n_episodes": 2, "eval.eval_freq": 20,
        "replay.game_segment_length": 20, "max_envstep": MAX_ENV_STEP, "stop_value": None,
        "logging.quiet": True, "tune.storage_path": str(storage), "tune.checkpoint_num_to_keep": None,
        "learn.resume_warmup_transitions": 100,
    }


# ---------------------------------------------------------------------------------------------- processes


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, session id) of a process, None if it is gone."""
    fields = proc_cpu.stat_fields(pid)
    return None if fields is None else (fields[0].decode(), int(fields[3]))


def _proc_table() -> dict[int, tuple[str, int]]:
    """pid -> (state, session id) of every process."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (st := _stat(int(d))) is not None:
            out[int(d)] = st
    return out


def _kill_session(sid: int, before: set[int], timeout_s: float = 30.0) -> list[int]:
    """SIGKILL every live process of session ``sid`` that did not exist before it started (the sweep's
    driver, GCS, raylet, the orphaned ray::DashboardAgent / ray::RuntimeEnvAgent, workers); wait for them."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while True:
        live = [pid for pid, (state, s) in _proc_table().items()
                if s == sid and state != "Z" and pid not in before]
        if not live:
            return sorted(killed)
        assert time.monotonic() < deadline, f"processes of session {sid} survive SIGKILL: {live}"
        for pid in live:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # never join another Ray
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled", TUNE_GLOBAL_CHECKPOINT_S="1")
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return env


# ---------------------------------------------------------------------------------------------- sweep folder


def _state(exp_dir: str) -> dict[str, dict]:
    """Trial folder name -> {trial_id, status, last_result} as the experiment state on storage has it."""
    files = sorted(glob.glob(os.path.join(exp_dir, "experiment_state-*.json")))
    if not files:
        return {}
    try:
        with open(files[-1]) as f:
            data = json.load(f)
    except (OSError, ValueError):  # being replaced right now
        return {}
    out = {}
    for trial_json, meta_json in data["trial_data"]:
        t, m = json.loads(trial_json), json.loads(meta_json)
        out[t["relative_logdir"]] = {"trial_id": t["trial_id"], "status": t["status"],
                                     "last_result": m.get("last_result") or {}}
    return out


def _ckpt_dirs(trial_dir: str) -> list[str]:
    return sorted(glob.glob(os.path.join(trial_dir, "checkpoint_*")))


def _progress(trial_dir: str) -> list[dict[str, str]]:
    path = os.path.join(trial_dir, "progress.csv")
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _ints(rows, key) -> list[int]:
    return [int(float(r[key])) for r in rows]


def _trial_processes(session: int, trial_dirname: str) -> list[int]:
    """The trial's own process: Tune runs it in a working folder named after the trial."""
    out = []
    for pid, (_, sid) in _proc_table().items():
        if sid == session:
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                continue
            if cwd.endswith(os.sep + trial_dirname):
                out.append(pid)
    return out


def _freeze_at(exp_dir: str, session: int, checkpoints: int, proc: subprocess.Popen, log_path) -> None:
    """SIGSTOP each trial's process once it has written ``checkpoints`` checkpoints: it writes no more after
    that, and the reports of all but its last one have been fetched by Tune (a function trainable's report
    blocks until Tune asks for the next result), so the experiment state can catch up with them."""
    frozen: set[str] = set()
    deadline = time.monotonic() + 300  # 40-70 s on 2 loaded cores, from the start of the sweep process
    while len(frozen) < 2:
        assert proc.poll() is None, f"the sweep ended unkilled: {open(log_path).read()[-5000:]}"
        assert time.monotonic() < deadline, f"not {checkpoints} checkpoints per trial: {_state(exp_dir)}"
        for d in glob.glob(os.path.join(exp_dir, "muzero_tune_trainable_*")):
            if d in frozen or len(_ckpt_dirs(d)) < checkpoints:
                continue
            pids = _trial_processes(session, os.path.basename(d))
            assert pids, f"no process of trial {d}"
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            frozen.add(d)
        time.sleep(0.05)


def _wait_state_synced(exp_dir: str, proc: subprocess.Popen, steady_s: float = 2.5) -> None:
    """Wait until the experiment state on storage has every result Tune processed (progress.csv rows) for
    both trials, steadily (sync period 1 s; with Tune's default of 300 s this would time out)."""
    deadline = time.monotonic() + 60
    since = None
    while True:
        assert proc.poll() is None
        state = _state(exp_dir)
        synced = len(state) == 2 and all(
            st["status"] == "RUNNING"
            and st["last_result"].get("training_iteration") == len(_progress(os.path.join(exp_dir, name)))
            for name, st in state.items()
        )
        now = time.monotonic()
        since = (since or now) if synced else None
        if since is not None and now - since >= steady_s:
            return
        assert now < deadline, f"the experiment state on storage stays behind the trials' reports: {state}"
        time.sleep(0.1)


def test_sigkill_then_resume_continues_every_trial_from_its_newest_checkpoint(tmp_path, request):
    storage = tmp_path / "tune"
    name = "killed"
    exp_dir = os.path.join(str(storage), name)
    # one sync and one async trial (seed 0): both restore paths
    args = {"space": "sync_vs_async", "name": name, "overrides": tiny(storage), "num_cpus": 6,
            "max_concurrent": 2, "grid": {"seed": [0]}}
    before = set(_proc_table())
    log = open(tmp_path / "sweep.log", "w")
    proc = subprocess.Popen([sys.executable, HELPER, json.dumps(args)], stdout=log, stderr=subprocess.STDOUT,
                            env=_env(), cwd=str(tmp_path), start_new_session=True)
    # the process that resumes the sweep: a new one with its own Ray, started beside the sweep so that its
    # interpreter and its Ray start while the sweep runs; it reads nothing of the sweep until it is told to
    # resume, after the kill
    resume_log = open(tmp_path / "resume.log", "w")
    resumer = subprocess.Popen([sys.executable, HELPER, "resume", exp_dir, "6"], stdin=subprocess.PIPE,
                               stdout=resume_log, stderr=subprocess.STDOUT, env=_env(), cwd=str(tmp_path),
                               start_new_session=True, text=True)  # fmt: skip
    request.addfinalizer(lambda: (resumer.kill(), resumer.wait(), _kill_session(resumer.pid, before),
                                  resume_log.close()))  # fmt: skip
    try:
        _freeze_at(exp_dir, proc.pid, 3, proc, tmp_path / "sweep.log")
        _wait_state_synced(exp_dir, proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        orphans = _kill_session(proc.pid, before)
        log.close()
    assert orphans, "a killed Ray driver leaves its agents and workers behind"

    # what was on storage at the kill
    at_kill = _state(exp_dir)
    assert len(at_kill) == 2
    snap = {}
    for tname, st in at_kill.items():
        d = os.path.join(exp_dir, tname)
        counters = {}
        for c in _ckpt_dirs(d):
            try:
                ck = load_checkpoint(os.path.join(c, CHECKPOINT_FILE))
            except Exception:  # being copied when its process was frozen: never reported to Tune
                continue
            counters[ck["resume"]["counters"]["eval_index"]] = {
                "train_iter": ck["resume"]["learner"]["train_iter"], **ck["resume"]["counters"]}
        snap[tname] = {"rows": _progress(d), "ckpts": counters, "last": st["last_result"],
                       "id": st["trial_id"]}
        assert st["status"] == "RUNNING" and st["last_result"]["envstep"] < MAX_ENV_STEP  # killed mid-run

    # resume in that new process (the CLI: muzero-tune resume PATH)
    assert resumer.poll() is None, open(tmp_path / "resume.log").read()[-5000:]
    resumer.stdin.write("resume\n")
    resumer.stdin.close()
    try:
        rc = resumer.wait(timeout=300)  # 40-60 s on 2 loaded cores
    finally:
        if resumer.poll() is None:
            resumer.kill()
            resumer.wait()
        _kill_session(resumer.pid, before)
    assert rc == 0, open(tmp_path / "resume.log").read()[-5000:]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(default_tracking_uri(str(storage)))
    exp = client.get_experiment_by_name(name)
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 2  # one run per trial: the restored trials reopened theirs
    run_of = {r.data.tags[TRIAL_TAG]: r for r in runs}

    final = _state(exp_dir)
    pipelines = set()
    for tname, s in snap.items():
        assert final[tname]["status"] == "TERMINATED"
        d = os.path.join(exp_dir, tname)
        rows = _progress(d)
        assert rows[: len(s["rows"])] == s["rows"]  # the rows from before the kill are kept as they were
        restored_at = [i for i, r in enumerate(rows) if r["iterations_since_restore"] == "1"]
        assert len(restored_at) == 2 and restored_at[0] == 0, restored_at  # started once, restored once
        pre, post = rows[: restored_at[1]], rows[restored_at[1] :]
        k, e = len(pre), s["last"]["eval_index"]
        assert e == k >= 2 and pre == s["rows"]
        assert _ints(pre, "eval_index") == _ints(pre, "training_iteration") == list(range(1, k + 1))
        # Tune restores the newest checkpoint it registered: the last report's, or the one before it when the
        # trial was frozen before Tune fetched the last one (a separate call to the trial); never older
        r = int(post[0]["training_iteration"]) - 1
        assert r in (e - 1, e) and r in s["ckpts"], (r, e, sorted(s["ckpts"]))
        assert max(s["ckpts"]) <= e + 1  # at most one more was persisted, not reported
        n = r + len(post)
        assert _ints(post, "eval_index") == _ints(post, "training_iteration") == list(range(r + 1, n + 1))
        # the first report after the restore continues from that checkpoint's counters
        ckpt, first = s["ckpts"][r], post[0]
        assert ckpt["train_iter"] == int(float(pre[r - 1]["train_iter"]))
        assert ckpt["env_steps"] == int(float(pre[r - 1]["envstep"]))
        assert int(float(first["train_iter"])) >= ckpt["train_iter"]
        assert int(float(first["envstep"])) >= ckpt["env_steps"]
        assert float(first["wall_s"]) > ckpt["wall_s"]
        assert first["pid"] != pre[-1]["pid"]
        if first["pipeline"] == "async":
            assert first["placement/actors_in_trial_pg"] == "1"  # the new actors, in the trial's new group
        else:  # the sync driver evaluates only after training
            assert int(float(first["train_iter"])) > ckpt["train_iter"]
        pipelines.add(first["pipeline"])
        for part in (pre, post):
            for key in ("train_iter", "envstep"):
                vals = _ints(part, key)
                assert vals == sorted(vals), (key, vals)
        assert int(float(post[-1]["envstep"])) >= MAX_ENV_STEP
        # its MLflow run: FINISHED, every report logged; only the reports after the restored checkpoint that
        # had reached MLflow before the kill are there twice
        run = run_of[s["id"]]
        assert run.info.status == "FINISHED"
        hist = client.get_metric_history(run.info.run_id, "eval_index")
        steps = sorted(int(m.value) for m in hist)  # the eval indices logged (MLflow steps are env steps)
        assert sorted(set(steps)) == list(range(1, n + 1))
        assert {x for x in steps if steps.count(x) > 1} <= set(range(r + 1, e + 2)), steps
    assert pipelines == {"sync", "async"}
