"""Tests for muzero_tune.envs: specs, single-frame envs, frame stacking, seeding and config errors."""

from __future__ import annotations

import collections

import gymnasium as gym
import numpy as np
import pytest

from muzero_tune.envs import (
    AtariFramePreprocessing,
    EnvConfigError,
    EnvSpec,
    MissingDependencyError,
    UnitBoxActions,
    UnknownEnvError,
    action_mask_from_info,
    area_resize,
    bounds_to_unit,
    env_spec,
    factory,
    make_env,
    stack_frames,
    unit_to_bounds,
    validate_env_id,
)

PONG = "ALE/Pong-v5"


def _rollout(env: gym.Env, actions: np.ndarray) -> tuple[list[np.ndarray], list[float], list[bool]]:
    """Frames (first from reset), rewards and done flags; resets (unseeded) after each episode end."""
    obs, _ = env.reset()
    frames, rewards, dones = [obs], [], []
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(action)
        frames.append(obs)
        rewards.append(float(reward))
        dones.append(terminated or truncated)
        if terminated or truncated:
            obs, _ = env.reset()
            frames.append(obs)
    return frames, rewards, dones


# --- classic control -------------------------------------------------------------------------------


def test_cartpole_spec_and_stacked_shapes():
    spec = env_spec("CartPole-v1")
    assert spec.frame_shape == (4,)
    assert spec.frame_dtype == "float32"
    assert spec.num_actions == 2
    assert (spec.action_kind, spec.action_dim) == ("discrete", 0)
    assert spec.obs_shape == (4,)
    assert env_spec("CartPole-v1", frame_stack=4).obs_shape == (16,)

    env = make_env("CartPole-v1", seed=0)
    obs, _ = env.reset()
    assert obs.shape == (4,) and obs.dtype == np.float32
    frames = [obs] + [env.step(0)[0] for _ in range(3)]
    window = np.stack(frames)  # [4, 4] oldest first
    assert stack_frames(window[-1:]).shape == (4,)
    stacked = stack_frames(window)
    assert stacked.shape == (16,)
    np.testing.assert_array_equal(stacked, np.concatenate(frames))
    batched = np.stack([window, window[::-1]])  # [B=2, stack=4, D=4]
    assert stack_frames(batched).shape == (2, 16)
    assert env_spec("CartPole-v1", frame_stack=4).stack(batched).shape == (2, 16)


def test_cartpole_seed_reproducible_across_episodes():
    actions = np.random.default_rng(0).integers(0, 2, size=120)
    run_a = _rollout(make_env("CartPole-v1", seed=3), actions)
    run_b = _rollout(make_env("CartPole-v1", seed=3), actions)
    assert any(run_a[2]), "the rollout should cross an episode boundary"
    for frame_a, frame_b in zip(run_a[0], run_b[0], strict=True):
        np.testing.assert_array_equal(frame_a, frame_b)
    assert run_a[1:] == run_b[1:]
    other = make_env("CartPole-v1", seed=4).reset()[0]
    assert not np.array_equal(run_a[0][0], other)
    # The seed also fixes action sampling.
    assert [make_env("CartPole-v1", seed=3).action_space.sample() for _ in range(2)] == [
        make_env("CartPole-v1", seed=3).action_space.sample() for _ in range(2)
    ]


def test_explicit_reset_seed_wins_over_stored_seed():
    first = make_env("CartPole-v1", seed=1).reset(seed=2)[0]
    np.testing.assert_array_equal(first, make_env("CartPole-v1").reset(seed=2)[0])


def test_continuous_spec_and_time_limit_and_reward_clipping():
    spec = env_spec("Pendulum-v1")
    assert (spec.action_kind, spec.action_dim, spec.num_actions) == ("continuous", 1, 0)
    assert spec.frame_shape == (3,)

    env = make_env("CartPole-v1", seed=0, max_episode_steps=5)
    env.reset()
    # Alternating pushes keep the pole up well past 5 steps, so only the cap ends the episode.
    steps = [env.step(t % 2) for t in range(5)]
    assert [s[3] for s in steps] == [False] * 4 + [True]
    assert not any(s[2] for s in steps)

    # MountainCarContinuous pays -0.1 * a^2 per step: sign clipping turns -0.1 into -1.0.
    push = np.array([1.0], dtype=np.float32)
    raw = make_env("MountainCarContinuous-v0", seed=0)
    raw.reset()
    assert raw.step(push)[1] == pytest.approx(-0.1)
    clipped = make_env("MountainCarContinuous-v0", seed=0, clip_rewards=True)
    clipped.reset()
    assert clipped.step(push)[1] == -1.0


# --- frame stacking and specs -----------------------------------------------------------------------


def test_stack_frames_images_is_a_view_with_leading_dims():
    frames = np.arange(2 * 3 * 4 * 1 * 5 * 5, dtype=np.uint8).reshape(
        2, 3, 4, 1, 5, 5
    )  # [B, T, stack, C, H, W]
    stacked = stack_frames(frames)
    assert stacked.shape == (2, 3, 4, 5, 5)
    assert np.shares_memory(stacked, frames)
    np.testing.assert_array_equal(stacked[1, 2], np.concatenate(list(frames[1, 2]), axis=0))
    rgb = np.zeros((4, 3, 8, 8), dtype=np.uint8)
    assert stack_frames(rgb).shape == (12, 8, 8)
    vectors = np.zeros((2, 3, 4, 6), dtype=np.float32)  # [B, T, stack, D]: rank must be given
    assert stack_frames(vectors, frame_ndim=1).shape == (2, 3, 24)


def test_env_spec_validation_and_caching():
    with pytest.raises(ValueError, match="frame_stack"):
        EnvSpec("X", (4,), "float32", 0, 2, "discrete")
    with pytest.raises(ValueError, match="action_kind"):
        EnvSpec("X", (4,), "float32", 1, 2, "multi")  # type: ignore[arg-type]
    assert EnvSpec("X", [1, 8, 8], "uint8", 4, 6, "discrete").obs_shape == (4, 8, 8)
    with pytest.raises(EnvConfigError, match="env.frame_stack"):
        env_spec("CartPole-v1", frame_stack=0)
    assert env_spec("CartPole-v1", frame_stack=2) is env_spec("CartPole-v1", frame_stack=2)


def test_action_mask_from_info():
    np.testing.assert_array_equal(action_mask_from_info({}, 3), [True, True, True])
    np.testing.assert_array_equal(action_mask_from_info(None, 2), [True, True])
    np.testing.assert_array_equal(action_mask_from_info({"action_mask": [1, 0, 1]}, 3), [True, False, True])
    with pytest.raises(ValueError, match="expected 3"):
        action_mask_from_info({"action_mask": [1, 0]}, 3)
    with pytest.raises(ValueError, match="no action"):
        action_mask_from_info({"action_mask": np.zeros(3)}, 3)


# --- Atari --------------------------------------------------------------------------------------------


def test_area_resize_matches_area_averaging():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(128, 128), dtype=np.uint8)
    block_mean = np.rint(image.reshape(64, 2, 64, 2).astype(np.float64).mean(axis=(1, 3)))
    np.testing.assert_array_equal(area_resize(image, height_px=64, width_px=64), block_mean)

    screen = rng.integers(0, 256, size=(210, 160), dtype=np.uint8)
    out = area_resize(screen, height_px=64, width_px=64)
    # Output pixel (0, 0) covers rows [0, 3.28125) and columns [0, 2.5) of the screen.
    x = screen.astype(np.float64)
    rows = np.array([1, 1, 1, 0.28125])[:, None]
    cols = np.array([1, 1, 0.5])[None, :]
    expected = (x[:4, :3] * rows * cols).sum() / (3.28125 * 2.5)
    assert out[0, 0] == np.rint(expected)
    flat = np.full((3, 210, 160), 77, dtype=np.uint8)
    assert (area_resize(flat, height_px=96, width_px=96) == 77).all()


@pytest.mark.parametrize("frame_size_px", [64, 96])
def test_pong_frames_and_spec(frame_size_px):
    env = make_env(PONG, seed=0, frame_size_px=frame_size_px)
    obs, _ = env.reset()
    assert obs.shape == (1, frame_size_px, frame_size_px) and obs.dtype == np.uint8
    assert env.observation_space.shape == obs.shape
    assert env.step(0)[0].shape == obs.shape
    kwargs = env.unwrapped.spec.kwargs
    assert kwargs["repeat_action_probability"] == 0.25
    assert kwargs["frameskip"] == 4
    assert kwargs["full_action_space"] is False
    spec = env_spec(PONG, frame_stack=4, frame_size_px=frame_size_px)
    assert spec.num_actions == 6
    assert (spec.frame_shape, spec.frame_dtype) == ((1, frame_size_px, frame_size_px), "uint8")
    assert spec.obs_shape == (4, frame_size_px, frame_size_px)


def test_pong_rgb_and_sticky_knob():
    env = make_env(PONG, grayscale=False, sticky_action_prob=0.0)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (3, 64, 64) and obs.dtype == np.uint8
    assert env.unwrapped.spec.kwargs["repeat_action_probability"] == 0.0
    assert env_spec(PONG, grayscale=False).frame_shape == (3, 64, 64)


def test_pong_seed_reproducible():
    actions = np.random.default_rng(1).integers(0, 6, size=60)
    frames_a, rewards_a, _ = _rollout(make_env(PONG, seed=11), actions)
    frames_b, rewards_b, _ = _rollout(make_env(PONG, seed=11), actions)
    for frame_a, frame_b in zip(frames_a, frames_b, strict=True):
        np.testing.assert_array_equal(frame_a, frame_b)
    assert rewards_a == rewards_b
    assert len({f.tobytes() for f in frames_a}) > 10, "frames should change over the rollout"


def test_pong_rolling_window_matches_gymnasium_frame_stack():
    stack = 4
    actions = np.random.default_rng(2).integers(0, 6, size=50)
    reset_at = 25  # an unseeded mid-run reset checks the padding again
    single = make_env(PONG, seed=5)
    # gymnasium 1.4 padding_type="reset" pads with copies of the reset observation.
    reference = gym.wrappers.FrameStackObservation(make_env(PONG, seed=5), stack, padding_type="reset")

    def reset_both() -> tuple[collections.deque, np.ndarray]:
        frame, _ = single.reset()
        ref_obs, _ = reference.reset()
        return collections.deque([frame] * stack, maxlen=stack), ref_obs

    window, ref_obs = reset_both()
    compared = 0
    for t, action in enumerate(actions):
        ours = stack_frames(np.stack(window))
        assert ours.shape == (stack, 64, 64)
        np.testing.assert_array_equal(ours, stack_frames(ref_obs))
        compared += 1
        if t == reset_at:
            window, ref_obs = reset_both()
            continue
        frame, _, terminated, truncated, _ = single.step(action)
        ref_obs, _, ref_terminated, ref_truncated, _ = reference.step(action)
        assert (terminated, truncated) == (ref_terminated, ref_truncated)
        window.append(frame)
    np.testing.assert_array_equal(stack_frames(np.stack(window)), stack_frames(ref_obs))
    assert compared == len(actions)


def test_breakout_episodic_life_terminates_on_life_loss():
    env = make_env("ALE/Breakout-v5", seed=0, episodic_life=True, noop_max=0)
    _, info = env.reset()
    assert info["lives"] == 5
    for t in range(500):
        _, _, terminated, truncated, info = env.step(1 if t == 0 else 0)  # serve once, then idle
        if terminated or truncated:
            break
    assert terminated and info["lives"] == 4


def test_atari_final_frame_is_the_real_last_screen():
    validate_env_id(PONG)  # registers the ALE ids when this test runs alone
    # 400 emulator frames = 100 agent steps: far enough that consecutive frames differ.
    base = gym.make(PONG, obs_type="grayscale", max_num_frames_per_episode=400)
    env = AtariFramePreprocessing(base, frame_size_px=64, noop_max=0)
    previous, _ = env.reset(seed=0)
    for _ in range(150):
        frame, _, _, truncated, _ = env.step(0)
        if truncated:
            break
        previous = frame
    assert truncated
    assert not np.array_equal(frame, previous)
    screen = env.unwrapped.ale.getScreenGrayscale()
    np.testing.assert_array_equal(frame[0], area_resize(screen, height_px=64, width_px=64))


# --- errors ---------------------------------------------------------------------------------------------


def test_unknown_env_id_names_key_value_and_suggestion():
    with pytest.raises(UnknownEnvError) as excinfo:
        validate_env_id("CartPol-v1")
    message = str(excinfo.value)
    assert "env.env_id" in message and "'CartPol-v1'" in message and "'CartPole-v1'" in message
    assert "ALE/<Game>-v5" in message  # the supported families
    assert isinstance(excinfo.value, ValueError)
    with pytest.raises(UnknownEnvError, match="ALE/Pong-v5"):
        make_env("Pong-v5")


@pytest.mark.parametrize(
    ("knob", "value"),
    [("frame_size_px", 84), ("frame_size_px", 64.0), ("sticky_action_prob", 1.5), ("noop_max", -1)],
)
def test_bad_knobs_name_their_key(knob, value):
    with pytest.raises(EnvConfigError, match=f"env.{knob}"):
        make_env("CartPole-v1", **{knob: value})


def test_missing_ale_py_says_what_to_install(monkeypatch):
    real_import = factory._import_module

    def fake_import(name, *args, **kwargs):
        if name == "ale_py":
            raise ImportError("No module named 'ale_py'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(factory, "_import_module", fake_import)
    with pytest.raises(MissingDependencyError) as excinfo:
        make_env(PONG)
    assert isinstance(excinfo.value, ImportError)
    assert 'pip install "muzero-tune[atari]"' in str(excinfo.value)
    assert "pip install ale-py" in str(excinfo.value)
    validate_env_id("CartPole-v1")  # vector envs do not need ale-py


def test_missing_box2d_says_what_to_install(monkeypatch):
    def no_box2d(name, *args, **kwargs):
        if name == "Box2D":
            raise ImportError("No module named 'Box2D'")
        return real_import(name, *args, **kwargs)

    real_import = factory._import_module
    monkeypatch.setattr(factory, "_import_module", no_box2d)
    with pytest.raises(MissingDependencyError, match=r"gymnasium\[box2d\]"):
        validate_env_id("LunarLander-v3")


# --- continuous actions ---------------------------------------------------------------------------------


class _RecordingBoxEnv(gym.Env):
    """Records the actions it receives; bounds per component [-2, 2], [0, 10], [5, 5] (degenerate)."""

    metadata: dict = {}

    def __init__(self):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Box(
            low=np.array([-2.0, 0.0, 5.0], np.float32), high=np.array([2.0, 10.0, 5.0], np.float32)
        )
        self.received: list[np.ndarray] = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.received.append(np.array(action))
        return np.zeros(1, np.float32), 0.0, False, False, {}


def test_unit_actions_map_affinely_to_the_bounds_and_back():
    low, high = np.array([-2.0, 0.0, 5.0]), np.array([2.0, 10.0, 5.0])
    unit = np.array([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.5, -0.5, 0.3]])
    env_actions = unit_to_bounds(unit, low, high)
    np.testing.assert_allclose(env_actions, [[-2, 0, 5], [2, 10, 5], [0, 5, 5], [1, 2.5, 5]])
    # back: exact inverse where the bounds are not degenerate; a degenerate component maps to 0
    back = bounds_to_unit(env_actions, low, high)
    np.testing.assert_allclose(back[:, :2], unit[:, :2], atol=1e-12)
    np.testing.assert_array_equal(back[:, 2], 0.0)
    # out-of-range inputs are clipped in both directions
    np.testing.assert_allclose(unit_to_bounds([[3.0, -7.0, 9.0]], low, high), [[2, 0, 5]])
    np.testing.assert_allclose(bounds_to_unit([[-9.0, 11.0, 0.0]], low, high), [[-1, 1, 0]])
    # the bounds themselves are hit exactly (no float overshoot past high)
    assert np.all(unit_to_bounds(np.ones(3), low, high) <= high)


def test_unit_box_wrapper_is_what_the_env_receives():
    inner = _RecordingBoxEnv()
    env = UnitBoxActions(inner)
    assert env.action_space == gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
    env.reset(seed=0)
    env.step(np.array([1.0, 0.0, -1.0], np.float32))
    env.step(np.array([-5.0, 2.0, 0.0], np.float32))  # out of range: clipped, never outside the bounds
    np.testing.assert_allclose(inner.received, [[2.0, 5.0, 5.0], [-2.0, 10.0, 5.0]])
    assert inner.received[0].dtype == np.float32
    np.testing.assert_allclose(env.reverse_action(np.array([2.0, 5.0, 5.0])), [1.0, 0.0, 0.0])
    unbounded = _RecordingBoxEnv()
    unbounded.action_space = gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32)
    with pytest.raises(ValueError, match="finite action bounds"):
        UnitBoxActions(unbounded)


def test_pendulum_takes_unit_actions():
    """Pendulum-v1's torque bounds are [-2, 2]: the library's 0.5 is a torque of 1.0."""
    env = make_env("Pendulum-v1", seed=0)
    assert env.action_space == gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
    env.reset()
    env.step(np.array([0.5], np.float32))
    assert env.unwrapped.last_u == pytest.approx(1.0)
    env.step(np.array([4.0], np.float32))
    assert env.unwrapped.last_u == pytest.approx(2.0)


def test_spec_action_form_and_checks():
    pend = env_spec("Pendulum-v1")
    cart = env_spec("CartPole-v1")
    assert (pend.action_shape, pend.action_dtype, cart.action_shape, cart.action_dtype) == (
        (1,), "float32", (), "int64"
    )
    rng = np.random.default_rng(0)
    assert pend.random_actions(rng, (4, 3)).shape == (4, 3, 1)
    assert cart.random_actions(rng, (5,)).dtype == np.int64
    # the discrete draw is exactly rng.integers(num_actions, size=...)
    np.testing.assert_array_equal(
        cart.random_actions(np.random.default_rng(7), (6,)), np.random.default_rng(7).integers(2, size=6)
    )
    np.testing.assert_array_equal(pend.check_actions([[0.5], [-1.0]], 2), [[0.5], [-1.0]])
    with pytest.raises(ValueError, match=r"needs shape \(2, 1\) of float32"):
        pend.check_actions(np.zeros(2, np.int64), 2)
    with pytest.raises(ValueError, match=r"outside \[-1, 1\]"):
        pend.check_actions([[1.5], [0.0]], 2)
    with pytest.raises(ValueError, match=r"needs shape \(2,\) of int64"):
        cart.check_actions(np.zeros((2, 1), np.float32), 2)
    assert cart.env_action(np.int64(1)) == 1 and isinstance(cart.env_action(np.int64(1)), int)
    row = np.array([0.25], np.float32)
    out = pend.env_action(row)
    assert out.dtype == np.float32 and out is not row


CONTINUOUS_ENVS = [
    ("Pendulum-v1", 3, 1, None),
    ("MountainCarContinuous-v0", 2, 1, None),
    ("LunarLanderContinuous-v3", 8, 2, "box2d"),
    ("InvertedPendulum-v5", 4, 1, "mujoco"),
]


@pytest.mark.parametrize(("env_id", "obs_dim", "action_dim", "extra"), CONTINUOUS_ENVS,
                         ids=[e[0] for e in CONTINUOUS_ENVS])
def test_continuous_env_builds_steps_and_seeds(env_id, obs_dim, action_dim, extra):
    try:
        validate_env_id(env_id)
    except MissingDependencyError as err:
        pytest.skip(f"optional {extra} extra not installed: {err}")
    spec = env_spec(env_id)
    assert (spec.action_kind, spec.action_dim, spec.frame_shape, spec.frame_dtype) == (
        "continuous", action_dim, (obs_dim,), "float32"
    )
    actions = np.random.default_rng(0).uniform(-1, 1, size=(60, action_dim)).astype(np.float32)
    runs = []
    for _ in range(2):
        env = make_env(env_id, seed=3)
        assert env.action_space == gym.spaces.Box(-1.0, 1.0, shape=(action_dim,), dtype=np.float32)
        frames, rewards, dones = _rollout(env, actions)
        env.close()
        assert all(f.dtype == np.float32 and f.shape == (obs_dim,) for f in frames)
        assert np.all(np.isfinite(rewards))
        runs.append((frames, rewards, dones))
    (f1, r1, d1), (f2, r2, d2) = runs
    np.testing.assert_array_equal(np.stack(f1), np.stack(f2))
    assert r1 == r2 and d1 == d2
    other = make_env(env_id, seed=4)
    assert not np.array_equal(other.reset()[0], f1[0])  # the seed matters
    other.close()


@pytest.mark.parametrize(
    ("env_id", "missing", "extra"),
    [("LunarLanderContinuous-v3", "Box2D", "box2d"), ("LunarLander-v3", "pygame", "box2d"),
     ("InvertedPendulum-v5", "mujoco", "mujoco"), ("InvertedPendulum-v5", "imageio", "mujoco")],
)
def test_missing_extra_is_one_line_naming_it(monkeypatch, env_id, missing, extra):
    real_import = factory._import_module

    def fake_import(name, *args, **kwargs):
        if name == missing:
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(factory, "_import_module", fake_import)
    with pytest.raises(MissingDependencyError) as excinfo:
        make_env(env_id)
    message = str(excinfo.value)
    assert "\n" not in message
    assert f'pip install -e ".[{extra}]"' in message and f"{extra} extra" in message and missing in message
