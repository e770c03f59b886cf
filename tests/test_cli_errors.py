"""Every user error through the CLI: exit status 2, one line on stderr naming the input and what is allowed,
no traceback. A real internal bug still shows its traceback.

The cases run one after another in one module fixture; each parametrized test checks one of them. Most call
``muzero_tune.cli.main`` in this process (what the ``muzero-tune`` entry point runs: parsing, dispatch, the
one-line error), with stderr captured and any warning counted as a stderr line: a subprocess each cost 60 s
of setup here, mostly each one importing torch, Ray Tune or MLflow again. The case marked ``process`` (an
argparse refusal: the exit status of a real process, which imports nothing heavy) and the two that stub out an
extra (an import that fails as the interpreter starts) run the real CLI in a subprocess, as does the internal
bug's traceback (what the interpreter prints for an escaping exception). (An unknown MLflow experiment in
``compare`` is checked in test_tune.py, beside an MLflow store that exists.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

# MLflow binds its log handler to the sys.stderr of its import: imported here, before a test captures stderr
import mlflow  # noqa: F401
import pytest
import torch
from conftest import ACTOR_CPUS, CLI_SMALL, cli_in_process, run_cli, set_args

from muzero_tune.cli import main as cli_main

# a quarter of a CPU per actor: the async run fits the tests' Ray (conftest's RAY_TEST_CPUS)

# (id, args (with {run}, {ckpt1}, {dir} placeholders), how it runs, what the one line must contain); how it
# runs: None in this process, "process" the real CLI in a subprocess, "ale_stub" that with ale-py and Box2D
# stubbed out
CASES = [
    ("config_missing", ["train", "--config", "{dir}/nope.yaml"], None, "nope.yaml: cannot read"),
    ("config_bad_yaml", ["train", "--config", "{dir}/bad.yaml"], None, "bad.yaml:3:5: not valid YAML"),
    ("config_not_mapping", ["train", "--config", "{dir}/list.yaml"], None, "must hold a mapping"),
    ("set_unknown_key", ["train", "--set", "learn.batch_siz=3"], None, "did you mean 'learn.batch_size'"),
    ("set_bad_type", ["train", "--set", "learn.batch_size=abc"], None, "expected an integer"),
    ("set_out_of_range", ["train", "--set", "learn.batch_size=0"], None, "must be >= 1"),
    ("set_without_equals", ["train", "--set", "learn.batch_size"], None, "expected --set key=value"),
    ("unknown_preset", ["train", "--preset", "cartpole_muzro"], None, "did you mean 'cartpole_muzero'"),
    ("unknown_env", ["train", "--set", "env.env_id=NoSuchEnv-v0"], None, "unknown environment id"),
    # Box2D is stubbed out (the box2d extra is installed in CI: without the stub this would train)
    ("missing_box2d", ["train", "--set", "env.env_id=LunarLander-v3"], "ale_stub", '-e ".[box2d]"'),
    ("missing_ale", ["train", "--preset", "pong_muzero"], "ale_stub", "muzero-tune[atari]"),
    ("unknown_flag", ["train", "--bogus"], "process", "unrecognized arguments: --bogus"),
    ("resume_missing", ["train", "--resume", "{dir}/no_such_run"], None,
     "no_such_run: no such file or folder"),
    ("resume_no_checkpoint", ["train", "--resume", "{dir}/empty_dir"], None, "no checkpoint in this folder"),
    ("resume_empty_file", ["train", "--resume", "{dir}/empty.pt"], None, "empty.pt: the file is empty"),
    (
        "resume_truncated",
        ["train", "--resume", "{dir}/truncated.pt"],
        None,
        "truncated.pt: truncated or corrupt",
    ),
    (
        "resume_not_torch",
        ["train", "--resume", "{dir}/notes.txt"],
        None,
        "notes.txt: not a muzero_tune checkpoint",
    ),
    ("resume_foreign_torch", ["train", "--resume", "{dir}/foreign.pt"], None, "no 'format' key"),
    (
        "resume_other_version",
        ["train", "--resume", "{dir}/v2.pt"],
        None,
        "format version 'muzero_tune.checkpoint/2'",
    ),
    (
        "resume_shape_change",
        ["train", "--resume", "{run}", "--set", "model.hidden_dim=64"],
        None,
        "model.hidden_dim=32",
    ),
    (
        "resume_env_change",
        ["train", "--resume", "{run}", "--set", "env.env_id=Acrobot-v1"],
        None,
        "env.env_id='CartPole-v1'",
    ),
    (
        "resume_with_preset",
        ["train", "--resume", "{run}", "--preset", "pong_muzero"],
        None,
        "cannot be combined with --resume",
    ),
    (
        "resume_older_over_newer",
        ["train", "--resume", "{ckpt1}"],
        None,
        "would replace its 2 later checkpoint(s)",
    ),
    (
        "new_run_into_existing",
        ["train", "--set", "logging.output_dir={runs}", "--set", "exp_name=tiny"],
        None,
        "already holds a run",
    ),
    ("eval_missing", ["eval", "{dir}/nope.pt"], None, "nope.pt: no such file"),
    ("eval_truncated", ["eval", "{dir}/truncated.pt"], None, "truncated.pt: truncated or corrupt"),
    (
        "eval_zero_episodes",
        ["eval", "{run}", "--episodes", "0"],
        None,
        "--episodes: expected an integer >= 1",
    ),
    (
        "eval_set_other_section",
        ["eval", "{run}", "--set", "model.hidden_dim=64"],
        None,
        "re-evaluated with eval.*, mcts.* keys only",
    ),
    ("eval_set_bad_value", ["eval", "{run}", "--set", "eval.unvisited_q=mean"], None, "allowed: parent, min"),
    ("name_climbs_out", ["train", "--set", "exp_name=../../escaped_run"], None, "escaped_run' is invalid"),
    ("name_absolute", ["train", "--set", "exp_name=/tmp/abs_run"], None, "must be one folder name"),
    ("name_empty", ["train", "--set", "exp_name="], None, "'exp_name' = '' is invalid"),
    ("lr_nan", ["train", "--set", "learn.learning_rate=nan"], None, "= nan is invalid: must be a finite"),
    ("lr_inf", ["train", "--set", "learn.learning_rate=inf"], None, "= inf is invalid: must be a finite"),
    ("discount_nan", ["train", "--set", "mcts.discount=nan"], None, "'mcts.discount' = nan"),
    ("int_inf", ["train", "--set", "max_envstep=inf"], None, "= inf is invalid: expected an integer"),
    ("output_dir_unusable", ["train", "--set", "logging.output_dir={dir}/plain_file/x"], None,
     "'logging.output_dir'"),
    ("tracking_uri_folder", ["train", "--set", "logging.mlflow_tracking_uri=mlruns"], None,
     "expected an MLflow store URI"),
    ("sweep_name_climbs_out", ["sweep", "--name", "../up"], None, "'--name' = '../up' is invalid"),
    ("sweep_storage_unusable", ["sweep", "--set", "tune.storage_path={dir}/plain_file/x"], None,
     "'tune.storage_path'"),
    ("sweep_zero_samples", ["sweep", "--samples", "0"], None, "--samples: expected an integer >= 1"),
    ("sweep_unknown_space", ["sweep", "--space", "quickstrat"], None, "quickstart"),
    (
        "sweep_zero_concurrent",
        ["sweep", "--max-concurrent", "0"],
        None,
        "--max-concurrent: expected an integer",
    ),
    ("resume_not_a_sweep", ["resume", "{dir}/empty_dir"], None, "not a muzero-tune sweep folder"),
    ("resume_missing_sweep", ["resume", "{dir}/no_such_sweep"], None, "no_such_sweep: no such folder"),
    (
        "compare_no_store",
        ["compare", "--tracking-uri", "sqlite:///{dir}/none.db"],
        None,
        "no MLflow store there",
    ),
]


def _prepare(d: str, run: str) -> None:
    with open(os.path.join(d, "bad.yaml"), "w") as f:
        f.write("learn:\n  batch_size: [1, 2\nseed: 3\n")
    with open(os.path.join(d, "list.yaml"), "w") as f:
        f.write("- 1\n- 2\n")
    os.makedirs(os.path.join(d, "empty_dir"))
    open(os.path.join(d, "empty.pt"), "wb").close()
    newest = os.path.join(run, "ckpt", "eval_000003.pt")
    with open(newest, "rb") as f:
        data = f.read()
    with open(os.path.join(d, "truncated.pt"), "wb") as f:
        f.write(data[: len(data) // 2])
    with open(os.path.join(d, "notes.txt"), "w") as f:
        f.write("my notes\n")
    with open(os.path.join(d, "plain_file"), "w") as f:  # a file where a folder setting wants a folder
        f.write("not a folder\n")
    torch.save({"weights": torch.zeros(2)}, os.path.join(d, "foreign.pt"))
    ckpt = torch.load(newest, weights_only=True)
    ckpt["format"] = "muzero_tune.checkpoint/2"
    torch.save(ckpt, os.path.join(d, "v2.pt"))
    for module in ("ale_py", "Box2D"):  # ale-py and Box2D "not installed": importing them fails
        stub = os.path.join(d, "ale_stub", module)
        os.makedirs(stub)
        with open(os.path.join(stub, "__init__.py"), "w") as f:
            f.write(f"raise ImportError(\"No module named '{module}'\")\n")


@pytest.fixture(scope="module")
def results(trained_run, tmp_path_factory):
    d = str(tmp_path_factory.mktemp("cli_errors"))
    _prepare(d, trained_run)
    before = sorted(os.listdir(os.path.join(trained_run, "ckpt")))
    subs = {
        "{dir}": d,
        "{run}": trained_run,
        "{runs}": os.path.dirname(trained_run),
        "{ckpt1}": os.path.join(trained_run, "ckpt", "eval_000001.pt"),
    }

    out = {}
    for name, args, how, _ in CASES:
        args = [_sub(a, subs) for a in args]
        if how is None:
            out[name] = cli_in_process(args, cwd=d)
        else:
            env = {"PYTHONPATH": os.path.join(d, "ale_stub") + os.pathsep + os.environ.get("PYTHONPATH", "")}
            out[name] = run_cli(args, cwd=d, env=env if how == "ale_stub" else None, timeout=120)
    out["_ckpt_files"] = (before, sorted(os.listdir(os.path.join(trained_run, "ckpt"))))
    return out


def _sub(arg: str, subs: dict) -> str:
    for k, v in subs.items():
        arg = arg.replace(k, v)
    return arg


def test_the_table_has_at_least_20_cases():
    assert len(CASES) >= 20 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_user_error_is_one_line_with_exit_status_2(case, results):
    name, _, _, expected = case
    res = results[name]
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert "Traceback" not in res.stderr
    assert len(lines) == 1, lines
    assert lines[0].startswith("muzero-tune") and ": error: " in lines[0], lines[0]
    assert expected in lines[0], lines[0]


def test_refused_commands_leave_the_run_folder_untouched(results):
    before, after = results["_ckpt_files"]
    assert before == after == ["eval_000001.pt", "eval_000002.pt", "eval_000003.pt"]


def test_an_internal_bug_still_shows_its_traceback(tmp_path):
    code = (
        "import sys, muzero_tune.cli as c\n"
        "def broken(args):\n    return {}['no such key']\n"
        "c._cmd_presets = broken\nsys.exit(c.main(['presets']))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert res.returncode == 1
    assert "Traceback" in res.stderr and "KeyError: 'no such key'" in res.stderr


def test_no_run_folder_is_written_by_a_refused_train(tmp_path, capsys):
    # the env/policy combination is checked before the run folder is claimed
    code = cli_main(["train", "--set", "env.env_id=Pendulum-v1", "--set",
                     f"logging.output_dir={tmp_path}/runs"])
    assert code == 2 and "continuous actions" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "runs")
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_a_run_whose_actors_are_all_lost_stops_in_one_line(ray_cluster, tmp_path, capsys):
    """An async run whose only collector fails with no restart allowed: the run stops, and the command line
    says so in one line (exit status 1, no traceback), naming the actor and the intact checkpoint. (In this
    process, on the tests' Ray: the actors' output is not forwarded here, so stderr is the command's own.)"""
    code = cli_main([
        "train", "--async-pipeline", *set_args({
            **CLI_SMALL, **ACTOR_CPUS, "logging.output_dir": str(tmp_path / "runs"),
            "env.wrappers": '["tests.user_envs:BreaksAfter {steps: 40}"]',
            "policy.async_pipeline.max_actor_restarts": 0, "max_envstep": 2000,
        }),
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1, err[-2000:]
    lines = [line for line in err.splitlines() if line.startswith("muzero-tune train:")]
    assert len(lines) == 1 and "stopped:" in lines[0] and "last checkpoint is intact" in lines[0], lines
    assert "Traceback" not in err, err[-2000:]
