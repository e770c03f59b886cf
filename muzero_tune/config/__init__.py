"""The experiment configuration: one frozen dataclass tree, presets as data, dotted overrides, validation.

This package owns every setting the library reads. Each field carries a one-line doc (``--help`` and the
README are generated from it) and its allowed range. Every way of changing a setting -- a preset, a YAML
file, ``--set key=value`` on the command line, a Tune ``param_space`` -- goes through :func:`apply_overrides`,
and :func:`validate` runs before any environment, process or network is created. A bad value stops the run
with a :class:`ConfigError` naming the dotted key, the value and what is allowed.

It must never import torch, Ray or gymnasium at module load: the CLI's ``--help`` and validation stay fast.

    schema.py      the dataclass tree and :func:`param`
    presets.py     the presets and :func:`make_config`
    overrides.py   dotted overrides, coercion, flat dicts, YAML, the field listing
    validation.py  :func:`validate`
"""

from muzero_tune.config.overrides import (
    RENAMED_KEYS,
    apply_overrides,
    current_key,
    describe_fields,
    flatten,
    from_flat_dict,
    iter_fields,
    leaf_keys,
    load_yaml,
    parse_set_args,
    to_flat_dict,
)
from muzero_tune.config.presets import (
    PRESETS,
    make_config,
)
from muzero_tune.config.schema import (
    POLICY_TYPES,
    AsyncPipelineConfig,
    CollectConfig,
    EnvConfig,
    EvalConfig,
    ExperimentConfig,
    LearnConfig,
    LoggingConfig,
    MctsConfig,
    ModelConfig,
    PolicyConfig,
    ReplayConfig,
    TuneConfig,
    param,
    resolved_async,
)
from muzero_tune.config.validation import check_path_component, validate
from muzero_tune.errors import ConfigError, ConfigWarning

__all__ = [
    "AsyncPipelineConfig",
    "CollectConfig",
    "ConfigError",
    "ConfigWarning",
    "EnvConfig",
    "EvalConfig",
    "ExperimentConfig",
    "LearnConfig",
    "LoggingConfig",
    "MctsConfig",
    "ModelConfig",
    "POLICY_TYPES",
    "PRESETS",
    "PolicyConfig",
    "RENAMED_KEYS",
    "ReplayConfig",
    "TuneConfig",
    "apply_overrides",
    "check_path_component",
    "current_key",
    "describe_fields",
    "flatten",
    "from_flat_dict",
    "iter_fields",
    "leaf_keys",
    "load_yaml",
    "make_config",
    "param",
    "parse_set_args",
    "resolved_async",
    "to_flat_dict",
    "validate",
]
