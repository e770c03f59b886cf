"""Every pUCT search follows its values on every reward scale: checks written from the task, independent of
the kernels and of mcts/reference.py.

The pUCT types search with three classes: ``MuZeroSearch`` (muzero, muzero_context, muzero_rnn_full_obs,
efficientzero, unizero), ``StochasticMuZeroSearch`` (stochastic_muzero) and ``SampledSearch``
(sampled_muzero, sampled_efficientzero, sampled_unizero). Each is checked under both Q transforms and both
rules for unvisited children where it takes them.

* The best action wins. Three actions, root prior logits [2, 0, 0], a constant reward r per step, values
  consistent with it (V = r / (1 - discount)), and action 2 worth +0.5 in Q over the others (its first
  reward is r + 0.5). Whatever r (positive, zero or negative, large or small), action 2 gets the most visits
  at 25 and at 50 simulations without root noise. A min-max span that holds the Q of an imaginary reward-0
  edge into the root (discount * V) fails this for every r > 0: that entry sits r below every child, the
  first child visited normalises to 1 and the others to 0, so the search never leaves the prior's choice.
* Invariance. Adding a constant c to every reward (and c / (1 - discount) to every value) or multiplying
  every reward and value by k > 0 leaves the visit counts unchanged, on random world models and batches.
  The span floor ``value_delta_max`` is an absolute scale, so these run with it at 0.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from muzero_tune.mcts import MuZeroSearch
from muzero_tune.mcts.sampled import SampledSearch
from muzero_tune.mcts.stochastic import StochasticMuZeroSearch
from tests.oracles.tables import table_step

DISCOUNT = 0.997
REWARDS = (5.0, 1.0, 0.01, 0.0, -0.01, -1.0, -5.0)
TRANSFORMS = ("tree_min_max", "parent_and_siblings")
UNVISITED = ("min", "parent")
SEARCHES = ("muzero", "stochastic", "sampled_uniform", "sampled_density")


class BetterThird:
    """The table of the module docstring as a world model. States: 0 the root, 1 after actions 0 and 1,
    2 after action 2; 1 and 2 loop to themselves under every action. Latents are [n, 1] state ids."""

    def __init__(self, r: float, *, discount: float = DISCOUNT):
        self.r = r
        self.v = r / (1.0 - discount)
        self.discount = discount
        self.root_logits = np.array([[2.0, 0.0, 0.0]])

    def step(self, latent: torch.Tensor, actions: np.ndarray):
        """(next state [n, 1], reward [n]) of every row."""
        s = latent[:, 0].long().numpy()
        bonus = np.where((s == 0) & (actions == 2), 0.5, 0.0)
        ns = np.where(s == 0, np.where(actions == 2, 2, 1), s)
        return torch.as_tensor(ns, dtype=torch.float64)[:, None], self.r + bonus

    def recurrent_fn(self, latent: torch.Tensor, actions: np.ndarray):
        nxt, reward = self.step(latent, actions)
        n = len(actions)
        return nxt, reward, np.full(n, self.v), np.zeros((n, 3))

    # Stochastic MuZero: a decision edge leads to an afterstate (Q(s, a), one chance outcome), whose chance
    # edge pays the reward and leads to the next state. The afterstate keeps the action: latent [n, 2].
    def afterstate_fn(self, latent: torch.Tensor, actions: np.ndarray):
        nxt, reward = self.step(latent, actions)
        q = reward + self.discount * self.v
        afterstate = torch.cat([latent[:, :1], torch.as_tensor(actions, dtype=torch.float64)[:, None]], 1)
        return afterstate, q, np.zeros((len(actions), 1))

    def chance_fn(self, afterstate: torch.Tensor, codes: np.ndarray):
        nxt, reward = self.step(afterstate[:, :1], afterstate[:, 1].long().numpy())
        n = len(codes)
        nxt = torch.cat([nxt, torch.zeros(n, 1, dtype=torch.float64)], 1)
        return nxt, reward, np.full(n, self.v), np.zeros((n, 3))


def _visits(search_name: str, model: BetterThird, sims: int, q_transform: str, unvisited: str) -> np.ndarray:
    knobs = dict(
        num_simulations=sims, discount=model.discount, q_transform=q_transform, unvisited_q=unvisited
    )
    run = dict(
        root_policy_logits=model.root_logits,
        legal_mask=np.ones((1, 3), bool),
        add_noise=False,
        deterministic=True,
        rng=np.random.default_rng(0),
        root_value=np.array([model.v]),
    )
    if search_name == "muzero":
        search = MuZeroSearch(num_actions=3, **knobs)
        out = search.run(
            root_latent=torch.zeros(1, 1, dtype=torch.float64), recurrent_fn=model.recurrent_fn, **run
        )
    elif search_name == "stochastic":
        search = StochasticMuZeroSearch(num_actions=3, num_chances=1, **knobs)
        out = search.run(
            root_latent=torch.zeros(1, 2, dtype=torch.float64),
            recurrent_fn=model.chance_fn,
            afterstate_fn=model.afterstate_fn,
            **run,
        )
    else:
        prior = search_name.removeprefix("sampled_")
        search = SampledSearch(
            num_samples=3, action_kind="discrete", num_actions=3, sampled_prior=prior, **knobs
        )
        out = search.run(
            root_latent=torch.zeros(1, 1, dtype=torch.float64), recurrent_fn=model.recurrent_fn, **run
        )
        order = np.argsort(out.extras["sampled_actions"][0])  # slots -> actions 0, 1, 2
        return out.visit_counts[0, order]
    return out.visit_counts[0]


@pytest.mark.parametrize("search_name", SEARCHES)
@pytest.mark.parametrize("q_transform", TRANSFORMS)
@pytest.mark.parametrize("unvisited", UNVISITED)
def test_the_best_action_gets_the_most_visits_on_every_reward_scale(search_name, q_transform, unvisited):
    failures = []
    for r in REWARDS:
        for sims in (25, 50):
            visits = _visits(search_name, BetterThird(r), sims, q_transform, unvisited)
            assert visits.sum() == sims
            if not visits[2] > max(visits[0], visits[1]):
                failures.append((r, sims, visits.tolist()))
    assert not failures, (
        f"(reward per step, simulations, visits) where action 2 is not the most visited: {failures}"
    )


# ------------------------------------------------------------------------------------------- invariance


class RandomTables:
    """A random world model over ``num_states`` states, transformed: rewards ``k * (reward + c)`` and values
    ``k * (value + c / (1 - discount))``. Stochastic MuZero's afterstates get Q-consistent values and two
    chance outcomes each."""

    def __init__(self, *, num_actions: int, seed: int, c: float = 0.0, k: float = 1.0, num_states: int = 61):
        g = np.random.default_rng(seed)
        self.num_actions = num_actions
        shift = c / (1.0 - DISCOUNT)
        self.next_state = g.integers(0, num_states, size=(num_states, num_actions))
        self.reward = k * (g.normal(size=(num_states, num_actions)) + c)
        self.value = k * (3.0 * g.normal(size=num_states) + shift)
        self.logits = 1.5 * g.normal(size=(num_states, num_actions))
        # afterstates (s, a): their value and two chance outcomes with their own next states and rewards
        self.as_value = k * (g.normal(size=(num_states, num_actions)) + shift)
        self.chance_logits = g.normal(size=(num_states, num_actions, 2))
        self.chance_next = g.integers(0, num_states, size=(num_states, num_actions, 2))
        self.chance_reward = k * (g.normal(size=(num_states, num_actions, 2)) + c)

    def recurrent_fn(self, latent, actions):
        return table_step(self, latent, actions)

    def afterstate_fn(self, latent, actions):
        s = latent[:, 0].long().numpy()
        afterstate = torch.as_tensor(np.stack([s, actions], 1), dtype=torch.float64)
        return afterstate, self.as_value[s, actions], self.chance_logits[s, actions]

    def chance_fn(self, afterstate, codes):
        s, a = afterstate[:, 0].long().numpy(), afterstate[:, 1].long().numpy()
        ns = self.chance_next[s, a, codes]
        nxt = torch.as_tensor(np.stack([ns, np.zeros_like(ns)], 1), dtype=torch.float64)
        return nxt, self.chance_reward[s, a, codes], self.value[ns], self.logits[ns]


class RandomContinuous:
    """A random continuous-action world model (latent [n, 4], action [n, 2] in [-1, 1]), transformed like
    :class:`RandomTables`."""

    def __init__(self, *, seed: int, c: float = 0.0, k: float = 1.0):
        g = np.random.default_rng(seed)
        self.w = g.normal(size=(4, 4)) / 2
        self.u = g.normal(size=(2, 4))
        self.w_r, self.u_r = g.normal(size=4), g.normal(size=2)
        self.w_v = 3.0 * g.normal(size=4)
        self.w_p = g.normal(size=(4, 4)) / 2
        self.c, self.k = c, k

    def params(self, z: np.ndarray) -> np.ndarray:
        return np.tanh(z @ self.w_p) * np.array([1.0, 1.0, 0.5, 0.5]) - np.array([0.0, 0.0, 0.7, 0.7])

    def value(self, z: np.ndarray) -> np.ndarray:
        return self.k * (z @ self.w_v + self.c / (1.0 - DISCOUNT))

    def recurrent_fn(self, latent, actions):
        z = latent.numpy()
        nxt = np.tanh(z @ self.w + actions.astype(np.float64) @ self.u)
        reward = self.k * (z @ self.w_r + actions.astype(np.float64) @ self.u_r + self.c)
        return torch.as_tensor(nxt), reward, self.value(nxt), self.params(nxt)


def _random_visits(search_name: str, *, seed: int, c: float, k: float, q_transform: str, unvisited: str):
    knobs = dict(
        num_simulations=40,
        discount=DISCOUNT,
        q_transform=q_transform,
        unvisited_q=unvisited,
        value_delta_max=0.0,
    )
    batch = 6
    g = np.random.default_rng(seed + 1)
    states = g.integers(0, 61, size=batch)
    run = dict(add_noise=False, deterministic=True, rng=np.random.default_rng(seed))
    if search_name == "sampled_continuous":
        model = RandomContinuous(seed=seed, c=c, k=k)
        z = np.random.default_rng(seed + 2).normal(size=(batch, 4))
        search = SampledSearch(num_samples=5, action_kind="continuous", action_dim=2, **knobs)
        out = search.run(
            root_latent=torch.as_tensor(z),
            root_policy_logits=model.params(z),
            legal_mask=None,
            recurrent_fn=model.recurrent_fn,
            root_value=model.value(z),
            **run,
        )
        return out.visit_counts
    model = RandomTables(num_actions=5, seed=seed, c=c, k=k)
    legal = g.random((batch, 5)) < 0.7
    legal[:, 0] = True
    run.update(root_policy_logits=model.logits[states], legal_mask=legal, root_value=model.value[states])
    if search_name == "stochastic":
        search = StochasticMuZeroSearch(num_actions=5, num_chances=2, **knobs)
        out = search.run(
            root_latent=torch.as_tensor(np.stack([states, np.zeros_like(states)], 1), dtype=torch.float64),
            recurrent_fn=model.chance_fn,
            afterstate_fn=model.afterstate_fn,
            **run,
        )
        return out.visit_counts
    latent = torch.as_tensor(states, dtype=torch.float64)[:, None]
    if search_name == "muzero":
        search = MuZeroSearch(num_actions=5, **knobs)
    else:
        search = SampledSearch(num_samples=3, action_kind="discrete", num_actions=5, **knobs)
    return search.run(root_latent=latent, recurrent_fn=model.recurrent_fn, **run).visit_counts


@pytest.mark.parametrize("search_name", ("muzero", "stochastic", "sampled_discrete", "sampled_continuous"))
@pytest.mark.parametrize("q_transform", TRANSFORMS)
@pytest.mark.parametrize("unvisited", UNVISITED)
def test_shifting_or_scaling_rewards_and_values_leaves_the_visits_unchanged(
    search_name, q_transform, unvisited
):
    for seed in (0, 1, 2):
        base = _random_visits(
            search_name, seed=seed, c=0.0, k=1.0, q_transform=q_transform, unvisited=unvisited
        )
        # the searches spread their visits (a degenerate all-on-one-action tree would prove little)
        assert (base > 0).sum() > base.shape[0]
        for c, k in ((1.0, 1.0), (-2.5, 1.0), (0.0, 0.01), (0.0, 40.0), (3.0, 0.5)):
            moved = _random_visits(
                search_name, seed=seed, c=c, k=k, q_transform=q_transform, unvisited=unvisited
            )
            np.testing.assert_array_equal(moved, base, err_msg=f"seed {seed}, c {c}, k {k}")
