"""Game segments and the per-environment builder that cuts an episode into them.

A :class:`GameSegment` is a contiguous slice of one episode: ``num_real`` real transitions followed by up
to ``num_unroll_steps + td_steps`` padding transitions that are the *true continuation* of the episode
(they are the next segment's first transitions, copied). Frames are single frames; the
``frame_stack - 1`` frames before the first real observation are kept so any stacked observation inside
the segment can be rebuilt.

:class:`SegmentBuilder` owns one environment's in-flight data. It lives as long as its environment, across
``collect()`` calls, so a segment is only emitted once its padding exists (or the episode ended): no
transition is lost or duplicated, and padding is never invented. This module never touches the replay
buffer or the network.

Actions are stored in the library's form (:attr:`EnvSpec.action_shape` / :attr:`EnvSpec.action_dtype`):
``[M]`` int64 indices for discrete envs, ``[M, D]`` float32 vectors in [-1, 1] for continuous ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class GameSegment:
    """One slice of an episode (M stored transitions, the first ``num_real`` of them real).

    Observation index i (0 <= i <= M) is the state before action i; its stacked model input is
    ``frames[i : i + frame_stack]``. ``stats`` holds what the policy stored per step (visit
    distributions, root values, legal masks, ...); reanalyze rewrites ``stats['child_visits']`` in place,
    which is why this dataclass is not frozen. Everything else is never mutated after emission.
    """

    frames: np.ndarray  # [frame_stack - 1 + M + 1, *frame_shape]; a FrameRef once in the replay buffer
    actions: np.ndarray  # [M] int64 (discrete) or [M, D] float32 in [-1, 1] (continuous)
    rewards: np.ndarray  # [M] float32, reward received after actions[i]
    stats: dict[str, np.ndarray]  # name -> [M, ...]
    num_real: int  # real transitions; positions >= num_real are padding (the true continuation)
    frame_stack: int
    done: bool  # the real transitions end the episode (never true for a padded predecessor)
    terminal_at_end: bool  # frames[-1] is a terminal state: positions past M are absorbing (value 0)
    env_id: int = 0  # which environment of its collector produced it
    episode_step0: int = 0  # episode step of position 0
    policy_version: int = -1  # weights version that collected it (-1: unknown)
    priorities: np.ndarray | None = None  # [num_real] initial priorities, or None for the buffer's max
    stream_id: str = ""  # one environment of one collector instance ("" = unknown: frames never shared)
    episode_index: int = 0  # episodes started by that stream before this one
    meta: dict = field(default_factory=dict)

    @property
    def num_stored(self) -> int:
        """M: real plus padding transitions."""
        return int(self.actions.shape[0])

    def stacked_obs(self, positions: np.ndarray) -> np.ndarray:
        """Stacked observations at ``positions`` [P] (each 0..M) -> [P, frame_stack, *frame_shape]."""
        idx = np.asarray(positions)[:, None] + np.arange(self.frame_stack)[None, :]
        return self.frames[idx]

    @property
    def nbytes(self) -> int:
        n = self.frames.nbytes + self.actions.nbytes + self.rewards.nbytes
        return n + sum(v.nbytes for v in self.stats.values())


class SegmentBuilder:
    """One environment's in-flight trajectory, cut into segments of ``segment_length`` real transitions.

    Call :meth:`reset` with the first frame of an episode, then :meth:`step` once per env step. Both
    return the segments that became complete. A segment [s, s+L) is complete when the trace holds
    L + pad_length transitions from s (its padding is the true continuation), or when the episode ends.

    ``action_shape`` / ``action_dtype`` are one action's shape and dtype (``EnvSpec.action_shape`` /
    ``EnvSpec.action_dtype``): ``()`` / int64 for discrete envs (the default), ``(D,)`` / float32 for
    continuous ones; emitted segments carry ``actions`` ``[M, *action_shape]``.
    """

    def __init__(
        self,
        *,
        segment_length: int,
        pad_length: int,
        frame_stack: int,
        env_id: int = 0,
        stream_id: str = "",
        action_shape: tuple[int, ...] = (),
        action_dtype: str = "int64",
    ):
        self.segment_length = segment_length
        self.pad_length = pad_length  # num_unroll_steps + td_steps
        self.frame_stack = frame_stack
        self.env_id = env_id
        self.stream_id = stream_id
        self.action_shape = tuple(int(d) for d in action_shape)
        self.action_dtype = np.dtype(action_dtype)
        self.episode_index = -1
        self._frames: list[np.ndarray] = []  # from obs index start - (frame_stack - 1)
        self._actions: list[int | np.ndarray] = []  # ints (discrete) or owned [D] arrays (continuous)
        self._rewards: list[float] = []
        self._stats: list[dict[str, np.ndarray]] = []
        self._start = 0  # episode step of the next segment's first real transition
        self._policy_version = -1
        self._priorities: list[float] = []

    @property
    def in_flight_transitions(self) -> int:
        """Transitions held that no emitted segment has as real transitions yet."""
        return len(self._actions)

    def reset(self, first_frame: np.ndarray) -> list[GameSegment]:
        """Start a new episode. Any leftover trace must have been flushed by an episode end."""
        assert not self._actions, "reset() with an unfinished episode: call end_episode() first"
        # The stack window before the first observation is filled with copies of it (frame-stack 'reset'
        # padding, the same as gymnasium's FrameStackObservation(padding_type='reset')).
        self._frames = [first_frame] * self.frame_stack
        self._start = 0
        self.episode_index += 1
        return []

    def current_frames(self) -> np.ndarray:
        """The frame window of the current observation: [frame_stack, *frame_shape]."""
        return np.stack(self._frames[-self.frame_stack :])

    def step(
        self,
        *,
        action: int | np.ndarray,
        reward: float,
        next_frame: np.ndarray,
        stats: dict[str, np.ndarray],
        terminated: bool,
        truncated: bool,
        policy_version: int = -1,
        priority: float | None = None,
    ) -> list[GameSegment]:
        """Record one transition; return the segments it completed (the episode-end flush included).

        ``action``: an int (discrete) or ``[*action_shape]`` (continuous; copied, so the caller may reuse it).
        """
        if self.action_shape:
            a = np.array(action, dtype=self.action_dtype)
            if a.shape != self.action_shape:
                raise ValueError(
                    f"SegmentBuilder.step: action of shape {a.shape}, expected {self.action_shape}"
                )
            self._actions.append(a)
        else:
            self._actions.append(int(action))
        self._rewards.append(float(reward))
        self._stats.append(stats)
        self._frames.append(next_frame)
        self._priorities.append(np.nan if priority is None else float(priority))
        self._policy_version = policy_version
        out: list[GameSegment] = []
        full = self.segment_length + self.pad_length
        ended = terminated or truncated
        while len(self._actions) >= full:
            # The episode may end exactly at this step: then this segment's data reaches the terminal state
            # (_emit sets terminal_at_end only when it takes the whole trace), and it is done iff it has no
            # padding.
            out.append(
                self._emit(
                    num_real=self.segment_length,
                    num_stored=full,
                    done=ended and len(self._actions) == self.segment_length,
                    terminal=terminated,
                )
            )
        if terminated or truncated:
            while self._actions:
                n = len(self._actions)
                real = min(self.segment_length, n)
                # Only the segment whose real transitions reach the episode end is `done`; a predecessor
                # padded up to the end is not, but its data does end in the terminal state.
                out.append(self._emit(num_real=real, num_stored=n, done=real == n, terminal=terminated))
        return out

    def _emit(self, *, num_real: int, num_stored: int, done: bool, terminal: bool) -> GameSegment:
        fs = self.frame_stack
        frames = np.stack(self._frames[: fs + num_stored])
        keys = self._stats[0].keys() if self._stats else ()
        stats = {k: np.stack([s[k] for s in self._stats[:num_stored]]) for k in keys}
        pri = np.asarray(self._priorities[:num_real], dtype=np.float32)
        seg = GameSegment(
            frames=frames,
            actions=np.asarray(self._actions[:num_stored], dtype=self.action_dtype).reshape(
                num_stored, *self.action_shape
            ),
            rewards=np.asarray(self._rewards[:num_stored], dtype=np.float32),
            stats=stats,
            num_real=num_real,
            frame_stack=fs,
            done=done,
            terminal_at_end=terminal and num_stored == len(self._actions),
            env_id=self.env_id,
            episode_step0=self._start,
            policy_version=self._policy_version,
            priorities=None if np.isnan(pri).any() else pri,
            stream_id=self.stream_id,
            episode_index=self.episode_index,
        )
        del self._actions[:num_real], self._rewards[:num_real], self._stats[:num_real]
        del self._frames[:num_real], self._priorities[:num_real]
        self._start += num_real
        return seg

    def state_dict(self) -> dict:
        """The in-flight trace as numpy arrays and builtins (T = :attr:`in_flight_transitions`), so a
        resumed collector emits the same segments as one that never stopped: ``frames`` [F, *frame_shape],
        ``actions`` [T, *action_shape], ``rewards`` [T] float64, ``stats`` name -> [T, ...],
        ``priorities`` [T] float64 (NaN: none), and the stream, episode and segment-start counters."""
        keys = self._stats[0].keys() if self._stats else ()
        return {
            "stream_id": self.stream_id,
            "episode_index": self.episode_index,
            "start": self._start,
            "policy_version": self._policy_version,
            "frames": np.stack(self._frames) if self._frames else np.zeros((0,), np.float32),
            "actions": np.asarray(self._actions, dtype=self.action_dtype).reshape(-1, *self.action_shape),
            "rewards": np.asarray(self._rewards, dtype=np.float64),
            "stats": {k: np.stack([np.asarray(s[k]) for s in self._stats]) for k in keys},
            "priorities": np.asarray(self._priorities, dtype=np.float64),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue the trace :meth:`state_dict` saved (this builder's shape settings must be the saver's)."""
        n = int(len(state["actions"]))
        self.stream_id = str(state["stream_id"])
        self.episode_index = int(state["episode_index"])
        self._start = int(state["start"])
        self._policy_version = int(state["policy_version"])
        self._frames = list(np.asarray(state["frames"])) if len(state["frames"]) else []
        actions = np.asarray(state["actions"], dtype=self.action_dtype)
        self._actions = [a.copy() for a in actions] if self.action_shape else [int(a) for a in actions]
        self._rewards = [float(r) for r in np.asarray(state["rewards"])]
        stats = {k: np.asarray(v) for k, v in state["stats"].items()}
        self._stats = [{k: v[t] for k, v in stats.items()} for t in range(n)]
        self._priorities = [float(p) for p in np.asarray(state["priorities"])]

    def drop_in_flight(self) -> int:
        """Forget the unfinished trace (a collector restart); returns the transitions dropped."""
        n = len(self._actions)
        self._frames, self._actions, self._rewards, self._stats, self._priorities = [], [], [], [], []
        return n
