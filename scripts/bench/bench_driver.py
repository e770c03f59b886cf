"""The single driver's ceiling: how many env steps/s it can absorb, by phase, and where it becomes the limit.

The async driver alone pushes segments, samples, builds targets and writes priorities back, so it bounds
how many collectors help. This script measures, in one run:

1. **Phases, in process** (no Ray): real segments from a real collector (the preset's network, search and
   env), pushed into the preset's buffer; per collect, the train budget at ``--replay-ratio``; each phase
   timed in CPU time: the driver's push, sample, targets (``make_batch``'s gathers, n-step sums, masks),
   priority write-back, publish (snapshot + digest); the learner's bootstrap (the target network's forward
   over the positions that need a value, run at the start of its step: ``targets.Bootstrap``) and its
   forward/backward. Printed per env step. With the learner's work negligible (a GPU learner) the driver
   absorbs at most 1 / (its phases per env step); one learner consumes 1 / (the whole train step's time per
   env step). The goal: a ratio of at least 20. The ratio with the bootstrap counted in the driver
   (where it ran before) is printed too.
2. **Collectors on simulated nodes** (a ``ray.cluster_utils.Cluster``: a head and ``--nodes`` worker nodes
   with logical CPUs, all on this machine): the real async driver, its learner's forward/backward replaced
   by a no-op, fed by 1, 2, 4, 8 stub collectors that return the recorded collects at once, so the driver
   -- not the collectors -- sets the rate. Per collector count: the env steps/s the driver received and
   trained (wall clock), and its own CPU per env step (its CPU ceiling). The driver becomes the limit at the
   first count whose real collectors (one real collector's env steps per CPU second, from step 1, times the
   count: a core each) would produce more than that ceiling.

    python scripts/bench/bench_driver.py  # cartpole_muzero, replay ratio 0.25, 20 s per count
    python scripts/bench/bench_driver.py --collectors 1 2 4 8 16 --wall-s 30 --set mcts.num_simulations=50

Wall-clock rates on a shared 2-core machine depend on the kernel's scheduling (see ``clock`` below), and the
stub collectors share the cores with the driver; the CPU figures are what a driver with a core of its own
spends.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time

import numpy as np

from muzero_tune.config import make_config, parse_set_args, to_flat_dict
from muzero_tune.pipeline.messages import CollectResult

# Phases are timed in the driver thread's CPU time: on this shared machine a train step's wall time changed 2x
# with the kernel's scheduling (17 ms before ray.init, 8 ms after, in one process) while its CPU time stayed
# 6-7 ms. CPU time is what a driver with a core of its own spends; torch runs on that thread (1 thread).
clock = time.thread_time

PHASES = ("push", "sample", "targets", "writeback", "publish")  # the driver's own work
LEARNER_PHASES = ("bootstrap", "learner")  # network work on the learner's device
PHASE_DOC = {
    "targets": "make_batch: gathers, n-step sums, masks (driver thread)",
    "bootstrap": "the target network's bootstrap values, at the start of the learner's step",
    "learner": "the learner's forward/backward and optimizer step",
}


def load() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3]) if os.path.exists("/proc/loadavg") else "?"


def restamp(result: CollectResult, tag: str, version: int = 0) -> CollectResult:
    """The recorded collect as a new one: own stream ids (the buffer shares frames by stream), own version."""
    segs = tuple(
        dataclasses.replace(
            s, stream_id=f"{s.stream_id}|{tag}", frames=np.array(s.frames), policy_version=version
        )
        for s in result.segments
    )
    return dataclasses.replace(result, segments=segs, policy_version=version, weights_digest="")


def record_collects(cfg, n: int) -> tuple[list[CollectResult], float]:
    """``n`` real collects with the preset's untrained network; and one collector's env steps per CPU s."""
    from muzero_tune.distributed.actors import CollectorWorker
    from muzero_tune.distributed.placement import LocalRef
    from muzero_tune.pipeline.messages import WeightsSnapshot

    w = CollectorWorker(to_flat_dict(cfg), 0)
    weights = {k: v.detach().numpy().copy() for k, v in w.model.state_dict().items()}
    snap = WeightsSnapshot(version=0, ref=LocalRef(weights), digest="")
    w.collect([snap], 1.0)  # warm-up: numba kernels, first env resets
    t0, c0 = time.perf_counter(), clock()
    out = [w.collect([snap], 1.0) for _ in range(n)]
    wall, cpu = time.perf_counter() - t0, clock() - c0
    w.close()
    steps = sum(r.envstep_delta for r in out)
    print(f"one real collector: {steps / cpu:.1f} env steps per CPU second ({steps / wall:.1f} per wall "
          f"second on this loaded machine)", flush=True)  # fmt: skip
    return out, steps / cpu


def time_phases(cfg, recorded: list[CollectResult], *, rounds: int) -> dict:
    """CPU seconds per env step of each driver phase and of the learner's forward/backward, at cfg's
    replay ratio."""
    from muzero_tune.pipeline.core import DriverCore
    from muzero_tune.pipeline.messages import weights_digest
    from muzero_tune.runs.reporter import MemoryReporter

    core = DriverCore(cfg, MemoryReporter())
    lc, rc = cfg.learn, cfg.replay
    k = 0
    while not core.trainable():  # fill to the training threshold, untimed
        core.push_collect(restamp(recorded[k % len(recorded)], f"fill{k}"))
        k += 1
    tot = dict.fromkeys((*PHASES, *LEARNER_PHASES), 0.0)
    value_fn = core.policy.value_fn

    def timed_value_fn(model):
        fn = value_fn(model)

        def run(*a, **kw):
            t0 = clock()
            try:
                return fn(*a, **kw)
            finally:
                tot["bootstrap"] += clock() - t0

        return run

    core.policy.value_fn = timed_value_fn
    env_steps = train_steps = 0
    for r in range(rounds):
        res = restamp(recorded[r % len(recorded)], f"r{r}")
        t0 = clock()
        budget = core.push_collect(res)
        tot["push"] += clock() - t0
        env_steps += res.envstep_delta
        for _ in range(budget):
            t0 = clock()
            sample = core.buffer.sample(lc.batch_size, core.rng)
            t1 = clock()
            batch = core.policy.make_batch(
                sample, target_model=core.learner.target_model, rng=core.rng,
                reanalyze_count=int(lc.batch_size * rc.reanalyze_ratio), defer_bootstrap=True,
            )  # fmt: skip
            t2 = clock()
            out = core.learner.train_step(batch)  # runs the deferred bootstrap first
            t3 = clock()
            if rc.use_priority:
                core.buffer.update_priorities(sample.flat_index, out.priorities, sample.make_time)
            t4 = clock()
            tot["sample"] += t1 - t0
            tot["targets"] += t2 - t1
            tot["learner"] += t3 - t2  # minus bootstrap, below
            tot["writeback"] += t4 - t3
            train_steps += 1
        t0 = clock()  # one publish per collect launch (max_policy_lag 0 publishes every version)
        weights = core.learner.weights_snapshot()
        {k: v.numpy() for k, v in weights.items()}
        weights_digest(weights)
        tot["publish"] += clock() - t0
    tot["learner"] -= tot["bootstrap"]
    per = {k: v / env_steps for k, v in tot.items()}
    per["env_steps"], per["train_steps"] = env_steps, train_steps
    return per


class StubCollector:
    """A collector actor that returns the recorded collects at once (``recorded``: set before ray.remote)."""

    recorded: list = []

    def __init__(self, flat_cfg, actor_id, incarnation=0, fault=None, num_gpus=0.0):
        self.actor_id, self.n = actor_id, 0

    def ping(self) -> dict:
        import ray

        ctx = ray.get_runtime_context()
        return {"pid": os.getpid(), "placement_group_id": ctx.get_placement_group_id(), "kind": "collector",
                "node_id": ctx.get_node_id(), "actor_id": self.actor_id, "incarnation": 0}  # fmt: skip

    def collect(self, snapshot_box, temperature) -> CollectResult:
        self.n += 1
        res = self.recorded[self.n % len(self.recorded)]
        return dataclasses.replace(restamp(res, f"a{self.actor_id}n{self.n}", snapshot_box[0].version),
                                   actor_id=self.actor_id)  # fmt: skip

    def close(self) -> bool:
        return True


def _timed(fn, key: str, tot: dict):
    def run(*a, **kw):
        t0 = clock()
        try:
            return fn(*a, **kw)
        finally:
            tot[key] += clock() - t0

    return run


def _time_calls(obj, name: str, key: str, tot: dict) -> None:
    """Accumulate the CPU seconds spent in ``obj.name(...)`` into ``tot[key]`` (an instance attribute)."""
    setattr(obj, name, _timed(getattr(obj, name), key, tot))


def absorb(cfg, n_collectors: int, wall_s: float, out_dir: str) -> dict:
    """The real async driver (learner forward/backward stubbed) fed by n stub collectors for wall_s."""
    import ray

    from muzero_tune.config import apply_overrides
    from muzero_tune.distributed.async_driver import AsyncDriver
    from muzero_tune.distributed.placement import standalone_placement
    from muzero_tune.pipeline.learner import LearnOutput
    from muzero_tune.runs.reporter import MemoryReporter

    cfg = apply_overrides(cfg, {
        "policy.async_pipeline.enabled": True, "policy.async_pipeline.num_collector_actors": n_collectors,
        "max_wall_s": None, "max_envstep": 10**9, "eval.eval_freq": 10**9, "logging.output_dir": out_dir,
        "exp_name": f"absorb{n_collectors}", "logging.quiet": True,
    })  # fmt: skip
    driver = AsyncDriver(cfg, MemoryReporter())
    driver.actors.remote_classes["collector"] = ray.remote(StubCollector)
    learner = driver.core.learner
    ones = np.ones(cfg.learn.batch_size, dtype=np.float32)

    def no_learning(batch, **_) -> LearnOutput:  # the learner's work made negligible
        learner.train_iter += 1
        return LearnOutput(priorities=ones, metrics={})

    learner.train_step = no_learning
    spent = dict.fromkeys(("train_step", *PHASES), 0.0)
    core = driver.core
    for obj, name, key in ((core, "train_step", "train_step"), (core, "push_collect", "push"),
                           (core.buffer, "sample", "sample"), (core.policy, "make_batch", "targets"),
                           (core.buffer, "update_priorities", "writeback")):  # fmt: skip
        _time_calls(obj, name, key, spent)
    # the bootstrap values are the learner's work (targets.Bootstrap), stubbed out here with the rest of it
    stamps: list[tuple[float, int, int]] = []  # (time, env steps, train_iter) at each result
    on_collect = driver.on_collect

    def timed(launch, result):
        on_collect(launch, result)
        if driver.core.train_iter > 0:  # steady state: training runs (before it, collects are not budgeted)
            stamps.append((time.monotonic(), driver.core.counters.env_steps, driver.core.train_iter))

    driver.on_collect = timed
    done = driver._done

    def until_wall() -> str | None:  # wall_s of steady state, from the first result once training runs
        if stamps and time.monotonic() - stamps[0][0] >= wall_s:
            return "max_wall_s"
        return done()

    driver._done = until_wall
    driver.placement = standalone_placement(cfg, learner_on_gpu=False, timeout_s=120)
    try:
        driver.run()
    finally:
        driver.shutdown()
    # past the first quarter: the budget queue (2 x collectors collects) fills there at a rate no driver keeps
    late = [st for st in stamps if st[0] - stamps[0][0] >= wall_s / 4]
    (t_a, e_a, i_a), (t_b, e_b, i_b) = (late or stamps)[0], stamps[-1]
    dt = max(t_b - t_a, 1e-9)
    return {
        "envstep_per_s": (e_b - e_a) / dt,  # collects received
        # collects whose train budget was trained
        "trained_envstep_per_s": (i_b - i_a) / dt / cfg.learn.replay_ratio,
        "learner_idle_frac": driver.pipeline_metrics()["pipeline/learner_idle_frac"],
        "train_steps": driver.core.train_iter,
        "env_steps": driver.core.counters.env_steps,
        "spent": spent,  # seconds in each phase over the whole run
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="cartpole_muzero")
    ap.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    ap.add_argument("--replay-ratio", type=float, default=0.25)
    ap.add_argument("--collectors", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--wall-s", type=float, default=20.0, help="seconds per collector count")
    ap.add_argument("--rounds", type=int, default=40, help="collects timed in process")
    ap.add_argument("--nodes", type=int, default=2, help="simulated worker nodes (collectors over them)")
    args = ap.parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from muzero_tune.pipeline.core import setup_torch_threads

    setup_torch_threads()
    cfg = make_config(args.preset, overrides={
        **parse_set_args(args.overrides), "learn.replay_ratio": args.replay_ratio,
        "learn.update_per_collect": None,
        "stop_value": None, "logging.quiet": True,
    })  # fmt: skip
    print(f"load before: {load()}; preset {args.preset}, replay ratio {args.replay_ratio}, "
          f"batch {cfg.learn.batch_size}, {cfg.env.collector_env_num} envs per collector",
          flush=True)  # fmt: skip
    recorded, collector_rate = record_collects(cfg, 6)
    print(f"{np.mean([r.envstep_delta for r in recorded]):.0f} env steps per collect", flush=True)
    per = time_phases(cfg, recorded, rounds=args.rounds)
    driver_s = sum(per[p] for p in PHASES)
    learner_s = per["bootstrap"] + per["learner"]
    step_s = driver_s - per["publish"] + learner_s  # what one learner does per env step, alone
    print(f"\nCPU time per env step, {per['env_steps']} env steps / {per['train_steps']} train steps "
          f"(load {load()}):")
    for p in (*PHASES, *LEARNER_PHASES):
        if p == LEARNER_PHASES[0]:
            print(f"  = driver    {driver_s * 1e6:9.1f} us   "
                  f"({(driver_s - per['publish'] - per['push']) * 1e3 / args.replay_ratio:.2f} ms per train "
                  f"step in sample + targets + write-back); the learner's phases:")  # fmt: skip
        doc = f"   ({PHASE_DOC[p]})" if p in PHASE_DOC else ""
        print(f"  {p:<11} {per[p] * 1e6:9.1f} us{doc}")
    ceiling, consumed = 1.0 / driver_s, 1.0 / step_s
    print(f"  the driver absorbs at most {ceiling:,.0f} env steps/s with the learner's work negligible; one "
          f"learner (driver work + bootstrap + forward/backward) consumes {consumed:,.0f} env steps/s at "
          f"replay ratio {args.replay_ratio}: driver / learner = {ceiling / consumed:.2f} "
          "(goal >= 20)")  # fmt: skip
    old_ceiling = 1.0 / (driver_s + per["bootstrap"])
    print(f"  (counting the bootstrap in the driver, as before: ceiling {old_ceiling:,.0f} env steps/s, "
          f"driver / learner = {old_ceiling / consumed:.2f})")  # fmt: skip

    import ray
    from ray.cluster_utils import Cluster

    per_node = max(1, -(-max(args.collectors) // args.nodes))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    for _ in range(args.nodes):
        cluster.add_node(num_cpus=per_node)
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    StubCollector.recorded = recorded
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench_driver_") as out_dir:
            for n in args.collectors:
                r = absorb(cfg, n, args.wall_s, out_dir)
                rows.append((n, r))
                print(f"collectors {n}: received {r['envstep_per_s']:,.0f} env steps/s, trained their "
                      f"budgets at {r['trained_envstep_per_s']:,.0f} env steps/s, driver idle "
                      f"{r['learner_idle_frac']:.2f} "
                      f"(load {load()})", flush=True)  # fmt: skip
                sp, steps = r["spent"], max(1, r["train_steps"])
                per_env = sp["push"] / max(1, r["env_steps"]) + sp["train_step"] / steps * args.replay_ratio
                r["cpu_ceiling"] = 1.0 / per_env
                print("  driver CPU per train step: " + ", ".join(
                    f"{p} {sp[p] / steps * 1e3:.2f} ms"
                    for p in ("sample", "targets", "writeback")
                ) + f" (all: {sp['train_step'] / steps * 1e3:.2f} ms); per env step {per_env * 1e6:.0f} us "
                    f"-> CPU ceiling {r['cpu_ceiling']:,.0f} env steps/s")  # fmt: skip
    finally:
        ray.shutdown()
        cluster.shutdown()
    print("\nabsorbed: min(received, trained) env steps/s, wall clock, on this machine; CPU ceiling: 1 /\n"
          "the driver's CPU per env step in that run; demand: n x one collector's env steps per CPU s")
    print(f"{'collectors':>10} {'absorbed/s':>11} {'CPU ceiling/s':>14} {'demand/s':>9}  limit (a core each)")
    crossover = None
    for n, r in rows:
        r["absorbed"] = min(r["envstep_per_s"], r["trained_envstep_per_s"])
        demand = n * collector_rate
        limit = "driver" if demand >= r["cpu_ceiling"] else "collectors"
        if limit == "driver" and crossover is None:
            crossover = n
        print(f"{n:>10} {r['absorbed']:>11,.0f} {r['cpu_ceiling']:>14,.0f} {demand:>9,.0f}  {limit}")
    cpu_ceiling = float(np.median([r["cpu_ceiling"] for _, r in rows]))
    where = crossover if crossover else f"> {max(args.collectors)}"
    print(f"the driver becomes the limit at {where} collectors (its median CPU ceiling {cpu_ceiling:,.0f} "
          f"env steps/s = {cpu_ceiling / collector_rate:.1f} collectors); "
          f"in process (no Ray) {ceiling:,.0f}; driver / one learner = {cpu_ceiling / consumed:.1f} "
          f"(goal >= 20). load after: {load()}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
