"""Run a sweep in its own process with its own Ray (the restore test SIGKILLs it mid-run), or resume one.

``python tests/tune_helpers/sweep_proc.py '<json>'`` with keys ``space``, ``name``, ``overrides``,
``num_cpus``, ``max_concurrent`` and ``grid`` (``{key: [values]}``, each a ``tune.grid_search`` added to the
space's ``param_space``).

``python tests/tune_helpers/sweep_proc.py resume PATH NUM_CPUS``: imports the command line and starts the
local Ray that ``muzero-tune resume PATH --num-cpus NUM_CPUS`` starts (``start_or_join``) at once, prints
``ready``, then waits for a line on stdin before it runs that command (``muzero_tune.cli.main``, which finds
its Ray started); its exit status is the command's. Until then it reads nothing of the sweep.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    if argv[1] == "resume":
        return resume(argv[2], int(argv[3]))
    args = json.loads(argv[1])
    from ray import tune

    from muzero_tune.tune.sweep import run_sweep

    res = run_sweep(
        args["space"], overrides=args["overrides"], name=args["name"], num_cpus=args["num_cpus"],
        max_concurrent=args["max_concurrent"],
        param_space_extra={k: tune.grid_search(v) for k, v in args.get("grid", {}).items()},
    )
    return 1 if res.results.errors else 0


def resume(path: str, num_cpus: int) -> int:
    import muzero_tune.tune.sweep  # noqa: F401  (what the command imports: Ray Tune, the trainable)
    from muzero_tune.cli import main as cli_main
    from muzero_tune.distributed.cluster import start_or_join

    start_or_join(num_cpus=num_cpus)
    print("ready", flush=True)
    sys.stdin.readline()
    return cli_main(["resume", path, "--num-cpus", str(num_cpus)])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
