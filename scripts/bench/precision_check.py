"""Loss curves of the learner in fp32 and under ``learn.mixed_precision``, side by side on the same batches.

One replay buffer is filled by the preset's collector (the untrained network at temperature 1), then two
learners with the same initial weights train on the same sequence of samples: one in fp32, one with
``learn.mixed_precision=true`` (bf16 autocast on CUDA and on CPUs with native bf16). Each builds its own
targets from the same samples (its own target network for the bootstrap values), so the only difference is
the precision. Prints the losses every ``--every`` steps, the relative difference of the total loss, and
the wall time per step of each.

    python scripts/bench/precision_check.py                                  # CartPole MuZero, 600 steps
    python scripts/bench/precision_check.py --preset pong_muzero --set learn.batch_size=32 --steps 30 \
        --every 5
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from bench_common import add_preset_args, preset_overrides

from muzero_tune.config import make_config
from muzero_tune.pipeline.collector import fill_replay
from muzero_tune.pipeline.core import DriverCore, setup_torch_threads
from muzero_tune.pipeline.learner import Learner
from muzero_tune.runs.reporter import MemoryReporter

TERMS = ("train/loss_total", "train/loss_value", "train/loss_policy", "train/loss_reward", "train/loss_ssl")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_preset_args(p)
    p.add_argument("--steps", type=int, default=600, help="train steps of each learner")
    p.add_argument("--every", type=int, default=50, help="print the losses every this many steps")
    p.add_argument("--transitions", type=int, default=2000, help="real transitions collected first")
    args = p.parse_args(argv)
    setup_torch_threads()
    base = preset_overrides(args)
    cfg = make_config(args.preset, overrides={**base, "learn.mixed_precision": False})
    core = DriverCore(cfg, MemoryReporter())
    fill_replay(core, max(args.transitions, cfg.learn.batch_size), seed=cfg.seed)

    learners = {
        "fp32": core.learner,
        "mixed": Learner(
            make_config(args.preset, overrides={**base, "learn.mixed_precision": True}), core.policy
        ),
    }
    amp = learners["mixed"].autocast_dtype
    print(f"preset={args.preset} batch={cfg.learn.batch_size} buffer={core.buffer.num_transitions} "
          f"transitions; mixed = autocast {amp} (None: no native bf16 here, both run fp32)")  # fmt: skip
    sample_rng = np.random.default_rng([cfg.seed, 7])
    batch_rngs = {name: np.random.default_rng([cfg.seed, 11]) for name in learners}
    wall = {name: 0.0 for name in learners}
    hist: dict[str, list[dict]] = {name: [] for name in learners}
    heads = (f"{name + ' ' + t.split('_', 1)[1]:>14}" for name in learners for t in TERMS[:4])
    print(f"{'step':>5} " + " ".join(heads) + f" {'total rel diff':>14}")
    for step in range(1, args.steps + 1):
        sample = core.buffer.sample(cfg.learn.batch_size, sample_rng)  # one draw, both learners train on it
        for name, learner in learners.items():
            batch = core.policy.make_batch(
                sample, target_model=learner.target_model, rng=batch_rngs[name], defer_bootstrap=True
            )
            t0 = time.perf_counter()
            hist[name].append(learner.train_step(batch).metrics)
            wall[name] += time.perf_counter() - t0
        if step % args.every == 0 or step == args.steps:
            # the mean over the last `every` steps: one batch's loss is noisy, the curve is what counts
            means = {
                n: {t: float(np.mean([m[t] for m in h[-args.every :]])) for t in TERMS}
                for n, h in hist.items()
            }
            rel = abs(means["mixed"][TERMS[0]] - means["fp32"][TERMS[0]]) / abs(means["fp32"][TERMS[0]])
            print(f"{step:>5} " + " ".join(f"{means[n][t]:>14.4f}" for n in learners for t in TERMS[:4])
                  + f" {rel:>14.2%}")  # fmt: skip
    totals = {n: np.asarray([m[TERMS[0]] for m in h]) for n, h in hist.items()}
    rel_all = np.abs(totals["mixed"] - totals["fp32"]) / np.abs(totals["fp32"])
    print(
        f"per-step total loss, relative difference: median {np.median(rel_all):.2%}, max {rel_all.max():.2%}"
    )
    ms = {n: 1e3 * w / args.steps for n, w in wall.items()}
    print(f"learner step wall time: fp32 {ms['fp32']:.1f} ms, mixed {ms['mixed']:.1f} ms "
          f"(load {os.getloadavg()[0]:.2f} at the end)")  # fmt: skip


if __name__ == "__main__":
    main()
