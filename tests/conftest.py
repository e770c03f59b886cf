"""Shared fixtures: one Ray cluster per test session (``ray.init`` costs 6-9 s on this machine; under
``pytest -n 2`` each of the two worker processes has its session, so its own cluster) and a helper that runs a
tiny async CartPole run and records what the driver saw.

Tests that need Ray request ``ray_cluster`` (or ``run_async``, which depends on it); the others never start
Ray. The environment variables below are set at import so any Ray started anywhere in the session inherits
them (no usage stats, no token auth).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ["RAY_AUTH_MODE"] = "disabled"
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

# Inductor's CPU kernels are C++: a check that compiles on the CPU needs a compiler
NEEDS_CXX = pytest.mark.skipif(
    not any(shutil.which(c) for c in ("g++", "c++", "clang++")),
    reason="Inductor's CPU kernels need a C++ compiler",
)

# Logical CPUs of each test process's Ray cluster: the machine's, and at least the 5 the largest proof needs
# (the quickstart sweep's four trials side by side, each async one 1 + 0.25 + 0.25: tests/test_tune.py). Every
# other test's runs and sweeps fit in 2 and start no more processes at once than that.
RAY_TEST_CPUS = max(5, os.cpu_count() or 1)
# A test's actors take a quarter of a logical CPU each, so a run (driver 1 + its actors) fits in 2 CPUs: one
# collector and one evaluator need 1.5, two of each 2.0
ACTOR_CPUS = {
    "policy.async_pipeline.collector_num_cpus": 0.25, "policy.async_pipeline.evaluator_num_cpus": 0.25,
}  # fmt: skip

# every async run in the tests: tiny networks and searches, short segments, no early stop
ASYNC_SMALL = {
    "model.hidden_dim": 32, "model.latent_dim": 16, "mcts.num_simulations": 4, "learn.batch_size": 32,
    "env.collector_env_num": 4, "env.evaluator_env_num": 2, "eval.n_episodes": 2, "eval.eval_freq": 20,
    "replay.game_segment_length": 20, "max_envstep": 400, "stop_value": None, "logging.quiet": True,
    "policy.async_pipeline.enabled": True, "policy.async_pipeline.actor_restart_delay_s": 0.1, **ACTOR_CPUS,
}


_SUITE_T0 = time.perf_counter()
SUITE_BUDGET_S = 8 * 60  # the default suite's budget on a 2-core machine


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Print the suite's wall time against its budget (before pytest's closing line, which CI reads)."""
    wall_s = time.perf_counter() - _SUITE_T0
    terminalreporter.write_line(
        f"test time: {wall_s:.0f} s wall for this session (default-suite budget {SUITE_BUDGET_S} s)"
    )


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """``-n N`` (pytest-xdist) without ``--dist``: each test file whole on one worker (``loadfile``), so a
    module's and the session's fixtures (one Ray cluster per worker, the Tune sweeps a file's tests share) are
    built once per worker, not once per test that lands there. Runs before xdist's own hook, which would pick
    ``load``; ``pytest`` without xdist installed, or without ``-n``, is untouched. The files are handed out
    in collection order (:data:`LONGEST_FILES_FIRST` first), not xdist's default of the most tests first."""
    if getattr(config.option, "numprocesses", None) and getattr(config.option, "dist", None) == "no":
        config.option.dist = "loadfile"
        config.option.loadscopereorder = False


# The files that take longest under `-n 2` (over 35 s each, most of it Ray actors and Tune trials), longest
# first. Under xdist they are handed out before the rest, so the two workers finish together (the longest
# first is the usual greedy schedule); handed out by their number of tests (xdist's default), the long files
# with few tests came last and one worker ended well after the other. A file missing here runs after these,
# in collection order; the order changes no test's outcome.
LONGEST_FILES_FIRST = (
    "test_every_policy_type.py", "test_async_faults.py", "test_tune.py", "test_learner_group.py",
    "test_tune_restore.py", "test_async_pipeline.py", "test_compiled_loss.py", "test_user_envs.py",
    "test_pipeline_resume.py", "test_config_walk.py",
)  # fmt: skip


def pytest_collection_modifyitems(config, items):
    """Under ``-n N``: the :data:`LONGEST_FILES_FIRST` files' tests first, in that order, then the rest in
    collection order (a stable sort: each file's tests keep their order)."""
    if not getattr(config.option, "numprocesses", None):
        return
    rank = {name: i for i, name in enumerate(LONGEST_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray instance with the machine's CPUs (:data:`RAY_TEST_CPUS`)."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=RAY_TEST_CPUS, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


class DriverProbe(list):
    """A ``driver_out`` list that instruments the driver appended to it.

    It records every collect result (actor id, version, digest, env steps, transitions) and every eval
    result the driver handles, and pings every actor incarnation: those spawned while the driver was built
    when it is appended, the others right after they are spawned, so the pids of restarted actors are known
    too.
    """

    def __init__(self):
        super().__init__()
        self.collects: list[dict] = []
        self.evals: list[dict] = []
        self.pings: list[Any] = []
        self.spawns: list[tuple[str, int, int]] = []  # (kind, index, incarnation) of every actor created

    def append(self, driver) -> None:  # type: ignore[override]
        super().append(driver)
        on_collect, on_eval, spawn = driver.on_collect, driver.on_eval, driver.actors.spawn

        def _on_collect(launch, result):
            self.collects.append({
                "actor_id": result.actor_id, "slot": launch.slot.index, "version": result.policy_version,
                "launch_version": launch.version, "digest": result.weights_digest,
                "envstep_delta": result.envstep_delta, "real_transitions": result.real_transitions,
                "duration_s": result.duration_s,
            })
            on_collect(launch, result)

        def _on_eval(launch, result):
            self.evals.append({"actor_id": result.actor_id, "version": result.policy_version,
                               "digest": result.weights_digest, "duration_s": result.duration_s})
            on_eval(launch, result)

        def _spawn(slot):
            spawn(slot)
            self.spawns.append((slot.kind, slot.index, slot.incarnation))
            self.pings.append(slot.handle.ping.remote())

        driver.on_collect, driver.on_eval, driver.actors.spawn = _on_collect, _on_eval, _spawn
        # the actors the driver created while it was being built (its collectors boot beside its learner)
        self.pings += [s.handle.ping.remote() for s in driver.actors.slots if s.handle]
        self.spawns += [(s.kind, s.index, s.incarnation) for s in driver.actors.slots if s.handle]

    @property
    def driver(self):
        return self[0]

    def actor_pings(self) -> list[dict]:
        """The ping of every actor incarnation that came up (killed ones included: their reply is kept).

        An incarnation that died before answering never ran a task and is left out; one that is alive and
        does not answer within 30 s (ten times an actor's start-up on 2 loaded cores: a replacement spawned
        as the run ended may still be booting) raises ``GetTimeoutError`` (a hung actor fails the checks
        built on this, it does not drop out of them)."""
        import ray
        from ray.exceptions import RayActorError

        out = []
        for ref in self.pings:
            try:
                out.append(ray.get(ref, timeout=30))
            except RayActorError:  # died before it answered
                pass
        return out


@dataclass
class AsyncRun:
    cfg: Any
    summary: Any
    probe: DriverProbe
    reporter: Any
    run_dir: str
    error: BaseException | None = None
    wall_s: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def driver(self):
        return self.probe.driver

    @property
    def stats(self):
        return self.probe.driver.stats


def _async_config(out_dir, overrides: dict | None = None, *, exp_name: str = "async"):
    from muzero_tune.config import make_config

    return make_config("cartpole_muzero", overrides={
        **ASYNC_SMALL, "logging.output_dir": str(out_dir), "exp_name": exp_name, **(overrides or {})})


@pytest.fixture(scope="session")
def async_small() -> dict:
    """The overrides every tiny async run uses (a copy)."""
    return dict(ASYNC_SMALL)


@pytest.fixture(scope="session")
def async_config():
    """``async_config(out_dir, overrides, exp_name=...) -> ExperimentConfig``: the tiny async run's config."""
    return _async_config


def _run_async(out_dir, overrides: dict | None = None, *, fault=None, standalone: bool = False,
               exp_name: str = "async", expect_error: type[BaseException] | None = None) -> AsyncRun:
    from muzero_tune.distributed.async_driver import train_muzero_segment_async
    from muzero_tune.runs.reporter import MemoryReporter

    cfg = _async_config(out_dir, overrides, exp_name=exp_name)
    reporter = None if standalone else MemoryReporter()
    probe = DriverProbe()
    summary, error = None, None
    t0 = time.monotonic()
    if expect_error is None:
        summary = train_muzero_segment_async(cfg, reporter=reporter, driver_out=probe, fault=fault)
    else:
        with pytest.raises(expect_error) as info:
            train_muzero_segment_async(cfg, reporter=reporter, driver_out=probe, fault=fault)
        error = info.value
    return AsyncRun(cfg, summary, probe, reporter, os.path.join(str(out_dir), exp_name), error,
                    time.monotonic() - t0)


@pytest.fixture(scope="session")
def run_async(ray_cluster):
    """``run_async(out_dir, overrides, fault=..., standalone=..., expect_error=...) -> AsyncRun``."""
    return _run_async


def pids_still_alive(pids, grace_s: float = 15.0) -> set[int]:
    """The pids that still exist after up to ``grace_s`` seconds (``os.kill(pid, 0)`` succeeds)."""
    alive = set(pids)
    deadline = time.monotonic() + grace_s
    while True:
        for pid in list(alive):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                alive.discard(pid)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


@pytest.fixture(scope="session")
def alive_after():
    """``alive_after(pids, grace_s=15) -> set``: pids still running after the grace period."""
    return pids_still_alive


# ---------------------------------------------------------------------------------------------- the CLI

# every CLI run in the tests: the tiny sync CartPole settings as --set arguments
CLI_SMALL = {
    "model.hidden_dim": 32, "model.latent_dim": 16, "mcts.num_simulations": 4, "learn.batch_size": 32,
    "env.collector_env_num": 4, "env.evaluator_env_num": 2, "eval.n_episodes": 2, "eval.eval_freq": 20,
    "replay.game_segment_length": 20, "stop_value": None, "logging.progress_interval_s": 0,
}


def fit_one_trial(cfg, storage_path):
    """Run ``cfg`` as a 1-trial Tune sweep (no MLflow) under ``storage_path``; assert it ended without an
    error and return its ``ray.tune.Result``."""
    from ray import tune

    from muzero_tune.tune.trainable import make_trainable

    tuner = tune.Tuner(
        make_trainable(cfg, sweep_name="t", mlflow_uri=None),
        param_space={},
        run_config=tune.RunConfig(storage_path=str(storage_path)),
    )
    results = tuner.fit()
    assert results.num_errors == 0 and len(results) == 1
    return results[0]


def trial_policy(result):
    """Load the newest checkpoint of a Tune ``result``: ``(cfg, policy, model, checkpoint dict)`` as
    :func:`muzero_tune.runs.checkpoint.load_policy` returns them."""
    from muzero_tune.runs.checkpoint import load_policy
    from muzero_tune.tune.trainable import CHECKPOINT_FILE

    with result.checkpoint.as_directory() as d:
        return load_policy(os.path.join(d, CHECKPOINT_FILE))


def set_args(overrides: dict) -> list[str]:
    """``{"a.b": 3}`` -> ``["--set", "a.b=3"]`` (None as ``none``)."""
    out: list[str] = []
    for k, v in overrides.items():
        out += ["--set", f"{k}={'none' if v is None else v}"]
    return out


def run_cli(args: list[str], *, cwd, env: dict | None = None, timeout: float = 300):
    """``python -m muzero_tune.cli ARGS`` in a subprocess; returns the CompletedProcess (text)."""
    import subprocess
    import sys

    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "muzero_tune.cli", *args], cwd=str(cwd), env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def cli_in_process(args: list[str], *, cwd: str) -> subprocess.CompletedProcess:
    """``muzero_tune.cli.main(args)`` in ``cwd`` as the entry point would run it: the exit status (``main``'s
    return value or argparse's ``SystemExit``), stdout, and stderr with every warning raised meanwhile and the
    traceback of an escaping exception (exit status 1) in it, as the interpreter would print them."""
    import contextlib
    import io
    import traceback
    import warnings

    import torch

    from muzero_tune import cli

    out, err = io.StringIO(), io.StringIO()
    old_cwd, threads = os.getcwd(), torch.get_num_threads()
    os.chdir(cwd)
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            warnings.simplefilter("always")
            for hidden in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.simplefilter("ignore", hidden)  # the interpreter's default filters hide these
            try:
                code = cli.main(args)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except Exception:  # noqa: BLE001 - a bug: the interpreter would print it and exit 1
                traceback.print_exc(file=err)
                code = 1
        for w in caught:
            err.write(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line))
    finally:
        os.chdir(old_cwd)
        torch.set_num_threads(threads)  # `eval` sets one thread for its process
    return subprocess.CompletedProcess(["muzero-tune", *args], code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """A tiny sync run trained through the command line in this process (:func:`cli_in_process`; seed 1,
    300 env steps, 3 evaluations); copy it before changing it. Returns its run folder
    (``<tmp>/runs/tiny``)."""
    root = tmp_path_factory.mktemp("cli_run")
    res = cli_in_process(["train", *set_args({**CLI_SMALL, "seed": 1, "max_envstep": 300, "exp_name": "tiny",
                                              "logging.output_dir": str(root / "runs")})], cwd=str(root))
    assert res.returncode == 0, res.stderr
    return str(root / "runs" / "tiny")
