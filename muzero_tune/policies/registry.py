"""Policy registry: the policy type name picks the policy class.

This is the only place in the library that maps a policy name to code. The collector, buffer, learner and
drivers receive a policy object and never branch on its name. Importing this module is light (no torch):
``config.validate`` calls :func:`check_policy_type` before anything starts.
"""

from __future__ import annotations

import importlib

from muzero_tune.errors import ConfigError

# name -> "module:Class": the one list of policy type names (a test may substitute a class for a name with
# ``monkeypatch.setitem(POLICY_CLASSES, name, "module:Class")``)
POLICY_CLASSES: dict[str, str] = {
    "muzero": "muzero_tune.policies.muzero:MuZeroPolicy",
    "efficientzero": "muzero_tune.policies.efficientzero:EfficientZeroPolicy",
    "stochastic_muzero": "muzero_tune.policies.stochastic_muzero:StochasticMuZeroPolicy",
    "gumbel_muzero": "muzero_tune.policies.gumbel_muzero:GumbelMuZeroPolicy",
    "muzero_context": "muzero_tune.policies.muzero_context:MuZeroContextPolicy",
    "muzero_rnn_full_obs": "muzero_tune.policies.muzero_rnn:MuZeroRNNFullObsPolicy",
    "unizero": "muzero_tune.policies.unizero:UniZeroPolicy",
    "sampled_muzero": "muzero_tune.policies.sampled:SampledMuZeroPolicy",
    "sampled_efficientzero": "muzero_tune.policies.sampled:SampledEfficientZeroPolicy",
    "sampled_unizero": "muzero_tune.policies.sampled_unizero:SampledUniZeroPolicy",
}
POLICY_TYPES: tuple[str, ...] = tuple(POLICY_CLASSES)


def check_policy_type(name: str) -> None:
    """Raise ConfigError for an unknown policy type."""
    if name not in POLICY_TYPES:
        raise ConfigError("policy.type", name, f"allowed: {', '.join(POLICY_TYPES)}")


def get_policy_class(name: str) -> type:
    check_policy_type(name)
    module, cls = POLICY_CLASSES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def policy_types_for(action_kind: str) -> tuple[str, ...]:
    """Implemented policy types whose class supports ``action_kind`` (imports every policy module: call it
    only to word an error)."""
    return tuple(name for name in POLICY_CLASSES if action_kind in get_policy_class(name).action_kinds)
