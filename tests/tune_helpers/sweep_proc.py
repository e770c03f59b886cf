"""Run a sweep in its own process with its own Ray (the restore test SIGKILLs it mid-run).

``python tests/tune_helpers/sweep_proc.py '<json>'`` with keys ``space``, ``name``, ``overrides``,
``num_cpus``, ``max_concurrent`` and ``grid`` (``{key: [values]}``, each a ``tune.grid_search`` added to the
space's ``param_space``).
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    args = json.loads(argv[1])
    from ray import tune

    from muzero_tune.tune.sweep import run_sweep

    res = run_sweep(
        args["space"], overrides=args["overrides"], name=args["name"], num_cpus=args["num_cpus"],
        max_concurrent=args["max_concurrent"],
        param_space_extra={k: tune.grid_search(v) for k, v in args.get("grid", {}).items()},
    )
    return 1 if res.results.errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
