"""Learner steps at ``learn.num_threads`` 1 against N, side by side, optionally beside a busy process.

    python scripts/bench_learner_threads.py --preset pong_muzero --set learn.batch_size=32
    python scripts/bench_learner_threads.py --preset pong_muzero --set learn.batch_size=32 --busy-process
    python scripts/bench_learner_threads.py --steps 10           # CartPole MuZero

Two drivers of one preset, the same seed and data, one per thread count, each taking ``--steps`` full train
steps (sample, targets, loss, backward, step, write-back) in turn over interleaved rounds. Printed: the median
step of each and the median per-round ratio (>1: N threads faster) with its spread. ``--busy-process`` runs a
second process that spins on a core for the whole measurement, as a collector actor does beside an async
learner on a 2-core machine: the case ``learn.num_threads`` > 1 is not meant for (OpenMP's threads then wait
for the one that lost its core).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os

import numpy as np
from bench_common import add_preset_args, filled_core, interleaved_train_steps, preset_overrides

from muzero_tune.pipeline.core import setup_torch_threads


def spin(stop) -> None:
    """Busy-loop on one core until ``stop`` is set (the stand-in for a collector actor's work)."""
    while not stop.is_set():
        sum(range(10_000))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_preset_args(p)
    p.add_argument("--threads", type=int, default=2, help="the thread count compared with 1")
    p.add_argument("--steps", type=int, default=2, help="train steps per driver per round")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--busy-process", action="store_true", help="a second process spins on a core meanwhile")
    args = p.parse_args(argv)
    setup_torch_threads()
    overrides = preset_overrides(args)
    cores = {n: filled_core(args.preset, {**overrides, "learn.num_threads": n}) for n in (1, args.threads)}
    stop = mp.Event()
    busy = mp.Process(target=spin, args=(stop,), daemon=True) if args.busy_process else None
    if busy is not None:
        busy.start()
    try:  # the warm-up steps (traces, allocator, OpenMP's team) then the timed rounds
        per_round = interleaved_train_steps(cores, rounds=args.rounds, steps=args.steps)
    finally:
        stop.set()
        if busy is not None:
            busy.join()
    one, many = np.asarray(per_round[1]), np.asarray(per_round[args.threads])
    r = one / many
    cfg = cores[1].cfg
    print(f"preset={args.preset} batch={cfg.learn.batch_size} "
          f"overlap_bootstrap={cfg.learn.overlap_bootstrap} busy_process={args.busy_process}; "
          f"{args.rounds} rounds x {args.steps} steps, interleaved "
          f"(load {os.getloadavg()[0]:.2f} at the end)")  # fmt: skip
    print(f"  full step, learn.num_threads=1: {1e3 * np.median(one):8.2f} ms")
    print(f"  full step, learn.num_threads={args.threads}: {1e3 * np.median(many):8.2f} ms")
    print(f"  speed-up ({args.threads} threads over 1): {np.median(r):.2f} "
          f"(per-round min {r.min():.2f}, max {r.max():.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
