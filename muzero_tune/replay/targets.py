"""Training targets for sampled transitions: unrolled observations and actions, n-step value targets,
reward and policy targets, and their validity masks.

For a sample (segment, t) and unroll step k = 0..K, the unroll index is i = t + k; a segment stores M
transitions (real + true-continuation padding) and observations 0..M.

- value target z_i: with n = min(td_steps, M - i),
  z_i = sum_{j<n} gamma^j r_{i+j} + gamma^n v_target(o_{i+n}),
  the bootstrap term dropped when o_{i+n} is the terminal state. Past M: 0 if the data ended in a terminal
  state (absorbing), else unknown (masked out).
- reward target for step k: r_{t+k}; past M: 0 if terminal, else masked.
- policy target: the stored (or reanalyzed) visit distribution at i, ``[A]`` for discrete policies or
  over whatever the policy stored in ``child_visits`` (e.g. its K sampled actions); past M masked.
- actions a_{t+k}, k = 0..K-1 (what the learner unrolls with), in the library's form: ``[B, K]`` int64
  (discrete) or ``[B, K, D]`` float32 in [-1, 1] (continuous, ``action_dim`` = D > 0); past M uniform
  random (their targets are absorbing or masked).

Bootstrap values come from ``value_fn`` (the target model, supplied by the policy): this module never
imports torch and never mutates the buffer except through the explicit reanalyze write-back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from muzero_tune.envs.spec import random_actions, stack_frames
from muzero_tune.replay.buffer import SampledIndices
from muzero_tune.replay.segment import GameSegment
from muzero_tune.replay.steps import STAT, rows_of_segments

ValueFn = Callable[[np.ndarray], np.ndarray]  # stacked obs [N, *obs_shape] -> value [N] float32
# obs [N, ...], legal [N, A] -> visits [N, A], or {stat name: [N, ...]} to write back
ReanalyzeFn = Callable[[np.ndarray, np.ndarray], "np.ndarray | dict[str, np.ndarray]"]


@dataclass(frozen=True)
class TrainBatch:
    """One learner batch (numpy; the learner moves it to its device)."""

    obs: np.ndarray  # [B, K+1 or 1, *obs_shape] stacked observations at t..t+K (clamped to M)
    actions: np.ndarray  # [B, K] int64 (discrete) or [B, K, D] float32 in [-1, 1] (continuous)
    target_value: np.ndarray  # [B, K+1] float32, raw scalars
    target_reward: np.ndarray  # [B, K] float32, raw scalars
    target_policy: np.ndarray  # [B, K+1, A] float32 (A: the width of the stored child_visits)
    value_mask: np.ndarray  # [B, K+1] float32
    reward_mask: np.ndarray  # [B, K] float32
    policy_mask: np.ndarray  # [B, K+1] float32
    obs_mask: np.ndarray  # [B, K+1] float32, 1 where obs[:, k] is a real observation (SSL targets)
    weights: np.ndarray  # [B] float32 importance weights
    flat_index: np.ndarray  # [B] int64
    make_time: int
    extras: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return int(self.actions.shape[0])


def n_step_targets(
    seg: GameSegment, i: int, *, td_steps: int, discount: float
) -> tuple[float, int | None, float, bool]:
    """For unroll index i of ``seg``: (discounted reward sum, bootstrap obs index or None, gamma^n, valid).

    The value target is ``reward_sum + gamma_n * v(obs[bootstrap])`` when a bootstrap index is returned.
    """
    m = seg.num_stored
    if i >= m:
        return 0.0, None, 0.0, seg.terminal_at_end
    n = min(td_steps, m - i)
    r = seg.rewards[i : i + n].astype(np.float64)
    reward_sum = float(np.sum(r * discount ** np.arange(n)))
    b = i + n
    if b == m and seg.terminal_at_end:
        return reward_sum, None, 0.0, True
    return reward_sum, b, float(discount**n), True


def make_batch(
    sample: SampledIndices,
    *,
    num_unroll_steps: int,
    td_steps: int,
    discount: float,
    num_actions: int,
    value_fn: ValueFn,
    rng: np.random.Generator,
    all_obs: bool = True,
    reanalyze_count: int = 0,
    reanalyze_fn: ReanalyzeFn | None = None,
    extra_stats: tuple[str, ...] = (),
    action_dim: int = 0,
) -> TrainBatch:
    """Build the targets of a prioritized sample (vectorised over the batch; :func:`n_step_targets` is the
    per-element definition it must agree with).

    ``all_obs``: gather stacked observations for every unroll step (needed by the SSL loss), else only
    k = 0. ``reanalyze_count``: the first that many samples get fresh policy targets from
    ``reanalyze_fn`` (a search with the target model), written back into their segments' stored
    ``child_visits``. ``extra_stats``: names of further per-step statistics (e.g. a Gumbel improved
    policy, chance codes) gathered at t..t+K into ``extras[name]`` [B, K+1, ...], zero past the stored data
    (``policy_mask`` says where they are real). ``action_dim``: 0 for discrete actions (``num_actions``
    indices, ``actions`` [B, K] int64); D > 0 for continuous ones (``actions`` [B, K, D] float32 -- pass
    ``EnvSpec.action_dim``).
    """
    k_steps, td = num_unroll_steps, td_steps
    bsz = len(sample.positions)
    if reanalyze_count > 0 and reanalyze_fn is not None:
        reanalyze_positions(
            sample.segments[:reanalyze_count],
            sample.positions[:reanalyze_count],
            span=k_steps + 1,
            reanalyze_fn=reanalyze_fn,
        )

    width = k_steps + td  # reward window: r_{t} .. r_{t+K+td-1}
    n_obs = k_steps + 1 if all_obs else 1
    # random past the data; drawn before anything else so discrete batches keep their RNG stream
    actions = random_actions(rng, (bsz, k_steps), num_actions=num_actions, action_dim=action_dim)
    segs = sample.segments
    stored_shape = segs[0].actions.shape[1:]
    if stored_shape != actions.shape[2:]:
        raise ValueError(
            f"make_batch: segments store actions of shape [M, *{stored_shape}] but action_dim={action_dim} "
            f"asks for [M, *{actions.shape[2:]}] (pass action_dim=EnvSpec.action_dim)"
        )
    rows = sample.rows if sample.rows is not None else rows_of_segments(segs)
    stored, terminal = rows.num_stored, rows.terminal  # [B] M and terminal_at_end per sample
    t_pos = np.asarray(sample.positions, dtype=np.int64)
    ks = np.arange(k_steps + 1)
    i = t_pos[:, None] + ks[None, :]  # [B, K+1] unroll indices
    m = stored[:, None]
    n = np.clip(np.minimum(td, m - i), 0, None)  # [B, K+1] reward terms per value target
    # observation positions to gather per sample: the unrolled observations, then each bootstrap observation
    # (clamped to M; unused ones are masked below) -- one gather for the whole batch
    obs_pos = np.minimum(t_pos[:, None] + np.arange(n_obs)[None, :], m)  # [B, n_obs]
    gather = np.concatenate([obs_pos, np.minimum(i + n, m)], axis=1)  # [B, n_obs + K+1]
    rewards = rows.windows("rewards", t_pos, width).astype(np.float64)  # [B, width]
    step_actions, real = rows.windows("actions", t_pos, k_steps, with_valid=True)
    actions[real] = step_actions[real]  # random past the data (drawn above), else the stored actions
    target_policy = rows.windows(STAT + "child_visits", t_pos, k_steps + 1)
    target_policy = target_policy.astype(np.float32, copy=False)
    extras = {name: rows.windows(STAT + name, t_pos, k_steps + 1) for name in extra_stats}
    frames = rows.stacked_obs(gather)  # [B, n_obs + K+1, frame_stack, *frame_shape]
    all_frames = stack_frames(frames, frame_ndim=frames.ndim - 3)  # [B, n_obs + K+1, *obs_shape]

    in_data = i < m  # [B, K+1]
    windows = np.lib.stride_tricks.sliding_window_view(rewards, td, axis=1)[:, : k_steps + 1]  # [B, K+1, td]
    j = np.arange(td)
    reward_sum = np.sum(windows * (discount**j) * (j[None, None, :] < n[:, :, None]), axis=-1)
    boot_ok = in_data & ~((i + n == m) & terminal[:, None])
    target_value = reward_sum
    if boot_ok.any():
        values = value_fn(all_frames[:, n_obs:][boot_ok])
        target_value = reward_sum.copy()
        target_value[boot_ok] += (discount ** n[boot_ok]) * values
    value_mask = in_data | terminal[:, None]
    step_in_data = i[:, :k_steps] < m
    reward_mask = step_in_data | terminal[:, None]
    return TrainBatch(
        obs=np.ascontiguousarray(all_frames[:, :n_obs]),
        actions=actions,
        target_value=target_value.astype(np.float32),
        target_reward=(rewards[:, :k_steps] * step_in_data).astype(np.float32),
        target_policy=target_policy,
        value_mask=value_mask.astype(np.float32),
        reward_mask=reward_mask.astype(np.float32),
        policy_mask=in_data.astype(np.float32),
        obs_mask=(i <= m).astype(np.float32),
        weights=sample.weights,
        flat_index=sample.flat_index,
        make_time=sample.make_time,
        extras=extras,
    )


def reanalyze_positions(
    segments: tuple[GameSegment, ...] | list[GameSegment],
    positions: np.ndarray,
    *,
    span: int,
    reanalyze_fn: ReanalyzeFn,
) -> int:
    """Re-search positions t..t+span-1 (within stored data) of each segment and write the results back:
    ``reanalyze_fn`` returns visit distributions [N, A] (written to ``stats['child_visits']``) or a dict of
    per-step statistics by name (each [N, ...], written to ``stats[name]``). Returns the positions
    re-searched."""
    where: list[tuple[GameSegment, int]] = []
    obs: list[np.ndarray] = []
    legal: list[np.ndarray] = []
    for seg, t in zip(segments, positions):
        for i in range(int(t), min(int(t) + span, seg.num_stored)):
            where.append((seg, i))
            obs.append(seg.stacked_obs(np.array([i]))[0])
            # continuous-action policies may store no mask: an empty [0] one is what the collector passes
            legal.append(seg.stats["legal_mask"][i] if "legal_mask" in seg.stats else np.ones(0, dtype=bool))
    if not where:
        return 0
    frame_ndim = segments[0].frames.ndim - 1
    fresh = reanalyze_fn(stack_frames(np.stack(obs), frame_ndim=frame_ndim), np.stack(legal))
    if not isinstance(fresh, dict):
        fresh = {"child_visits": fresh}
    for j, (seg, i) in enumerate(where):
        for name, arr in fresh.items():
            if not seg.stats[name].flags.writeable:  # segments from Ray are read-only object-store views
                seg.stats[name] = seg.stats[name].copy()
            seg.stats[name][i] = arr[j]
    return len(where)
