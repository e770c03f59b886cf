"""Segment continuity: the segments a collector (or a bare SegmentBuilder) emits, concatenated per
environment, are exactly that environment's trajectory -- nothing lost or duplicated across ``collect()``
calls, padding is the true continuation, ``done`` / ``terminal_at_end`` / frame-stack windows are right.

A scripted deterministic env makes every transition identifiable: its observation is
``[env_tag, episode_index, step_index]`` and its reward is the step index. Its continuous twin (actions
float32 ``[D]``) runs the same checks through the collector and the evaluator with a test-only policy that
acts uniformly at random in [-1, 1] (no continuous policy type exists yet).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from muzero_tune.config import ConfigError, make_config
from muzero_tune.envs.spec import EnvSpec
from muzero_tune.pipeline.collector import SegmentCollector
from muzero_tune.pipeline.evaluator import Evaluator
from muzero_tune.policies.base import ActOutput, Policy
from muzero_tune.policies.muzero import MuZeroPolicy
from muzero_tune.replay.segment import GameSegment, SegmentBuilder

SEG_LEN = 10
NUM_UNROLL = 3
TD_STEPS = 4
PAD = NUM_UNROLL + TD_STEPS  # 7: a segment is complete once 17 transitions from its start exist

# 37 = 2 * SEG_LEN + SEG_LEN + PAD: the episode ends exactly when a full segment (10 real + 7 padding)
# becomes available, so the regular emission and the episode end coincide.
EPISODE_LENGTHS = (37, 5, 120, 1, 17)


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    # The tiny model's search is dominated by thread overhead; one thread keeps the module fast.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class ScriptedEnv(gym.Env):
    """Deterministic episodes of scripted lengths; each ends by termination or truncation per ``ends``.

    Observation ``[tag, episode, step]`` (float32), reward = step index of the action. Every transition is
    logged in ``log`` as (obs, action, reward, next_obs, terminated, truncated). ``action_dim`` > 0 makes
    the actions continuous: ``Box(-1, 1, (action_dim,))``, logged as float32 arrays.
    """

    metadata: dict = {}

    def __init__(self, tag: int, lengths=EPISODE_LENGTHS, ends=("terminated",), offset: int = 0,
                 action_dim: int = 0):
        self.tag = tag
        self.lengths = lengths
        self.ends = ends
        self.offset = offset
        self.action_dim = action_dim
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(3,), dtype=np.float32)
        self.action_space = (
            gym.spaces.Box(-1.0, 1.0, shape=(action_dim,), dtype=np.float32)
            if action_dim
            else gym.spaces.Discrete(2)
        )
        self.episode = -1
        self.step_idx = 0
        self.log: list[tuple] = []
        self.reset_obs: dict[int, np.ndarray] = {}

    def _obs(self) -> np.ndarray:
        return np.array([self.tag, self.episode, self.step_idx], dtype=np.float32)

    def episode_length(self, episode: int) -> int:
        return self.lengths[(episode + self.offset) % len(self.lengths)]

    def episode_end(self, episode: int) -> str:
        return self.ends[(episode + self.offset) % len(self.ends)]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.step_idx = 0
        obs = self._obs()
        self.reset_obs[self.episode] = obs
        return obs, {}

    def step(self, action):
        obs = self._obs()
        reward = float(self.step_idx)
        self.step_idx += 1
        nxt = self._obs()
        ended = self.step_idx >= self.episode_length(self.episode)
        terminated = ended and self.episode_end(self.episode) == "terminated"
        truncated = ended and not terminated
        logged = np.array(action, dtype=np.float32) if self.action_dim else int(action)
        self.log.append((obs, logged, reward, nxt, terminated, truncated))
        return nxt, reward, terminated, truncated, {}


def check_stream(env: ScriptedEnv, segments: list[GameSegment], in_flight: int, frame_stack: int) -> None:
    """All continuity properties of one env's emitted segments (in emission order) against its log."""
    log = env.log
    obs = np.stack([e[0] for e in log])
    actions = np.array([e[1] for e in log])
    rewards = np.array([e[2] for e in log], dtype=np.float32)
    next_obs = np.stack([e[3] for e in log])
    terminated = np.array([e[4] for e in log])
    truncated = np.array([e[5] for e in log])
    fs = frame_stack

    # 1. real transitions, concatenated in emission order, are the trajectory (no loss, no duplicate)
    real_obs = [s.frames[fs - 1 : fs - 1 + s.num_real] for s in segments]
    real_act = [s.actions[: s.num_real] for s in segments]
    real_rew = [s.rewards[: s.num_real] for s in segments]
    n_real = sum(s.num_real for s in segments)
    assert n_real + in_flight == len(log), "emitted real + in-flight transitions != env steps"
    if segments:
        np.testing.assert_array_equal(np.concatenate(real_obs), obs[:n_real])
        np.testing.assert_array_equal(np.concatenate(real_act), actions[:n_real])
        np.testing.assert_array_equal(np.concatenate(real_rew), rewards[:n_real])
    else:
        assert n_real == 0

    g = 0  # global index (into the log) of the segment's position 0
    for s in segments:
        m, r = s.num_stored, s.num_real
        assert 1 <= r <= m
        assert s.frames.shape[0] == fs - 1 + m + 1
        # 2. stored data (real + padding) is the true continuation, inside one episode
        np.testing.assert_array_equal(s.frames[fs - 1 : fs - 1 + m], obs[g : g + m])
        np.testing.assert_array_equal(s.frames[fs - 1 + m], next_obs[g + m - 1])
        np.testing.assert_array_equal(s.actions, actions[g : g + m])
        np.testing.assert_array_equal(s.rewards, rewards[g : g + m])
        episode = obs[g, 1]
        assert np.all(obs[g : g + m, 1] == episode), "a segment crosses an episode boundary"
        # no episode end strictly inside the stored data; padding stops only at an episode end
        ends = terminated[g : g + m] | truncated[g : g + m]
        assert not ends[:-1].any()
        if m < r + PAD:
            assert ends[-1], "a segment was emitted short of its padding without an episode end"
        else:
            assert m == r + PAD
        # 3. done only when the *real* transitions end the episode
        assert s.done == bool(terminated[g + r - 1] or truncated[g + r - 1])
        if s.done:
            assert m == r, "a done segment cannot have padding (there is no continuation)"
        # 4. terminal_at_end only when the stored data reaches a terminated (not truncated) end
        assert s.terminal_at_end == bool(terminated[g + m - 1])
        # 5. frame-stack window before position 0: previous frames, or copies of the reset frame
        step0 = int(obs[g, 2])
        assert s.episode_step0 == step0
        assert s.env_id == int(obs[g, 0])
        for j in range(1, fs):
            expect = obs[g - j] if step0 - j >= 0 else env.reset_obs[int(episode)]
            np.testing.assert_array_equal(s.frames[fs - 1 - j], expect)
        # stacked obs at position i ends with the observation at i
        st = s.stacked_obs(np.arange(m + 1))
        np.testing.assert_array_equal(st[:-1, -1], obs[g : g + m])
        for name, arr in s.stats.items():
            assert arr.shape[0] == m, name
        g += r


# ---------------------------------------------------------------------------------------------- builder


def drive_builder(env: ScriptedEnv, builder: SegmentBuilder, steps: int, rng: np.random.Generator,
                  with_priority: bool = False) -> list[GameSegment]:
    out: list[GameSegment] = []
    if env.episode < 0:
        frame, _ = env.reset()
        assert builder.reset(frame) == []
    for _ in range(steps):
        a = int(rng.integers(2))
        frame, reward, term, trunc, _ = env.step(a)
        k = len(env.log) - 1
        stats = {"child_visits": np.array([k, -k], dtype=np.float32), "legal_mask": np.ones(2, dtype=bool)}
        out.extend(builder.step(action=a, reward=reward, next_frame=frame, stats=stats, terminated=term,
                                truncated=trunc, priority=float(k) + 0.5 if with_priority else None))
        if term or trunc:
            assert builder.in_flight_transitions == 0
            frame, _ = env.reset()
            builder.reset(frame)
    return out


@pytest.mark.parametrize("frame_stack", [1, 3])
@pytest.mark.parametrize(
    "ends", [("terminated",), ("truncated",), ("terminated", "truncated")], ids=["term", "trunc", "mixed"]
)
@pytest.mark.parametrize("offset", [0, 2])
def test_builder_stream_is_the_trajectory(frame_stack, ends, offset):
    env = ScriptedEnv(tag=4, ends=ends, offset=offset)
    builder = SegmentBuilder(segment_length=SEG_LEN, pad_length=PAD, frame_stack=frame_stack, env_id=4)
    rng = np.random.default_rng(0)
    segs: list[GameSegment] = []
    total = 0
    # uneven chunks: segment completion must not depend on how the caller slices its steps
    for chunk in (3, 50, 1, 77, 200, 13):
        segs += drive_builder(env, builder, chunk, rng)
        total += chunk
        check_stream(env, segs, builder.in_flight_transitions, frame_stack)
    assert total == len(env.log)
    assert sum(s.done for s in segs) == sum(e[4] or e[5] for e in env.log)
    # every complete episode length appears (at least the scripted ones that finished)
    assert any(s.done and s.num_real == 1 and s.episode_step0 == 0 for s in segs)  # the 1-step episode


def test_builder_terminal_exactly_at_full_segment():
    """Episode of 17 = SEG_LEN + PAD steps: the segment emitted at that step reaches the terminal state."""
    env = ScriptedEnv(tag=0, lengths=(SEG_LEN + PAD,), ends=("terminated",))
    builder = SegmentBuilder(segment_length=SEG_LEN, pad_length=PAD, frame_stack=1)
    segs = drive_builder(env, builder, SEG_LEN + PAD, np.random.default_rng(1))
    assert [(s.num_real, s.num_stored, s.done, s.terminal_at_end) for s in segs] == [
        (SEG_LEN, SEG_LEN + PAD, False, True),  # padded predecessor: not done, but its data ends terminal
        (PAD, PAD, True, True),
    ]
    # same length, truncated: no terminal anywhere
    env = ScriptedEnv(tag=0, lengths=(SEG_LEN + PAD,), ends=("truncated",))
    builder = SegmentBuilder(segment_length=SEG_LEN, pad_length=PAD, frame_stack=1)
    segs = drive_builder(env, builder, SEG_LEN + PAD, np.random.default_rng(1))
    assert [(s.num_real, s.num_stored, s.done, s.terminal_at_end) for s in segs] == [
        (SEG_LEN, SEG_LEN + PAD, False, False),
        (PAD, PAD, True, False),
    ]


def test_builder_flush_short_episode_segments():
    """A 5-step terminated episode (shorter than one segment) is one done segment; a 25-step one is a full
    segment emitted at step 17, then at the end a predecessor padded up to the terminal state (not done)
    and the done remainder."""
    env = ScriptedEnv(tag=0, lengths=(5, 25), ends=("terminated",))
    builder = SegmentBuilder(segment_length=SEG_LEN, pad_length=PAD, frame_stack=2)
    segs = drive_builder(env, builder, 30, np.random.default_rng(2))
    assert [(s.num_real, s.num_stored, s.done, s.terminal_at_end, s.episode_step0) for s in segs] == [
        (5, 5, True, True, 0),
        (10, 17, False, False, 0),  # complete at episode step 17: the terminal is not in its data
        (10, 15, False, True, 10),  # flushed at the end: padded with the 5 remaining real transitions
        (5, 5, True, True, 20),
    ]
    check_stream(env, segs, builder.in_flight_transitions, 2)


def test_builder_in_flight_and_priorities():
    env = ScriptedEnv(tag=0, lengths=(1000,))
    builder = SegmentBuilder(segment_length=SEG_LEN, pad_length=PAD, frame_stack=1)
    rng = np.random.default_rng(3)
    segs = drive_builder(env, builder, SEG_LEN + PAD - 1, rng, with_priority=True)
    assert segs == [] and builder.in_flight_transitions == SEG_LEN + PAD - 1
    segs = drive_builder(env, builder, 1, rng, with_priority=True)
    assert len(segs) == 1 and builder.in_flight_transitions == PAD
    np.testing.assert_array_equal(segs[0].priorities, np.arange(SEG_LEN) + 0.5)
    # stats of padding transitions are the continuation's stats too
    np.testing.assert_array_equal(segs[0].stats["child_visits"][:, 0], np.arange(SEG_LEN + PAD))
    segs = drive_builder(env, builder, SEG_LEN, rng, with_priority=True)
    assert len(segs) == 1
    np.testing.assert_array_equal(segs[0].priorities, np.arange(SEG_LEN, 2 * SEG_LEN) + 0.5)
    assert builder.in_flight_transitions == PAD
    # without priorities the segment carries None (the buffer assigns its max)
    env2 = ScriptedEnv(tag=1, lengths=(1000,))
    b2 = SegmentBuilder(segment_length=SEG_LEN, pad_length=PAD, frame_stack=1)
    segs = drive_builder(env2, b2, SEG_LEN + PAD, rng, with_priority=False)
    assert len(segs) == 1 and segs[0].priorities is None
    assert b2.drop_in_flight() == PAD and b2.in_flight_transitions == 0


# ---------------------------------------------------------------------------------------------- collector


def _collector(frame_stack: int, ends, num_envs: int = 2):
    cfg = make_config(
        "cartpole_muzero",
        overrides={
            "model.hidden_dim": 16,
            "model.latent_dim": 8,
            "model.projection_dim": 8,
            "model.value_support_size": 5,
            "model.reward_support_size": 5,
            "mcts.num_simulations": 2,
            "env.frame_stack": frame_stack,
            "replay.game_segment_length": SEG_LEN,
            "replay.num_unroll_steps": NUM_UNROLL,
            "replay.td_steps": TD_STEPS,
            "learn.batch_size": 16,
        },
    )
    spec = EnvSpec(env_id="Scripted-v0", frame_shape=(3,), frame_dtype="float32", frame_stack=frame_stack,
                   num_actions=2, action_kind="discrete")
    policy = MuZeroPolicy(cfg, spec)
    torch.manual_seed(0)
    model = policy.build_model()
    envs: list[ScriptedEnv] = []

    def make(seed: int) -> ScriptedEnv:
        env = ScriptedEnv(tag=len(envs), ends=ends, offset=seed % len(EPISODE_LENGTHS))
        envs.append(env)
        return env

    col = SegmentCollector(cfg, policy, spec, seed=1, num_envs=num_envs, make=make)
    return col, model, envs


@pytest.mark.parametrize(
    "frame_stack, ends", [(1, ("terminated", "truncated")), (3, ("truncated", "terminated", "terminated"))]
)
def test_collector_segments_are_the_trajectory(frame_stack, ends):
    col, model, envs = _collector(frame_stack, ends)
    per_env: dict[int, list[GameSegment]] = {i: [] for i in range(len(envs))}
    envsteps = 0
    versions = []
    finished: list[int] = []
    for call in range(30):
        res = col.collect(model, num_segments=3, temperature=1.0, policy_version=call)
        assert len(res.segments) >= 3
        assert res.real_transitions == sum(s.num_real for s in res.segments)
        assert all(s.policy_version == call for s in res.segments)
        versions.append(res.policy_version)
        envsteps += res.envstep_delta
        for s in res.segments:
            per_env[s.env_id].append(s)
        # after every call: per env, emitted + in-flight == steps taken, and the stream matches the log
        assert envsteps == sum(len(e.log) for e in envs) == col.total_envsteps
        for i, env in enumerate(envs):
            assert col.builders[i].in_flight_transitions == len(env.log) - sum(s.num_real for s in per_env[i])
            check_stream(env, per_env[i], col.builders[i].in_flight_transitions, frame_stack)
        # the episodes finished in this call are reported with their true lengths
        finished += res.episode_lengths
    assert versions == list(range(30))
    # the run was long enough to cross collect() boundaries mid-segment and finish several episodes
    assert all(e.episode >= 4 for e in envs), [e.episode for e in envs]
    # every scripted episode length finished (37 ends exactly where a full segment completes)
    assert sorted(set(finished)) == sorted(EPISODE_LENGTHS)
    ends_log = [[n for n, e in enumerate(env.log) if e[4] or e[5]] for env in envs]
    assert len(finished) == sum(len(x) for x in ends_log)
    assert any(col.builders[i].in_flight_transitions > 0 for i in range(len(envs)))
    # stored search statistics are well formed
    for segs in per_env.values():
        for s in segs:
            np.testing.assert_allclose(s.stats["child_visits"].sum(-1), 1.0, rtol=1e-5)


# ---------------------------------------------------------------------------------- continuous actions

ACTION_DIM = 2


class RandomUnitPolicy(Policy):
    """Test-only continuous policy: uniform random actions [B, D] in [-1, 1]; stores, as a sampled policy
    would, its one "sampled" action ``sampled_actions`` [1, D] with all the visits ``child_visits`` [1]."""

    name = "random_unit"
    action_kinds = ("continuous",)

    def build_model(self) -> torch.nn.Module:
        return torch.nn.Linear(1, 1)

    def act(self, model, obs, legal_mask, *, explore, temperature, rng, state=None, env_index=None):
        b = obs.shape[0]
        assert legal_mask.shape == (b, 0)  # nothing to mask for continuous actions
        actions = self.spec.random_actions(rng, (b,))  # [B, D] float32
        return ActOutput(
            actions=actions,
            step_stats={
                "child_visits": np.ones((b, 1), np.float32),
                "sampled_actions": actions[:, None, :].copy(),
                "root_value": np.zeros(b, np.float32),
            },
            root_value=np.zeros(b, np.float32),
            predicted_value=np.zeros(b, np.float32),
        )

    def make_batch(self, sample, *, target_model, rng, reanalyze_count=0, defer_bootstrap=False):
        raise NotImplementedError

    def reanalyze(self, target_model, obs, legal_mask, rng):
        raise NotImplementedError

    def compute_loss(self, model, batch, *, train_iter):
        raise NotImplementedError


def _continuous_spec(frame_stack: int = 1) -> EnvSpec:
    return EnvSpec(env_id="ScriptedContinuous-v0", frame_shape=(3,), frame_dtype="float32",
                   frame_stack=frame_stack, num_actions=0, action_kind="continuous", action_dim=ACTION_DIM)


def _small_cfg(frame_stack: int):
    return make_config("cartpole_muzero", overrides={
        "env.frame_stack": frame_stack,
        "replay.game_segment_length": SEG_LEN,
        "replay.num_unroll_steps": NUM_UNROLL,
        "replay.td_steps": TD_STEPS,
        "eval.n_episodes": 5,
    })


@pytest.mark.parametrize(
    "frame_stack, ends", [(1, ("terminated", "truncated")), (3, ("truncated", "terminated", "terminated"))]
)
def test_continuous_collector_segments_are_the_trajectory(frame_stack, ends):
    """The continuity test above, with float32 [D] actions: lossless across collect() calls, padding the
    true continuation, and the stored actions exactly what each env received."""
    spec = _continuous_spec(frame_stack)
    policy = RandomUnitPolicy(_small_cfg(frame_stack), spec)
    envs: list[ScriptedEnv] = []

    def make(seed: int) -> ScriptedEnv:
        env = ScriptedEnv(tag=len(envs), ends=ends, offset=seed % len(EPISODE_LENGTHS), action_dim=ACTION_DIM)
        envs.append(env)
        return env

    col = SegmentCollector(policy.cfg, policy, spec, seed=1, num_envs=2, make=make)
    model = policy.build_model()
    per_env: dict[int, list[GameSegment]] = {i: [] for i in range(len(envs))}
    for call in range(30):
        res = col.collect(model, num_segments=3, temperature=1.0, policy_version=call)
        for s in res.segments:
            assert s.actions.dtype == np.float32 and s.actions.shape == (s.num_stored, ACTION_DIM)
            assert np.all(np.abs(s.actions) <= 1.0)
            # the per-step statistics travel with their transition (padding included)
            np.testing.assert_array_equal(s.stats["sampled_actions"][:, 0], s.actions)
            per_env[s.env_id].append(s)
        for i, env in enumerate(envs):
            check_stream(env, per_env[i], col.builders[i].in_flight_transitions, frame_stack)
    assert all(e.episode >= 4 for e in envs), [e.episode for e in envs]
    assert any(col.builders[i].in_flight_transitions > 0 for i in range(len(envs)))
    # distinct random actions: a dropped or shifted transition could not go unnoticed
    logged = np.concatenate([np.stack([e[1] for e in env.log]) for env in envs])
    assert len(np.unique(logged[:, 0])) == len(logged)


def test_continuous_evaluator_steps_with_unit_actions():
    """The evaluator runs a continuous policy episode after episode; every env action is in [-1, 1]."""
    spec = _continuous_spec()
    policy = RandomUnitPolicy(_small_cfg(1), spec)
    envs: list[ScriptedEnv] = []

    def make(seed: int) -> ScriptedEnv:
        env = ScriptedEnv(tag=len(envs), lengths=(4, 7, 3), action_dim=ACTION_DIM)
        envs.append(env)
        return env

    ev = Evaluator(policy.cfg, policy, spec, seed=3, num_envs=2, make=make)
    res = ev.evaluate(policy.build_model(), n_episodes=5, policy_version=4)
    assert len(res.episode_returns) == 5 and res.policy_version == 4
    assert res.envsteps == sum(len(e.log) for e in envs) == sum(res.episode_lengths)
    acts = np.stack([e[1] for env in envs for e in env.log])
    assert acts.dtype == np.float32 and acts.shape[1] == ACTION_DIM and np.all(np.abs(acts) <= 1.0)


def test_policy_of_the_wrong_action_kind_is_refused():
    """Both directions stop at construction, naming the env, its action kind and what the policy supports;
    a policy returning actions of the wrong form stops at its first step."""
    cfg = _small_cfg(1)
    discrete = EnvSpec(env_id="Scripted-v0", frame_shape=(3,), frame_dtype="float32", frame_stack=1,
                       num_actions=2, action_kind="discrete")
    with pytest.raises(ConfigError, match="'random_unit' supports continuous actions and this env has discr"):
        RandomUnitPolicy(cfg, discrete)
    with pytest.raises(ConfigError, match="'muzero' supports discrete actions and this env has continuous"):
        MuZeroPolicy(cfg, _continuous_spec())

    class IndexPolicy(RandomUnitPolicy):  # claims continuous, acts with indices
        def act(self, *args, **kwargs):
            out = super().act(*args, **kwargs)
            return ActOutput(actions=np.zeros(len(out.actions), np.int64), step_stats=out.step_stats,
                             root_value=out.root_value, predicted_value=out.predicted_value)

    policy = IndexPolicy(cfg, _continuous_spec())
    col = SegmentCollector(cfg, policy, policy.spec, seed=0, num_envs=2,
                           make=lambda seed: ScriptedEnv(tag=0, action_dim=ACTION_DIM))
    with pytest.raises(ValueError, match=r"needs shape \(2, 2\) of float32"):
        col.collect(policy.build_model(), temperature=1.0)


def test_check_policy_env_refuses_both_directions(monkeypatch):
    """Through the drivers' check (the registry's class, before anything starts): a continuous-only type on
    CartPole and a discrete-only one on Pendulum, each naming the types that would fit."""
    from muzero_tune.pipeline.core import check_policy_env
    from muzero_tune.policies import registry

    # stand in for a continuous-only policy type (none is registered yet)
    monkeypatch.setitem(registry.POLICY_CLASSES, "sampled_muzero", f"{__name__}:RandomUnitPolicy")
    cfg = make_config("cartpole_muzero", overrides={"policy.type": "sampled_muzero"})
    fits = "this env has discrete actions; policy types for discrete actions: muzero, efficientzero"
    with pytest.raises(ConfigError, match=fits):
        check_policy_env(cfg)
    cfg = make_config("cartpole_muzero", overrides={"env.env_id": "Pendulum-v1"})
    with pytest.raises(ConfigError, match="'muzero' supports discrete actions and this env has continuous "
                                          "actions; policy types for continuous actions: .*sampled_muzero"):
        check_policy_env(cfg)
    cls, spec = check_policy_env(make_config("cartpole_muzero", overrides={
        "policy.type": "sampled_muzero", "env.env_id": "Pendulum-v1"}))
    assert cls is RandomUnitPolicy and spec.action_shape == (1,)
