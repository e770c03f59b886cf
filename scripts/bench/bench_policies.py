"""Train steps/s of every implemented policy type against MuZero's, side by side in one process.

Each type gets its CartPole preset, a buffer filled by its own collector, and then rounds of timed full
learner steps (sample + targets + loss + backward + step) that alternate between the types, so every type
sees the same machine load. Prints steps/s and the ratio to MuZero.

    python scripts/bench/bench_policies.py --steps 20 --rounds 3
    python scripts/bench/bench_policies.py --types unizero sampled_unizero   # MuZero is always measured
"""

from __future__ import annotations

import argparse

import numpy as np
from bench_common import filled_core, interleaved_train_steps

from muzero_tune.pipeline.core import DriverCore, setup_torch_threads
from muzero_tune.policies.registry import POLICY_TYPES


def prepared_core(policy_type: str) -> DriverCore:
    return filled_core(f"cartpole_{policy_type}", {"logging.quiet": True}, min_transitions=0)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20, help="timed train steps per type per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--types", nargs="+", default=None, choices=POLICY_TYPES,
                   help="the policy types to measure (default: all); muzero is always measured")  # fmt: skip
    args = p.parse_args(argv)
    setup_torch_threads()
    types = POLICY_TYPES if args.types is None else ("muzero", *args.types)
    cores = {t: prepared_core(t) for t in dict.fromkeys(types)}
    times = interleaved_train_steps(cores, rounds=args.rounds, steps=args.steps)
    base = float(np.median(times["muzero"]))
    print(f"CartPole presets, batch 256, K=5, {args.rounds} alternating rounds x {args.steps} steps (median)")
    print(f"{'policy type':>22} {'train steps/s':>14} {'vs muzero':>10}")
    for t, ts in times.items():
        med = float(np.median(ts))
        print(f"{t:>22} {1 / med:>14.1f} {base / med:>10.2f}")


if __name__ == "__main__":
    main()
