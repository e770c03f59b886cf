"""Learner efficiency: full train steps/s (sample + targets + loss + backward + step + priority write-back)
against a bare forward+backward of the same network on the same shapes, measured side by side in one run.

    python scripts/bench/bench_learner.py                      # CartPole MuZero, batch 256, K=5, MLP
    python scripts/bench/bench_learner.py --preset pong_muzero --set learn.batch_size=32 --steps 5
    python scripts/bench/bench_learner.py --clock cpu  # this process's CPU time (steadier when shared)
    python scripts/bench/bench_learner.py --preset pong_muzero --set learn.batch_size=32 \
        --set learn.num_threads=2
    # + FLOP bounds
    python scripts/bench/bench_learner.py --preset pong_muzero --set learn.batch_size=32 --flops

``--clock cpu`` counts the CPU seconds this process spent (``time.process_time``): with one torch thread the
work is the same, and the waits for a core that other processes hold are left out, so the ratios move far
less with the machine's load than wall-time ones do. It counts every thread's CPU, the helper's and those of
``learn.num_threads`` > 1 included, so those are compared on the wall clock.

``--flops`` also counts the floating-point work of one step (``torch.utils.flop_counter``: matmuls and
convolutions, forward and backward) and prints the efficiency that work alone allows, whatever the code
around it: the bare step's FLOPs over the loss step's (SSL targets included) on the loss's thread, and over
half of loss + bootstrap forward with both cores' work perfectly shared.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from bench_common import add_preset_args, filled_core, preset_overrides
from proc_cpu import MachineCpu  # scripts/bench/, beside this script

from muzero_tune.models.layout import place_model
from muzero_tune.pipeline.core import setup_torch_threads
from muzero_tune.pipeline.learner import intra_op_threads, make_optimizer


def bare_step(model, optimizer, obs, actions, num_unroll: int, amp_dtype: torch.dtype | None = None) -> None:
    """Forward (initial + K recurrent) and backward with a trivial loss on every head; no targets.
    ``amp_dtype``: the forward under ``torch.autocast`` to that dtype (None: fp32)."""
    dev = obs.device.type
    with torch.autocast(dev, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
        root = model.initial_inference(obs)
        loss = root.value_logits.logsumexp(-1).mean() + root.policy_logits.logsumexp(-1).mean()
        latent = root.latent
        for k in range(num_unroll):
            rec = model.recurrent_inference(latent, actions[:, k])
            latent = rec.latent
            loss = (
                loss
                + (
                    rec.value_logits.logsumexp(-1).mean()
                    + rec.policy_logits.logsumexp(-1).mean()
                    + rec.reward_logits.logsumexp(-1).mean()
                )
                / num_unroll
            )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_preset_args(p)
    p.add_argument("--steps", type=int, default=10, help="timed steps per variant per round")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds (side by side)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="wall time or this process's CPU")
    p.add_argument("--flops", action="store_true", help="also count FLOPs; print the bounds")
    args = p.parse_args(argv)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    setup_torch_threads()
    core = filled_core(args.preset, preset_overrides(args))
    cfg = core.cfg

    bs, k = cfg.learn.batch_size, cfg.replay.num_unroll_steps
    # the learner's device and layout: the same network
    model = place_model(
        core.policy.build_model(), device=core.learner.device, channels_last=cfg.model.channels_last
    )
    # the learner's own optimizer construction, so the bare step gets the same (fused) update
    opt = make_optimizer(cfg.learn, list(model.parameters()))
    sample = core.buffer.sample(bs, core.rng)
    batch = core.policy.make_batch(sample, target_model=core.learner.target_model, rng=core.rng)
    obs = torch.as_tensor(batch.obs[:, 0])
    actions = torch.as_tensor(batch.actions)
    loss_opt = make_optimizer(cfg.learn, list(model.parameters()))

    def loss_step():
        """The policy's own loss (SSL included) + backward + step on a fixed batch: the learner minus data,
        on the learner's thread counts (``learn.num_threads``)."""
        with intra_op_threads(core.learner.forward_threads):
            out = core.policy.compute_loss(model, batch, train_iter=0)
        with intra_op_threads(core.learner.backward_threads):
            loss_opt.zero_grad(set_to_none=True)
            out.loss.backward()
            loss_opt.step()

    def time_it(fn, n):
        t0 = clock()
        for _ in range(n):
            fn()
        core.settle()  # the work a full step started ahead for the next (learn.prefetch_next_batch) counts
        return (clock() - t0) / n

    # the other variants draw with their own generator and leave the buffer's clock, so the batch a full
    # step built ahead stays valid for the next round's first full step, as within a train budget
    bench_rng = np.random.default_rng(1)

    def build():  # the driver's side of a batch: the bootstrap values are left to the learner's step
        core.build_batch(bench_rng, tick=False)

    _, deferred = core.build_batch(bench_rng, tick=False)

    amp = core.learner.autocast_dtype  # the learner's precision (learn.mixed_precision), None: fp32
    pieces = cfg.learn.bootstrap_piece_rows  # the learner's split of its bootstrap forward
    helper = core.learner.bootstrap_helper

    def serial_step():  # the learner step with its bootstrap forward first and the SSL targets on this thread
        learner, offload = core.learner, core.learner.ssl_offload
        learner.bootstrap_helper, learner.ssl_offload = None, None
        try:
            learner.train_step(core.build_batch(bench_rng, tick=False)[1])
        finally:
            learner.bootstrap_helper, learner.ssl_offload = helper, offload

    def fixed_step():
        with torch.autocast(model_dev, dtype=amp or torch.float32, enabled=amp is not None):
            loss_step()

    model_dev = core.learner.device.type
    variants = {
        "full": core.train_step,
        "bare": lambda: bare_step(model, opt, obs, actions, k, amp),
        "fixed": fixed_step,
        "targets": build,
        # the target network's forward (the learner's precision), which the full step overlaps with its loss
        "bootstrap": lambda: core.learner.in_precision(deferred.bootstrap.values, pieces),
    }
    if helper is not None:  # learn.overlap_bootstrap: the same step without the helper thread, side by side
        variants["serial"] = serial_step
    if amp is not None:  # learn.mixed_precision: the bare step in fp32 too
        variants["bare_fp32"] = lambda: bare_step(model, opt, obs, actions, k)
    threads = cfg.learn.num_threads
    if threads > 1:  # learn.num_threads: the bare step on as many threads too (the efficiency stays on one)

        def bare_threads():
            with intra_op_threads(threads):
                bare_step(model, opt, obs, actions, k, amp)

        variants["bare_threads"] = bare_threads
    # warm-up, then many short interleaved rounds: every variant sees the same machine load, and the
    # ratios are taken per round (the median and the spread say how much the shared machine moved them)
    # and between each variant's fastest round
    for fn in variants.values():
        time_it(fn, 2)
    per_round: dict[str, list[float]] = {name: [] for name in variants}
    machine0 = MachineCpu.now()
    for _ in range(args.rounds):
        for name, fn in variants.items():
            per_round[name].append(time_it(fn, args.steps))
    med = {name: float(np.median(v)) for name, v in per_round.items()}

    def ratio(num: str, den: str) -> str:
        """The median of the per-round ratios and their spread, and the ratio of each variant's fastest round
        (the least disturbed run of each: a neighbour's load only ever slows a round down)."""
        r = np.asarray(per_round[num]) / np.asarray(per_round[den])
        fastest = min(per_round[num]) / min(per_round[den])
        spread = f"per-round min {r.min():.2f}, max {r.max():.2f}"
        return f"{np.median(r):.2f} ({spread}; fastest rounds {fastest:.2f})"

    f, b, x, t, v = med["full"], med["bare"], med["fixed"], med["targets"], med["bootstrap"]
    precision = "fp32" if amp is None else f"autocast {str(amp).removeprefix('torch.')}"
    lc = cfg.learn
    print(f"preset={args.preset} batch={bs} K={k} model={cfg.model.kind} ssl={lc.ssl_loss_weight > 0} "
          f"precision={precision} overlap_bootstrap={helper is not None} num_threads={threads} "
          f"helper_ssl_encodings={lc.helper_ssl_encodings} prefetch_next_batch={lc.prefetch_next_batch} "
          f"bootstrap_piece_rows={lc.bootstrap_piece_rows}")  # fmt: skip
    print(f"  rounds={args.rounds} x {args.steps} steps per variant, interleaved, {args.clock} clock; "
          f"medians (load {os.getloadavg()[0]:.2f} at the end):")  # fmt: skip
    # steal: the hypervisor's share; a step that overlaps work on both cores loses most when it is high
    print(f"  the machine over the rounds: {MachineCpu.describe(machine0)}")
    print(f"  full learner step     : {1e3 * f:8.2f} ms  -> {1 / f:7.1f} train steps/s")
    if "serial" in med:
        print(f"  full step, nothing on the helper thread: {1e3 * med['serial']:8.2f} ms")
    print(f"  bare forward+backward ({precision}): {1e3 * b:8.2f} ms  -> {1 / b:7.1f} steps/s")
    if "bare_fp32" in med:
        print(f"  bare forward+backward (fp32): {1e3 * med['bare_fp32']:8.2f} ms")
    if "bare_threads" in med:
        print(f"  bare forward+backward on {threads} threads: {1e3 * med['bare_threads']:8.2f} ms")
    print(f"  policy loss + backward on a fixed batch (SSL incl.): {1e3 * x:8.2f} ms")
    print(f"  sample + targets (the driver's side, bootstrap deferred): {1e3 * t:8.2f} ms")
    print(f"  bootstrap values (target network, {len(deferred.bootstrap.obs)} positions): {1e3 * v:8.2f} ms")
    print(f"  learner efficiency (bare forward+backward / full): {ratio('bare', 'full')}")
    if "serial" in med:
        print(f"  learner efficiency, bootstrap not overlapped (bare / serial): {ratio('bare', 'serial')}")
        print(f"  overlap speed-up (serial step / full): {ratio('serial', 'full')}")
    if "bare_fp32" in med:
        print(f"  against the fp32 bare step (bare fp32 / full): {ratio('bare_fp32', 'full')}")
    if "bare_threads" in med:
        print(f"  against the bare step on {threads} threads (bare / full): {ratio('bare_threads', 'full')}")
    print(f"  learner efficiency without data (fixed-batch loss step / full): {ratio('fixed', 'full')}")
    print(f"  batches built ahead by full steps: {core.prefetch_stats['used']} used, "
          f"{core.prefetch_stats['discarded']} discarded")  # fmt: skip
    if args.flops:
        gf = {
            "bare": count_flops(lambda: bare_step(model, opt, obs, actions, k, amp)),
            "loss": count_flops(fixed_step),
            "bootstrap": count_flops(lambda: core.learner.in_precision(deferred.bootstrap.values, pieces)),
        }
        print_flop_bounds(gf, len(deferred.bootstrap.obs), {"bare": b, "loss": x, "bootstrap": v})


def count_flops(fn) -> float:
    """GFLOPs of one call of ``fn`` (matmuls and convolutions, forward and backward; torch's counter)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops() / 1e9


def print_flop_bounds(gf: dict[str, float], n_bootstrap: int, seconds: dict[str, float]) -> None:
    """The learner efficiency the arithmetic alone allows. ``gf``: GFLOPs of the bare step, the policy's loss
    step (forward with its SSL targets, backward) and the bootstrap forward (``n_bootstrap`` positions);
    ``seconds``: the median time of each, measured alone in the rounds above. The FLOP bounds assume every
    part runs at the bare step's rate; the parts' own rates (printed) differ, so the last line bounds by
    their measured times instead."""
    bare, loss, boot = gf["bare"], gf["loss"], gf["bootstrap"]
    print(f"  GFLOP per step: bare {bare:.2f}, loss step {loss:.2f}, bootstrap forward {boot:.2f} "
          f"({n_bootstrap} positions)")  # fmt: skip
    rates = ", ".join(f"{name} {gf[name] / seconds[name]:.1f}" for name in ("bare", "loss", "bootstrap"))
    print(f"  GFLOP/s of each part alone: {rates}")
    print(f"  FLOP bound, loss on one thread, bootstrap beside it (bare / loss): {bare / loss:.2f}")
    print(f"  FLOP bound, all of it shared perfectly over 2 cores (bare / ((loss + bootstrap) / 2)): "
          f"{bare / ((loss + boot) / 2):.2f}")  # fmt: skip
    t_bare, t_loss, t_boot = seconds["bare"], seconds["loss"], seconds["bootstrap"]
    print(f"  time bound, the parts' measured times shared perfectly over 2 cores "
          f"(bare / ((loss step + bootstrap) / 2)): {t_bare / ((t_loss + t_boot) / 2):.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
