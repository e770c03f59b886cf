"""``learn.compile``: the compiled loss and optimizer step train as the eager ones do, within float rounding,
and a part that cannot compile warns once and runs eager with the eager results."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from conftest import NEEDS_CXX

from muzero_tune.config import ConfigWarning, make_config
from muzero_tune.pipeline.collector import fill_replay
from muzero_tune.pipeline.compiled_loss import CompiledOptimizerStep, tensor_batch
from muzero_tune.pipeline.core import DriverCore
from muzero_tune.policies.base import loss_output
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


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from a clean Dynamo state and counts its own graphs (Inductor's disk cache keeps
    recompiles short)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _core(policy_type: str, compile_mode: str, **over) -> DriverCore:
    cfg = make_config(f"cartpole_{policy_type}", overrides={**TINY, "learn.compile": compile_mode, **over})
    core = DriverCore(cfg, MemoryReporter())
    fill_replay(core, 200)
    return core


def _compare_with_eager(policy_type: str, compile_mode: str = "default", *, both: dict | None = None,
                        **over) -> tuple[DriverCore, list]:
    """STEPS train steps of an eager and a compiled driver from the same seed on the same data (``both``:
    settings of the two, ``over``: of the compiled one): the compiled one's weights, target network and
    priorities equal the eager one's within the tolerances."""
    both = both or {}
    eager, compiled = _core(policy_type, "off", **both), _core(policy_type, compile_mode, **both, **over)
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



@NEEDS_CXX
def test_a_compiled_loss_trains_as_the_eager_one():
    """muzero's loss (which five of the types share) compiled: the same weights, target network and
    priorities within float rounding, and its compile time reported beside the step's metrics."""
    from torch._dynamo.utils import counters

    # two unrolled steps: the loop's graph as at any K, in a shorter compile (every type at its preset K:
    # test_every_policy_types_compiled_loss_trains_as_its_eager_one)
    compiled, outs = _compare_with_eager("muzero", both={"replay.num_unroll_steps": 2},
                                         **{"learn.compile_optimizer_step": True})
    assert compiled.learner.compiled_loss.compiled and compiled.learner.compiled_optimizer_step.compiled
    assert outs[-1][1].metrics["train/compile_s"] > 0 and "train/compile_s" not in outs[-1][0].metrics
    # the loss is one graph from the observations to the priorities, with no break (a break would have
    # Dynamo trace the loss twice at every first compile): its host side runs after the graph
    learner, (_, batch) = compiled.learner, compiled.build_batch()
    torch._dynamo.reset()
    counters.clear()
    out = learner.compiled_loss(learner.model, resolve_bootstrap(batch), train_iter=learner.train_iter)
    assert not counters["graph_break"], list(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1 and isinstance(out.priorities, np.ndarray)


def test_a_loss_that_cannot_compile_warns_once_and_runs_eager():
    """No C++ compiler for Inductor's CPU kernels: one warning naming the error, then the eager loss, whose
    results are the eager learner's bit for bit."""
    eager = _core("muzero", "off", **{"model.hidden_dim": 24})
    no_compiler = torch._inductor.config.patch({"cpp.cxx": ("/nonexistent/c++",), "fx_graph_cache": False})
    with no_compiler, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        broken = _core("muzero", "default", **{"model.hidden_dim": 24, "learn.compile_optimizer_step": True})
        outs = [(eager.train_step(), broken.train_step()) for _ in range(STEPS)]
    said = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning) and "compile" in str(w)]
    assert len(said) == 2, said
    assert "muzero's loss does not compile" in said[0]
    assert "muzero's optimizer step does not compile" in said[1]
    assert not broken.learner.compiled_loss.compiled and not broken.learner.compiled_optimizer_step.compiled
    for a, b in outs:
        np.testing.assert_array_equal(b.priorities, a.priorities)
    for key, ref in eager.learner.model.state_dict().items():
        assert torch.equal(broken.learner.model.state_dict()[key], ref), key


@NEEDS_CXX
@pytest.mark.slow  # a forward compiled from an empty cache: about 30 s
def test_a_backward_that_cannot_compile_warns_once_and_redoes_the_step_eager():
    """AOTAutograd compiles the backward graph at the first backward: where that fails (here the C++
    compiler goes missing after the forward compiled), one warning naming the cause, and the step's loss
    runs again eager with its backward, so the weights after it are the eager learner's bit for bit; the
    loss stays eager after that.

    Default-tier twin:
    tests/test_compiled_loss.py::test_a_loss_that_cannot_compile_warns_once_and_runs_eager
    """
    # a learning rate that changes every step keeps the optimizer's step eager: the step is eager's exactly
    over = {"model.hidden_dim": 20, "learn.lr_schedule": "cosine", "learn.lr_total_train_iter": 100}
    eager, broken = _core("muzero", "off", **over), _core("muzero", "default", **over)
    compiled_loss = broken.learner.compiled_loss
    compile_backward = compiled_loss.backward
    no_compiler = torch._inductor.config.patch({"cpp.cxx": ("/nonexistent/c++",)})

    def backward_without_compiler(loss):
        with no_compiler:
            return compile_backward(loss)

    compiled_loss.backward = backward_without_compiler
    # nothing from a disk cache: the forward compiles here, and the backward must compile too
    no_cache = torch._inductor.config.patch({"fx_graph_cache": False})
    no_aot_cache = torch._functorch.config.patch({"enable_autograd_cache": False})
    with no_cache, no_aot_cache, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = (eager.train_step(), broken.train_step())
        for key, ref in eager.learner.model.state_dict().items():
            assert torch.equal(broken.learner.model.state_dict()[key], ref), key
        second = (eager.train_step(), broken.train_step())
    said = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning) and "compile" in str(w)]
    assert len(said) == 1, said
    assert "muzero's loss does not compile (its backward: " in said[0]
    assert not compiled_loss.compiled and broken.learner.compiled_optimizer_step is None
    assert first[1].metrics["train/loss_total"] == first[0].metrics["train/loss_total"]
    np.testing.assert_allclose(first[1].priorities, first[0].priorities, atol=PRIORITY_ATOL)  # compiled's
    assert second[1].metrics["train/loss_total"] == pytest.approx(second[0].metrics["train/loss_total"])
    assert broken.learner.train_iter == 2


# a compiled optimizer step against torch's eager multi-tensor one, on the same weights and gradients: Adam's
# and SGD's updates fused into other kernels differ at float32 rounding, and no more, after OPT_STEPS steps
OPT_STEPS = 12
OPT_ATOL = 1e-6
MILESTONES = (4, 8)  # a piecewise learning rate: three values, each compiled once


def _optimizers(kind: str, params_a, params_b):
    make = {
        "adam": lambda p: torch.optim.Adam(p, lr=1e-3, weight_decay=1e-4, foreach=True),
        "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=1e-2, foreach=True),
        "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4, foreach=True),
    }[kind]
    return make(params_a), make(params_b)


@NEEDS_CXX
@pytest.mark.parametrize("kind", ["adam", "adamw", "sgd"])
def test_a_compiled_optimizer_step_updates_as_the_eager_one_and_compiles_once_per_learning_rate(kind):
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    eager_net, compiled_net = copy.deepcopy(net), copy.deepcopy(net)
    eager_opt, opt = _optimizers(kind, list(eager_net.parameters()), list(compiled_net.parameters()))
    factor = lambda s: 0.1 ** sum(s >= m for m in MILESTONES)  # noqa: E731
    schedules = [torch.optim.lr_scheduler.LambdaLR(o, factor) for o in (eager_opt, opt)]
    step = CompiledOptimizerStep(opt, mode="default", policy_name="test")
    counters.clear()
    for _ in range(OPT_STEPS):
        for a, b in zip(eager_net.parameters(), compiled_net.parameters()):
            a.grad = torch.randn_like(a)
            b.grad = a.grad.clone()
        eager_opt.step()
        step()
        for s in schedules:
            s.step()
    assert step.compiled and step.compile_s > 0
    for (key, a), b in zip(eager_net.state_dict().items(), compiled_net.state_dict().values()):
        torch.testing.assert_close(b, a, atol=OPT_ATOL, rtol=0, msg=lambda m, k=key: f"{k}: {m}")
        assert not torch.equal(a, net.state_dict()[key])  # the steps moved it
    for a, b in zip(eager_opt.state.values(), opt.state.values()):  # moments / momentum buffers
        for name in a:
            torch.testing.assert_close(b[name], a[name], atol=OPT_ATOL, rtol=0)
    # one graph per learning rate (and the first step's, which creates the state), not one per step
    assert counters["stats"]["unique_graphs"] <= len(MILESTONES) + 2


def _net_and_grads(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, width), torch.nn.ReLU(), torch.nn.Linear(width, 3))
    for p in net.parameters():
        p.grad = torch.randn_like(p)
    return net


class _ScaledLoss:
    """A loss method shared by every instance, as ``compute_loss`` is by the policy types; ``scale`` is a
    Python float, which Dynamo specialises its graph on."""

    def __init__(self, scale: float):
        self.scale = scale

    def compute_loss(self, model: torch.nn.Module, batch, train_iter: int = 0) -> torch.Tensor:
        return (model(batch.obs.flatten(1)) * self.scale).pow(2).mean()


def _toy_batch(rows: int = 4):
    from muzero_tune.replay.targets import TrainBatch

    zeros = lambda *shape: np.zeros(shape, np.float32)  # noqa: E731
    return TrainBatch(
        obs=np.random.default_rng(0).normal(size=(rows, 1, 6)).astype(np.float32),
        actions=np.zeros((rows, 1), np.int64), target_value=zeros(rows, 2), target_reward=zeros(rows, 1),
        target_policy=zeros(rows, 2, 2), value_mask=zeros(rows, 2), reward_mask=zeros(rows, 1),
        policy_mask=zeros(rows, 2), obs_mask=zeros(rows, 2), weights=zeros(rows),
        flat_index=np.arange(rows), make_time=0,
    )  # fmt: skip


@NEEDS_CXX
def test_each_compiled_loss_has_its_own_recompile_budget():
    """Losses that share their function (every type's is ``compute_loss`` or an override) each compile
    their own graph: with Dynamo's recompile limit at 1, a process that compiles four runs' losses in turn,
    each specialised differently, runs every one compiled and none falls back to eager."""
    from torch._dynamo.utils import counters

    from muzero_tune.pipeline.compiled_loss import CompiledLoss

    model, batch = torch.nn.Linear(6, 3), _toy_batch()
    counters.clear()
    with torch._dynamo.config.patch(recompile_limit=1), warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)  # a fallback's warning fails the test
        losses, values = [], []
        for scale in (1.0, 2.0, 3.0, 4.0):
            losses.append(CompiledLoss(_ScaledLoss(scale).compute_loss, mode="default",
                                       device=torch.device("cpu"), policy_name=f"x{scale:g}"))  # fmt: skip
            values.append(losses[-1](model, batch).item())
    assert all(loss.compiled for loss in losses), [loss.fallback_reason for loss in losses]
    assert counters["stats"]["unique_graphs"] == 4  # one graph each, none run eager instead
    eager = [
        _ScaledLoss(s).compute_loss(model, tensor_batch(batch, torch.device("cpu"))).item()
        for s in (1, 2, 3, 4)
    ]
    np.testing.assert_allclose(values, eager, rtol=1e-6)


class _StepCountedLoss:
    """A loss that reads its step count in the graph and reports it as a host metric, as a schedule would."""

    def compute_loss(self, model: torch.nn.Module, batch, train_iter: int = 0):
        per_sample = (model(batch.obs.flatten(1)) * (1 + train_iter)).pow(2).mean(1)  # [B]
        loss = per_sample.mean()
        host = {"train/train_iter": float(train_iter)}
        return loss_output(loss, per_sample, per_sample.detach(), loss.detach().reshape(1), ("m",), host)


@NEEDS_CXX
@pytest.mark.skipif(
    not hasattr(getattr(torch.compiler, "config", None), "dynamic_sources"),
    reason="this torch has no dynamic_sources option: the second step compiles once more",
)
def test_a_compiled_loss_compiles_once_while_its_step_count_changes():
    """``train_iter`` is a new int every step: the loss compiles it as a symbol from its first call, so with
    Dynamo's recompile limit at 1 the later steps run the same graph (an int specialised on its first value
    would compile again at the second step, here past the limit), with the eager loss's values and the step
    count reported; the user's own ``dynamic_sources`` entry is kept around the calls."""
    from torch._dynamo.utils import counters

    from muzero_tune.pipeline.compiled_loss import CompiledLoss

    model, batch, eager = torch.nn.Linear(6, 3), _toy_batch(), _StepCountedLoss()
    loss = CompiledLoss(eager.compute_loss, mode="default", device=torch.device("cpu"), policy_name="counted")
    counters.clear()
    with (
        torch._dynamo.config.patch(recompile_limit=1),
        torch.compiler.config.patch(dynamic_sources="L['user_entry']"),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("error", ConfigWarning)  # a fallback's warning fails the test
        outs = [loss(model, batch, train_iter=i) for i in range(4)]
        assert torch.compiler.config.dynamic_sources == "L['user_entry']"
    assert loss.compiled and counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    for i, out in enumerate(outs):
        ref = eager.compute_loss(model, tensor_batch(batch, torch.device("cpu")), train_iter=i)
        assert out.metrics["train/train_iter"] == i
        assert out.loss.item() == pytest.approx(ref.loss.item(), rel=1e-6)


@NEEDS_CXX
def test_a_part_that_recompiles_past_dynamos_limit_warns_once_and_runs_eager():
    """A learning rate that changes every step recompiles the optimizer's step each time: past Dynamo's
    recompile limit (here 2) the step warns once, naming the limit, and runs eager, updating as the eager
    optimizer does (Dynamo alone would run it eager with a log line and ``compiled`` still True)."""
    eager_net, compiled_net = _net_and_grads(16), _net_and_grads(16)
    eager_opt, opt = (
        torch.optim.SGD(n.parameters(), lr=0.1, foreach=True) for n in (eager_net, compiled_net)
    )
    step = CompiledOptimizerStep(opt, mode="default", policy_name="test")
    with torch._dynamo.config.patch(recompile_limit=2), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(5):
            for o in (eager_opt, opt):
                o.param_groups[0]["lr"] = 0.1 / (i + 1)
            eager_opt.step()
            step()
    said = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
    assert len(said) == 1 and "test's optimizer step does not compile" in said[0], said
    assert "recompile_limit" in said[0] and not step.compiled
    for (key, a), b in zip(eager_net.state_dict().items(), compiled_net.state_dict().values()):
        torch.testing.assert_close(b, a, atol=OPT_ATOL, rtol=0, msg=lambda m, k=key: f"{k}: {m}")
    assert torch._dynamo.config.fail_on_recompile_limit_hit is False  # restored after each call


def test_a_compiling_cpu_learner_starts_inductors_per_process_work_before_its_first_step():
    """A CPU learner with ``learn.compile`` starts Inductor's instruction-set check on a thread of its own
    when it is built (a fresh process, so nothing checked them before), and the hash of torch's sources
    that keys Inductor's caches, so its first compile finds both answers cached instead of working then."""
    code = """
import time
from muzero_tune.config import make_config
from muzero_tune.pipeline.core import DriverCore
from muzero_tune.runs.reporter import MemoryReporter
from torch._inductor import codecache, cpu_vec_isa
assert cpu_vec_isa.valid_vec_isa_list.cache_info().currsize == 0
asked = []
if hasattr(codecache.torch_key, "prefetch"):  # torch's own background hash, where torch has it
    real_prefetch = codecache.torch_key.prefetch
    codecache.torch_key.prefetch = lambda: (asked.append(True), real_prefetch())
else:
    asked.append(True)
DriverCore(make_config("cartpole_muzero", overrides={"logging.quiet": True, "learn.compile": "default"}),
           MemoryReporter())
deadline = time.monotonic() + 120  # nothing on this thread checks them before a compile
while cpu_vec_isa.valid_vec_isa_list.cache_info().currsize == 0 and time.monotonic() < deadline:
    time.sleep(0.05)
info = cpu_vec_isa.valid_vec_isa_list.cache_info()
print("checked", info.currsize, info.misses, "source hash asked for", len(asked))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "checked 1 1 source hash asked for 1" in done.stdout, done.stdout


def test_the_optimizer_step_compiles_only_where_asked_and_not_under_a_per_step_learning_rate():
    """The optimizer's step compiles only with learn.compile_optimizer_step, and not under a learning rate
    that changes every step; asked for with the loss eager, a warning says it does nothing."""
    asked = {"learn.compile_optimizer_step": True}
    over = {"learn.lr_schedule": "cosine", "learn.lr_total_train_iter": 100, **asked}
    cosine = _core("muzero", "default", **over)
    assert cosine.learner.compiled_loss is not None and cosine.learner.compiled_optimizer_step is None
    assert _core("muzero", "default", **asked).learner.compiled_optimizer_step is not None
    loss_only = _core("muzero", "default")
    assert loss_only.learner.compiled_loss is not None and loss_only.learner.compiled_optimizer_step is None
    with pytest.warns(ConfigWarning, match="compile_optimizer_step=true has no effect"):
        eager = _core("muzero", "off", **asked)
    assert eager.learner.compiled_loss is None and eager.learner.compiled_optimizer_step is None


@NEEDS_CXX
@pytest.mark.slow
@pytest.mark.parametrize("policy_type", list(POLICY_CLASSES))
def test_every_policy_types_compiled_loss_trains_as_its_eager_one(policy_type):
    """Each type's loss under ``learn.compile=default``, and its optimizer's step, compile (the recurrent
    type's history replay runs eager before its graph) and train as the eager learner does, within float
    rounding.

    Default-tier twin:
    tests/test_compiled_loss.py::test_a_compiled_loss_trains_as_the_eager_one
    """
    compiled, _ = _compare_with_eager(policy_type, **{"learn.compile_optimizer_step": True})
    assert compiled.learner.compiled_loss.compiled, compiled.learner.compiled_loss.fallback_reason
    step = compiled.learner.compiled_optimizer_step
    assert step.compiled, step.fallback_reason


def test_the_first_backward_after_a_compiled_forward_counts_as_compile_time():
    """AOTAutograd compiles a graph's backward at its first backward call: that call's wall time joins
    ``compile_s``, later backwards and an uncompiled loss's do not."""
    from muzero_tune.pipeline.compiled_loss import CompiledLoss

    compiled = CompiledLoss(lambda m, b: None, mode="default", device=torch.device("cpu"), policy_name="t")
    weight = torch.ones(3, requires_grad=True)
    compiled.backward((weight * 2).sum())  # before any compiled forward: nothing to add to
    assert compiled.compile_s is None
    compiled.compile_s = 1.0  # as a first compiled forward leaves it
    compiled.backward((weight * 2).sum())
    after_first = compiled.compile_s
    assert after_first > 1.0
    compiled.backward((weight * 2).sum())
    assert compiled.compile_s == after_first
    torch.testing.assert_close(weight.grad, torch.full((3,), 6.0))  # three backwards ran


@NEEDS_CXX
@pytest.mark.slow
def test_the_cpp_wrapper_runs_the_same_kernels_bit_for_bit():
    """``learn.compile_cpp_wrapper`` changes only who calls the kernels: the weights and priorities of
    STEPS steps equal those under Inductor's Python wrapper exactly.

    Default-tier twin:
    tests/test_compiled_loss.py::test_a_compiled_loss_trains_as_the_eager_one
    """
    both = {"learn.compile_optimizer_step": True}
    python_wrapper = _core("muzero", "default", **{"learn.compile_cpp_wrapper": False, **both})
    cpp_wrapper = _core("muzero", "default", **both)
    outs = [(python_wrapper.train_step(), cpp_wrapper.train_step()) for _ in range(STEPS)]
    for a, b in outs:
        np.testing.assert_array_equal(b.priorities, a.priorities)
    ours = cpp_wrapper.learner.model.state_dict()
    for key, ref in python_wrapper.learner.model.state_dict().items():
        assert torch.equal(ours[key], ref), key
