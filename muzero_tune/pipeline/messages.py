"""Messages that cross process boundaries: every one is a frozen dataclass.

Collectors and evaluators receive :class:`WeightsSnapshot` (an immutable, versioned CPU copy of the
weights, put into the Ray object store once per version) and return :class:`CollectResult` /
:class:`EvalResult` tagged with the version they used. Nothing mutable is shared.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from muzero_tune.replay.segment import GameSegment


def weights_digest(weights: dict[str, Any]) -> str:
    """A content hash of a weights dict (tensors or arrays): equal digests mean bit-identical weights."""
    h = hashlib.blake2b(digest_size=16)
    for k in sorted(weights):
        v = weights[k]
        a = v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)
        h.update(k.encode())
        h.update(str(a.dtype).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def segments_digest(segments) -> str:
    """A content hash of game segments as shipped (frames [F, ...], actions [M(, D)], rewards [M], stats
    name -> [M, ...], priorities [num_real] and the scalar fields): equal digests mean identical segments."""
    h = hashlib.blake2b(digest_size=16)

    def arr(name: str, a) -> None:
        a = np.ascontiguousarray(np.asarray(a))
        h.update(f"{name}:{a.dtype}:{a.shape}".encode())
        h.update(a.tobytes())

    for i, s in enumerate(segments):
        arr(f"{i}.frames", s.frames)
        arr(f"{i}.actions", s.actions)
        arr(f"{i}.rewards", s.rewards)
        for k in sorted(s.stats):
            arr(f"{i}.stats.{k}", s.stats[k])
        if s.priorities is not None:
            arr(f"{i}.priorities", s.priorities)
        fields = (s.num_real, s.frame_stack, s.done, s.terminal_at_end, s.env_id, s.episode_step0,
                  s.policy_version, s.stream_id, s.episode_index)  # fmt: skip
        h.update(repr(fields).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class WeightsSnapshot:
    """One published weights version. ``ref`` holds ``{name: np.ndarray}`` (CPU) in the object store."""

    version: int  # the learner's train_iter when the snapshot was taken
    ref: Any  # ray.ObjectRef (kept out of the type so this module does not import Ray)
    digest: str  # weights_digest of the snapshot


@dataclass(frozen=True)
class CollectResult:
    """One ``collect()`` call's output; crosses process boundaries in the async pipeline."""

    segments: tuple[GameSegment, ...]  # actions [M] int64 (discrete) or [M, D] float32 in [-1, 1]
    envstep_delta: int  # env steps taken in this call
    real_transitions: int  # sum of segments' num_real
    policy_version: int  # weights version used for the whole call
    episode_returns: tuple[float, ...]  # episodes finished in this call
    episode_lengths: tuple[int, ...]
    duration_s: float
    search_s: float  # time inside policy.act (search + network)
    actor_id: int = 0
    weights_digest: str = ""  # digest of the weights actually used (set by actors)
    segments_digest: str = ""  # segments_digest of ``segments`` as the actor sent them ("" = not computed)
    node_id: str = ""  # the Ray node the actor ran on ("" = not known)


@dataclass(frozen=True)
class EvalResult:
    """One evaluation of one weights version; crosses process boundaries in the async pipeline."""

    reward_mean: float
    reward_std: float
    episode_returns: tuple[float, ...]
    episode_lengths: tuple[int, ...]
    envsteps: int
    duration_s: float
    policy_version: int
    actor_id: int = 0
    weights_digest: str = ""  # digest of the weights actually used (set by actors)
    node_id: str = ""  # the Ray node the actor ran on ("" = not known)
    videos: tuple[tuple[str, bytes], ...] = ()  # (file name, mp4 bytes) of the episodes recorded, if any
