"""The learner's compiled step (``learn.compile``): ``torch.compile`` of a policy's ``compute_loss`` and of
the optimizer's step.

The compiled loss takes a batch whose arrays are torch tensors on the learner's device, its value targets
resolved (:func:`tensor_batch`), so the path from the observations through the unroll to the loss and the
priorities traces as one graph, whose backward AOTAutograd compiles with it; what follows the graph (the
priorities to numpy, the metrics to floats) runs eager after it. A run's batch shape is fixed, so one graph
serves every step: the step count ``train_iter``, which changes every call, enters it as a symbol from the
first compile (Dynamo would specialise it on its first value and compile again at the second step, about 0.7 s
of a CartPole run), and any other size or int argument that changes compiles once more, as a symbol. Dynamo
keeps its compiled graphs, and counts recompiles, per code object, and every type's loss is ``compute_loss``
or an override of it: so the loss is called through a code object of its own (:func:`own_code`), and a process
that compiles many runs' losses in turn compiles each one (through the shared code they would pass Dynamo's
recompile limit after a few types, and Dynamo would run the rest eager with only a log line). The optimizer's
step gets no count of its own that way: torch breaks its graph inside ``step``, whose code every optimizer of
its class shares. A part that would recompile past the limit (a learning rate changed at more milestones than
it allows, or the optimizers of more differently shaped runs in one process) warns once, naming the limit, and
runs eager from then on. The first call's wall time, compile and step together, and the first backward's
(AOTAutograd compiles the backward graph then) are kept as :attr:`CompiledLoss.compile_s`.

A loss that cannot compile (an op Dynamo cannot trace, no C++ compiler for Inductor's CPU kernels) warns
once, naming the error, and runs eager from then on: the run goes on with the same results, only slower. So
does one whose backward graph fails to compile at the first backward: that step's loss then runs again,
eager, and its backward with it (the priorities already written back stay the compiled forward's).
What a policy's loss indexes by the data (``Policy.eager_loss_inputs``: the recurrent type's history
replay) runs eager before the graph, on the batch as built, and enters it as tensors with their autograd
history. The SSL targets are encoded inside the graph (the learner's helper-thread SSL offload hands the
loss a callable, which a graph cannot take), and the bootstrap values are waited for before the graph
starts.

With ``learn.compile_optimizer_step`` the optimizer's step (:class:`CompiledOptimizerStep`) is a second graph:
every parameter's update (Adam's moments, weight decay, momentum) fused into a few kernels instead of one
multi-tensor op after another (off by default: its first compile, about a second per process for the CartPole
networks, against 0-0.6 ms less per later step). Its learning rate is a Python float the graph is specialised
on, so a schedule that changes it at milestones compiles once per value; one that changes it every step
(``cosine``) keeps the eager step (:func:`optimizer_step_compiles`), as does a run whose fp16 gradient scaler
steps the optimizer.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from muzero_tune.config import ConfigWarning
from muzero_tune.policies.base import LossTensors
from muzero_tune.replay.targets import TrainBatch

# batch fields that stay host values: bookkeeping the loss never reads
_HOST_FIELDS = ("flat_index", "make_time", "bootstrap")
# the loss's ``train_iter`` argument, a new value every step: a symbol in the graph from the first compile
# (Dynamo otherwise specialises an int argument on its first value and compiles again at the second step)
STEP_COUNT_SOURCE = r".*\['train_iter'\]$"


def tensor_batch(batch: TrainBatch, device: torch.device) -> TrainBatch:
    """``batch`` with its value targets resolved into ``target_value`` (waiting for a bootstrap forward that
    runs elsewhere) and every array the loss reads -- observations, actions, targets, masks, weights and the
    policy's extras -- as a tensor on ``device`` (the same dtypes and shapes; a CPU array is shared, not
    copied)."""

    def to_tensor(x: Any) -> Any:
        return torch.as_tensor(x, device=device) if isinstance(x, np.ndarray) else x

    resolved = dataclasses.replace(batch, target_value=batch.value_targets(), bootstrap=None)
    moved = {
        f.name: to_tensor(getattr(resolved, f.name))
        for f in dataclasses.fields(resolved)
        if f.name not in _HOST_FIELDS and f.name != "extras"
    }
    return dataclasses.replace(resolved, **moved, extras={k: to_tensor(v) for k, v in batch.extras.items()})


def start_inductor_prework() -> None:
    """Start the work Inductor does once per process, whatever it compiles, on background threads:

    - the check of the vector instruction sets its CPU kernels may use, which builds and loads a probe
      library for each set the CPU lists, in child processes (about a second);
    - the hash of torch's own sources that keys its caches (about 0.1 s; torch's ``torch_key.prefetch``,
      where torch has it).

    Started early, they run beside what the process does before its first compiled step (a first collect),
    and that compile finds their answers cached. A failure here is left to that compile, which does the
    work again and reports its own failure."""

    def check() -> None:
        try:
            from torch._inductor import codecache, cpu_vec_isa  # importing them takes about a second

            prefetch = getattr(codecache.torch_key, "prefetch", None)
            if prefetch is not None:  # on torch's own thread, beside the check below
                prefetch()
            cpu_vec_isa.valid_vec_isa_list()
        except Exception:  # noqa: BLE001 (the compile does the work again and reports its own failure)
            pass

    threading.Thread(target=check, name="inductor-cpu-checks", daemon=True).start()


def inductor_options(mode: str, *, cpp_wrapper: bool) -> dict[str, Any]:
    """Inductor's options of ``torch.compile(mode=mode)``, with its C++ wrapper where ``cpp_wrapper``: the
    graph's kernels and matmuls then called from generated C++ instead of generated Python (the same
    kernels, so the same results; a longer first compile)."""
    options = dict(torch._inductor.list_mode_options(mode))
    if cpp_wrapper:
        options["cpp_wrapper"] = True
    return options


def own_code(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A function that calls ``fn``, with a code object made for it alone, named ``name``: Dynamo keys its
    cache of compiled graphs, and its recompile count, on the code object of the function it compiles, which
    ``fn`` shares with every other instance of its class (Dynamo inlines ``fn`` into the caller's graph)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    call.__code__ = call.__code__.replace(co_name=name, co_qualname=name)
    call.__name__ = call.__qualname__ = name
    return call


class _CompiledOnce:
    """``fn`` compiled with ``torch.compile(mode=mode)``, through a code object of its own (:func:`own_code`);
    eager from the first call that fails to compile or would recompile past Dynamo's recompile limit, after
    one warning naming ``what`` and the cause. The first compiled call's wall time, compile and run together,
    is kept as :attr:`compile_s`."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        what: str,
        mode: str,
        policy_name: str,
        cpp_wrapper: bool = False,
        dynamic_sources: str = "",
    ):
        self.eager_fn = fn
        self.what = what
        self.mode = mode
        self.policy_name = policy_name
        name = f"{policy_name}_{what}".replace(" ", "_").replace("'", "")
        options = inductor_options(mode, cpp_wrapper=cpp_wrapper)
        self.compiled_fn = torch.compile(own_code(fn, name), options=options)
        # torch >= 2.6 can raise at the recompile limit instead of running the frame eager without a word
        self._limit_hit_error = getattr(torch._dynamo.exc, "FailOnRecompileLimitHit", ())
        # Dynamo's sources compiled as symbols from the first call on (where torch has
        # ``torch.compiler.config.dynamic_sources``; without it, the first call that changes one recompiles)
        compiler_config = getattr(torch.compiler, "config", None)
        has_sources = dynamic_sources and hasattr(compiler_config, "dynamic_sources")
        self._dynamic_sources = dynamic_sources if has_sources else ""
        self.compile_s: float | None = None  # wall seconds of the first compiled call (its run included)
        self.fallback_reason: str | None = None  # why it runs eager, once it does

    @property
    def compiled(self) -> bool:
        return self.fallback_reason is None

    def _run(self, run_compiled: Callable[[], Any], run_eager: Callable[[], Any]) -> Any:
        """``run_compiled()`` while it compiles, else ``run_eager()`` (a failed compile has run nothing)."""
        if not self.compiled:
            return run_eager()
        t0 = time.perf_counter()
        dynamo = torch._dynamo.config
        if self._limit_hit_error:  # a call past the recompile limit raises before running anything
            fail_on_limit, dynamo.fail_on_recompile_limit_hit = dynamo.fail_on_recompile_limit_hit, True
        if self._dynamic_sources:  # read where Dynamo compiles: the user's own entries kept
            user_sources = torch.compiler.config.dynamic_sources
            ours = (user_sources, self._dynamic_sources)
            torch.compiler.config.dynamic_sources = ",".join(filter(None, ours))
        try:
            out = run_compiled()
        except self._limit_hit_error:
            limit = getattr(dynamo, "recompile_limit", None) or dynamo.cache_size_limit  # the older name
            why = f"past Dynamo's recompile_limit, {limit}; TORCH_LOGS=recompiles says why"
            self._fall_back(why, stacklevel=4)  # the caller of __call__
            return run_eager()
        except Exception as exc:  # noqa: BLE001 (any compile failure: the eager call runs next)
            if self.compile_s is not None:
                raise  # compiled before: an error of the call, not of compiling
            self._fall_back(exc, stacklevel=4)  # the caller of __call__
            return run_eager()
        finally:
            if self._limit_hit_error:
                dynamo.fail_on_recompile_limit_hit = fail_on_limit
            if self._dynamic_sources:
                torch.compiler.config.dynamic_sources = user_sources
        if self.compile_s is None:
            self.compile_s = time.perf_counter() - t0
        return out

    def _fall_back(self, exc: Exception | str, *, part: str = "", stacklevel: int) -> None:
        """Run eager from now on, after one warning naming ``exc`` (and the ``part`` that did not compile)."""
        if isinstance(exc, str):
            self.fallback_reason = f"{part}{exc}"
        else:  # the first two lines: Inductor says "backend raised:" first and the cause next
            said = [line.strip() for line in str(exc).splitlines() if line.strip()][:2]
            self.fallback_reason = f"{part}{type(exc).__name__}: {' '.join(said)[:300]}"
        warnings.warn(
            f"learn.compile={self.mode}: {self.policy_name}'s {self.what} does not compile "
            f"({self.fallback_reason}); it runs eager",
            ConfigWarning,
            stacklevel=stacklevel,
        )


class CompiledLoss(_CompiledOnce):
    """``loss_fn(model, batch, train_iter=...)`` compiled, called on :func:`tensor_batch` batches; eager (on
    the batch as it came, its arrays where it reads numpy) from the first call that fails to compile."""

    def __init__(
        self,
        loss_fn: Callable[..., Any],
        *,
        mode: str,
        device: torch.device,
        policy_name: str,
        cpp_wrapper: bool = False,
        eager_inputs: Callable[[torch.nn.Module, TrainBatch], dict[str, Any]] | None = None,
    ):
        super().__init__(
            loss_fn,
            what="loss",
            mode=mode,
            policy_name=policy_name,
            cpp_wrapper=cpp_wrapper,
            dynamic_sources=STEP_COUNT_SOURCE,
        )
        self.device = device
        self.eager_inputs = eager_inputs  # the policy's eager_loss_inputs: computed before the graph
        self._backward_timed = False

    def backward(self, loss: torch.Tensor) -> bool:
        """``loss.backward()`` for a loss this object returned; False where it did not run. AOTAutograd
        compiles a graph's backward at its first backward call, so the first one after the compiled forward
        adds its wall time (compile and run together) to :attr:`compile_s`; if that compile fails, the loss
        warns once, naming the cause, and runs eager from then on, and this call returns False with no
        gradient written (the caller runs the step's loss again, eager, and its backward)."""
        first = self.compile_s is not None and not self._backward_timed
        if not first:
            loss.backward()
            return True
        t0 = time.perf_counter()
        try:
            loss.backward()
        except Exception as exc:  # noqa: BLE001 (any compile failure: the caller redoes the step eager)
            self._fall_back(exc, part="its backward: ", stacklevel=4)  # Learner.finish_step
            return False
        self.compile_s += time.perf_counter() - t0
        self._backward_timed = True
        return True

    def __call__(self, model: torch.nn.Module, batch: TrainBatch, **kwargs: Any) -> Any:
        kwargs.pop("ssl_latent", None)  # encoded in the graph (module docstring)
        if self.compiled and self.eager_inputs is not None:  # outside _run: their errors are not compiling's
            kwargs.update(self.eager_inputs(model, batch))
        out = self._run(
            lambda: self.compiled_fn(model, tensor_batch(batch, self.device), **kwargs),
            lambda: self.eager_fn(model, batch, **kwargs),
        )
        return out.host_side() if isinstance(out, LossTensors) else out  # the graph ends before it


def optimizer_step_compiles(lr_schedule: str, grad_scaler_enabled: bool) -> bool:
    """Whether ``learn.compile`` compiles the optimizer's step too: not under a learning rate that changes
    every step (each value would compile anew) nor behind fp16's gradient scaler (which steps the optimizer
    itself, skipping steps with inf gradients)."""
    return lr_schedule != "cosine" and not grad_scaler_enabled


class CompiledOptimizerStep(_CompiledOnce):
    """``optimizer.step()`` compiled; eager from the first call that fails to compile."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, *, mode: str, policy_name: str, cpp_wrapper: bool = False
    ):
        super().__init__(
            optimizer.step, what="optimizer step", mode=mode, policy_name=policy_name, cpp_wrapper=cpp_wrapper
        )

    def __call__(self) -> None:
        self._run(self.compiled_fn, self.eager_fn)
