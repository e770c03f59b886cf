"""Train steps/s with the learner in the driver's process and with 1 and 2 learner workers
(``learn.num_learners``), side by side in one run, on the same replay buffer; and the driver's share of a
step's time with remote learners.

    python scripts/bench/bench_learner_group.py                        # Pong conv net, batch 256
    python scripts/bench/bench_learner_group.py --preset cartpole_muzero --steps 20 --rounds 5
    python scripts/bench/bench_learner_group.py --set learn.device=cuda --learners 0 1 2   # GPUs

Every variant's steps are full train steps (sample, targets, the learners' forward and backward, priority
write-back). With workers, the driver computes the batch's bootstrap values on its copy of the target
network, ships the shards, and writes priorities back (building the next batch) while the learners run
their backward; ``driver share`` is that work over the step's time, the rest is waiting for the learners.
On a machine with fewer cores than learners + 1 the workers and the driver share cores, and the figures
say what that costs, not what the group gains where each learner has its own.
"""

from __future__ import annotations

import argparse
import os
import statistics

from bench_common import add_preset_args, interleaved_train_steps, preset_overrides

from muzero_tune.config import make_config
from muzero_tune.distributed.learner_group import LearnerGroup
from muzero_tune.distributed.placement import bundles, standalone_placement, total_resources
from muzero_tune.pipeline.collector import fill_replay
from muzero_tune.pipeline.core import DriverCore, setup_torch_threads
from muzero_tune.runs.reporter import MemoryReporter


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_preset_args(p, default="pong_muzero")
    p.add_argument("--learners", type=int, nargs="+", default=[0, 1, 2], help="learner counts to compare")
    p.add_argument("--steps", type=int, default=1, help="timed steps per variant per round")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (side by side)")
    args = p.parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    setup_torch_threads()
    overrides = preset_overrides(args)
    cfgs = {n: make_config(args.preset, overrides={**overrides, "learn.num_learners": n})
            for n in args.learners}  # fmt: skip
    cpus = sum(total_resources(bundles(c)).get("CPU", 1.0) for c in cfgs.values())  # every group at once
    ray.init(address="local", num_cpus=max(int(cpus + 0.999), os.cpu_count() or 1), include_dashboard=False,
             log_to_driver=False)  # fmt: skip
    cores, placements = {}, []
    for n, cfg in cfgs.items():
        if n == 0:
            cores[n] = DriverCore(cfg, MemoryReporter())
            continue
        pl = standalone_placement(cfg, learner_on_gpu=cfg.learn.device.startswith("cuda"), timeout_s=120)
        placements.append(pl)

        def make(c, policy, pl=pl):
            return LearnerGroup(c, policy, placement=pl)

        cores[n] = DriverCore(cfg, MemoryReporter(), make_learner=make)
    first = next(iter(cores.values()))
    fill_replay(first, max(2 * first.cfg.learn.batch_size, 1000))
    for core in cores.values():  # one buffer: every variant samples the same data
        core.buffer = first.buffer
    try:
        per_round = interleaved_train_steps(cores, rounds=args.rounds, steps=args.steps, warmup=1)
        base = statistics.median(per_round[args.learners[0]])
        cfg0 = next(iter(cfgs.values()))
        print(f"{args.preset}: batch {cfg0.learn.batch_size}, device {cfg0.learn.device}, "
              f"{args.rounds} rounds x {args.steps} steps; cores here: {os.cpu_count()}")  # fmt: skip
        for n, secs in per_round.items():
            med = statistics.median(secs)
            line = (f"  learners={n}: {1 / med:7.3f} steps/s (median {med * 1000:8.1f} ms, worst "
                    f"{max(secs) * 1000:8.1f} ms); x{base / med:.2f} of learners={args.learners[0]}")
            learner = cores[n].learner
            if isinstance(learner, LearnerGroup):
                t = {k: v / learner.step_timing_s["step"] for k, v in learner.step_timing_s.items()}
                line += (f"; driver share {t['driver']:.2f}, waiting for the forward "
                         f"{t['forward_wait']:.2f}, the backward {t['backward_wait']:.2f}")
            print(line)
    finally:
        for core in cores.values():
            core.close()
        for pl in placements:
            pl.remove()
        ray.shutdown()


if __name__ == "__main__":
    main()
