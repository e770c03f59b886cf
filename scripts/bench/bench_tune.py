"""The Tune trainable's costs, measured side by side in one run.

1. overhead: env steps/s of the bare driver against the same config run as a 1-trial Tune trainable
   (same wall budget, sync and async);
2. checkpoints: size and write time with and without the replay buffer, at a given buffer fill.

    python scripts/bench/bench_tune.py --wall-s 60 --buffer-transitions 20000
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from muzero_tune.config import make_config, parse_set_args
from muzero_tune.runs.checkpoint import FORMAT, load_checkpoint, save_checkpoint
from muzero_tune.runs.reporter import MemoryReporter


def bare(cfg):
    from muzero_tune.api import train

    s = train(cfg, reporter=MemoryReporter())
    return s.env_steps / s.wall_s


def in_tune(cfg, storage: str):
    from ray import tune

    from muzero_tune.tune.trainable import make_trainable

    t0 = time.monotonic()
    tuner = tune.Tuner(
        make_trainable(cfg, sweep_name="bench", mlflow_uri=None),
        param_space={},
        run_config=tune.RunConfig(storage_path=storage, name=f"bench_{time.time_ns()}", verbose=0),
    )
    res = tuner.fit()
    m = res[0].metrics
    return m["envstep"] / m["wall_s"], time.monotonic() - t0


def checkpoint_costs(preset: str, overrides: dict, transitions: int) -> list[tuple[str, int, float, float]]:
    from muzero_tune.pipeline.core import DriverCore
    from muzero_tune.replay.random_rollout import random_segments

    cfg = make_config(preset, overrides={**overrides, "logging.quiet": True})
    core = DriverCore(cfg, MemoryReporter())
    rc = cfg.replay
    segs = random_segments(
        cfg.env.env_id,
        steps=transitions,
        frame_stack=cfg.env.frame_stack,
        segment_length=rc.game_segment_length,
        pad_length=rc.num_unroll_steps + rc.td_steps,
    )
    core.buffer.push(segs)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for with_buffer in (False, True):
            payload = {
                "format": FORMAT,
                "config": core.flat_config,
                "evaluated": {"weights": core.learner.weights_snapshot(), "version": 0, "metrics": {}},
                "resume": core.resume_state(include_buffer=with_buffer),
            }
            path = os.path.join(d, f"c{int(with_buffer)}.pt")
            t0 = time.perf_counter()
            size = save_checkpoint(path, payload)
            write_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            load_checkpoint(path)
            load_s = time.perf_counter() - t0
            rows.append(("with buffer" if with_buffer else "without buffer", size, write_s, load_s))
    return rows, core.buffer.num_transitions


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="cartpole_muzero")
    p.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    p.add_argument("--wall-s", type=float, default=60.0)
    p.add_argument("--buffer-transitions", type=int, default=20000)
    p.add_argument("--skip-overhead", action="store_true")
    args = p.parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    overrides = parse_set_args(args.overrides)

    rows, n = checkpoint_costs(args.preset, overrides, args.buffer_transitions)
    print(f"checkpoint ({args.preset}, buffer of {n} transitions):")
    for name, size, write_s, load_s in rows:
        print(
            f"  {name:>15}: {size / 2**20:8.2f} MiB, "
            f"write {write_s * 1e3:7.1f} ms, load {load_s * 1e3:7.1f} ms"
        )
    if args.skip_overhead:
        return
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    storage = tempfile.mkdtemp(prefix="bench_tune_")
    print(f"\noverhead ({args.preset}, {args.wall_s:g} s per run):")
    for pipeline in ("sync", "async"):
        cfg = make_config(
            args.preset,
            overrides={
                **overrides,
                "max_wall_s": args.wall_s,
                "max_envstep": 10**9,
                "stop_value": None,
                "logging.quiet": True,
                "logging.output_dir": storage,
                "eval.eval_freq": 200,
                "policy.async_pipeline.enabled": pipeline == "async",
            },
        )
        b = bare(cfg)
        t, total = in_tune(cfg, storage)
        print(
            f"  {pipeline:>5}: bare {b:7.1f} envstep/s, in Tune {t:7.1f} envstep/s -> ratio {t / b:.2f} "
            f"(Tune fit wall {total:.1f} s for a {args.wall_s:g} s run)"
        )
    ray.shutdown()


if __name__ == "__main__":
    main()
