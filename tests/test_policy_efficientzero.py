"""EfficientZero policy: value-prefix search against a plain-Python reference, value-prefix targets on a
hand-computed case, the LSTM reset in the loss, the conv variant. Its sync and async runs: its Tune trials in
tests/test_every_policy_type.py, every checkpoint re-evaluated exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from muzero_tune.config import make_config
from muzero_tune.envs.factory import env_spec
from muzero_tune.mcts.reference import reference_search
from muzero_tune.models.efficientzero_net import ConvEfficientZeroNet, ValuePrefixOutput
from muzero_tune.models.support import logits_to_scalar_np, scalar_to_target
from muzero_tune.policies.efficientzero import (
    VALUE_PREFIX_KEY,
    EfficientZeroPolicy,
    pack_search_state,
    value_prefix_targets,
)
from muzero_tune.policies.muzero import MuZeroPolicy, soft_cross_entropy
from muzero_tune.policies.registry import get_policy_class
from muzero_tune.replay.buffer import SampledIndices
from muzero_tune.replay.segment import GameSegment


def tiny_policy(**overrides) -> tuple[EfficientZeroPolicy, torch.nn.Module]:
    """A policy on CartPole with a small network whose (normally zero-initialised) heads are random, so
    value prefixes, values and priors all differ between nodes."""
    cfg = make_config("cartpole_efficientzero", overrides={
        "model.hidden_dim": 16, "model.latent_dim": 8, "policy.lstm_hidden_size": 8,
        "model.value_support_size": 5, "model.reward_support_size": 5, **overrides,
    }, check_env=False)
    policy = EfficientZeroPolicy(cfg, env_spec("CartPole-v1"))
    torch.manual_seed(3)
    model = policy.build_model().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.7 * torch.randn_like(p))
    return policy, model


# ---------------------------------------------------------------------------------------------- search


class ReferenceEZ:
    """The EfficientZero search rules written out per node, for ``reference_search``.

    The reference tree stores one node id per node as its "latent"; the node's latent, LSTM state (h, c),
    depth and value prefix live here in plain records. A step from a parent at depth d starts from a zero
    LSTM state and prefix 0 when d % horizon == 0, else from the parent's; the child's reward is its prefix
    minus that starting prefix.
    """

    def __init__(self, model, horizon: int, root_latent: torch.Tensor):
        self.model, self.horizon = model, horizon
        zeros = torch.zeros(model.lstm_hidden_size)
        self.nodes = [dict(latent=root_latent[b], h=zeros, c=zeros, depth=0, prefix=np.float32(0.0),
                           reward=None, parent=None) for b in range(root_latent.shape[0])]
        self.created: list[list[int]] = []  # node ids created per simulation, batch order

    def root_ids(self) -> torch.Tensor:
        return torch.arange(len(self.nodes), dtype=torch.float32).view(-1, 1)

    def __call__(self, ids: torch.Tensor, actions: np.ndarray):
        parents = [self.nodes[int(i)] for i in ids[:, 0]]
        starts = [p["depth"] % self.horizon == 0 for p in parents]
        zeros = torch.zeros(self.model.lstm_hidden_size)
        h = torch.stack([zeros if s else p["h"] for p, s in zip(parents, starts)])
        c = torch.stack([zeros if s else p["c"] for p, s in zip(parents, starts)])
        with torch.no_grad():
            out = self.model.recurrent_inference(
                torch.stack([p["latent"] for p in parents]), torch.as_tensor(actions), (h, c)
            )
        prefix = logits_to_scalar_np(out.reward_logits.numpy(), support_size=self.model.reward_support_size)
        value = logits_to_scalar_np(out.value_logits.numpy(), support_size=self.model.value_support_size)
        new_ids, rewards = [], []
        for b, (p, s) in enumerate(zip(parents, starts)):
            reward = prefix[b] if s else prefix[b] - p["prefix"]
            rewards.append(reward)
            new_ids.append(len(self.nodes))
            self.nodes.append(dict(latent=out.latent[b], h=out.lstm_state[0][b], c=out.lstm_state[1][b],
                                   depth=p["depth"] + 1, prefix=prefix[b], reward=reward, parent=p))
        self.created.append(new_ids)
        ids_out = torch.tensor(new_ids, dtype=torch.float32).view(-1, 1)
        return ids_out, np.array(rewards, dtype=np.float32), value, out.policy_logits.numpy()


def test_search_matches_reference_with_value_prefix_rewards_and_horizon_resets():
    sims, horizon = 24, 2
    policy, model = tiny_policy(**{"mcts.num_simulations": sims, "policy.lstm_horizon_len": horizon})
    obs = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    legal = np.array([[True, True], [True, True], [False, True]])
    out, _ = policy.search_observations(model, obs, legal, add_noise=True, deterministic=True,
                                          rng=np.random.default_rng(5))

    with torch.no_grad():
        root = model.initial_inference(torch.as_tensor(obs))
    ref_ez = ReferenceEZ(model, horizon, root.latent)
    m = policy.cfg.mcts
    ref = reference_search(
        root_latent=ref_ez.root_ids(), root_policy_logits=root.policy_logits.numpy(), legal_mask=legal,
        recurrent_fn=ref_ez, num_simulations=sims, add_noise=True, deterministic=True,
        rng=np.random.default_rng(5),
        root_value=logits_to_scalar_np(root.value_logits.numpy(), support_size=model.value_support_size),
        pb_c_base=m.pb_c_base, pb_c_init=m.pb_c_init, discount=m.discount,
        dirichlet_alpha=m.root_dirichlet_alpha, noise_weight=m.root_noise_weight,
        value_delta_max=m.value_delta_max,
    )
    np.testing.assert_array_equal(out.visit_counts, ref.visit_counts)
    np.testing.assert_allclose(out.root_value, ref.root_value, rtol=1e-5, atol=1e-6)

    # every node's reward in the real tree is the reference's prefix difference (or prefix after a reset)
    tree_reward = policy.search.tree.reward[:3, 1 : sims + 1]  # node s + 1 was expanded at simulation s
    ref_reward = np.array([[ref_ez.nodes[i]["reward"] for i in row] for row in ref_ez.created]).T
    # the search's step runs on the host kernel (models/host.py), the reference calls the network eagerly:
    # float32 rounding of prefixes up to ~6, and of their differences, apart
    np.testing.assert_allclose(tree_reward, ref_reward, rtol=0, atol=1e-5)
    nodes = ref_ez.nodes[3:]
    after_reset = [n for n in nodes if n["parent"]["depth"] % horizon == 0 and n["depth"] > 1]
    inside = [n for n in nodes if n["parent"]["depth"] % horizon != 0]
    assert after_reset and inside and max(n["depth"] for n in nodes) > 2 * horizon
    for n in after_reset:
        assert n["reward"] == n["prefix"] and n["reward"] != n["prefix"] - n["parent"]["prefix"]
    for n in inside:
        assert n["reward"] == n["prefix"] - n["parent"]["prefix"]
    visits = policy.reanalyze(model, obs, legal, np.random.default_rng(0))  # the same search, with noise
    assert visits.shape == (3, 2) and visits[2, 0] == 0 and visits.sum(1) == pytest.approx([1.0] * 3)


def test_recurrent_fn_resets_lstm_and_prefix_at_the_horizon():
    policy, model = tiny_policy(**{"policy.lstm_horizon_len": 3})
    fn = policy.recurrent_fn(model)
    g = torch.Generator().manual_seed(1)
    latent, h, c = (torch.rand(2, n, generator=g) for n in (8, 8, 8))
    depth = torch.tensor([3.0, 4.0])  # row 0 is a reset node (3 % 3 == 0), row 1 is not
    parent_prefix = torch.tensor([7.0, 0.75])
    actions = np.array([1, 0], dtype=np.int64)
    with torch.no_grad():  # the search calls it under no_grad
        child, reward, value, logits = fn(pack_search_state(latent, (h, c), depth, parent_prefix), actions)
        exp0 = model.recurrent_inference(latent[:1], torch.tensor([1]), None)  # zero state
        exp1 = model.recurrent_inference(latent[1:], torch.tensor([0]), (h[1:], c[1:]))
    assert isinstance(exp0, ValuePrefixOutput)
    p0, p1 = (logits_to_scalar_np(e.reward_logits.numpy(), support_size=5)[0] for e in (exp0, exp1))
    assert reward[0] == pytest.approx(p0, abs=1e-5)  # after a reset: the child's prefix itself
    assert reward[1] == pytest.approx(p1 - 0.75, abs=1e-5)  # inside a horizon: the prefix difference
    assert child.shape == (2, 8 + 2 * 8 + 2)
    np.testing.assert_allclose(child[:, -2].numpy(), [4.0, 5.0])  # depth + 1
    np.testing.assert_allclose(child[:, -1].numpy(), [p0, p1], atol=1e-5)  # the child's own prefix
    np.testing.assert_allclose(child[0, 8:16].numpy(), exp0.lstm_state[0][0].numpy(), atol=1e-5)
    np.testing.assert_allclose(child[1, 16:24].numpy(), exp1.lstm_state[1][0].numpy(), atol=1e-5)
    np.testing.assert_allclose(logits[1], exp1.policy_logits[0].numpy(), atol=1e-5)


# ---------------------------------------------------------------------------------------------- targets


def segment(*, m: int, num_real: int, terminal: bool) -> GameSegment:
    """rewards r_i = i + 1; CartPole-shaped observations."""
    return GameSegment(
        frames=np.tile(np.arange(m + 1, dtype=np.float32)[:, None], (1, 4)) / 10.0,
        actions=(np.arange(m) % 2).astype(np.int64),
        rewards=(np.arange(m) + 1).astype(np.float32),
        stats={"child_visits": np.full((m, 2), 0.5, dtype=np.float32), "legal_mask": np.ones((m, 2), bool)},
        num_real=num_real, frame_stack=1, done=terminal, terminal_at_end=terminal,
    )


def test_make_batch_value_prefix_targets_hand_computed():
    # K = 5, horizon 2: prefixes cover unroll steps {1, 2}, {3, 4}, {5} of *each* sample
    policy, model = tiny_policy(
        **{"replay.num_unroll_steps": 5, "replay.td_steps": 3, "policy.lstm_horizon_len": 2}
    )
    deep = segment(m=10, num_real=4, terminal=False)
    terminated = segment(m=5, num_real=5, terminal=True)
    open_end = segment(m=7, num_real=4, terminal=False)  # 4 real + 3 padding, data ends at 7
    segs, starts = [deep, terminated, open_end, deep], [1, 2, 3, 0]
    sample = SampledIndices(flat_index=np.arange(4), segments=tuple(segs), positions=np.array(starts),
                            weights=np.ones(4, dtype=np.float32), make_time=1)
    batch = policy.make_batch(sample, target_model=model, rng=np.random.default_rng(0))
    expected = np.array([
        [2, 2 + 3, 4, 4 + 5, 6],  # r_1.. r_5
        [3, 3 + 4, 5, 5 + 0, 0],  # r_2, r_3, r_4 then absorbing zeros: held inside the horizon, 0 after it
        [4, 4 + 5, 6, 6 + 7, 0],  # r_3.. r_6, step 5 past the data (masked)
        [1, 1 + 2, 3, 3 + 4, 5],  # t = 0: same reset phase although it is the 4th sample
    ], dtype=np.float32)
    np.testing.assert_array_equal(batch.extras[VALUE_PREFIX_KEY], expected)
    np.testing.assert_array_equal(batch.reward_mask, [[1] * 5, [1] * 5, [1, 1, 1, 1, 0], [1] * 5])
    # everything else is MuZero's batch
    plain = MuZeroPolicy.make_batch(policy, sample, target_model=model, rng=np.random.default_rng(0))
    for name in ("target_value", "target_reward", "value_mask", "target_policy", "actions", "obs"):
        np.testing.assert_array_equal(getattr(batch, name), getattr(plain, name))
    # the pure helper with another horizon
    np.testing.assert_array_equal(value_prefix_targets(np.array([[1, 2, 4, 8, 16]]), 3), [[1, 3, 7, 8, 24]])


def test_loss_resets_lstm_state_every_horizon_steps():
    """With horizon 1 every unroll step starts from a zero LSTM state: the loss must equal the loss computed
    with explicit per-step zero states (and differ from horizon 5, where state is carried)."""
    p1, model = tiny_policy(**{"policy.lstm_horizon_len": 1, "replay.num_unroll_steps": 3})
    p5, _ = tiny_policy(**{"policy.lstm_horizon_len": 5, "replay.num_unroll_steps": 3})
    seg = segment(m=10, num_real=8, terminal=False)
    sample = SampledIndices(flat_index=np.arange(2), segments=(seg, seg), positions=np.array([0, 2]),
                            weights=np.ones(2, dtype=np.float32), make_time=1)
    b1 = p1.make_batch(sample, target_model=model, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(b1.extras[VALUE_PREFIX_KEY], b1.target_reward)  # horizon 1: per-step
    with torch.no_grad():
        l1 = p1.compute_loss(model, b1, train_iter=0)
        l5 = p5.compute_loss(model, b1, train_iter=0)  # same targets, state carried across steps
        latent = model.initial_inference(torch.as_tensor(b1.obs[:, 0])).latent
        ce = []
        for k in range(3):
            rec = model.recurrent_inference(latent, torch.as_tensor(b1.actions[:, k]), None)
            latent = rec.latent
            ce.append(rec.reward_logits)
    assert np.isfinite(l1.metrics["train/loss_total"]) and l1.per_sample_loss.shape == (2,)
    assert l1.metrics["train/loss_reward"] != pytest.approx(l5.metrics["train/loss_reward"])
    tr = torch.as_tensor(b1.extras[VALUE_PREFIX_KEY])
    manual = sum(soft_cross_entropy(ce[k], scalar_to_target(tr[:, k], support_size=5)) for k in range(3)) / 3
    assert l1.metrics["train/loss_reward"] == pytest.approx(float(manual.mean()), rel=1e-5)


def test_conv_variant_searches_and_trains():
    from muzero_tune.envs.spec import EnvSpec
    from muzero_tune.replay.targets import TrainBatch

    spec = EnvSpec(env_id="ALE/Fake-v5", frame_shape=(1, 16, 16), frame_dtype="uint8", frame_stack=2,
                   num_actions=3, action_kind="discrete")
    cfg = make_config("cartpole_efficientzero", overrides={
        "model.kind": "conv", "model.num_channels": 4, "model.value_support_size": 3,
        "model.reward_support_size": 3, "model.projection_dim": 8, "policy.lstm_hidden_size": 6,
        "policy.lstm_horizon_len": 2, "mcts.num_simulations": 6, "replay.num_unroll_steps": 3,
        "learn.ssl_loss_weight": 2.0}, check_env=False)
    policy = EfficientZeroPolicy(cfg, spec)
    torch.manual_seed(0)
    model = policy.build_model()
    assert isinstance(model, ConvEfficientZeroNet) and not hasattr(model, "reward_head")
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256, size=(2, 2, 16, 16), dtype=np.uint8)
    act = policy.act(model, obs, np.ones((2, 3), bool), explore=True, temperature=1.0, rng=rng)
    assert act.step_stats["child_visits"].sum(1) == pytest.approx([1.0, 1.0])
    b, k = 4, 3
    batch = TrainBatch(
        obs=rng.integers(0, 256, size=(b, k + 1, 2, 16, 16), dtype=np.uint8),
        actions=rng.integers(0, 3, size=(b, k)), target_value=np.ones((b, k + 1), np.float32),
        target_reward=np.ones((b, k), np.float32), target_policy=np.full((b, k + 1, 3), 1 / 3, np.float32),
        value_mask=np.ones((b, k + 1), np.float32), reward_mask=np.ones((b, k), np.float32),
        policy_mask=np.ones((b, k + 1), np.float32), obs_mask=np.ones((b, k + 1), np.float32),
        weights=np.ones(b, np.float32), flat_index=np.arange(b), make_time=0,
        extras={VALUE_PREFIX_KEY: value_prefix_targets(np.ones((b, k), np.float32), 2)},
    )
    out = policy.compute_loss(model.train(), batch, train_iter=0)
    out.loss.backward()
    assert out.metrics["train/loss_ssl"] != 0 and out.metrics["train/loss_reward"] > 0  # SSL is on
    # the prefix head's last layer starts at zero, so at step 0 only it (not the LSTM) gets a gradient
    assert model.value_prefix_head[-1].weight.grad.abs().sum() > 0 and model.lstm.weight_hh.grad is not None


# ---------------------------------------------------------------------------------------------- registry


def test_registered():
    """The registry's ``efficientzero`` is this policy (its sync and async runs: the type's Tune trials in
    tests/test_every_policy_type.py, every checkpoint re-evaluated exactly)."""
    assert get_policy_class("efficientzero") is EfficientZeroPolicy
