"""Frame storage for the replay buffer: every single frame stored once.

Consecutive segments of one environment stream overlap: a segment's padding (its true continuation) and
the frame-stack window before its first observation are frames its neighbours hold too. The collector
ships each segment whole (simple, self-contained messages); on push the buffer keeps only the frames it
has not stored yet and turns the segment's frames into a :class:`FrameRef` -- indices into one shared
:class:`FrameStore` ring. Frame stacks are rebuilt at sample time by indexing, so a 1M-transition Pong
buffer holds ~1M frames, not ~1.7M (padding) x 4 (stack).

A stream is one environment of one collector instance (``GameSegment.stream_id``); frames are shared only
between consecutive segments of the same episode of the same stream, so a restarted actor or a dropped
collect can never alias frames.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class FrameStore:
    """A growable ring of frames addressed by global ids (monotonic; freed from the oldest end)."""

    def __init__(self, frame_shape: tuple[int, ...], dtype: np.dtype, *, capacity: int = 4096):
        self.frame_shape = tuple(frame_shape)
        self.dtype = np.dtype(dtype)
        self._data = np.empty((capacity, *self.frame_shape), dtype=self.dtype)
        self.lo = 0  # oldest live global id
        self.hi = 0  # next global id

    @property
    def capacity(self) -> int:
        return len(self._data)

    @property
    def num_frames(self) -> int:
        return self.hi - self.lo

    @property
    def nbytes(self) -> int:
        """Bytes of live frames (what a buffer needs; the ring may hold up to 2x slack while growing)."""
        return self.num_frames * int(np.prod(self.frame_shape)) * self.dtype.itemsize

    @property
    def allocated_bytes(self) -> int:
        return self._data.nbytes

    def _grow(self, need: int) -> None:
        cap = self.capacity
        while cap < need:
            cap *= 2
        new = np.empty((cap, *self.frame_shape), dtype=self.dtype)
        ids = np.arange(self.lo, self.hi)
        new[ids % cap] = self._data[ids % self.capacity]
        self._data = new

    def append(self, frames: np.ndarray) -> np.ndarray:
        """Store ``frames`` [n, *frame_shape]; returns their global ids [n] int64."""
        n = len(frames)
        if self.num_frames + n > self.capacity:
            self._grow(self.num_frames + n)
        ids = np.arange(self.hi, self.hi + n, dtype=np.int64)
        self._data[ids % self.capacity] = frames
        self.hi += n
        return ids

    def get(self, ids: np.ndarray) -> np.ndarray:
        """Frames for global ids of any shape [...] -> [..., *frame_shape]."""
        return self._data[np.asarray(ids) % self.capacity]

    def free_below(self, global_id: int) -> int:
        """Forget frames with id < global_id; returns how many were freed."""
        new_lo = min(max(self.lo, int(global_id)), self.hi)
        freed = new_lo - self.lo
        self.lo = new_lo
        return freed


@dataclass(frozen=True)
class FrameRef:
    """A segment's frames as ids into a :class:`FrameStore`; indexes like the frames array it replaced."""

    store: FrameStore
    ids: np.ndarray  # [frame_stack - 1 + M + 1] int64

    def __getitem__(self, idx) -> np.ndarray:
        return self.store.get(self.ids[idx])

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def ndim(self) -> int:
        return 1 + len(self.store.frame_shape)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.ids), *self.store.frame_shape)

    @property
    def nbytes(self) -> int:
        return self.ids.nbytes  # the frames themselves are counted once, in the store

    def materialize(self) -> np.ndarray:
        return self.store.get(self.ids)


@dataclass
class _StreamTail:
    episode_index: int
    last_position: int  # episode frame position of the stream's newest stored frame
    first_position: int  # position of tail_ids[0]
    tail_ids: np.ndarray  # ids of the newest segment's frames, by position


class FrameDeduplicator:
    """Turns pushed segments' frame arrays into FrameRefs, storing each frame of a stream once."""

    def __init__(self):
        self.store: FrameStore | None = None
        self._tails: dict[str, _StreamTail] = {}
        self.frames_received = 0
        self.frames_stored = 0

    def add(self, seg) -> FrameRef:
        frames = seg.frames
        if isinstance(frames, FrameRef):
            return frames
        if self.store is None:
            self.store = FrameStore(frames.shape[1:], frames.dtype)
        fs = seg.frame_stack
        first = seg.episode_step0 - (fs - 1)  # episode position of frames[0]
        last = first + len(frames) - 1
        tail = self._tails.get(seg.stream_id) if seg.stream_id else None
        shared = 0
        if tail is not None and tail.episode_index == seg.episode_index and first >= tail.first_position:
            shared = max(0, min(tail.last_position, last) - first + 1)
        if shared:
            lo = first - tail.first_position
            old_ids = tail.tail_ids[lo : lo + shared]
            if old_ids.min() < self.store.lo:  # the stream's previous segment was evicted meanwhile
                shared, old_ids = 0, old_ids[:0]
        if shared:
            if not np.array_equal(self.store.get(old_ids[-1:]), frames[shared - 1 : shared]):
                shared, old_ids = 0, old_ids[:0]  # not the continuation we thought: store everything
        else:
            old_ids = np.empty(0, dtype=np.int64)
        new_ids = self.store.append(frames[shared:])
        ids = np.concatenate([old_ids, new_ids])
        self.frames_received += len(frames)
        self.frames_stored += len(new_ids)
        if seg.stream_id:
            self._tails[seg.stream_id] = _StreamTail(seg.episode_index, last, first, ids)
        return FrameRef(self.store, ids)
