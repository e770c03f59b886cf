"""The driver core: what the sync and async drivers share, so their training semantics are identical.

It owns the learner and the replay buffer (the single owner: nothing else mutates them), the driver RNG,
and the run counters. Both drivers call the same methods: :meth:`push_collect` (push segments, count
env steps, return the train budget owed), :meth:`train_step` (sample, build targets, learn, write back
priorities, buffer reanalyze per schedule), :meth:`record_eval` (metrics, checkpoint through the
reporter) and :meth:`resume_state` / :meth:`load_resume_state`.

A train step may build the next step's batch ahead (``learn.prefetch_next_batch``): once its loss's forward
is done and its priorities are written back, so the next batch's bootstrap forward runs on the learner's
helper thread beside this step's backward, and (``learn.build_ahead_on_helper``) its draw and targets
there too, the step waiting for them before it returns, so no buffer write overlaps them. It draws with a
copy of the driver RNG and without ticking the buffer's clock, and the next :meth:`train_step` uses it only
if the buffer's version, the RNG's state and the target network's version are still those it was built at
(and then takes the copy's RNG state and the tick), so the batches, the RNG stream and every checkpoint are
the same as building each batch in turn.
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import numpy as np
import torch

from muzero_tune.config import ConfigError, ExperimentConfig, to_flat_dict
from muzero_tune.envs import spec_of
from muzero_tune.pipeline import schedule
from muzero_tune.pipeline.learner import Learner, LearnOutput
from muzero_tune.pipeline.messages import CollectResult, EvalResult
from muzero_tune.policies.base import check_action_kind, with_model_kind
from muzero_tune.policies.registry import get_policy_class, policy_types_for
from muzero_tune.replay.buffer import ReplayBuffer, SampledIndices
from muzero_tune.replay.targets import PendingBootstrap, TrainBatch, reanalyze_positions
from muzero_tune.runs.checkpoint import to_numpy_tree
from muzero_tune.runs.reporter import Reporter

EVAL_SEED_OFFSET = 100_000  # evaluator episode j is reset with seed cfg.seed + EVAL_SEED_OFFSET + j
EPISODE_WINDOW = 100  # collect/episode_*_mean average the last this many finished training episodes


@dataclass
class Counters:
    """Run counters; all of them are saved in checkpoints and restored exactly on resume."""

    env_steps: int = 0
    train_epoch: int = 0  # completed train budgets (one per collect)
    eval_index: int = 0  # evaluations done
    last_eval_iter: int | None = None
    best_reward: float = float("-inf")
    collects: int = 0
    reanalyze_calls: int = 0
    stale_writebacks: int = 0
    wall_s: float = 0.0  # run wall time, carried across resumes
    episodes: int = 0  # training episodes finished (episodes in flight are not counted until they end)
    recent_episodes: list = field(default_factory=list)  # [[return, length]] of the last EPISODE_WINDOW
    replay_ratio_carry: float = 0.0  # train steps in [0, 1) owed by replay_ratio, carried to the next collect

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class RunSummary:
    """What a driver returns when it stops."""

    stop_reason: str
    env_steps: int
    train_iter: int
    evals: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    timings: dict[str, float] = field(
        default_factory=dict
    )  # seconds spent per phase (sync: collect, train, eval)


def setup_torch_threads() -> None:
    """One torch thread per process: parallelism comes from processes (measured: 2 threads on 2 busy
    cores are many times slower). The learner's step may take more around its own ops
    (``learn.num_threads``, :func:`~muzero_tune.pipeline.learner.intra_op_threads`). For the library's own
    processes (actors, learner workers); a call into the library from a user's program uses
    :func:`one_torch_thread`, which gives the caller's setting back."""
    torch.set_num_threads(1)


def one_torch_thread(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` run with torch on one intra-op thread (:func:`setup_torch_threads`), the caller's thread
    count restored when it returns or raises: a program that embeds the library keeps its own setting."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        before = torch.get_num_threads()
        setup_torch_threads()
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(before)

    return wrapper


def make_spec(cfg: ExperimentConfig):
    """The env spec of ``cfg.env`` (cached)."""
    return spec_of(cfg.env)


def check_policy_env(cfg: ExperimentConfig):
    """The policy class and env spec, after checking the policy supports the env's action space (called by
    the drivers before anything is written or started; the spec is cached)."""
    spec = make_spec(cfg)
    cls = get_policy_class(cfg.policy.type)
    if spec.action_kind not in cls.action_kinds:
        # both ways: a discrete-only type on a continuous env, a continuous-only one on a discrete env
        check_action_kind(
            cls, spec, policy_type=cfg.policy.type, alternatives=policy_types_for(spec.action_kind)
        )
    with_model_kind(cfg, spec)  # model.kind fits the env's frames
    if cfg.eval.video_every > 0:
        check_video_for(cfg)
    return cls, spec


def check_video_for(cfg: ExperimentConfig, *, asked_by: tuple[str, object] | None = None) -> None:
    """Raise (one line) when evaluation videos of ``cfg``'s env cannot be recorded (no ``rgb_array``
    rendering: a ConfigError naming ``asked_by`` (key, value), default ``eval.video_every``; or the video
    extra missing)."""
    from muzero_tune.envs import EnvConfigError
    from muzero_tune.envs.video import check_video
    from muzero_tune.pipeline.collector import env_factory

    try:
        check_video(lambda: env_factory(cfg, evaluation=True, render_mode="rgb_array")(0), cfg.env.env_id)
    except EnvConfigError as err:
        key, value = asked_by or ("eval.video_every", cfg.eval.video_every)
        raise ConfigError(key, value, str(err)) from None


def video_name(cfg: ExperimentConfig, eval_index: int, version: int) -> str | None:
    """The name of the video evaluation number ``eval_index`` (1-based) records, or None: every
    ``eval.video_every``-th evaluation records its first episode."""
    every = cfg.eval.video_every
    return f"eval_{eval_index:06d}_v{version}" if every > 0 and eval_index % every == 0 else None


def make_policy(cfg: ExperimentConfig):
    """The configured policy and its env spec."""
    cls, spec = check_policy_env(cfg)
    return cls(cfg, spec), spec


P = ParamSpec("P")
R = TypeVar("R")
MakeLearner = Callable[[ExperimentConfig, Any], Any]  # (cfg, policy) -> a Learner or a learner group


@dataclass(frozen=True)
class Prefetched:
    """A batch built ahead of its train step and what it was built on (see the module docstring)."""

    sample: SampledIndices
    batch: TrainBatch  # its bootstrap forward already running on the learner's helper thread
    buffer_version: int
    target_version: int
    rng_before: dict  # the driver RNG's state it was drawn from
    rng_after: dict  # and the state drawing it left


class DriverCore:
    """Learner + replay buffer + counters, driven by a sync or async loop."""

    def __init__(
        self, cfg: ExperimentConfig, reporter: Reporter, *, make_learner: MakeLearner | None = None
    ):
        """``make_learner(cfg, policy)``: the learner (default: :class:`Learner`, in this process; the
        distributed layer passes a data-parallel learner group's constructor for ``learn.num_learners``)."""
        self.cfg = cfg
        self.reporter = reporter
        self.policy, self.spec = make_policy(cfg)
        if make_learner is None:
            if cfg.learn.num_learners > 0:
                raise ConfigError(
                    "learn.num_learners", cfg.learn.num_learners,
                    "learner workers are Ray actors: train through muzero_tune.train, the CLI or Tune",
                )  # fmt: skip
            make_learner = Learner
        self.learner = make_learner(cfg, self.policy)
        rc = cfg.replay
        self.buffer = ReplayBuffer(
            capacity_transitions=rc.capacity_transitions,
            use_priority=rc.use_priority,
            alpha=rc.priority_alpha,
            beta=rc.priority_beta,
        )
        self.rng = np.random.default_rng([cfg.seed, 31337])
        self.counters = Counters()
        self.flat_config = to_flat_dict(cfg)
        self.min_transitions = cfg.learn.min_replay_transitions or cfg.learn.batch_size
        self.t_start = time.monotonic()
        self._wall_offset = 0.0
        self.last_learn: LearnOutput | None = None
        self._prefetched: Prefetched | None = None
        # batches built ahead: used by the next step, and thrown away (something changed first)
        self.prefetch_stats = {"used": 0, "discarded": 0}
        # the sync driver's collector state (SegmentCollector.state_dict), saved beside the replay buffer so a
        # resume continues the episodes in flight; None where the collectors are actors (async)
        self.collector_state: Callable[[], dict] | None = None

    # ------------------------------------------------------------------ counters

    @property
    def train_iter(self) -> int:
        return self.learner.train_iter

    def wall_s(self) -> float:
        return self._wall_offset + time.monotonic() - self.t_start

    def trainable(self) -> bool:
        return schedule.can_train(
            env_steps=self.counters.env_steps,
            num_transitions=self.buffer.num_transitions,
            train_start_after_envsteps=self.cfg.learn.train_start_after_envsteps,
            min_transitions=self.min_transitions,
        )

    # ------------------------------------------------------------------ data in

    def push_collect(self, result: CollectResult) -> int:
        """Push a collect result; returns the train budget (update_per_collect) it earns, possibly 0.

        The fraction of a step that ``learn.replay_ratio`` leaves over is carried to the next collect
        (``counters.replay_ratio_carry``, saved in checkpoints), so the long-run ratio is the configured one.
        """
        c = self.counters
        c.env_steps += result.envstep_delta
        c.collects += 1
        self.count_episodes(result.episode_returns, result.episode_lengths)
        self.buffer.push(list(result.segments))
        budget, c.replay_ratio_carry = schedule.update_per_collect(
            real_transitions=result.real_transitions,
            fixed=self.cfg.learn.update_per_collect,
            replay_ratio=self.cfg.learn.replay_ratio,
            carry=c.replay_ratio_carry,
        )
        return budget

    def count_episodes(self, returns, lengths) -> None:
        """Record finished training episodes (returns: [E] floats, lengths: [E] env steps)."""
        c = self.counters
        c.episodes += len(returns)
        c.recent_episodes = (c.recent_episodes + [[float(r), int(n)] for r, n in zip(returns, lengths)])[
            -EPISODE_WINDOW:
        ]

    def episode_metrics(self) -> dict:
        """collect/*: mean return and length of the last EPISODE_WINDOW training episodes (NaN before one
        ends), and the episodes finished so far."""
        recent = self.counters.recent_episodes
        return {
            "collect/episode_return_mean": float(np.mean([r for r, _ in recent])) if recent else float("nan"),
            "collect/episode_length_mean": float(np.mean([n for _, n in recent])) if recent else float("nan"),
            "collect/episodes": self.counters.episodes,
        }

    def reanalyze_plan(self, budget: int) -> schedule.ReanalyzePlan:
        return schedule.reanalyze_plan(
            buffer_reanalyze_freq=self.cfg.replay.buffer_reanalyze_freq, update_per_collect=budget
        )

    def buffer_reanalyze(self) -> int:
        """Re-search ``reanalyze_batch_size`` positions from the oldest partition with the target model."""
        rc = self.cfg.replay
        if self.buffer.num_transitions == 0:
            return 0
        seg_idx, pos = self.buffer.sample_oldest(rc.reanalyze_batch_size, rc.reanalyze_partition, self.rng)
        segs = [self.buffer.segment(int(g)) for g in seg_idx]
        steps = self.policy.context_steps  # past steps each root is built with (the policy's context)
        n = reanalyze_positions(
            segs,
            pos,
            span=1,
            reanalyze_fn=self.policy.reanalyze_fn(self.learner.target_model, self.rng),
            context_steps=steps,
            rows=self.buffer.step_rows(seg_idx) if steps > 0 else None,
        )
        self.buffer.mark_changed()  # statistics written into stored segments: a batch built ahead is stale
        self.counters.reanalyze_calls += 1
        return n

    # ------------------------------------------------------------------ learning

    def build_batch(
        self, rng: np.random.Generator | None = None, *, tick: bool = True
    ) -> tuple[SampledIndices, TrainBatch]:
        """Draw a prioritized sample and build its targets, the bootstrap values left to the learner's step;
        ``rng``: the driver RNG unless given (benchmarks draw with their own); ``tick``: the buffer's clock
        ticks for the draw (False: a draw made ahead, see :meth:`ReplayBuffer.sample`)."""
        lc, rng = self.cfg.learn, self.rng if rng is None else rng
        sample = self.buffer.sample(lc.batch_size, rng, tick=tick)
        batch = self.policy.make_batch(
            sample,
            target_model=self.learner.target_model,
            rng=rng,
            reanalyze_count=self.reanalyze_count,
            defer_bootstrap=True,  # the target network's forward is the learner's work (targets.Bootstrap)
        )
        return sample, batch

    @property
    def reanalyze_count(self) -> int:
        """Samples per batch whose policy targets are searched afresh (``replay.reanalyze_ratio``)."""
        return int(self.cfg.learn.batch_size * self.cfg.replay.reanalyze_ratio)

    def train_step(self, *, prefetch_next: bool = True) -> LearnOutput:
        """Sample, build targets (the bootstrap values left to the learner's step), one learner step, priority
        write-back. ``prefetch_next``: the caller's hint that another train step follows at once, so building
        its batch ahead is worth it (either way the results are the same: see the module docstring)."""
        taken = self._take_prefetched()
        sample, batch = taken if taken is not None else self.build_batch()

        building: list[Future] = []  # the next batch's build on the helper thread, while it runs

        def after_forward(priorities: np.ndarray) -> None:
            if self.cfg.replay.use_priority:
                if self.buffer.update_priorities(sample.flat_index, priorities, sample.make_time) == 0:
                    self.counters.stale_writebacks += 1
            if prefetch_next and self._may_prefetch():
                if self.cfg.learn.build_ahead_on_helper:
                    building.append(self.learner.bootstrap_helper.submit(self._prefetch))
                else:
                    self._prefetch()

        try:
            out = self.learner.train_step(batch, after_forward=after_forward)
        finally:
            futures.wait(building)  # it reads the buffer: done before anything can write to it again
        for build in building:
            build.result()  # its error, if any
        self.last_learn = out
        return out

    def _may_prefetch(self) -> bool:
        """Whether the next batch can be built now, the same as after this step: the learner overlaps its
        bootstrap forward, the target network stays through this step, building it writes nothing into the
        buffer (no in-batch reanalyze), and a next step is allowed."""
        learner = self.learner
        return (
            self.cfg.learn.prefetch_next_batch
            and learner.bootstrap_helper is not None
            and learner.target_stays()
            and self.reanalyze_count == 0
            and learner.train_iter + 1 < self.cfg.max_train_iter
        )

    def _prefetch(self) -> None:
        """Build the next batch with a copy of the driver RNG, without ticking the buffer's clock, and start
        its bootstrap forward on the helper (queued behind this build where the build runs there too). Reads
        the buffer and the driver RNG only, so it may run on the helper beside the step's backward."""
        rng = copy.deepcopy(self.rng)
        rng_before = self.rng.bit_generator.state
        sample, batch = self.build_batch(rng, tick=False)
        self._prefetched = Prefetched(
            sample=sample,
            batch=self.learner.start_bootstrap(batch),
            buffer_version=self.buffer.version,
            target_version=self.learner.target_version,
            rng_before=rng_before,
            rng_after=rng.bit_generator.state,
        )

    def _take_prefetched(self) -> tuple[SampledIndices, TrainBatch] | None:
        """The batch built ahead, if nothing it was built on changed since (then its RNG state and clock
        tick are taken); else None, and it is dropped."""
        p, self._prefetched = self._prefetched, None
        if p is None:
            return None
        if (
            p.buffer_version != self.buffer.version
            or p.target_version != self.learner.target_version
            or self.rng.bit_generator.state != p.rng_before
        ):
            self._discard(p)
            return None
        self.buffer.tick(p.sample.make_time)
        self.rng.bit_generator.state = p.rng_after
        self.prefetch_stats["used"] += 1
        return p.sample, p.batch

    def settle(self) -> None:
        """Wait for work started ahead on the learner's helper thread (a batch built ahead: its bootstrap
        forward), e.g. so a benchmark's timing includes it; the batch stays for the next step."""
        p = self._prefetched
        if p is not None and isinstance(p.batch.bootstrap, PendingBootstrap):
            p.batch.bootstrap.future.exception()  # waits; an error is raised where the batch is used

    def drop_prefetched(self) -> None:
        """Throw away a batch built ahead (the train budget ended: a policy hook or a push comes next)."""
        p, self._prefetched = self._prefetched, None
        if p is not None:
            self._discard(p)

    def _discard(self, p: Prefetched) -> None:
        if isinstance(p.batch.bootstrap, PendingBootstrap):
            p.batch.bootstrap.future.cancel()  # not started yet: skipped; running: it finishes, unread
        self.prefetch_stats["discarded"] += 1

    def close(self) -> None:
        """Stop the learner's helper thread, or end the learner workers."""
        self.drop_prefetched()
        self.learner.close()

    def budget_done(self) -> None:
        """One collect's train budget finished: count it and run the policy hook."""
        self.drop_prefetched()
        self.counters.train_epoch += 1
        self.learner.train_budget_done()

    # ------------------------------------------------------------------ evaluation and reports

    def should_eval(self, *, eval_at_start: bool = False) -> bool:
        return schedule.should_eval(
            train_iter=self.train_iter,
            last_eval_iter=self.counters.last_eval_iter,
            eval_freq=self.cfg.eval.eval_freq,
            eval_at_start=eval_at_start,
        )

    def base_metrics(self) -> dict:
        wall = self.wall_s()
        m = {
            "envstep": self.counters.env_steps,
            "train_iter": self.train_iter,
            "train_epoch": self.counters.train_epoch,
            "wall_s": wall,
            "envstep_per_s": self.counters.env_steps / max(wall, 1e-9),
            "train_iter_per_s": self.train_iter / max(wall, 1e-9),
            "buffer/transitions": self.buffer.num_transitions,
            "buffer/segments": self.buffer.num_segments,
            "buffer/bytes": self.buffer.nbytes,
            "buffer/stale_writebacks": self.counters.stale_writebacks,
            "buffer/reanalyze_calls": self.counters.reanalyze_calls,
            **self.episode_metrics(),
        }
        if self.last_learn is not None:
            m.update(self.last_learn.metrics)
        return m

    def progress(self, extra: dict | None = None) -> None:
        self.reporter.on_progress({**self.base_metrics(), **(extra or {})})

    def record_eval(
        self, result: EvalResult, weights: dict, *, train_iter_at_launch: int, extra: dict | None = None
    ) -> dict:
        """Report one evaluation of ``weights`` (the exact snapshot evaluated) with a checkpoint."""
        c = self.counters
        c.last_eval_iter = train_iter_at_launch
        c.eval_index += 1
        c.best_reward = max(c.best_reward, result.reward_mean)
        metrics = {
            **self.base_metrics(),
            "reward_mean": result.reward_mean,
            "reward_std": result.reward_std,
            "reward_best": c.best_reward,
            "eval_index": c.eval_index,
            "eval_episodes": len(result.episode_returns),
            "eval_duration_s": result.duration_s,
            "policy_version": result.policy_version,
            **(extra or {}),
        }
        evaluated = {
            "weights": weights,
            "version": result.policy_version,
            "weights_digest": result.weights_digest,  # of the weights the evaluator used ("": sync)
            "metrics": {k: v for k, v in metrics.items() if isinstance(v, (int, float, str))},
        }
        self.reporter.on_eval(metrics, evaluated, self.resume_state)
        on_videos = getattr(self.reporter, "on_videos", None)  # reporters that keep files have it
        if result.videos and on_videos is not None:
            on_videos(result.videos, metrics)
        return metrics

    def out_of_time(self) -> bool:
        return self.cfg.max_wall_s is not None and self.wall_s() >= self.cfg.max_wall_s

    def reached_stop_value(self, reward_mean: float) -> bool:
        return self.cfg.stop_value is not None and reward_mean >= self.cfg.stop_value

    # ------------------------------------------------------------------ resume

    def resume_state(self, *, include_buffer: bool | None = None) -> dict:
        """Everything to continue exactly; the replay buffer when ``tune.save_replay_buffer`` (or asked),
        and with it the collector's episodes in flight where the driver keeps its collector
        (:attr:`collector_state`): together they make a sync run's resume equal to a straight run."""
        if include_buffer is None:
            include_buffer = self.cfg.tune.save_replay_buffer
        self.counters.wall_s = self.wall_s()
        state = {
            "learner": self.learner.state_dict(),
            "counters": self.counters.as_dict(),
            "driver_rng": self.rng.bit_generator.state,
        }
        if include_buffer:
            state["buffer"] = self.buffer.state_dict()
            if self.collector_state is not None:
                state["collector"] = self.collector_state()
        return state

    def load_resume_state(self, state: dict) -> None:
        self.drop_prefetched()
        self.learner.load_state_dict(state["learner"])
        for k, v in state["counters"].items():
            setattr(self.counters, k, v)
        self.rng.bit_generator.state = state["driver_rng"]
        self._wall_offset = float(self.counters.wall_s)
        self.t_start = time.monotonic()
        if "buffer" in state:
            self.buffer.load_state_dict(to_numpy_tree(state["buffer"]))
        # Without the buffer, training waits for fresh data so the first updates do not overfit a handful
        # of transitions (the reward collapse after resume reported for the reference system).
        self.min_transitions = schedule.resume_min_transitions(
            batch_size=self.cfg.learn.batch_size,
            configured=self.cfg.learn.min_replay_transitions,
            resumed_without_buffer="buffer" not in state,
            warmup_transitions=self.cfg.learn.resume_warmup_transitions,
        )
