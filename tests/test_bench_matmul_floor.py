"""scripts/bench/bench_learner_variants.py --matmul-floor: the products a real train step records, their
FLOP count, and their replay."""

from __future__ import annotations

import os
import sys

import torch

BENCH_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "bench")
sys.path.insert(0, BENCH_DIR)
import bench_learner_variants as blv  # noqa: E402  (benchmark code, not part of the package)
from bench_common import filled_core  # noqa: E402

SMALL = {
    "logging.quiet": True, "learn.batch_size": 16, "mcts.num_simulations": 4, "model.hidden_dim": 24,
    "model.latent_dim": 12, "model.value_support_size": 5, "model.reward_support_size": 3,
    "replay.num_unroll_steps": 2,
}  # fmt: skip


def test_matmul_flops_counts_two_per_multiply_add():
    assert blv.matmul_flops("aten::mm", [[4, 3], [3, 5]]) == 2 * 4 * 3 * 5
    assert blv.matmul_flops("aten::addmm", [[5], [4, 3], [3, 5]]) == 2 * 4 * 3 * 5
    assert blv.matmul_flops("aten::bmm", [[2, 4, 3], [2, 3, 5]]) == 2 * 2 * 4 * 3 * 5
    assert blv.matmul_flops("aten::baddbmm", [[2, 4, 5], [2, 4, 3], [2, 3, 5]]) == 2 * 2 * 4 * 3 * 5


def test_a_train_steps_matmuls_are_recorded_with_their_shapes_and_replay():
    """The step's forward products are there with the batch's rows (the first representation layer takes
    [B, 4] observations to the hidden width), as are the backward's, which outnumber them."""
    core = filled_core("cartpole_muzero", SMALL, min_transitions=100)
    core.train_step()
    calls = blv.recorded_matmuls(core, 2)
    batch, hidden = SMALL["learn.batch_size"], SMALL["model.hidden_dim"]
    assert ("aten::addmm", [[hidden], [batch, 4], [4, hidden], [], []]) in calls  # bias, x, W^T, beta, alpha
    forward = sum(name == "aten::addmm" for name, _ in calls)
    assert len(calls) - forward > forward  # each layer's input and weight gradients
    assert len(calls) % 2 == 0  # two steps, the same products each
    assert blv.timed_matmuls(calls, torch.float32, repeats=1) > 0
