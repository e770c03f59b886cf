"""Standalone run folders through the command line: resume continues the same run from its own config, runs
never mix, a damaged newest checkpoint is skipped and named, writes are atomic under SIGKILL, training-episode
returns are reported, and standalone runs log to MLflow for ``compare``.

The commands run in this process (``muzero_tune.cli.main``, what the ``muzero-tune`` entry point runs, with
its exit status and output); only the SIGKILLed checkpoint writer, and the processes whose pids stand for a
dead and a live run, are processes of their own. One tiny trained run (``trained_run``) is copied per test
that changes it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

# MLflow binds its log handler to the sys.stderr of its import: imported here, before a command's output is
# captured (a captured stream is gone after it, and every later log line would fail on it)
import mlflow  # noqa: F401
import pytest
from conftest import CLI_SMALL, cli_in_process, set_args

from muzero_tune.runs.checkpoint import eval_checkpoints, find_checkpoint, load_checkpoint

run_cli = cli_in_process  # muzero-tune in this process: its exit status, stdout and stderr


def rows(run: str) -> list[dict]:
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def config(run: str) -> dict:
    with open(os.path.join(run, "config.json")) as f:
        return json.load(f)


def copy_run(trained_run: str, tmp_path) -> str:
    dst = str(tmp_path / "runs" / "tiny")
    shutil.copytree(trained_run, dst)
    return dst


@pytest.fixture(scope="module")
def resumed(trained_run, tmp_path_factory):
    """The trained run resumed through the CLI: max_envstep raised, warm-up lowered so it trains."""
    tmp = tmp_path_factory.mktemp("resumed")
    run = copy_run(trained_run, tmp)
    before = rows(run)
    res = run_cli(
        [
            "train",
            "--resume",
            run,
            "--set",
            "max_envstep=500",
            "--set",
            "learn.resume_warmup_transitions=64",
        ],
        cwd=tmp,
    )
    assert res.returncode == 0, res.stderr
    return run, before, res


def test_resume_continues_the_run_in_its_folder_with_its_own_config(resumed, trained_run):
    run, before, res = resumed
    cfg = config(run)
    # the checkpoint's config, not the default preset's: seed 1, the tiny network, 4 simulations
    assert (cfg["seed"], cfg["model.hidden_dim"], cfg["mcts.num_simulations"]) == (1, 32, 4)
    assert cfg["max_envstep"] == 500 and config(trained_run)["max_envstep"] == 300
    assert "changed: max_envstep 300 -> 500, learn.resume_warmup_transitions 1000 -> 64" in res.stderr
    after = rows(run)
    assert after[: len(before)] == before
    assert [r["eval_index"] for r in after] == list(range(1, len(after) + 1)) and len(after) > len(before)
    assert all(b["envstep"] > a["envstep"] for a, b in zip(after, after[1:]))
    assert len(eval_checkpoints(os.path.join(run, "ckpt"))) == len(after)
    with open(os.path.join(run, "run.json")) as f1, open(os.path.join(trained_run, "run.json")) as f2:
        assert json.load(f1)["run_id"] == json.load(f2)["run_id"]


def test_training_episode_returns_are_reported_in_metrics_and_progress(resumed):
    run, _, res = resumed
    rs = rows(run)
    assert all(r["collect/episodes"] > 0 for r in rs)
    assert [r["collect/episodes"] for r in rs] == sorted(r["collect/episodes"] for r in rs)
    for r in rs:  # CartPole: return = length (reward 1 per step)
        assert r["collect/episode_return_mean"] == pytest.approx(r["collect/episode_length_mean"])
        assert 8 <= r["collect/episode_return_mean"] <= 500
    assert "episode_return_mean=" in res.stdout and "episodes=" in res.stdout


def test_a_second_run_with_the_same_name_is_refused_and_overwrite_replaces_it(trained_run, tmp_path):
    run = copy_run(trained_run, tmp_path)
    args = [
        "train",
        *set_args(
            {
                **CLI_SMALL,
                "max_envstep": 60,
                "exp_name": "tiny",
                "logging.output_dir": str(tmp_path / "runs"),
            }
        ),
    ]
    res = run_cli(args, cwd=tmp_path)
    assert res.returncode == 2 and f"run folder {run} already holds a run (3 checkpoints)" in res.stderr
    assert rows(run) == rows(trained_run)
    res = run_cli([*args, "--overwrite"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    new = rows(run)
    assert [r["eval_index"] for r in new] == list(range(1, len(new) + 1)) and new[-1]["envstep"] < 200
    assert len(eval_checkpoints(os.path.join(run, "ckpt"))) == len(new)
    with open(os.path.join(run, "run.json")) as f1, open(os.path.join(trained_run, "run.json")) as f2:
        assert json.load(f1)["run_id"] != json.load(f2)["run_id"]


def test_a_damaged_newest_checkpoint_is_named_and_the_newest_intact_one_resumed(trained_run, tmp_path):
    run = copy_run(trained_run, tmp_path)
    newest = os.path.join(run, "ckpt", "eval_000003.pt")
    with open(newest, "r+b") as f:
        f.truncate(os.path.getsize(newest) // 3)
    found = find_checkpoint(run)
    assert found.path.endswith("eval_000002.pt") and found.skipped[0][0] == newest
    res = run_cli(["eval", run], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"skipping damaged checkpoint {newest}: truncated or corrupt" in res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1])["checkpoint"].endswith("eval_000002.pt")
    res = run_cli(
        [
            "train",
            "--resume",
            run,
            "--set",
            "max_envstep=400",
            "--set",
            "learn.resume_warmup_transitions=32",
        ],
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert (
        f"skipping damaged checkpoint {newest}" in res.stderr and "eval_000002.pt (eval_index=2" in res.stderr
    )
    assert os.path.exists(newest + ".damaged")
    rs = rows(run)
    assert [r["eval_index"] for r in rs] == list(range(1, len(rs) + 1))
    assert load_checkpoint(newest)["resume"]["counters"]["eval_index"] == 3  # rewritten by the resumed run


def test_resume_from_an_eval_file_with_a_new_exp_name_branches_into_a_new_folder(trained_run, tmp_path):
    src = os.path.join(trained_run, "ckpt", "eval_000002.pt")
    res = run_cli(
        [
            "train",
            "--resume",
            src,
            "--set",
            "exp_name=branch",
            "--set",
            f"logging.output_dir={tmp_path}/runs",
            "--set",
            "max_envstep=340",
            "--set",
            "learn.resume_warmup_transitions=32",
        ],
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    branch = str(tmp_path / "runs" / "branch")
    assert [r["eval_index"] for r in rows(branch)][0] == 3  # the branch continues the eval index
    assert sorted(os.listdir(os.path.join(trained_run, "ckpt"))) == [f"eval_00000{i}.pt" for i in (1, 2, 3)]


WRITER = """
import os, sys
from muzero_tune.runs.checkpoint import FORMAT, save_checkpoint
import torch
folder = sys.argv[1]
blob = {"w": torch.randn(400_000)}
i = 0
while True:
    i += 1
    print("writing", i, flush=True)
    save_checkpoint(os.path.join(folder, "eval_%06d.pt" % (i % 3 + 1)),
                    {"format": FORMAT, "config": {}, "evaluated": {"weights": blob, "version": i}})
"""


def test_a_writer_killed_mid_write_never_leaves_a_damaged_checkpoint(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(folder)], stdout=subprocess.PIPE, text=True)
    # killed as it starts its 6th 1.6 MB write, whatever the machine's speed: 5 writes done, one in flight
    for i in range(1, 7):
        assert proc.stdout.readline().split() == ["writing", str(i)]
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    files = sorted(os.listdir(folder))
    done = [f for f in files if not f.startswith(".tmp-")]
    assert len(done) == 3, files  # the 3 names were written (5 writes over them) and are whole
    for f in done:
        assert load_checkpoint(str(folder / f))["evaluated"]["version"] >= 3  # the newest write of its name


def test_standalone_runs_log_to_mlflow_by_env_steps_and_compare_reads_them(trained_run, tmp_path):
    out = tmp_path / "runs"
    res = run_cli(
        [
            "train",
            *set_args(
                {
                    **CLI_SMALL,
                    "max_envstep": 100,
                    "exp_name": "ml",
                    "logging.output_dir": str(out),
                    "logging.mlflow": True,
                }
            ),
        ],
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    uri = f"sqlite:///{out}/mlflow.db"
    assert f"--experiment standalone --tracking-uri {uri}" in res.stdout
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("standalone")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["pipeline"] == "sync"
    assert run.info.run_name == "sync-s0-ml"  # pipeline, seed, run folder
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert run.data.params["model.hidden_dim"] == "32"
    hist = sorted(client.get_metric_history(run.info.run_id, "reward_mean"), key=lambda m: m.step)
    assert [m.step for m in hist] == [r["envstep"] for r in rows(str(out / "ml"))]
    assert client.get_metric_history(run.info.run_id, "collect/episode_return_mean")
    res = run_cli(
        ["compare", "--experiment", "standalone", "--tracking-uri", uri, "--out", str(tmp_path / "p")],
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert sorted(os.listdir(tmp_path / "p")) == [
        "envstep_per_s.png",
        "reward_vs_envstep.png",
        "reward_vs_wall.png",
        "summary.csv",  # the summary table, also logged to the comparison experiment
    ]


def _run_without_checkpoints(folder: str, pid: int) -> None:
    """What a run killed before its first evaluation leaves: its run.json (with its process), config and an
    empty metrics file, no checkpoint."""
    import socket

    os.makedirs(os.path.join(folder, "ckpt"))
    with open(os.path.join(folder, "run.json"), "w") as f:
        json.dump({"run_id": "dead", "host": socket.gethostname(), "pid": pid}, f)
    for name in ("config.json", "metrics.jsonl"):
        with open(os.path.join(folder, name), "w") as f:
            f.write("{}\n" if name == "config.json" else "")


def test_a_run_that_died_before_its_first_checkpoint_is_replaced_by_the_next_one(tmp_path):
    from muzero_tune.runs.run_folder import claim_new, read_run_info

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    folder = str(tmp_path / "run")
    _run_without_checkpoints(folder, dead.pid)
    info, notes = claim_new(folder)
    assert len(notes) == 1 and "stopped before its first checkpoint" in notes[0], notes
    assert "run.json, config.json, metrics.jsonl" in notes[0]
    assert read_run_info(folder)["run_id"] == info["run_id"] != "dead"
    assert not os.path.exists(os.path.join(folder, "metrics.jsonl"))


def test_a_run_still_running_without_a_checkpoint_keeps_its_folder(tmp_path):
    from muzero_tune.errors import RunFolderError
    from muzero_tune.runs.run_folder import claim_new

    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        folder = str(tmp_path / "run")
        _run_without_checkpoints(folder, alive.pid)
        with pytest.raises(RunFolderError, match=f"still running \\(process {alive.pid}, 0 checkpoints\\)"):
            claim_new(folder)
        assert os.path.exists(os.path.join(folder, "metrics.jsonl"))  # untouched
    finally:
        alive.kill()
        alive.wait()


def test_train_again_after_a_kill_before_the_first_checkpoint_takes_the_folder_over(tmp_path):
    """The command line, end to end: a run killed before its first checkpoint, then the same ``train``
    again, which says what it replaced and never offers a resume."""
    overrides = {**CLI_SMALL, "exp_name": "again", "logging.output_dir": str(tmp_path), "max_envstep": 60}
    args = ["train", *set_args(overrides)]
    folder = str(tmp_path / "again")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _run_without_checkpoints(folder, dead.pid)
    res = run_cli(args, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "stopped before its first checkpoint" in res.stderr and "--resume" not in res.stderr
    assert eval_checkpoints(os.path.join(folder, "ckpt"))
