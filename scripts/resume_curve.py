"""Reward across a resume: train, stop, resume from the last checkpoint (no saved buffer), continue.

Prints the eval reward curve before and after the resume for (a) resume with the default fresh-data
warm-up (learn.resume_warmup_transitions), (b) resume with no warm-up, and (c) resume with the replay buffer
saved in the checkpoint, and draws them into one PNG. Counters continue exactly in every case.

    python scripts/resume_curve.py --first 4000 --then 4000 --out-dir runs/resume_curve
"""

from __future__ import annotations

import argparse
import os

from muzero_tune.config import make_config, parse_set_args
from muzero_tune.pipeline.sync_driver import train_muzero_segment
from muzero_tune.runs.checkpoint import latest_checkpoint
from muzero_tune.runs.reporter import MemoryReporter, default_reporter


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--first", type=int, default=4000, help="env steps before the stop")
    p.add_argument("--then", type=int, default=4000, help="env steps after the resume")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    p.add_argument("--out-dir", default="runs/resume_curve")
    args = p.parse_args(argv)
    base = {
        "seed": args.seed,
        "stop_value": None,
        "logging.quiet": True,
        "logging.output_dir": args.out_dir,
        "eval.eval_freq": 100,
        **parse_set_args(args.overrides),
    }
    curves = {}
    for variant, extra in (
        ("buffer saved", {"tune.save_replay_buffer": True}),
        ("no buffer, warm-up", {}),
        ("no buffer, no warm-up", {"learn.resume_warmup_transitions": 0}),
    ):
        name = variant.replace(" ", "_").replace(",", "")
        cfg1 = make_config(
            "cartpole_muzero",
            overrides={**base, **extra, "max_envstep": args.first, "exp_name": f"first_{name}"},
        )
        rep1 = MemoryReporter()
        train_muzero_segment(cfg1, reporter=_Both(rep1, default_reporter(cfg1)))
        ckpt = latest_checkpoint(os.path.join(args.out_dir, f"first_{name}"))
        cfg2 = make_config(
            "cartpole_muzero",
            overrides={**base, **extra, "max_envstep": args.first + args.then, "exp_name": f"then_{name}"},
        )
        rep2 = MemoryReporter()
        train_muzero_segment(cfg2, reporter=rep2, resume_from=ckpt)
        curves[variant] = (
            [(e["envstep"], e["reward_mean"], e["eval_index"]) for e in rep1.evals],
            [(e["envstep"], e["reward_mean"], e["eval_index"]) for e in rep2.evals],
        )
        before, after = curves[variant]
        print(f"{variant:>22}: before {[(s, round(r)) for s, r, _ in before]}")
        print(
            f"{'':>22}  after  {[(s, round(r)) for s, r, _ in after]}  (eval_index {after[0][2]}.. continues "
            f"{before[-1][2]})"
        )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for variant, (before, after) in curves.items():
        (line,) = ax.plot(
            [s for s, _, _ in before + after],
            [r for _, r, _ in before + after],
            marker="o",
            ms=3,
            label=variant,
        )
    ax.axvline(args.first, color="gray", ls="--", label="stop / resume")
    ax.set_xlabel("env steps")
    ax.set_ylabel("eval reward_mean")
    ax.legend()
    ax.grid(alpha=0.3)
    out = os.path.join(args.out_dir, "resume_curve.png")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("wrote", out)


class _Both:
    """Fan one driver's reports out to two reporters (memory for the curve, files for the checkpoint)."""

    def __init__(self, *reps):
        self.reps = reps

    def on_progress(self, m):
        for r in self.reps:
            r.on_progress(m)

    def on_eval(self, m, evaluated, resume_state):
        for r in self.reps:
            r.on_eval(m, evaluated, resume_state)

    def close(self):
        for r in self.reps:
            r.close()


if __name__ == "__main__":
    main()
