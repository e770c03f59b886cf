"""The segment collector: steps its environments with the policy's search and emits game segments.

It owns its environments and one :class:`SegmentBuilder` per environment; both live across ``collect()``
calls, so in-flight segments are never dropped and every segment is padded with its true continuation.

Each env's first episode is reset with the env's construction seed and later ones continue the env's RNG
stream (gymnasium's ``np_random``); the collector keeps, per env, how its current episode started (that
seed, or the ``np_random`` state just before the reset) and the actions taken since, so an env's state is
those two things. :meth:`SegmentCollector.state_dict` saves them with the builders' in-flight traces, the
acting state and the collector's RNG, and :meth:`SegmentCollector.load_state_dict` replays each in-flight
episode (gymnasium's contract: the same start and the same actions give the same trajectory) and checks
that the replay reached the saved observation and action mask, so a resumed sync run continues its
episodes exactly. An env with randomness of its own beside ``np_random`` (the ALE's emulator, for one)
fails that check or continues another future; the first starts a new episode, with a warning.

The weights used are fixed for a whole ``collect()`` call (the caller passes the model), and every result
carries the version of those weights. It never touches the replay buffer.

Actions are in the library's form (``spec.action_shape`` / ``spec.action_dtype``: int64 indices, or
float32 ``[D]`` in [-1, 1] that the env wrapper maps to the env's bounds); the policy's actions are checked
against that form every step, so a policy of the wrong kind fails at its first step with a clear message.
"""

from __future__ import annotations

import logging
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

log = logging.getLogger("muzero_tune")


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
        self.seed = int(seed)
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
        # how each env's current episode started (the reset's seed, -1: none; else the env's np_random state
        # before the reset) and the actions it has taken since, as the env received them
        self._episode_seeds = np.full(self.num_envs, -1, dtype=np.int64)
        self._episode_rngs: list[dict] = [{} for _ in range(self.num_envs)]
        self._episode_actions: list[list[int | np.ndarray]] = [[] for _ in range(self.num_envs)]
        for i in range(self.num_envs):
            self._reset_env(i)

    def _reset_env(self, i: int) -> None:
        env = self.envs[i]
        if self.builders[i].episode_index < 0:  # the first episode: the env's construction seed
            seed, rng = self.seed + i, {}
        else:  # later ones go on with the env's RNG stream: its state now is where this episode starts
            seed, rng = -1, env.np_random.bit_generator.state
        frame, info = env.reset(seed=None if seed < 0 else seed)
        self._episode_seeds[i], self._episode_rngs[i] = seed, rng
        self._episode_actions[i] = []
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
                self._episode_actions[i].append(a)
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

    def state_dict(self) -> dict:
        """Everything a resumed collector needs to go on as this one would (numpy arrays and builtins, no
        env objects): the RNG, how each env's episode started and its actions so far, its builder's trace,
        its action mask, return and length so far, and the policy's acting state."""
        return {
            "num_envs": self.num_envs,
            "rng": self.rng.bit_generator.state,
            "total_envsteps": self.total_envsteps,
            "masks": self._masks.copy(),
            "returns": self._returns.copy(),
            "lengths": self._lengths.copy(),
            "episode_seeds": self._episode_seeds.copy(),
            "episode_rngs": list(self._episode_rngs),
            "episode_actions": [self._actions_array(a) for a in self._episode_actions],
            "builders": [b.state_dict() for b in self.builders],
            "act_state": self.policy.save_act_state(self._act_state),
        }

    def _actions_array(self, actions: list) -> np.ndarray:
        """One env's episode actions as ``[T, *action_shape]`` of the action dtype."""
        dtype = np.dtype(self.spec.action_dtype)
        return np.asarray(actions, dtype=dtype).reshape(len(actions), *self.spec.action_shape)

    def load_state_dict(self, state: dict, *, device: torch.device | str = "cpu") -> int:
        """Continue from :meth:`state_dict` (on a collector that has not collected yet): each env's episode in
        flight is replayed from how it started with its actions so far, and must end at the saved observation
        and action mask. An env whose replay does not (randomness outside its seed and ``np_random``) starts a
        new episode instead, and a saved state of another number of envs is not used at all; either drops
        those in-flight transitions, with a warning. ``device``: where the acting state's tensors go (the
        acting model's). Returns the number of envs continued exactly."""
        if int(state["num_envs"]) != self.num_envs:
            log.warning(
                "the checkpoint's collector had %d envs, this one has %d: its in-flight episodes are not "
                "continued (new episodes start)", int(state["num_envs"]), self.num_envs,
            )  # fmt: skip
            return 0
        self.rng.bit_generator.state = state["rng"]
        self.total_envsteps = int(state["total_envsteps"])
        self._act_state = self.policy.load_act_state(state["act_state"], self.num_envs, device=device)
        continued = 0
        for i in range(self.num_envs):
            self.builders[i].load_state_dict(state["builders"][i])
            self._masks[i] = np.asarray(state["masks"][i])
            self._returns[i] = float(state["returns"][i])
            self._lengths[i] = int(state["lengths"][i])
            start = (int(state["episode_seeds"][i]), state["episode_rngs"][i])
            problem = self._replay_episode(i, start, np.asarray(state["episode_actions"][i]))
            if problem is None:
                continued += 1
                continue
            log.warning("collector env %d: its in-flight episode is not continued (%s); it starts a new one",
                        i, problem)  # fmt: skip
            self.builders[i].drop_in_flight()
            self._reset_env(i)
        return continued

    def _replay_episode(self, i: int, start: tuple[int, dict], actions: np.ndarray) -> str | None:
        """Restart env ``i``'s episode as it started (``start``: its reset seed, or -1 and the env's
        ``np_random`` state before the reset) and step it with ``actions`` [T, *action_shape]; None when it
        ends at the builder's current observation and the saved action mask, else what differs."""
        env = self.envs[i]
        seed, rng = start
        if seed < 0:
            generator = env.np_random
            if generator.bit_generator.state["bit_generator"] != rng["bit_generator"]:
                generator = env.np_random = np.random.Generator(getattr(np.random, rng["bit_generator"])())
            generator.bit_generator.state = rng
        frame, info = env.reset(seed=None if seed < 0 else seed)
        self._episode_seeds[i], self._episode_rngs[i] = seed, rng
        self._episode_actions[i] = []
        for t, action in enumerate(actions):
            a = self.spec.env_action(action)
            frame, _, terminated, truncated, info = env.step(a)
            self._episode_actions[i].append(a)
            if terminated or truncated:  # a saved episode is in flight: it never ended
                return f"the replay ended its episode after {t + 1} of {len(actions)} steps"
        if not np.array_equal(np.asarray(frame), self.builders[i].current_frames()[-1]):
            return f"the replay of its {len(actions)} actions reached another observation"
        if not np.array_equal(action_mask_from_info(info, self.spec.num_actions), self._masks[i]):
            return f"the replay of its {len(actions)} actions has another action mask"
        return None

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
