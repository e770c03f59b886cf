"""Acting on CartPole: the search's recurrent network call and a whole collect step, variants side by side.

Variants of the recurrent call at the collect batch (8 envs): eager under ``torch.no_grad``, eager under
``torch.inference_mode``, the traced twin (:mod:`muzero_tune.models.traced`), the numba host kernel
(:mod:`muzero_tune.models.host`, where the network allows it), and ``torch.compile`` of the same call in
each ``--compile-modes`` mode (static shapes; compile seconds printed); then ``policy.act`` (8 envs, the
preset's simulations) with the host kernel (``mcts.host_kernel``), with the traced call, and with the same
model forced eager. Interleaved rounds; medians and per-round ratios. ``--host-rows``: the search's model
step (network call and decoding) with the host kernel against the traced call at other row counts, the
measurement behind ``models.host.MAX_ROWS``.

    python scripts/bench/bench_acting.py [--rounds 15] [--calls 200] [--clock cpu]
    python scripts/bench/bench_acting.py --compile-modes --host-rows 8 16 32 64 128 256
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
from muzero_tune.models import host
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
    p.add_argument("--host-rows", nargs="*", type=int, default=[],
                   help="row counts at which to time the host kernel's search step against the traced one")
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
    traced_model = policy.build_model().eval()
    traced_model.load_state_dict(model.state_dict())
    traced_model.host_recurrent = False  # traced, never the host kernel
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
            recurrent_outputs(traced_model, latent, action)

    def host_call():
        with torch.no_grad():
            host.host_recurrent_outputs(model, latent, action)

    with torch.no_grad():
        has_host = host.host_recurrent_outputs(model, latent, action) is not None  # the MuZero call
    host_steps = host.host_kernel_kind(model) is not None  # its search steps run on a host kernel

    rng = np.random.default_rng(0)
    obs = rng.random((b, *spec.obs_shape)).astype(np.float32)
    mask = np.ones((b, spec.num_actions), dtype=bool)

    def act(net):
        return lambda: policy.act(net, obs, mask, explore=True, temperature=1.0, rng=rng)

    calls = {"eager no_grad": eager_no_grad, "eager inference_mode": eager_inference_mode, "traced": traced}
    if has_host:
        calls["host kernel"] = host_call
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
    steps = {"act, traced": act(traced_model), "act, eager": act(eager_model)}
    if host_steps:
        steps["act, host"] = act(model)
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
    if host_steps:
        h = np.asarray(times["act, host"])
        print(f"  collect step (policy.act): host {1e3 * np.median(h):.2f} ms; traced / host "
              f"{ratio_text(t, h)}; eager / host {ratio_text(e, h)}")  # fmt: skip
    if args.host_rows and not has_host:
        print("  --host-rows: this network's call does not run on the MuZero host kernel")
    elif args.host_rows:
        host_rows(policy, model, traced_model, spec.num_actions, args, clock, ratio_text)


def host_rows(policy, model, traced_model, num_actions, args, clock, ratio_text) -> None:
    """The search's model step (network call + decoding) at each ``--host-rows`` count: the host kernel
    against the traced call, interleaved rounds (the kernel runs past ``host.MAX_ROWS`` here)."""
    limit, host.MAX_ROWS = host.MAX_ROWS, 1 << 30
    try:
        fns = {"host": policy.recurrent_fn(model), "traced": policy.recurrent_fn(traced_model)}
        for rows in args.host_rows:
            latent = torch.rand(rows, *model.latent_shape)
            actions = np.arange(rows) % num_actions
            times: dict[str, list[float]] = {k: [] for k in fns}
            calls = max(5, args.calls * 8 // max(rows, 8))
            with torch.no_grad():
                for fn in fns.values():
                    fn(latent, actions)
                for _ in range(args.rounds):
                    for name, fn in fns.items():
                        t0 = clock()
                        for _ in range(calls):
                            fn(latent, actions)
                        times[name].append((clock() - t0) / calls)
            h, t = np.asarray(times["host"]), np.asarray(times["traced"])
            print(f"  search model step at {rows:4d} rows: host {1e6 * np.median(h):8.1f} us, traced "
                  f"{1e6 * np.median(t):8.1f} us; traced / host {ratio_text(t, h)}")  # fmt: skip
    finally:
        host.MAX_ROWS = limit


if __name__ == "__main__":
    main()
