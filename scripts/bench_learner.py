"""Learner efficiency: full train steps/s (sample + targets + loss + backward + step + priority write-back)
against a bare forward+backward of the same network on the same shapes, measured side by side in one run.

    python scripts/bench_learner.py                      # CartPole MuZero, batch 256, K=5, MLP
    python scripts/bench_learner.py --preset pong_muzero --set learn.batch_size=32 --steps 5
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from muzero_tune.config import make_config, parse_set_args
from muzero_tune.pipeline.collector import SegmentCollector
from muzero_tune.pipeline.core import DriverCore, setup_torch_threads
from muzero_tune.pipeline.reporter import MemoryReporter


def bare_step(model, optimizer, obs, actions, num_unroll: int) -> None:
    """Forward (initial + K recurrent) and backward with a trivial loss on every head; no targets."""
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
    p.add_argument("--preset", default="cartpole_muzero")
    p.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    p.add_argument("--steps", type=int, default=100, help="timed steps per variant")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (side by side)")
    args = p.parse_args(argv)
    setup_torch_threads()
    cfg = make_config(args.preset, overrides={"logging.quiet": True, **parse_set_args(args.overrides)})
    core = DriverCore(cfg, MemoryReporter())
    collector = SegmentCollector(cfg, core.policy, core.spec, seed=0)
    while core.buffer.num_transitions < max(2 * cfg.learn.batch_size, 1000):
        core.push_collect(collector.collect(core.learner.model, temperature=1.0))
    collector.close()

    bs, k = cfg.learn.batch_size, cfg.replay.num_unroll_steps
    model = core.policy.build_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    sample = core.buffer.sample(bs, core.rng)
    batch = core.policy.make_batch(sample, target_model=core.learner.target_model, rng=core.rng)
    obs = torch.as_tensor(batch.obs[:, 0])
    actions = torch.as_tensor(batch.actions)
    loss_opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def loss_step():
        """The policy's own loss (SSL included) + backward + step on a fixed batch: the learner minus data."""
        out = core.policy.compute_loss(model, batch, train_iter=0)
        loss_opt.zero_grad(set_to_none=True)
        out.loss.backward()
        loss_opt.step()

    def time_it(fn, n):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n

    # warm-up both, then alternate rounds so both see the same machine load
    time_it(core.train_step, 3)
    time_it(lambda: bare_step(model, opt, obs, actions, k), 3)
    time_it(loss_step, 2)
    full, bare, targets, fixed = [], [], [], []
    for _ in range(args.rounds):
        full.append(time_it(core.train_step, args.steps))
        bare.append(time_it(lambda: bare_step(model, opt, obs, actions, k), args.steps))
        fixed.append(time_it(loss_step, args.steps))

        def build():
            s = core.buffer.sample(bs, core.rng)
            core.policy.make_batch(s, target_model=core.learner.target_model, rng=core.rng)

        targets.append(time_it(build, max(1, args.steps // 4)))
    f, b, t, x = (float(np.median(v)) for v in (full, bare, targets, fixed))
    print(f"preset={args.preset} batch={bs} K={k} model={cfg.model.kind} ssl={cfg.learn.ssl_loss_weight > 0}")
    print(f"  full learner step     : {1e3 * f:8.2f} ms  -> {1 / f:7.1f} train steps/s")
    print(f"  bare forward+backward : {1e3 * b:8.2f} ms  -> {1 / b:7.1f} steps/s")
    print(f"  policy loss + backward on a fixed batch (SSL incl.): {1e3 * x:8.2f} ms")
    print(f"  sample + targets (target-net bootstrap values incl.): {1e3 * t:8.2f} ms")
    print(f"  learner efficiency (bare forward+backward / full): {b / f:.2f}")
    print(f"  learner efficiency without data (fixed-batch loss step / full): {x / f:.2f}")


if __name__ == "__main__":
    main()
