"""Weight snapshots for the async pipeline's actors: immutable, versioned, put into Ray once per version.

What this module owns
    :class:`WeightPublisher`: taking a snapshot of the learner's weights (version = its ``train_iter``),
    putting it into the object store once (the same reference serves every launch at that version), its
    digest (actors' results are checked against it), and when a new snapshot is due for collectors
    (``weight_sync_interval`` / ``max_policy_lag``, :func:`muzero_tune.pipeline.schedule.should_publish`).
"""

from __future__ import annotations

from typing import Any

from muzero_tune.pipeline import schedule
from muzero_tune.pipeline.messages import WeightsSnapshot, weights_digest


class WeightPublisher:
    """Snapshots of one learner's weights (see the module docstring).

    ``learner``: has ``weights_snapshot()`` (CPU tensors by name) and ``train_iter``; ``stats``: the
    driver's ``AsyncStats`` (``publishes``, ``publish_versions``).
    """

    def __init__(self, ray: Any, learner: Any, *, weight_sync_interval: int, max_policy_lag: int, stats: Any):
        self.ray, self.learner, self.stats = ray, learner, stats
        self.weight_sync_interval, self.max_policy_lag = weight_sync_interval, max_policy_lag
        self.published: WeightsSnapshot | None = None  # the collectors' current snapshot
        self.published_weights: dict | None = None  # its CPU tensors
        self.digests: dict[int, str] = {}  # version -> digest of every snapshot taken

    def snapshot(self) -> tuple[WeightsSnapshot, dict]:
        """A new snapshot of the current weights: (its Ray reference with version and digest, the CPU
        tensors by name)."""
        weights = self.learner.weights_snapshot()
        arrays = {k: v.numpy() for k, v in weights.items()}
        digest = weights_digest(weights)
        snap = WeightsSnapshot(version=self.learner.train_iter, ref=self.ray.put(arrays), digest=digest)
        self.digests[snap.version] = digest
        return snap, weights

    def current(self) -> tuple[WeightsSnapshot, dict]:
        """A snapshot of the weights as they are now: the published one when it is current, else a new one
        (not published: evaluations take this)."""
        if self.published is not None and self.published.version == self.learner.train_iter:
            return self.published, self.published_weights
        return self.snapshot()

    def publish_if_due(self) -> WeightsSnapshot:
        """The snapshot a collect launched now gets: a new one when ``weight_sync_interval`` or
        ``max_policy_lag`` says so, else the one published last."""
        last = self.published.version if self.published is not None else None
        if schedule.should_publish(
            current_version=self.learner.train_iter,
            last_published=last,
            weight_sync_interval=self.weight_sync_interval,
            max_policy_lag=self.max_policy_lag,
        ):
            self.published, self.published_weights = self.snapshot()
            self.stats.publishes += 1
            self.stats.publish_versions.append(self.published.version)
        return self.published
