"""Per-process CPU accounting of a run, from ``/proc``: who spent the machine's cores, grouped by role.

What this module owns
    :class:`CpuSampler`, a background thread that reads every process's CPU seconds (``utime + stime`` of
    ``/proc/<pid>/stat``) at a fixed interval during a run and attributes them to roles by the process's
    command line: ``driver`` (the process running the sampler: learner, buffer, event loop), ``collector``
    and ``evaluator`` (Ray actors, whose titles name their class), ``ray`` (Ray's own processes: raylet, GCS,
    dashboard agents, idle workers) and ``other`` (everything else on the machine). Only the driver's
    descendants get the first four roles (a local Ray cluster the driver started: its GCS and raylet are
    the driver's children, the actors the raylet's); another run's actors on the same machine (a second
    benchmark, a parallel test worker) are ``other``, however their command lines read. A process that exits
    during the run keeps the CPU seen at its last sample (at most one interval is lost); the sampler's own
    reads are measured on its thread and reported apart (``sampler``, subtracted from ``driver``). ``/proc``
    counts in clock ticks and leaves out time a hypervisor steals from the VM, so on a loaded VM its figures
    can be below ``time.process_time()`` (0.145 s for a 0.2 s busy loop here); compare roles within a run.
    :class:`MachineCpu`, the whole machine's busy / idle / steal time from ``/proc/stat``, which the learner
    benchmarks print over their timed rounds.

What it must never do
    Change what it measures (it only reads ``/proc``: one ``stat`` read per process per interval, command
    lines only of new and Ray processes), or run outside Linux (:func:`available` says whether it can).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

ROLES = ("driver", "collector", "evaluator", "ray", "other")
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def available() -> bool:
    """True where ``/proc/<pid>/stat`` can be read (Linux)."""
    return os.path.exists(f"/proc/{os.getpid()}/stat")


def stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after ``pid (comm)``: state is field 0, ppid 1, session 3, utime
    11, stime 12; None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return raw[raw.rfind(b")") + 2 :].split()


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) process ``pid`` has used, or None if it is gone."""
    fields = stat_fields(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / _CLK_TCK


def parent_pid(pid: int) -> int | None:
    """The parent of process ``pid`` (0 for the kernel's own), or None if it is gone."""
    fields = stat_fields(pid)
    return None if fields is None else int(fields[1])


@dataclass(frozen=True)
class MachineCpu:
    """The whole machine's CPU time so far, from ``/proc/stat``'s ``cpu`` line, in clock ticks summed over the
    cores: ``busy`` (user, nice, system, irq, softirq), ``idle`` (idle, iowait) and ``steal`` (time the
    hypervisor gave this VM's cores to other guests: a benchmark on a shared VM loses it without seeing a
    busy neighbour process)."""

    busy: int
    idle: int
    steal: int

    @classmethod
    def now(cls) -> MachineCpu | None:
        """The counters now, or None where ``/proc/stat`` cannot be read."""
        try:
            with open("/proc/stat", "rb") as f:
                fields = [int(x) for x in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        user, nice, system, idle, iowait, irq, softirq, steal = fields + [0] * (8 - len(fields))
        return cls(busy=user + nice + system + irq + softirq, idle=idle + iowait, steal=steal)

    def shares_since(self, start: MachineCpu) -> dict[str, float]:
        """Each kind's share of the machine's CPU time between ``start`` and this snapshot (sums to 1)."""
        d = {
            "busy": self.busy - start.busy,
            "idle": self.idle - start.idle,
            "steal": self.steal - start.steal,
        }
        total = max(sum(d.values()), 1)
        return {k: v / total for k, v in d.items()}

    @staticmethod
    def describe(start: MachineCpu | None) -> str:
        """``"busy 97%, idle 2%, steal 1% of 2 cores"`` since ``start`` (empty without ``/proc/stat``)."""
        end = MachineCpu.now()
        if start is None or end is None:
            return ""
        shares = end.shares_since(start)
        parts = ", ".join(f"{k} {100 * v:.0f}%" for k, v in shares.items())
        return f"{parts} of {os.cpu_count()} cores"


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def short_name(cmdline: str) -> str:
    """The program of a command line, for the per-process breakdown: ``ray::X`` titles as they are, else the
    base name of the first word, plus the script or module a Python interpreter runs."""
    words = cmdline.split()
    if not words:
        return "?"
    if words[0].startswith("ray::"):
        return words[0].split(".")[0]
    name = os.path.basename(words[0])
    if name.startswith("python") and len(words) > 1:
        arg = words[2] if words[1] == "-m" and len(words) > 2 else words[1]
        return f"{name} {os.path.basename(arg)}"
    return name


def role_of(cmdline: str, *, is_driver: bool) -> str:
    """The role (one of :data:`ROLES`) of a process with this command line."""
    if is_driver:
        return "driver"
    if "CollectorWorker" in cmdline:
        return "collector"
    if "EvaluatorWorker" in cmdline:
        return "evaluator"
    if "ray" in cmdline:  # raylet, gcs_server, ray::IDLE workers, dashboard and runtime-env agents, monitors
        return "ray"
    return "other"


@dataclass
class _Proc:
    start_cpu_s: float
    last_cpu_s: float
    role: str
    name: str = ""  # a short name from the command line (``raylet``, ``gcs_server``, ``ray::IDLE``, ...)
    mark_cpu_s: float | None = None  # CPU seconds at :meth:`CpuSampler.mark` (None: not yet running then)


@dataclass
class CpuReport:
    """CPU seconds per role over one sampled interval of wall time ``wall_s``."""

    wall_s: float
    cpu_s: dict[str, float] = field(default_factory=dict)  # role -> CPU seconds (ROLES + "sampler")
    processes: dict[str, int] = field(default_factory=dict)  # role -> processes seen
    by_process: dict[str, float] = field(default_factory=dict)  # "role: short name" -> CPU s (not other)
    since_mark: CpuReport | None = None  # the same from :meth:`CpuSampler.mark` on, if it was called

    def ours_s(self) -> float:
        """CPU seconds of this run's own processes (driver, actors, Ray, the sampler), not ``other``."""
        return sum(v for k, v in self.cpu_s.items() if k != "other")


class CpuSampler:
    """Sample all processes' CPU seconds every ``interval_s`` between :meth:`start` and :meth:`stop`."""

    def __init__(self, *, interval_s: float = 0.5, driver_pid: int | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.interval_s = float(interval_s)
        self.driver_pid = os.getpid() if driver_pid is None else int(driver_pid)
        self._procs: dict[int, _Proc] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sampler_cpu_s = 0.0
        self._t0 = 0.0
        self._mark: tuple[float, float] | None = None  # (monotonic time, sampler CPU s) at mark()
        self._lock = threading.Lock()
        self._descends: dict[int, bool] = {self.driver_pid: True}  # pid -> descends from the driver

    def _is_ours(self, pid: int) -> bool:
        """Whether ``pid`` is the driver or descends from it, walking parents up ``/proc`` (memoised: a
        pid's ancestry is fixed while it lives, and the sampler sees each pid once)."""
        chain: list[int] = []
        while pid not in self._descends:
            chain.append(pid)
            parent = parent_pid(pid)
            if parent is None or parent <= 1:  # gone, or reached init / the kernel: not the driver's
                ours = False
                break
            pid = parent
        else:
            ours = self._descends[pid]
        for p in chain:
            self._descends[p] = ours
        return ours

    def _scan(self, *, baseline: bool) -> None:
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            cpu = process_cpu_s(pid)
            if cpu is None:
                continue
            proc = self._procs.get(pid)
            if proc is None:
                # a process first seen after the start was started during the run: all its CPU counts
                cmdline = _cmdline(pid)
                if self._is_ours(pid):
                    role = role_of(cmdline, is_driver=pid == self.driver_pid)
                else:
                    role = "other"
                proc = _Proc(cpu if baseline else 0.0, cpu, role, short_name(cmdline))
                self._procs[pid] = proc
            elif proc.role == "ray":
                # Ray renames an idle worker when it binds an actor to it; other roles are final
                cmdline = _cmdline(pid)
                proc.role, proc.name = role_of(cmdline, is_driver=False), short_name(cmdline)
            proc.last_cpu_s = cpu

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            t = time.thread_time()
            with self._lock:
                self._scan(baseline=False)
            self._sampler_cpu_s += time.thread_time() - t

    def mark(self) -> None:
        """Start a second window here (e.g. once training runs, to leave out start-up): :meth:`stop`'s
        report carries it as ``since_mark``. Only the first call counts."""
        if self._mark is not None:
            return
        t = time.thread_time()
        with self._lock:
            self._scan(baseline=False)
            for proc in self._procs.values():
                proc.mark_cpu_s = proc.last_cpu_s
            self._mark = (time.monotonic(), self._sampler_cpu_s)
        self._sampler_cpu_s += time.thread_time() - t

    def start(self) -> CpuSampler:
        if not available():
            raise RuntimeError("CpuSampler needs /proc (Linux)")
        self._t0 = time.monotonic()
        self._scan(baseline=True)
        self._thread = threading.Thread(target=self._loop, name="cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> CpuReport:
        """Stop sampling (one last scan) and return CPU seconds per role since :meth:`start`."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        t = time.thread_time()
        self._scan(baseline=False)
        self._sampler_cpu_s += time.thread_time() - t
        now = time.monotonic()
        report = self._report(now - self._t0, lambda p: p.start_cpu_s, self._sampler_cpu_s)
        if self._mark is not None:
            t_mark, sampler_at_mark = self._mark
            report.since_mark = self._report(
                now - t_mark,
                lambda p: p.start_cpu_s if p.mark_cpu_s is None else p.mark_cpu_s,
                self._sampler_cpu_s - sampler_at_mark,
            )
        return report

    def _report(self, wall_s: float, base, sampler_cpu_s: float) -> CpuReport:
        report = CpuReport(wall_s=wall_s, cpu_s=dict.fromkeys(ROLES, 0.0))
        for proc in self._procs.values():
            spent = max(0.0, proc.last_cpu_s - base(proc))
            report.cpu_s[proc.role] += spent
            report.processes[proc.role] = report.processes.get(proc.role, 0) + 1
            if proc.role != "other":
                key = f"{proc.role}: {proc.name}"
                report.by_process[key] = report.by_process.get(key, 0.0) + spent
        report.cpu_s["sampler"] = sampler_cpu_s
        report.cpu_s["driver"] = max(0.0, report.cpu_s["driver"] - sampler_cpu_s)
        return report
