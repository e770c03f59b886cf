"""What a busy second thread in the learner's process does to its backward: why the driver does not build the
next batch on a helper thread beside the backward.

    python scripts/bench/bench_gil.py  # CartPole MuZero, batch 256, 5 interleaved rounds (~2 min)
    python scripts/bench/bench_gil.py --preset cartpole_efficientzero --switch-interval-ms 0.2

The learner's loss backward and optimizer step on one fixed batch are timed on the main thread alone, and
beside a second thread that loops over one of: the driver's batch build (a prioritized sample and its
targets, the work a next-batch prefetch would move there), a pure-Python loop (holds the GIL), and a large
numpy sort (releases it). Rounds are interleaved, so every neighbour sees the same machine; the script
prints each neighbour's median slowdown of the backward and of the optimizer step, with the per-round range.
A backward that ran without the GIL would not notice the Python loop on a 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable

import numpy as np
from bench_common import add_preset_args, filled_core, preset_overrides

from muzero_tune.pipeline.core import setup_torch_threads
from muzero_tune.pipeline.learner import torch_thread_pool
from muzero_tune.replay.targets import resolve_bootstrap


def python_loop() -> None:
    """About a millisecond of pure-Python work (the GIL held throughout)."""
    x = 0
    for i in range(20_000):
        x += i


def make_numpy_sort() -> Callable[[], None]:
    """A numpy sort of 300k floats: C work that releases the GIL."""
    a = np.random.default_rng(0).random(300_000)
    return lambda: np.sort(a)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_preset_args(p)
    p.add_argument("--steps", type=int, default=10, help="timed backward+step calls per neighbour per round")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    p.add_argument("--switch-interval-ms", type=float, default=None, help="sys.setswitchinterval (default 5)")
    args = p.parse_args(argv)
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1e3)
    setup_torch_threads()
    core = filled_core(args.preset, preset_overrides(args))
    cfg = core.cfg
    learner, bs = core.learner, cfg.learn.batch_size
    # the target network's forward done once, outside the timing
    batch = resolve_bootstrap(core.build_batch()[1])
    build_rng = np.random.default_rng(1)  # the neighbour's own draws; the batch above stays fixed

    def build_batch() -> None:
        core.build_batch(build_rng)

    def backward_and_step() -> tuple[float, float]:
        """Seconds of the loss's backward and of the optimizer step (the forward untimed)."""
        out = core.policy.compute_loss(learner.model, batch, train_iter=0)
        learner.optimizer.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        out.loss.backward()
        t1 = time.perf_counter()
        learner.optimizer.step()
        return t1 - t0, time.perf_counter() - t1

    neighbours: dict[str, Callable[[], None] | None] = {
        "alone": None,
        "batch build": build_batch,
        "python loop": python_loop,
        "numpy sort": make_numpy_sort(),
    }
    times = {name: {"backward": [], "step": []} for name in neighbours}
    pool = torch_thread_pool("bench-neighbour")  # torch's thread count set there, as the learner's helpers
    for _ in range(1 + args.rounds):  # the first round warms up and is not kept
        for name, work in neighbours.items():
            stop = threading.Event()

            def loop(work=work, stop=stop) -> None:
                while not stop.is_set():
                    work()

            running = pool.submit(loop) if work is not None else None
            calls = [backward_and_step() for _ in range(args.steps)]
            stop.set()
            if running is not None:
                running.result()
            times[name]["backward"].append(float(np.median([c[0] for c in calls])))
            times[name]["step"].append(float(np.median([c[1] for c in calls])))
    for name in times:  # drop the warm-up round
        for part in times[name]:
            times[name][part] = times[name][part][1:]

    interval_ms = sys.getswitchinterval() * 1e3
    print(f"preset={args.preset} batch={bs}: the loss's backward and the optimizer step on the main thread, "
          f"{args.rounds} interleaved rounds x {args.steps} calls; GIL switch interval {interval_ms:g} ms; "
          f"load {os.getloadavg()[0]:.2f} at the end")  # fmt: skip
    alone = {part: np.asarray(v) for part, v in times["alone"].items()}
    print(f"  alone: backward {1e3 * np.median(alone['backward']):.2f} ms, "
          f"optimizer step {1e3 * np.median(alone['step']):.2f} ms")  # fmt: skip
    for name in list(neighbours)[1:]:
        cols = []
        for part in ("backward", "step"):
            r = np.asarray(times[name][part]) / alone[part]
            cols.append(
                f"{part} {1e3 * np.median(times[name][part]):.2f} ms, {np.median(r):.2f}x slower "
                f"(per round {r.min():.2f}-{r.max():.2f})"
            )
        print(f"  beside a {name:11s}: " + "; ".join(cols))


if __name__ == "__main__":
    main()
