"""Learner and MuZero loss: importance weighting of the loss, train_step effects and priorities, the target
network schedule, exact checkpoint/resume (torch.save + torch.load(weights_only=True)), LR schedule."""

from __future__ import annotations

import copy
import dataclasses
import io
import os
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from muzero_tune.config import ConfigWarning, make_config
from muzero_tune.envs.spec import EnvSpec
from muzero_tune.models import build_network, logits_to_scalar
from muzero_tune.models.layout import place_model
from muzero_tune.models.traced import autocast_dtype
from muzero_tune.pipeline.learner import (
    Learner,
    clip_grad_norm,
    cpu_has_native_bf16,
    lr_factor,
    torch_thread_pool,
)
from muzero_tune.policies.muzero import MuZeroPolicy
from muzero_tune.replay.buffer import ReplayBuffer
from muzero_tune.replay.segment import GameSegment

B = 16
K = 3
TD = 3
SPEC = EnvSpec(
    env_id="CartPole-v1",
    frame_shape=(4,),
    frame_dtype="float32",
    frame_stack=1,
    num_actions=2,
    action_kind="discrete",
)


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def small_cfg(**extra):
    overrides = {
        "model.hidden_dim": 32,
        "model.latent_dim": 16,
        "model.projection_dim": 16,
        "model.value_support_size": 10,
        "model.reward_support_size": 5,
        "mcts.num_simulations": 2,
        "replay.num_unroll_steps": K,
        "replay.td_steps": TD,
        "replay.game_segment_length": 10,
        "learn.batch_size": B,
        "learn.target_update_interval": 3,
        "learn.learning_rate": 1e-2,
        "learn.lr_schedule": "piecewise",
        "learn.lr_milestones": (2, 4),
        "learn.lr_decay_factor": 0.5,
        "seed": 3,
    }
    overrides.update(extra)
    return make_config("cartpole_muzero", overrides=overrides)


def cartpole_like_segment(rng: np.random.Generator, num_real: int, pad: int, terminal: bool) -> GameSegment:
    m = num_real + pad
    return GameSegment(
        frames=rng.normal(scale=0.5, size=(m + 1, 4)).astype(np.float32),
        actions=rng.integers(0, 2, size=m).astype(np.int64),
        rewards=np.ones(m, dtype=np.float32),
        stats={
            "child_visits": rng.dirichlet([1.0, 1.0], size=m).astype(np.float32),
            "root_value": rng.normal(size=m).astype(np.float32),
            "legal_mask": np.ones((m, 2), dtype=bool),
        },
        num_real=num_real,
        frame_stack=1,
        done=terminal,
        terminal_at_end=terminal,
    )


def make_batches(cfg, n: int, seed: int = 0):
    """``n`` fixed batches from a buffer of random CartPole-like segments (bootstrap from a fresh net)."""
    rng = np.random.default_rng(seed)
    policy = MuZeroPolicy(cfg, SPEC)
    buf = ReplayBuffer(capacity_transitions=1000)
    segs = [cartpole_like_segment(rng, 10, K + TD, False) for _ in range(6)]
    segs += [cartpole_like_segment(rng, 7, 0, True), cartpole_like_segment(rng, 4, 0, False)]
    buf.push(segs)
    torch.manual_seed(123)
    target = policy.build_model()
    return [policy.make_batch(buf.sample(B, rng), target_model=target, rng=rng) for _ in range(n)]


@pytest.fixture(scope="module")
def cfg():
    return small_cfg()


@pytest.fixture(scope="module")
def batches(cfg):
    return make_batches(cfg, 6)


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_loss_importance_weighting(cfg, batches):
    policy = MuZeroPolicy(cfg, SPEC)
    torch.manual_seed(0)
    model = policy.build_model()
    batch = batches[0]
    uniform = dataclasses.replace(batch, weights=np.ones(B, dtype=np.float32))
    out = policy.compute_loss(model, uniform, train_iter=0)
    per = out.per_sample_loss.detach()
    assert per.shape == (B,) and torch.all(per > 0)
    assert len(torch.unique(per)) > 1  # samples differ, so the checks below can tell them apart
    torch.testing.assert_close(out.loss.detach(), per.mean(), rtol=1e-6, atol=0.0)
    for j in (0, 5, B - 1):
        w = np.zeros(B, dtype=np.float32)
        w[j] = 1.0
        one = policy.compute_loss(model, dataclasses.replace(batch, weights=w), train_iter=0)
        torch.testing.assert_close(one.per_sample_loss.detach(), per, rtol=0.0, atol=0.0)
        torch.testing.assert_close(one.loss.detach(), per[j] / B, rtol=1e-6, atol=0.0)
    # general weights: mean of w * loss (not normalised by the weights' sum)
    w = np.linspace(0.1, 1.0, B).astype(np.float32)
    gen = policy.compute_loss(model, dataclasses.replace(batch, weights=w), train_iter=0)
    torch.testing.assert_close(gen.loss.detach(), (torch.as_tensor(w) * per).sum() / B, rtol=1e-5, atol=0.0)


def test_train_step_changes_parameters_and_returns_priorities(cfg, batches):
    learner = Learner(cfg, MuZeroPolicy(cfg, SPEC))
    batch = batches[1]
    before = params(learner.model)
    with torch.no_grad():
        root = learner.model.initial_inference(torch.as_tensor(batch.obs[:, 0]))
        v_hat = logits_to_scalar(root.value_logits, support_size=learner.model.value_support_size).numpy()
    out = learner.train_step(batch)
    after = params(learner.model)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) > len(before) // 2
    assert out.priorities.shape == (B,)
    assert np.all(out.priorities >= 1e-6)
    # exactly the fp32 decode: priorities steer prioritized sampling, so an ulp here changes a run's samples
    np.testing.assert_array_equal(out.priorities, np.abs(v_hat - batch.target_value[:, 0]) + np.float32(1e-6))
    assert learner.train_iter == 1
    assert np.isfinite(out.metrics["train/loss_total"]) and out.metrics["train/grad_norm"] > 0


def test_policy_loss_of_the_stacked_steps_is_the_per_step_loss_bit_for_bit(cfg, batches):
    """``policy_losses`` takes all unroll steps' logits at once [B, K+1, A]: the same values and gradients
    as one cross-entropy per step, so the change left training trajectories as they were."""
    policy = MuZeroPolicy(cfg, SPEC)
    logits = torch.randn(B, K + 1, 2, generator=torch.Generator().manual_seed(0), requires_grad=True)
    target = torch.as_tensor(batches[0].target_policy)  # [B, K+1, 2]
    stacked = policy.policy_losses(logits, batches[0], target)  # [B, K+1]
    (grad_stacked,) = torch.autograd.grad((stacked * torch.arange(1.0, K + 2)).sum(), logits)
    per_step = torch.stack(
        [-(target[:, k] * torch.log_softmax(logits[:, k], dim=-1)).sum(-1) for k in range(K + 1)], 1
    )
    (grad_per_step,) = torch.autograd.grad((per_step * torch.arange(1.0, K + 2)).sum(), logits)
    assert stacked.shape == (B, K + 1) and torch.equal(stacked, per_step)
    assert torch.equal(grad_stacked, grad_per_step)


def test_target_network_copied_every_interval(cfg, batches):
    learner = Learner(cfg, MuZeroPolicy(cfg, SPEC))
    assert learner.cfg.learn.target_update_interval == 3
    target = params(learner.target_model)
    assert_same(target, params(learner.model))
    for step in range(1, 8):
        learner.train_step(batches[(step - 1) % len(batches)])
        model_now, target_now = params(learner.model), params(learner.target_model)
        if step % 3 == 0:
            assert_same(target_now, model_now)
            target = target_now
        else:
            assert_same(target_now, target)  # unchanged between copies
            assert any(not torch.equal(target_now[k], model_now[k]) for k in model_now)
    assert not any(p.requires_grad for p in learner.target_model.parameters())


def _roundtrip(state: dict) -> dict:
    f = io.BytesIO()
    torch.save(state, f)
    f.seek(0)
    return torch.load(f, weights_only=True)


def _assert_nested_equal(a, b, path="") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _assert_nested_equal(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_nested_equal(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_resume_is_exact(optimizer, batches):
    cfg = small_cfg(**{"learn.optimizer": optimizer})
    policy = MuZeroPolicy(cfg, SPEC)
    straight = Learner(cfg, policy)
    for b in batches:
        straight.train_step(b)

    first = Learner(cfg, policy)
    for b in batches[:3]:
        first.train_step(b)
    state = _roundtrip(first.state_dict())
    assert state["train_iter"] == 3
    resumed = Learner(cfg, policy)  # fresh init (re-seeds torch), then overwritten by the checkpoint
    resumed.load_state_dict(state)
    for b in batches[3:]:
        resumed.train_step(b)

    assert resumed.train_iter == straight.train_iter == 6
    assert_same(params(resumed.model), params(straight.model))
    assert_same(params(resumed.target_model), params(straight.target_model))
    _assert_nested_equal(resumed.optimizer.state_dict(), straight.optimizer.state_dict(), "optimizer")
    assert resumed.optimizer.param_groups[0]["lr"] == straight.optimizer.param_groups[0]["lr"]
    assert resumed.scheduler.get_last_lr() == straight.scheduler.get_last_lr()
    assert resumed.scheduler.last_epoch == straight.scheduler.last_epoch == 6
    # and training really moved the weights away from where the checkpoint was taken
    assert any(not torch.equal(v, params(resumed.model)[k]) for k, v in state["model"].items())


@pytest.mark.parametrize("optimizer", ["adam", "adamw", "sgd"])
def test_foreach_optimizer_step_is_bit_identical_to_the_per_tensor_loop(optimizer, batches):
    """The learner's optimizer runs torch's multi-tensor (foreach) step, a pure speed change: the weights and
    optimizer state match the per-tensor loop (torch's CPU default) bit for bit."""
    cfg = small_cfg(**{"learn.optimizer": optimizer, "learn.weight_decay": 1e-4})
    policy = MuZeroPolicy(cfg, SPEC)
    multi, loop = Learner(cfg, policy), Learner(cfg, policy)
    assert all(g["foreach"] is True for g in multi.optimizer.param_groups)
    for g in loop.optimizer.param_groups:
        g["foreach"] = False  # read by every step(): the per-tensor implementation
    before = params(multi.model)
    for b in batches:
        multi.train_step(b)
        loop.train_step(b)
    assert_same(params(multi.model), params(loop.model))
    _assert_nested_equal(
        multi.optimizer.state_dict()["state"], loop.optimizer.state_dict()["state"], "optimizer state"
    )
    assert any(not torch.equal(v, params(multi.model)[k]) for k, v in before.items())  # training moved them


@pytest.mark.parametrize("max_norm", [1e-3, 0.5, 1e6])  # clipping hard, mid, never
def test_gradient_clipping_is_bit_identical_to_torch(max_norm):
    """The learner's clip (the multiply skipped when the factor is 1) leaves the gradients and returns the
    norm exactly as ``torch.nn.utils.clip_grad_norm_(foreach=True)`` does; unused parameters keep no grad."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(7, 33), torch.nn.Tanh(), torch.nn.Linear(33, 5))
    unused = torch.nn.Parameter(torch.ones(3))
    net(torch.randn(64, 7)).pow(2).sum().backward()
    ours = [p for p in net.parameters()] + [unused]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    for a, b in zip(ours, theirs):
        b.grad = None if a.grad is None else a.grad.clone()
    norm = clip_grad_norm(ours, max_norm)
    expect = torch.nn.utils.clip_grad_norm_(theirs, max_norm, foreach=True)
    assert norm == float(expect) and norm > 0.0
    for a, b in zip(ours, theirs):
        assert (a.grad is None and b.grad is None) or torch.equal(a.grad, b.grad)
    clipped = float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in ours[:-1]])))
    assert clipped == pytest.approx(min(norm, max_norm), rel=1e-5)  # it did clip (or not) as asked


def test_channels_last_conv_learner_matches_the_nchw_network():
    """``model.channels_last``: the conv weights go NHWC, the network computes the same function (up to
    kernel rounding), its gradients agree, and its state dict loads into an NCHW network (actors,
    checkpoints) with the same outputs; ``false`` leaves the layout alone."""
    kw = dict(kind="conv", obs_shape=(4, 16, 16), num_actions=3, value_support_size=5, reward_support_size=5,
              projection_dim=16, num_channels=8, num_res_blocks=1, downsample=True)  # fmt: skip
    torch.manual_seed(0)
    nchw = build_network(**kw)
    with torch.no_grad():  # the value head starts at zero: give it weights so the outputs say something
        for p in nchw.parameters():
            if not p.any():
                p.normal_(0.0, 0.1)
    assert small_cfg().model.channels_last is False
    assert small_cfg(**{"model.channels_last": True}).model.channels_last is True
    same = place_model(copy.deepcopy(nchw), device="cpu", channels_last=False)
    nhwc = place_model(copy.deepcopy(nchw), device="cpu", channels_last=True)
    convs = [m.weight for m in nhwc.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(w.is_contiguous(memory_format=torch.channels_last) for w in convs)
    assert all(m.weight.is_contiguous() for m in same.modules() if isinstance(m, torch.nn.Conv2d))
    assert not all(w.is_contiguous() for w in convs)
    obs = torch.randint(0, 256, (6, 4, 16, 16), dtype=torch.uint8)
    acts = torch.randint(0, 3, (6,))

    def outputs_and_grads(net):
        net.zero_grad(set_to_none=True)
        root = net.initial_inference(obs)
        rec = net.recurrent_inference(root.latent, acts)
        (root.value_logits.logsumexp(-1).sum() + rec.reward_logits.logsumexp(-1).sum()).backward()
        grads = [p.grad.clone() for p in net.parameters() if p.grad is not None]
        return [root.value_logits, root.policy_logits, rec.latent, rec.reward_logits], grads

    ref_out, ref_grads = outputs_and_grads(nchw)
    out, grads = outputs_and_grads(nhwc)
    for a, b in zip([*ref_out, *ref_grads], [*out, *grads]):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    assert len(grads) == len(ref_grads) > 0
    plain = build_network(**kw)
    plain.load_state_dict(nhwc.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(
            plain.initial_inference(obs).value_logits, nhwc.initial_inference(obs).value_logits
        )


def test_state_dict_restores_rng_states(cfg):
    learner = Learner(cfg, MuZeroPolicy(cfg, SPEC))
    torch.manual_seed(42)
    np.random.seed(42)
    state = _roundtrip(learner.state_dict())
    expect = (torch.rand(3), np.random.rand(3))
    other = Learner(cfg, MuZeroPolicy(cfg, SPEC))
    torch.manual_seed(0)
    np.random.seed(0)
    other.load_state_dict(state)
    torch.testing.assert_close(torch.rand(3), expect[0], rtol=0, atol=0)
    np.testing.assert_array_equal(np.random.rand(3), expect[1])


def test_piecewise_lr_schedule(batches):
    cfg = small_cfg(
        **{
            "learn.optimizer": "sgd",
            "learn.learning_rate": 0.2,
            "learn.lr_milestones": (2, 4),
            "learn.lr_decay_factor": 0.1,
        }
    )
    lc = cfg.learn
    # factor 1 before the first milestone, x0.1 from step 2, x0.01 from step 4
    assert [lr_factor(lc, s) for s in range(7)] == pytest.approx([1, 1, 0.1, 0.1, 0.01, 0.01, 0.01])
    learner = Learner(cfg, MuZeroPolicy(cfg, SPEC))
    expected_used = [0.2, 0.2, 0.02, 0.02, 0.002, 0.002]  # lr in effect during train steps 1..6
    for s, b in enumerate(batches):
        assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(expected_used[s])
        out = learner.train_step(b)
        assert out.metrics["train/lr"] == pytest.approx(0.2 * lr_factor(lc, s + 1))
    # the lr really is what the optimizer used: one SGD step (no momentum, no decay) moves by lr * grad
    cfg2 = small_cfg(
        **{
            "learn.optimizer": "sgd",
            "learn.learning_rate": 0.2,
            "learn.momentum": 0.0,
            "learn.weight_decay": 0.0,
            "learn.lr_milestones": (1, 4),
            "learn.lr_decay_factor": 0.1,
            "learn.grad_clip_norm": 1e9,
        }
    )
    ln = Learner(cfg2, MuZeroPolicy(cfg2, SPEC))
    ln.train_step(batches[0])  # step 1 at lr 0.2; the schedule drops it to 0.02 for step 2
    assert ln.optimizer.param_groups[0]["lr"] == pytest.approx(0.02)
    model_copy = copy.deepcopy(ln.model)
    out = ln.policy.compute_loss(model_copy, batches[1], train_iter=1)
    out.loss.backward()
    expect = {n: p.detach() - 0.02 * p.grad for n, p in model_copy.named_parameters() if p.grad is not None}
    ln.train_step(batches[1])
    got = dict(ln.model.named_parameters())
    for n, v in expect.items():
        torch.testing.assert_close(got[n].detach(), v, rtol=1e-5, atol=1e-6)


def _root_only(batch):
    """The batch with every unrolled step's target masked out: only the root terms remain."""
    vm, pm, om = batch.value_mask.copy(), batch.policy_mask.copy(), batch.obs_mask.copy()
    vm[:, 1:], pm[:, 1:], om[:, 1:] = 0.0, 0.0, 0.0
    return dataclasses.replace(
        batch, value_mask=vm, policy_mask=pm, obs_mask=om, reward_mask=np.zeros_like(batch.reward_mask)
    )


@pytest.mark.parametrize("convention,root_scale", [("whole", 1.0 / K), ("per_step", 1.0)])
def test_loss_scale_of_the_root_terms(batches, convention, root_scale):
    """``learn.unroll_loss_scale``: LightZero's ``whole`` (root + K unrolled steps summed, the whole loss
    x 1/K) makes the gradient of a root-only batch's loss 1/K of the plain (unscaled) root loss's; MuZero's
    ``per_step`` (root x 1, each unrolled step x 1/K) leaves it equal."""
    from muzero_tune.models import scalar_to_target
    from muzero_tune.policies.muzero import soft_cross_entropy

    cfg = small_cfg(
        **{
            "learn.value_loss_weight": 0.25,
            "learn.policy_loss_weight": 1.0,
            "learn.unroll_loss_scale": convention,
        }
    )
    policy = MuZeroPolicy(cfg, SPEC)
    torch.manual_seed(0)
    model = policy.build_model()
    w = np.linspace(0.2, 1.0, B).astype(np.float32)
    batch = dataclasses.replace(_root_only(batches[2]), weights=w)
    assert batch.value_mask[:, 0].sum() > 0 and batch.policy_mask[:, 0].sum() > 0

    def grads(loss):
        model.zero_grad(set_to_none=True)
        loss.backward()
        return torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in model.parameters()]
        )

    ours = grads(policy.compute_loss(model, batch, train_iter=0).loss)
    root = model.initial_inference(torch.as_tensor(batch.obs[:, 0]))
    tv0 = scalar_to_target(torch.as_tensor(batch.target_value[:, 0]), support_size=model.value_support_size)
    plain = soft_cross_entropy(
        root.policy_logits, torch.as_tensor(batch.target_policy[:, 0])
    ) * torch.as_tensor(batch.policy_mask[:, 0]) + 0.25 * soft_cross_entropy(
        root.value_logits, tv0
    ) * torch.as_tensor(batch.value_mask[:, 0])
    unscaled = grads((torch.as_tensor(w) * plain).mean())
    assert unscaled.norm() > 0
    torch.testing.assert_close(ours, unscaled * root_scale, rtol=1e-4, atol=1e-7)


def test_loss_scale_conventions_agree_on_the_unrolled_steps(batches):
    """With the root's targets masked out, ``per_step`` and ``whole`` are the same loss (both x 1/K)."""
    vm, pm = batches[2].value_mask.copy(), batches[2].policy_mask.copy()
    vm[:, 0], pm[:, 0] = 0.0, 0.0
    batch = dataclasses.replace(batches[2], value_mask=vm, policy_mask=pm)
    losses = []
    for convention in ("per_step", "whole"):
        policy = MuZeroPolicy(small_cfg(**{"learn.unroll_loss_scale": convention}), SPEC)
        torch.manual_seed(0)
        losses.append(policy.compute_loss(policy.build_model(), batch, train_iter=0).loss)
    assert losses[0] > 0
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-6, atol=0)


def _deferred_batches(cfg, learner: Learner, n: int, *, seed: int = 5):
    """``n`` batches whose bootstrap term is left to ``learner`` (bound to its target network), drawn the same
    way for every learner given the same ``seed``; each batch's value_fn records the thread it ran on."""
    rng = np.random.default_rng(seed)
    buf = ReplayBuffer(capacity_transitions=1000)
    buf.push([cartpole_like_segment(rng, 10, K + TD, False) for _ in range(6)])
    threads: list[int] = []
    out = []
    for _ in range(n):
        batch = learner.policy.make_batch(
            buf.sample(B, rng), target_model=learner.target_model, rng=rng, defer_bootstrap=True
        )
        value_fn = batch.bootstrap.value_fn

        def recorded(obs, value_fn=value_fn):
            threads.append(threading.get_ident())
            return value_fn(obs)

        bootstrap = dataclasses.replace(batch.bootstrap, value_fn=recorded)
        out.append(dataclasses.replace(batch, bootstrap=bootstrap))
    return out, threads


@pytest.mark.parametrize("piece_rows", [0, 5])
def test_overlapped_bootstrap_is_bit_identical_to_the_serial_step(piece_rows):
    """``learn.overlap_bootstrap``: the target network's bootstrap forward runs on the learner's helper thread
    beside the loss's forward, and the step is exactly the serial one -- weights, priorities and metrics --
    also across target-network updates (every 3 steps here: each batch sees the target as it was before its
    own step), and with the forward asked in pieces (``learn.bootstrap_piece_rows``: the same on both)."""
    runs = {}
    for overlap in (True, False):
        cfg = small_cfg(**{"learn.overlap_bootstrap": overlap, "learn.bootstrap_piece_rows": piece_rows})
        learner = Learner(cfg, MuZeroPolicy(cfg, SPEC))
        assert (learner.bootstrap_helper is not None) is overlap
        batches, threads = _deferred_batches(cfg, learner, 7)
        # one value_fn call per batch, or one per piece of each batch
        calls = sum(-(-len(b.bootstrap.obs) // (piece_rows or len(b.bootstrap.obs))) for b in batches)
        outs = [learner.train_step(b) for b in batches]
        runs[overlap] = (params(learner.model), params(learner.target_model), outs, threads)
    (p_on, t_on, outs_on, threads_on), (p_off, t_off, outs_off, threads_off) = runs[True], runs[False]
    assert_same(p_on, p_off)
    assert_same(t_on, t_off)
    for a, b in zip(outs_on, outs_off):
        np.testing.assert_array_equal(a.priorities, b.priorities)
        assert a.metrics == b.metrics
    me = threading.get_ident()
    assert len(threads_on) == len(threads_off) == calls
    assert piece_rows or calls == 7
    assert all(t != me for t in threads_on) and all(t == me for t in threads_off)


def _os_threads_started_by(pool: ThreadPoolExecutor, fn) -> set[str]:
    """OS threads of this process that running ``fn`` on ``pool``'s thread started, that thread left out."""
    before = set(os.listdir("/proc/self/task"))

    def run():
        fn()
        return str(threading.get_native_id())

    pool_thread = pool.submit(run).result()
    pool.shutdown()
    return set(os.listdir("/proc/self/task")) - before - {pool_thread}


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")
def test_the_learner_helper_thread_runs_torch_on_the_callers_thread_count():
    """``torch.set_num_threads(1)`` holds for the thread that called it; a thread started later runs a matmul
    on a team of OpenMP's default size (its own worker threads, one per core) beside the caller's work. The
    learner's helper pool sets the caller's count first, so its forwards start no threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(256, 512), torch.randn(512, 384)

        def matmuls():
            for _ in range(5):
                torch.mm(a, b)

        # the defect this guards against shows where a new thread's OpenMP team is larger than one: a second
        # core, and no OMP_NUM_THREADS=1 (Ray sets it in its workers) making every team one thread
        default_team = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
        if default_team > 1:
            # not on every new thread: OpenMP may hand one idle threads of an earlier team (2 of 20 here)
            assert any(_os_threads_started_by(ThreadPoolExecutor(max_workers=1), matmuls) for _ in range(5))
        assert _os_threads_started_by(torch_thread_pool("test-helper"), matmuls) == set()
        cfg = small_cfg(**{"learn.overlap_bootstrap": True})
        learner = Learner(cfg, MuZeroPolicy(cfg, SPEC))
        assert _os_threads_started_by(learner.bootstrap_helper, matmuls) == set()
    finally:
        torch.set_num_threads(before)


def test_a_failing_overlapped_bootstrap_fails_the_step():
    """An error in the helper thread's forward reaches the caller of ``train_step``; no update is made."""
    cfg = small_cfg(**{"learn.overlap_bootstrap": True})
    learner = Learner(cfg, MuZeroPolicy(cfg, SPEC))
    (batch,), _ = _deferred_batches(cfg, learner, 1)

    def broken(obs):
        raise RuntimeError("target network forward failed")

    batch = dataclasses.replace(batch, bootstrap=dataclasses.replace(batch.bootstrap, value_fn=broken))
    before = params(learner.model)
    with pytest.raises(RuntimeError, match="target network forward failed"):
        learner.train_step(batch)
    assert_same(params(learner.model), before)
    assert learner.train_iter == 0


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="this CPU has no native bf16")
def test_mixed_precision_on_cpu_autocasts_both_forwards_and_keeps_fp32_state():
    """``learn.mixed_precision`` on a CPU with native bf16: the loss forward and the bootstrap forward run
    under bf16 autocast, the weights, gradients and optimizer state stay fp32, and the losses of a short run
    track the fp32 run's (bf16 keeps ~3 significant digits)."""
    losses = {}
    for amp in (True, False):
        cfg = small_cfg(**{"learn.mixed_precision": amp})
        learner = Learner(cfg, MuZeroPolicy(cfg, SPEC))
        assert learner.autocast_dtype == (torch.bfloat16 if amp else None)
        batches, _ = _deferred_batches(cfg, learner, 6)
        precisions = []
        for i, b in enumerate(batches):
            value_fn = b.bootstrap.value_fn

            def seen(obs, value_fn=value_fn, precisions=precisions):
                precisions.append(autocast_dtype("cpu") or False)
                return value_fn(obs)

            batches[i] = dataclasses.replace(b, bootstrap=dataclasses.replace(b.bootstrap, value_fn=seen))
        losses[amp] = [learner.train_step(b).metrics["train/loss_total"] for b in batches]
        assert precisions == [torch.bfloat16 if amp else False] * 6
        assert all(p.dtype == torch.float32 for p in learner.model.parameters())
        state = learner.optimizer.state_dict()["state"]
        assert all(v.dtype == torch.float32 for s in state.values() for v in s.values() if v.dim() > 0)
    np.testing.assert_allclose(losses[True], losses[False], rtol=0.02)
    assert losses[True] != losses[False]  # it did run in another precision


def test_mixed_precision_without_native_bf16_warns_and_runs_fp32(monkeypatch):
    """On a CPU without native bf16 (emulated bf16 measured 29x slower) the learner says so, naming the key,
    and stays fp32."""
    import muzero_tune.pipeline.learner as learner_module

    monkeypatch.setattr(learner_module, "cpu_has_native_bf16", lambda: False)
    cfg = small_cfg(**{"learn.mixed_precision": True})
    with pytest.warns(ConfigWarning, match=r"learn\.mixed_precision=True: no native bf16"):
        learner = Learner(cfg, MuZeroPolicy(cfg, SPEC))
    assert learner.autocast_dtype is None


@pytest.mark.parametrize("prefetch", [True, False])
@pytest.mark.parametrize("overlap", [True, False])
def test_num_threads_sets_the_steps_intra_op_threads_and_restores_the_callers(overlap, prefetch):
    """``learn.num_threads=2``: the loss's forward runs on 2 intra-op threads less the bootstrap helper's one,
    the backward on 2 -- or on 1 too where the helper works beside it (the next batch's bootstrap forward,
    ``learn.prefetch_next_batch``); the caller's count (1 here) is back after every step, and the step is
    deterministic at that count (two learners from one seed end bit-identical). Where both are 1, the config
    says so with a ConfigWarning."""
    runs = []
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cfg = small_cfg(
                **{
                    "learn.num_threads": 2,
                    "learn.overlap_bootstrap": overlap,
                    "learn.prefetch_next_batch": prefetch,
                }
            )
        warned = [
            w
            for w in caught
            if issubclass(w.category, ConfigWarning) and "learn.num_threads=2" in str(w.message)
        ]
        assert len(warned) == (1 if overlap and prefetch else 0)
        learner = Learner(cfg, MuZeroPolicy(cfg, SPEC))
        seen: dict[str, list[int]] = {"forward": [], "backward": []}
        loss_fn = learner.loss_fn

        def recorded_loss(*args, loss_fn=loss_fn, seen=seen, **kwargs):
            seen["forward"].append(torch.get_num_threads())
            return loss_fn(*args, **kwargs)

        learner.loss_fn = recorded_loss
        # a gradient hook runs inside the backward, on the calling thread (the CPU autograd engine's)
        first = next(learner.model.parameters())
        first.register_hook(lambda g, seen=seen: seen["backward"].append(torch.get_num_threads()) or g)
        batches, _ = _deferred_batches(cfg, learner, 4)
        for b in batches:
            out = learner.train_step(b)
            assert torch.get_num_threads() == 1
            assert np.isfinite(out.metrics["train/loss_total"])
        assert seen["forward"] == [1 if overlap else 2] * 4
        assert seen["backward"] == [1 if overlap and prefetch else 2] * 4
        runs.append(params(learner.model))
    assert_same(runs[0], runs[1])
