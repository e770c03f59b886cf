"""muzero_tune: MuZero-family training with sync and async segment pipelines, Ray Tune sweeps and MLflow.

The public surface: configs (``make_config``, ``apply_overrides``), the two drivers, checkpoint loading and
the Tune trainable. Everything else is machinery behind them.
"""

from muzero_tune.config import ConfigError, ExperimentConfig, apply_overrides, make_config, validate
from muzero_tune.errors import UserError

__version__ = "0.1.0"  # the one place the version is written (setup.cfg reads it)

__all__ = [
    "__version__",
    "ConfigError",
    "UserError",
    "ExperimentConfig",
    "apply_overrides",
    "evaluate",
    "load_policy",
    "make_config",
    "make_trainable",
    "train",
    "train_muzero_segment",
    "train_muzero_segment_async",
    "validate",
]


def __getattr__(name: str):
    # heavy modules (torch, Ray) load on first use, so `import muzero_tune` and the CLI's --help stay fast
    if name == "train":
        from muzero_tune.api import train

        return train
    if name == "train_muzero_segment":
        from muzero_tune.pipeline.sync_driver import train_muzero_segment

        return train_muzero_segment
    if name == "train_muzero_segment_async":
        from muzero_tune.distributed.async_driver import train_muzero_segment_async

        return train_muzero_segment_async
    if name in ("evaluate", "load_policy"):
        from muzero_tune import api

        return getattr(api, name)
    if name == "make_trainable":
        from muzero_tune.tune.trainable import make_trainable

        return make_trainable
    raise AttributeError(name)
