"""Stochastic MuZero policy: the chance-node kernel search against a plain-Python reference, chance sampling
frequencies, targets on a hand-computed case, the loss's stop-gradients, the stochastic CartPole env, and a
short sync run on it that writes a loadable evaluated snapshot. The type's sync and async runs on CartPole:
its Tune trials in tests/test_every_policy_type.py, every checkpoint re-evaluated exactly.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from muzero_tune.config import make_config
from muzero_tune.envs.factory import env_spec, make_env, validate_env_id
from muzero_tune.envs.stochastic import STOCHASTIC_CARTPOLE_ID
from muzero_tune.mcts.reference import reference_stochastic_search
from muzero_tune.mcts.stochastic import StochasticMuZeroSearch
from muzero_tune.models.muzero_net import InitialOutput
from muzero_tune.models.support import scalar_to_target
from muzero_tune.policies.registry import get_policy_class
from muzero_tune.policies.stochastic_muzero import StochasticMuZeroPolicy
from muzero_tune.replay.buffer import SampledIndices
from muzero_tune.replay.segment import GameSegment
from muzero_tune.runs.checkpoint import latest_checkpoint, load_policy

PRESET = "cartpole_stochastic_muzero"
ENV_PRESET = "stochastic_cartpole_stochastic_muzero"
SMALL = {
    "model.hidden_dim": 32, "model.latent_dim": 16, "mcts.num_simulations": 4, "learn.batch_size": 32,
    "env.collector_env_num": 4, "env.evaluator_env_num": 2, "eval.n_episodes": 2, "eval.eval_freq": 20,
    "replay.game_segment_length": 20, "max_envstep": 400, "stop_value": None, "logging.quiet": True,
    "policy.chance_space_size": 4,
}
DECISION, CHANCE = 0, 1


class TabularStochasticModel:
    """Tabular toy world: states 0..NS-1 and afterstates NS..NS+NAS-1, encoded as latent rows (id, 0.5 id).
    ``afterstate_fn`` asserts it only sees states, ``recurrent_fn`` that it only sees afterstates."""

    NS, NAS = 211, 223

    def __init__(self, *, num_actions: int, num_chances: int, seed: int):
        g = np.random.default_rng(seed)
        self.after = g.integers(0, self.NAS, size=(self.NS, num_actions))
        self.q = g.normal(size=self.NAS).astype(np.float32)
        self.chance_logits = (1.5 * g.normal(size=(self.NAS, num_chances))).astype(np.float32)
        self.next = g.integers(0, self.NS, size=(self.NAS, num_chances))
        self.reward = g.normal(size=(self.NAS, num_chances)).astype(np.float32)
        self.value = g.normal(size=self.NS).astype(np.float32)
        self.logits = (2.0 * g.normal(size=(self.NS, num_actions))).astype(np.float32)
        self.calls = {"afterstate": 0, "recurrent": 0}

    @staticmethod
    def latent(ids) -> torch.Tensor:
        s = torch.as_tensor(np.asarray(ids), dtype=torch.float32)
        return torch.stack([s, 0.5 * s], dim=1)

    def _ids(self, latent: torch.Tensor) -> np.ndarray:
        assert torch.equal(latent[:, 1], 0.5 * latent[:, 0]), "latent rows were mixed up"
        return latent[:, 0].long().numpy()

    def afterstate_fn(self, latent, actions):
        self.calls["afterstate"] += 1
        s = self._ids(latent)
        assert actions.dtype == np.int64 and (s < self.NS).all(), "afterstate_fn got an afterstate"
        a = self.after[s, actions]
        return self.latent(self.NS + a), self.q[a], self.chance_logits[a]

    def recurrent_fn(self, latent, codes):
        self.calls["recurrent"] += 1
        a = self._ids(latent) - self.NS
        assert codes.dtype == np.int64 and (a >= 0).all(), "recurrent_fn got a state"
        s = self.next[a, codes]
        return self.latent(s), self.reward[a, codes], self.value[s], self.logits[s]


@pytest.mark.parametrize("chance_selection", ["sample", "prior_weighted"])
@pytest.mark.parametrize(
    "bsz,num_actions,num_chances,sims,discount,add_noise,deterministic",
    [
        (1, 2, 3, 10, 0.997, False, True),
        (4, 2, 8, 40, 0.9, True, True),
        (3, 5, 2, 60, 1.0, True, False),
        (5, 3, 6, 30, 0.95, False, False),
    ],
)
def test_kernel_search_matches_reference(chance_selection, bsz, num_actions, num_chances, sims, discount,
                                         add_noise, deterministic):
    model = TabularStochasticModel(num_actions=num_actions, num_chances=num_chances, seed=bsz + sims)
    g = np.random.default_rng(5)
    states = g.integers(0, model.NS, size=bsz)
    legal = g.random((bsz, num_actions)) < 0.7
    legal[np.arange(bsz), g.integers(0, num_actions, size=bsz)] = True
    search = StochasticMuZeroSearch(num_actions=num_actions, num_chances=num_chances, num_simulations=sims,
                                    discount=discount, chance_selection=chance_selection)
    kw = dict(root_latent=model.latent(states), root_policy_logits=model.logits[states], legal_mask=legal,
              root_value=model.value[states], recurrent_fn=model.recurrent_fn,
              afterstate_fn=model.afterstate_fn, add_noise=add_noise, deterministic=deterministic)
    out = search.run(**kw, rng=np.random.default_rng(11))
    kernel_calls = dict(model.calls)
    visits, root_value, roots, ref_calls = reference_stochastic_search(
        **kw, num_simulations=sims, rng=np.random.default_rng(11), chance_selection=chance_selection,
        discount=discount)
    np.testing.assert_array_equal(out.visit_counts, visits)
    np.testing.assert_array_equal(out.root_value, root_value.astype(np.float32))
    assert out.visit_counts.sum() == bsz * sims and (out.visit_counts[~legal] == 0).all()
    # one call per simulation per node kind present in the batch, identical to the reference's grouping
    assert int(out.extras["network_calls"][0]) == sum(kernel_calls.values()) == ref_calls
    assert sims <= ref_calls <= 2 * sims
    # the tree alternates kinds and every chance node's visits are the sum over its outcomes (no reward)
    tree = search.tree
    for b in range(bsz):
        for n in range(sims + 1):
            for e in range(tree.width):
                c = tree.children[b, n, e]
                if c >= 0:
                    assert tree.kind[b, c] != tree.kind[b, n]
            if tree.kind[b, n] == CHANCE:
                assert tree.reward[b, n] == 0.0
                kids = tree.children[b, n][tree.children[b, n] >= 0]
                assert tree.visit_count[b, kids].sum() == tree.visit_count[b, n] - 1


def test_chance_outcomes_follow_the_chance_prior():
    """A single action leads to one afterstate with sigma = (0.1, 0.2, 0.3, 0.4): over many searches, the
    outcomes chosen at that chance node (node 1 of every tree) follow sigma; prior-weighted selection tracks
    sigma * N to within one visit."""
    sigma = np.array([0.1, 0.2, 0.3, 0.4])
    model = TabularStochasticModel(num_actions=1, num_chances=4, seed=0)
    model.chance_logits[:] = np.log(sigma).astype(np.float32)
    bsz, sims, runs = 16, 50, 30
    counts = np.zeros(4)
    search = StochasticMuZeroSearch(num_actions=1, num_chances=4, num_simulations=sims)
    rng = np.random.default_rng(2)
    states = np.arange(bsz)
    for _ in range(runs):
        search.run(root_latent=model.latent(states), root_policy_logits=model.logits[states],
                   root_value=model.value[states], legal_mask=np.ones((bsz, 1), bool),
                   recurrent_fn=model.recurrent_fn,
                   afterstate_fn=model.afterstate_fn, add_noise=False, deterministic=True, rng=rng)
        tree = search.tree
        assert (tree.kind[:bsz, 1] == CHANCE).all()
        kids = tree.children[:bsz, 1, :4]
        n = np.take_along_axis(tree.visit_count[:bsz], np.maximum(kids, 0), 1)
        counts += np.where(kids >= 0, n, 0).sum(0)  # an outcome never drawn has no child
    total = runs * bsz * (sims - 1)
    assert counts.sum() == total
    freq = counts / total
    np.testing.assert_allclose(freq, sigma, atol=0.01)  # 4+ standard errors (~0.0025 each)

    pw = StochasticMuZeroSearch(num_actions=1, num_chances=4, num_simulations=sims,
                                chance_selection="prior_weighted")
    pw.run(root_latent=model.latent(states), root_policy_logits=model.logits[states],
           root_value=model.value[states], legal_mask=np.ones((bsz, 1), bool),
           recurrent_fn=model.recurrent_fn,
           afterstate_fn=model.afterstate_fn, add_noise=False, deterministic=True, rng=rng)
    kids = pw.tree.children[:bsz, 1, :4]
    n = np.take_along_axis(pw.tree.visit_count[:bsz], kids, 1)
    assert (np.abs(n - sigma * (sims - 1)) <= 1.0).all()


# ---------------------------------------------------------------------------------------------- targets, loss


def _policy(**overrides) -> StochasticMuZeroPolicy:
    cfg = make_config(PRESET, overrides={
        "model.hidden_dim": 16, "model.latent_dim": 8, "model.value_support_size": 10,
        "model.reward_support_size": 5, "policy.chance_space_size": 4, **overrides,
    }, check_env=False)
    return StochasticMuZeroPolicy(cfg, env_spec("CartPole-v1"))


class ObsValueModel(torch.nn.Module):
    """Target model stand-in whose value of an observation is its first feature (exact two-hot logits)."""

    value_support_size = 10

    def __init__(self):
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def initial_inference(self, obs):
        two_hot = scalar_to_target(obs[:, 0].double(), support_size=self.value_support_size)
        return InitialOutput(latent=obs, value_logits=torch.log(two_hot), policy_logits=obs)


def test_make_batch_targets_hand_computed():
    g, td, k_steps = 0.9, 3, 3
    policy = _policy(**{"mcts.discount": g, "replay.td_steps": td, "replay.num_unroll_steps": k_steps})

    def segment(m, *, terminal, base):
        frames = np.stack([base + np.arange(m + 1), -np.arange(m + 1), np.zeros(m + 1), np.ones(m + 1)], 1)
        return GameSegment(
            frames=frames.astype(np.float32), actions=(np.arange(m) % 2).astype(np.int64),
            rewards=np.ones(m, np.float32),
            stats={"child_visits": np.tile([[0.25, 0.75]], (m, 1)).astype(np.float32),
                   "root_value": np.zeros(m, np.float32), "legal_mask": np.ones((m, 2), bool)},
            num_real=m, frame_stack=1, done=True, terminal_at_end=terminal)

    terminated = segment(6, terminal=True, base=0.0)  # v(o_i) = i
    truncated = segment(5, terminal=False, base=10.0)  # v(o_i) = 10 + i
    sample = SampledIndices(flat_index=np.arange(2), segments=(terminated, truncated),
                            positions=np.array([2, 3]), weights=np.ones(2, np.float32), make_time=1)
    batch = policy.make_batch(sample, target_model=ObsValueModel(), rng=np.random.default_rng(0))
    # o_t..o_{t+K} gathered for the chance encoder (clamped at M, masked past it)
    assert batch.obs.shape == (2, k_steps + 1, 4)
    np.testing.assert_array_equal(batch.obs[0, :, 0], [2, 3, 4, 5])
    np.testing.assert_array_equal(batch.obs[1, :, 0], [13, 14, 15, 15])
    np.testing.assert_array_equal(batch.obs_mask, [[1, 1, 1, 1], [1, 1, 1, 0]])
    s3 = 1 + g + g * g
    expect_value = [
        [s3 + g**3 * 5, s3, 1 + g, 1],  # terminal o_6: no bootstrap from it
        [1 + g + g * g * 15, 1 + g * 15, 0, 0],  # truncated at M = 5: bootstrap from o_5, unknown past it
    ]
    np.testing.assert_allclose(batch.target_value, expect_value, rtol=1e-5)
    np.testing.assert_array_equal(batch.value_mask, [[1, 1, 1, 1], [1, 1, 0, 0]])
    np.testing.assert_array_equal(batch.target_reward, [[1, 1, 1], [1, 1, 0]])
    np.testing.assert_array_equal(batch.reward_mask, [[1, 1, 1], [1, 1, 0]])
    np.testing.assert_array_equal(batch.policy_mask, [[1, 1, 1, 1], [1, 1, 0, 0]])
    np.testing.assert_allclose(batch.target_policy[0], np.tile([0.25, 0.75], (4, 1)))
    np.testing.assert_array_equal(batch.actions[0], [0, 1, 0])
    assert batch.extras == {}  # nothing chance-specific stored or gathered: codes come from the encoder


def _grad_norms(model, names):
    return {n: sum(float(p.grad.abs().sum()) if p.grad is not None else 0.0
                   for k, p in model.named_parameters() if k.startswith(n)) for n in names}


def _loss_batch(b: int, k_steps: int, rng: np.random.Generator):
    from muzero_tune.replay.targets import TrainBatch

    omask = np.ones((b, k_steps + 1), np.float32)
    omask[0, k_steps] = 0.0  # sample 0: its last observation is past the data
    return TrainBatch(
        obs=rng.normal(size=(b, k_steps + 1, 4)).astype(np.float32),
        actions=rng.integers(0, 2, size=(b, k_steps)), target_value=rng.normal(size=(b, k_steps + 1)),
        target_reward=np.ones((b, k_steps), np.float32),
        target_policy=np.tile([0.5, 0.5], (b, k_steps + 1, 1)).astype(np.float32),
        value_mask=np.ones((b, k_steps + 1), np.float32), reward_mask=np.ones((b, k_steps), np.float32),
        policy_mask=np.ones((b, k_steps + 1), np.float32), obs_mask=omask, weights=np.ones(b, np.float32),
        flat_index=np.arange(b), make_time=0)


def _only(overrides: dict | None = None, **weights) -> StochasticMuZeroPolicy:
    keys = ("policy.afterstate_policy_loss_weight", "policy.afterstate_value_loss_weight",
            "policy.commitment_loss_weight", "learn.policy_loss_weight", "learn.value_loss_weight",
            "learn.reward_loss_weight")
    return _policy(**{k: weights.get(k.split(".")[1], 0.0) for k in keys}, **(overrides or {}))


def test_loss_chance_codes_commitment_and_stop_gradients():
    policy = _policy()
    torch.manual_seed(0)
    model = policy.build_model()
    rng = np.random.default_rng(0)
    b, k_steps = 6, 3
    batch = _loss_batch(b, k_steps, rng)
    out = policy.compute_loss(model, batch, train_iter=0)
    assert torch.isfinite(out.loss) and out.per_sample_loss.shape == (b,) and out.priorities.shape == (b,)
    # the codes come from the encoder on consecutive real observations; commitment by hand:
    # || onehot(argmax e) - softmax(e) ||^2, masked where o_{t+k+1} is not real, / K
    with torch.no_grad():
        expect = torch.zeros(b)
        obs = torch.as_tensor(batch.obs)
        for k in range(k_steps):
            code, logits = model.encode_chance(obs[:, k], obs[:, k + 1])
            one_hot = torch.nn.functional.one_hot(logits.argmax(-1), 4).float()
            assert torch.equal(code, one_hot)  # straight-through: exactly one-hot in the forward pass
            p = torch.softmax(logits, -1)
            expect += ((one_hot - p) ** 2).sum(-1) * torch.as_tensor(batch.obs_mask[:, k + 1]) / k_steps
    assert out.metrics["train/loss_commitment"] == pytest.approx(float(expect.mean()), rel=1e-5)

    parts = ("enc_", "after_pred_", "dyn_", "repr_")
    one_step = _loss_batch(b, 1, rng)  # K = 1: sigma_0 depends on no earlier code
    # the chance-prior CE trains sigma towards the encoder's code, never the encoder (stop-gradient)
    model.zero_grad()
    _only(afterstate_policy_loss_weight=1.0).compute_loss(model, one_step, train_iter=0).loss.backward()
    g = _grad_norms(model, parts)
    assert g["enc_"] == 0.0 and g["dyn_"] == 0.0 and g["after_pred_"] > 0 and g["repr_"] > 0
    # the commitment loss trains only the encoder
    model.zero_grad()
    _only(commitment_loss_weight=1.0).compute_loss(model, batch, train_iter=0).loss.backward()
    g = _grad_norms(model, parts)
    assert g["enc_"] > 0 and g["after_pred_"] == 0.0 and g["dyn_"] == 0.0 and g["repr_"] == 0.0
    # the reward loss reaches the encoder through the straight-through code fed to the dynamics
    with torch.no_grad():  # the zero-initialised reward head would block every gradient behind it
        model.dyn_reward.weight.normal_()
    model.zero_grad()
    _only(reward_loss_weight=1.0).compute_loss(model, one_step, train_iter=0).loss.backward()
    assert _grad_norms(model, parts)["enc_"] > 0


@pytest.mark.parametrize("convention", ["whole", "per_step"])
def test_loss_scale_of_the_root_terms(convention):
    """``learn.unroll_loss_scale``: with the unrolled targets masked, the gradient of the loss is 1/K
    (``whole``, LightZero: root + K steps summed, x 1/K) or 1 (``per_step``, MuZero) x the gradient of the
    plain root policy + value loss."""
    from muzero_tune.policies.muzero import soft_cross_entropy

    b, k_steps = 6, 4
    root_scale = 1.0 / k_steps if convention == "whole" else 1.0
    policy = _only({"learn.unroll_loss_scale": convention}, policy_loss_weight=1.0, value_loss_weight=0.25)
    torch.manual_seed(0)
    model = policy.build_model()
    batch = _loss_batch(b, k_steps, np.random.default_rng(1))
    batch.value_mask[:, 1:] = 0.0
    batch.policy_mask[:, 1:] = 0.0
    batch.weights[:] = np.linspace(0.2, 1.0, b)

    def grads(loss):
        model.zero_grad(set_to_none=True)
        loss.backward()
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                          for p in model.parameters()])

    ours = grads(policy.compute_loss(model, batch, train_iter=0).loss)
    root = model.initial_inference(torch.as_tensor(batch.obs[:, 0]))
    tv0 = scalar_to_target(torch.as_tensor(batch.target_value[:, 0]).float(), support_size=10)
    plain = (soft_cross_entropy(root.policy_logits, torch.as_tensor(batch.target_policy[:, 0]))
             + 0.25 * soft_cross_entropy(root.value_logits, tv0))
    unscaled = grads((torch.as_tensor(batch.weights) * plain).mean())
    assert unscaled.norm() > 0
    torch.testing.assert_close(ours, unscaled * root_scale, rtol=1e-4, atol=1e-7)


# ---------------------------------------------------------------------------------------------- env


def test_stochastic_cartpole_env_is_registered_seeded_and_slips():
    validate_env_id(STOCHASTIC_CARTPOLE_ID)
    spec = env_spec(STOCHASTIC_CARTPOLE_ID)
    assert spec.frame_shape == (4,) and spec.num_actions == 2

    def rollout(seed):
        env = make_env(STOCHASTIC_CARTPOLE_ID, seed=seed)
        env.reset()
        out = []
        for _ in range(400):
            obs, _, term, trunc, info = env.step(1)
            out.append((info["slipped"], info["executed_action"], obs.tolist()))
            if term or trunc:
                env.reset()
        return out

    a, b = rollout(3), rollout(3)
    assert a == b  # reproducible from the seed
    slipped = np.mean([s for s, _, _ in a])
    flipped = np.mean([e == 0 for _, e, _ in a])
    assert 0.22 < slipped < 0.38 and 0.09 < flipped < 0.21  # p = 0.3 -> opposite push with p = 0.15


# ---------------------------------------------------------------------------------------------- pipelines


def _check_snapshot(run_dir: str, summary) -> None:
    path = latest_checkpoint(run_dir)
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["evaluated"]["version"] == summary.evals[-1]["train_iter"] > 0
    assert any(k.startswith("enc_") for k in ckpt["evaluated"]["weights"])
    cfg, policy, model, _ = load_policy(path)
    assert cfg.policy.type == "stochastic_muzero" and isinstance(policy, StochasticMuZeroPolicy)
    act = policy.act(model, np.zeros((2, 4), np.float32), np.ones((2, 2), bool), explore=False,
                     temperature=0.0, rng=np.random.default_rng(0))
    assert act.actions.shape == (2,) and np.isfinite(act.root_value).all()


def test_registry_and_short_sync_run_on_the_stochastic_env(tmp_path):
    from muzero_tune.pipeline.sync_driver import train_muzero_segment

    assert get_policy_class("stochastic_muzero") is StochasticMuZeroPolicy
    cfg = make_config(ENV_PRESET, overrides={**SMALL, "logging.output_dir": str(tmp_path), "exp_name": "s",
                                             "max_envstep": 160})  # fmt: skip
    assert cfg.env.env_id == STOCHASTIC_CARTPOLE_ID
    summary = train_muzero_segment(cfg)
    assert summary.stop_reason == "max_envstep" and summary.train_iter > 0 and summary.evals
    _check_snapshot(os.path.join(str(tmp_path), "s"), summary)
