"""Environment shape contract: the `EnvSpec` record and the frame-stacking rule.

This module owns *what the model sees* and nothing about how environments are built:

* an environment made by :func:`muzero_tune.envs.make_env` emits ONE frame per step
  (vector ``[D]`` float32, or image ``[C, H, W]`` uint8, channel-first);
* replay stores those single frames, and the model input is rebuilt from the last
  ``frame_stack`` of them with :func:`stack_frames`:

  - vectors ``[stack, D]`` -> ``[stack * D]`` (concatenation, oldest first);
  - images ``[stack, C, H, W]`` -> ``[stack * C, H, W]`` (concatenation on the channel axis).

Both rules are a single ``reshape`` of a contiguous ``[..., stack, *frame_shape]`` block, so stacking
never copies when the frames already sit next to each other in memory.

It also owns *what an action is* inside the library (:attr:`EnvSpec.action_shape` /
:attr:`EnvSpec.action_dtype`): a discrete action is one int64 index (shape ``()``), a continuous one is a
float32 vector ``[D]`` in [-1, 1] (mapped affinely to the env's bounds only at the env boundary, by
:mod:`muzero_tune.envs.actions`), a factored one (a ``MultiDiscrete`` taken by its factors) an int64 vector
``[D]`` of factor indices, ``0 <= a_d < nvec_d``. Segments, replay, targets and the pipelines carry actions in
this form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

__all__ = ["ACTION_KINDS", "ActionKind", "EnvSpec", "random_actions", "stack_frames"]

ActionKind = Literal["discrete", "continuous", "factored"]
ACTION_KINDS = ("discrete", "continuous", "factored")

# Frame ranks the rest of the library understands: vector observations and channel-first images.
_VECTOR_NDIM = 1
_IMAGE_NDIM = 3


def stack_frames(frames: Any, *, frame_ndim: int | None = None) -> Any:
    """Merge a window of single frames into one model input.

    Args:
        frames: ``[..., stack, *frame_shape]`` with any number of leading batch dims; frames are ordered
            oldest first. A numpy array (a torch tensor works too: only ``.ndim``, ``.shape`` and
            ``.reshape`` are used).
        frame_ndim: rank of ONE frame: 1 for vectors ``[D]``, 3 for images ``[C, H, W]``. When ``None`` it
            is inferred as 3 if ``frames.ndim >= 4`` else 1. That guess is wrong for vector frames with two
            or more leading dims (``[B, T, stack, D]``): pass ``frame_ndim=1`` there, or use
            :meth:`EnvSpec.stack`, which knows the frame rank.

    Returns:
        ``[..., stack * C, H, W]`` for images or ``[..., stack * D]`` for vectors. A view of ``frames``
        (no copy) when ``frames`` is contiguous; ``reshape`` copies otherwise.
    """
    if frame_ndim is None:
        frame_ndim = _IMAGE_NDIM if frames.ndim >= 4 else _VECTOR_NDIM
    if frame_ndim not in (_VECTOR_NDIM, _IMAGE_NDIM):
        raise ValueError(f"frame_ndim must be 1 (vector) or 3 (image), got {frame_ndim}")
    if frames.ndim < frame_ndim + 1:
        raise ValueError(
            f"frames must be [..., stack, *frame_shape] with a {frame_ndim}-d frame, "
            f"got shape {tuple(frames.shape)}"
        )
    shape = tuple(frames.shape)
    stack_axis = len(shape) - frame_ndim - 1
    leading, stack, frame_shape = shape[:stack_axis], shape[stack_axis], shape[stack_axis + 1 :]
    return frames.reshape((*leading, stack * frame_shape[0], *frame_shape[1:]))


def random_actions(
    rng: np.random.Generator,
    shape: tuple[int, ...],
    *,
    num_actions: int,
    action_dim: int,
    action_nvec: tuple[int, ...] = (),
) -> np.ndarray:
    """Uniform random actions ``[*shape, *action_shape]``: int64 in [0, num_actions) when ``action_dim`` is
    0 (discrete; the same draw as ``rng.integers(num_actions, size=shape)``); with ``action_nvec`` (factored)
    int64 ``[*shape, D]``, factor d uniform in [0, nvec_d); else float32 uniform in [-1, 1]
    ``[*shape, action_dim]`` (continuous)."""
    if action_nvec:
        return rng.integers(np.asarray(action_nvec, dtype=np.int64), size=(*shape, len(action_nvec)))
    if action_dim > 0:
        return rng.uniform(-1.0, 1.0, size=(*shape, action_dim)).astype(np.float32)
    return rng.integers(num_actions, size=shape).astype(np.int64)


@dataclass(frozen=True)
class EnvSpec:
    """What one environment emits and what the model consumes.

    Attributes:
        env_id: gymnasium id, e.g. ``"CartPole-v1"`` or ``"ALE/Pong-v5"``.
        frame_shape: shape of ONE emitted frame: ``(D,)`` for vectors, ``(C, H, W)`` for images.
        frame_dtype: numpy dtype name of a frame: ``"float32"`` (vectors) or ``"uint8"`` (images).
        frame_stack: number of consecutive frames the model sees (>= 1).
        num_actions: size of the discrete action set; 0 for continuous and factored actions.
        action_kind: ``"discrete"``, ``"continuous"`` or ``"factored"``.
        action_dim: length of a continuous or factored action vector (D); 0 for discrete actions.
        action_nvec: factored actions: each factor's number of values ``(n_1, ..., n_D)``; else ``()``.
        action_note: what made the actions this kind, for messages (factored: the env's space, its number of
            combinations and the flat limit); may be empty.
    """

    env_id: str
    frame_shape: tuple[int, ...]
    frame_dtype: str
    frame_stack: int
    num_actions: int
    action_kind: ActionKind
    action_dim: int = 0
    action_nvec: tuple[int, ...] = ()
    action_note: str = ""

    def __post_init__(self) -> None:
        # Normalise list-like shapes from configs so equality and hashing stay value-based.
        object.__setattr__(self, "frame_shape", tuple(int(d) for d in self.frame_shape))
        object.__setattr__(self, "action_nvec", tuple(int(n) for n in self.action_nvec))
        if len(self.frame_shape) not in (_VECTOR_NDIM, _IMAGE_NDIM) or min(self.frame_shape) <= 0:
            raise ValueError(
                f"frame_shape must be (D,) or (C, H, W) with positive sizes, got {self.frame_shape}"
            )
        if np.dtype(self.frame_dtype).name != self.frame_dtype:
            raise ValueError(f"frame_dtype must be a numpy dtype name like 'uint8', got {self.frame_dtype!r}")
        if (
            isinstance(self.frame_stack, bool)
            or not isinstance(self.frame_stack, int)
            or self.frame_stack < 1
        ):
            raise ValueError(f"env.frame_stack: must be an integer >= 1, got {self.frame_stack!r}")
        if self.action_kind == "discrete":
            if self.num_actions < 1 or self.action_dim != 0:
                raise ValueError(
                    f"discrete actions need num_actions >= 1 and action_dim 0, "
                    f"got {self.num_actions} / {self.action_dim}"
                )
        elif self.action_kind == "continuous":
            if self.action_dim < 1 or self.num_actions != 0:
                raise ValueError(
                    f"continuous actions need action_dim >= 1 and num_actions 0, "
                    f"got {self.action_dim} / {self.num_actions}"
                )
        elif self.action_kind == "factored":
            nvec = self.action_nvec
            if not nvec or min(nvec) < 1 or self.action_dim != len(nvec) or self.num_actions != 0:
                raise ValueError(
                    f"factored actions need action_nvec of sizes >= 1, action_dim = len(action_nvec) and "
                    f"num_actions 0, got {nvec} / {self.action_dim} / {self.num_actions}"
                )
        else:
            raise ValueError(f"action_kind must be one of {list(ACTION_KINDS)}, got {self.action_kind!r}")
        if self.action_nvec and self.action_kind != "factored":
            raise ValueError(f"action_nvec is for factored actions only, got {self.action_nvec} with "
                             f"{self.action_kind} actions")

    @property
    def is_image(self) -> bool:
        """True for channel-first image frames ``[C, H, W]``."""
        return len(self.frame_shape) == _IMAGE_NDIM

    @property
    def frame_ndim(self) -> int:
        """Rank of one frame: 1 (vector) or 3 (image)."""
        return len(self.frame_shape)

    @property
    def obs_shape(self) -> tuple[int, ...]:
        """Stacked model-input shape: ``(stack * D,)`` or ``(stack * C, H, W)``."""
        return (self.frame_stack * self.frame_shape[0], *self.frame_shape[1:])

    def stack(self, frames: Any) -> Any:
        """:func:`stack_frames` with this spec's frame rank.

        ``[..., stack, *frame_shape]`` -> ``[..., *obs_shape]``.
        """
        return stack_frames(frames, frame_ndim=self.frame_ndim)

    # ---------------------------------------------------------------- actions

    @property
    def action_shape(self) -> tuple[int, ...]:
        """Shape of ONE action inside the library: ``()`` (an index) discrete, ``(D,)`` continuous and
        factored."""
        return () if self.action_kind == "discrete" else (self.action_dim,)

    @property
    def action_dtype(self) -> str:
        """numpy dtype name of actions inside the library: ``"float32"`` continuous, else ``"int64"``."""
        return "float32" if self.action_kind == "continuous" else "int64"

    def random_actions(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        """Uniform random actions ``[*shape, *action_shape]`` (see :func:`random_actions`)."""
        return random_actions(
            rng, shape, num_actions=self.num_actions, action_dim=self.action_dim, action_nvec=self.action_nvec
        )

    def check_actions(self, actions: Any, batch_size: int, *, source: str = "policy.act") -> np.ndarray:
        """``actions`` as ``[batch_size, *action_shape]`` of :attr:`action_dtype`, or a ValueError saying
        what ``source`` returned and what this env needs (continuous: finite and inside [-1, 1]; factored:
        factor d in [0, nvec_d))."""
        arr = np.asarray(actions)
        want = (batch_size, *self.action_shape)
        kind_ok = arr.dtype.kind == "f" if self.action_kind == "continuous" else arr.dtype.kind in "iu"
        if arr.shape != want or not kind_ok:
            raise ValueError(
                f"{source} returned actions of shape {arr.shape} and dtype {arr.dtype}; "
                f"{self.env_id} ({self.action_kind}) needs shape {want} of {self.action_dtype}"
            )
        if self.action_kind == "continuous" and not (np.all(np.isfinite(arr)) and np.all(np.abs(arr) <= 1.0)):
            raise ValueError(
                f"{source} returned continuous actions outside [-1, 1] (min {arr.min()}, max {arr.max()}); "
                "actions inside the library live in [-1, 1] (the env wrapper maps them to the env's bounds)"
            )
        nvec = np.array(self.action_nvec, dtype=np.int64)
        if self.action_kind == "factored" and not (np.all(arr >= 0) and np.all(arr < nvec)):
            raise ValueError(
                f"{source} returned factored actions outside their factors' ranges (min "
                f"{arr.min(0).tolist()}, max {arr.max(0).tolist()}); factor d takes 0 .. nvec_d - 1, "
                f"nvec = {nvec.tolist()}"
            )
        return arr.astype(self.action_dtype, copy=False)

    def env_action(self, action: Any) -> int | np.ndarray:
        """One library action as the env takes it: a Python int (discrete), an owned float32 ``[D]`` copy
        (continuous; the env wrapper maps [-1, 1] to the env's bounds) or an owned int64 ``[D]`` copy
        (factored; the env wrapper gives it the env's own shape and start)."""
        if self.action_kind == "discrete":
            return int(action)
        return np.array(action, dtype=self.action_dtype).reshape(self.action_shape)
