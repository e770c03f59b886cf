"""Traced acting calls: a network's ``recurrent_inference`` as one TorchScript-traced graph for the search.

What this module owns
    :func:`recurrent_outputs`, the search's per-simulation network call: for a network that declares
    ``traceable_recurrent = True`` and when autograd is off, a traced twin of ``recurrent_inference``
    (made on first use, cached per model); otherwise the eager call. Measured on this 2-core CPU
    (``scripts/bench_acting.py``): a CartPole MLP recurrent call at batch 8 takes ~0.55x the eager one, since
    per-module Python dispatch dominates tiny batches.

What it must never do
    Freeze weights into the trace: the trace shares the model's parameters, so in-place weight loads
    (``load_state_dict``, the collectors' weight sync) are seen at once. It is made again when the
    parameters are replaced (``.to(device)``), the train/eval mode, the latent's shape or dtype, or the
    action's dtype or rank differ from the trace's; a network whose trace fails is called eagerly after.
"""

from __future__ import annotations

import warnings
import weakref

import torch
from torch import Tensor, nn

__all__ = ["recurrent_outputs"]

# model -> (key, traced module or None, (module owning the first parameter, its attribute name))
_TRACES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Recurrent(nn.Module):
    """``recurrent_inference`` with its output container flattened to a tuple (what tracing needs)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, latent: Tensor, action: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        out = self.net.recurrent_inference(latent, action)
        return out.latent, out.reward_logits, out.value_logits, out.policy_logits


def recurrent_outputs(
    model: nn.Module, latent: Tensor, action: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(next latent [B, *latent_shape], reward logits [B, 2Sr+1], value logits [B, 2Sv+1], policy output
    [B, P]) of ``model.recurrent_inference(latent, action)``, traced where the module docstring says."""
    if not getattr(model, "traceable_recurrent", False) or torch.is_grad_enabled():
        out = model.recurrent_inference(latent, action)
        return out.latent, out.reward_logits, out.value_logits, out.policy_logits
    cached = _TRACES.get(model)
    # the first parameter, looked up through its owner: ``next(model.parameters())`` walks every submodule
    # (~17 us per call for the CartPole MLP, 25 calls per collect step); this sees a replaced parameter too
    first = cached[2][0]._parameters[cached[2][1]] if cached is not None else next(model.parameters())
    key = (first.data_ptr(), model.training, latent.shape[1:], latent.dtype, action.dtype, action.dim())
    if cached is None or (cached[0] != key and cached[1] is not None):
        traced = None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # TracerWarnings about shape checks baked into the graph
                traced = torch.jit.trace(_Recurrent(model), (latent, action), check_trace=False)
        except Exception:  # noqa: BLE001 -- any trace failure means: call this network eagerly
            traced = None
        name = next(n for n, _ in model.named_parameters())
        owner_name, _, attr = name.rpartition(".")
        cached = (key, traced, (model.get_submodule(owner_name), attr))
        _TRACES[model] = cached
    if cached[1] is None:
        out = model.recurrent_inference(latent, action)
        return out.latent, out.reward_logits, out.value_logits, out.policy_logits
    return cached[1](latent, action)
