"""Contiguous per-step storage for the replay buffer's segments, and the batch rows targets are gathered from.

Building a batch reads, for each of B samples, windows of its segment's per-step arrays (rewards, actions,
visit distributions, further statistics) and stacked frames. With every segment holding its own arrays,
that needs per-sample Python and a concatenation of the sampled segments' arrays per batch -- most of the
non-network cost of target building. Here the buffer keeps each per-step field of all its segments in one
:class:`ColumnStore` block (rows addressed by monotonic global ids, freed from the oldest end, like
:class:`~muzero_tune.replay.frames.FrameStore`), and each pushed segment's arrays become *views* of that
block. So:

- a batch's windows are one fancy index per field into one array (:class:`StepRows`), no Python per sample;
- reanalyze, which writes ``seg.stats[name][i]`` in place, writes straight into the block;
- when a block has to move (growth or compaction) the store calls back and the buffer re-points every
  segment's arrays at the new block, so the views stay the segments' data.

Rows of a batch from segments that are not in a buffer (hand-built samples, tests) are made by
:func:`rows_of_segments`, which concatenates the distinct segments' arrays once: the same values, gathered
the same way. This module never mutates a segment except through the buffer's re-pointing.

Steps before a segment's position 0 (a policy that wants past steps of context, :meth:`StepRows.past`) are
read from the segment its stream emitted just before in the same episode (:func:`continues`), when that one
is held too; a segment that starts an episode has none, so a window never reaches into another episode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from muzero_tune.replay.frames import FrameRef

STAT = "stats."  # column-name prefix of a per-step statistic (``seg.stats[name]``)


def segment_columns(seg) -> dict[str, np.ndarray]:
    """The per-step arrays of a segment by column name: ``rewards``, ``actions``, ``stats.<name>``."""
    cols = {"rewards": seg.rewards, "actions": seg.actions}
    cols.update({STAT + k: v for k, v in seg.stats.items()})
    return cols


def continues(prev, seg) -> bool:
    """``seg`` is the segment its stream emitted right after ``prev`` in the same episode: ``prev``'s real
    transitions end at ``seg``'s position 0 (and its padding is ``seg``'s first transitions)."""
    return (
        bool(seg.stream_id)
        and prev.stream_id == seg.stream_id
        and prev.episode_index == seg.episode_index
        and prev.num_real > 0
        and prev.episode_step0 + prev.num_real == seg.episode_step0
    )


def column_signature(cols: dict[str, np.ndarray]) -> tuple:
    """(name, dtype, trailing shape) per column: segments with one signature can share a store."""
    return tuple(sorted((k, np.asarray(v).dtype.str, np.asarray(v).shape[1:]) for k, v in cols.items()))


class ColumnStore:
    """Named columns with equal row counts, rows addressed by monotonic global ids; appended at the new
    end, freed from the old end. ``on_move`` is called after the block is reallocated (then every view of
    the old block is stale and must be re-pointed)."""

    def __init__(self, signature: tuple, *, capacity: int = 4096, on_move: Callable[[], None] | None = None):
        self.signature = signature
        self._shapes = {name: (np.dtype(dt), shape) for name, dt, shape in signature}
        self.data = {n: np.empty((capacity, *s), dtype=d) for n, (d, s) in self._shapes.items()}
        self.base = 0  # global id of physical row 0
        self.lo = 0  # oldest live global id
        self.hi = 0  # next global id
        self.on_move = on_move
        self.moves = 0

    @property
    def capacity(self) -> int:
        return len(next(iter(self.data.values())))

    @property
    def num_rows(self) -> int:
        return self.hi - self.lo

    def view(self, name: str, start: int, n: int) -> np.ndarray:
        """Rows [start, start + n) (global ids) of column ``name``: a view, valid until the next move."""
        p = start - self.base
        return self.data[name][p : p + n]

    def append(self, cols: dict[str, np.ndarray]) -> int:
        """Copy one segment's columns (each [n, ...]) in; returns the global id of their first row."""
        n = len(next(iter(cols.values())))
        if self.hi + n - self.base > self.capacity:
            self._move(self.num_rows + n)
        p = self.hi - self.base
        for name, arr in cols.items():
            self.data[name][p : p + n] = arr
        start, self.hi = self.hi, self.hi + n
        return start

    def free_below(self, global_id: int) -> None:
        self.lo = min(max(self.lo, int(global_id)), self.hi)

    def _move(self, need: int) -> None:
        """Compact the live rows to physical row 0, doubling the block while it is over half full."""
        cap = self.capacity
        while cap < 2 * need:
            cap *= 2
        live = slice(self.lo - self.base, self.hi - self.base)
        new = {}
        for name, (dt, shape) in self._shapes.items():
            new[name] = np.empty((cap, *shape), dtype=dt)
            new[name][: self.num_rows] = self.data[name][live]
        self.data, self.base = new, self.lo
        self.moves += 1
        if self.on_move is not None:
            self.on_move()


@dataclass(frozen=True)
class StepRows:
    """Where a batch's per-step data lives: per sample the physical row of its segment's position 0 in
    flat column arrays, and how its stacked frames are read. Physical rows are valid until the next push."""

    columns: Callable[[str], np.ndarray]  # column name -> flat array [R, ...]
    step0: np.ndarray  # [B] int64, row of each sample's segment position 0 in the columns
    num_stored: np.ndarray  # [B] int64, M of each sample's segment
    terminal: np.ndarray  # [B] bool, its data ends in a terminal state
    frame_ids: np.ndarray  # [F] int64, flat frame ids (or rows of ``frames_of``) of the segments
    frame0: np.ndarray  # [B] int64, index into ``frame_ids`` of each sample's segment frame 0
    frames_of: Callable[[np.ndarray], np.ndarray]  # frame ids [...] -> frames [..., *frame_shape]
    frame_stack: int
    # per sample, the previous segment of its episode when it is held (:func:`continues`): the row of its
    # position 0 in the columns, the index into ``frame_ids`` of its frame 0, its real transitions; -1 / 0
    # where there is none (None: no sample has one)
    prev_step0: np.ndarray | None = None  # [B] int64
    prev_frame0: np.ndarray | None = None  # [B] int64
    prev_real: np.ndarray | None = None  # [B] int64

    def take(self, name: str, rows: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """Column ``name`` at ``rows`` [B, W] (see :func:`~muzero_tune.replay.target_kernels.window_rows`)
        -> [B, W, ...], zero where ``valid`` [B, W] is False."""
        out = self.columns(name)[rows]
        out[~valid] = 0
        return out

    def stacked_obs(self, positions: np.ndarray, *, samples: np.ndarray | None = None) -> np.ndarray:
        """Frame stacks at observation positions (each 0..M of its segment): ``positions`` [B, P] of every
        sample -> [B, P, frame_stack, *frame]; or ``positions`` [N] of samples ``samples`` [N] ->
        [N, frame_stack, *frame]."""
        window = np.arange(self.frame_stack)
        if samples is None:
            rows = self.frame0[:, None, None] + positions[:, :, None] + window  # [B, P, fs]
        else:
            rows = self.frame0[samples][:, None] + positions[:, None] + window  # [N, fs]
        return self.frames_of(self.frame_ids[rows])

    def past(
        self, positions: np.ndarray, samples: np.ndarray, steps: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The H = ``steps`` steps before observation positions ``positions`` [N] of samples ``samples`` [N],
        oldest first: their stacked frames [N, H, frame_stack, *frame] (the observations o_{p-H}..o_{p-1}),
        the actions taken there [N, H, ...], and ``valid`` [N, H] bool (a suffix of each row). A step
        before position 0 comes from the sample's previous segment (``prev_*``) when it is held; it is not
        valid when the episode started after it or its data is not held. Invalid steps are zero."""
        positions = np.asarray(positions, dtype=np.int64)
        samples = np.asarray(samples, dtype=np.int64)
        q = positions[:, None] + np.arange(-steps, 0)[None, :]  # [N, H] positions in the sample's segment
        valid = q >= 0
        rows = self.step0[samples][:, None] + q
        frame_rows = self.frame0[samples][:, None] + q
        if self.prev_step0 is not None:
            prev_q = self.prev_real[samples][:, None] + q  # the same steps in the previous segment
            prev = ~valid & (self.prev_step0[samples] >= 0)[:, None] & (prev_q >= 0)
            rows = np.where(prev, self.prev_step0[samples][:, None] + prev_q, rows)
            frame_rows = np.where(prev, self.prev_frame0[samples][:, None] + prev_q, frame_rows)
            valid |= prev
        rows = np.where(valid, rows, self.step0[samples][:, None])  # invalid steps read position 0, zeroed
        frame_rows = np.where(valid, frame_rows, self.frame0[samples][:, None])
        actions = self.columns("actions")[rows]
        actions[~valid] = 0
        frames = self.frames_of(self.frame_ids[frame_rows[:, :, None] + np.arange(self.frame_stack)])
        frames[~valid] = 0
        return frames, actions, valid


def rows_of_segments(segs) -> StepRows:
    """StepRows for segments held outside a buffer: the distinct segments' arrays concatenated once."""
    index: dict[int, int] = {}
    unique = []
    which = np.empty(len(segs), dtype=np.int64)  # [B] sample -> index into ``unique``
    for b, seg in enumerate(segs):
        j = index.get(id(seg))
        if j is None:
            j = index[id(seg)] = len(unique)
            unique.append(seg)
        which[b] = j
    lengths = np.fromiter((s.num_stored for s in unique), dtype=np.int64, count=len(unique))
    terminal = np.fromiter((s.terminal_at_end for s in unique), dtype=bool, count=len(unique))
    cache: dict[str, np.ndarray] = {}

    def columns(name: str) -> np.ndarray:
        if name not in cache:
            cache[name] = np.concatenate([segment_columns(s)[name] for s in unique])
        return cache[name]

    frame_len = np.fromiter((len(s.frames) for s in unique), dtype=np.int64, count=len(unique))
    frame_off = np.cumsum(frame_len) - frame_len
    first = unique[0].frames
    if isinstance(first, FrameRef) and all(
        isinstance(s.frames, FrameRef) and s.frames.store is first.store for s in unique
    ):
        flat_ids = np.concatenate([s.frames.ids for s in unique])  # ids into the shared FrameStore
        frames_of = first.store.get
    else:  # frames held by the segments themselves (not pushed to a buffer): rows of their concatenation
        flat = np.concatenate([s.frames[:] for s in unique])
        flat_ids = np.arange(len(flat), dtype=np.int64)

        def frames_of(rows: np.ndarray) -> np.ndarray:
            return flat[rows]

    offsets = np.cumsum(lengths) - lengths
    prev = _previous_of(unique)[which]  # [B] index into ``unique`` of each sample's previous segment, or -1
    has = prev >= 0
    real = np.fromiter((s.num_real for s in unique), dtype=np.int64, count=len(unique))
    return StepRows(
        columns=columns,
        step0=offsets[which],
        num_stored=lengths[which],
        terminal=terminal[which],
        frame_ids=flat_ids,
        frame0=frame_off[which],
        frames_of=frames_of,
        frame_stack=unique[0].frame_stack,
        prev_step0=np.where(has, offsets[prev], -1),
        prev_frame0=np.where(has, frame_off[prev], -1),
        prev_real=np.where(has, real[prev], 0),
    )


def _previous_of(segs) -> np.ndarray:
    """[S] int64: for each of ``segs`` the index of its previous segment among them (:func:`continues`),
    or -1."""
    ends = {(s.stream_id, s.episode_index, s.episode_step0 + s.num_real): j for j, s in enumerate(segs)}
    prev = np.full(len(segs), -1, dtype=np.int64)
    for j, seg in enumerate(segs):
        p = ends.get((seg.stream_id, seg.episode_index, seg.episode_step0))
        if p is not None and p != j and continues(segs[p], seg):
            prev[j] = p
    return prev
