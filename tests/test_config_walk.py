"""Every setting, given a bad or extreme value, is either refused in one line naming it before any run folder
is written, or a run that reads it completes: no key crashes later with a traceback, and no completed run
counts unless the value reached the code that uses it.

The walk covers every numeric key (nan, inf, a negative value, an absurdly large one) and every free-text key
(empty, a path climbing out of its folder, an absolute path, control characters). Each value goes through
``muzero-tune train`` in this process (the command line's own error handling); a value validation refuses is
checked there, whatever the key. A value it accepts runs where the key is read, and the run's reads of the
config sections are recorded (``tests/oracles/config_reads.py``: reads made by the library outside the config
package and the command line, in this process): the key must be among them.

- Most keys: a tiny sync run on the policy type whose doc names the key (muzero when none does), with the
  settings that switch its code on (``ENABLED_BY``: a learning-rate schedule, the temperature decay, buffer
  reanalyze, MLflow). A value a key allows may still make training diverge (a huge loss weight): that run
  stops with the learner's one-line error, naming the settings that size a step, and keeps its folder.
- ``learn.resume_warmup_transitions``: a tiny run, then ``train --resume`` of it with the value.
- The async pipeline's keys: one run per value kind with every key that accepts it set at once, in local
  mode (the driver and its actors in this process, so every read is seen) and with one collector failure,
  so the restart settings are read too. The timeouts only Ray's waits use (``RAY_USES``, with the learner
  workers' ``learn.learner_timeout_s``) are refused at every walked value (a wait is bounded), and Ray's use
  of the actors' resources is not walked (their bounds refuse the walk's huge values).
- ``tune.*``: no train run reads them (the type runs check that); the sweep's own code does, without trials:
  ``muzero-tune sweep`` into a name that already holds a sweep (refused, naming the folder the storage path
  resolved to), and the builders of Tune's run and search settings (the value lands in them).

Each policy setting's run type is checked to read it (one tiny run per type). An accepted value found to
crash a run goes in ``KNOWN_CRASHES`` (expected strictly, so its fix asks for the entry to go); it is empty.
"""

from __future__ import annotations

import functools
import os
import types
import typing
import warnings

# MLflow binds its log handler to the sys.stderr of its import: imported here, before a test captures stderr
# (a captured stream is closed after its test, and every later log line would fail on it)
import mlflow  # noqa: F401
import pytest

from muzero_tune.cli import main
from muzero_tune.config import POLICY_TYPES, ConfigError, apply_overrides, iter_fields, make_config, validate
from tests.oracles.config_reads import recording

HUGE_INT = 10**12
HUGE_FLOAT = 1e30
NUMERIC_VALUES = ("nan", "inf", "negative", "huge")
ABSOLUTE = "<absolute>"  # an absolute path inside the test's own folder, filled in per test
PATH_VALUES = ("", "../escaped", ABSOLUTE, "a\x01b")

# a run of a few seconds: few envs, few simulations, a small network, one evaluation
TINY = {
    "max_envstep": 96,
    "max_train_iter": 6,
    "max_wall_s": 120,
    "env.collector_env_num": 2,
    "env.evaluator_env_num": 1,
    "env.max_episode_steps": 24,
    "eval.n_episodes": 1,
    "eval.eval_freq": 3,
    "mcts.num_simulations": 3,
    "learn.batch_size": 8,
    "learn.replay_ratio": 0.1,
    "replay.game_segment_length": 8,
    "replay.capacity_transitions": 2000,
    "model.hidden_dim": 16,
    "model.latent_dim": 8,
    "model.value_support_size": 10,
    "model.reward_support_size": 10,
    "model.projection_dim": 16,
    "policy.num_samples": 2,
    "policy.world_model_embed_dim": 16,
    "policy.context_tokens": 4,
    "logging.quiet": True,
}

ASYNC = "policy.async_pipeline."

# keys a tiny sync run reads only with another setting that switches their code on
ENABLED_BY = {
    "collect.temperature_decay_train_iter": {"collect.temperature_decay": True},
    "learn.lr_milestones": {"learn.lr_schedule": "piecewise"},
    "learn.lr_decay_factor": {"learn.lr_schedule": "piecewise"},
    "learn.lr_total_train_iter": {"learn.lr_schedule": "cosine"},
    "learn.momentum": {"learn.optimizer": "sgd"},
    "replay.reanalyze_batch_size": {"replay.buffer_reanalyze_freq": 1},
    "replay.reanalyze_partition": {"replay.buffer_reanalyze_freq": 1},
    "logging.mlflow_tracking_uri": {"logging.mlflow": True},
    "logging.mlflow_experiment": {"logging.mlflow": True},
}
# keys whose value only Ray uses (a wait's timeout): every value the walk gives them is refused (a wait is at
# most MAX_WAIT_S, which Ray's C integers hold), so none runs; an accepted one would need a run on the cluster
RAY_USES = (ASYNC + "actor_start_timeout_s", ASYNC + "shutdown_timeout_s", "learn.learner_timeout_s")
RESUME_ONLY = ("learn.resume_warmup_transitions",)  # read when a run resumes without its replay buffer

# accepted values whose run crashes with a traceback (no upper bound refuses them), expected strictly: none
KNOWN_CRASHES: dict[tuple[str, str], type[BaseException]] = {}


def _inner(tp):
    """``int | None`` -> int; anything else as it is."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        (tp,) = [a for a in typing.get_args(tp) if a is not type(None)]
    return tp


def _policy_type_of(doc: str) -> str:
    """The policy type a setting's doc names first, in the words before its colon (``sampled_*``:
    sampled_muzero; ``muzero_context / muzero_rnn_full_obs``: muzero_context), muzero if it names none."""
    head, colon, _ = doc.partition(":")
    words = ["sampled_muzero" if w == "sampled_*" else w for w in head.replace("/", " ").split()]
    named = [w for w in words if w in POLICY_TYPES]
    return named[0] if colon and named else "muzero"


def _walk():
    """(key, kind, value, policy type) for every numeric and free-text key and each of its values."""
    out = []
    for key, tp, f in iter_fields():
        tp = _inner(tp)
        elem = typing.get_args(tp)[0] if typing.get_origin(tp) is tuple else tp
        ptype = _policy_type_of(f.metadata.get("doc", ""))
        if elem in (int, float):
            # as typed on the command line ("nan" / "inf" are refused for an int as "expected an integer")
            huge = HUGE_FLOAT if elem is float else HUGE_INT
            values = {"nan": "nan", "inf": "inf", "negative": -1, "huge": huge}
            out += [(key, kind, values[kind], ptype) for kind in NUMERIC_VALUES]
        elif elem is str and not f.metadata.get("choices"):
            out += [(key, f"path{i}", value, ptype) for i, value in enumerate(PATH_VALUES)]
    return out


WALK = _walk()
POLICY_KEYS = {key: ptype for key, _, _, ptype in WALK if key.startswith("policy.") and ASYNC not in key}


def _route(key: str) -> str:
    if key in RAY_USES:
        return "ray"
    if key.startswith(ASYNC):
        return "async"
    if key.startswith("tune."):
        return "sweep"
    if key in RESUME_ONLY:
        return "resume"
    return "sync"


@functools.cache
def _base(ptype: str, key: str):
    """The tiny run's config for ``key``'s checks."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make_config(f"cartpole_{ptype}", overrides=TINY)


def _accepted(key: str, value, ptype: str) -> bool:
    """Whether validation takes the value (as the command line would pass it) with the tiny run's settings."""
    text = "/absolute/place" if value == ABSOLUTE else str(value)
    base = _base(ptype, key if key in RAY_USES else "")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            validate(apply_overrides(base, {key: text}), check_env=False)
    except ConfigError:
        return False
    return True


def _routes():
    """Each walked value to the test that proves it: refused values and sync keys to the command-line walk;
    other accepted values to the run that reads them."""
    routes: dict[str, list] = {"sync": [], "ray": [], "async": [], "sweep": [], "resume": []}
    for key, kind, value, ptype in WALK:
        route = _route(key)
        if route != "sync" and not _accepted(key, value, ptype):
            route = "sync"  # refused on the command line before anything runs
        routes[route].append((key, kind, value, ptype))
    return routes


ROUTES = _routes()


def _param(key, kind, *values):
    return pytest.param(key, *values, id=f"{key}={kind}", marks=_crash_marks(key, kind))


def _crash_marks(key: str, kind: str) -> list:
    crash = KNOWN_CRASHES.get((key, kind))
    if crash is None:
        return []
    why = f"accepted, and its run raises {crash.__name__}"
    return [pytest.mark.xfail(strict=True, raises=crash, reason=why)]


CASES = [_param(key, kind, value, ptype) for key, kind, value, ptype in ROUTES["sync"]]
SWEEP_CASES = [_param(key, kind, value) for key, kind, value, _ in ROUTES["sweep"]]
RESUME_CASES = [_param(key, kind, value) for key, kind, value, _ in ROUTES["resume"]]


def _async_runs():
    """The async values a local run takes: one run per value kind with every key that accepts it, and a run
    of its own for a value that crashes."""
    runs: dict[str, dict] = {}
    marks: dict[str, list] = {}
    for key, kind, value, _ in ROUTES["async"]:
        name = f"{key}={kind}" if (key, kind) in KNOWN_CRASHES else kind
        runs.setdefault(name, {})[key] = value
        marks[name] = _crash_marks(key, kind)
    return [pytest.param(values, id=name, marks=marks[name]) for name, values in runs.items()]


ASYNC_RUNS = _async_runs()


def test_the_walk_covers_every_numeric_and_free_text_key():
    walked = [(key, kind) for key, kind, _, _ in WALK]
    assert len(walked) >= 4 * 100, len(walked)
    keys = {key for key, _ in walked}
    assert {"learn.learning_rate", "mcts.discount", "seed", "exp_name", "logging.output_dir"} <= keys
    assert {"tune.max_failures", ASYNC + "max_policy_lag", "policy.rnn_hidden_size"} <= keys
    # every walked value is proven by exactly one test
    proven = [tuple(p.id.rsplit("=", 1)) for p in CASES + SWEEP_CASES + RESUME_CASES]
    proven += [(key, p.id.rsplit("=", 1)[-1]) for p in ASYNC_RUNS for key in p.values[0]]
    assert sorted(proven) == sorted(walked)
    # the tables name walked keys, and each crash listed is of a value validation still accepts
    assert set(ENABLED_BY) | set(RAY_USES) | set(RESUME_ONLY) | {k for k, _ in KNOWN_CRASHES} <= keys
    accepted = {(key, kind) for r in ("ray", "async", "sweep", "resume") for key, kind, _, _ in ROUTES[r]}
    assert set(KNOWN_CRASHES) <= accepted, set(KNOWN_CRASHES) - accepted
    assert ROUTES["async"] and ROUTES["sweep"] and ROUTES["resume"]
    assert not ROUTES["ray"], f"accepted values only Ray uses, walked by no run: {ROUTES['ray']}"


def _written_outside(root: str, allowed: str) -> list[str]:
    out = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            if not path.startswith(allowed + os.sep):
                out.append(path)
    return out


def _cli(argv: list[str], cwd, overrides: dict) -> tuple[int, set[str]]:
    """``muzero-tune`` with ``--set`` for each override, run in ``cwd``: its status and the keys it read."""
    for k, v in overrides.items():
        argv = [*argv, "--set", f"{k}={v}"]
    old = os.getcwd()
    os.chdir(cwd)
    try:
        with recording() as reads:
            status = main(argv)
    finally:
        os.chdir(old)
    return status, reads


def _check_outcome(key, value, status, reads, captured, runs) -> None:
    """Refused in one line naming the key with no run folder; or diverged in the learner's one line; or
    completed, having read the key."""
    lines = [line for line in captured.err.splitlines() if line.strip()]
    if status == 2 and "training diverged" in captured.err:
        # a value the key allows whose run diverged: one line, stopped by the learner, its folder kept
        assert len(lines) == 1 and "learn.learning_rate" in lines[0], (key, value, captured.err)
        assert key in reads, f"{key}={value!r}: the run diverged without reading it"
    elif status == 2:
        assert len(lines) == 1 and key in lines[0], (key, value, captured.err)
        assert not runs.exists() or not any(runs.iterdir()), f"{key}={value!r} wrote {list(runs.iterdir())}"
    else:
        assert status == 0 and "stopped (" in captured.out, (key, value, captured.err)
        assert key in reads, f"{key}={value!r}: the run completed without reading it"


def _walk_folders(tmp_path, value):
    cwd = tmp_path / "work"
    cwd.mkdir()
    value = str(tmp_path / "absolute" / "place") if value == ABSOLUTE else value
    return cwd, cwd / "runs", value


@pytest.mark.parametrize("key, value, ptype", CASES)
def test_a_value_is_refused_in_one_line_or_a_tiny_run_completes(key, value, ptype, tmp_path, capsys):
    """Through ``muzero-tune train``; a tiny run that completes must have read the key."""
    cwd, runs, value = _walk_folders(tmp_path, value)
    overrides = {**TINY, **ENABLED_BY.get(key, {}), "logging.output_dir": str(runs), key: value}
    status, reads = _cli(["train", "--preset", f"cartpole_{ptype}"], cwd, overrides)
    _check_outcome(key, value, status, reads, capsys.readouterr(), runs)
    if key not in ("logging.output_dir", "logging.mlflow_tracking_uri"):  # these name where to write
        outside = _written_outside(str(tmp_path), str(runs))
        assert not outside, f"{key}={value!r} wrote outside the output folder: {outside[:3]}"


@pytest.mark.parametrize("key, value", RESUME_CASES)
def test_a_resume_setting_is_read_by_the_resumed_run(key, value, tmp_path, capsys):
    """A tiny run, then ``train --resume`` of its folder with the value (and room to train further)."""
    cwd, runs, value = _walk_folders(tmp_path, value)
    status, _ = _cli(["train", "--preset", "cartpole_muzero"], cwd, {**TINY, "logging.output_dir": str(runs)})
    assert status == 0, capsys.readouterr().err
    capsys.readouterr()
    more = {"max_envstep": 2 * TINY["max_envstep"], "max_train_iter": 2 * TINY["max_train_iter"], key: value}
    status, reads = _cli(["train", "--resume", str(runs / "cartpole_muzero")], cwd, more)
    _check_outcome(key, value, status, reads, capsys.readouterr(), runs)


@pytest.mark.parametrize("values", ASYNC_RUNS)
def test_async_values_are_read_by_a_local_async_run_that_completes_past_a_collector_failure(values, tmp_path):
    """Every async key that accepts a value kind, set at once; the run's collector fails once."""
    from muzero_tune.distributed.async_driver import train_muzero_segment_async
    from muzero_tune.envs.faults import FaultSpec
    from muzero_tune.runs.reporter import MemoryReporter

    overrides = {**TINY, ASYNC + "enabled": True, ASYNC + "ray_local_mode": True, **values}
    overrides["logging.output_dir"] = str(tmp_path)
    cfg = validate(make_config("cartpole_muzero", overrides=overrides))
    drivers: list = []
    with recording() as reads:
        summary = train_muzero_segment_async(
            cfg, reporter=MemoryReporter(), fault=FaultSpec("collector", (0,), 3, 3), driver_out=drivers
        )
    assert summary.train_iter > 0 and drivers[0].stats.collector_restarts == 1, summary
    assert not [k for k in values if k not in reads], f"the run did not read {set(values) - reads}"


@pytest.mark.parametrize("key, value", [c for c in SWEEP_CASES if c.values[0] == "tune.storage_path"])
def test_a_sweep_storage_path_reaches_the_sweep_folder(key, value, tmp_path, capsys):
    """``muzero-tune sweep`` into a name that holds a sweep already: refused (before Ray starts), naming the
    folder the storage path resolved to."""
    cwd, _, value = _walk_folders(tmp_path, value)
    held = os.path.join(os.path.abspath(os.path.join(cwd, value)), "walk")
    os.makedirs(held)
    open(os.path.join(held, "trial.json"), "w").close()
    argv = ["sweep", "--space", "blank", "--name", "walk"]
    status, reads = _cli(argv, cwd, {"tune.mlflow": False, key: value})
    err = capsys.readouterr().err
    assert status == 2 and f"its folder {held}" in err, err
    assert key in reads


@pytest.mark.parametrize("key, value", [c for c in SWEEP_CASES if c.values[0] != "tune.storage_path"])
def test_a_sweep_setting_reaches_tunes_settings(key, value, tmp_path):
    """The sweep's builders of Tune's run and search settings (what ``muzero-tune sweep`` hands Tune)."""
    from muzero_tune.tune.sweep import _run_config, _tune_configs
    from search_spaces import get_space

    cfg = validate(make_config("cartpole_muzero", overrides={key: value}), check_env=False)
    with recording() as reads:
        run = _run_config(cfg, "walk", str(tmp_path))
        search = _tune_configs(
            cfg, get_space("blank"), samples=None, scheduler="none", max_concurrent=None, seed=0,
            envstep_budgets=[cfg.max_envstep],
        )  # fmt: skip
    assert key in reads
    landed = (
        run.checkpoint_config.num_to_keep,
        run.failure_config.max_failures,
        run.sync_config.sync_period,
        search.max_concurrent_trials,
    )
    assert value in landed, (key, value, landed)


@pytest.mark.parametrize("ptype", sorted(set(POLICY_KEYS.values()) | {"muzero"}))
def test_a_policy_setting_runs_on_a_type_that_reads_it(ptype, tmp_path, capsys):
    """A tiny run of the type reads every policy setting the walk sends to it; it reads no other type's
    setting (validation reads every key: the reads counted are the run's) and none of the sweep's settings
    the walk sends to the sweep."""
    cwd, runs, _ = _walk_folders(tmp_path, None)
    overrides = {**TINY, "logging.output_dir": runs}
    status, reads = _cli(["train", "--preset", f"cartpole_{ptype}"], cwd, overrides)
    assert status == 0, capsys.readouterr().err
    mine = {k for k, t in POLICY_KEYS.items() if t == ptype}
    assert mine <= reads, f"cartpole_{ptype} did not read {sorted(mine - reads)}"
    assert not [k for k, _, _, _ in ROUTES["sweep"] if k in reads]
    if ptype == "muzero":
        others = {k for k, t in POLICY_KEYS.items() if t != "muzero"}
        assert not others & reads, sorted(others & reads)
