"""Devices: CPU-only machines resolve to CPU with no error; an explicit CUDA without one is a clear error.

The CUDA tests run only where a GPU is present (scripts/tools/device_check.sh runs them on a GPU machine).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from muzero_tune.config import ConfigError, make_config
from muzero_tune.pipeline.collector import fill_replay
from muzero_tune.pipeline.core import DriverCore
from muzero_tune.pipeline.learner import cpu_has_native_bf16, resolve_device
from muzero_tune.replay.random_rollout import random_segments
from muzero_tune.runs.reporter import MemoryReporter

HAS_CUDA = torch.cuda.is_available()
TINY = {"model.hidden_dim": 32, "model.latent_dim": 16, "mcts.num_simulations": 4, "learn.batch_size": 16}


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU-only behaviour")
def test_cpu_only_machine_resolves_auto_and_rejects_cuda():
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    for name in ("cuda", "cuda:0", "cuda:3"):
        with pytest.raises(ConfigError) as err:
            resolve_device(name)
        assert "learn.device" in str(err.value) and name in str(err.value) and "cpu or auto" in str(err.value)
    cfg = make_config(
        "cartpole_muzero", overrides={**TINY, "learn.device": "auto", "learn.mixed_precision": True}
    )
    core = DriverCore(cfg, MemoryReporter())
    # mixed precision on a CPU: bf16 where the CPU runs it natively, fp32 elsewhere (with a ConfigWarning)
    expected = torch.bfloat16 if cpu_has_native_bf16() else None
    assert core.learner.device.type == "cpu" and core.learner.autocast_dtype == expected


def _trained_core(device: str, **extra) -> DriverCore:
    cfg = make_config("cartpole_muzero", overrides={**TINY, "learn.device": device, **extra})
    core = DriverCore(cfg, MemoryReporter())
    core.buffer.push(
        random_segments("CartPole-v1", steps=400, frame_stack=1, segment_length=50, pad_length=15)
    )
    for _ in range(3):
        out = core.train_step()
    assert out.priorities.shape == (16,) and np.all(np.isfinite(out.priorities))
    return core


def test_snapshots_are_cpu_tensors():
    core = _trained_core("auto")
    snap = core.learner.weights_snapshot()
    assert all(v.device.type == "cpu" for v in snap.values())
    # a copy: training on does not change the published snapshot
    before = {k: v.clone() for k, v in snap.items()}
    core.train_step()
    assert all(torch.equal(before[k], snap[k]) for k in snap)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("amp", [False, True])
def test_cuda_learner_and_search(amp):
    core = _trained_core("cuda", **{"learn.mixed_precision": amp})
    assert core.learner.device.type == "cuda"
    assert next(core.learner.model.parameters()).is_cuda
    obs = np.zeros((8, 4), np.float32)
    act = core.policy.act(
        core.learner.model,
        obs,
        np.ones((8, 2), bool),
        explore=True,
        temperature=1.0,
        rng=np.random.default_rng(0),
    )
    assert act.actions.shape == (8,)


# a CUDA learner's compiled loss (Inductor's generated GPU kernels) against its eager loss, four SGD steps on
# the same batches: they sum in another order, so the weights agree within these (fp32; under bf16 autocast
# both round every matmul input to 8 bits of mantissa, but not at the same places)
CUDA_COMPILE_ATOL = {False: 1e-4, True: 2e-2}


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("amp", [False, True])
def test_a_compiled_loss_on_cuda_trains_as_the_eager_one(amp):
    """``learn.compile`` on a CUDA learner: the loss compiles (no fallback), its compile time is reported,
    and the weights after four SGD steps equal the eager learner's within the tolerance."""
    over = {"learn.mixed_precision": amp, "learn.optimizer": "sgd", "learn.learning_rate": 0.05}
    eager = _trained_core("cuda", **over, **{"learn.compile": "off"})  # three steps
    compiled = _trained_core("cuda", **over, **{"learn.compile": "default"})
    assert compiled.learner.compiled_loss.compiled, compiled.learner.compiled_loss.fallback_reason
    a, b = eager.train_step(), compiled.train_step()
    assert b.metrics["train/compile_s"] > 0 and "train/compile_s" not in a.metrics
    assert b.metrics["train/loss_total"] == pytest.approx(a.metrics["train/loss_total"], rel=1e-2)
    ours = compiled.learner.model.state_dict()
    for key, ref in eager.learner.model.state_dict().items():
        torch.testing.assert_close(ours[key], ref, atol=CUDA_COMPILE_ATOL[amp], rtol=0,
                                   msg=lambda m, k=key: f"{k}: {m}")  # fmt: skip


# one preset per policy type (continuous control for the sampled types: their tanh-Gaussian loss)
PRESET_PER_TYPE = [
    "cartpole_muzero",
    "cartpole_efficientzero",
    "cartpole_gumbel_muzero",
    "cartpole_stochastic_muzero",
    "cartpole_muzero_context",
    "cartpole_muzero_rnn_full_obs",
    "pendulum_sampled_muzero",
    "pendulum_sampled_efficientzero",
    "cartpole_unizero",
    "pendulum_sampled_unizero",
]


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="this CPU has no native bf16")
@pytest.mark.parametrize("preset", PRESET_PER_TYPE)
def test_every_policy_type_trains_under_cpu_mixed_precision(preset):
    """``learn.mixed_precision`` on a CPU with native bf16, every policy type: a few train steps on collected
    data give finite losses and priorities, and the weights stay fp32 and finite."""
    cfg = make_config(
        preset,
        overrides={"learn.mixed_precision": True, "learn.batch_size": 16, "mcts.num_simulations": 2},
    )
    core = DriverCore(cfg, MemoryReporter())
    assert core.learner.autocast_dtype == torch.bfloat16
    fill_replay(core, 200)
    for _ in range(5):
        out = core.train_step()
        assert np.isfinite(out.metrics["train/loss_total"]) and np.all(np.isfinite(out.priorities))
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in core.learner.model.parameters())
