"""A UniZero collect step with and without its KV caches, against MuZero's, side by side in one process; and
the cached policy with its network calls traced (the default) against the same calls eager.

One collect step = one batched ``policy.act`` over ``--envs`` envs of the preset's env with the preset's
simulations (root inference + search). The cached and uncached policies act on the same recorded observation
stream with the same RNG seeds and must return the same actions and values (checked; the eager-call variant
bit for bit); rounds alternate between the variants so every variant sees the same machine load. Prints ms
per collect step and the ratios.

    python scripts/bench/bench_unizero_cache.py --steps 60 --rounds 3
    python scripts/bench/bench_unizero_cache.py --preset pendulum_sampled_unizero \
        --baseline pendulum_sampled_muzero
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
import torch

from muzero_tune.config import make_config
from muzero_tune.models.traced import make_eager
from muzero_tune.pipeline.core import make_policy, setup_torch_threads


def _stream(env_id: str, num_envs: int, steps: int, seed: int = 0) -> list[np.ndarray]:
    """Observations [num_envs, *obs_shape] of ``env_id`` envs under seeded random actions (an env resets when
    it ends)."""
    envs = [gym.make(env_id) for _ in range(num_envs)]
    for i, e in enumerate(envs):
        e.action_space.seed(seed + i)
    obs = np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(envs)])
    out = [obs.astype(np.float32)]
    for _ in range(steps - 1):
        nxt = []
        for e in envs:
            o, _, term, trunc, _ = e.step(e.action_space.sample())
            nxt.append(e.reset()[0] if term or trunc else o)
        out.append(np.stack(nxt).astype(np.float32))
    return out


def _run(policy, model, stream, seed: int):
    """(seconds per act, actions [T, B], values [T, B]) over ``stream``."""
    state = policy.initial_act_state(len(stream[0]))
    discrete = policy.spec.action_kind == "discrete"
    legal = np.ones((len(stream[0]), policy.spec.num_actions if discrete else 0), bool)
    rng = np.random.default_rng(seed)
    acts, vals = [], []
    t0 = time.perf_counter()
    for obs in stream:
        out = policy.act(model, obs, legal, explore=True, temperature=1.0, rng=rng, state=state,
                         env_index=np.arange(len(obs)))  # fmt: skip
        state = out.state
        acts.append(out.actions)
        vals.append(out.root_value)
    return (time.perf_counter() - t0) / len(stream), np.stack(acts), np.stack(vals)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--steps", type=int, default=60, help="collect steps per variant per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--preset", default="cartpole_unizero", help="a unizero or sampled_unizero preset")
    p.add_argument("--baseline", default="cartpole_muzero", help="the MuZero-family preset to compare with")
    args = p.parse_args(argv)
    setup_torch_threads()
    variants = {}
    for name, preset, over in (
        ("unizero cached", args.preset, {"policy.kv_cache": True}),
        ("unizero cached eager", args.preset, {"policy.kv_cache": True}),
        ("unizero uncached", args.preset, {"policy.kv_cache": False}),
        ("muzero", args.baseline, {}),
    ):
        cfg = make_config(preset, overrides=over)
        policy, _ = make_policy(cfg)
        torch.manual_seed(0)
        variants[name] = (policy, policy.build_model().eval())
    # the uncached and eager models are the cached one's weights; the eager one never runs a traced call
    for name in ("unizero uncached", "unizero cached eager"):
        variants[name][1].load_state_dict(variants["unizero cached"][1].state_dict())
    make_eager(variants["unizero cached eager"][1])
    stream = _stream(variants["unizero cached"][0].cfg.env.env_id, args.envs, args.steps)
    times: dict[str, list[float]] = {k: [] for k in variants}
    for policy, model in variants.values():  # warm-up (numba, allocations)
        _run(policy, model, stream[:3], seed=0)
    for r in range(args.rounds):
        results = {}
        for name, (policy, model) in variants.items():
            sec, acts, vals = _run(policy, model, stream, seed=r)
            times[name].append(sec)
            results[name] = (acts, vals)
        # continuous actions are tanh(mu + sigma * noise): equal up to float rounding
        np.testing.assert_allclose(results["unizero cached"][0], results["unizero uncached"][0], atol=1e-4)
        np.testing.assert_allclose(
            results["unizero cached"][1], results["unizero uncached"][1], atol=1e-4, rtol=1e-5
        )
        for got, want in zip(results["unizero cached"], results["unizero cached eager"], strict=True):
            np.testing.assert_array_equal(got, want)
    sims = variants["unizero cached"][0].cfg.mcts.num_simulations
    base = np.median(times["muzero"])
    print(f"collect step: {args.preset} vs {args.baseline} ('muzero' below), {args.envs} envs, {sims} "
          f"simulations, median of {args.rounds} rounds")  # fmt: skip
    for name, ts in times.items():
        med = np.median(ts)
        print(f"  {name:20s} {1e3 * med:8.1f} ms/step   x{med / base:5.2f} of muzero")
    ratio = np.median(times["unizero uncached"]) / np.median(times["unizero cached"])
    print(f"  uncached / cached    {ratio:.2f}  (same actions and values: checked)")
    per_round = np.array(times["unizero cached eager"]) / np.array(times["unizero cached"])
    spread = f"rounds {per_round.min():.2f}-{per_round.max():.2f}"
    print(f"  eager / traced call  {np.median(per_round):.2f} ({spread}; same actions and values bit for "
          "bit: checked)")


if __name__ == "__main__":
    main()
