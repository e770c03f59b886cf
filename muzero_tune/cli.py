"""The ``muzero-tune`` command line: train, eval, sweep, resume, compare, presets, spaces.

Every setting is reachable with ``--set key=value`` (dotted keys of the config tree; ``train --help``
lists them all with their docs, generated from the config's field docs). Bad input stops before any
environment, process or network starts, with one line naming the input, the value and what is allowed
(a :class:`~muzero_tune.errors.UserError`, exit status 2); a run stopped by a fault it could not recover
from is one line too (:class:`~muzero_tune.errors.RunFault`, exit status 1); any other exception is a bug
and keeps its traceback. ``train --resume PATH`` continues the run in PATH with the checkpoint's own config.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from muzero_tune.config import (
    PRESETS,
    describe_fields,
    make_config,
    parse_set_args,
    to_flat_dict,
)
from muzero_tune.distributed.cluster import DEFAULT_CONNECT_TIMEOUT_S
from muzero_tune.errors import PathError, RunFault, UserError


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (argparse's default prints the usage block first)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


DEFAULT_PRESET = "cartpole_muzero"


def _config_args(p: argparse.ArgumentParser, *, resumable: bool = False) -> None:
    p.add_argument(
        "--preset",
        default=None,
        help=f"preset name (default {DEFAULT_PRESET}"
        + ("; not with --resume: a resumed run keeps its own config" if resumable else "")
        + f"): {', '.join(PRESETS)}",
    )
    p.add_argument("--config", metavar="FILE.yaml", help="YAML file of settings (nested or dotted keys)")
    p.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        dest="overrides",
        help="override one setting, e.g. --set learn.batch_size=128 (repeatable)",
    )


def _cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--address",
        metavar="HOST:PORT",
        default=None,
        help="join the running Ray cluster there (the address `ray start --head` printed; default: "
        "$RAY_ADDRESS, else a local Ray is started)",
    )
    p.add_argument(
        "--connect-timeout-s",
        type=float,
        default=DEFAULT_CONNECT_TIMEOUT_S,
        metavar="S",
        help=f"how long to wait for the cluster's address to answer (default {DEFAULT_CONNECT_TIMEOUT_S:g})",
    )


def _settings_epilog(preset: str | None) -> str:
    """``train --help``'s settings: the values the chosen preset (default :data:`DEFAULT_PRESET`) gives, with
    the bare default beside each one it changes."""
    name = preset if preset in PRESETS else DEFAULT_PRESET
    values = to_flat_dict(make_config(name, check_env=False))
    return f"settings as preset {name} sets them (use with --set KEY=VALUE):\n" + describe_fields(
        values, source=name
    )


def _preset_in(argv: list[str]) -> str | None:
    """The ``--preset NAME`` (or ``--preset=NAME``) in ``argv``, if any."""
    for i, arg in enumerate(argv):
        if arg == "--preset" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--preset="):
            return arg.split("=", 1)[1]
    return None


def build_parser(preset: str | None = None) -> argparse.ArgumentParser:
    """The command line; ``preset``: whose values ``train --help`` lists (default :data:`DEFAULT_PRESET`)."""
    from muzero_tune import __version__

    parser = _Parser(prog="muzero-tune", description="Train, evaluate and compare MuZero-family agents.")
    parser.add_argument("--version", action="version", version=f"muzero-tune {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    tr = sub.add_parser(
        "train",
        help="train one agent (sync pipeline, or async with --async-pipeline)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_settings_epilog(preset),
    )
    _config_args(tr, resumable=True)
    tr.add_argument(
        "--async-pipeline",
        action="store_true",
        help="run the async pipeline (Ray actors); same as --set policy.async_pipeline.enabled=true",
    )
    tr.add_argument(
        "--resume",
        metavar="PATH",
        help="continue the run in PATH with its own config (--set / --config change it on top): "
        "a run folder, an eval_*.pt, a Tune trial folder, a Tune checkpoint_* folder or its checkpoint.pt",
    )
    tr.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run already in the run folder (or, with --resume, discard its later checkpoints)",
    )
    tr.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    _cluster_args(tr)

    ev = sub.add_parser("eval", help="evaluate a checkpoint's evaluated snapshot")
    ev.add_argument(
        "checkpoint",
        help="a run folder (its newest intact checkpoint), an eval_*.pt, a Tune trial folder, a Tune "
        "checkpoint_* folder or its checkpoint.pt",
    )
    ev.add_argument(
        "--episodes", type=positive_int, default=None, help="episodes (default: the run's eval.n_episodes)"
    )
    ev.add_argument("--seed", type=int, default=None, help="evaluation seed (default: the run's)")
    ev.add_argument(
        "--video", metavar="DIR", default=None,
        help="record episodes as mp4 files in DIR (and in the run's MLflow run); needs the video extra",
    )  # fmt: skip
    ev.add_argument(
        "--video-episodes", type=positive_int, default=1, help="with --video: how many episodes (default 1)"
    )
    ev.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        dest="overrides",
        help="evaluate with an eval.* or mcts.* setting changed, e.g. --set eval.unvisited_q=min "
        "(repeatable)",
    )

    sw = sub.add_parser(
        "sweep",
        help="run a Ray Tune search over a preset: a named space and/or any keys given here (MLflow-logged)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  muzero-tune sweep --grid learn.learning_rate=1e-3,3e-3 --grid mcts.num_simulations=25,50\n"
        "  muzero-tune sweep --loguniform learn.learning_rate=1e-4,1e-2 --choice learn.batch_size=64,128 "
        "--samples 8 --scheduler asha\n"
        "  muzero-tune sweep --space policy_lag_grid --grid seed=0,1   # a named space, and seeds on top",
    )
    _config_args(sw)
    sw.add_argument(
        "--space",
        default=None,
        help="search space name (search_spaces/): quickstart, sync_vs_async, policy_lag_grid, "
        "policy_lag_optuna, blank (default: quickstart, or blank when keys are given below)",
    )
    for kind, (meta, text) in {
        "grid": ("KEY=V1,V2,...", "every value, a trial each (a product with the other grids)"),
        "choice": ("KEY=V1,V2,...", "one value drawn per trial"),
        "uniform": ("KEY=LOW,HIGH", "a number drawn uniformly per trial"),
        "loguniform": ("KEY=LOW,HIGH", "a number drawn on a log scale per trial"),
        "randint": ("KEY=LOW,HIGH", "an integer in [LOW, HIGH) per trial"),
    }.items():
        sw.add_argument(f"--{kind}", action="append", default=[], metavar=meta, help=f"{text} (repeatable)")
    sw.add_argument(
        "--samples", type=positive_int, default=None, help="num_samples (grids: repeats of the grid)"
    )
    sw.add_argument(
        "--scheduler", choices=("asha", "none"), default=None, help="override the space's scheduler"
    )
    sw.add_argument("--max-concurrent", type=positive_int, default=None, help="trials at once")
    sw.add_argument("--name", default=None, help="experiment name (default: <space>_<preset>)")
    sw.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a sweep of the same name (its folder and its MLflow runs) instead of refusing",
    )
    sw.add_argument(
        "--num-cpus", type=positive_int, default=None, help="logical CPUs for a local Ray (default: enough)"
    )
    _cluster_args(sw)

    rs = sub.add_parser("resume", help="continue a killed or interrupted sweep from its folder")
    rs.add_argument("path", help="the sweep folder: <tune.storage_path>/<name>")
    rs.add_argument("--num-cpus", type=positive_int, default=None, help="logical CPUs for a local Ray")
    _cluster_args(rs)

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
    cp.add_argument(
        "--ui-url",
        default="http://127.0.0.1:5000",
        help="where `mlflow ui` serves, for the printed links (default http://127.0.0.1:5000)",
    )

    pr = sub.add_parser("presets", help="a table of the presets, or one preset's resolved settings")
    pr.add_argument("name", nargs="?", help="a preset: print every setting it resolves to")
    sub.add_parser("spaces", help="list named search spaces")
    return parser


def _note(msg: str) -> None:
    print(f"[muzero-tune] {msg}", file=sys.stderr, flush=True)


def _overrides(args: argparse.Namespace) -> dict:
    """--config (YAML) then --set (later wins) then --async-pipeline, as dotted keys."""
    from muzero_tune.config import load_yaml

    out = load_yaml(args.config) if args.config else {}
    out.update(parse_set_args(args.overrides))
    if getattr(args, "async_pipeline", False):
        out["policy.async_pipeline.enabled"] = "true"
    return out


def _resume_plan(args: argparse.Namespace):
    """(cfg, checkpoint dict, reporter) for ``train --resume PATH``: the checkpoint's own config with the
    overrides on top, continuing the checkpoint's run folder (or a new folder when exp_name/output_dir
    change, or when the checkpoint came from a Tune trial)."""
    from muzero_tune.runs.checkpoint import find_checkpoint
    from muzero_tune.runs.reporter import run_dir
    from muzero_tune.runs.resume import describe_changes, resume_config

    if args.preset is not None:
        raise UserError(
            f"--preset {args.preset} cannot be combined with --resume: a resumed run keeps the config in its "
            f"checkpoint; change settings with --set KEY=VALUE"
        )
    found = find_checkpoint(args.resume)
    notes = [f"skipping damaged checkpoint {path}: {problem}" for path, problem in found.skipped]
    if "resume" not in found.checkpoint:
        from muzero_tune.errors import CheckpointError

        raise CheckpointError(found.path, "no resume state in it: it can be evaluated, not resumed")
    cfg, changes = resume_config(found.checkpoint["config"], _overrides(args))
    counters = found.checkpoint["resume"]["counters"]
    notes.append(
        f"resuming from {found.path} (eval_index={counters['eval_index']} "
        f"train_iter={found.checkpoint['resume']['learner']['train_iter']} "
        f"envstep={counters['env_steps']}, "
        f"{'async' if cfg.policy.async_pipeline.enabled else 'sync'} pipeline); {describe_changes(changes)}"
    )
    moved = any(k in changes for k in ("exp_name", "logging.output_dir"))
    folder = found.run_dir if (found.run_dir is not None and not moved) else run_dir(cfg)
    if counters["env_steps"] >= cfg.max_envstep:
        notes.append(
            f"the run already has envstep={counters['env_steps']} >= max_envstep={cfg.max_envstep}: "
            f"raise it with --set max_envstep=N to train further"
        )
    return cfg, found, folder, notes


def _cmd_train(args: argparse.Namespace) -> int:
    from muzero_tune.config import validate

    if args.resume:
        cfg, found, folder, notes = _resume_plan(args)
        resume_from = found.checkpoint
    else:
        cfg = make_config(args.preset or DEFAULT_PRESET, overrides=_overrides(args))
        found, folder, resume_from, notes = None, None, None, []
    if args.print_config:
        print(json.dumps(to_flat_dict(cfg), indent=1))
        return 0
    from muzero_tune.api import train
    from muzero_tune.pipeline.core import check_policy_env
    from muzero_tune.runs.reporter import default_reporter

    validate(cfg)
    check_policy_env(cfg)  # before the run folder is claimed: a bad combination writes nothing
    _join_cluster_for(cfg, args)  # likewise: an unreachable cluster writes nothing
    same_run = found is not None and found.run_dir is not None and folder == found.run_dir
    reporter = default_reporter(
        cfg,
        resume_eval_index=found.eval_index if same_run else None,
        overwrite=args.overwrite,
        folder=folder,
        log_notes=False,
    )
    for msg in notes + reporter.notes:  # printed once the run folder is claimed: a refusal is one line
        _note(msg)
    summary = train(cfg, reporter=reporter, resume_from=resume_from)
    last = summary.evals[-1] if summary.evals else {}
    reward = f"reward_mean={last['reward_mean']:.1f}" if "reward_mean" in last else "no new evaluation"
    print(
        f"[muzero-tune] stopped ({summary.stop_reason}): envstep={summary.env_steps} "
        f"train_iter={summary.train_iter} wall_s={summary.wall_s:.1f} {reward} "
        f"checkpoints: {reporter.ckpt_dir}/"
    )
    if cfg.logging.mlflow:
        from muzero_tune.runs.mlflow_log import default_tracking_uri

        uri = cfg.logging.mlflow_tracking_uri or default_tracking_uri(cfg.logging.output_dir)
        print(
            f"[muzero-tune] MLflow: {uri} experiment '{cfg.logging.mlflow_experiment}' -- compare with: "
            f"muzero-tune compare --experiment {cfg.logging.mlflow_experiment} --tracking-uri {uri}"
        )
    return 0


def _join_cluster_for(cfg, args: argparse.Namespace) -> None:
    """Join --address / $RAY_ADDRESS now for a run with Ray actors (the async pipeline's, or learner workers);
    a sync run with its learner in process needs no Ray (says so for --address)."""
    from muzero_tune.distributed.cluster import join_cluster, requested_address

    _check_timeout(args)
    address = requested_address(args.address)
    if address is None:
        return
    ap = cfg.policy.async_pipeline
    uses_ray = (ap.enabled and not ap.ray_local_mode) or cfg.learn.num_learners > 0
    if not uses_ray:
        if args.address:
            _note(f"--address {args.address} not used: this run's pipeline runs in this process without Ray")
        return
    join_cluster(address, connect_timeout_s=args.connect_timeout_s)
    _note(f"joined the Ray cluster at {address}")


def _check_timeout(args: argparse.Namespace) -> None:
    if not args.connect_timeout_s > 0:
        raise UserError(f"--connect-timeout-s {args.connect_timeout_s:g}: must be > 0 seconds")


def _cmd_eval(args: argparse.Namespace) -> int:
    from muzero_tune.api import evaluate

    overrides = parse_set_args(args.overrides)
    res = evaluate(
        args.checkpoint,
        episodes=args.episodes,
        seed=args.seed,
        overrides=overrides,
        on_skipped=lambda path, problem: _note(f"skipping damaged checkpoint {path}: {problem}"),
        video_dir=args.video,
        video_episodes=args.video_episodes,
    )
    for path in res.videos:
        _note(f"video: {path}")
    print(
        json.dumps(
            {
                "checkpoint": res.checkpoint,
                "version": res.version,
                "reward_mean": res.reward_mean,
                "reward_std": res.reward_std,
                "episodes": len(res.episode_returns),
                "reported_reward_mean": res.reported_reward_mean,
                "overrides": overrides,
            }
        )
    )
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    from muzero_tune.tune.flags import KINDS, param_space_from_flags
    from muzero_tune.tune.sweep import run_sweep

    _check_timeout(args)
    flags = {kind: getattr(args, kind) for kind in KINDS}
    extra = param_space_from_flags(flags)  # typed and checked before Ray starts
    res = run_sweep(
        args.space or ("blank" if extra else "quickstart"),
        param_space_extra=extra,
        preset=args.preset or DEFAULT_PRESET,
        overrides=_sweep_overrides(args),
        samples=args.samples,
        scheduler=args.scheduler,
        max_concurrent=args.max_concurrent,
        name=args.name,
        num_cpus=args.num_cpus,
        address=args.address,
        connect_timeout_s=args.connect_timeout_s,
        overwrite=args.overwrite,
    )
    return _print_sweep(res)


def _sweep_overrides(args: argparse.Namespace) -> dict:
    return _overrides(args)


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

    _check_timeout(args)
    return _print_sweep(
        resume_sweep(
            args.path, num_cpus=args.num_cpus, address=args.address, connect_timeout_s=args.connect_timeout_s
        )
    )


def _cmd_compare(args: argparse.Namespace) -> int:
    import os

    from muzero_tune.config import ExperimentConfig
    from muzero_tune.runs.mlflow_log import default_tracking_uri, sqlite_store_missing
    from muzero_tune.tune.compare import compare

    storage = os.path.abspath(ExperimentConfig().tune.storage_path)
    uri = args.tracking_uri or default_tracking_uri(storage)
    if sqlite_store_missing(uri):
        raise PathError(
            f"--tracking-uri {uri}: no MLflow store there (the file does not exist); run a sweep or a "
            f"`train --set logging.mlflow=true` first, or pass the store's URI"
        )
    out = args.out or os.path.join(storage, "compare", args.experiment)
    res = compare(uri, args.experiment, out, ui_url=args.ui_url)
    for p in res["plots"]:
        print(f"[muzero-tune] wrote {p}")
    print(json.dumps(res["summary"], indent=1))
    port = args.ui_url.rstrip("/").rsplit(":", 1)[-1]
    port = port if port.isdigit() else "5000"
    print(
        f"[muzero-tune] plots and summary table logged to run {res['run_id']} of experiment "
        f"'{res['compare_experiment']}'; open the UI with: "
        f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port {port}"
    )
    print(f"[muzero-tune] trials' chart view (grouped by pipeline): {res['urls']['charts']}")
    print(f"[muzero-tune] comparison plots: {res['urls']['compare']}")
    return 0


def _cmd_spaces(_: argparse.Namespace) -> int:
    from search_spaces import SPACES

    for s in SPACES.values():
        print(f"{s.name}: {s.description}")
    return 0


def _cmd_presets(args: argparse.Namespace) -> int:
    """``presets``: name, env, policy type, goal and budget of each; ``presets NAME``: every setting of one
    (``*`` marks those the preset sets)."""
    if args.name is not None:
        cfg = make_config(args.name, check_env=False)  # an unknown name: ConfigError naming the presets
        own = set(PRESETS[args.name])
        for key, value in to_flat_dict(cfg).items():
            print(f"{'*' if key in own else ' '} {key} = {value!r}")
        return 0
    rows = [("preset", "env", "policy type", "goal", "budget (env steps)")]
    for name in PRESETS:
        cfg = make_config(name, check_env=False)
        goal = "-" if cfg.stop_value is None else f"reward_mean >= {cfg.stop_value:g}"
        rows.append((name, cfg.env.env_id, cfg.policy.type, goal, f"{cfg.max_envstep:,}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    print("muzero-tune presets NAME: every setting of one preset")
    return 0


class _StdoutHandler(logging.StreamHandler):
    """Writes each record to the ``sys.stdout`` of the moment it is emitted (one that is replaced later, as
    tests capturing the output do, still gets the lines)."""

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, _value) -> None:
        pass


class _WarningsAndAbove(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING


# Loggers whose INFO records announce MLflow's schema migrations each time an sqlite store is opened.
_STORE_MIGRATION_LOGGERS = ("alembic.runtime.migration", "alembic.runtime.plugins")


def _quiet_store_migrations() -> None:
    """Keep MLflow's schema-migration INFO lines off stderr. A filter on the emitting loggers, because MLflow
    configures the ``alembic`` logger's level and handlers when it is imported (after this runs) and resets
    those of its children, but leaves the children's filters alone."""
    for name in _STORE_MIGRATION_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _WarningsAndAbove) for f in logger.filters):
            logger.addFilter(_WarningsAndAbove())


def _show_progress_lines() -> None:
    """The library's INFO records (progress and evaluation lines) on stdout, once per process."""
    logger = logging.getLogger("muzero_tune")
    if not any(isinstance(h, _StdoutHandler) for h in logger.handlers):
        handler = _StdoutHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    """Run one command; a user error (bad input) is printed as one line with exit status 2, while any other
    exception is a bug and keeps its traceback."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(_preset_in(argv)).parse_args(argv)
    _show_progress_lines()
    _quiet_store_migrations()
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
    except UserError as e:
        print(f"muzero-tune {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except RunFault as e:
        print(f"muzero-tune {args.command}: stopped: {_one_line(e)}", file=sys.stderr)
        return 1
    except ImportError as e:
        from muzero_tune.envs.factory import MissingDependencyError

        if not isinstance(e, MissingDependencyError):
            raise
        print(f"muzero-tune {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`muzero-tune presets | head`): not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(
            f"muzero-tune {args.command}: interrupted (checkpoints written so far are intact)",
            file=sys.stderr,
        )
        return 130


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


if __name__ == "__main__":
    sys.exit(main())
