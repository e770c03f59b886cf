"""Train budgets in the drivers: the replay_ratio remainder carried across collects (and checkpoints), and
buffer reanalyze calls per budget, in :class:`DriverCore` and in short sync / async runs."""

from __future__ import annotations

import io
import math

import torch

from muzero_tune.config import make_config
from muzero_tune.pipeline.core import DriverCore
from muzero_tune.pipeline.messages import CollectResult
from muzero_tune.pipeline.sync_driver import train_muzero_segment
from muzero_tune.runs.checkpoint import to_torch_tree
from muzero_tune.runs.reporter import MemoryReporter

SMALL = {
    "model.hidden_dim": 32, "model.latent_dim": 16, "mcts.num_simulations": 2, "learn.batch_size": 32,
    "env.collector_env_num": 4, "env.evaluator_env_num": 2, "eval.n_episodes": 1, "eval.eval_freq": 10_000,
    "replay.game_segment_length": 10, "stop_value": None, "logging.quiet": True,
}


def _core(**overrides) -> DriverCore:
    cfg = make_config("cartpole_muzero", overrides={**SMALL, **overrides})
    return DriverCore(cfg, MemoryReporter())


def _collected(real_transitions: int) -> CollectResult:
    """A collect result that counts ``real_transitions`` (its segments are not needed for the budget)."""
    return CollectResult(
        segments=(), envstep_delta=real_transitions, real_transitions=real_transitions, policy_version=0,
        episode_returns=(), episode_lengths=(), duration_s=0.0, search_s=0.0,
    )


def test_replay_ratio_remainder_is_carried_across_collects():
    core = _core(**{"learn.replay_ratio": 0.1})
    budgets = [core.push_collect(_collected(15)) for _ in range(101)]
    assert budgets[:4] == [1, 2, 1, 2]  # 1.5 steps per collect on average, never 1 each
    assert sum(budgets) == math.floor(0.1 * 15 * 101) == 151
    assert core.counters.replay_ratio_carry == 0.5


def test_replay_ratio_remainder_survives_a_checkpoint_round_trip():
    core = _core(**{"learn.replay_ratio": 0.1})
    assert [core.push_collect(_collected(15)) for _ in range(3)] == [1, 2, 1]  # 0.5 step owed
    buf = io.BytesIO()
    torch.save(to_torch_tree({"resume": core.resume_state(include_buffer=False)}), buf)  # as checkpoints do
    buf.seek(0)
    state = torch.load(buf, weights_only=True)["resume"]  # what load_checkpoint returns
    resumed = _core(**{"learn.replay_ratio": 0.1})
    resumed.load_resume_state(state)
    assert resumed.counters.replay_ratio_carry == 0.5
    assert resumed.push_collect(_collected(15)) == 2  # a fresh core owes 1
    assert _core(**{"learn.replay_ratio": 0.1}).push_collect(_collected(15)) == 1


def test_sync_run_trains_exactly_the_carried_budgets_and_reanalyzes_freq_times_each(tmp_path):
    """4 envs x 10-step segments at ratio 0.02: most collects owe 0 or 1 steps. Every collect after warm-up
    trains exactly its budget (0 included) and runs buffer_reanalyze_freq=2 reanalyze calls."""
    cfg = make_config("cartpole_muzero", overrides={
        **SMALL, "learn.replay_ratio": 0.02, "replay.buffer_reanalyze_freq": 2,
        "replay.reanalyze_batch_size": 4, "max_envstep": 600, "logging.output_dir": str(tmp_path),
        "exp_name": "budget",
    })
    reporter = MemoryReporter()
    summary = train_muzero_segment(cfg, reporter=reporter)
    rows = [r for r in reporter.progress if r.get("pipeline") == "sync"]  # one per collect
    trained = [b["train_iter"] - a["train_iter"] for a, b in zip(rows, rows[1:])]
    pushed = [b["buffer/transitions"] - a["buffer/transitions"] for a, b in zip(rows, rows[1:])]
    assert rows[-1]["train_epoch"] >= 10 and summary.train_iter > 0
    assert 0 in trained  # zero-step budgets happen and train nothing (was: at least 1 step per collect)
    # after warm-up, the long-run ratio is the configured one: steps = floor(0.02 x transitions) up to the
    # carry (< 1 step) at either end
    first = next(i for i, r in enumerate(rows) if r["train_epoch"] > 0)
    steps, transitions = sum(trained[first:]), sum(pushed[first:])
    assert abs(steps - 0.02 * transitions) < 1.0
    assert rows[-1]["buffer/reanalyze_calls"] == 2 * rows[-1]["train_epoch"]
