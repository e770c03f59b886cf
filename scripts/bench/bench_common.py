"""What the learner benchmarks share (not a benchmark itself): the ``--preset`` / ``--set`` options, a driver
with a filled buffer, and full train steps of several drivers timed in interleaved rounds.

The scripts import it as ``bench_common``: ``python scripts/bench/<name>.py`` puts ``scripts/bench/`` first
on the path.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Hashable

from muzero_tune.config import make_config, parse_set_args
from muzero_tune.pipeline.collector import fill_replay
from muzero_tune.pipeline.core import DriverCore
from muzero_tune.runs.reporter import MemoryReporter


def add_preset_args(p: argparse.ArgumentParser, default: str = "cartpole_muzero") -> None:
    """``--preset NAME`` and repeatable ``--set KEY=VALUE`` (parsed into ``args.overrides``)."""
    p.add_argument("--preset", default=default)
    p.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")


def preset_overrides(args: argparse.Namespace) -> dict:
    """The ``--set`` overrides of ``args``, with the run's console output off."""
    return {"logging.quiet": True, **parse_set_args(args.overrides)}


def filled_core(preset: str, overrides: dict, *, min_transitions: int = 1000) -> DriverCore:
    """A driver of ``preset`` with ``overrides`` and a buffer its collector filled with twice the batch of
    real transitions, at least ``min_transitions``."""
    cfg = make_config(preset, overrides=overrides)
    core = DriverCore(cfg, MemoryReporter())
    fill_replay(core, max(2 * cfg.learn.batch_size, min_transitions))
    return core


def interleaved_train_steps(
    cores: dict[Hashable, DriverCore], *, rounds: int, steps: int, warmup: int = 2
) -> dict[Hashable, list[float]]:
    """Seconds per full train step of each driver, one figure per round: after ``warmup`` steps each, every
    round times ``steps`` steps of each driver in turn, so all of them see the same machine load. A round
    includes the work its last step started ahead (``learn.prefetch_next_batch``), which the driver's next
    round then uses, as consecutive steps of a train budget do."""
    for core in cores.values():
        for _ in range(warmup):
            core.train_step()
    per_round: dict[Hashable, list[float]] = {key: [] for key in cores}
    for _ in range(rounds):
        for key, core in cores.items():
            t0 = time.perf_counter()
            for _ in range(steps):
                core.train_step()
            core.settle()  # the next batch's bootstrap forward started ahead is this round's work
            per_round[key].append((time.perf_counter() - t0) / steps)
    return per_round
