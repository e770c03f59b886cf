"""Sampled MuZero's batched search: kernels against the plain-Python reference (continuous and discrete,
masks, noise, random ties), discrete K = |A| with the density prior against the MuZero search, masks with
fewer legal actions than K, the tanh-Gaussian density against torch, and reproducibility from the seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from muzero_tune.mcts import MuZeroSearch
from muzero_tune.mcts.reference import reference_sampled_search
from muzero_tune.mcts.sampled import SampledSearch


class SmoothModel:
    """A deterministic world model over latents [B, 2] float64 and actions [B, D] in [-1, 1] (continuous)
    or [B] ids (discrete): every output is a fixed function of (latent, action), so two searches making the
    same choices see the same numbers."""

    def __init__(self, *, continuous: bool, action_dim: int = 1, num_actions: int = 4):
        self.continuous, self.d, self.a = continuous, action_dim, num_actions

    def params(self, latent: np.ndarray) -> np.ndarray:
        x = latent[:, :1]
        if self.continuous:
            mu = 0.8 * np.sin(3.0 * x + np.arange(self.d))
            log_sigma = -0.5 + 0.5 * np.cos(2.0 * x + np.arange(self.d))
            return np.concatenate([mu, log_sigma], axis=1)  # [B, 2D]
        return 1.5 * np.sin(2.0 * x + 1.3 * np.arange(self.a))  # [B, A]

    def value(self, latent: np.ndarray) -> np.ndarray:
        return np.cos(latent[:, 0] - 0.5 * latent[:, 1])

    def __call__(self, latent: torch.Tensor, actions: np.ndarray):
        z = latent.numpy()
        a = actions.astype(np.float64).reshape(len(z), -1).sum(axis=1)
        if not self.continuous:
            a = np.cos(a)
        nxt = np.stack([np.tanh(z[:, 0] + 0.7 * a), 0.5 * z[:, 1] + 0.3 * np.sin(a)], axis=1)
        reward = np.sin(z[:, 0] + 2.0 * a)
        return torch.as_tensor(nxt), reward, self.value(nxt), self.params(nxt)


def _roots(rng, bsz):
    z = rng.normal(size=(bsz, 2))
    return z, torch.as_tensor(z)


def _run(model, search, z, legal, *, add_noise, deterministic, seed):
    return search.run(
        root_latent=torch.as_tensor(z),
        root_policy_logits=model.params(z),
        legal_mask=legal,
        recurrent_fn=model,
        add_noise=add_noise,
        deterministic=deterministic,
        rng=np.random.default_rng(seed),
        root_value=model.value(z),
    )


@pytest.mark.parametrize(
    "action_dim,num_samples,sims,prior", [(1, 5, 20, "uniform"), (2, 8, 30, "density"), (3, 4, 12, "density")]
)
@pytest.mark.parametrize("add_noise,deterministic", [(False, True), (True, False)])
def test_continuous_kernels_match_reference(action_dim, num_samples, sims, prior, add_noise, deterministic):
    model = SmoothModel(continuous=True, action_dim=action_dim)
    z, _ = _roots(np.random.default_rng(action_dim), 4)
    search = SampledSearch(
        num_samples=num_samples,
        action_kind="continuous",
        action_dim=action_dim,
        num_simulations=sims,
        sampled_prior=prior,
        discount=0.97,
    )
    out = _run(model, search, z, None, add_noise=add_noise, deterministic=deterministic, seed=3)
    ref = reference_sampled_search(
        root_latent=torch.as_tensor(z),
        root_policy_logits=model.params(z),
        legal_mask=None,
        recurrent_fn=model,
        num_simulations=sims,
        num_samples=num_samples,
        action_kind="continuous",
        action_dim=action_dim,
        add_noise=add_noise,
        deterministic=deterministic,
        rng=np.random.default_rng(3),
        root_value=model.value(z),
        sampled_prior=prior,
        discount=0.97,
    )
    np.testing.assert_array_equal(out.visit_counts, ref.visit_counts)
    np.testing.assert_array_equal(out.root_value, ref.root_value)
    np.testing.assert_array_equal(out.root_prior, ref.root_prior)
    np.testing.assert_array_equal(out.extras["sampled_actions"], ref.extras["sampled_actions"])
    acts = out.extras["sampled_actions"]
    assert acts.shape == (4, num_samples, action_dim) and acts.dtype == np.float32
    assert (np.abs(acts) <= 1.0).all() and out.extras["sampled_mask"].all()
    assert (out.visit_counts.sum(1) == sims).all()
    if prior == "uniform" and not add_noise:
        np.testing.assert_allclose(out.root_prior, 1.0 / num_samples, rtol=1e-6)


@pytest.mark.parametrize(
    "num_actions,num_samples,sims,prior",
    [(6, 3, 25, "uniform"), (5, 5, 30, "density"), (9, 4, 40, "density")],
)
@pytest.mark.parametrize("add_noise,deterministic", [(False, True), (True, False)])
def test_discrete_kernels_match_reference_with_masks(
    num_actions, num_samples, sims, prior, add_noise, deterministic
):
    model = SmoothModel(continuous=False, num_actions=num_actions)
    rng = np.random.default_rng(num_actions)
    z, _ = _roots(rng, 5)
    legal = rng.random((5, num_actions)) < 0.6
    legal[:, 0] = True
    legal[1] = True
    legal[2] = False
    legal[2, [1, 3]] = True  # fewer legal actions than K (when K > 2)
    search = SampledSearch(
        num_samples=num_samples,
        action_kind="discrete",
        num_actions=num_actions,
        num_simulations=sims,
        sampled_prior=prior,
        discount=0.95,
    )
    out = _run(model, search, z, legal, add_noise=add_noise, deterministic=deterministic, seed=9)
    ref = reference_sampled_search(
        root_latent=torch.as_tensor(z),
        root_policy_logits=model.params(z),
        legal_mask=legal,
        recurrent_fn=model,
        num_simulations=sims,
        num_samples=num_samples,
        action_kind="discrete",
        add_noise=add_noise,
        deterministic=deterministic,
        rng=np.random.default_rng(9),
        root_value=model.value(z),
        sampled_prior=prior,
        discount=0.95,
    )
    np.testing.assert_array_equal(out.visit_counts, ref.visit_counts)
    np.testing.assert_array_equal(out.root_value, ref.root_value)
    np.testing.assert_array_equal(out.extras["sampled_actions"], ref.extras["sampled_actions"])
    np.testing.assert_array_equal(out.extras["sampled_mask"], ref.extras["sampled_mask"])
    acts, mask = out.extras["sampled_actions"], out.extras["sampled_mask"]
    for b in range(5):
        valid = acts[b][mask[b]]
        assert len(set(valid.tolist())) == len(valid) == min(num_samples, legal[b].sum())  # distinct
        assert legal[b, valid].all()  # only legal actions at the root
        assert (out.visit_counts[b][~mask[b]] == 0).all()


@pytest.mark.parametrize("add_noise", [False, True])
def test_discrete_all_actions_with_the_default_prior_is_the_muzero_search(add_noise):
    """K = |A| and the default prior (for discrete actions: pi renormalised over the K distinct samples):
    the sampled search is MuZero's search (slots are the actions in ascending order), so the visit counts
    agree exactly, masks included."""
    num_actions, sims, bsz = 6, 40, 6
    model = SmoothModel(continuous=False, num_actions=num_actions)
    rng = np.random.default_rng(4)
    z, _ = _roots(rng, bsz)
    legal = np.ones((bsz, num_actions), bool)
    if not add_noise:  # the noise is drawn per slot, which is per action only when every action is legal
        legal = rng.random((bsz, num_actions)) < 0.6
        legal[:, 2] = True
    sampled = SampledSearch(
        num_samples=num_actions,
        action_kind="discrete",
        num_actions=num_actions,
        num_simulations=sims,
        discount=0.9,
    )
    assert sampled.sampled_prior == "density"
    muzero = MuZeroSearch(num_actions=num_actions, num_simulations=sims, discount=0.9)
    out = _run(model, sampled, z, legal, add_noise=add_noise, deterministic=True, seed=2)
    ref = _run(model, muzero, z, legal, add_noise=add_noise, deterministic=True, seed=2)
    by_action = np.zeros_like(ref.visit_counts)
    for b in range(bsz):
        slots = out.extras["sampled_mask"][b]
        by_action[b, out.extras["sampled_actions"][b][slots]] = out.visit_counts[b][slots]
    np.testing.assert_array_equal(by_action, ref.visit_counts)
    np.testing.assert_array_equal(out.root_value, ref.root_value)


def test_the_discrete_default_prior_keeps_the_policy_where_one_over_k_throws_it_away():
    """K = |A| = 2, root logits [3, -3], both actions worth the same: MuZero's search follows the prior,
    [10, 0]. The default sampled search does the same; a 1/K prior over the two distinct samples spreads
    the visits evenly instead ([5, 5]), whatever the policy says."""

    def flat(latent, actions):
        n = len(actions)
        return latent, np.zeros(n), np.zeros(n), np.array([[3.0, -3.0]] * n)

    def visits(search) -> np.ndarray:
        out = search.run(
            root_latent=torch.zeros(1, 1),
            root_policy_logits=np.array([[3.0, -3.0]]),
            legal_mask=np.ones((1, 2), bool),
            recurrent_fn=flat,
            add_noise=False,
            deterministic=True,
            rng=np.random.default_rng(0),
            root_value=np.zeros(1),
        )
        order = np.argsort(out.extras["sampled_actions"][0]) if out.extras else np.arange(2)
        return out.visit_counts[0, order]

    knobs = dict(num_simulations=10, discount=0.997)
    muzero = visits(MuZeroSearch(num_actions=2, **knobs))
    np.testing.assert_array_equal(muzero, [10, 0])
    default = SampledSearch(num_samples=2, action_kind="discrete", num_actions=2, **knobs)
    np.testing.assert_array_equal(visits(default), muzero)
    one_over_k = SampledSearch(
        num_samples=2, action_kind="discrete", num_actions=2, sampled_prior="uniform", **knobs
    )
    np.testing.assert_array_equal(visits(one_over_k), [5, 5])
    continuous = SampledSearch(num_samples=4, action_kind="continuous", num_simulations=4)
    assert continuous.sampled_prior == "uniform"  # independent draws: the paper's 1/K


def test_density_prior_is_the_tanh_gaussian_density():
    """With one simulation and no noise the root prior is the softmax of the slots' log-densities; they
    must equal torch's TransformedDistribution(Normal, TanhTransform) up to its epsilon-free correction."""
    model = SmoothModel(continuous=True, action_dim=2)
    z, _ = _roots(np.random.default_rng(0), 3)
    search = SampledSearch(
        num_samples=6, action_kind="continuous", action_dim=2, num_simulations=1, sampled_prior="density"
    )
    out = _run(model, search, z, None, add_noise=False, deterministic=True, seed=0)
    params = torch.as_tensor(model.params(z))
    mu, log_sigma = params[:, :2], params[:, 2:].clamp(-20, 2)
    dist = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mu[:, None], log_sigma.exp()[:, None]),
        [torch.distributions.TanhTransform(cache_size=1)],
    )
    a = torch.as_tensor(search.tree.node_actions[:3, 0])  # float64 actions, [B, K, D]
    logp = dist.log_prob(a.clamp(-1 + 1e-12, 1 - 1e-12)).sum(-1)  # [B, K]
    expected = torch.softmax(logp, dim=1).numpy()
    np.testing.assert_allclose(out.root_prior, expected, rtol=2e-4, atol=1e-6)


def test_reproducible_from_the_seed_and_random_across_seeds():
    model = SmoothModel(continuous=True, action_dim=1)
    z, _ = _roots(np.random.default_rng(1), 4)
    search = SampledSearch(num_samples=5, action_kind="continuous", num_simulations=15)
    a = _run(model, search, z, None, add_noise=True, deterministic=False, seed=7)
    b = _run(model, search, z, None, add_noise=True, deterministic=False, seed=7)
    c = _run(model, search, z, None, add_noise=True, deterministic=False, seed=8)
    np.testing.assert_array_equal(a.visit_counts, b.visit_counts)
    np.testing.assert_array_equal(a.extras["sampled_actions"], b.extras["sampled_actions"])
    assert not np.array_equal(a.extras["sampled_actions"], c.extras["sampled_actions"])


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="num_samples"):
        SampledSearch(num_samples=5, action_kind="discrete", num_actions=3, num_simulations=4)
    with pytest.raises(ValueError, match="sampled_prior"):
        SampledSearch(num_samples=2, action_kind="continuous", num_simulations=4, sampled_prior="beta")
    search = SampledSearch(num_samples=2, action_kind="continuous", action_dim=2, num_simulations=4)
    with pytest.raises(ValueError, match="root_policy_logits"):
        search.run(
            root_latent=torch.zeros(1, 2),
            root_policy_logits=np.zeros((1, 2)),
            legal_mask=None,
            recurrent_fn=None,
            add_noise=False,
            deterministic=True,
            rng=np.random.default_rng(0),
            root_value=np.zeros(1),
        )
