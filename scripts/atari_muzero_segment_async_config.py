"""MuZero on Atari with the segment pipeline, mirroring the spec's command line.

    python scripts/atari_muzero_segment_async_config.py --env ALE/Pong-v5 --seed 0                    # sync
    python scripts/atari_muzero_segment_async_config.py --env ALE/Pong-v5 --seed 0 --async-pipeline   # async
    python scripts/atari_muzero_segment_async_config.py --env ALE/Breakout-v5 --smoke  # 1-2 min

Any ``ALE/<Game>-v5`` id works; settings come from the ``pong_muzero`` preset (the reference system's Atari
settings) and can be changed with ``--set key=value``. ``--smoke`` shrinks everything (fewer simulations, a
small batch, a short run) so the whole pipeline runs in a minute or two on a CPU.
"""

from __future__ import annotations

import argparse
import sys

from muzero_tune.api import train
from muzero_tune.config import make_config, parse_set_args
from muzero_tune.runs.reporter import run_dir

SMOKE = {
    "max_envstep": 800,
    "mcts.num_simulations": 8,
    "learn.batch_size": 16,
    "learn.replay_ratio": 0.05,
    "learn.train_start_after_envsteps": 200,
    "learn.min_replay_transitions": 64,
    "env.collector_env_num": 4,
    "env.evaluator_env_num": 1,
    "eval.n_episodes": 1,
    "eval.max_episode_steps": 200,
    "eval.eval_freq": 20,
    "model.num_channels": 32,
    "model.value_support_size": 50,
    "model.reward_support_size": 5,
    "replay.capacity_transitions": 20_000,
    "stop_value": None,
    "policy.async_pipeline.actor_start_timeout_s": 300.0,
}


def build_config(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="ALE/Pong-v5", help="any ALE/<Game>-v5 id")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--async-pipeline", action="store_true", help="Ray collector/evaluator actors (default: sync)"
    )
    p.add_argument("--smoke", action="store_true", help="a tiny run of a minute or two")
    p.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    args = p.parse_args(argv)
    game = args.env.split("/")[-1].split("-")[0].lower()
    overrides = {
        "env.env_id": args.env,
        "seed": args.seed,
        "exp_name": f"atari_{game}_muzero_seed{args.seed}"
        + ("_async" if args.async_pipeline else "_sync")
        + ("_smoke" if args.smoke else ""),
        "policy.async_pipeline.enabled": args.async_pipeline,
    }
    if args.smoke:
        overrides.update(SMOKE)
    overrides.update(parse_set_args(args.overrides))
    return make_config("pong_muzero", overrides=overrides)


def main(argv: list[str] | None = None) -> int:
    cfg = build_config(argv)
    summary = train(cfg)
    last = summary.evals[-1] if summary.evals else {}
    print(
        f"[atari] {cfg.env.env_id} {'async' if cfg.policy.async_pipeline.enabled else 'sync'}: "
        f"stopped ({summary.stop_reason}) envstep={summary.env_steps} train_iter={summary.train_iter} "
        f"wall_s={summary.wall_s:.1f} envstep/s={summary.env_steps / max(summary.wall_s, 1e-9):.1f} "
        f"reward_mean={last.get('reward_mean', float('nan'))} checkpoints: {run_dir(cfg)}/ckpt/"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
