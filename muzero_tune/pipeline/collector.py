"""The segment collector: steps its environments with the policy's search and emits game segments.

It owns its environments and one :class:`SegmentBuilder` per environment; both live across ``collect()``
calls, so in-flight segments are never dropped and every segment is padded with its true continuation.
The weights used are fixed for a whole ``collect()`` call (the caller passes the model), and every result
carries the version of those weights. It never touches the replay buffer.

Actions are in the library's form (``spec.action_shape`` / ``spec.action_dtype``: int64 indices, or
float32 ``[D]`` in [-1, 1] that the env wrapper maps to the env's bounds); the policy's actions are checked
against that form every step, so a policy of the wrong kind fails at its first step with a clear message.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch

from muzero_tune.config import ExperimentConfig
from muzero_tune.envs import action_mask_from_info, make_env, stack_frames
from muzero_tune.envs.spec import EnvSpec
from muzero_tune.pipeline.messages import CollectResult
from muzero_tune.policies.base import Policy
from muzero_tune.replay.segment import GameSegment, SegmentBuilder


def env_factory(
    cfg: ExperimentConfig, *, evaluation: bool = False, render_mode: str | None = None
) -> Callable[[int], gym.Env]:
    """``seed -> env`` for this config's environment (``render_mode``: gymnasium's, for videos)."""
    ec = cfg.env

    def make(seed: int) -> gym.Env:
        return make_env(
            ec.env_id,
            seed=seed,
            frame_size_px=ec.frame_size_px,
            grayscale=ec.grayscale,
            sticky_action_prob=ec.sticky_action_prob,
            noop_max=ec.noop_max,
            clip_rewards=ec.clip_rewards and not evaluation,
            episodic_life=ec.episodic_life and not evaluation,
            max_episode_steps=(cfg.eval.max_episode_steps or ec.max_episode_steps)
            if evaluation
            else ec.max_episode_steps,
            kwargs=ec.kwargs,
            wrappers=ec.wrappers,
            render_mode=render_mode,
            multi_discrete_actions=ec.multi_discrete_actions,
        )

    return make


def visit_temperature(cfg: ExperimentConfig, train_iter: int) -> float:
    """Visit-count temperature for collection at ``train_iter``."""
    cc = cfg.collect
    if not cc.temperature_decay:
        return cc.temperature
    frac = train_iter / cc.temperature_decay_train_iter
    return 1.0 if frac < 0.5 else 0.5 if frac < 0.75 else 0.25


class SegmentCollector:
    """Collects game segments from ``num_envs`` environments stepped together (one batched search)."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        policy: Policy,
        spec: EnvSpec,
        *,
        seed: int,
        num_envs: int | None = None,
        make: Callable[[int], gym.Env] | None = None,
        actor_id: int = 0,
    ):
        self.cfg = cfg
        self.policy = policy
        self.spec = spec
        self.actor_id = actor_id
        self.num_envs = num_envs or cfg.env.collector_env_num
        make = make or env_factory(cfg)
        self.envs = [make(seed + i) for i in range(self.num_envs)]
        rc = cfg.replay
        stream = uuid.uuid4().hex[:12]  # this collector instance: a restarted actor starts new streams
        self.builders = [
            SegmentBuilder(
                segment_length=rc.game_segment_length,
                pad_length=rc.num_unroll_steps + rc.td_steps,
                frame_stack=spec.frame_stack,
                env_id=i,
                stream_id=f"{stream}:{i}",
                action_shape=spec.action_shape,
                action_dtype=spec.action_dtype,
            )
            for i in range(self.num_envs)
        ]
        self.rng = np.random.default_rng([seed, 7919])
        self._masks = np.ones((self.num_envs, spec.num_actions), dtype=bool)
        self._returns = np.zeros(self.num_envs)
        self._lengths = np.zeros(self.num_envs, dtype=np.int64)
        self.total_envsteps = 0
        self._act_state = policy.initial_act_state(self.num_envs)
        self._env_index = np.arange(self.num_envs)
        for i in range(self.num_envs):
            self._reset_env(i)

    def _reset_env(self, i: int) -> None:
        frame, info = self.envs[i].reset()
        self.builders[i].reset(np.asarray(frame))
        self._masks[i] = action_mask_from_info(info, self.spec.num_actions)
        self._returns[i] = 0.0
        self._lengths[i] = 0
        self._act_state = self.policy.reset_act_state(self._act_state, i)

    def collect(
        self,
        model: torch.nn.Module,
        *,
        num_segments: int | None = None,
        temperature: float,
        policy_version: int = -1,
    ) -> CollectResult:
        """Step all envs until at least ``num_segments`` (default: num_envs) segments are complete."""
        t0 = time.perf_counter()
        want = num_segments or self.num_envs
        use_step_priority = self.cfg.replay.use_priority and not self.cfg.replay.use_max_priority_for_new_data
        out: list[GameSegment] = []
        returns: list[float] = []
        lengths: list[int] = []
        steps = 0
        search_s = 0.0
        while len(out) < want:
            obs = stack_frames(
                np.stack([b.current_frames() for b in self.builders]), frame_ndim=self.spec.frame_ndim
            )
            ts = time.perf_counter()
            act = self.policy.act(
                model, obs, self._masks, explore=True, temperature=temperature, rng=self.rng,
                state=self._act_state, env_index=self._env_index,
            )
            self._act_state = act.state
            search_s += time.perf_counter() - ts
            actions = self.spec.check_actions(act.actions, self.num_envs)  # [B] int64 or [B, D] float32
            for i, env in enumerate(self.envs):
                a = self.spec.env_action(actions[i])
                frame, reward, terminated, truncated, info = env.step(a)
                stats = {k: v[i] for k, v in act.step_stats.items()}
                pri = abs(float(act.root_value[i]) - float(act.predicted_value[i])) + 1e-6
                out.extend(
                    self.builders[i].step(
                        action=a,
                        reward=float(reward),
                        next_frame=np.asarray(frame),
                        stats=stats,
                        terminated=bool(terminated),
                        truncated=bool(truncated),
                        policy_version=policy_version,
                        priority=pri if use_step_priority else None,
                    )
                )
                self._returns[i] += float(reward)
                self._lengths[i] += 1
                self._masks[i] = action_mask_from_info(info, self.spec.num_actions)
                if terminated or truncated:
                    returns.append(float(self._returns[i]))
                    lengths.append(int(self._lengths[i]))
                    self._reset_env(i)
            steps += self.num_envs
        self.total_envsteps += steps
        return CollectResult(
            segments=tuple(out),
            envstep_delta=steps,
            real_transitions=sum(s.num_real for s in out),
            policy_version=policy_version,
            episode_returns=tuple(returns),
            episode_lengths=tuple(lengths),
            duration_s=time.perf_counter() - t0,
            search_s=search_s,
            actor_id=self.actor_id,
        )

    def close(self) -> None:
        for env in self.envs:
            env.close()


def fill_replay(core, min_transitions: int, *, seed: int = 0) -> None:
    """Collect with ``core``'s learner model (a :class:`~muzero_tune.pipeline.core.DriverCore`, exploring at
    temperature 1) until its replay buffer holds at least ``min_transitions`` transitions, then close the
    collector: the filled buffer that benchmarks, checks and tests of the learner start from."""
    collector = SegmentCollector(core.cfg, core.policy, core.spec, seed=seed)
    try:
        while core.buffer.num_transitions < min_transitions:
            core.push_collect(collector.collect(core.learner.model, temperature=1.0))
    finally:
        collector.close()
