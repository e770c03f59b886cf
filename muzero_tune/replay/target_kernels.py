"""Numba kernels of target building: per-sample window indices, n-step reward sums, masks and the list of
positions that need a bootstrap value -- one pass over the batch instead of a dozen numpy temporaries.

They must produce exactly what the numpy definitions in :mod:`muzero_tune.replay.targets` produced (the
batch a seed gives may not change): the discounted reward sum of a value target is summed the way
``np.sum(..., axis=-1)`` sums a contiguous row (numpy's pairwise summation: eight running partial sums
over blocks of eight, combined as ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)), the remainder added in order,
halves above 128 terms, all added to 0.0), each term being ``(r_j * gamma^j) * [j < n]``.
``tests/test_targets.py`` pins the kernels against those numpy expressions. Powers of gamma come in as an
array computed by numpy, so no power is evaluated here.
"""

from __future__ import annotations

import numba
import numpy as np

_BLOCK = 8  # numpy's pairwise-sum unroll
_LEAF = 128  # numpy's PW_BLOCKSIZE: above it the row is split in halves


@numba.njit(cache=True, inline="always")
def _leaf_sum(a: np.ndarray, lo: int, n: int) -> float:
    """Sum of a[lo : lo + n], n <= 128, in numpy's pairwise order (float64)."""
    if n < _BLOCK:
        res = 0.0
        for x in range(lo, lo + n):
            res += a[x]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    x = _BLOCK
    stop = n - n % _BLOCK
    while x < stop:
        r0 += a[lo + x]
        r1 += a[lo + x + 1]
        r2 += a[lo + x + 2]
        r3 += a[lo + x + 3]
        r4 += a[lo + x + 4]
        r5 += a[lo + x + 5]
        r6 += a[lo + x + 6]
        r7 += a[lo + x + 7]
        x += _BLOCK
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while x < n:
        res += a[lo + x]
        x += 1
    return res


@numba.njit(cache=True)
def _pairwise_sum(a: np.ndarray, lo: int, n: int) -> float:
    """Sum of a[lo : lo + n] in numpy's pairwise order: rows over 128 split in halves (the first a multiple
    of 8), recursively -- evaluated here with an explicit stack (post-order), since numba recursion is not
    cacheable."""
    if n <= _LEAF:
        return _leaf_sum(a, lo, n)
    los = np.empty(64, dtype=np.int64)  # depth <= log2(n / 128) + 1 per branch; 64 frames is plenty
    ns = np.empty(64, dtype=np.int64)
    state = np.zeros(64, dtype=np.int64)  # 0: not split yet, 1: left summed
    left = np.empty(64, dtype=np.float64)
    los[0], ns[0], top, result = lo, n, 0, 0.0
    while top >= 0:
        if ns[top] <= _LEAF:
            result = _leaf_sum(a, los[top], ns[top])
            top -= 1
            while top >= 0 and state[top] == 1:  # both halves done: combine and pop
                result = left[top] + result
                top -= 1
            if top >= 0:  # a left half finished: keep it, go right
                left[top] = result
                state[top] = 1
                half = ns[top] // 2
                half -= half % _BLOCK
                los[top + 1], ns[top + 1], state[top + 1] = los[top] + half, ns[top] - half, 0
                top += 1
            continue
        half = ns[top] // 2
        half -= half % _BLOCK
        los[top + 1], ns[top + 1], state[top + 1] = los[top], half, 0
        top += 1
    return result


@numba.njit(cache=True)
def window_rows(t_pos, step0, stored, width, rows, valid):
    """Column rows of each sample's window t..t+width-1, clamped to its last stored step.

    t_pos, step0, stored: [B] int64 (position, row of the segment's position 0, M);
    rows: [B, width] int64 out; valid: [B, width] bool out (the row exists: t + w < M).
    """
    for b in range(len(t_pos)):
        m = stored[b]
        for w in range(width):
            j = t_pos[b] + w
            valid[b, w] = j < m
            rows[b, w] = step0[b] + (j if j < m - 1 else m - 1)


@numba.njit(cache=True)
def value_targets(t_pos, stored, terminal, rewards, gamma_pow, td_b, reward_sum, n_terms, boot_ok, masks,
                  target_reward):  # fmt: skip
    """n-step reward sums, masks and bootstrap positions for unroll indices i = t + k, k = 0..K.

    t_pos, stored: [B] int64; terminal: [B] bool; td_b: [B] int64, each sample's horizon (<= td);
    rewards: [B, K + td] float64 (zero past the data); gamma_pow: [td] float64, gamma^j (td = the window,
    the longest horizon). Out: reward_sum [B, K+1] float64; n_terms [B, K+1] int64
    (n = clip(min(td_b, M - i), 0)); boot_ok [B, K+1] bool (i < M and o_{i+n} is not the terminal state);
    masks [4, B, K+1] float32 (value, policy = i < M, obs = i <= M, reward on [:, :, :K]);
    target_reward [B, K] float32 (r_{t+k} where t + k < M, else 0). Returns the number of bootstrap
    positions.
    """
    bsz, kp1 = reward_sum.shape
    td = len(gamma_pow)
    terms = np.empty(td, dtype=np.float64)
    n_boot = 0
    for b in range(bsz):
        m = stored[b]
        term = terminal[b]
        for k in range(kp1):
            i = t_pos[b] + k
            n = min(td_b[b], m - i)
            n = n if n > 0 else 0
            n_terms[b, k] = n
            for j in range(td):
                terms[j] = (rewards[b, k + j] * gamma_pow[j]) * (1.0 if j < n else 0.0)
            reward_sum[b, k] = 0.0 + _pairwise_sum(terms, 0, td)
            in_data = i < m
            ok = in_data and not (i + n == m and term)
            boot_ok[b, k] = ok
            n_boot += ok
            masks[0, b, k] = 1.0 if (in_data or term) else 0.0
            masks[1, b, k] = 1.0 if in_data else 0.0
            masks[2, b, k] = 1.0 if i <= m else 0.0
            if k < kp1 - 1:
                masks[3, b, k] = 1.0 if (in_data or term) else 0.0
                target_reward[b, k] = np.float32(rewards[b, k] * (1.0 if in_data else 0.0))
    return n_boot
