"""How much a second busy core gives on this machine: one thread's matmul loop alone, and while the same loop
runs on a second thread of this process (with torch's thread count set there, as the learner's helper thread
does) or in a second process, measured side by side in interleaved rounds. One torch thread each, as the
pipelines run.

    python scripts/bench/bench_cores.py                 # 256x512 @ 512x384 fp32 matmuls, 15 rounds
    python scripts/bench/bench_cores.py --rounds 30 --n 512

The learner overlaps its bootstrap forward with the loss on a helper thread, and the async pipeline runs its
collectors beside the learner: both gain what a second busy core adds, 2 / the slowdown printed here. A
thread that did not set torch's count would run its matmuls on every core (``torch.set_num_threads`` holds
per OpenMP thread; :func:`muzero_tune.pipeline.learner.torch_thread_pool`), and the loop beside it would slow
down by a varying amount, so that case is not timed here (``tests/test_learner.py`` checks it by the OS
threads such a matmul starts).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time

import numpy as np
import torch

from muzero_tune.pipeline.learner import torch_thread_pool


def matmul_loop(a: torch.Tensor, b: torch.Tensor, seconds: float) -> int:
    """Matmuls of ``a`` [M, K] @ ``b`` [K, N] until ``seconds`` have passed; returns how many ran."""
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        torch.mm(a, b)
        n += 1
    return n


def timed_loop(a: torch.Tensor, b: torch.Tensor, reps: int) -> float:
    """Seconds per matmul over ``reps`` of them on this thread."""
    t0 = time.perf_counter()
    for _ in range(reps):
        torch.mm(a, b)
    return (time.perf_counter() - t0) / reps


def _busy_process(n: int, seconds: float, ready, go) -> None:
    torch.set_num_threads(1)
    a, b = torch.randn(256, n), torch.randn(n, 384)
    ready.set()
    go.wait()
    matmul_loop(a, b, seconds)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--reps", type=int, default=200, help="timed matmuls per variant per round")
    p.add_argument("--n", type=int, default=512, help="inner dimension K of the [256, K] @ [K, 384] matmuls")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    a, b = torch.randn(256, args.n), torch.randn(args.n, 384)
    per_mm = timed_loop(a, b, args.reps)  # warm-up, and how long the busy neighbour must run
    busy_s = 3 * per_mm * args.reps + 0.5

    def alone() -> float:
        return timed_loop(a, b, args.reps)

    def with_thread() -> float:
        pool = torch_thread_pool("neighbour")  # the learner's helper thread, as the learner makes it
        neighbour = pool.submit(matmul_loop, a.clone(), b.clone(), busy_s)
        time.sleep(0.05)  # the neighbour is running before the timing starts
        out = timed_loop(a, b, args.reps)
        neighbour.result()
        pool.shutdown()
        return out

    ctx = mp.get_context("spawn")

    def with_process() -> float:
        ready, go = ctx.Event(), ctx.Event()
        proc = ctx.Process(target=_busy_process, args=(args.n, busy_s, ready, go))
        proc.start()
        ready.wait()
        go.set()
        time.sleep(0.05)
        out = timed_loop(a, b, args.reps)
        proc.join()
        return out

    variants = {
        "alone": alone,
        "thread": with_thread,
        "process": with_process,
    }
    per_round: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            per_round[name].append(fn())
    base = np.asarray(per_round["alone"])
    flops = 2 * 256 * args.n * 384
    load = os.getloadavg()[0]
    print(f"[256, {args.n}] @ [{args.n}, 384] fp32 matmuls, one torch thread each, {args.rounds} interleaved "
          f"rounds of {args.reps}; cpus {os.cpu_count()}, load {load:.2f} at the end")  # fmt: skip
    print(f"  alone: {1e3 * np.median(base):.3f} ms per matmul ({flops / np.median(base) / 1e9:.1f} GFLOP/s)")
    for name in [v for v in variants if v != "alone"]:
        slow = np.asarray(per_round[name]) / base
        print(f"  with the same loop on a second {name:7s}: {np.median(slow):.2f}x slower "
              f"(per-round {slow.min():.2f}-{slow.max():.2f}); two busy cores = "
              f"{2 / np.median(slow):.2f}x one")  # fmt: skip


if __name__ == "__main__":
    main()
