"""The ``muzero-tune`` command line: train, eval, sweep, resume, compare, presets, spaces.

Every setting is reachable with ``--set key=value`` (dotted keys of the config tree; ``train --help``
lists them all with their docs, generated from the config's field docs). Bad input stops before any
environment, process or network starts, with a message naming the key, the value and what is allowed.
"""

from __future__ import annotations

import argparse
import json
import sys

from muzero_tune.config import (
    PRESETS,
    ConfigError,
    describe_fields,
    make_config,
    parse_set_args,
    to_flat_dict,
)


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="cartpole_muzero", help=f"preset name: {', '.join(PRESETS)}")
    p.add_argument("--config", metavar="FILE.yaml", help="YAML file of settings (nested or dotted keys)")
    p.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        dest="overrides",
        help="override one setting, e.g. --set learn.batch_size=128 (repeatable)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="muzero-tune", description="Train, evaluate and compare MuZero-family agents."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    tr = sub.add_parser(
        "train",
        help="train one agent (sync pipeline, or async with --async-pipeline)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="settings (use with --set KEY=VALUE):\n" + describe_fields(),
    )
    _config_args(tr)
    tr.add_argument(
        "--async-pipeline",
        action="store_true",
        help="run the async pipeline (Ray actors); same as --set policy.async_pipeline.enabled=true",
    )
    tr.add_argument("--resume", metavar="CHECKPOINT", help="continue from a checkpoint file or run folder")
    tr.add_argument("--print-config", action="store_true", help="print the resolved config and exit")

    ev = sub.add_parser("eval", help="evaluate a checkpoint's evaluated snapshot")
    ev.add_argument(
        "checkpoint", help="a checkpoint file (ckpt/eval_*.pt) or a run folder (newest checkpoint)"
    )
    ev.add_argument(
        "--episodes", type=int, default=None, help="episodes (default: the run's eval.n_episodes)"
    )
    ev.add_argument("--seed", type=int, default=None, help="evaluation seed (default: the run's)")

    sw = sub.add_parser("sweep", help="run a named Ray Tune search space over a preset (MLflow-logged)")
    _config_args(sw)
    sw.add_argument(
        "--space",
        default="quickstart",
        help="search space name (search_spaces/): "
        "quickstart, sync_vs_async, policy_lag_grid, policy_lag_optuna",
    )
    sw.add_argument("--samples", type=int, default=None, help="num_samples (grids: repeats of the grid)")
    sw.add_argument(
        "--scheduler", choices=("asha", "none"), default=None, help="override the space's scheduler"
    )
    sw.add_argument("--max-concurrent", type=int, default=None, help="trials at once")
    sw.add_argument("--name", default=None, help="experiment name (default: <space>_<preset>)")
    sw.add_argument(
        "--num-cpus", type=int, default=None, help="logical CPUs for a local Ray (default: enough)"
    )

    rs = sub.add_parser("resume", help="continue a killed or interrupted sweep from its folder")
    rs.add_argument("path", help="the sweep folder: <tune.storage_path>/<name>")
    rs.add_argument("--num-cpus", type=int, default=None)

    cp = sub.add_parser(
        "compare", help="plot runs of an MLflow experiment (reward vs wall/env steps, envstep/s)"
    )
    cp.add_argument(
        "--experiment", default="quickstart_cartpole_muzero", help="MLflow experiment (= sweep name)"
    )
    cp.add_argument("--tracking-uri", default=None, help="default: sqlite:///<runs/tune>/mlflow.db")
    cp.add_argument(
        "--out", default=None, help="folder for the PNGs (default: <storage>/compare/<experiment>)"
    )

    sub.add_parser("presets", help="list presets and their settings")
    sub.add_parser("spaces", help="list named search spaces")
    return parser


def _cmd_train(args: argparse.Namespace) -> int:
    overrides = parse_set_args(args.overrides)
    if args.async_pipeline:
        overrides["policy.async_pipeline.enabled"] = "true"
    cfg = make_config(args.preset, yaml_path=args.config, overrides=overrides)
    if args.print_config:
        print(json.dumps(to_flat_dict(cfg), indent=1))
        return 0
    from muzero_tune.pipeline.sync_driver import run_dir, train

    summary = train(cfg, resume_from=args.resume)
    last = summary.evals[-1] if summary.evals else {}
    print(
        f"[muzero-tune] stopped ({summary.stop_reason}): env_steps={summary.env_steps} "
        f"train_iter={summary.train_iter} wall_s={summary.wall_s:.1f} "
        f"reward_mean={last.get('reward_mean', float('nan')):.1f} checkpoints: {run_dir(cfg)}/ckpt/"
    )
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from muzero_tune.pipeline.checkpoint import load_policy
    from muzero_tune.pipeline.core import EVAL_SEED_OFFSET, setup_torch_threads
    from muzero_tune.pipeline.evaluator import Evaluator

    setup_torch_threads()
    cfg, policy, model, ckpt = load_policy(args.checkpoint)
    seed = args.seed if args.seed is not None else cfg.seed + EVAL_SEED_OFFSET
    evaluator = Evaluator(cfg, policy, policy.spec, seed=seed)
    try:
        res = evaluator.evaluate(model, n_episodes=args.episodes, policy_version=ckpt["evaluated"]["version"])
    finally:
        evaluator.close()
    reported = ckpt["evaluated"]["metrics"].get("reward_mean")
    print(
        json.dumps(
            {
                "version": res.policy_version,
                "reward_mean": res.reward_mean,
                "reward_std": res.reward_std,
                "episodes": len(res.episode_returns),
                "reported_reward_mean": reported,
            }
        )
    )
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    from muzero_tune.tune.sweep import run_sweep

    res = run_sweep(
        args.space,
        preset=args.preset,
        overrides=_sweep_overrides(args),
        samples=args.samples,
        scheduler=args.scheduler,
        max_concurrent=args.max_concurrent,
        name=args.name,
        num_cpus=args.num_cpus,
    )
    return _print_sweep(res)


def _sweep_overrides(args: argparse.Namespace) -> dict:
    from muzero_tune.config import load_yaml

    out = load_yaml(args.config) if args.config else {}
    out.update(parse_set_args(args.overrides))
    return out


def _print_sweep(res) -> int:
    df = res.results.get_dataframe()
    cols = [
        c
        for c in (
            "trial_id",
            "reward_mean",
            "envstep",
            "envstep_per_s",
            "train_iter",
            "pipeline",
            "training_iteration",
        )
        if c in df.columns
    ]
    print(df[cols].to_string(index=False))
    errors = res.results.errors
    print(f"[muzero-tune] sweep folder: {res.experiment_path}")
    if res.tracking_uri:
        print(
            f"[muzero-tune] MLflow: {res.tracking_uri} experiment '{res.experiment_name}' -- compare with: "
            f"muzero-tune compare --experiment {res.experiment_name} --tracking-uri {res.tracking_uri}"
        )
    if errors:
        print(f"[muzero-tune] {len(errors)} trial(s) errored: {errors}", file=sys.stderr)
        return 1
    return 0


def _cmd_resume(args: argparse.Namespace) -> int:
    from muzero_tune.tune.sweep import resume_sweep

    return _print_sweep(resume_sweep(args.path, num_cpus=args.num_cpus))


def _cmd_compare(args: argparse.Namespace) -> int:
    import os

    from muzero_tune.config import ExperimentConfig
    from muzero_tune.tune.compare import compare
    from muzero_tune.tune.mlflow_log import default_tracking_uri

    storage = os.path.abspath(ExperimentConfig().tune.storage_path)
    uri = args.tracking_uri or default_tracking_uri(storage)
    out = args.out or os.path.join(storage, "compare", args.experiment)
    res = compare(uri, args.experiment, out)
    for p in res["plots"]:
        print(f"[muzero-tune] wrote {p}")
    print(json.dumps(res["summary"], indent=1))
    print(
        f"[muzero-tune] plots logged to MLflow run {res['run_id']}; open the UI with: "
        f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000"
    )
    return 0


def _cmd_spaces(_: argparse.Namespace) -> int:
    from search_spaces import SPACES

    for s in SPACES.values():
        print(f"{s.name}: {s.description}")
    return 0


def _cmd_presets(_: argparse.Namespace) -> int:
    for name, values in PRESETS.items():
        print(f"{name}:")
        for k, v in values.items():
            print(f"  {k} = {v!r}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {
            "train": _cmd_train,
            "eval": _cmd_eval,
            "sweep": _cmd_sweep,
            "resume": _cmd_resume,
            "compare": _cmd_compare,
            "presets": _cmd_presets,
            "spaces": _cmd_spaces,
        }[args.command](args)
    except ConfigError as e:
        print(f"muzero-tune: error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # e.g. compare: unknown experiment
        if args.command != "compare":
            raise
        print(f"muzero-tune: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
