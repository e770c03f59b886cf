"""Host kernels: the MLP networks' search step as one numba kernel over their parameters' numpy views.

What this module owns
    :func:`host_search_step`, the search's per-simulation model step of an ``MLPMuZeroNet`` (the network
    call and the decoding of its reward and value), and :func:`host_recurrent_outputs`, the call alone
    (one-hot action, dynamics trunk, latent and reward heads, min-max normalisation, prediction trunk,
    value and policy heads); :func:`host_value_prefix_step`, the same step of an ``MLPEfficientZeroNet`` on
    its packed node states (the horizon's LSTM reset, the LSTM cell, the value-prefix head, the child's
    packed state); :func:`host_afterstate_step` and :func:`host_chance_step`, an
    ``MLPStochasticMuZeroNet``'s two search steps (the chance step is the MuZero kernel over one-hot chance
    codes); and the per-model plan of which parameter arrays each kernel reads. Each runs as one
    compiled numba function on CPU float32 arrays. Why: at the search's batch sizes (one row per env) the
    network's arithmetic is a few microseconds and the rest of a torch call, traced or eager, is per-op
    dispatch; one kernel call costs about a quarter of the traced graph's, and a CartPole collect step
    about a third (``scripts/bench/bench_acting.py``).

What it must never do
    Copy the weights: the plan holds numpy views of the parameters' storage, so in-place weight loads
    (``load_state_dict``, the collectors' weight sync, the target network's update) are seen at once, and
    the plan is made again when a parameter is replaced (``.to(device)``, a new tensor). Run where its
    arithmetic is not the model's: under autograd, under autocast, off the CPU, in a dtype other than
    float32, or for a network whose dynamics, prediction, action input or module layout differ from those
    classes' (a subclass that overrides them gets ``None`` and its caller's traced or eager call). Its
    results equal the eager call's within float32 rounding (summation order), not bit for bit.
"""
from __future__ import annotations

import threading
import weakref

import numba
import numpy as np
import torch
from numba import types
from numba.typed import List
from torch import Tensor, nn

from muzero_tune.models.efficientzero_net import MLPEfficientZeroNet
from muzero_tune.models.muzero_net import MLPMuZeroNet, MuZeroNetwork
from muzero_tune.models.stochastic_net import MLPStochasticMuZeroNet
from muzero_tune.models.support import DEFAULT_EPS, _logits_to_scalar_np
from muzero_tune.models.traced import autocast_dtype, first_parameter_owner

__all__ = [
    "MAX_ROWS", "host_afterstate_step", "host_chance_step", "host_kernel_kind", "host_recurrent_outputs",
    "host_search_step", "host_value_prefix_step",
]

# reassociation lets the dot products vectorise; NaN and inf keep their IEEE meaning
_FAST = {"reassoc", "contract"}

# One trunk layer: Linear weight [O, I], bias [O], LayerNorm weight [O], bias [O].
_LAYER = types.Tuple((types.float32[:, ::1], types.float32[::1], types.float32[::1], types.float32[::1]))


# A trunk's typed list of layers is built by these cached functions: a list built from Python compiles the
# list's methods in every process (about 0.4 s of each actor's first search), these load from numba's cache.
@numba.njit(cache=True)
def _layer_list(layers):
    """A typed list of ``layers`` (a tuple of :data:`_LAYER` tuples, at least one)."""
    out = List.empty_list(_LAYER)
    for layer in layers:
        out.append(layer)
    return out


@numba.njit(cache=True)
def _no_layers():
    """An empty typed list of :data:`_LAYER` (a trunk without layers)."""
    return List.empty_list(_LAYER)


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _linear(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """x [N, I] @ w.T [I, O] + b [O] -> [N, O] float32."""
    n, i_dim = x.shape
    o_dim = w.shape[0]
    out = np.empty((n, o_dim), dtype=np.float32)
    for r in range(n):
        for o in range(o_dim):
            acc = np.float32(0.0)
            for k in range(i_dim):
                acc += x[r, k] * w[o, k]
            out[r, o] = acc + b[o]
    return out


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _layer_norm_relu_(x: np.ndarray, g: np.ndarray, beta: np.ndarray, eps: float) -> None:
    """relu(LayerNorm(x) * g + beta) over each row of x [N, D], in place (biased variance, as torch)."""
    n, d = x.shape
    for r in range(n):
        mean = np.float32(0.0)
        for k in range(d):
            mean += x[r, k]
        mean /= d
        var = np.float32(0.0)
        for k in range(d):
            t = x[r, k] - mean
            var += t * t
        var /= d
        inv = np.float32(1.0) / np.sqrt(var + np.float32(eps))
        for k in range(d):
            y = (x[r, k] - mean) * inv * g[k] + beta[k]
            x[r, k] = y if y > 0 else np.float32(0.0)


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _trunk(x: np.ndarray, layers, eps: float) -> np.ndarray:
    """``len(layers)`` x (Linear -> LayerNorm -> ReLU) on x [N, I] -> [N, H] (x itself for no layers)."""
    for w, b, g, beta in layers:
        x = _linear(x, w, b)
        _layer_norm_relu_(x, g, beta, eps)
    return x


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _minmax_(x: np.ndarray, eps: float) -> None:
    """Each row of x [N, D] scaled to [0, 1] in place (``muzero_net.normalize_latent``)."""
    n, d = x.shape
    for r in range(n):
        lo = x[r, 0]
        hi = x[r, 0]
        for k in range(1, d):
            lo = min(lo, x[r, k])
            hi = max(hi, x[r, k])
        span = max(hi - lo, np.float32(eps))
        for k in range(d):
            x[r, k] = (x[r, k] - lo) / span


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _dynamics(latent, action, dyn_layers, dyn_latent_w, dyn_latent_b, ln_eps):
    """``MLPMuZeroNet``'s dynamics trunk and latent head on (latent, one-hot action): latent [N, L], action
    [N] int64 -> (trunk output [N, H], min-max normalised next latent [N, L]). The one-hot's width is the
    first layer's input less L (the actions, or Stochastic MuZero's chance codes)."""
    n, latent_dim = latent.shape
    first_w = dyn_layers[0][0] if len(dyn_layers) else dyn_latent_w
    num_actions = first_w.shape[1] - latent_dim
    x = np.zeros((n, latent_dim + num_actions), dtype=np.float32)
    for r in range(n):
        if action[r] < 0 or action[r] >= num_actions:
            raise ValueError("an action is outside [0, num_actions)")
        for k in range(latent_dim):
            x[r, k] = latent[r, k]
        x[r, latent_dim + action[r]] = 1.0
    hidden = _trunk(x, dyn_layers, ln_eps)
    next_latent = _linear(hidden, dyn_latent_w, dyn_latent_b)
    _minmax_(next_latent, 1e-5)
    return hidden, next_latent


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _recurrent(latent, action, dyn_layers, dyn_latent_w, dyn_latent_b, dyn_reward_w, dyn_reward_b,
               pred_layers, value_w, value_b, policy_w, policy_b, ln_eps):  # fmt: skip
    """latent [N, L] float32, action [N] int64 -> (next latent [N, L], reward logits [N, 2Sr+1], value
    logits [N, 2Sv+1], policy logits [N, A]), all float32."""
    hidden, next_latent = _dynamics(
        latent, action, dyn_layers, dyn_latent_w, dyn_latent_b, ln_eps
    )
    reward = _linear(hidden, dyn_reward_w, dyn_reward_b)
    pred_hidden = _trunk(next_latent, pred_layers, ln_eps)
    value = _linear(pred_hidden, value_w, value_b)
    return next_latent, reward, value, _linear(pred_hidden, policy_w, policy_b)


@numba.njit(cache=True, nogil=True)
def _step(reward_support_size, value_support_size, eps, latent, action, dyn_layers, dyn_latent_w,
          dyn_latent_b, dyn_reward_w, dyn_reward_b, pred_layers, value_w, value_b, policy_w, policy_b,
          ln_eps):  # fmt: skip
    """:func:`_recurrent` with its reward and value logits decoded: (next latent [N, L], reward [N], value
    [N], policy logits [N, A]). (Flat arguments: a nested tuple costs numba far more to unbox.)"""
    next_latent, reward_logits, value_logits, policy = _recurrent(
        latent, action, dyn_layers, dyn_latent_w, dyn_latent_b, dyn_reward_w, dyn_reward_b, pred_layers,
        value_w, value_b, policy_w, policy_b, ln_eps,
    )
    reward = _logits_to_scalar_np(reward_logits, reward_support_size, eps)
    value = _logits_to_scalar_np(value_logits, value_support_size, eps)
    return next_latent, reward, value, policy


@numba.njit(cache=True, nogil=True)
def _afterstate_step(value_support_size, eps, latent, action, after_layers, after_out_w, after_out_b,
                     after_pred_layers, q_w, q_b, chance_w, chance_b, ln_eps):  # fmt: skip
    """``MLPStochasticMuZeroNet.afterstate_inference`` with its Q logits decoded: latent [N, L], action [N]
    int64 -> (afterstate [N, L], Q [N], chance logits [N, C])."""
    _, afterstate = _dynamics(latent, action, after_layers, after_out_w, after_out_b, ln_eps)
    hidden = _trunk(afterstate, after_pred_layers, ln_eps)
    q = _logits_to_scalar_np(_linear(hidden, q_w, q_b), value_support_size, eps)
    return afterstate, q, _linear(hidden, chance_w, chance_b)


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _sigmoid(x):
    """1 / (1 + exp(-x)), float32."""
    return np.float32(1.0) / (np.float32(1.0) + np.exp(-x))


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _value_prefix_step(horizon, reward_support_size, value_support_size, eps, packed, action, dyn_layers,
                       dyn_latent_w, dyn_latent_b, w_ih, w_hh, b_ih, b_hh, prefix_g, prefix_beta, prefix_eps,
                       prefix_w, prefix_b, pred_layers, value_w, value_b, policy_w, policy_b,
                       ln_eps):  # fmt: skip
    """``MLPEfficientZeroNet``'s search step on packed node states (``policies.efficientzero``'s layout):
    packed [N, L + 2H + 2] (latent, LSTM h, c, depth, value prefix) float32, action [N] int64 ->
    (child packed [N, L + 2H + 2], rewards [N] (this prefix less the parent's, or the whole prefix where the
    parent starts a horizon: depth % horizon == 0, zero LSTM state), values [N], policy logits [N, A])."""
    n, width = packed.shape
    hid = w_hh.shape[1]
    latent_dim = width - 2 * hid - 2
    latent = np.ascontiguousarray(packed[:, :latent_dim])
    _, next_latent = _dynamics(  # this network's LSTM reads the next latent, not the trunk's output
        latent, action, dyn_layers, dyn_latent_w, dyn_latent_b, ln_eps
    )
    # LSTMCell(next latent, (h, c)): gates i, f, g, o (torch's order) from both products
    h = np.zeros((n, hid), dtype=np.float32)
    c = np.zeros((n, hid), dtype=np.float32)
    base = np.zeros(n, dtype=np.float32)
    for r in range(n):
        if packed[r, width - 2] % horizon != 0:
            for k in range(hid):
                h[r, k] = packed[r, latent_dim + k]
                c[r, k] = packed[r, latent_dim + hid + k]
            base[r] = packed[r, width - 1]
    gates = _linear(next_latent, w_ih, b_ih)
    gates += _linear(h, w_hh, b_hh)
    next_h = np.empty((n, hid), dtype=np.float32)
    next_c = np.empty((n, hid), dtype=np.float32)
    for r in range(n):
        for k in range(hid):
            i_gate = _sigmoid(gates[r, k])
            f_gate = _sigmoid(gates[r, hid + k])
            g_gate = np.tanh(gates[r, 2 * hid + k])
            o_gate = _sigmoid(gates[r, 3 * hid + k])
            cell = f_gate * c[r, k] + i_gate * g_gate
            next_c[r, k] = cell
            next_h[r, k] = o_gate * np.tanh(cell)
    head = next_h.copy()
    _layer_norm_relu_(head, prefix_g, prefix_beta, prefix_eps)
    prefix = _logits_to_scalar_np(_linear(head, prefix_w, prefix_b), reward_support_size, eps)
    pred_hidden = _trunk(next_latent, pred_layers, ln_eps)
    value = _logits_to_scalar_np(_linear(pred_hidden, value_w, value_b), value_support_size, eps)
    policy = _linear(pred_hidden, policy_w, policy_b)
    child = np.empty((n, width), dtype=np.float32)
    for r in range(n):
        for k in range(latent_dim):
            child[r, k] = next_latent[r, k]
        for k in range(hid):
            child[r, latent_dim + k] = next_h[r, k]
            child[r, latent_dim + hid + k] = next_c[r, k]
        child[r, width - 2] = packed[r, width - 2] + np.float32(1.0)
        child[r, width - 1] = prefix[r]
    return child, prefix - base, value, policy


def _plan_args(model: nn.Module, kind: str, eps: float) -> tuple:
    """The kernel's arguments after its inputs for ``model`` (``kind``: "reward" for :func:`_recurrent`,
    "value_prefix" for :func:`_value_prefix_step`, "chance" for both of Stochastic MuZero's steps, a pair):
    numpy views of its parameters, each trunk as a typed list of its layers, the trunks' LayerNorm eps
    last."""

    def view(p: Tensor) -> np.ndarray:
        return p.detach().numpy()

    def layers(trunk: nn.Sequential):
        per_layer = tuple(
            (view(lin.weight), view(lin.bias), view(norm.weight), view(norm.bias))
            for lin, norm in zip(trunk[0::3], trunk[1::3], strict=True)
        )
        return _layer_list(per_layer) if per_layer else _no_layers()

    if kind == "chance":  # (afterstate step's arguments, chance step's arguments)
        return (
            (layers(model.after_trunk), view(model.after_out.weight), view(model.after_out.bias),
             layers(model.after_pred_trunk), view(model.after_pred_value.weight),
             view(model.after_pred_value.bias), view(model.after_pred_chance.weight),
             view(model.after_pred_chance.bias), eps),
            (layers(model.dyn_trunk), view(model.dyn_latent.weight), view(model.dyn_latent.bias),
             view(model.dyn_reward.weight), view(model.dyn_reward.bias), layers(model.pred_trunk),
             view(model.pred_value.weight), view(model.pred_value.bias), view(model.pred_policy.weight),
             view(model.pred_policy.bias), eps),
        )  # fmt: skip
    dynamics = (layers(model.dyn_trunk), view(model.dyn_latent.weight), view(model.dyn_latent.bias))
    prediction = (
        layers(model.pred_trunk), view(model.pred_value.weight), view(model.pred_value.bias),
        view(model.pred_policy.weight), view(model.pred_policy.bias), eps,
    )  # fmt: skip
    if kind == "reward":
        return (*dynamics, view(model.dyn_reward.weight), view(model.dyn_reward.bias), *prediction)
    lstm, (norm, _, head) = model.lstm, model.value_prefix_head
    return (
        *dynamics, view(lstm.weight_ih), view(lstm.weight_hh), view(lstm.bias_ih), view(lstm.bias_hh),
        view(norm.weight), view(norm.bias), float(norm.eps), view(head.weight), view(head.bias), *prediction,
    )  # fmt: skip


def _trunks_eps(*trunks: nn.Sequential) -> float | None:
    """The LayerNorm eps of ``trunks`` where each is (Linear -> LayerNorm -> ReLU) x n with biases and affine
    norms, one eps throughout (1e-5 for empty trunks); else None."""
    eps = set()
    for trunk in trunks:
        if len(trunk) % 3:
            return None
        for i in range(0, len(trunk), 3):
            lin, norm, act = trunk[i], trunk[i + 1], trunk[i + 2]
            if not (type(lin) is nn.Linear and type(norm) is nn.LayerNorm and type(act) is nn.ReLU):
                return None
            if lin.bias is None or not norm.elementwise_affine or norm.bias is None:
                return None
            eps.add(float(norm.eps))
    if len(eps) > 1:
        return None
    return eps.pop() if eps else 1e-5


def _overrides(cls: type, names: tuple[str, ...], base: type) -> bool:
    return any(getattr(cls, name) is not getattr(base, name) for name in names)


def _layout(model: nn.Module) -> tuple[str, float] | None:
    """(kernel kind, the trunks' LayerNorm eps) where ``model`` computes exactly what a kernel does: "reward"
    (``MLPMuZeroNet``, :func:`_recurrent`), "value_prefix" (``MLPEfficientZeroNet``,
    :func:`_value_prefix_step`) or "chance" (``MLPStochasticMuZeroNet``: :func:`_afterstate_step`, and
    :func:`_step` for its chance step); None for any other network, a subclass that overrides their dynamics,
    prediction or action input, or parameters off the CPU or not float32."""
    if not isinstance(model, (MLPMuZeroNet, MLPStochasticMuZeroNet)):
        return None
    if any(p.device.type != "cpu" or p.dtype != torch.float32 for p in model.parameters()):
        return None
    cls = type(model)
    if isinstance(model, MLPStochasticMuZeroNet):
        if _overrides(cls, ("afterstate_inference", "afterstate_dynamics", "afterstate_predict",
                            "chance_inference", "dynamics", "predict"), MLPStochasticMuZeroNet):  # fmt: skip
            return None
        eps = _trunks_eps(model.after_trunk, model.after_pred_trunk, model.dyn_trunk, model.pred_trunk)
        return None if eps is None else ("chance", eps)
    if _overrides(cls, ("predict", "action_features"), MLPMuZeroNet):
        return None
    if isinstance(model, MLPEfficientZeroNet):
        if _overrides(cls, ("recurrent_inference", "dynamics_with_state", "_dynamics_features"),
                      MLPEfficientZeroNet):  # fmt: skip
            return None
        lstm, head = model.lstm, model.value_prefix_head
        if type(lstm) is not nn.LSTMCell or lstm.bias_ih is None or len(head) != 3:
            return None
        norm, act, lin = head
        if not (type(norm) is nn.LayerNorm and type(act) is nn.ReLU and type(lin) is nn.Linear):
            return None
        if not norm.elementwise_affine or norm.bias is None or lin.bias is None:
            return None
        kind = "value_prefix"
    elif _overrides(cls, ("recurrent_inference",), MuZeroNetwork) or _overrides(
        cls, ("dynamics",), MLPMuZeroNet
    ):
        return None
    else:
        kind = "reward"
    eps = _trunks_eps(model.dyn_trunk, model.pred_trunk)
    return None if eps is None else (kind, eps)


# The most rows a call runs on the host kernel: at the search's batch sizes (one row per env) it is several
# times faster than the traced graph; at the learner's reanalyze batches (hundreds of rows) oneDNN's matmuls
# win (scripts/bench/bench_acting.py --host-rows).
MAX_ROWS = 64

# model -> (module owning the first parameter, its attribute name, that parameter's data_ptr, (kernel kind,
# its arguments) or None where the model's layout is no kernel's)
_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _plan(model: nn.Module) -> tuple[str, tuple] | None:
    """(kernel kind, its arguments) for ``model`` (cached; made again when its first parameter was replaced:
    a ``.to(device)`` or an assigning load replaces them all), or None where no kernel applies."""
    cached = _PLANS.get(model)
    # the first parameter looked up through its owner, so a replaced parameter is seen
    if cached is not None and cached[0]._parameters[cached[1]].data_ptr() == cached[2]:
        return cached[3]
    with _LOCK:
        layout = _layout(model)
        plan = None
        if layout is not None:
            try:
                plan = layout[0], _plan_args(model, *layout)
            except Exception:  # noqa: BLE001 -- a parameter numba cannot view (strides): the caller's call
                plan = None
        owner, attr = first_parameter_owner(model)
        _PLANS[model] = (owner, attr, owner._parameters[attr].data_ptr(), plan)
    return plan


def _actions(action: np.ndarray, rows: int) -> np.ndarray:
    """``action`` as [rows] int64 (the kernels index with it unchecked, so its length is checked here)."""
    a = np.asarray(action).reshape(-1).astype(np.int64, copy=False)
    if len(a) != rows:
        raise ValueError(f"action batch {len(a)} does not match latent batch {rows}")
    return a


def host_kernel_kind(model: nn.Module) -> str | None:
    """Which host kernel runs ``model``'s search steps: "reward" (:func:`host_search_step`), "value_prefix"
    (:func:`host_value_prefix_step`), "chance" (:func:`host_afterstate_step` and :func:`host_chance_step`),
    or None where none does (its layout, device or dtype; the per-call
    conditions, autograd, autocast and row counts, are checked at each call)."""
    if not getattr(model, "host_recurrent", False):
        return None
    plan = _plan(model)
    return None if plan is None else plan[0]


def _inputs(model: nn.Module, x: Tensor, kind: str) -> tuple | None:
    """(x as a C-contiguous [B, F] float32 array, the ``kind`` kernel's other arguments) where that kernel
    runs this call, else None (the module docstring's cases, and batches over :data:`MAX_ROWS`)."""
    if not getattr(model, "host_recurrent", False) or torch.is_grad_enabled():
        return None
    if x.device.type != "cpu" or x.dtype != torch.float32 or len(x) > MAX_ROWS or x.requires_grad:
        return None
    if autocast_dtype("cpu") is not None:
        return None
    plan = _plan(model)
    if plan is None or plan[0] != kind:
        return None
    a = x.numpy()
    if a.ndim != 2 or not a.flags.c_contiguous:
        a = np.ascontiguousarray(a.reshape(len(a), -1))
    return a, plan[1]


def host_recurrent_outputs(
    model: nn.Module, latent: Tensor, action: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
    """(next latent [B, L], reward logits [B, 2Sr+1], value logits [B, 2Sv+1], policy logits [B, A]) of
    ``model.recurrent_inference(latent [B, L], action [B] int)`` by the host kernel, as CPU float32 tensors
    over fresh arrays; None where the module docstring says the kernel does not run (the caller runs its
    traced or eager call then)."""
    inputs = _inputs(model, latent, "reward")
    if inputs is None:
        return None
    a = _actions(action.reshape(-1).numpy(), len(inputs[0]))
    return tuple(torch.from_numpy(o) for o in _recurrent(inputs[0], a, *inputs[1]))  # type: ignore[return-value]


def host_search_step(
    model: nn.Module, latent: Tensor, action: np.ndarray, *, reward_support_size: int,
    value_support_size: int, eps: float = DEFAULT_EPS,
) -> tuple[Tensor, np.ndarray, np.ndarray, np.ndarray] | None:  # fmt: skip
    """The search's model step by the host kernel: (next latent [B, L] float32 tensor, rewards [B], values
    [B] (the logits decoded as ``support.logits_to_scalar_np`` does), policy logits [B, A]) float32 arrays,
    all fresh; None where :func:`host_recurrent_outputs` would be."""
    inputs = _inputs(model, latent, "reward")
    if inputs is None:
        return None
    a = _actions(action, len(inputs[0]))
    next_latent, reward, value, policy = _step(
        reward_support_size, value_support_size, eps, inputs[0], a, *inputs[1]
    )
    return torch.from_numpy(next_latent), reward, value, policy


def host_value_prefix_step(
    model: nn.Module, packed: Tensor, action: np.ndarray, *, horizon: int, reward_support_size: int,
    value_support_size: int, eps: float = DEFAULT_EPS,
) -> tuple[Tensor, np.ndarray, np.ndarray, np.ndarray] | None:  # fmt: skip
    """EfficientZero's search step by the host kernel (``MLPEfficientZeroNet``): packed node states
    [B, L + 2H + 2] (``policies.efficientzero.pack_search_state``), actions [B] -> (children's packed
    states [B, L + 2H + 2] float32 tensor, rewards [B], values [B], policy logits [B, A] float32 arrays);
    a parent at depth % ``horizon`` == 0 starts a new horizon (zero LSTM state, its child's reward is the
    whole prefix). None where the kernel does not run (as :func:`host_recurrent_outputs`)."""
    inputs = _inputs(model, packed, "value_prefix")
    if inputs is None:
        return None
    a = _actions(action, len(inputs[0]))
    child, reward, value, policy = _value_prefix_step(
        horizon, reward_support_size, value_support_size, eps, inputs[0], a, *inputs[1]
    )
    return torch.from_numpy(child), reward, value, policy


def host_afterstate_step(
    model: nn.Module, latent: Tensor, action: np.ndarray, *, value_support_size: int, eps: float = DEFAULT_EPS
) -> tuple[Tensor, np.ndarray, np.ndarray] | None:
    """Stochastic MuZero's afterstate step by the host kernel (``MLPStochasticMuZeroNet``): latents
    [B, L], actions [B] -> (afterstates [B, L] float32 tensor, Q [B] decoded, chance logits [B, C] float32
    arrays); None where the kernel does not run (as :func:`host_recurrent_outputs`)."""
    inputs = _inputs(model, latent, "chance")
    if inputs is None:
        return None
    a = _actions(action, len(inputs[0]))
    afterstate, q, chance = _afterstate_step(value_support_size, eps, inputs[0], a, *inputs[1][0])
    return torch.from_numpy(afterstate), q, chance


def host_chance_step(
    model: nn.Module, afterstate: Tensor, code: np.ndarray, *, reward_support_size: int,
    value_support_size: int, eps: float = DEFAULT_EPS,
) -> tuple[Tensor, np.ndarray, np.ndarray, np.ndarray] | None:  # fmt: skip
    """Stochastic MuZero's chance step by the host kernel: afterstates [B, L], chance code indices [B] ->
    (latents [B, L] float32 tensor, rewards [B], values [B], policy logits [B, A] float32 arrays); None
    where the kernel does not run."""
    inputs = _inputs(model, afterstate, "chance")
    if inputs is None:
        return None
    c = _actions(code, len(inputs[0]))
    latent, reward, value, policy = _step(
        reward_support_size, value_support_size, eps, inputs[0], c, *inputs[1][1]
    )
    return torch.from_numpy(latent), reward, value, policy
