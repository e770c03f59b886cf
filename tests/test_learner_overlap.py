"""The learner's helper-thread work changes no result: ``learn.helper_ssl_encodings`` (SSL target encodings on
the helper, BatchNorm statistics folded back in order) and ``learn.prefetch_next_batch`` (the next batch built
ahead, its bootstrap forward beside the backward) give the same weights, running statistics, priorities,
metrics, buffer, driver RNG and clock as the serial steps -- also when the batch built ahead must be thrown
away (a push, a buffer reanalyze, an RNG draw, a target update, a budget end, a resume in between)."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch

from muzero_tune.config import ConfigError, ConfigWarning, make_config
from muzero_tune.pipeline.collector import fill_replay
from muzero_tune.pipeline.core import DriverCore, setup_torch_threads
from muzero_tune.pipeline.ssl_offload import fold_batch_statistics, shadow_network
from muzero_tune.runs.reporter import MemoryReporter

# a small conv MuZero on Pong: BatchNorm in every stage, the SSL loss on, K = 5
PONG_TINY = {
    "logging.quiet": True,
    "model.num_channels": 8,
    "model.projection_dim": 16,
    "model.value_support_size": 10,
    "model.reward_support_size": 10,
    "learn.batch_size": 4,
    "mcts.num_simulations": 2,
    "learn.target_update_interval": 4,
    "replay.capacity_transitions": 2000,
    "learn.prefetch_next_batch": False,
    "learn.helper_ssl_encodings": 0,
}
CARTPOLE_SMALL = {
    "logging.quiet": True,
    "model.hidden_dim": 32,
    "model.latent_dim": 16,
    "learn.batch_size": 16,
    "mcts.num_simulations": 4,
    "learn.target_update_interval": 5,
    "replay.capacity_transitions": 400,  # the pushes below evict
    "learn.prefetch_next_batch": False,
}


@pytest.fixture(autouse=True)
def _one_torch_thread():
    n = torch.get_num_threads()
    setup_torch_threads()
    yield
    torch.set_num_threads(n)


def _core(preset: str, overrides: dict) -> DriverCore:
    return DriverCore(make_config(preset, overrides=overrides), MemoryReporter())


@pytest.fixture(scope="module")
def pong_state():
    """A Pong driver's resume state with 160 collected transitions (the buffer included)."""
    core = _core("pong_muzero", PONG_TINY)
    fill_replay(core, 100)
    return core.resume_state(include_buffer=True)


@pytest.fixture(scope="module")
def cartpole_state():
    core = _core("cartpole_muzero", CARTPOLE_SMALL)
    fill_replay(core, 200)
    return core.resume_state(include_buffer=True)


def _cores(preset: str, base: dict, state: dict, variants: dict[str, dict]) -> dict[str, DriverCore]:
    cores = {}
    for name, extra in variants.items():
        core = _core(preset, {**base, **extra})
        core.load_resume_state(copy.deepcopy(state))
        cores[name] = core
    return cores


def _assert_same_runs(cores: dict[str, DriverCore], outs: dict[str, list]) -> None:
    """Every driver ended where the first did, bit for bit."""
    names = list(cores)
    ref, ref_outs = cores[names[0]], outs[names[0]]
    for name in names[1:]:
        core = cores[name]
        for which in ("model", "target_model"):
            a = getattr(ref.learner, which).state_dict()
            b = getattr(core.learner, which).state_dict()
            assert a.keys() == b.keys()
            for key in a:  # running statistics and num_batches_tracked included
                assert torch.equal(a[key], b[key]), (name, which, key)
        for o_ref, o in zip(ref_outs, outs[name], strict=True):
            np.testing.assert_array_equal(o.priorities, o_ref.priorities)
            assert o.metrics == o_ref.metrics, name
        np.testing.assert_array_equal(core.buffer.priorities, ref.buffer.priorities)
        assert core.rng.bit_generator.state == ref.rng.bit_generator.state, name
        assert core.buffer.clock == ref.buffer.clock, name
        assert (
            core.learner.optimizer.state_dict()["state"].keys()
            == ref.learner.optimizer.state_dict()["state"].keys()
        )


def test_ssl_encodings_on_the_helper_are_bit_identical_to_the_serial_loss(pong_state):
    """The last 1, 3 or all 5 SSL target encodings on the helper thread, with and without the next batch
    built ahead: the same weights, BatchNorm running statistics and counts, priorities and metrics as every
    encoding on the loss's thread, across two target-network copies."""
    variants = {
        "serial": {},
        "ssl1": {"learn.helper_ssl_encodings": 1},
        "ssl3_prefetch": {"learn.helper_ssl_encodings": 3, "learn.prefetch_next_batch": True},
        "ssl5": {"learn.helper_ssl_encodings": 5},
    }
    cores = _cores("pong_muzero", PONG_TINY, pong_state, variants)
    assert cores["serial"].learner.ssl_offload is None
    assert cores["ssl3_prefetch"].learner.ssl_offload.count == 3
    outs = {name: [core.train_step() for _ in range(9)] for name, core in cores.items()}
    _assert_same_runs(cores, outs)
    assert cores["ssl3_prefetch"].prefetch_stats["used"] >= 5  # every step whose target network stays
    bn = cores["ssl5"].learner.model.representation[1]
    assert int(bn.num_batches_tracked) == 9 * 6  # the root and five SSL targets per step


def test_batches_built_ahead_give_the_serial_run_when_thrown_away(cartpole_state):
    """``learn.prefetch_next_batch``: a CartPole driver takes train steps with pushes (and evictions), buffer
    reanalyze calls, draws from its RNG, budget ends and a resume in between; each of those makes the batch
    built ahead stale, and the run stays step for step the one without prefetching, whether the batch is
    built on the helper thread beside the backward or on the step's own thread."""
    variants = {
        "serial": {},
        "prefetch": {"learn.prefetch_next_batch": True},
        "prefetch_on_step_thread": {"learn.prefetch_next_batch": True, "learn.build_ahead_on_helper": False},
    }
    cores = _cores("cartpole_muzero", CARTPOLE_SMALL, cartpole_state, variants)
    segment_source = _core("cartpole_muzero", CARTPOLE_SMALL)
    fill_replay(segment_source, 120, seed=5)
    extra = list(segment_source.buffer.segments)
    outs = {name: [] for name in cores}
    for name, core in cores.items():
        segs = copy.deepcopy(extra)
        for i in range(24):
            outs[name].append(core.train_step())
            if i % 6 == 1:
                core.buffer.push([segs.pop()])  # evicts: the buffer is full
            elif i % 6 == 2:
                core.buffer_reanalyze()
            elif i % 6 == 3:
                core.rng.random()
            elif i % 6 == 4:
                core.budget_done()
            if i == 15:
                core.load_resume_state(core.resume_state(include_buffer=True))
    _assert_same_runs(cores, outs)
    stats = cores["prefetch"].prefetch_stats
    assert stats["used"] >= 6 and stats["discarded"] >= 3, stats
    assert cores["prefetch_on_step_thread"].prefetch_stats == stats
    assert cores["serial"].prefetch_stats == {"used": 0, "discarded": 0}


def test_a_batch_built_ahead_is_not_built_where_the_target_network_changes(cartpole_state):
    """Before a target-network copy (every 5 steps here) or with a soft update, the next batch is built in
    its own step: its bootstrap values must come from the updated target network."""
    (core,) = _cores(
        "cartpole_muzero", CARTPOLE_SMALL, cartpole_state, {"p": {"learn.prefetch_next_batch": True}}
    ).values()
    for _ in range(10):
        core.train_step()
    # steps 4 and 9 end with a copy, so they build nothing ahead: steps 0 and 5 build their own batch
    assert core.prefetch_stats == {"used": 8, "discarded": 0}
    soft = _core(
        "cartpole_muzero",
        {**CARTPOLE_SMALL, "learn.prefetch_next_batch": True, "learn.target_update_tau": 0.1},
    )
    soft.load_resume_state(copy.deepcopy(cartpole_state))
    for _ in range(3):
        soft.train_step()
    assert soft.prefetch_stats == {"used": 0, "discarded": 0}


def test_fold_batch_statistics_is_the_training_forwards_update():
    """The fold the helper's encodings use: a BatchNorm layer's running statistics and count after
    ``fold_batch_statistics(bn, x)`` are bit-identical to those after ``bn(x)`` in train mode, for NCHW and
    channels-last inputs, 1-d layers, a cumulative average (momentum None) and autocast's bf16 inputs; a
    layer in eval mode is left alone."""
    gen = torch.Generator().manual_seed(0)
    cases = []
    for c, shape in ((8, (6, 8, 5, 5)), (16, (4, 16, 9, 9)), (12, (10, 12))):
        for momentum in (0.1, None):
            bn = (
                torch.nn.BatchNorm2d(c, momentum=momentum)
                if len(shape) == 4
                else torch.nn.BatchNorm1d(c, momentum=momentum)
            )
            x = torch.randn(shape, generator=gen) * 3 + 1
            cases.append((bn, x))
            if len(shape) == 4:
                cases.append((copy.deepcopy(bn), x.contiguous(memory_format=torch.channels_last)))
            cases.append((copy.deepcopy(bn), x.to(torch.bfloat16)))
    for bn, x in cases:
        with torch.no_grad():
            bn.running_mean.uniform_(-1, 1, generator=gen)
            bn.running_var.uniform_(0.5, 2, generator=gen)
            bn(x)  # a first batch, so the cumulative average has a count
        ref, folded = copy.deepcopy(bn), copy.deepcopy(bn)
        with torch.no_grad():
            ref(x * 0.5 - 2)
        fold_batch_statistics(folded, x * 0.5 - 2)
        for key, value in ref.state_dict().items():
            assert torch.equal(value, folded.state_dict()[key]), (key, bn, x.dtype)
    bn.eval()
    before = copy.deepcopy(bn.state_dict())
    fold_batch_statistics(bn, x)
    assert all(torch.equal(v, bn.state_dict()[k]) for k, v in before.items())


def test_the_shadow_network_shares_the_weights_and_leaves_the_running_statistics(pong_state):
    """The helper's shadow computes the live network's train-mode encoding bit for bit, follows an optimizer
    step at once (the same parameter tensors) and never moves a running statistic."""
    core = _core("pong_muzero", PONG_TINY)
    model = core.learner.model
    model.train()
    shadow = shadow_network(model)
    shadow.train()
    obs = torch.randint(0, 256, (4, *core.spec.obs_shape), dtype=torch.uint8)
    live_stats = copy.deepcopy(model.state_dict())
    with torch.no_grad():
        a = shadow.represent(obs)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in live_stats.items())
    with torch.no_grad():
        assert torch.equal(a, model.represent(obs))
        for p in model.parameters():
            p.add_(0.01)
        b = shadow.represent(obs)
        assert not torch.equal(a, b)
        assert torch.equal(b, model.represent(obs))
    assert all(p is q for p, q in zip(shadow.parameters(), model.parameters(), strict=True))


def test_a_failing_helper_encoding_fails_the_step_and_leaves_the_network(pong_state, monkeypatch):
    """An error in an SSL encoding on the helper reaches ``train_step``'s caller; no update is made and the
    next step runs."""
    (core,) = _cores(
        "pong_muzero", PONG_TINY, pong_state, {"ssl": {"learn.helper_ssl_encodings": 2}}
    ).values()
    offload = core.learner.ssl_offload
    real = offload._encode

    def broken(obs, k):
        if k == 5:
            raise RuntimeError("helper encoding failed")
        return real(obs, k)

    monkeypatch.setattr(offload, "_encode", broken)
    before = copy.deepcopy(core.learner.model.state_dict())
    with pytest.raises(RuntimeError, match="helper encoding failed"):
        core.train_step()
    assert core.train_iter == 0
    monkeypatch.setattr(offload, "_encode", real)
    weights = [k for k, v in before.items() if v.is_floating_point() and "running" not in k]
    assert all(torch.equal(before[k], core.learner.model.state_dict()[k]) for k in weights)
    core.train_step()
    assert core.train_iter == 1


def test_helper_ssl_encodings_is_checked():
    """More encodings than unroll steps, or a policy whose loss computes its SSL targets itself, is an error
    naming the key; without the helper thread it is a warning and every encoding stays on the loss's
    thread."""
    with pytest.raises(
        ConfigError, match=r"learn.helper_ssl_encodings.*must be <= replay.num_unroll_steps \(5\)"
    ):
        make_config("pong_muzero", overrides={"learn.helper_ssl_encodings": 6})
    with pytest.raises(ConfigError, match=r"learn.helper_ssl_encodings.*stochastic_muzero's loss"):
        _core(
            "cartpole_stochastic_muzero",
            {"logging.quiet": True, "learn.ssl_loss_weight": 1.0, "learn.helper_ssl_encodings": 2},
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = make_config("pong_muzero", overrides={"learn.overlap_bootstrap": False})
    assert any(
        issubclass(w.category, ConfigWarning) and "learn.helper_ssl_encodings=3" in str(w.message)
        for w in caught
    )
    assert cfg.learn.helper_ssl_encodings == 3
    assert make_config("pong_unizero").learn.helper_ssl_encodings == 0
