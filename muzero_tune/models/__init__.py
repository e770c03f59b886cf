"""MuZero networks and the categorical support transforms their heads use."""

from muzero_tune.models.muzero_net import (
    ConvMuZeroNet,
    InitialOutput,
    MLPMuZeroNet,
    MuZeroNetwork,
    RecurrentOutput,
    build_network,
    normalize_latent,
)
from muzero_tune.models.support import (
    Support,
    inverse_scalar_transform,
    logits_to_scalar,
    logits_to_scalar_np,
    scalar_to_target,
    scalar_to_two_hot,
    scalar_transform,
    two_hot_cross_entropy,
)

__all__ = [
    "ConvMuZeroNet",
    "InitialOutput",
    "MLPMuZeroNet",
    "MuZeroNetwork",
    "RecurrentOutput",
    "Support",
    "build_network",
    "inverse_scalar_transform",
    "logits_to_scalar",
    "logits_to_scalar_np",
    "normalize_latent",
    "scalar_to_target",
    "scalar_to_two_hot",
    "scalar_transform",
    "two_hot_cross_entropy",
]
