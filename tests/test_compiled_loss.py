"""``learn.compile``: the compiled loss trains as the eager one does, within float rounding, and a loss that
cannot compile warns once and runs eager with the eager results."""

from __future__ import annotations

import dataclasses
import shutil
import warnings

import numpy as np
import pytest
import torch

from muzero_tune.config import ConfigWarning, make_config
from muzero_tune.pipeline.collector import fill_replay
from muzero_tune.pipeline.compiled_loss import tensor_batch
from muzero_tune.pipeline.core import DriverCore
from muzero_tune.policies.registry import POLICY_CLASSES
from muzero_tune.replay.targets import resolve_bootstrap
from muzero_tune.runs.reporter import MemoryReporter

# a small network, so a compile takes seconds; the batch shape is the one every step has. SGD: a weight's
# change follows its gradient's, where Adam's normalisation turns a gradient at rounding level into a step
# of about the learning rate whose sign is the rounding's
TINY = {
    "logging.quiet": True, "learn.batch_size": 32, "mcts.num_simulations": 4, "model.hidden_dim": 32,
    "model.latent_dim": 16, "model.value_support_size": 10, "model.reward_support_size": 5,
    "learn.optimizer": "sgd", "learn.learning_rate": 0.05,
}  # fmt: skip
STEPS = 3
# compiled kernels fuse and reorder float32 sums: after STEPS SGD steps the weights and the priorities
# agree with the eager step's within these
PARAM_ATOL = 1e-5
PRIORITY_ATOL = 1e-4


def _core(policy_type: str, compile_mode: str, **over) -> DriverCore:
    cfg = make_config(f"cartpole_{policy_type}", overrides={**TINY, "learn.compile": compile_mode, **over})
    core = DriverCore(cfg, MemoryReporter())
    fill_replay(core, 200)
    return core


def _compare_with_eager(policy_type: str, compile_mode: str = "default") -> tuple[DriverCore, list]:
    """STEPS train steps of an eager and a compiled driver from the same seed on the same data: the
    compiled one's weights, target network and priorities equal the eager one's within the tolerances."""
    eager, compiled = _core(policy_type, "off"), _core(policy_type, compile_mode)
    before = {k: v.clone() for k, v in compiled.learner.model.state_dict().items()}
    outs = [(eager.train_step(), compiled.train_step()) for _ in range(STEPS)]
    for a, b in outs:
        np.testing.assert_allclose(b.priorities, a.priorities, atol=PRIORITY_ATOL)
        assert b.metrics["train/loss_total"] == pytest.approx(a.metrics["train/loss_total"], abs=1e-4)
    for name in ("model", "target_model"):
        ours = dict(getattr(compiled.learner, name).state_dict())
        for key, ref in getattr(eager.learner, name).state_dict().items():
            torch.testing.assert_close(ours[key], ref, atol=PARAM_ATOL, rtol=0,
                                       msg=lambda m, n=f"{name}.{key}": f"{n}: {m}")  # fmt: skip
    moved = [k for k, p in compiled.learner.model.state_dict().items() if not torch.equal(p, before[k])]
    assert moved, "the steps changed no weight: the comparison would pass whatever the loss computed"
    return compiled, outs


def test_the_tensor_batch_holds_the_batch_as_tensors():
    core = _core("muzero", "off")
    _, batch = core.build_batch()
    resolved = resolve_bootstrap(batch)
    tb = tensor_batch(batch, torch.device("cpu"))
    assert tb.bootstrap is None and isinstance(tb.flat_index, np.ndarray)
    for f in dataclasses.fields(tb):
        value = getattr(tb, f.name)
        if isinstance(value, torch.Tensor):
            np.testing.assert_array_equal(value.numpy(), getattr(resolved, f.name), err_msg=f.name)
    assert isinstance(tb.obs, torch.Tensor) and isinstance(tb.target_value, torch.Tensor)


NEEDS_CXX = pytest.mark.skipif(
    not any(shutil.which(c) for c in ("g++", "c++", "clang++")),
    reason="Inductor's CPU kernels need a C++ compiler",
)


@NEEDS_CXX
def test_a_compiled_loss_trains_as_the_eager_one():
    """muzero's loss (which five of the types share) compiled: the same weights, target network and
    priorities within float rounding, and its compile time reported beside the step's metrics."""
    compiled, outs = _compare_with_eager("muzero")
    assert compiled.learner.compiled_loss.compiled
    assert outs[-1][1].metrics["train/compile_s"] > 0 and "train/compile_s" not in outs[-1][0].metrics


def test_a_loss_that_cannot_compile_warns_once_and_runs_eager():
    """No C++ compiler for Inductor's CPU kernels: one warning naming the error, then the eager loss, whose
    results are the eager learner's bit for bit."""
    eager = _core("muzero", "off", **{"model.hidden_dim": 24})
    no_compiler = torch._inductor.config.patch({"cpp.cxx": ("/nonexistent/c++",), "fx_graph_cache": False})
    with no_compiler, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        broken = _core("muzero", "default", **{"model.hidden_dim": 24})
        outs = [(eager.train_step(), broken.train_step()) for _ in range(STEPS)]
    said = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning) and "compile" in str(w)]
    assert len(said) == 1 and "muzero's loss does not compile" in said[0], said
    assert not broken.learner.compiled_loss.compiled
    for a, b in outs:
        np.testing.assert_array_equal(b.priorities, a.priorities)
    for key, ref in eager.learner.model.state_dict().items():
        assert torch.equal(broken.learner.model.state_dict()[key], ref), key


@NEEDS_CXX
@pytest.mark.slow
@pytest.mark.parametrize("policy_type", list(POLICY_CLASSES))
def test_every_policy_types_compiled_loss_trains_as_its_eager_one(policy_type):
    """Each type's loss under ``learn.compile=default``: compiled, or (a type whose loss does not compile)
    eager after one warning; either way the eager learner's results within float rounding."""
    _compare_with_eager(policy_type)
