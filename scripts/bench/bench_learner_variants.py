"""Full learner steps of one preset under several settings, side by side, optionally beside a busy process.

    python scripts/bench/bench_learner_variants.py --preset pong_muzero --set learn.batch_size=32 \
        --variant "serial:learn.prefetch_next_batch=false" --variant "ssl2:learn.helper_ssl_encodings=2"
    python scripts/bench/bench_learner_variants.py --preset pong_muzero --set learn.batch_size=32 \
        --variant "threads2:learn.num_threads=2" --busy-process
    python scripts/bench/bench_learner_variants.py --steps 10 \
        --variant "noprefetch:learn.prefetch_next_batch=false"
    python scripts/bench/bench_learner_variants.py --steps 20 --matmul-floor \
        --variant "compiled:learn.compile=default"

One driver per variant -- the preset with ``--set`` (the ``base`` variant) and each ``--variant NAME:KEY=VALUE
[,KEY=VALUE...]`` on top of it -- the same seed and data, each taking ``--steps`` full train steps (sample,
targets, loss, backward, step, write-back, and the work a step starts ahead for the next) in turn over
interleaved rounds. Printed: each variant's median step and its median per-round speed-up over ``base``
(>1: faster) with the spread, and a compiled variant's compile time (``train/compile_s``; cold with
``TORCHINDUCTOR_CACHE_DIR`` set to an empty folder, else from Inductor's disk cache). ``--busy-process``
runs a second process that spins on a core for the whole measurement, as a collector actor does beside an
async learner on a 2-core machine.

``--matmul-floor`` also prints the arithmetic no setting removes: every matrix product of the base variant's
step on the thread that steps it (the loss's forward and backward; recorded by torch's profiler on the eager
step, each with its shapes) timed alone, back to back on fresh fp32 and bf16 tensors. A step is no faster
than those matmuls unless they shrink (bf16) or move to another core.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from collections import Counter

import numpy as np
import torch
from bench_common import add_preset_args, filled_core, interleaved_train_steps, preset_overrides
from proc_cpu import MachineCpu  # scripts/bench/, beside this script

from muzero_tune.config import parse_set_args
from muzero_tune.pipeline.core import setup_torch_threads


def spin(stop) -> None:
    """Busy-loop on one core until ``stop`` is set (the stand-in for a collector actor's work)."""
    while not stop.is_set():
        sum(range(10_000))


def parse_variant(text: str) -> tuple[str, dict]:
    """``NAME:KEY=VALUE[,KEY=VALUE...]`` -> (name, overrides)."""
    name, sep, settings = text.partition(":")
    if not sep or not name or not settings:
        raise SystemExit(f"--variant {text!r}: expected NAME:KEY=VALUE[,KEY=VALUE...]")
    return name, parse_set_args(settings.split(","))


MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def recorded_matmuls(core, steps: int) -> list[tuple[str, list]]:
    """The matrix products of ``steps`` eager train steps of ``core`` on the thread that steps it (the
    loss's forward and backward): [(op name, input shapes)]."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(steps):
            core.train_step()
        core.settle()
    events = [e for e in prof.events() if e.name in MATMUL_OPS]
    if not events:
        return []
    per_thread = Counter(e.thread for e in events)  # the loss's forward and backward: the most of them
    stepping = per_thread.most_common(1)[0][0]
    return [(e.name, [list(s) for s in e.input_shapes]) for e in events if e.thread == stepping]


def timed_matmuls(calls: list[tuple[str, list]], dtype: torch.dtype, repeats: int = 5) -> float:
    """Median seconds of running ``calls`` [(op name, input shapes)] once each, back to back."""
    op = {"aten::mm": torch.mm, "aten::addmm": torch.addmm, "aten::bmm": torch.bmm,
          "aten::baddbmm": torch.baddbmm}  # fmt: skip
    args = [(op[name], [torch.randn(s, dtype=dtype) for s in shapes if s]) for name, shapes in calls]
    for fn, a in args:  # warm: allocator, the library's kernels for each shape
        fn(*a)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for fn, a in args:
            fn(*a)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def matmul_flops(name: str, shapes: list) -> int:
    """Floating-point operations of one recorded product: 2 m k n ([b, m, k] @ [b, k, n]: 2 b m k n)."""
    a, b = (shapes[1], shapes[2]) if name in ("aten::addmm", "aten::baddbmm") else (shapes[0], shapes[1])
    return 2 * int(np.prod(a)) * b[-1]


def print_matmul_floor(core, steps: int, step_s: float) -> None:
    """The base variant's matmuls per step, timed alone in fp32 and bf16, against its step ``step_s``."""
    calls = recorded_matmuls(core, steps)
    flops = sum(matmul_flops(name, shapes) for name, shapes in calls) / steps
    print(f"  the base step's {len(calls) // steps} matmuls on its own thread ({flops / 1e6:.0f} MFLOP), "
          "timed alone:")  # fmt: skip
    for dtype in (torch.float32, torch.bfloat16):
        per_step = timed_matmuls(calls, dtype) / steps
        rate = flops / per_step / 1e9
        print(f"    {str(dtype).removeprefix('torch.'):9s} {1e3 * per_step:6.2f} ms per step "
              f"({per_step / step_s:.0%} of the base step, {rate:.0f} GFLOP/s)")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_preset_args(p)
    p.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE[,...]")
    p.add_argument("--steps", type=int, default=2, help="train steps per driver per round")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--busy-process", action="store_true", help="a second process spins on a core meanwhile")
    p.add_argument("--matmul-floor", action="store_true", help="also time the base step's matmuls alone")
    args = p.parse_args(argv)
    if not args.variant:
        raise SystemExit("give at least one --variant to compare with the base settings")
    setup_torch_threads()
    overrides = preset_overrides(args)
    if args.matmul_floor and overrides.get("learn.compile", "off") != "off":
        raise SystemExit(
            "--matmul-floor records the base variant's eager step: leave learn.compile off in --set"
        )
    variants = {"base": {}, **dict(parse_variant(v) for v in args.variant)}
    cores = {name: filled_core(args.preset, {**overrides, **extra}) for name, extra in variants.items()}
    stop = mp.Event()
    busy = mp.Process(target=spin, args=(stop,), daemon=True) if args.busy_process else None
    if busy is not None:
        busy.start()
    machine0 = MachineCpu.now()
    try:  # the warm-up steps (traces, allocator, OpenMP's team) then the timed rounds
        per_round = interleaved_train_steps(cores, rounds=args.rounds, steps=args.steps)
    finally:
        stop.set()
        if busy is not None:
            busy.join()
    cfg = cores["base"].cfg
    print(f"preset={args.preset} batch={cfg.learn.batch_size} busy_process={args.busy_process} "
          f"base: {' '.join(args.overrides) or '(preset)'}; {args.rounds} rounds x {args.steps} steps, "
          f"interleaved (load {os.getloadavg()[0]:.2f} at the end)")  # fmt: skip
    print(f"  the machine over the rounds: {MachineCpu.describe(machine0)}")
    base = np.asarray(per_round["base"])
    for name, extra in variants.items():
        t = np.asarray(per_round[name])
        line = f"  {name:12s} {1e3 * np.median(t):8.2f} ms per step"
        if name != "base":
            r = base / t
            settings = ",".join(f"{k}={v}" for k, v in extra.items())
            line += f"  speed-up over base {np.median(r):.2f} (per round {r.min():.2f}-{r.max():.2f})"
            line += f"  [{settings}]"
        stats = cores[name].prefetch_stats
        line += f"  batches built ahead: {stats['used']} used, {stats['discarded']} discarded"
        compile_s = cores[name].last_learn.metrics.get("train/compile_s")
        if compile_s is not None:
            line += f"  compile {compile_s:.1f} s"
        print(line)
    if args.matmul_floor:
        print_matmul_floor(cores["base"], args.steps, float(np.median(base)))


if __name__ == "__main__":
    main()
