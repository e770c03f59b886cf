"""Reporters: how a driver hands its progress and evaluations to its host (DESIGN seam 8).

The drivers call ``on_progress`` (often) and ``on_eval`` (every evaluation, with the exact evaluated
snapshot and a callable returning the resume state). Standalone, :class:`StandaloneReporter` prints a
progress line, appends metrics to ``<run>/metrics.jsonl`` and writes ``<run>/ckpt/eval_<index>.pt``;
under Tune a reporter calls ``tune.report`` instead. Drivers do not know which host they run in.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Protocol

from muzero_tune.pipeline.checkpoint import FORMAT, save_checkpoint


class Reporter(Protocol):
    def on_progress(self, metrics: dict) -> None: ...

    def on_eval(self, metrics: dict, evaluated: dict, resume_state: Callable[[], dict]) -> None:
        """``evaluated`` = {"weights", "version", "metrics"}: exactly what the evaluator used."""

    def close(self) -> None: ...


def format_progress(m: dict) -> str:
    parts = [
        f"env_steps={m.get('envstep', 0):>8d}",
        f"envstep/s={m.get('envstep_per_s', 0.0):7.1f}",
        f"train_iter={m.get('train_iter', 0):>7d}",
        f"buffer={m.get('buffer/transitions', 0):>7d}",
    ]
    if m.get("reward_mean") is not None:
        parts.append(f"reward_mean={m['reward_mean']:.1f}")
    return "[muzero-tune] " + " ".join(parts)


class StandaloneReporter:
    """Writes ``<output_dir>/<exp_name>/{metrics.jsonl, ckpt/eval_NNNNNN.pt}`` and prints progress."""

    def __init__(
        self, run_dir: str, *, flat_config: dict, progress_interval_s: float = 5.0, quiet: bool = False
    ):
        self.run_dir = run_dir
        self.ckpt_dir = os.path.join(run_dir, "ckpt")
        os.makedirs(self.ckpt_dir, exist_ok=True)
        self.flat_config = flat_config
        self.progress_interval_s = progress_interval_s
        self.quiet = quiet
        self._last_print = 0.0
        self._last_reward: float | None = None
        self._metrics = open(os.path.join(run_dir, "metrics.jsonl"), "a")
        with open(os.path.join(run_dir, "config.json"), "w") as f:
            json.dump(flat_config, f, indent=1)
        self.checkpoints: list[str] = []

    def _print(self, m: dict) -> None:
        if not self.quiet:
            print(format_progress({**m, "reward_mean": self._last_reward}), file=sys.stdout, flush=True)

    def on_progress(self, metrics: dict) -> None:
        now = time.monotonic()
        if now - self._last_print >= self.progress_interval_s:
            self._last_print = now
            self._print(metrics)

    def on_eval(self, metrics: dict, evaluated: dict, resume_state: Callable[[], dict]) -> None:
        self._last_reward = metrics.get("reward_mean")
        self._metrics.write(
            json.dumps({k: v for k, v in metrics.items() if isinstance(v, (int, float, str))}) + "\n"
        )
        self._metrics.flush()
        path = os.path.join(self.ckpt_dir, f"eval_{int(metrics['eval_index']):06d}.pt")
        save_checkpoint(
            path,
            {"format": FORMAT, "config": self.flat_config, "evaluated": evaluated, "resume": resume_state()},
        )
        self.checkpoints.append(path)
        self._print(metrics)

    def close(self) -> None:
        self._metrics.close()


class MemoryReporter:
    """Keeps everything in memory (tests, benchmarks): progress rows, eval rows and evaluated snapshots."""

    def __init__(self, *, keep_resume: bool = False):
        self.progress: list[dict] = []
        self.evals: list[dict] = []
        self.snapshots: list[dict] = []
        self.resume_states: list[dict] = []
        self.keep_resume = keep_resume

    def on_progress(self, metrics: dict) -> None:
        self.progress.append(dict(metrics))

    def on_eval(self, metrics: dict, evaluated: dict, resume_state: Callable[[], dict]) -> None:
        self.evals.append(dict(metrics))
        self.snapshots.append(evaluated)
        if self.keep_resume:
            self.resume_states.append(resume_state())

    def close(self) -> None:
        pass
