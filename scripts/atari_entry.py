"""The spec's Atari command lines (``atari_<type>_segment_async_config.py``): what they share.

Not a command itself: ``scripts/atari_muzero_segment_async_config.py`` and
``scripts/atari_unizero_segment_async_config.py`` call :func:`main` with their policy's presets. Settings come
from the ``pong_<type>`` preset (``pong_<type>_smoke`` with ``--smoke``), the env id and seed from the flags,
and ``--set KEY=VALUE`` on top. A bad setting, an env that is not there, or a run folder that already holds a
run is one line on stderr with exit status 2, as with ``muzero-tune``.
"""

from __future__ import annotations

import argparse
import sys

from muzero_tune.api import train
from muzero_tune.config import make_config, parse_set_args
from muzero_tune.errors import UserError
from muzero_tune.runs.reporter import default_reporter, run_dir


def build_config(policy: str, argv: list[str] | None, doc: str):
    """The run's config from the command line (``policy``: ``muzero`` or ``unizero``), and whether
    ``--overwrite`` was given."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="ALE/Pong-v5", help="any ALE/<Game>-v5 id")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--async-pipeline", action="store_true", help="Ray collector/evaluator actors (default: sync)"
    )
    p.add_argument("--smoke", action="store_true", help=f"the pong_{policy}_smoke preset: a minute or two")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in the run folder")
    p.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    args = p.parse_args(argv)
    game = args.env.split("/")[-1].split("-")[0].lower()
    overrides = {
        "env.env_id": args.env,
        "seed": args.seed,
        "exp_name": f"atari_{game}_{policy}_seed{args.seed}"
        + ("_async" if args.async_pipeline else "_sync")
        + ("_smoke" if args.smoke else ""),
        "policy.async_pipeline.enabled": args.async_pipeline,
        **parse_set_args(args.overrides),
    }
    preset = f"pong_{policy}_smoke" if args.smoke else f"pong_{policy}"
    return make_config(preset, overrides=overrides), args.overwrite


def main(policy: str, argv: list[str] | None, doc: str) -> int:
    prog = f"atari_{policy}_segment_async_config.py"
    try:
        cfg, overwrite = build_config(policy, argv, doc)
        summary = train(cfg, reporter=default_reporter(cfg, overwrite=overwrite))
    except UserError as err:
        print(f"{prog}: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    last = summary.evals[-1] if summary.evals else {}
    print(
        f"[atari] {cfg.env.env_id} {'async' if cfg.policy.async_pipeline.enabled else 'sync'}: "
        f"stopped ({summary.stop_reason}) envstep={summary.env_steps} train_iter={summary.train_iter} "
        f"wall_s={summary.wall_s:.1f} envstep/s={summary.env_steps / max(summary.wall_s, 1e-9):.1f} "
        f"reward_mean={last.get('reward_mean', float('nan'))} checkpoints: {run_dir(cfg)}/ckpt/"
    )
    return 0
