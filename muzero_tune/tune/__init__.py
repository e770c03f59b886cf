"""Ray Tune integration: the function trainable, its placement-group resources, MLflow runs, sweeps.

Importing this package does not import Ray; the functions do when called.
"""

from muzero_tune.tune.resources import placement_group_factory, trial_bundles
from muzero_tune.tune.trainable import TuneReporter, make_trainable

__all__ = ["TuneReporter", "make_trainable", "placement_group_factory", "trial_bundles"]
