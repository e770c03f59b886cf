"""Plot sync-vs-async comparisons from an MLflow store (same as ``muzero-tune compare``).

Writes the PNGs and ``summary.csv`` to ``--out``, logs them (and ``summary.json``) to a run of the experiment
``<experiment>_compare``, and prints the URL of the trials' chart view grouped by pipeline (``--ui-url``).

    python scripts/compare_mlflow.py --experiment quickstart_cartpole_muzero \
        --tracking-uri sqlite:///$PWD/runs/tune/mlflow.db --out runs/compare
"""

from __future__ import annotations

import sys

from muzero_tune.cli import main

if __name__ == "__main__":
    sys.exit(main(["compare", *sys.argv[1:]]))
