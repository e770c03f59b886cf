"""scripts/bench/proc_cpu.py: roles from command lines, and CPU seconds attributed to the process that
spent them (a real child process, real /proc)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import pytest

BENCH_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "bench")
sys.path.insert(0, BENCH_DIR)
import proc_cpu  # noqa: E402  (benchmark code, not part of the package)

pytestmark = pytest.mark.skipif(not proc_cpu.available(), reason="needs /proc")

BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}:\n    pass\n"


@pytest.mark.parametrize(
    ("cmdline", "is_driver", "role"),
    [
        ("python train.py", True, "driver"),
        ("ray::CollectorWorker.collect()", False, "collector"),
        ("ray::EvaluatorWorker", False, "evaluator"),
        ("/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --node-id=x", False, "ray"),
        ("ray::IDLE", False, "ray"),
        ("python -m muzero_tune.cli train --preset cartpole_muzero", False, "other"),
    ],
)
def test_role_of(cmdline, is_driver, role):
    assert proc_cpu.role_of(cmdline, is_driver=is_driver) == role


def _busy(seconds: float) -> None:
    t = time.process_time()
    while time.process_time() - t < seconds:
        pass


@contextlib.contextmanager
def _busy_child(seconds: float):
    """A child titled like a collector actor that spins ``seconds`` of CPU, then waits: the block runs once
    its busy loop is over and the child is still alive; the child exits after the block."""
    wait = "import sys\nprint('spun', flush=True)\nsys.stdin.read()\n"
    code = "# CollectorWorker\n" + BUSY.format(s=seconds) + wait
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)  # fmt: skip
    try:
        assert child.stdout.readline().strip() == "spun"
        yield
    finally:
        child.stdin.close()
        assert child.wait(timeout=60) == 0


def test_sampler_attributes_cpu_to_the_process_that_spent_it():
    sampler = proc_cpu.CpuSampler(interval_s=0.05).start()
    _busy(0.2)  # the driver, before the mark
    sampler.mark()
    # a child whose command line names the collector class, as a Ray actor's title does; the sampler's last
    # scan sees it alive after its busy loop (whatever the load: no sample of it can be missed)
    with _busy_child(0.3):
        report = sampler.stop()
    # (>= 1: a Ray worker that an earlier test in this process bound to a collector may still carry its title)
    assert report.processes["collector"] >= 1
    # its busy loop plus its interpreter start-up; /proc counts in clock ticks and leaves out time a
    # hypervisor steals (measured here: 0.145 s for a 0.2 s busy loop by process_time on a loaded VM)
    assert 0.12 <= report.cpu_s["collector"] <= 0.3 + 0.5
    assert report.cpu_s["driver"] >= 0.1
    steady = report.since_mark
    assert steady is not None and steady.wall_s < report.wall_s
    assert steady.cpu_s["collector"] == pytest.approx(report.cpu_s["collector"])  # all after the mark
    assert steady.cpu_s["driver"] <= report.cpu_s["driver"] - 0.08  # the busy loop was before the mark
    assert report.ours_s() >= report.cpu_s["collector"] + report.cpu_s["driver"]


def test_processes_outside_the_drivers_tree_are_other_whatever_their_command_line():
    """Another run's actors on the same machine (a parallel test worker's, a second benchmark's) are not
    this run's: with the driver set to a sleeping child, this process's busy collector-titled child is not
    the driver's descendant, so it counts as ``other`` and none of the run's roles grows."""
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        sampler = proc_cpu.CpuSampler(interval_s=0.05, driver_pid=driver.pid).start()
        with _busy_child(0.3):
            report = sampler.stop()
    finally:
        driver.kill()
        driver.wait()
    assert report.processes.get("collector", 0) == 0
    assert report.cpu_s["collector"] == 0.0
    assert report.cpu_s["other"] >= 0.12
    assert report.processes["driver"] == 1
    assert proc_cpu.parent_pid(os.getpid()) == os.getppid()


def test_sampler_rejects_a_bad_interval():
    with pytest.raises(ValueError, match="interval_s must be > 0, got 0"):
        proc_cpu.CpuSampler(interval_s=0)


def test_machine_cpu_counts_a_busy_loop_and_splits_the_time():
    """``MachineCpu``: the machine's busy ticks grow by at least most of a busy loop this process runs (less
    what a hypervisor may steal), the three shares sum to 1, and ``describe`` names them and the cores."""
    start = proc_cpu.MachineCpu.now()
    assert start is not None and min(start.busy, start.idle, start.steal) >= 0
    _busy(0.3)
    end = proc_cpu.MachineCpu.now()
    assert (end.busy - start.busy) / proc_cpu._CLK_TCK >= 0.15
    shares = end.shares_since(start)
    assert set(shares) == {"busy", "idle", "steal"} and sum(shares.values()) == pytest.approx(1.0)
    assert shares["busy"] > 0
    text = proc_cpu.MachineCpu.describe(start)
    assert text.startswith("busy ") and "steal " in text and text.endswith(f"of {os.cpu_count()} cores")
