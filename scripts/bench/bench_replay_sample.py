"""Prioritized draw and priority write-back against the buffer's size, side by side with the O(N) draw the
sum tree replaced (numpy's ``rng.choice(n, p=P)``, which builds a cumulative sum over all N every call).

Fills a replay buffer with N real transitions (tiny frames; only the flat index and priorities matter here)
and random priorities, then times, in interleaved rounds: ``buffer.sample`` (sum-tree draw, importance
weights, lookups), the draw as it was (``buffer.choice_draw``: ``rng.choice`` and the same weights), and
``update_priorities`` of a batch. Both draws pick the same transitions (``tests/test_buffer.py``).

    python scripts/bench/bench_replay_sample.py                       # N = 1k, 30k, 300k, 1M; batch 256
    python scripts/bench/bench_replay_sample.py --sizes 1000000 --batch 32
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from muzero_tune.replay.buffer import ReplayBuffer
from muzero_tune.replay.segment import GameSegment

SEGMENT_LEN = 1000


def filled_buffer(n: int, rng: np.random.Generator) -> ReplayBuffer:
    """A buffer of ``n`` real transitions in segments of up to 1,000, priorities spread over 1e-3..1e3."""
    buf = ReplayBuffer(capacity_transitions=n)
    done = 0
    while done < n:
        m = min(SEGMENT_LEN, n - done)
        buf.push([GameSegment(
            frames=np.zeros((m + 1, 1), dtype=np.float32), actions=np.zeros(m, dtype=np.int64),
            rewards=np.zeros(m, dtype=np.float32), stats={}, num_real=m, frame_stack=1, done=False,
            terminal_at_end=False, priorities=10.0 ** rng.uniform(-3, 3, size=m),
        )])  # fmt: skip
        done += m
    return buf


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1_000, 30_000, 300_000, 1_000_000])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds per size")
    p.add_argument("--calls", type=int, default=20, help="calls per variant per round")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"batch={args.batch}, {args.rounds} interleaved rounds x {args.calls} calls; medians per call")
    print(f"{'N':>10}  {'sample (tree)':>14}  {'choice draw':>12}  {'speed-up':>9}  {'write-back':>11}")
    for n in args.sizes:
        tree, choice, write, ratio = time_size(n, args.batch, args.rounds, args.calls, rng)
        print(f"{n:>10,}  {tree:>11.3f} ms  {choice:>9.3f} ms  {ratio:>8.1f}x  {write:>8.3f} ms")


def time_size(n: int, batch: int, rounds: int, calls: int, rng: np.random.Generator):
    """(sample ms, choice-draw ms, write-back ms, median per-round choice / sample) at ``n`` transitions."""
    buf = filled_buffer(n, rng)
    s = buf.sample(batch, rng)
    pri = rng.random(batch) * 2.0
    variants = {
        "tree": lambda: buf.sample(batch, rng),
        "choice": lambda: buf.choice_draw(batch, rng),
        "write": lambda: buf.update_priorities(s.flat_index, pri, buf.clock),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for fn in variants.values():
        fn()
    for _ in range(rounds):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - t0) / calls)
    ratio = float(np.median(np.asarray(times["choice"]) / np.asarray(times["tree"])))
    return (*(1e3 * float(np.median(times[k])) for k in ("tree", "choice", "write")), ratio)


if __name__ == "__main__":
    main()
