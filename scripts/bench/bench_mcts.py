"""Benchmark the batched MuZero search kernels (network excluded).

What this script owns
    Timing of the tree work only: the two kernel calls per simulation (select; expand + backup), measured
    directly on precomputed random network outputs, the whole ``MuZeroSearch.run()`` with a zero-cost
    ``recurrent_fn``, and the numba compile time cold vs loaded from the on-disk cache. With LightZero's
    compiled tree installed (``pip install --no-deps LightZero==0.2.0``; nothing else of it is imported),
    the ``reference`` section times its search, C++ tree plus its collect path's Python glue, beside
    ``run()`` in interleaved rounds on the same zero-cost network outputs: the goal "3x below the
    reference" as a ratio measured on one machine.

What it must never do
    Time the network or depend on a model (a later section comparing search time with the real network per
    collect step gets appended to ``SECTIONS``), or leave numba cache files outside a temporary directory
    when measuring cold compiles.

Usage: ``python scripts/bench/bench_mcts.py [--batch-sizes 8 64] [--num-actions 2 18] [--num-simulations 50]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from muzero_tune.mcts import MuZeroSearch, kernels, puct
from muzero_tune.mcts.sampled import SampledSearch

LATENT_SIZE = 64  # width of the dummy latent for run(); only affects the torch gather/copy cost
CLOCK_NS = time.perf_counter_ns  # the tree-work timer; ``--clock cpu`` makes it this thread's CPU time


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print a fixed-width table (floats with 3 decimals)."""
    cells = [[f"{c:.3f}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
    print(f"\n## {title}")
    print("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))


def _random_network_outputs(
    rng: np.random.Generator, *, batch_size: int, num_actions: int, num_simulations: int
):
    """Precomputed decoded outputs: reward [S, B], value [S, B] float32, logits [S, B, A] float32."""
    shape = (num_simulations, batch_size)
    reward = rng.normal(size=shape).astype(np.float32)
    value = rng.normal(size=shape).astype(np.float32)
    logits = rng.normal(size=(*shape, num_actions)).astype(np.float32)
    return reward, value, logits


def time_kernels(
    *, batch_size: int, num_actions: int, num_simulations: int, repeats: int, rng: np.random.Generator
) -> tuple[float, float]:
    """Return (select_us, expand_backup_us) per simulation per tree, timing each kernel call directly.

    The kernels' argument tuples are built once (the arrays are updated in place), so only the calls are
    timed; the search's own hooks make the same calls with the same arguments."""
    search = MuZeroSearch(num_actions=num_actions, num_simulations=num_simulations)
    reward, value, logits = _random_network_outputs(
        rng, batch_size=batch_size, num_actions=num_actions, num_simulations=num_simulations
    )
    search._stage_roots(
        torch.zeros(batch_size, 1),
        rng.normal(size=(batch_size, num_actions)),
        np.ones((batch_size, num_actions), dtype=bool),
        rng.normal(size=batch_size),
    )
    t = search.tree
    pb_c_base, pb_c_init, discount, value_delta_max = 19652.0, 1.25, 0.997, 0.01
    tree_args = (t.children, t.prior, t.logits, t.kind, t.visit_count, t.value_sum, t.reward, t.raw_value,
                 t.min_value, t.max_value)  # fmt: skip
    select_args = (
        t.children, t.prior, t.kind, t.visit_count, t.value_sum, t.reward, t.min_value, t.max_value,
        t.root_legal, t.scores, t.path, t.path_len, t.sel_parent, t.sel_action, t.sel_kind, batch_size,
        num_actions, num_actions, pb_c_base, pb_c_init, discount, value_delta_max, True, 0,
        puct.UNVISITED_MIN, puct.Q_TREE_MIN_MAX,
    )  # fmt: skip
    backup_args = (t.path, t.path_len, t.sel_parent, t.sel_action, t.sel_kind, t.leaf_reward, t.leaf_value,
                   t.leaf_logits)  # fmt: skip
    select_ns = 0
    backup_ns = 0
    clock = CLOCK_NS
    for _ in range(repeats):
        t.root_noise[:batch_size] = rng.standard_gamma(0.3, size=(batch_size, num_actions))
        kernels.prepare_roots(
            *tree_args, t.root_legal, t.root_logits, t.root_noise, t.root_value, batch_size,
            num_simulations + 1, num_actions, True, 0.25,
        )  # fmt: skip
        for sim in range(num_simulations):
            # Staging is not kernel work: do it before the timed calls (outputs do not depend on the choice).
            t.leaf_reward[:batch_size] = reward[sim]
            t.leaf_value[:batch_size] = value[sim]
            t.leaf_logits[:batch_size] = logits[sim]
            t0 = clock()
            puct.select_leaves(*select_args)
            t1 = clock()
            kernels.expand_and_backup(
                *tree_args, *backup_args, sim + 1, batch_size, num_actions, num_actions, discount
            )
            t2 = clock()
            select_ns += t1 - t0
            backup_ns += t2 - t1
    per_sim_tree = 1e-3 / (repeats * num_simulations * batch_size)  # ns -> us, per simulation per tree
    return select_ns * per_sim_tree, backup_ns * per_sim_tree


def time_full_run(
    *,
    batch_size: int,
    num_actions: int,
    num_simulations: int,
    repeats: int,
    rng: np.random.Generator,
    search=None,
    legal=None,
) -> float:
    """Return microseconds per simulation per tree of ``search.run()`` (default: ``MuZeroSearch``) with a
    zero-cost recurrent_fn (returns precomputed outputs of width ``num_actions`` -- the policy's parameters
    -- and its input latent), i.e. kernels + Python driver + latent gather/copy."""
    reward, value, logits = _random_network_outputs(
        rng, batch_size=batch_size, num_actions=num_actions, num_simulations=num_simulations
    )
    step = [0]

    def recurrent_fn(latent: torch.Tensor, actions: np.ndarray):
        i = step[0] % num_simulations
        step[0] += 1
        return latent, reward[i], value[i], logits[i]

    if search is None:
        search = MuZeroSearch(num_actions=num_actions, num_simulations=num_simulations)
    root_latent = torch.zeros(batch_size, LATENT_SIZE)
    root_logits = rng.normal(size=(batch_size, num_actions)).astype(np.float32)
    if legal is None:
        legal = np.ones((batch_size, num_actions), dtype=bool)
    root_value = rng.normal(size=batch_size).astype(np.float32)
    run_rng = np.random.default_rng(0)

    def run_once() -> None:
        search.run(
            root_latent=root_latent,
            root_policy_logits=root_logits,
            legal_mask=legal,
            recurrent_fn=recurrent_fn,
            add_noise=True,
            deterministic=False,
            rng=run_rng,
            root_value=root_value,
        )

    run_once()  # warm-up: buffer allocation
    t0 = CLOCK_NS()
    for _ in range(repeats):
        run_once()
    return (CLOCK_NS() - t0) * 1e-3 / (repeats * num_simulations * batch_size)


def section_kernels(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(args.seed)
    rows = []
    for num_actions in args.num_actions:
        for batch_size in args.batch_sizes:
            cfg = dict(batch_size=batch_size, num_actions=num_actions, num_simulations=args.num_simulations)
            select_us, backup_us = time_kernels(repeats=args.repeats, rng=rng, **cfg)
            run_us = time_full_run(repeats=max(args.repeats // 4, 1), rng=rng, **cfg)
            rows.append(
                [
                    batch_size,
                    num_actions,
                    args.num_simulations,
                    select_us,
                    backup_us,
                    select_us + backup_us,
                    run_us,
                    run_us * batch_size,
                ]
            )
    print_table(
        "Tree work per simulation, network excluded (us = microseconds; kernel timings with deterministic "
        "ties, run() with root noise + random ties and a zero-cost recurrent_fn)",
        [
            "B",
            "A",
            "sims",
            "select us/sim/tree",
            "expand+backup us/sim/tree",
            "kernels us/sim/tree",
            "run() us/sim/tree",
            "run() us/sim (batch)",
        ],
        rows,
    )


_COMPILE_PROBE = """
import time
t0 = time.perf_counter()
import numpy as np, torch
from muzero_tune.mcts import MuZeroSearch
t1 = time.perf_counter()
zero = np.zeros(1, np.float32)
MuZeroSearch(num_actions=2, num_simulations=2).run(
    root_latent=torch.zeros(1, 1), root_policy_logits=np.zeros((1, 2), np.float32),
    legal_mask=np.ones((1, 2), bool), add_noise=True, deterministic=False, rng=np.random.default_rng(0),
    root_value=zero,
    recurrent_fn=lambda z, a: (z, zero, zero, np.zeros((1, 2), np.float32)))
print(time.perf_counter() - t1)
"""


def section_compile(args: argparse.Namespace) -> None:
    if args.skip_compile_timing:
        return
    rows = []
    with tempfile.TemporaryDirectory() as cache_dir:  # private cache: "cold" really is cold
        env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
        for label in ("cold (empty cache)", "cached (on-disk)"):
            out = subprocess.run(
                [sys.executable, "-c", _COMPILE_PROBE], env=env, check=True, capture_output=True, text=True
            )
            rows.append([label, float(out.stdout.strip().splitlines()[-1])])
    print_table("numba compile time: first run() in a fresh process", ["cache", "seconds"], rows)


def section_sampled(args: argparse.Namespace) -> None:
    """Sampled search (K samples per node; continuous D = 1, and discrete K of A = 2K) against MuZero's at
    A = K, whole run() with a zero-cost recurrent_fn, side by side."""
    rng = np.random.default_rng(args.seed)
    k, sims, rows = args.num_samples, args.num_simulations, []
    for batch_size in args.batch_sizes:
        reps = max(args.repeats // 4, 1)
        muzero = time_full_run(
            batch_size=batch_size, num_actions=k, num_simulations=sims, repeats=reps, rng=rng
        )
        cont = SampledSearch(num_samples=k, action_kind="continuous", action_dim=1, num_simulations=sims)
        cont_us = time_full_run(batch_size=batch_size, num_actions=2, num_simulations=sims, repeats=reps,
                                rng=rng, search=cont, legal=np.ones((batch_size, 0), bool))  # fmt: skip
        disc = SampledSearch(num_samples=k, action_kind="discrete", num_actions=2 * k, num_simulations=sims)
        disc_us = time_full_run(batch_size=batch_size, num_actions=2 * k, num_simulations=sims, repeats=reps,
                                rng=rng, search=disc)  # fmt: skip
        rows.append([batch_size, k, sims, muzero, cont_us, cont_us / muzero, disc_us, disc_us / muzero])
    print_table(
        f"Sampled search vs MuZero's at A = K = {k}: run() us/sim/tree, network excluded",
        ["B", "K", "sims", "muzero A=K", "sampled cont D=1", "ratio", f"sampled disc A={2 * k}", "ratio"],
        rows,
    )


# Sections run in order; later benchmark parts (e.g. search vs network per collect step) append theirs here.
def time_collect_step(
    preset: str, *, repeats: int, overrides: dict | None = None
) -> tuple[float, float, float, float, int, int]:
    """One collect step of a preset's real policy and network: (total ms, root ms, search network ms,
    forward ms, batch, simulations).

    The network is timed where the search calls it: the policy's root ``initial_inference`` (root ms) and
    every network function it hands to ``Search.run`` (recurrent ms: the ``*_fn`` arguments, the recurrent
    call the search makes per simulation, traced twin and the decoding of its outputs into numpy included).
    ``forward ms`` is the torch part of the recurrent calls alone (``recurrent_outputs``, traced or eager,
    where the policy's module calls it; decode ms = recurrent - forward). Search time = total - root -
    recurrent. Wrapping ``model.recurrent_inference`` instead
    would miss the traced twin, which calls the graph, not that method.
    """
    import sys

    from muzero_tune.config import make_config
    from muzero_tune.pipeline.core import make_policy

    cfg = make_config(preset, overrides=overrides or {})
    policy, spec = make_policy(cfg)
    model = policy.build_model().eval()
    spent = {"root": 0.0, "network": 0.0, "forward": 0.0}

    clock = CLOCK_NS  # ``--clock``: wall or this thread's CPU time, as for the tree work

    def timed(fn, slot: str):
        def wrapper(*a, **k):
            t0 = clock()
            out = fn(*a, **k)
            spent[slot] += (clock() - t0) * 1e-9
            return out

        return wrapper

    model.initial_inference = timed(model.initial_inference, "root")
    search_run = policy.search.run

    def run_with_timed_network(*a, **kw):  # every network function the policy hands to Search.run
        kw = {k: timed(v, "network") if k.endswith("_fn") and callable(v) else v for k, v in kw.items()}
        return search_run(*a, **kw)

    policy.search.run = run_with_timed_network
    policy_module = sys.modules[type(policy).recurrent_fn.__module__]
    forward = getattr(policy_module, "recurrent_outputs", None)
    if forward is not None:  # restored below: the module global is shared by every policy of that module
        policy_module.recurrent_outputs = timed(forward, "forward")
    try:
        batch = cfg.env.collector_env_num
        rng = np.random.default_rng(0)
        dtype = np.uint8 if spec.frame_dtype == "uint8" else np.float32
        obs = (rng.random((batch, *spec.obs_shape)) * (255 if dtype == np.uint8 else 1)).astype(dtype)
        mask = np.ones((batch, spec.num_actions), dtype=bool)
        policy.act(model, obs, mask, explore=True, temperature=1.0, rng=rng)  # warm-up (and the trace)
        spent.update(root=0.0, network=0.0, forward=0.0)
        t0 = clock()
        for _ in range(repeats):
            policy.act(model, obs, mask, explore=True, temperature=1.0, rng=rng)
        total = (clock() - t0) * 1e-9 / repeats
    finally:
        if forward is not None:
            policy_module.recurrent_outputs = forward
    ms = 1e3 / repeats
    return (1e3 * total, ms * spent["root"], ms * spent["network"], ms * spent["forward"], batch,
            cfg.mcts.num_simulations)  # fmt: skip


def section_collect_step(args: argparse.Namespace) -> None:
    rows = []
    cases = [("cartpole_muzero", {}, max(5, args.repeats // 4))]
    if not args.skip_pong:
        cases.append(("pong_muzero", {"mcts.num_simulations": 50}, 3))
    for preset, overrides, reps in cases:
        total, root, net, fwd, batch, sims = time_collect_step(preset, repeats=reps, overrides=overrides)
        search = total - root - net
        rows.append(
            (preset, batch, sims, f"{total:.2f}", f"{root:.2f}", f"{net:.2f}", f"{fwd:.2f}",
             f"{net - fwd:.2f}", f"{search:.2f}", f"{search / total:.1%}")
        )  # fmt: skip
    print_table(
        "one collect step (policy.act on the preset's env batch): search vs network as the search calls it "
        "(root: initial_inference; recurrent: the per-simulation recurrent_fn = torch forward + decoding)",
        [
            "preset",
            "B",
            "sims",
            "total ms",
            "root ms",
            "recurrent ms",
            "forward ms",
            "decode ms",
            "search ms",
            "search share",
        ],  # fmt: skip
        rows,
    )


def load_reference_tree():
    """LightZero's compiled MuZero tree (``lzero/mcts/ctree/ctree_muzero/mz_tree*.so``), loaded from its file
    so that LightZero's package imports (DI-engine, ...) are not needed; None when LightZero is absent.
    Install it for this section only: ``pip install --no-deps LightZero==0.2.0``."""
    import glob
    import importlib.util

    spec = importlib.util.find_spec("lzero")
    if spec is None or not spec.submodule_search_locations:
        return None
    pattern = os.path.join(spec.submodule_search_locations[0], "mcts", "ctree", "ctree_muzero", "mz_tree*.so")
    found = glob.glob(pattern)
    if not found:
        return None
    tree_spec = importlib.util.spec_from_file_location("mz_tree", found[0])
    module = importlib.util.module_from_spec(tree_spec)
    tree_spec.loader.exec_module(module)
    return module


def time_reference_run(
    mz_tree,
    *,
    batch_size: int,
    num_actions: int,
    num_simulations: int,
    repeats: int,
    rng: np.random.Generator,
) -> tuple[float, float]:
    """Microseconds per simulation per tree of the reference's search as its collect path drives it (and of
    its two C++ calls alone, ``batch_traverse`` and ``batch_backpropagate``): root
    noise drawn per root, ``Roots`` + ``prepare``, then per simulation ``batch_traverse``, the leaf latents
    gathered from its per-simulation list, the zero-cost network's outputs (precomputed tensors, like
    :func:`time_full_run`'s) turned into numpy and lists, ``batch_backpropagate``; finally the visit
    distributions and root values read out. The same constants as ``MuZeroSearch``'s defaults."""
    reward, value, logits = _random_network_outputs(
        rng, batch_size=batch_size, num_actions=num_actions, num_simulations=num_simulations
    )
    reward_t, value_t, logits_t = (torch.from_numpy(x) for x in (reward, value, logits))
    root_latent = np.zeros((batch_size, LATENT_SIZE), dtype=np.float32)
    root_logits = rng.normal(size=(batch_size, num_actions)).astype(np.float32).tolist()
    legal = [list(range(num_actions)) for _ in range(batch_size)]
    to_play = [-1] * batch_size
    noise_rng = np.random.default_rng(0)
    in_tree_ns = [0]

    def run_once() -> None:
        noises = [
            noise_rng.dirichlet([0.3] * num_actions).astype(np.float32).tolist() for _ in range(batch_size)
        ]
        roots = mz_tree.Roots(batch_size, legal)
        roots.prepare(0.25, noises, [0.0] * batch_size, root_logits, to_play)
        min_max = mz_tree.MinMaxStatsList(batch_size)
        min_max.set_delta(0.01)
        path = [root_latent]
        for sim in range(num_simulations):
            results = mz_tree.ResultsWrapper(num=batch_size)
            t0 = CLOCK_NS()
            ix, iy, last_actions, virtual_to_play = mz_tree.batch_traverse(
                roots, 19652, 1.25, 0.997, min_max, results, to_play
            )
            in_tree_ns[0] += CLOCK_NS() - t0
            latents = torch.from_numpy(np.asarray([path[i][j] for i, j in zip(ix, iy)]))
            actions = torch.from_numpy(np.asarray(last_actions)).long()
            del actions  # the network's input; the zero-cost network ignores it
            out_latent, out_reward, out_value, out_logits = (
                t.detach().cpu().numpy() for t in (latents, reward_t[sim], value_t[sim], logits_t[sim])
            )
            path.append(out_latent)
            rewards, values = out_reward.reshape(-1).tolist(), out_value.reshape(-1).tolist()
            priors = out_logits.tolist()
            t0 = CLOCK_NS()
            mz_tree.batch_backpropagate(
                sim + 1, 0.997, rewards, values, priors, min_max, results, virtual_to_play
            )
            in_tree_ns[0] += CLOCK_NS() - t0
        roots.get_distributions()
        roots.get_values()

    run_once()
    in_tree_ns[0] = 0
    t0 = CLOCK_NS()
    for _ in range(repeats):
        run_once()
    per_sim_tree = 1e-3 / (repeats * num_simulations * batch_size)  # ns -> us
    return (CLOCK_NS() - t0) * per_sim_tree, in_tree_ns[0] * per_sim_tree


def section_reference(args: argparse.Namespace) -> None:
    """This search's ``run()`` against the reference's C++ tree with its Python glue, interleaved rounds."""
    mz_tree = load_reference_tree()
    if mz_tree is None:
        print("\n## Reference tree: skipped (no LightZero here; pip install --no-deps LightZero==0.2.0)")
        return
    rng = np.random.default_rng(args.seed)
    rounds, reps = 5, max(args.repeats // 8, 1)
    rows = []
    for num_actions in args.num_actions:
        for batch_size in args.batch_sizes:
            cfg = dict(batch_size=batch_size, num_actions=num_actions, num_simulations=args.num_simulations)
            ours, ref, ref_tree = [], [], []
            for _ in range(rounds):
                ours.append(time_full_run(repeats=reps, rng=rng, **cfg))
                whole, in_tree = time_reference_run(mz_tree, repeats=reps, rng=rng, **cfg)
                ref.append(whole)
                ref_tree.append(in_tree)
            ratio = np.asarray(ref) / np.asarray(ours)
            rows.append([
                batch_size, num_actions, args.num_simulations, float(np.median(ours)), float(np.median(ref)),
                float(np.median(ref_tree)), f"{np.median(ratio):.2f} [{ratio.min():.2f}, {ratio.max():.2f}]",
            ])  # fmt: skip
    print_table(
        f"run() against the reference's C++ tree and Python glue (LightZero 0.2.0 mz_tree), no network, "
        f"medians of {rounds} interleaved rounds x {reps} searches (us per simulation per tree)",
        ["B", "A", "sims", "run() us", "reference us", "its C++ calls us", "reference / run() [min, max]"],
        rows,
    )


SECTIONS: list[Callable[[argparse.Namespace], None]] = [
    section_kernels,
    section_reference,
    section_sampled,
    section_compile,
    section_collect_step,
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 64])
    p.add_argument("--num-actions", type=int, nargs="+", default=[2, 18])
    p.add_argument("--num-simulations", type=int, default=50)
    p.add_argument("--num-samples", type=int, default=20, help="K of the sampled-search section")
    p.add_argument("--repeats", type=int, default=200, help="searches timed per configuration")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="time the tree work in wall time or in this thread's CPU time (steadier on a shared machine)",
    )
    p.add_argument("--skip-compile-timing", action="store_true", help="skip the cold/cached compile probe")
    p.add_argument("--skip-pong", action="store_true", help="collect-step section: CartPole only")
    p.add_argument(
        "--sections",
        nargs="+",
        choices=[f.__name__.removeprefix("section_") for f in SECTIONS],
        help="run only these sections (default: all)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    global CLOCK_NS
    CLOCK_NS = time.thread_time_ns if args.clock == "cpu" else time.perf_counter_ns
    torch.set_num_threads(1)
    # Compile (or load from cache) before timing anything.
    time_kernels(batch_size=1, num_actions=2, num_simulations=2, repeats=1, rng=np.random.default_rng(0))
    for section in SECTIONS:
        if args.sections is None or section.__name__.removeprefix("section_") in args.sections:
            section(args)


if __name__ == "__main__":
    main()
