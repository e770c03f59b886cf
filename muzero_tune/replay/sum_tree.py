"""Numba kernels of a sum tree: the prioritized draw in O(B log N) and the priority write in O(B log N).

Layout: one float64 array ``tree`` [2C], C a power of two; leaf i (a storage slot of
:class:`~muzero_tune.replay.growable.SumTreeArray`) is ``tree[C + i]``, node j's children are 2j and 2j+1,
the total is ``tree[1]`` (``tree[0]`` unused). Every write recomputes its ancestors from their children,
so the sums never drift the way add-the-difference updates do.

A draw descends from the root with ``target = u * total`` and returns the first leaf whose inclusive
prefix sum exceeds it: the index ``numpy.random.Generator.choice(n, p=w / w.sum())`` returns for the same
uniform ``u`` (it searches ``cumsum(p) / cumsum(p)[-1]`` the same way), except where ``u`` falls within
rounding of a boundary between two leaves (about N * 1e-16 of the unit interval in all).
"""

from __future__ import annotations

import numba
import numpy as np


def empty(num_slots: int) -> np.ndarray:
    """A zero tree [2C] with C the smallest power of two >= ``num_slots`` (>= 1)."""
    cap = 1 << max(int(num_slots) - 1, 0).bit_length()
    return np.zeros(2 * cap, dtype=np.float64)


@numba.njit(cache=True)
def build(tree: np.ndarray, leaves: np.ndarray) -> None:
    """Set the leaves to ``leaves`` [S] (S <= C; the rest 0) and every inner node from its children."""
    cap = tree.size // 2
    tree[cap:] = 0.0
    tree[cap : cap + leaves.size] = leaves
    for j in range(cap - 1, 0, -1):
        tree[j] = tree[2 * j] + tree[2 * j + 1]


@numba.njit(cache=True)
def set_leaves(tree: np.ndarray, slots: np.ndarray, values: np.ndarray) -> None:
    """``leaf[slots[b]] = values[b]`` for b in order, each leaf's ancestors recomputed from their children."""
    cap = tree.size // 2
    for b in range(slots.size):
        j = cap + slots[b]
        tree[j] = values[b]
        j >>= 1
        while j >= 1:
            tree[j] = tree[2 * j] + tree[2 * j + 1]
            j >>= 1


@numba.njit(cache=True)
def zero_range(tree: np.ndarray, lo: int, hi: int) -> None:
    """Leaves ``[lo, hi)`` set to 0, their ancestors recomputed a level at a time (O(hi - lo + log C))."""
    if hi <= lo:
        return
    cap = tree.size // 2
    a, b = cap + lo, cap + hi - 1
    tree[a : b + 1] = 0.0
    while a > 1:
        a >>= 1
        b >>= 1
        for j in range(a, b + 1):
            tree[j] = tree[2 * j] + tree[2 * j + 1]


@numba.njit(cache=True)
def find(tree: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """For each target in ``targets`` [B] (in [0, total)): the first leaf whose inclusive prefix sum
    exceeds it. Returns [B] int64 leaf indices. A target that rounding puts at the total ends on an empty
    leaf past the last non-empty one, which the caller clips back to it."""
    cap = tree.size // 2
    out = np.empty(targets.size, dtype=np.int64)
    for b in range(targets.size):
        t = targets[b]
        j = 1
        while j < cap:
            left = tree[2 * j]
            if t < left:
                j = 2 * j
            else:
                t -= left
                j = 2 * j + 1
        out[b] = j - cap
    return out
