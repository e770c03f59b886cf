"""The evaluator: greedy search (no root noise, argmax visits) on its own environments.

Episode j of every evaluation is reset with seed ``seed + j``, so evaluating the same weights twice gives
the same episodes: an evaluated snapshot's reward can be reproduced from its checkpoint. The evaluator
never touches the replay buffer or the learner. Actions are checked against the env's form
(``spec.check_actions``) like the collector's.

With ``video=True`` its first env renders ``rgb_array`` frames and records the episodes an evaluation asks
for (:class:`~muzero_tune.envs.video.EpisodeRecorder`); the videos come back in ``EvalResult.videos``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch

from muzero_tune.config import ExperimentConfig
from muzero_tune.envs import action_mask_from_info, stack_frames
from muzero_tune.envs.spec import EnvSpec
from muzero_tune.pipeline.collector import env_factory
from muzero_tune.pipeline.messages import EvalResult
from muzero_tune.policies.base import Policy


class Evaluator:
    """Runs ``n_episodes`` greedy episodes over ``num_envs`` environments stepped together."""

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
        video: bool = False,
    ):
        self.cfg = cfg
        self.policy = policy
        self.spec = spec
        self.seed = seed
        self.actor_id = actor_id
        self.num_envs = min(num_envs or cfg.env.evaluator_env_num, cfg.eval.n_episodes)
        make = make or env_factory(cfg, evaluation=True)
        self.recorder = None
        if video:
            from muzero_tune.envs.video import EpisodeRecorder

            self.recorder = EpisodeRecorder(env_factory(cfg, evaluation=True, render_mode="rgb_array")(seed))
        self.envs = [self.recorder or make(seed)] + [make(seed + i) for i in range(1, self.num_envs)]

    def evaluate(
        self,
        model: torch.nn.Module,
        *,
        n_episodes: int | None = None,
        policy_version: int = -1,
        video_name: str | None = None,
        video_episodes: int = 1,
    ) -> EvalResult:
        """``n_episodes`` greedy episodes (default ``eval.n_episodes``); with ``video_name`` (and an evaluator
        built with ``video=True``) the first env's first ``video_episodes`` episodes are recorded, as
        ``<video_name>_<k>_ep<id>.mp4``."""
        t0 = time.perf_counter()
        if video_name is not None:
            if self.recorder is None:
                raise ValueError("this evaluator records no videos: build it with video=True")
            self.recorder.start(video_name, max_episodes=video_episodes)
        n_episodes = n_episodes or self.cfg.eval.n_episodes
        rng = np.random.default_rng([self.seed, 104729])  # only used for ties when not deterministic
        frames: list[list[np.ndarray] | None] = [None] * self.num_envs
        masks = np.ones((self.num_envs, self.spec.num_actions), dtype=bool)
        returns = np.zeros(self.num_envs)
        lengths = np.zeros(self.num_envs, dtype=np.int64)
        started = 0
        finished: list[tuple[float, int]] = []
        envsteps = 0
        fs = self.spec.frame_stack

        act_state = self.policy.initial_act_state(self.num_envs)

        def start(i: int) -> None:
            nonlocal started
            frame, info = self.envs[i].reset(seed=self.seed + started)
            started += 1
            frames[i] = [np.asarray(frame)] * fs
            nonlocal act_state
            act_state = self.policy.reset_act_state(act_state, i)
            masks[i] = action_mask_from_info(info, self.spec.num_actions)
            returns[i], lengths[i] = 0.0, 0

        for i in range(min(self.num_envs, n_episodes)):
            start(i)
        while len(finished) < n_episodes:
            live = [i for i in range(self.num_envs) if frames[i] is not None]
            obs = stack_frames(
                np.stack([np.stack(frames[i][-fs:]) for i in live]), frame_ndim=self.spec.frame_ndim
            )
            act = self.policy.act(model, obs, masks[live], explore=False, temperature=0.0, rng=rng,
                                  state=act_state, env_index=np.asarray(live))
            act_state = act.state
            actions = self.spec.check_actions(act.actions, len(live))  # [B] int64 or [B, D] float32
            for j, i in enumerate(live):
                env_action = self.spec.env_action(actions[j])
                frame, reward, terminated, truncated, info = self.envs[i].step(env_action)
                envsteps += 1
                returns[i] += float(reward)
                lengths[i] += 1
                frames[i] = frames[i][-(fs - 1) :] + [np.asarray(frame)] if fs > 1 else [np.asarray(frame)]
                masks[i] = action_mask_from_info(info, self.spec.num_actions)
                if terminated or truncated:
                    finished.append((float(returns[i]), int(lengths[i])))
                    if started < n_episodes:
                        start(i)
                    else:
                        frames[i] = None
        rets = np.array([r for r, _ in finished])
        return EvalResult(
            reward_mean=float(rets.mean()),
            reward_std=float(rets.std()),
            episode_returns=tuple(float(r) for r in rets),
            episode_lengths=tuple(n for _, n in finished),
            envsteps=envsteps,
            duration_s=time.perf_counter() - t0,
            policy_version=policy_version,
            actor_id=self.actor_id,
            videos=self.recorder.take() if video_name is not None else (),
        )

    def close(self) -> None:
        for env in self.envs:
            env.close()
