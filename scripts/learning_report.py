"""Learning report: a matrix of presets x seeds, one run at a time; a Markdown table and one plot per task.

Each (preset, seed) cell is trained by ``learning_curve.run_seed`` (the config's pipeline, stopping at the
preset's ``stop_value`` or its env-step / wall budget) and its result is stored as
``<output-dir>/results/<preset>__seed<seed>.json`` the moment it finishes. A re-run skips the cells already
stored (resumable: stop it at any time, start it again), and ``--table-only`` rebuilds the table and the plots
from the stored results without training anything.

Outputs in ``<output-dir>``:

- ``report.md``: per preset the solved count n/N, the median and worst env steps and wall seconds to the
  threshold (worst is "> budget" when a seed did not get there), the median and minimum final return;
- ``<env_id>.png`` (one per task, ``/`` in the id written ``_``): eval return against env steps, per preset
  the median over seeds as a line and the min-max band over seeds; a seed that stopped early (solved) holds
  its last return from then on.

    python scripts/learning_report.py --presets cartpole_muzero cartpole_efficientzero --seeds 0 1 2 3 4
    python scripts/learning_report.py --presets acrobot_muzero --seeds 0 1 2 --output-dir runs/report_acrobot
    python scripts/learning_report.py --output-dir runs/report_acrobot --table-only
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from learning_curve import run_seed, seed_config, seed_row  # noqa: E402  (shared with learning_curve.py)

from muzero_tune.api import train  # noqa: E402
from muzero_tune.config import current_key, make_config, parse_set_args, to_flat_dict  # noqa: E402
from muzero_tune.runs.reporter import MemoryReporter  # noqa: E402

RESULTS_DIR = "results"


class EvalPrinter(MemoryReporter):
    """A MemoryReporter that prints one line per evaluation (a long cell shows how far it got)."""

    def __init__(self, label: str):
        super().__init__()
        self.label = label

    def on_eval(self, metrics, evaluated, resume_state) -> None:
        super().on_eval(metrics, evaluated, resume_state)
        collected = metrics.get("collect/episode_return_mean")
        print(f"[learning_report] {self.label}: eval reward_mean {metrics['reward_mean']:.1f} at "
              f"{metrics['envstep']:,} env steps / {metrics['wall_s']:.0f} s; training episodes' mean return "
              f"{collected if collected is None else round(collected, 1)} (load {os.getloadavg()[0]:.2f})",
              flush=True)


class CellDone(Exception):
    """Raised from an evaluation once every rule a cell compares has reached its target: the run ends."""


class AlsoEvalPrinter(EvalPrinter):
    """Evaluates every evaluated snapshot a second time under other ``eval.*`` / ``mcts.*`` settings.

    The second evaluator is built once, like the run's own (same seed, same episodes), so both rules play the
    same sequence of starting states; the global RNGs are restored around it and its seconds are taken off
    the run's clock, so training, its curve and its wall seconds are those of a run without it. The run
    trains on past its own target until the second rule reaches it too (``CellDone``) or the budget ends;
    with ``stop_at_own`` it ends at its own target, the second rule's result then being "reached by then"
    or not.
    """

    def __init__(self, label: str, run_cfg, also: dict, target: float, *, stop_at_own: bool = False):
        super().__init__(label)
        self.run_cfg, self.also, self.target, self.stop_at_own = run_cfg, also, target, stop_at_own
        self.also_evals: list[dict] = []
        self.also_s = 0.0
        self._alt = None  # (policy, model, evaluator), built at the first evaluation

    def on_eval(self, metrics, evaluated, resume_state) -> None:
        metrics = {**metrics, "wall_s": metrics["wall_s"] - self.also_s}
        super().on_eval(metrics, evaluated, resume_state)
        t0 = time.monotonic()
        reward = self._evaluate(evaluated)
        self.also_s += time.monotonic() - t0
        self.also_evals.append({**metrics, "reward_mean": reward})
        print(f"[learning_report] {self.label}: under {_label(self.also)}: eval reward_mean {reward:.1f}",
              flush=True)
        reached = [any(e["reward_mean"] >= self.target for e in r) for r in (self.evals, self.also_evals)]
        if reached[0] and (reached[1] or self.stop_at_own):
            raise CellDone

    def _evaluate(self, evaluated: dict) -> float:
        import random

        import numpy as np
        import torch

        from muzero_tune.pipeline.core import EVAL_SEED_OFFSET
        from muzero_tune.pipeline.evaluator import Evaluator
        from muzero_tune.runs.checkpoint import policy_from_checkpoint

        states = random.getstate(), np.random.get_state(), torch.get_rng_state()
        try:
            if self._alt is None:
                ckpt = {"config": to_flat_dict(self.run_cfg), "evaluated": evaluated}
                cfg, policy, model = policy_from_checkpoint(ckpt, overrides=self.also)
                evaluator = Evaluator(cfg, policy, policy.spec, seed=cfg.seed + EVAL_SEED_OFFSET)
                self._alt = policy, model, evaluator
            policy, model, evaluator = self._alt
            model.load_state_dict(evaluated["weights"])
            policy.on_weights_loaded(model)
            return evaluator.evaluate(model, policy_version=evaluated["version"]).reward_mean
        finally:
            random.setstate(states[0])
            np.random.set_state(states[1])
            torch.set_rng_state(states[2])

    def close(self) -> None:
        if self._alt is not None:
            self._alt[2].close()


def _label(also: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(also.items()))


# ---------------------------------------------------------------------------------------------- cells


def cell_path(output_dir: str, preset: str, seed: int) -> str:
    return os.path.join(output_dir, RESULTS_DIR, f"{preset}__seed{seed}.json")


def _write_json_atomic(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def run_cell(
    preset: str, seed: int, overrides: dict, output_dir: str, also: dict | None = None,
    stop_at_own: bool = False,
) -> dict:  # fmt: skip
    """Train one (preset, seed) cell; its stored record is run_seed's row plus the task and budgets.

    ``also``: eval.* / mcts.* settings every evaluated snapshot is evaluated under as well; the record's
    ``also_eval`` then holds that rule's row (its env steps to the target on the same training run), and
    ``stop_at_own`` ends the cell at the run's own target whether the other rule got there or not."""
    cfg = make_config(preset, overrides={"seed": seed, **overrides})
    load_before = os.getloadavg()
    t0 = time.monotonic()
    label = f"{preset} seed {seed}"
    if also:
        target = cfg.stop_value if cfg.stop_value is not None else 195.0
        runs = os.path.join(output_dir, "runs")
        run_cfg = seed_config(seed, {**overrides, "stop_value": None}, runs, preset)
        rep = AlsoEvalPrinter(label, run_cfg, also, target, stop_at_own=stop_at_own)
        try:
            stop_reason = train(run_cfg, reporter=rep).stop_reason
        except CellDone:
            stop_reason = "stop_value"
        row = seed_row(seed, rep.evals, target, stop_reason)
        also_row = seed_row(seed, rep.also_evals, target, stop_reason)
        ran = to_flat_dict(run_cfg)
        row["also_eval"] = {"settings": {k: str(v) for k, v in also.items()}, "stop_at_own": stop_at_own,
                            "own_settings": {k: str(ran[k]) for k in also},  # the run's, as it had them
                            **{k: v for k, v in also_row.items() if k not in ("seed", "stop_reason")}}
    else:
        row = run_seed(seed, overrides, os.path.join(output_dir, "runs"), preset, reporter=EvalPrinter(label))
    curve = row["curve"]
    return {
        **row,
        "preset": preset,
        "env_id": cfg.env.env_id,
        "policy_type": cfg.policy.type,
        "overrides": {k: str(v) for k, v in overrides.items()},
        "max_envstep": cfg.max_envstep,
        "max_wall_s": cfg.max_wall_s,
        "final_return": curve[-1][2] if curve else None,
        "final_env_steps": curve[-1][0] if curve else None,
        "run_wall_s": round(time.monotonic() - t0, 1),
        "loadavg_1min_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


IGNORED_KEYS = ("exp_name", "seed", "logging.")  # may differ between a cell and an imported run


def import_run(run_dir: str, preset: str, overrides: dict) -> dict:
    """A stored cell from a finished standalone run folder (``muzero-tune train``: config.json +
    metrics.jsonl) whose config is exactly ``preset`` + ``overrides`` (names, seed and logging aside).

    Raises SystemExit naming the first key that differs, so a run of another config is never filed under
    the preset."""
    with open(os.path.join(run_dir, "config.json")) as f:
        ran = {current_key(k, warn=False): v for k, v in json.load(f).items()}
    seed = int(ran["seed"])
    want = to_flat_dict(make_config(preset, overrides={"seed": seed, **overrides}))
    for key, value in want.items():
        if key.startswith(IGNORED_KEYS):
            continue
        if ran.get(key) != value:
            raise SystemExit(f"--import-run {run_dir}: config key '{key}' = {ran.get(key)!r} there, "
                             f"{value!r} in preset {preset} with the --set overrides")
    evals = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            if row.get("reward_mean") is not None and row.get("eval_episodes"):
                evals.append(row)
    target = want["stop_value"] if want["stop_value"] is not None else 195.0
    row = seed_row(seed, evals, target, "imported")
    curve = row["curve"]
    return {
        **row, "preset": preset, "env_id": want["env.env_id"],
        "policy_type": want["policy.type"], "overrides": {k: str(v) for k, v in overrides.items()},
        "max_envstep": want["max_envstep"], "max_wall_s": want["max_wall_s"],
        "final_return": curve[-1][2] if curve else None, "final_env_steps": curve[-1][0] if curve else None,
        "imported_from": os.path.abspath(run_dir),
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def load_results(output_dir: str) -> list[dict]:
    """Every stored cell in ``<output_dir>/results``, ordered by preset then seed."""
    rows = []
    for path in glob.glob(os.path.join(output_dir, RESULTS_DIR, "*__seed*.json")):
        with open(path) as f:
            row = json.load(f)
        if "max_env_step" in row:  # a cell stored before the budget's key was renamed
            row["max_envstep"] = row.pop("max_env_step")
        rows.append(row)
    return sorted(rows, key=lambda r: (r["preset"], r["seed"]))


# ---------------------------------------------------------------------------------------------- table


def within_budget(r: dict) -> bool:
    """Reached the threshold within the cell's env-step and wall budgets."""
    if not r["solved"]:
        return False
    if r["env_steps_to_target"] > r["max_envstep"]:
        return False
    return r.get("max_wall_s") is None or r["wall_s_to_target"] <= r["max_wall_s"]


def summarize(rows: list[dict]) -> list[dict]:
    """One summary per preset (first-seen order): solved count, median / worst figures over its seeds."""
    by_preset: dict[str, list[dict]] = {}
    for r in rows:
        by_preset.setdefault(r["preset"], []).append(r)
    out = []
    for preset, rs in by_preset.items():
        ok = [r for r in rs if within_budget(r)]
        steps = [r["env_steps_to_target"] for r in ok]
        walls = [r["wall_s_to_target"] for r in ok]
        finals = [r["final_return"] for r in rs if r["final_return"] is not None]
        all_ok = len(ok) == len(rs)
        out.append({
            "preset": preset,
            "env_id": rs[0]["env_id"],
            "target": rs[0]["target"],
            "seeds": [r["seed"] for r in rs],
            "n_solved": len(ok),
            "n": len(rs),
            "median_env_steps": statistics.median(steps) if all_ok else None,
            "worst_env_steps": max(steps) if all_ok else None,
            "median_wall_s": statistics.median(walls) if all_ok else None,
            "worst_wall_s": max(walls) if all_ok else None,
            # with unsolved seeds the median is taken with them counted as above every solved one
            "median_env_steps_lower_bound": _median_with_unsolved(steps, len(rs)),
            "median_wall_s_lower_bound": _median_with_unsolved(walls, len(rs)),
            "max_envstep": max(r["max_envstep"] for r in rs),
            "max_wall_s": rs[0].get("max_wall_s"),
            "median_final_return": statistics.median(finals) if finals else None,
            "min_final_return": min(finals) if finals else None,
        })
    return out


def _median_with_unsolved(steps: list[int], n: int) -> float | None:
    """The median over n seeds when the len(steps) solved ones are the smallest (None if it is unsolved)."""
    if not n:
        return None
    ordered = sorted(steps) + [float("inf")] * (n - len(steps))
    med = statistics.median(ordered)
    return None if med == float("inf") else med


def _fmt(x, nd: int = 0) -> str:
    if x is None:
        return "—"
    return f"{x:,.{nd}f}"


def markdown_table(summaries: list[dict]) -> str:
    lines = [
        "| preset | task | target | solved | median env steps | worst env steps | median wall s "
        "| worst wall s | final return (median / min) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        if s["n_solved"] == s["n"]:
            med_steps, worst_steps = _fmt(s["median_env_steps"]), _fmt(s["worst_env_steps"])
            med_wall, worst_wall = _fmt(s["median_wall_s"], 1), _fmt(s["worst_wall_s"], 1)
        else:
            lb = s["median_env_steps_lower_bound"]
            med_steps = _fmt(lb) if lb is not None else f"> {s['max_envstep']:,}"
            worst_steps = f"> {s['max_envstep']:,}"
            lb_wall = s.get("median_wall_s_lower_bound")
            med_wall, worst_wall = (_fmt(lb_wall, 1) if lb_wall is not None else "—"), "—"
        lines.append(
            f"| {s['preset']} | {s['env_id']} | {s['target']:g} | {s['n_solved']}/{s['n']} | {med_steps} "
            f"| {worst_steps} | {med_wall} | {worst_wall} | {_fmt(s['median_final_return'], 1)} / "
            f"{_fmt(s['min_final_return'], 1)} |"
        )
    return "\n".join(lines) + "\n"


def also_eval_table(rows: list[dict]) -> str:
    """Where cells were also evaluated under other settings: per preset, env steps to the target under the
    run's own evaluation settings and under the other ones, on the same training runs ("" if none were).

    The run's own settings are those its record stored; a record from before they were stored has them
    rebuilt from the preset as it is now and the record's overrides (wrong where the preset changed since)."""
    rows = [r for r in rows if r.get("also_eval")]
    if not rows:
        return ""
    lines = [
        "Each evaluated snapshot evaluated under both settings (the same training runs); env steps to the "
        "target, median / worst (solved):\n",
        "| preset | run's settings | env steps | other settings | env steps |",
        "|---|---|---|---|---|",
    ]
    by_preset: dict[str, list[dict]] = {}
    for r in rows:
        by_preset.setdefault(r["preset"], []).append(r)
    for preset, rs in by_preset.items():
        other = rs[0]["also_eval"]["settings"]
        own = rs[0]["also_eval"].get("own_settings")
        if own is None:
            ran = to_flat_dict(make_config(preset, overrides=rs[0]["overrides"], check_env=False))
            own = {k: ran[k] for k in other}
        lines.append(f"| {preset} | {_label(own)} | {_steps_summary(rs)} | {_label(other)} | "
                     f"{_steps_summary([{**r, **r['also_eval']} for r in rs])} |")
    return "\n".join(lines) + "\n"


def _steps_summary(rs: list[dict]) -> str:
    """"median / worst (n/N)" env steps to the target; an unsolved seed counts as above the budget, or, in
    a cell that ended at the run's own target, as not there by then ("—": the figure is not known)."""
    ok = [r["env_steps_to_target"] for r in rs if within_budget(r)]
    by_then = any(r.get("stop_at_own") for r in rs)
    budget = max(r["max_envstep"] for r in rs)
    med = _median_with_unsolved(ok, len(rs))
    unknown = "—" if by_then else f"> {budget:,}"
    worst = _fmt(max(ok)) if len(ok) == len(rs) else unknown
    solved = f"{len(ok)}/{len(rs)}" + (" by the run's own target" if by_then and len(ok) < len(rs) else "")
    return f"{_fmt(med) if med is not None else unknown} / {worst} ({solved})"


def seed_lines(rows: list[dict]) -> str:
    """One line per cell: what each seed reached (the table's inputs, for the README and for failures)."""
    out = []
    for r in rows:
        got = (
            f"{r['env_steps_to_target']:,} env steps / {r['wall_s_to_target']:.1f} s"
            if r["solved"] else f"not solved (best {_fmt(r['best_reward_mean'], 1)})"
        )
        if r["solved"] and not within_budget(r):
            got = f"not solved within the budget (reached only at {got})"
        load = r.get("loadavg_1min_before_after")
        also = r.get("also_eval")
        if also:
            by = f" by {_fmt(r['final_env_steps'])} env steps" if also.get("stop_at_own") else ""
            also_got = (f"{also['env_steps_to_target']:,} env steps" if also["solved"]
                        else f"not solved{by} (best {_fmt(also['best_reward_mean'], 1)})")
            got += f"; under {_label(also['settings'])}: {also_got}"
        out.append(
            f"- {r['preset']} seed {r['seed']}: {got}; final return {_fmt(r['final_return'], 1)} at "
            f"{_fmt(r['final_env_steps'])} env steps"
            + (f" (load {load[0]} -> {load[1]})" if load else "")
        )
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------- plots


def band(curves: list[list[tuple[float, float, float]]]):
    """(grid [T], median [T], low [T], high [T]) of return over env steps across seeds.

    ``curves``: per seed a list of (env_steps, wall_s, return) evaluations. Each seed is read on the union
    of all evaluation points as a step function (its latest evaluation so far; before its first one, that
    first one); a seed that stopped early holds its last return.
    """
    import numpy as np

    grid = np.array(sorted({c[0] for curve in curves for c in curve}), dtype=float)
    cols = []
    for curve in curves:
        xs = np.array([c[0] for c in curve], dtype=float)
        ys = np.array([c[2] for c in curve], dtype=float)
        idx = np.clip(np.searchsorted(xs, grid, side="right") - 1, 0, len(xs) - 1)
        cols.append(ys[idx])
    values = np.stack(cols)  # [seeds, T]
    return grid, np.median(values, axis=0), values.min(axis=0), values.max(axis=0)


def write_plots(rows: list[dict], output_dir: str) -> list[str]:
    """One PNG per task (env id): per preset its median line and min-max band over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_env: dict[str, dict[str, list[dict]]] = {}
    for r in rows:
        if r["curve"]:
            by_env.setdefault(r["env_id"], {}).setdefault(r["preset"], []).append(r)
    paths = []
    for env_id, presets in by_env.items():
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for preset, rs in presets.items():
            grid, med, lo, hi = band([r["curve"] for r in rs])
            (line,) = ax.plot(grid, med, drawstyle="steps-post", label=f"{preset} (median of {len(rs)})")
            ax.fill_between(grid, lo, hi, step="post", color=line.get_color(), alpha=0.2, linewidth=0)
        target = next(iter(presets.values()))[0]["target"]
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
        ax.set_xlabel("env steps")
        ax.set_ylabel("eval return (mean of the evaluation's episodes)")
        ax.set_title(f"{env_id}: median and min-max over seeds")
        ax.legend(fontsize=7, loc="best")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = os.path.join(output_dir, env_id.replace("/", "_") + ".png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def build_report(output_dir: str) -> tuple[str, list[str]]:
    """Rebuild ``report.md`` and the PNGs from the stored results; returns (markdown, png paths)."""
    rows = load_results(output_dir)
    if not rows:
        raise SystemExit(f"no stored results in {os.path.join(output_dir, RESULTS_DIR)}")
    md = (
        f"# Learning report ({time.strftime('%Y-%m-%d', time.gmtime())})\n\n"
        + markdown_table(summarize(rows)) + "\n" + seed_lines(rows)
    )
    also = also_eval_table(rows)
    if also:
        md += "\n" + also
    with open(os.path.join(output_dir, "report.md"), "w") as f:
        f.write(md)
    return md, write_plots(rows, output_dir)


# ---------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", nargs="+", default=["cartpole_muzero"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                   help="applied to every cell (stored with it)")
    p.add_argument("--output-dir", default="runs/learning_report")
    p.add_argument("--max-envstep", "--max-env-steps", dest="max_envstep", type=int, default=None,
                   help="env-step budget per cell (default: each preset's max_envstep)")
    p.add_argument("--max-wall-s", type=float, default=None, help="wall budget per cell (default: none)")
    p.add_argument("--also-eval", action="append", default=[], metavar="KEY=VALUE",
                   help="eval.* / mcts.* settings to evaluate every snapshot under as well (the same "
                        "training runs; each cell then trains until both settings reach its target)")
    p.add_argument("--stop-at-own-target", action="store_true",
                   help="with --also-eval: end each cell when the run's own settings reach the target (the "
                        "other settings' result is then whether they got there by then)")
    p.add_argument("--table-only", action="store_true", help="only rebuild report.md and the PNGs")
    p.add_argument("--rerun", action="store_true", help="train cells again even if a result is stored")
    p.add_argument("--import-run", metavar="RUN_DIR", default=None,
                   help="store a finished `muzero-tune train` run folder as the cell of --presets (one) and "
                        "its seed; its config must be the preset's with the --set overrides")
    args = p.parse_args(argv)

    overrides = parse_set_args(args.overrides)
    also = parse_set_args(args.also_eval)
    for key in also:
        if key.split(".")[0] not in ("eval", "mcts"):
            raise SystemExit(f"--also-eval {key}: only eval.* and mcts.* settings can be evaluated beside")
    if args.max_envstep is not None:
        overrides["max_envstep"] = args.max_envstep
    if args.max_wall_s is not None:
        overrides["max_wall_s"] = args.max_wall_s
    if args.import_run:
        if len(args.presets) != 1:
            raise SystemExit("--import-run needs exactly one --presets name")
        rec = import_run(args.import_run, args.presets[0], overrides)
        _write_json_atomic(cell_path(args.output_dir, rec["preset"], rec["seed"]), rec)
        print(f"[learning_report] imported {args.import_run}: {seed_lines([rec]).strip()}", flush=True)
    elif not args.table_only:
        for preset in args.presets:  # every config is checked before the first cell trains
            make_config(preset, overrides={"seed": args.seeds[0], **overrides, **also})
        for preset in args.presets:
            for seed in args.seeds:
                path = cell_path(args.output_dir, preset, seed)
                if os.path.exists(path) and not args.rerun:
                    print(f"[learning_report] {preset} seed {seed}: stored, skipped ({path})", flush=True)
                    continue
                print(f"[learning_report] {preset} seed {seed}: training (load {os.getloadavg()[0]:.2f})",
                      flush=True)
                rec = run_cell(preset, seed, overrides, args.output_dir, also, args.stop_at_own_target)
                _write_json_atomic(path, rec)
                print(f"[learning_report] {seed_lines([rec]).strip()}", flush=True)
    md, pngs = build_report(args.output_dir)
    print(md)
    for path in pngs:
        print("plot:", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
