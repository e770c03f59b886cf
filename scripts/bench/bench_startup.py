"""Start-up of a run in a fresh process: seconds from the ``train()`` call to the end of its first train step,
and the same with the package's imports before it, for the sync and the async pipeline, in alternating rounds
(a fresh Python process each, as a CLI run or a Tune trial's worker gets; Ray is started before the clock, as
a sweep's cluster is).

What it counts: the driver's imports and learner build, the actors' boot (async), the first collects and
the first train steps. A short sweep trial pays it once per trial.

    python scripts/bench/bench_startup.py                 # CartPole MuZero, 4 rounds
    python scripts/bench/bench_startup.py --rounds 2 --preset cartpole_efficientzero
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

CHILD = r"""
import json, os, sys, time
pipeline, preset, out_dir = sys.argv[1:4]
if pipeline == "async":
    import ray
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    time.sleep(5)  # a warm cluster, as a sweep's: Ray's own worker processes are up
T_IMPORT = time.monotonic()  # the package's imports, torch's among them
from muzero_tune.config import make_config
from muzero_tune.pipeline.core import DriverCore
from muzero_tune.runs.reporter import MemoryReporter
from muzero_tune.api import train
IMPORTS_S = time.monotonic() - T_IMPORT

first = []
train_step = DriverCore.train_step

def timed_train_step(self, *args, **kwargs):
    out = train_step(self, *args, **kwargs)
    if not first:
        first.append(time.monotonic() - T0)
    return out

DriverCore.train_step = timed_train_step
cfg = make_config(preset, overrides={
    "logging.quiet": True, "logging.output_dir": out_dir, "exp_name": pipeline, "max_envstep": 1500,
    "stop_value": None, "policy.async_pipeline.enabled": pipeline == "async",
})
T0 = time.monotonic()
train(cfg, reporter=MemoryReporter())
print(json.dumps({"first_train_s": first[0], "imports_s": IMPORTS_S}))
"""


def one_run(pipeline: str, preset: str) -> tuple[float, float]:
    """(seconds from train() to the end of the first train step, the package's imports' seconds)."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    with tempfile.TemporaryDirectory() as out_dir:
        res = subprocess.run(
            [sys.executable, "-c", CHILD, pipeline, preset, out_dir], capture_output=True, text=True, env=env,
            timeout=600,
        )  # fmt: skip
    if res.returncode != 0:
        raise RuntimeError(f"{pipeline} run failed:\n{res.stderr[-3000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    return float(out["first_train_s"]), float(out["imports_s"])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="cartpole_muzero")
    p.add_argument("--rounds", type=int, default=4, help="alternating sync, async rounds")
    args = p.parse_args(argv)
    runs: dict[str, list[tuple[float, float]]] = {"sync": [], "async": []}
    for _ in range(args.rounds):
        for pipeline in runs:
            runs[pipeline].append(one_run(pipeline, args.preset))
    print(f"preset={args.preset}: seconds from train() to the end of the first train step (and from before "
          f"the package's imports), fresh process each, {args.rounds} alternating rounds")  # fmt: skip
    for pipeline, pairs in runs.items():
        for label, t in (("", [a for a, _ in pairs]), (" +imports", [a + b for a, b in pairs])):
            each = " / ".join(f"{x:.2f}" for x in t)
            name = f"{pipeline}{label}"
            print(f"  {name:>14}: median {np.median(t):.2f} s (min {min(t):.2f}, max {max(t):.2f}; {each})")


if __name__ == "__main__":
    main()
