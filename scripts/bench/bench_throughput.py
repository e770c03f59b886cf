"""Sync vs async throughput, back to back in one run: same config, same replay ratio, same wall budget.

Prints each pipeline's env steps/s and train steps/s, the async/sync ratio, and the ideal overlap bound
from the sync run's measured collect and train times, (collect + train) / max(collect, train) per env
step: what perfect overlap of collection with learning could give.

    python scripts/bench/bench_throughput.py  # CartPole, 1 and 2 collectors, 60 s each,
                                                                # 3 interleaved rounds: median ratio, spread
    python scripts/bench/bench_throughput.py --wall-s 120 --collectors 1 2 --set mcts.num_simulations=50
    # Pong
    python scripts/bench/bench_throughput.py --preset pong_muzero --set learn.batch_size=32 ...
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import proc_cpu  # scripts/bench/, beside this script

from muzero_tune.config import make_config, parse_set_args
from muzero_tune.runs.reporter import MemoryReporter


class MarkingReporter(MemoryReporter):
    """A :class:`MemoryReporter` that starts the CPU sampler's steady-state window at the first progress row
    with training under way (actor start-up, imports and the first collect left out) and keeps the env
    steps and train steps at that point."""

    def __init__(self, sampler: proc_cpu.CpuSampler | None):
        super().__init__()
        self.sampler = sampler
        self.at_mark: tuple[int, int, float] | None = None  # (env steps, train_iter, run wall s) at the start

    def on_progress(self, metrics: dict) -> None:
        super().on_progress(metrics)
        if self.at_mark is None and metrics.get("train_iter", 0) > 0:
            if self.sampler is not None:
                self.sampler.mark()
            self.at_mark = (int(metrics["envstep"]), int(metrics["train_iter"]), float(metrics["wall_s"]))


def run(
    preset: str,
    overrides: dict,
    *,
    async_collectors: int | None,
    wall_s: float,
    out_dir: str,
    cpu_interval_s: float = 0.0,
) -> dict:
    from muzero_tune.distributed.async_driver import train_muzero_segment_async
    from muzero_tune.pipeline.sync_driver import train_muzero_segment

    common = {
        "stop_value": None,
        "max_envstep": 10**9,
        "max_wall_s": wall_s,
        "eval.eval_freq": 10**9,
        "logging.quiet": True,
        "logging.output_dir": out_dir,
        "exp_name": f"bench_{'sync' if async_collectors is None else f'async{async_collectors}'}",
    }
    if async_collectors is not None:
        common.update(
            {
                "policy.async_pipeline.enabled": True,
                "policy.async_pipeline.num_collector_actors": async_collectors,
            }
        )
    cfg = make_config(preset, overrides={**overrides, **common})
    out: list = []
    sampler = proc_cpu.CpuSampler(interval_s=cpu_interval_s).start() if cpu_interval_s > 0 else None
    reporter = MarkingReporter(sampler)
    try:
        if async_collectors is None:
            s = train_muzero_segment(cfg, reporter=reporter)
        else:
            s = train_muzero_segment_async(cfg, reporter=reporter, driver_out=out)
    finally:
        cpu = sampler.stop() if sampler is not None else None
    row = {
        "pipeline": "sync" if async_collectors is None else f"async x{async_collectors}",
        "env_steps": s.env_steps,
        "train_iter": s.train_iter,
        "wall_s": s.wall_s,
        "envstep_per_s": s.env_steps / s.wall_s,
        "train_per_s": s.train_iter / s.wall_s,
        "train_per_envstep": s.train_iter / max(1, s.env_steps),
        "timings": s.timings,
        "cpu": cpu,
        "at_mark": reporter.at_mark,
    }
    if reporter.at_mark is not None and s.wall_s > reporter.at_mark[2]:
        # the steady window: from the first progress row with training to the end (start-up left out)
        window_s = s.wall_s - reporter.at_mark[2]
        row["steady_train_per_s"] = (s.train_iter - reporter.at_mark[1]) / window_s
        row["steady_envstep_per_s"] = (s.env_steps - reporter.at_mark[0]) / window_s
        row["startup_s"] = reporter.at_mark[2]
    if out:
        m = out[0].pipeline_metrics()
        row.update(
            {
                "learner_idle": m["pipeline/learner_idle_frac"],
                "collector_idle": m["pipeline/collector_idle_frac"],
                "lag_mean": m["policy_lag_mean"],
            }
        )
    return row


def print_cpu(rows: list[dict]) -> None:
    """Per-process CPU of each run of a round, over its steady window (first training step to the end; the
    whole run where no window started): CPU seconds, cores used, CPU ms per env step and the share of the
    run's own CPU, per role."""
    roles = [*proc_cpu.ROLES[:-1], "sampler"]
    print(f"{'pipeline':>10} {'window':>7} {'env_steps':>9} " + " ".join(f"{r:>17}" for r in roles)
          + f" {'ours cores':>10} {'other cores':>11}")  # fmt: skip
    print(f"{'':>10} {'':>7} {'':>9} " + " ".join(f"{'ms/step  share':>17}" for _ in roles))
    for r in rows:
        cpu = r["cpu"]
        if cpu is None:
            continue
        window, steps = "run", r["env_steps"]
        if cpu.since_mark is not None and r["at_mark"] is not None:
            cpu, window, steps = cpu.since_mark, "steady", r["env_steps"] - r["at_mark"][0]
        ours = max(cpu.ours_s(), 1e-9)
        cells = " ".join(
            f"{1e3 * cpu.cpu_s.get(k, 0.0) / max(steps, 1):>9.2f} {cpu.cpu_s.get(k, 0.0) / ours:>6.1%}"
            for k in roles
        )
        print(
            f"{r['pipeline']:>10} {window:>7} {steps:>9d} {cells} {cpu.ours_s() / cpu.wall_s:>10.2f} "
            f"{cpu.cpu_s['other'] / cpu.wall_s:>11.2f}"
        )
        top = sorted(cpu.by_process.items(), key=lambda kv: -kv[1])[:8]
        print(" " * 12 + "; ".join(f"{k} {v / cpu.wall_s:.3f} cores" for k, v in top))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="cartpole_muzero")
    p.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    p.add_argument("--wall-s", type=float, default=60.0, help="wall budget per pipeline run")
    p.add_argument("--collectors", type=int, nargs="+", default=[1, 2])
    p.add_argument("--out-dir", default="/tmp/muzero_tune_bench")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (sync, async..., sync, ...)")
    p.add_argument(
        "--cpu-interval-s",
        type=float,
        default=1.0,
        help="sample every process's CPU seconds at this interval and print the share per role (0: off)",
    )
    args = p.parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    overrides = parse_set_args(args.overrides)

    import ray

    ray.init(num_cpus=max(4, 2 + max(args.collectors)), include_dashboard=False, log_to_driver=False)
    rounds: list[list[dict]] = []
    try:
        # interleaved rounds (sync, async x n..., sync, async x n...): the shared machine's drift hits both
        # pipelines alike, and each round's ratio is taken against that round's sync run
        for _ in range(args.rounds):
            rounds.append(
                [
                    run(
                        args.preset,
                        overrides,
                        async_collectors=n,
                        wall_s=args.wall_s,
                        out_dir=args.out_dir,
                        cpu_interval_s=args.cpu_interval_s if proc_cpu.available() else 0.0,
                    )
                    for n in (None, *args.collectors)
                ]
            )
    finally:
        ray.shutdown()

    print(
        f"\npreset={args.preset} overrides={overrides} "
        f"wall budget {args.wall_s:g} s per run, {args.rounds} interleaved round(s), {os.cpu_count()} cores"
    )
    print(
        "matched = envstep/s x min(1, train/envstep / sync's): async runs end a wall budget with collected "
        "but not yet trained budgets, so raw envstep/s flatters them; matched counts what the replay ratio "
        "covers"
    )
    # pipeline -> per round (ratio, matched ratio, matched share of the bound)
    summary: dict[str, list[tuple[float, float, float]]] = {}
    summary_steady: dict[str, list[tuple[float, float]]] = {}  # pipeline -> per round (ratio, share of bound)
    for k, rows in enumerate(rounds):
        sync = rows[0]
        t = sync["timings"]
        c_per_step = t["collect_s"] / max(1, sync["env_steps"])
        l_per_step = t["train_s"] / max(1, sync["env_steps"])
        bound = (c_per_step + l_per_step) / max(c_per_step, l_per_step)
        print(
            f"\nround {k + 1}: sync per env step: collect {1e3 * c_per_step:.2f} ms, train "
            f"{1e3 * l_per_step:.2f} ms -> ideal overlap bound {bound:.2f}x"
        )
        print(
            f"{'pipeline':>10} {'env_steps':>9} {'envstep/s':>9} {'matched':>8} {'train/s':>8} "
            f"{'train/envstep':>13} "
            f"{'ratio':>6} {'of bound':>8} {'learner idle':>12} {'collector idle':>14} {'lag':>6}"
        )
        for r in rows:
            ratio = r["envstep_per_s"] / sync["envstep_per_s"]
            matched = r["envstep_per_s"] * min(
                1.0, r["train_per_envstep"] / max(sync["train_per_envstep"], 1e-9)
            )
            summary.setdefault(r["pipeline"], []).append(
                (ratio, matched / sync["envstep_per_s"], matched / sync["envstep_per_s"] / bound)
            )
            print(
                f"{r['pipeline']:>10} {r['env_steps']:>9d} {r['envstep_per_s']:>9.1f} {matched:>8.1f} "
                f"{r['train_per_s']:>8.1f} "
                f"{r['train_per_envstep']:>13.3f} {ratio:>6.2f} {ratio / bound:>8.0%} "
                f"{r.get('learner_idle', float('nan')):>12.2f} "
                f"{r.get('collector_idle', float('nan')):>14.2f} {r.get('lag_mean', float('nan')):>6.1f}"
            )
        if sync.get("steady_train_per_s", 0.0) > 0:  # no ratio against a sync run that never trained
            print(
                "steady window (first progress row with training -> end; actor start-up and the first "
                "collect left out): train/s, and its ratio to sync's = env steps/s at sync's replay ratio"
            )
            for r in rows:
                if "steady_train_per_s" not in r:
                    continue
                steady = r["steady_train_per_s"] / max(sync["steady_train_per_s"], 1e-9)
                summary_steady.setdefault(r["pipeline"], []).append((steady, steady / bound))
                print(
                    f"{r['pipeline']:>10}: start-up {r['startup_s']:6.1f} s, train/s "
                    f"{r['steady_train_per_s']:6.2f}, envstep/s {r['steady_envstep_per_s']:7.1f}, ratio "
                    f"{steady:5.2f} = {steady / bound:4.0%} of the bound"
                )
        if any(r["cpu"] is not None for r in rows):
            print("CPU per role (driver = learner + buffer + event loop; ray = Ray's own processes):")
            print_cpu(rows)
    print(f"\nover {args.rounds} round(s): median [min, max] of each round's ratio to that round's sync run")
    for name, vals in summary.items():
        if name == "sync":
            continue
        ratio, matched, share = (np.asarray(v) for v in zip(*vals))
        print(
            f"{name:>10}: envstep/s ratio {np.median(ratio):.2f} [{ratio.min():.2f}, {ratio.max():.2f}]; "
            f"matched {np.median(matched):.2f} [{matched.min():.2f}, {matched.max():.2f}]; "
            f"matched share of the ideal bound {np.median(share):.0%} [{share.min():.0%}, {share.max():.0%}]"
        )
        if summary_steady.get(name):
            steady, steady_share = (np.asarray(v) for v in zip(*summary_steady[name]))
            print(
                f"{'':>10}  steady window: train/s ratio {np.median(steady):.2f} [{steady.min():.2f}, "
                f"{steady.max():.2f}]; share of the bound {np.median(steady_share):.0%} "
                f"[{steady_share.min():.0%}, {steady_share.max():.0%}]"
            )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
