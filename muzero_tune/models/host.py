"""Host kernels: the MLP MuZero network's search call as one numba kernel over its parameters' numpy views.

What this module owns
    :func:`host_search_step`, the search's per-simulation model step (the network call and the decoding
    of its reward and value), and :func:`host_recurrent_outputs`, the call alone:
    ``MLPMuZeroNet.recurrent_inference`` (one-hot action, dynamics trunk, latent and reward heads, min-max
    normalisation, prediction trunk, value and policy heads) computed by one compiled numba function on
    CPU float32 arrays; and the per-model plan of which parameter arrays it reads. Why: at the search's
    batch sizes (one row per env) the network's arithmetic is a few microseconds and the rest of a torch
    call, traced or eager, is per-op dispatch; one kernel call costs about a fifth of the traced graph's
    (``scripts/bench/bench_acting.py``), and the network call is most of a CartPole collect step.

What it must never do
    Copy the weights: the plan holds numpy views of the parameters' storage, so in-place weight loads
    (``load_state_dict``, the collectors' weight sync, the target network's update) are seen at once, and
    the plan is made again when a parameter is replaced (``.to(device)``, a new tensor). Run where its
    arithmetic is not the model's: under autograd, under autocast, off the CPU, in a dtype other than
    float32, or for a network whose dynamics, prediction or module layout differ from ``MLPMuZeroNet``'s
    (a subclass that overrides them gets ``None`` and its caller's traced or eager call). Its results equal
    the eager call's within float32 rounding (summation order), not bit for bit.
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

from muzero_tune.models.muzero_net import MLPMuZeroNet, MuZeroNetwork
from muzero_tune.models.support import DEFAULT_EPS, _logits_to_scalar_np
from muzero_tune.models.traced import autocast_dtype

__all__ = ["MAX_ROWS", "host_recurrent_outputs", "host_search_step"]

# reassociation lets the dot products vectorise; NaN and inf keep their IEEE meaning
_FAST = {"reassoc", "contract"}

# One trunk layer: Linear weight [O, I], bias [O], LayerNorm weight [O], bias [O].
_LAYER = types.Tuple((types.float32[:, ::1], types.float32[::1], types.float32[::1], types.float32[::1]))


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
def _trunk(x: np.ndarray, layers, eps: float) -> np.ndarray:
    """``len(layers)`` x (Linear -> LayerNorm -> ReLU) on x [N, I] -> [N, H] (x itself for no layers)."""
    for w, b, g, beta in layers:
        x = _linear(x, w, b)
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
def _recurrent(latent, action, dyn_layers, dyn_latent_w, dyn_latent_b, dyn_reward_w, dyn_reward_b,
               pred_layers, value_w, value_b, policy_w, policy_b, ln_eps):  # fmt: skip
    """latent [N, L] float32, action [N] int64 -> (next latent [N, L], reward logits [N, 2Sr+1], value
    logits [N, 2Sv+1], policy logits [N, A]), all float32."""
    n, latent_dim = latent.shape
    num_actions = policy_w.shape[0]
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


def _plan_args(model: MLPMuZeroNet, eps: float) -> tuple:
    """The kernel's arguments after (latent, action) for ``model``: numpy views of its parameters, each trunk
    as a typed list of its layers."""

    def view(p: Tensor) -> np.ndarray:
        return p.detach().numpy()

    def layers(trunk: nn.Sequential):
        out = List.empty_list(_LAYER)
        for i in range(0, len(trunk), 3):
            lin, norm = trunk[i], trunk[i + 1]
            out.append((view(lin.weight), view(lin.bias), view(norm.weight), view(norm.bias)))
        return out

    return (
        layers(model.dyn_trunk), view(model.dyn_latent.weight), view(model.dyn_latent.bias),
        view(model.dyn_reward.weight), view(model.dyn_reward.bias), layers(model.pred_trunk),
        view(model.pred_value.weight), view(model.pred_value.bias),
        view(model.pred_policy.weight), view(model.pred_policy.bias), eps,
    )  # fmt: skip


def _layout_eps(model: nn.Module) -> float | None:
    """The trunks' LayerNorm eps where ``model`` computes exactly what :func:`_recurrent` does, else None."""
    if not isinstance(model, MLPMuZeroNet):
        return None
    cls = type(model)
    for name, base in (("recurrent_inference", MuZeroNetwork), ("dynamics", MLPMuZeroNet),
                       ("predict", MLPMuZeroNet), ("action_features", MLPMuZeroNet)):  # fmt: skip
        if getattr(cls, name) is not getattr(base, name):
            return None
    eps = set()
    for trunk in (model.dyn_trunk, model.pred_trunk):
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
    if any(p.device.type != "cpu" or p.dtype != torch.float32 for p in model.parameters()):
        return None
    return eps.pop() if eps else 1e-5


# The most rows a call runs on the host kernel: at the search's batch sizes (one row per env) it is several
# times faster than the traced graph; at the learner's reanalyze batches (hundreds of rows) oneDNN's matmuls
# win (scripts/bench/bench_acting.py --host-rows).
MAX_ROWS = 64

# model -> (module owning the first parameter, its attribute name, that parameter's data_ptr, the kernel's
# arguments or None where the model's layout is not the kernel's)
_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _plan(model: nn.Module) -> tuple | None:
    """The kernel's arguments for ``model`` (cached; made again when its first parameter was replaced: a
    ``.to(device)`` or an assigning load replaces them all), or None where the kernel does not apply."""
    cached = _PLANS.get(model)
    # the first parameter looked up through its owner, so a replaced parameter is seen (models/traced.py)
    if cached is not None and cached[0]._parameters[cached[1]].data_ptr() == cached[2]:
        return cached[3]
    with _LOCK:
        eps = _layout_eps(model)
        args = None
        if eps is not None:
            try:
                args = _plan_args(model, eps)
            except Exception:  # noqa: BLE001 -- a parameter numba cannot view (strides): the caller's call
                args = None
        name = next(n for n, _ in model.named_parameters())
        owner_name, _, attr = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        _PLANS[model] = (owner, attr, owner._parameters[attr].data_ptr(), args)
    return args


def _inputs(model: nn.Module, latent: Tensor) -> tuple | None:
    """(latent as a C-contiguous [B, L] float32 array, the kernel's other arguments) where the kernel runs
    this call, else None (the module docstring's cases, and batches over :data:`MAX_ROWS`)."""
    if not getattr(model, "host_recurrent", False) or torch.is_grad_enabled():
        return None
    if latent.device.type != "cpu" or latent.dtype != torch.float32 or len(latent) > MAX_ROWS:
        return None
    if latent.requires_grad:
        return None
    if autocast_dtype("cpu") is not None:
        return None
    args = _plan(model)
    if args is None:
        return None
    x = latent.numpy()
    if x.ndim != 2 or not x.flags.c_contiguous:
        x = np.ascontiguousarray(x.reshape(len(x), -1))
    return x, args


def host_recurrent_outputs(
    model: nn.Module, latent: Tensor, action: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
    """(next latent [B, L], reward logits [B, 2Sr+1], value logits [B, 2Sv+1], policy logits [B, A]) of
    ``model.recurrent_inference(latent [B, L], action [B] int)`` by the host kernel, as CPU float32 tensors
    over fresh arrays; None where the module docstring says the kernel does not run (the caller runs its
    traced or eager call then)."""
    inputs = _inputs(model, latent)
    if inputs is None:
        return None
    a = action.reshape(-1).numpy().astype(np.int64, copy=False)
    return tuple(torch.from_numpy(o) for o in _recurrent(inputs[0], a, *inputs[1]))  # type: ignore[return-value]


def host_search_step(
    model: nn.Module, latent: Tensor, action: np.ndarray, *, reward_support_size: int,
    value_support_size: int, eps: float = DEFAULT_EPS,
) -> tuple[Tensor, np.ndarray, np.ndarray, np.ndarray] | None:  # fmt: skip
    """The search's model step by the host kernel: (next latent [B, L] float32 tensor, rewards [B], values
    [B] (the logits decoded as ``support.logits_to_scalar_np`` does), policy logits [B, A]) float32 arrays,
    all fresh; None where :func:`host_recurrent_outputs` would be."""
    inputs = _inputs(model, latent)
    if inputs is None:
        return None
    a = np.asarray(action).reshape(-1).astype(np.int64, copy=False)
    next_latent, reward, value, policy = _step(
        reward_support_size, value_support_size, eps, inputs[0], a, *inputs[1]
    )
    return torch.from_numpy(next_latent), reward, value, policy
