"""CartPole-v1 learning check (slow; not in the default tests).

For each seed, trains a CartPole preset (``--preset``, default ``cartpole_muzero``; any ``cartpole_<type>``
works) with the pipeline its config selects (sync unless ``--set policy.async_pipeline.enabled=true``) until
eval reward_mean >= 195 over 8 episodes, and prints env steps and wall seconds to get there. Target on a
2-core machine: every seed within 30k env steps and 10 minutes.

    python scripts/learning_curve.py --seeds 0 1 2
    python scripts/learning_curve.py --preset cartpole_efficientzero --seeds 0
    python scripts/learning_curve.py --seeds 0 --set policy.async_pipeline.enabled=true  # Ray actors
"""

from __future__ import annotations

import argparse
import json
import sys

from muzero_tune.api import train
from muzero_tune.config import make_config, parse_set_args
from muzero_tune.runs.reporter import MemoryReporter


class _EchoReporter(MemoryReporter):
    """A MemoryReporter that also prints every evaluation to stderr as it happens (long runs show progress and
    leave their curve behind even when stopped early)."""

    def on_eval(self, metrics: dict, evaluated: dict, resume_state) -> None:
        super().on_eval(metrics, evaluated, resume_state)
        print(f"eval envstep={metrics['envstep']} wall_s={metrics['wall_s']:.1f} "
              f"reward_mean={metrics['reward_mean']:.1f}", file=sys.stderr, flush=True)  # fmt: skip


def run_seed(
    seed: int, overrides: dict, output_dir: str, preset: str = "cartpole_muzero", reporter=None
) -> dict:
    """Train one seed; ``reporter``: a MemoryReporter (or subclass) to use, None for one that prints every
    evaluation to stderr."""
    cfg = seed_config(seed, overrides, output_dir, preset)
    rep = _EchoReporter() if reporter is None else reporter
    summary = train(cfg, reporter=rep)
    target = cfg.stop_value if cfg.stop_value is not None else 195.0
    return seed_row(seed, rep.evals, target, summary.stop_reason)


def seed_config(seed: int, overrides: dict, output_dir: str, preset: str = "cartpole_muzero"):
    """The config one seed trains with: the preset, quiet, its run folder named after it, the overrides."""
    return make_config(
        preset,
        overrides={
            "seed": seed,
            "exp_name": f"learning_curve_{preset}_seed{seed}",
            "logging.output_dir": output_dir,
            "logging.quiet": True,
            **overrides,
        },
    )


def seed_row(seed: int, evals: list[dict], target: float, stop_reason: str) -> dict:
    """One seed's result from its evaluation rows: solved or not, env steps / wall seconds / train iterations
    at the first evaluation at or above ``target``, the best return, the pipeline that ran the evaluations
    (``sync`` / ``async``) and the curve [(env steps, wall s, return)]."""
    solved = next((e for e in evals if e["reward_mean"] >= target), None)
    return {
        "seed": seed,
        "target": target,
        "solved": solved is not None,
        "env_steps_to_target": solved["envstep"] if solved else None,
        "wall_s_to_target": round(solved["wall_s"], 1) if solved else None,
        "train_iter_to_target": solved["train_iter"] if solved else None,
        "best_reward_mean": max((e["reward_mean"] for e in evals), default=None),
        "stop_reason": stop_reason,
        "pipeline": evals[-1].get("pipeline") if evals else None,
        "curve": [(e["envstep"], round(e["wall_s"], 1), e["reward_mean"]) for e in evals],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="cartpole_muzero")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    p.add_argument("--output-dir", default="runs/learning_curve")
    p.add_argument("--max-envstep", "--max-env-steps", dest="max_envstep", type=int, default=30_000,
                   help="the goal's env-step budget per seed")
    p.add_argument("--max-wall-s", type=float, default=600.0, help="the goal's wall-clock budget per seed")
    args = p.parse_args(argv)
    rows = []
    for seed in args.seeds:
        row = run_seed(seed, parse_set_args(args.overrides), args.output_dir, args.preset)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(
        f"\nseed  solved  env_steps_to_target  wall_s_to_target"
        f"   (target: eval reward_mean >= {rows[0]['target']})"
    )
    for r in rows:
        print(
            f"{r['seed']:>4}  {str(r['solved']):>6}  "
            f"{str(r['env_steps_to_target']):>19}  {str(r['wall_s_to_target']):>16}"
        )
    ok = all(
        r["solved"]
        and r["env_steps_to_target"] <= args.max_envstep
        and r["wall_s_to_target"] <= args.max_wall_s
        for r in rows
    )
    print(
        f"goal (every seed <= {args.max_envstep} env steps and <= {args.max_wall_s:g} s):",
        "MET" if ok else "NOT MET",
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
