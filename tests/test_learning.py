"""It learns: CartPole-v1 MuZero reaches eval reward_mean >= 195 over 8 episodes within 30k env steps.

Slow (about a minute per seed on 2 cores): run with ``python -m pytest -m slow``.
"""

from __future__ import annotations

import pytest

from muzero_tune.config import make_config
from muzero_tune.pipeline.reporter import MemoryReporter
from muzero_tune.pipeline.sync_driver import train_muzero_segment


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cartpole_muzero_solves(seed, tmp_path):
    cfg = make_config(
        "cartpole_muzero",
        overrides={"seed": seed, "logging.output_dir": str(tmp_path), "logging.quiet": True},
    )
    rep = MemoryReporter()
    summary = train_muzero_segment(cfg, reporter=rep)
    assert summary.stop_reason == "stop_value", rep.evals
    solved = rep.evals[-1]
    assert solved["reward_mean"] >= 195.0 and solved["eval_episodes"] == 8
    assert solved["envstep"] <= 30_000 and solved["wall_s"] <= 600
