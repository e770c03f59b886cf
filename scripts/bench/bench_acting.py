"""Acting on CartPole: the search's recurrent network call and a whole collect step, variants side by side.

Variants of the recurrent call at the collect batch (8 envs): eager under ``torch.no_grad`` (the previous
path), eager under ``torch.inference_mode``, the traced twin the search now uses
(:mod:`muzero_tune.models.traced`), and ``torch.compile`` of the same call in each ``--compile-modes`` mode
(static shapes; compile seconds printed); then ``policy.act`` (8 envs, the preset's 25 simulations) with the
traced call against the same model forced eager. Interleaved rounds; medians and per-round ratios.

    python scripts/bench/bench_acting.py [--rounds 15] [--calls 200] [--clock cpu]
    python scripts/bench/bench_acting.py --preset cartpole_efficientzero --compile-modes  # any type

``--clock cpu`` times this process's CPU seconds (``time.process_time``) instead of wall time: the waits for
a core that other work holds are left out, so the figures move far less with the machine's load.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from muzero_tune.config import make_config
from muzero_tune.models.traced import _Recurrent, make_eager, recurrent_outputs
from muzero_tune.pipeline.core import make_policy, setup_torch_threads


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="cartpole_muzero")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=200, help="recurrent calls per variant per round")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="wall time or this process's CPU")
    p.add_argument("--compile-modes", nargs="*", default=["default", "max-autotune-no-cudagraphs"],
                   help="torch.compile modes of the recurrent call to measure beside the others (none: skip)")
    args = p.parse_args(argv)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    setup_torch_threads()
    cfg = make_config(args.preset, overrides={"logging.quiet": True})
    policy, spec = make_policy(cfg)
    model = policy.build_model().eval()
    eager_model = policy.build_model().eval()
    eager_model.load_state_dict(model.state_dict())
    # the same network, always called eagerly (every call it declares traceable)
    make_eager(eager_model)
    b = cfg.env.collector_env_num
    latent = torch.rand(b, *model.latent_shape)
    action = torch.randint(0, spec.num_actions, (b,))

    def eager_no_grad():
        with torch.no_grad():
            model.recurrent_inference(latent, action)

    def eager_inference_mode():
        with torch.inference_mode():
            model.recurrent_inference(latent, action)

    def traced():
        with torch.no_grad():
            recurrent_outputs(model, latent, action)

    rng = np.random.default_rng(0)
    obs = rng.random((b, *spec.obs_shape)).astype(np.float32)
    mask = np.ones((b, spec.num_actions), dtype=bool)

    def act(net):
        return lambda: policy.act(net, obs, mask, explore=True, temperature=1.0, rng=rng)

    calls = {"eager no_grad": eager_no_grad, "eager inference_mode": eager_inference_mode, "traced": traced}
    compile_s = {}
    for mode in args.compile_modes:
        compiled = torch.compile(_Recurrent(model), mode=mode, dynamic=False)
        t0 = time.perf_counter()
        with torch.no_grad():
            compiled(latent, action)  # the compile
        compile_s[mode] = time.perf_counter() - t0

        def run_compiled(fn=compiled):
            with torch.no_grad():
                fn(latent, action)

        calls[f"compiled {mode}"] = run_compiled
    steps = {"act, traced": act(model), "act, eager": act(eager_model)}
    for fn in (*calls.values(), *steps.values()):
        fn()
    times: dict[str, list[float]] = {k: [] for k in (*calls, *steps)}
    for _ in range(args.rounds):
        for name, fn in calls.items():
            t0 = clock()
            for _ in range(args.calls):
                fn()
            times[name].append((clock() - t0) / args.calls)
        for name, fn in steps.items():
            t0 = clock()
            for _ in range(max(1, args.calls // 50)):
                fn()
            times[name].append((clock() - t0) / max(1, args.calls // 50))
    print(f"preset={args.preset} batch={b} sims={cfg.mcts.num_simulations} rounds={args.rounds} "
          f"clock={args.clock} load={os.getloadavg()[0]:.1f}")  # fmt: skip
    for mode, sec in compile_s.items():
        print(f"  compile {mode}: {sec:.1f} s")

    def ratio_text(slow: np.ndarray, fast: np.ndarray) -> str:
        r = slow / fast
        return f"{np.median(r):.2f} (per-round min {r.min():.2f}, max {r.max():.2f})"

    base = np.asarray(times["eager no_grad"])
    for name in calls:
        v = np.asarray(times[name])
        print(f"  recurrent call, {name:>20}: {1e6 * np.median(v):8.1f} us; eager no_grad / this "
              f"{ratio_text(base, v)}")  # fmt: skip
    e, t = np.asarray(times["act, eager"]), np.asarray(times["act, traced"])
    print(f"  collect step (policy.act): eager {1e3 * np.median(e):.2f} ms, traced {1e3 * np.median(t):.2f} "
          f"ms; eager / traced {ratio_text(e, t)}")  # fmt: skip


if __name__ == "__main__":
    main()
