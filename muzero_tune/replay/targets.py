"""Training targets for sampled transitions: unrolled observations and actions, n-step value targets,
reward and policy targets, and their validity masks.

For a sample (segment, t) and unroll step k = 0..K, the unroll index is i = t + k; a segment stores M
transitions (real + true-continuation padding) and observations 0..M.

- value target z_i: with n = min(td_steps, M - i) (td_steps per sample with the off-policy correction,
  :func:`off_policy_td_steps`),
  z_i = sum_{j<n} gamma^j r_{i+j} + gamma^n v_target(o_{i+n}),
  the bootstrap term dropped when o_{i+n} is the terminal state. Past M: 0 if the data ended in a terminal
  state (absorbing), else unknown (masked out).
- reward target for step k: r_{t+k}; past M: 0 if terminal, else masked.
- policy target: the stored (or reanalyzed) visit distribution at i, ``[A]`` for discrete policies or
  over whatever the policy stored in ``child_visits`` (e.g. its K sampled actions); past M masked.
- actions a_{t+k}, k = 0..K-1 (what the learner unrolls with), in the library's form: ``[B, K]`` int64
  (discrete), ``[B, K, D]`` float32 in [-1, 1] (continuous, ``action_dim`` = D > 0) or ``[B, K, D]`` int64
  factor indices (factored, ``action_nvec``); past M uniform random (their targets are absorbing or masked).

Bootstrap values come from ``value_fn`` (the target model, supplied by the policy), called here or -- with
``defer_bootstrap`` -- by the learner at the start of its step (:class:`Bootstrap`). A policy that evaluates
a position in the context of the steps before it (``context_steps`` H > 0, e.g. a transformer world model
whose acting roots see a window of past observations and actions) gets, with each bootstrap and reanalyze
position p, the H steps before it (:class:`PastSteps`: o_{p-H}..o_{p-1} and a_{p-H}..a_{p-1}, cut at the
episode start, :meth:`~muzero_tune.replay.steps.StepRows.past`); H = 0 asks exactly what it always asked.
The per-sample data is gathered from :class:`~muzero_tune.replay.steps.StepRows` (the buffer's column blocks)
and the arithmetic runs in :mod:`~muzero_tune.replay.target_kernels`. This module never imports torch and
never mutates the buffer except through the explicit reanalyze write-back.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from muzero_tune.envs.spec import random_actions, stack_frames
from muzero_tune.replay.buffer import SampledIndices
from muzero_tune.replay.segment import GameSegment
from muzero_tune.replay.steps import STAT, StepRows, rows_of_segments
from muzero_tune.replay.target_kernels import value_targets, window_rows

# stacked obs [N, *obs_shape] (, past: PastSteps of N rows, with context_steps > 0) -> value [N] float32;
# asked for a batch's N bootstrap positions in order, in one call or in consecutive pieces (Bootstrap.values),
# so one that needs more than the observation per position (a replayed history) takes it in that order
ValueFn = Callable[..., np.ndarray]
# obs [N, ...], legal [N, A] (, past: PastSteps of N rows, with context_steps > 0) -> visits [N, A], or
# {stat name: [N, ...]} to write back
ReanalyzeFn = Callable[..., "np.ndarray | dict[str, np.ndarray]"]


@dataclass(frozen=True)
class PastSteps:
    """The H steps before each of N positions p, oldest first (slot H-1 is step p-1): what a policy with
    ``context_steps`` = H builds its root's context from. ``valid`` is a suffix of each row: the window is
    cut at the episode start (and where the data before the segment is not held); invalid slots are zero."""

    obs: np.ndarray  # [N, H, *obs_shape] stacked observations o_{p-H}..o_{p-1}
    actions: np.ndarray  # [N, H] int64 or [N, H, D] float32: a_{p-H}..a_{p-1}, the actions taken there
    valid: np.ndarray  # [N, H] bool

    def rows(self, lo: int, hi: int) -> PastSteps:
        """Rows lo..hi-1 (views)."""
        return PastSteps(self.obs[lo:hi], self.actions[lo:hi], self.valid[lo:hi])


def past_steps(rows: StepRows, positions: np.ndarray, samples: np.ndarray, steps: int) -> PastSteps:
    """The ``steps`` steps before observation positions ``positions`` [N] of samples ``samples`` [N] (rows of
    ``rows``), as model inputs (frames stacked)."""
    frames, actions, valid = rows.past(positions, samples, steps)  # [N, H, fs, *frame], [N, H, ...]
    return PastSteps(stack_frames(frames, frame_ndim=frames.ndim - 3), actions, valid)


@dataclass(frozen=True)
class Bootstrap:
    """The bootstrap term of a batch's n-step value targets: z = reward_sum + gamma^n * v_target(o_{i+n}),
    for the N unroll positions that have one (inside the data, not bootstrapping from a terminal state).

    Why the learner evaluates it, not the driver's bookkeeping: v_target is a forward pass of the learner's
    target network on the learner's device -- the same kind of work as the train step, and it gets faster
    with the learner's accelerator, while the driver's gathers do not. Left here it is one batched call over
    exactly the N positions that need it; the driver's thread keeps only CPU bookkeeping. The values are the
    same either way: the target network only changes at the end of a train step, after this batch's targets.
    """

    obs: np.ndarray  # [N, *obs_shape] stacked bootstrap observations o_{i+n}, row-major over (b, k)
    flat_index: np.ndarray  # [N] int64, b * (K+1) + k: where each value goes in target_value
    scale: np.ndarray  # [N] float64, gamma^n
    reward_sum: np.ndarray  # [B, K+1] float64, discounted reward sums (the whole target where N misses)
    value_fn: ValueFn  # the target network's values (bound by the policy to the learner's target model)
    past: PastSteps | None = None  # N rows: the steps before each o_{i+n} (make_batch's context_steps > 0)

    def values(self, piece_rows: int = 0) -> np.ndarray:
        """The value targets [B, K+1] float32: ``value_fn`` called once over the N positions, or -- with
        ``piece_rows`` > 0 (``learn.bootstrap_piece_rows``) -- once per that many of them, in order.

        Why pieces: the learner runs this forward on its helper thread beside the loss's backward, and a
        conv network's activations for a piece stay in cache where those of one call over all N do not
        (Pong, 192 positions in pieces of 32: the train step 1.04-1.11x faster in interleaved A/B runs). A
        network's rows do not depend on the rows beside them (the target network runs in eval mode), but
        a matrix product may round a row differently by the number of rows beside it (the CartPole MLP: in
        1 of 451 batches of a run, by 2e-6), so the split is configuration, the same for the serial and the
        overlapped step."""
        if len(self.flat_index) == 0:
            return self.reward_sum.astype(np.float32)
        rows = piece_rows if piece_rows > 0 else len(self.obs)
        parts = [self._piece(lo, lo + rows) for lo in range(0, len(self.obs), rows)]
        target = self.reward_sum.copy()
        target.reshape(-1)[self.flat_index] += self.scale * np.concatenate(parts)
        return target.astype(np.float32)

    def _piece(self, lo: int, hi: int) -> np.ndarray:
        """``value_fn`` over positions lo..hi-1 [n], with their past steps when there are any."""
        if self.past is None:
            return self.value_fn(self.obs[lo:hi])
        return self.value_fn(self.obs[lo:hi], self.past.rows(lo, hi))


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
    # the value targets' bootstrap term when left to the learner (make_batch(defer_bootstrap=True)): until
    # resolve_bootstrap(batch) runs, target_value is NaN and value_targets() computes (or awaits) the term
    bootstrap: Bootstrap | PendingBootstrap | None = None

    @property
    def batch_size(self) -> int:
        return int(self.actions.shape[0])

    def value_targets(self) -> np.ndarray:
        """The value targets [B, K+1] float32: ``target_value``, or -- with the bootstrap term left to the
        learner -- ``bootstrap.values()``, which waits for that forward when it runs on the learner's helper
        thread (:func:`start_bootstrap`). A loss reads its value targets through this, as late as it can."""
        return self.target_value if self.bootstrap is None else self.bootstrap.values()


@dataclass(frozen=True)
class PendingBootstrap:
    """A deferred bootstrap forward already running elsewhere (:func:`start_bootstrap`)."""

    future: Future  # resolves to the value targets [B, K+1] float32

    def values(self) -> np.ndarray:
        """The value targets [B, K+1] float32, once the forward is done (its exception, if it raised)."""
        return self.future.result()


def resolve_bootstrap(batch: TrainBatch, piece_rows: int = 0) -> TrainBatch:
    """``batch`` with its value targets complete (a no-op for a batch built without deferring);
    ``piece_rows``: see :meth:`Bootstrap.values`."""
    term = batch.bootstrap
    if term is None:
        return batch
    values = term.values() if isinstance(term, PendingBootstrap) else term.values(piece_rows)
    return dataclasses.replace(batch, target_value=values, bootstrap=None)


def start_bootstrap(batch: TrainBatch, submit: Callable[..., Future], piece_rows: int = 0) -> TrainBatch:
    """``batch`` with its deferred bootstrap forward handed to ``submit`` (an executor's ``submit``), so it
    runs while the caller computes the loss's forward; the loss's :meth:`TrainBatch.value_targets` waits for
    it. The values are the same: the target network changes only after the step. ``piece_rows``: see
    :meth:`Bootstrap.values`. A no-op without a deferred term."""
    if batch.bootstrap is None or isinstance(batch.bootstrap, PendingBootstrap):
        return batch
    forward = functools.partial(batch.bootstrap.values, piece_rows)
    return dataclasses.replace(batch, bootstrap=PendingBootstrap(submit(forward)))


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


def off_policy_td_steps(
    age_transitions: np.ndarray | None, *, td_steps: int, td_steps_min: int, transitions_per_step: int
) -> np.ndarray | int:
    """EfficientZero's model-based off-policy correction (Ye et al. 2021): the older a sample's data, the
    shorter its n-step horizon, so stale returns of an older policy weigh less against the target model's
    bootstrap value.

    ``age_transitions`` [B] int64: transitions pushed after each sample (``SampledIndices.age_transitions``).
    Returns [B] int64, ``td_steps - age // transitions_per_step`` clipped to [``td_steps_min``, ``td_steps``];
    plain ``td_steps`` when the correction is off (``transitions_per_step`` 0) or the ages are unknown.
    """
    if transitions_per_step <= 0 or age_transitions is None:
        return td_steps
    shrink = np.asarray(age_transitions, dtype=np.int64) // transitions_per_step
    return np.clip(td_steps - shrink, min(td_steps_min, td_steps), td_steps)


def make_batch(
    sample: SampledIndices,
    *,
    num_unroll_steps: int,
    td_steps: int | np.ndarray,
    discount: float,
    num_actions: int,
    value_fn: ValueFn,
    rng: np.random.Generator,
    all_obs: bool = True,
    reanalyze_count: int = 0,
    reanalyze_fn: ReanalyzeFn | None = None,
    extra_stats: tuple[str, ...] = (),
    action_dim: int = 0,
    action_nvec: tuple[int, ...] = (),
    defer_bootstrap: bool = False,
    context_steps: int = 0,
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
    ``EnvSpec.action_dim``); ``action_nvec``: factored actions (``actions`` [B, K, D] int64 -- pass
    ``EnvSpec.action_nvec``). ``td_steps``: the n of every sample's value targets, or [B] int64 one per
    sample (:func:`off_policy_td_steps`). ``defer_bootstrap``: leave the bootstrap values to whoever trains
    on the batch (``batch.bootstrap``, resolved by :func:`resolve_bootstrap`; ``target_value`` is NaN until
    then) instead of calling ``value_fn`` here. ``context_steps`` H > 0: ``value_fn`` and ``reanalyze_fn``
    also get the H steps before each of their positions (:class:`PastSteps`, their last argument).
    """
    k_steps, bsz = num_unroll_steps, len(sample.positions)
    td_b = np.ascontiguousarray(np.broadcast_to(np.asarray(td_steps, dtype=np.int64), (bsz,)))  # [B]
    td = int(td_b.max()) if bsz else 1  # the reward window's length: the longest horizon
    if reanalyze_count > 0 and reanalyze_fn is not None:
        reanalyze_positions(
            sample.segments[:reanalyze_count],
            sample.positions[:reanalyze_count],
            span=k_steps + 1,
            reanalyze_fn=reanalyze_fn,
            context_steps=context_steps,
            rows=sample.rows,  # sample b's rows are rows b of the whole sample's (None: from the segments)
        )

    width = k_steps + td  # reward window: r_{t} .. r_{t+K+td-1}
    n_obs = k_steps + 1 if all_obs else 1
    # random past the data; drawn before anything else so discrete batches keep their RNG stream
    actions = random_actions(
        rng, (bsz, k_steps), num_actions=num_actions, action_dim=action_dim, action_nvec=action_nvec
    )
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
    # one window of column rows t..t+K+td-1 per sample; actions use its first K, policies its first K+1
    win_rows = np.empty((bsz, width), dtype=np.int64)
    win_valid = np.empty((bsz, width), dtype=bool)
    window_rows(t_pos, rows.step0, stored, width, win_rows, win_valid)
    rewards = rows.take("rewards", win_rows, win_valid).astype(np.float64)  # [B, width]
    step_actions = rows.take("actions", win_rows[:, :k_steps], win_valid[:, :k_steps])
    real = win_valid[:, :k_steps]
    actions[real] = step_actions[real]  # random past the data (drawn above), else the stored actions
    pol_rows, pol_valid = win_rows[:, : k_steps + 1], win_valid[:, : k_steps + 1]
    target_policy = rows.take(STAT + "child_visits", pol_rows, pol_valid).astype(np.float32, copy=False)
    extras = {name: rows.take(STAT + name, pol_rows, pol_valid) for name in extra_stats}

    reward_sum = np.empty((bsz, k_steps + 1), dtype=np.float64)
    n = np.empty((bsz, k_steps + 1), dtype=np.int64)  # [B, K+1] reward terms per value target
    boot_ok = np.empty((bsz, k_steps + 1), dtype=bool)
    masks = np.zeros((4, bsz, k_steps + 1), dtype=np.float32)  # value, policy, obs, reward masks
    target_reward = np.zeros((bsz, k_steps), dtype=np.float32)
    gamma_pow = discount ** np.arange(td)  # numpy's powers, as the numpy definition had them
    value_targets(
        t_pos, stored, terminal, rewards, gamma_pow, td_b, reward_sum, n, boot_ok, masks, target_reward
    )
    # unrolled observations at t..t+n_obs-1 clamped to M, and only the bootstrap observations that are used
    obs_pos = np.minimum(t_pos[:, None] + np.arange(n_obs)[None, :], stored[:, None])  # [B, n_obs]
    frames = rows.stacked_obs(obs_pos)  # [B, n_obs, frame_stack, *frame_shape]
    boot_b, boot_k = np.nonzero(boot_ok)  # row-major, the order value_fn has always been asked in
    boot_n = n[boot_b, boot_k]
    boot_pos = t_pos[boot_b] + boot_k + boot_n  # [N] bootstrap observation positions
    boot_frames = rows.stacked_obs(boot_pos, samples=boot_b)  # [N, fs, *frame]
    bootstrap = Bootstrap(
        obs=stack_frames(boot_frames, frame_ndim=boot_frames.ndim - 2),
        flat_index=boot_b * (k_steps + 1) + boot_k,
        scale=discount**boot_n,
        reward_sum=reward_sum,
        value_fn=value_fn,
        past=past_steps(rows, boot_pos, boot_b, context_steps) if context_steps > 0 else None,
    )
    deferred = defer_bootstrap and len(boot_b) > 0
    return TrainBatch(
        obs=stack_frames(frames, frame_ndim=frames.ndim - 3),
        actions=actions,
        target_value=np.full_like(reward_sum, np.nan, dtype=np.float32) if deferred else bootstrap.values(),
        target_reward=target_reward,
        target_policy=target_policy,
        value_mask=masks[0],
        reward_mask=np.ascontiguousarray(masks[3, :, :k_steps]),
        policy_mask=masks[1],
        obs_mask=masks[2],
        bootstrap=bootstrap if deferred else None,
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
    context_steps: int = 0,
    rows: StepRows | None = None,
) -> int:
    """Re-search positions t..t+span-1 (within stored data) of each segment and write the results back:
    ``reanalyze_fn`` returns visit distributions [N, A] (written to ``stats['child_visits']``) or a dict of
    per-step statistics by name (each [N, ...], written to ``stats[name]``). Returns the positions
    re-searched. ``context_steps`` H > 0: ``reanalyze_fn`` also gets the H steps before each position
    (:class:`PastSteps`), read through ``rows`` (row b: ``segments[b]``, e.g. the buffer's
    :meth:`~muzero_tune.replay.buffer.ReplayBuffer.step_rows`; None: from the segments themselves)."""
    where: list[tuple[GameSegment, int]] = []
    owner: list[int] = []  # the sample (index into segments) of each position
    obs: list[np.ndarray] = []
    legal: list[np.ndarray] = []
    for b, (seg, t) in enumerate(zip(segments, positions)):
        for i in range(int(t), min(int(t) + span, seg.num_stored)):
            where.append((seg, i))
            owner.append(b)
            obs.append(seg.stacked_obs(np.array([i]))[0])
            # continuous-action policies may store no mask: an empty [0] one is what the collector passes
            legal.append(seg.stats["legal_mask"][i] if "legal_mask" in seg.stats else np.ones(0, dtype=bool))
    if not where:
        return 0
    frame_ndim = segments[0].frames.ndim - 1
    args = [stack_frames(np.stack(obs), frame_ndim=frame_ndim), np.stack(legal)]
    if context_steps > 0:
        rows = rows if rows is not None else rows_of_segments(segments)
        at = np.fromiter((i for _, i in where), dtype=np.int64, count=len(where))
        args.append(past_steps(rows, at, np.asarray(owner, dtype=np.int64), context_steps))
    fresh = reanalyze_fn(*args)
    if not isinstance(fresh, dict):
        fresh = {"child_visits": fresh}
    for j, (seg, i) in enumerate(where):
        for name, arr in fresh.items():
            if not seg.stats[name].flags.writeable:  # segments from Ray are read-only object-store views
                seg.stats[name] = seg.stats[name].copy()
            seg.stats[name][i] = arr[j]
    return len(where)
