"""Traced network calls: a network's hot no-grad calls as TorchScript-traced graphs.

What this module owns
    :func:`recurrent_outputs`, the search's per-simulation network call (:func:`recurrent_state_outputs` for
    a network with a recurrent state beside the latent; :func:`traced_method` for any other tensor-only
    method, such as Stochastic MuZero's afterstate and chance steps), and :func:`initial_value_logits`,
    the learner's bootstrap forward (the target network's value at N observations). For a network that
    declares the call traceable (``traceable_recurrent`` / ``traceable_recurrent_state`` /
    ``traceable_initial`` = True: its control flow
    depends on shapes only, and never on the batch size) and when autograd is off, a traced twin of the call
    (made on first use, cached per model and call); otherwise the eager call. Why: per-module Python dispatch
    dominates small batches (a CartPole MLP recurrent call at batch 8 takes ~0.55x the eager one,
    ``scripts/bench/bench_acting.py``), and a traced graph runs without holding the GIL, so the learner's
    helper thread (``learn.overlap_bootstrap``) hardly slows the loss's forward on the main thread. Also
    :func:`autocast_dtype`, the precision autocast runs a call in, which keys the traces (torch >= 2.3).

What it must never do
    Freeze weights into the trace: the trace shares the model's parameters, so in-place weight loads
    (``load_state_dict``, the collectors' weight sync, the learner's target-network update) are seen at once.
    A trace records autocast's casts, so each precision has its own. It is made again when the parameters
    are replaced (``.to(device)``), the train/eval mode, or the inputs' trailing shapes, dtypes or ranks
    differ from the trace's; a call whose shapes take a few values in turn (UniZero's window recompute, one
    width per window length) names a ``variant`` and keeps one trace per value. A network whose trace fails
    is called eagerly after.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Callable

import torch
from torch import Tensor, nn

__all__ = [
    "autocast_dtype", "first_parameter_owner", "initial_value_logits", "make_eager", "recurrent_outputs",
    "recurrent_state_outputs", "traced_method",
]

# model -> {(call name, autocast dtype or None): (key, traced module or None, (module owning the first
# parameter, its attribute name))}
_TRACES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()  # the learner's helper thread and the driver's thread may trace the same model


class _Recurrent(nn.Module):
    """``recurrent_inference`` with its output container flattened to a tuple (what tracing needs)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, latent: Tensor, action: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        out = self.net.recurrent_inference(latent, action)
        return out.latent, out.reward_logits, out.value_logits, out.policy_logits


class _RecurrentWithState(nn.Module):
    """``recurrent_inference(latent, action, (h, c))`` of a network with a recurrent state beside the latent
    (EfficientZero's value-prefix LSTM), its outputs and the next state flattened to a tuple."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(
        self, latent: Tensor, action: Tensor, h: Tensor, c: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        out = self.net.recurrent_inference(latent, action, (h, c))
        next_h, next_c = out.lstm_state
        return out.latent, out.reward_logits, out.value_logits, out.policy_logits, next_h, next_c


class _Method(nn.Module):
    """``net.<name>(*inputs)`` of a method that takes and returns tensors only (a tuple of them)."""

    def __init__(self, net: nn.Module, name: str) -> None:
        super().__init__()
        self.net = net
        self.name = name

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        return getattr(self.net, self.name)(*inputs)


class _InitialValue(nn.Module):
    """``initial_inference(obs).value_logits`` (what the bootstrap values need)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, obs: Tensor) -> Tensor:
        return self.net.initial_inference(obs).value_logits


def make_eager(model: nn.Module) -> nn.Module:
    """``model`` with every call it declares ``traceable_<call>`` (or ``host_recurrent``, models/host.py)
    switched to eager (instance attributes set to False), for comparisons against its traced calls; returns
    it."""
    for attr in [a for a in dir(model) if a.startswith("traceable_") or a == "host_recurrent"]:
        setattr(model, attr, False)
    return model


def first_parameter_owner(model: nn.Module) -> tuple[nn.Module, str]:
    """(the module owning ``model``'s first parameter, its attribute name). ``owner._parameters[name]`` is
    that parameter as it is now: a cheap look-up (``next(model.parameters())`` walks every submodule, ~17 us
    for the CartPole MLP) that also sees a parameter replaced since (``.to(device)``, an assigning load)."""
    name = next(n for n, _ in model.named_parameters())
    owner_name, _, attr = name.rpartition(".")
    return model.get_submodule(owner_name), attr


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast casts to on ``device_type`` ("cpu", "cuda") in this thread, None where it is off.

    torch >= 2.4 asks by device (``torch.is_autocast_enabled("cpu")``); torch 2.3 has one function per device.
    """
    if hasattr(torch, "get_autocast_dtype"):  # torch >= 2.4
        return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
    if device_type == "cpu":
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
    return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None


def _traced(
    model: nn.Module,
    call: str,
    wrapper: Callable[[nn.Module], nn.Module],
    inputs: tuple[Tensor, ...],
    variant: object = None,
) -> nn.Module | None:
    """The cached traced twin of ``wrapper(model)`` for these inputs' trailing shapes and dtypes, or None
    where the call runs eagerly (autograd on, the network not traceable for ``call``, or its trace failed).
    ``variant``: a call whose trailing shapes take a few values in turn keeps one trace per value."""
    if not getattr(model, f"traceable_{call}", False) or torch.is_grad_enabled():
        return None
    # a trace records autocast's casts (learn.mixed_precision): one trace per call and precision
    slot = (call, autocast_dtype(inputs[0].device.type))
    if variant is not None:
        slot = (*slot, variant)
    calls = _TRACES.get(model)
    cached = calls.get(slot) if calls is not None else None
    # the first parameter, looked up through its owner (first_parameter_owner: cheap, sees a replacement)
    first = cached[2][0]._parameters[cached[2][1]] if cached is not None else next(model.parameters())
    key = (first.data_ptr(), model.training, *((x.shape[1:], x.dtype, x.dim()) for x in inputs))
    if cached is None or (cached[0] != key and cached[1] is not None):
        with _LOCK:
            traced = None
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # TracerWarnings about shape checks baked into the graph
                    traced = torch.jit.trace(wrapper(model), inputs, check_trace=False)
            except Exception:  # noqa: BLE001 -- any trace failure means: call this network eagerly
                traced = None
            cached = (key, traced, first_parameter_owner(model))
            _TRACES.setdefault(model, {})[slot] = cached
    return cached[1]


def recurrent_outputs(
    model: nn.Module, latent: Tensor, action: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(next latent [B, *latent_shape], reward logits [B, 2Sr+1], value logits [B, 2Sv+1], policy output
    [B, P]) of ``model.recurrent_inference(latent, action)``, traced where the module docstring says."""
    traced = _traced(model, "recurrent", _Recurrent, (latent, action))
    if traced is None:
        out = model.recurrent_inference(latent, action)
        return out.latent, out.reward_logits, out.value_logits, out.policy_logits
    return traced(latent, action)


def recurrent_state_outputs(
    model: nn.Module, latent: Tensor, action: Tensor, state: tuple[Tensor, Tensor]
) -> tuple[Tensor, Tensor, Tensor, Tensor, tuple[Tensor, Tensor]]:
    """(next latent, value-prefix logits [B, 2Sr+1], value logits [B, 2Sv+1], policy output [B, P], next
    (h, c), each [B, H]) of ``model.recurrent_inference(latent, action, state)`` for a network with a
    recurrent state (``traceable_recurrent_state``), traced where the module docstring says."""
    traced = _traced(model, "recurrent_state", _RecurrentWithState, (latent, action, *state))
    if traced is None:
        out = model.recurrent_inference(latent, action, state)
        return out.latent, out.reward_logits, out.value_logits, out.policy_logits, out.lstm_state
    next_latent, reward_logits, value_logits, policy, h, c = traced(latent, action, *state)
    return next_latent, reward_logits, value_logits, policy, (h, c)


def traced_method(model: nn.Module, name: str, *inputs: Tensor, variant: object = None) -> tuple[Tensor, ...]:
    """``model.<name>(*inputs)`` (tensors in, a tuple of tensors out), traced where the network declares
    ``traceable_<name>`` = True and autograd is off, as the module docstring says. ``variant`` (hashable):
    one trace kept per value, for a call whose inputs' trailing shapes take a few values in turn (a width)."""
    traced = _traced(model, name, lambda net: _Method(net, name), inputs, variant)
    return getattr(model, name)(*inputs) if traced is None else traced(*inputs)


def initial_value_logits(model: nn.Module, obs: Tensor) -> Tensor:
    """Value logits [N, 2Sv+1] of ``model.initial_inference(obs)`` (obs [N, *obs_shape]), traced where the
    module docstring says."""
    traced = _traced(model, "initial", _InitialValue, (obs,))
    return model.initial_inference(obs).value_logits if traced is None else traced(obs)
