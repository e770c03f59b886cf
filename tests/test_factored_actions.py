"""A ``MultiDiscrete`` action space taken by its factors: the env side (the factored spec and wrapper,
``env.multi_discrete_actions``, the one-line refusals), the factored head's joint log-probabilities, entropy
and sampling against hand computations, the factored search's kernels against the plain-Python reference,
and each sampled type training on ``FactorMatch-v0`` (32,768 combinations) through the sync pipeline and
sampled_muzero through the async one; ``-m slow``: the other two through the async pipeline, and one type
learns the env's rule."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from muzero_tune.config import make_config
from muzero_tune.envs import EnvConfigError, UnsupportedEnvError, env_spec, make_env
from muzero_tune.envs.spaces import FactoredMultiDiscreteActions
from muzero_tune.mcts.reference import reference_sampled_search
from muzero_tune.mcts.sampled import SampledSearch
from muzero_tune.models.factored_net import (
    ConvFactoredMuZeroNet,
    FactorEmbedding,
    MLPFactoredMuZeroNet,
    factor_one_hot,
    factored_entropy,
    factored_log_prob,
)

FACTORS = "tests.user_envs.factors:FactorMatch-v0"  # MultiDiscrete([8] * 5): 32,768 combinations
NVEC = (8, 8, 8, 8, 8)
SAMPLED_TYPES = ("sampled_muzero", "sampled_efficientzero", "sampled_unizero")


# ---------------------------------------------------------------------------------------------- the env side


class _Recorder(gym.Env):
    """Records the action it receives; a MultiDiscrete of shape [2, 2] with a start of 1 (or given)."""

    observation_space = gym.spaces.Discrete(1)

    def __init__(self, nvec=((2, 3), (4, 5)), start=1):
        nvec = np.array(nvec)
        self.action_space = gym.spaces.MultiDiscrete(nvec, start=np.full(nvec.shape, start))
        self.received = None

    def reset(self, *, seed=None, options=None):
        return 0, {}

    def step(self, action):
        self.received = action
        return 0, 0.0, False, False, {}


def test_the_factored_wrapper_gives_the_env_its_shape_start_and_dtype():
    env = FactoredMultiDiscreteActions(_Recorder())
    assert env.nvec == (2, 3, 4, 5) and env.action_space == gym.spaces.MultiDiscrete([2, 3, 4, 5])
    env.step(np.array([1, 0, 3, 2]))
    np.testing.assert_array_equal(env.unwrapped.received, [[2, 1], [4, 3]])
    assert env.unwrapped.received.dtype == env.unwrapped.action_space.dtype


def test_a_multidiscrete_above_the_flat_limit_is_factored_and_below_it_flat_unless_asked():
    spec = env_spec(FACTORS)
    assert (spec.action_kind, spec.action_nvec, spec.action_dim, spec.num_actions) == ("factored", NVEC, 5, 0)
    assert spec.action_shape == (5,) and spec.action_dtype == "int64"
    assert "32768 action combinations" in spec.action_note and "4096" in spec.action_note
    small = {"nvec": [3, 4]}
    flat = env_spec(FACTORS, kwargs=small)
    assert (flat.action_kind, flat.num_actions, flat.action_nvec) == ("discrete", 12, ())
    factored = env_spec(FACTORS, kwargs=small, multi_discrete_actions="factored")
    assert (factored.action_kind, factored.action_nvec) == ("factored", (3, 4))
    cfg = make_config(None, overrides={"env.env_id": FACTORS, "env.kwargs": small,
                                       "env.multi_discrete_actions": "factored"})  # fmt: skip
    from muzero_tune.envs import spec_of

    assert spec_of(cfg.env) == factored
    # the env takes the library's factor vector; a random one lies inside nvec
    env = make_env(FACTORS, seed=0)
    env.reset()
    actions = spec.random_actions(np.random.default_rng(0), (64,))
    assert actions.dtype == np.int64 and actions.shape == (64, 5)
    assert (actions < 8).all() and (actions >= 0).all() and len(np.unique(actions)) == 8
    env.step(spec.env_action(actions[0]))
    np.testing.assert_array_equal(spec.check_actions(actions, 64), actions)
    with pytest.raises(ValueError, match="outside their factors' ranges .*nvec = \\[8, 8, 8, 8, 8\\]"):
        spec.check_actions(np.full((2, 5), 8), 2)
    with pytest.raises(ValueError, match="needs shape \\(2, 5\\) of int64"):
        spec.check_actions(np.zeros((2, 5), np.float32), 2)


def test_a_flat_multidiscrete_above_the_limit_and_a_bad_setting_are_one_line():
    with pytest.raises(UnsupportedEnvError, match="32768 action combinations .*the 4096 .*factored"):
        make_env(FACTORS, multi_discrete_actions="flat")
    with pytest.raises(EnvConfigError, match="env.multi_discrete_actions: must be one of"):
        make_env(FACTORS, multi_discrete_actions="split")


def test_a_non_sampled_type_above_the_limit_is_refused_in_one_line(tmp_path, capsys):
    """Through ``muzero-tune train``: exit status 2, one line naming the space, its combinations, the limit
    and the sampled types; nothing written."""
    from muzero_tune.cli import main

    out = tmp_path / "runs"
    rc = main(["train", "--set", f"env.env_id={FACTORS}", "--set", "policy.type=muzero",
               "--set", f"logging.output_dir={out}"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    for part in ("MultiDiscrete([8 8 8 8 8])", "32768 action combinations", "4096", "factored actions",
                 "sampled_muzero", "sampled_efficientzero", "sampled_unizero"):  # fmt: skip
        assert part in err, (part, err)
    assert not out.exists() or not any(out.iterdir())


# ---------------------------------------------------------------------------------------------- the head


def test_joint_log_probs_entropy_and_one_hot_against_a_hand_computation():
    nvec = (2, 3)
    logits = torch.tensor([[0.5, -0.5, 1.0, 0.0, -1.0]], requires_grad=True)  # [B = 1, P = 5]
    actions = torch.tensor([[[0, 2], [1, 0], [1, 1]]])  # [B, K = 3, D = 2]
    e = math.exp
    p0 = [e(0.5) / (e(0.5) + e(-0.5)), e(-0.5) / (e(0.5) + e(-0.5))]
    z1 = e(1.0) + e(0.0) + e(-1.0)
    p1 = [e(1.0) / z1, e(0.0) / z1, e(-1.0) / z1]
    want = [math.log(p0[0] * p1[2]), math.log(p0[1] * p1[0]), math.log(p0[1] * p1[1])]
    got = factored_log_prob(logits, actions, nvec)
    assert got.shape == (1, 3) and got.dtype == torch.float32
    torch.testing.assert_close(got, torch.tensor([want]))
    entropy = -sum(p * math.log(p) for p in p0) - sum(p * math.log(p) for p in p1)
    torch.testing.assert_close(factored_entropy(logits, nvec), torch.tensor([entropy]))
    got.sum().backward()  # the loss reaches every factor's logits
    assert (logits.grad != 0).all()
    one_hot = factor_one_hot(torch.tensor([[1, 2], [0, 0]]), torch.tensor([0, 2]), 5)
    np.testing.assert_array_equal(one_hot.numpy(), [[0, 1, 0, 0, 1], [1, 0, 1, 0, 0]])
    assert factored_log_prob(logits.bfloat16(), actions, nvec).dtype == torch.float32  # a bf16 head


def test_the_factored_networks_take_factor_vectors():
    net = MLPFactoredMuZeroNet(nvec=(2, 3), obs_dim=4, latent_dim=8, hidden_dim=16, value_support_size=3,
                               reward_support_size=2, projection_dim=8)  # fmt: skip
    latent = net.initial_inference(torch.zeros(2, 4)).latent
    out = net.recurrent_inference(latent, torch.tensor([[1, 2], [0, 0]]))
    assert out.policy_logits.shape == (2, 5)
    other = net.recurrent_inference(latent, torch.tensor([[1, 1], [0, 0]]))
    assert not torch.equal(out.latent[0], other.latent[0]) and torch.equal(out.latent[1], other.latent[1])
    conv = ConvFactoredMuZeroNet(nvec=(2, 3), obs_shape=(2, 4, 4), num_channels=4, num_res_blocks=1,
                                 downsample=False, value_support_size=3, reward_support_size=2,
                                 projection_dim=8)  # fmt: skip
    conv.eval()  # batch-norm statistics of its own: each row stands alone
    latent = conv.initial_inference(torch.rand(2, 2, 4, 4)).latent
    out = conv.recurrent_inference(latent, torch.tensor([[1, 2], [0, 0]]))
    assert out.policy_logits.shape == (2, 5) and out.latent.shape == latent.shape
    other = conv.recurrent_inference(latent, torch.tensor([[0, 2], [0, 0]]))
    assert not torch.equal(out.latent[0], other.latent[0]) and torch.equal(out.latent[1], other.latent[1])
    embed = FactorEmbedding((2, 3), 4)
    tokens = embed(torch.tensor([[1.0, 2.0], [0.0, 0.0]]))  # the world model passes float factor indices
    torch.testing.assert_close(tokens[0], embed.table.weight[1] + embed.table.weight[4])


class _Model:
    """A deterministic world model over latents [B, 2] float64 and factored actions [B, D]."""

    def __init__(self, nvec):
        self.nvec, self.p = nvec, sum(nvec)

    def params(self, latent):
        return 1.5 * np.sin(2.0 * latent[:, :1] + 1.3 * np.arange(self.p))  # [B, P]

    def value(self, latent):
        return np.cos(latent[:, 0] - 0.5 * latent[:, 1])

    def __call__(self, latent, actions):
        z = latent.numpy()
        assert actions.dtype == np.int64 and actions.shape == (len(z), len(self.nvec))
        a = np.cos(actions.astype(np.float64) @ (0.3 + np.arange(len(self.nvec))))
        nxt = np.stack([np.tanh(z[:, 0] + 0.7 * a), 0.5 * z[:, 1] + 0.3 * np.sin(a)], axis=1)
        return torch.as_tensor(nxt), np.sin(z[:, 0] + 2.0 * a), self.value(nxt), self.params(nxt)


def _search(nvec, k, sims, prior, z, *, add_noise, deterministic, seed, reference=False):
    model = _Model(nvec)
    common = dict(root_latent=torch.as_tensor(z), root_policy_logits=model.params(z), legal_mask=None,
                  recurrent_fn=model, add_noise=add_noise, deterministic=deterministic,
                  rng=np.random.default_rng(seed), root_value=model.value(z))  # fmt: skip
    if reference:
        return reference_sampled_search(num_simulations=sims, num_samples=k, action_kind="factored",
                                        action_nvec=nvec, sampled_prior=prior, discount=0.97, **common)
    search = SampledSearch(num_samples=k, action_kind="factored", action_nvec=nvec, num_simulations=sims,
                           sampled_prior=prior, discount=0.97)  # fmt: skip
    return search.run(**common)


@pytest.mark.parametrize("prior", ["uniform", "density"])
def test_root_draws_and_priors_against_a_hand_computation(prior):
    """Without noise the K root slots are inverse-CDF draws of each factor's softmax with the run's first
    uniforms [B, K, D]; the prior is 1/K (uniform) or the softmax of the joint log-probabilities (density)."""
    nvec, k = (3, 2, 4), 6
    z = np.random.default_rng(1).normal(size=(3, 2))
    out = _search(nvec, k, 1, prior, z, add_noise=False, deterministic=True, seed=5)
    u = np.random.default_rng(5).random((3, k, 3))  # the first draw of a deterministic, noiseless run
    logits = _Model(nvec).params(z)
    starts = np.cumsum((0,) + nvec[:-1])
    for b in range(3):
        joint = []
        for slot in range(k):
            logp = 0.0
            for d, n in enumerate(nvec):
                part = logits[b, starts[d] : starts[d] + n]
                pi = np.exp(part - part.max()) / np.exp(part - part.max()).sum()
                v = int(np.searchsorted(np.cumsum(pi), u[b, slot, d], side="right"))
                assert out.extras["sampled_actions"][b, slot, d] == v
                logp += math.log(pi[v])
            joint.append(logp)
        want = np.full(k, 1.0 / k) if prior == "uniform" else np.exp(joint) / np.exp(joint).sum()
        np.testing.assert_allclose(out.root_prior[b], want, rtol=1e-6)
    assert out.extras["sampled_actions"].dtype == np.int64 and out.extras["sampled_mask"].all()


@pytest.mark.parametrize("prior", ["uniform", "density"])
@pytest.mark.parametrize("add_noise,deterministic", [(False, True), (True, False)])
def test_factored_kernels_match_reference(prior, add_noise, deterministic):
    """Bit for bit, exploring roots (Dirichlet noise mixed into each factor's draw and over the K edges)
    included."""
    nvec = (3, 2, 4)
    z = np.random.default_rng(0).normal(size=(4, 2))
    out = _search(nvec, 5, 25, prior, z, add_noise=add_noise, deterministic=deterministic, seed=3)
    ref = _search(nvec, 5, 25, prior, z, add_noise=add_noise, deterministic=deterministic, seed=3,
                  reference=True)  # fmt: skip
    np.testing.assert_array_equal(out.visit_counts, ref.visit_counts)
    np.testing.assert_array_equal(out.root_value, ref.root_value)
    np.testing.assert_array_equal(out.root_prior, ref.root_prior)
    np.testing.assert_array_equal(out.extras["sampled_actions"], ref.extras["sampled_actions"])
    assert (out.visit_counts.sum(1) == 25).all() and (out.extras["sampled_actions"] < np.array(nvec)).all()


# ---------------------------------------------------------------------------------------------- training

TINY = {
    "env.env_id": FACTORS, "model.hidden_dim": 32, "model.latent_dim": 16, "mcts.num_simulations": 4,
    "learn.batch_size": 16, "env.collector_env_num": 2, "env.evaluator_env_num": 2, "eval.n_episodes": 2,
    "eval.eval_freq": 10, "replay.game_segment_length": 8, "max_envstep": 96, "stop_value": None,
    "logging.quiet": True, "policy.num_samples": 4, "model.value_support_size": 10,
    "model.reward_support_size": 2,
}  # fmt: skip


def _check_run(evals: list[dict], pipeline: str) -> None:
    assert evals and all(e["pipeline"] == pipeline for e in evals)
    for e in evals:
        assert 0.0 <= e["reward_mean"] <= 8.0  # FactorMatch's returns: 8 steps of a reward in 0..1
        assert np.isfinite(e["train/loss_total"]) and np.isfinite(e["train/loss_policy"])


def _check_stored_actions(segments) -> None:
    for seg in segments:
        assert seg.actions.dtype == np.int64 and seg.actions.shape[1:] == (5,)
        assert ((seg.actions >= 0) & (seg.actions < 8)).all()
        sampled = seg.stats["sampled_actions"]
        assert sampled.shape[1:] == (4, 5) and ((sampled >= 0) & (sampled < 8)).all()


@pytest.mark.parametrize("ptype", SAMPLED_TYPES)
def test_each_sampled_type_trains_on_factors_sync(ptype, tmp_path):
    """FactorMatch raises on an action outside its space, so a finished sync run sent only actions inside
    nvec."""
    from muzero_tune.pipeline.sync_driver import train_muzero_segment
    from muzero_tune.runs.reporter import MemoryReporter

    cfg = make_config(None, overrides={**TINY, "policy.type": ptype, "logging.output_dir": str(tmp_path),
                                       "exp_name": ptype})  # fmt: skip
    rep = MemoryReporter()
    summary = train_muzero_segment(cfg, reporter=rep)
    assert summary.stop_reason == "max_envstep" and summary.train_iter > 0
    _check_run(rep.evals, "sync")


def test_collected_segments_hold_factor_vectors_and_a_train_step_learns_from_them(tmp_path):
    from muzero_tune.pipeline.collector import fill_replay
    from muzero_tune.pipeline.core import DriverCore
    from muzero_tune.runs.reporter import MemoryReporter

    cfg = make_config(None, overrides={**TINY, "policy.type": "sampled_efficientzero",
                                       "logging.output_dir": str(tmp_path)})  # fmt: skip
    core = DriverCore(cfg, MemoryReporter())
    try:
        fill_replay(core, 32)
        _check_stored_actions(core.buffer.segments)
        _, batch = core.build_batch()
        assert batch.actions.dtype == np.int64 and batch.actions.shape == (16, cfg.replay.num_unroll_steps, 5)
        assert ((batch.actions >= 0) & (batch.actions < 8)).all()  # random past the data: inside nvec too
        out = core.train_step(prefetch_next=False)
        assert np.isfinite(out.metrics["train/loss_total"]) and np.isfinite(out.priorities).all()
        obs = np.eye(4, dtype=np.float32)[[0, 3]]  # two cues, one-hot
        legal = np.ones((2, 0), bool)  # nothing to mask
        fresh = core.policy.reanalyze(core.learner.model, obs, legal, np.random.default_rng(0))
        assert fresh["sampled_actions"].shape == (2, 4, 5) and fresh["child_visits"].shape == (2, 4)
        assert fresh["sampled_actions"].dtype == np.int64 and (fresh["sampled_actions"] < 8).all()
    finally:
        core.close()


@pytest.mark.parametrize("ptype", [t if t == "sampled_muzero" else pytest.param(t, marks=pytest.mark.slow)
                                   for t in SAMPLED_TYPES])  # fmt: skip
def test_each_sampled_type_trains_on_factors_async(ptype, run_async, tmp_path):
    """The Ray actors build FactorMatch from the config; no actor fails, and the buffer holds factor vectors
    inside nvec (sampled_muzero by default: what crosses the actors' boundary, factor vectors in segments and
    in sampled actions, is the same for every sampled type).

    Default-tier twin: factor vectors across the actors' boundary,
    tests/test_factored_actions.py::test_each_sampled_type_trains_on_factors_async[sampled_muzero]
    and each type's factored training on the sync pipeline,
    tests/test_factored_actions.py::test_each_sampled_type_trains_on_factors_sync[sampled_efficientzero]
    tests/test_factored_actions.py::test_each_sampled_type_trains_on_factors_sync[sampled_unizero]
    """
    run = run_async(tmp_path, {**TINY, "policy.type": ptype, "max_envstep": 160}, exp_name=ptype)
    assert run.summary.train_iter > 0 and run.summary.env_steps >= 160
    assert run.stats.collector_failures == 0 and run.stats.evaluator_failures == 0, run.stats.restart_reasons
    _check_run(run.reporter.evals, "async")
    _check_stored_actions(run.driver.core.buffer.segments)


@pytest.mark.slow
def test_sampled_muzero_learns_the_factor_rule(tmp_path):
    """FactorMatch with 4 cues: a uniform random policy returns 1.0 an episode (0.15 the standard error of an
    8-episode mean), the rule 8.0. 16,000 env steps of sampled_muzero with K = 8 reached 2.15 at the last
    evaluation on seed 0 (about a minute).

    Default-tier twin: the same type and env trained on the sync pipeline,
    tests/test_factored_actions.py::test_each_sampled_type_trains_on_factors_sync[sampled_muzero]
    """
    from muzero_tune.api import train
    from muzero_tune.runs.reporter import MemoryReporter

    cfg = make_config(None, overrides={
        **TINY, "model.hidden_dim": 64, "model.latent_dim": 32, "mcts.num_simulations": 16,
        "learn.batch_size": 64, "env.collector_env_num": 8, "env.evaluator_env_num": 8, "eval.n_episodes": 8,
        "eval.eval_freq": 500, "max_envstep": 16_000, "policy.type": "sampled_muzero",
        "policy.num_samples": 8, "seed": 0, "logging.output_dir": str(tmp_path), "exp_name": "learn",
    })  # fmt: skip
    rep = MemoryReporter()
    train(cfg, reporter=rep)
    last = [e["reward_mean"] for e in rep.evals[-2:]]
    assert min(last) > 1.6, [round(e["reward_mean"], 2) for e in rep.evals]
