"""CartPole-v1 learning check (slow; not in the default tests).

For each seed, trains a CartPole preset (``--preset``, default ``cartpole_muzero``; any ``cartpole_<type>``
works) with the sync pipeline until eval reward_mean >= 195
over 8 episodes, and prints env steps and wall seconds to get there. Target on a 2-core machine: every
seed within 30k env steps and 10 minutes.

    python scripts/learning_curve.py --seeds 0 1 2
    python scripts/learning_curve.py --preset cartpole_efficientzero --seeds 0
"""

from __future__ import annotations

import argparse
import json
import sys

from muzero_tune.config import make_config, parse_set_args
from muzero_tune.pipeline.reporter import MemoryReporter
from muzero_tune.pipeline.sync_driver import train_muzero_segment


def run_seed(seed: int, overrides: dict, output_dir: str, preset: str = "cartpole_muzero") -> dict:
    cfg = make_config(
        preset,
        overrides={
            "seed": seed,
            "exp_name": f"learning_curve_{preset}_seed{seed}",
            "logging.output_dir": output_dir,
            "logging.quiet": True,
            **overrides,
        },
    )
    rep = MemoryReporter()
    summary = train_muzero_segment(cfg, reporter=rep)
    solved = next((e for e in rep.evals if e["reward_mean"] >= 195.0), None)
    return {
        "seed": seed,
        "solved": solved is not None,
        "env_steps_to_195": solved["envstep"] if solved else None,
        "wall_s_to_195": round(solved["wall_s"], 1) if solved else None,
        "train_iter_to_195": solved["train_iter"] if solved else None,
        "stop_reason": summary.stop_reason,
        "curve": [(e["envstep"], round(e["wall_s"], 1), e["reward_mean"]) for e in rep.evals],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="cartpole_muzero")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    p.add_argument("--output-dir", default="runs/learning_curve")
    args = p.parse_args(argv)
    rows = []
    for seed in args.seeds:
        row = run_seed(seed, parse_set_args(args.overrides), args.output_dir, args.preset)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\nseed  solved  env_steps_to_195  wall_s_to_195")
    for r in rows:
        print(
            f"{r['seed']:>4}  {str(r['solved']):>6}  "
            f"{str(r['env_steps_to_195']):>16}  {str(r['wall_s_to_195']):>13}"
        )
    ok = all(r["solved"] and r["env_steps_to_195"] <= 30_000 and r["wall_s_to_195"] <= 600 for r in rows)
    print("target (every seed <= 30k env steps and <= 600 s):", "MET" if ok else "NOT MET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
