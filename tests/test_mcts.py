"""Tests for the batched MuZero search: kernels vs the plain-Python reference, masking, determinism,
root visit accounting and action selection. Uses a deterministic tabular toy world model (no network)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from muzero_tune.mcts import MuZeroSearch, SearchOutput, select_action
from muzero_tune.mcts.reference import reference_search


class TabularModel:
    """Deterministic toy dynamics over ``num_states`` states, tables drawn from ``seed``.

    latent: [B, 2] float32 = (state id, 0.5 * state id); the second channel lets the model assert that the
    search gathered whole latent rows. Transition, reward [S, A], value [S] and logits [S, A] are table
    look-ups, so any search that makes the same choices sees the same numbers.
    """

    def __init__(
        self,
        *,
        num_actions: int,
        seed: int,
        num_states: int = 509,
        value_scale: float = 1.0,
        zero: bool = False,
    ) -> None:
        g = np.random.default_rng(seed)
        self.num_actions = num_actions
        self.next_state = g.integers(0, num_states, size=(num_states, num_actions))  # [S, A]
        scale = 0.0 if zero else 1.0
        self.reward = (scale * value_scale * g.normal(size=(num_states, num_actions))).astype(np.float32)
        self.value = (scale * value_scale * g.normal(size=num_states)).astype(np.float32)  # [S]
        self.logits = (scale * 2.0 * g.normal(size=(num_states, num_actions))).astype(np.float32)  # [S, A]
        self.calls = 0

    def latent(self, states: np.ndarray) -> torch.Tensor:
        s = torch.as_tensor(np.asarray(states), dtype=torch.float32)
        return torch.stack([s, 0.5 * s], dim=1)  # [B, 2]

    def root_logits(self, states: np.ndarray) -> np.ndarray:
        return self.logits[np.asarray(states)]  # [B, A]

    def root_value(self, states: np.ndarray) -> np.ndarray:
        return self.value[np.asarray(states)]  # [B]

    def __call__(self, latent: torch.Tensor, actions: np.ndarray):
        assert actions.dtype == np.int64 and actions.shape == (latent.shape[0],)
        assert torch.equal(latent[:, 1], 0.5 * latent[:, 0]), "latent rows were mixed up"
        self.calls += 1
        s = latent[:, 0].long().numpy()
        ns = self.next_state[s, actions]
        return self.latent(ns), self.reward[s, actions], self.value[ns], self.logits[ns]


def _legal_masks(rng: np.random.Generator, batch_size: int, num_actions: int) -> np.ndarray:
    mask = rng.random((batch_size, num_actions)) < 0.6  # [B, A]
    mask[np.arange(batch_size), rng.integers(0, num_actions, size=batch_size)] = True
    mask[0] = True  # keep one fully legal row
    return mask


def _run_both(model, search, states, legal, *, add_noise, seed, discount, num_simulations, unvisited_q="min"):
    out = search.run(
        root_latent=model.latent(states),
        root_policy_logits=model.root_logits(states),
        root_value=model.root_value(states),
        legal_mask=legal,
        recurrent_fn=model,
        add_noise=add_noise,
        deterministic=True,
        rng=np.random.default_rng(seed),
    )
    ref = reference_search(
        root_latent=model.latent(states),
        root_policy_logits=model.root_logits(states),
        root_value=model.root_value(states),
        legal_mask=legal,
        recurrent_fn=model,
        num_simulations=num_simulations,
        add_noise=add_noise,
        deterministic=True,
        rng=np.random.default_rng(seed),
        discount=discount,
        unvisited_q=unvisited_q,
    )
    return out, ref


def _eval_run(search, model, states, legal, *, seed) -> SearchOutput:
    """Evaluation-mode search: no noise, deterministic tie-break."""
    return search.run(
        root_latent=model.latent(states),
        root_policy_logits=model.root_logits(states),
        root_value=model.root_value(states),
        legal_mask=legal,
        recurrent_fn=model,
        add_noise=False,
        deterministic=True,
        rng=np.random.default_rng(seed),
    )


def _assert_same(out: SearchOutput, ref: SearchOutput) -> None:
    np.testing.assert_array_equal(out.visit_counts, ref.visit_counts)
    np.testing.assert_array_equal(out.root_prior, ref.root_prior)
    np.testing.assert_array_equal(out.root_value, ref.root_value)
    np.testing.assert_array_equal(out.visit_distribution, ref.visit_distribution)


@pytest.mark.parametrize(
    "batch_size,num_actions,num_simulations,discount,value_scale",
    [
        (1, 2, 8, 0.997, 1.0),
        (3, 2, 40, 0.9, 1.0),
        (4, 18, 50, 0.997, 1.0),
        (2, 18, 120, 0.95, 1.0),
        (6, 5, 30, 0.8, 1e-3),  # tiny value range: exercises the value_delta_max floor
        (5, 7, 64, 1.0, 10.0),
    ],
)
@pytest.mark.parametrize("add_noise", [False, True])
@pytest.mark.parametrize("unvisited_q", ["parent", "min"])
def test_kernel_search_matches_reference(
    batch_size, num_actions, num_simulations, discount, value_scale, add_noise, unvisited_q
):
    model = TabularModel(
        num_actions=num_actions, seed=100 * batch_size + num_actions, value_scale=value_scale
    )
    rng = np.random.default_rng(7)
    states = rng.integers(0, 509, size=batch_size)
    legal = _legal_masks(rng, batch_size, num_actions)
    search = MuZeroSearch(
        num_actions=num_actions, num_simulations=num_simulations, discount=discount, unvisited_q=unvisited_q
    )
    out, ref = _run_both(
        model,
        search,
        states,
        legal,
        add_noise=add_noise,
        seed=11,
        discount=discount,
        num_simulations=num_simulations,
        unvisited_q=unvisited_q,
    )
    _assert_same(out, ref)
    assert model.calls == 2 * num_simulations  # one batched call per simulation in each search
    assert out.visit_counts.dtype == np.int32 and out.visit_counts.shape == (batch_size, num_actions)
    assert out.visit_distribution.dtype == np.float32 and out.root_value.dtype == np.float32
    assert out.root_prior.dtype == np.float32 and dict(out.extras) == {}
    assert np.all(out.visit_counts[~legal] == 0)
    # Priors: a distribution over the legal actions; noise must actually move them.
    assert np.all(out.root_prior[~legal] == 0.0)
    np.testing.assert_allclose(out.root_prior.sum(axis=1), 1.0, rtol=1e-6)
    if add_noise:
        clean = _eval_run(search, model, states, legal, seed=0)
        assert np.abs(out.root_prior - clean.root_prior).max() > 1e-3


def test_reused_search_grows_and_still_matches_reference():
    num_actions, num_simulations = 6, 25
    model = TabularModel(num_actions=num_actions, seed=3)
    search = MuZeroSearch(num_actions=num_actions, num_simulations=num_simulations, discount=0.99)
    rng = np.random.default_rng(0)
    for batch_size in (2, 9, 3, 9):  # grow, then reuse a larger buffer with a smaller batch
        states = rng.integers(0, 509, size=batch_size)
        legal = _legal_masks(rng, batch_size, num_actions)
        out, ref = _run_both(
            model,
            search,
            states,
            legal,
            add_noise=True,
            seed=batch_size,
            discount=0.99,
            num_simulations=num_simulations,
        )
        _assert_same(out, ref)
    assert search.tree.batch_capacity == 9
    assert search.tree.num_reallocations == 2  # 1 -> 2 trees, then 2 -> 9; never again


def test_deterministic_tie_break_takes_lowest_index():
    # All-zero model: every Q is 0 and priors are uniform, so pUCT prefers the least-visited child and every
    # choice is an exact tie among the least visited: round-robin from the lowest legal index.
    model = TabularModel(num_actions=3, seed=0, zero=True)
    search = MuZeroSearch(num_actions=3, num_simulations=4)
    kwargs = dict(
        root_latent=model.latent([0]),
        root_policy_logits=model.root_logits([0]),
        root_value=model.root_value([0]),
        recurrent_fn=model,
        add_noise=False,
        deterministic=True,
        rng=np.random.default_rng(0),
    )
    out = search.run(legal_mask=np.ones((1, 3), dtype=bool), **kwargs)
    np.testing.assert_array_equal(out.visit_counts, [[2, 1, 1]])
    search5 = MuZeroSearch(num_actions=3, num_simulations=5)
    out = search5.run(legal_mask=np.array([[False, True, True]]), **kwargs)
    np.testing.assert_array_equal(out.visit_counts, [[0, 3, 2]])


def test_random_tie_break_is_reproducible_and_random():
    model = TabularModel(num_actions=4, seed=0, zero=True)
    legal = np.ones((3, 4), dtype=bool)
    states = np.zeros(3, dtype=np.int64)

    def run(seed: int, num_simulations: int) -> np.ndarray:
        search = MuZeroSearch(num_actions=4, num_simulations=num_simulations)
        return search.run(
            root_latent=model.latent(states),
            root_policy_logits=model.root_logits(states),
            root_value=model.root_value(states),
            legal_mask=legal,
            recurrent_fn=model,
            add_noise=False,
            deterministic=False,
            rng=np.random.default_rng(seed),
        ).visit_counts

    np.testing.assert_array_equal(run(5, 9), run(5, 9))  # same Generator seed -> same result
    counts = run(5, 9)
    assert np.all(counts.max(axis=1) - counts.min(axis=1) <= 1)  # still least-visited-first
    first_actions = {int(np.argmax(run(seed, 1)[b])) for seed in range(10) for b in range(3)}
    assert len(first_actions) >= 3  # ties are broken at random, not always towards action 0


def test_batch_elements_are_independent():
    num_actions, num_simulations = 18, 40
    model = TabularModel(num_actions=num_actions, seed=21)
    rng = np.random.default_rng(1)
    states = rng.integers(0, 509, size=5)
    legal = _legal_masks(rng, 5, num_actions)
    legal[2] = False
    legal[2, 17] = True  # a single legal action
    search = MuZeroSearch(num_actions=num_actions, num_simulations=num_simulations)

    def run(idx) -> SearchOutput:
        return _eval_run(search, model, states[idx], legal[idx], seed=0)

    mixed = run(np.arange(5))
    assert np.all(mixed.visit_counts[~legal] == 0)
    assert mixed.visit_counts[2, 17] == num_simulations
    for b in range(5):
        alone = run(np.array([b]))
        np.testing.assert_array_equal(alone.visit_counts[0], mixed.visit_counts[b])
        np.testing.assert_array_equal(alone.root_value[0], mixed.root_value[b])


def test_evaluation_search_is_deterministic():
    model = TabularModel(num_actions=9, seed=4)
    states = np.arange(6)
    legal = _legal_masks(np.random.default_rng(2), 6, 9)
    outputs = []
    for seed in range(3):  # different Generators must not matter without noise / random ties
        search = MuZeroSearch(num_actions=9, num_simulations=30)
        for _ in range(2):  # the same object reused
            outputs.append(_eval_run(search, model, states, legal, seed=seed))
    for out in outputs[1:]:
        np.testing.assert_array_equal(out.visit_counts, outputs[0].visit_counts)
        np.testing.assert_array_equal(out.root_value, outputs[0].root_value)


@pytest.mark.parametrize("deterministic,add_noise", [(True, False), (False, True)])
def test_root_visits_sum_to_num_simulations(deterministic, add_noise):
    # Root rule: the initial inference is the root's first visit, so children's visits == num_simulations
    # and the root has one more.
    num_actions, num_simulations, batch_size = 5, 37, 4
    model = TabularModel(num_actions=num_actions, seed=8)
    search = MuZeroSearch(num_actions=num_actions, num_simulations=num_simulations)
    legal = _legal_masks(np.random.default_rng(3), batch_size, num_actions)
    states = np.arange(batch_size)
    out = search.run(
        root_latent=model.latent(states),
        root_policy_logits=model.root_logits(states),
        root_value=model.root_value(states),
        legal_mask=legal,
        recurrent_fn=model,
        add_noise=add_noise,
        deterministic=deterministic,
        rng=np.random.default_rng(0),
    )
    np.testing.assert_array_equal(out.visit_counts.sum(axis=1), num_simulations)
    np.testing.assert_array_equal(search.tree.visit_count[:batch_size, 0], num_simulations + 1)
    np.testing.assert_allclose(out.visit_distribution.sum(axis=1), 1.0, rtol=1e-6)
    assert np.all(out.visit_distribution[~legal] == 0.0)


def test_invalid_inputs_are_rejected():
    model = TabularModel(num_actions=3, seed=0)
    search = MuZeroSearch(num_actions=3, num_simulations=2)
    legal = np.array([[True, False, False], [False, False, False]])
    with pytest.raises(ValueError, match="legal"):
        search.run(
            root_latent=model.latent([0, 1]),
            root_policy_logits=model.root_logits([0, 1]),
            root_value=np.zeros(2),
            legal_mask=legal,
            recurrent_fn=model,
            add_noise=False,
            deterministic=True,
            rng=np.random.default_rng(0),
        )
    with pytest.raises(ValueError, match="root_policy_logits"):
        search.run(
            root_latent=model.latent([0, 1]),
            root_policy_logits=np.zeros((2, 4), np.float32),
            root_value=np.zeros(2),
            legal_mask=np.ones((2, 3), bool),
            recurrent_fn=model,
            add_noise=False,
            deterministic=True,
            rng=np.random.default_rng(0),
        )


def test_select_action_argmax_and_sampling_frequencies():
    rng = np.random.default_rng(0)
    counts = np.array([[1, 3, 0, 6], [5, 5, 2, 0]], dtype=np.int32)
    for kwargs in (dict(temperature=0.0, deterministic=False), dict(temperature=1.0, deterministic=True)):
        np.testing.assert_array_equal(select_action(counts, rng=rng, **kwargs), [3, 0])  # ties -> lowest

    num_draws = 40_000
    row = np.array([[1, 3, 0, 6]], dtype=np.int32)
    for temperature in (1.0, 0.5, 2.0):
        actions = select_action(
            np.repeat(row, num_draws, axis=0), temperature=temperature, rng=rng, deterministic=False
        )
        assert actions.dtype == np.int64 and actions.shape == (num_draws,)
        freq = np.bincount(actions, minlength=4) / num_draws
        expected = row[0] ** (1.0 / temperature)
        expected = expected / expected.sum()
        assert freq[2] == 0.0  # zero visits -> never sampled
        np.testing.assert_allclose(freq, expected, atol=0.012)


_ACT_EVERY_SEARCH = """
import numpy as np
from muzero_tune.config import make_config
from muzero_tune.pipeline.core import make_policy
for preset in ("cartpole_muzero", "cartpole_stochastic_muzero", "cartpole_sampled_muzero",
               "cartpole_gumbel_muzero"):
    policy, spec = make_policy(make_config(preset, overrides={"mcts.num_simulations": 4}))
    obs = np.zeros((3, *spec.obs_shape), dtype=np.float32)
    policy.act(policy.build_model().eval(), obs, np.ones((3, spec.num_actions), dtype=bool), explore=True,
               temperature=1.0, rng=np.random.default_rng(0))
"""


def test_search_kernels_load_from_numba_cache_in_a_new_process():
    """Every search kernel a policy calls is loaded from numba's on-disk cache by the next process, not
    compiled again: a new collector or evaluator actor would otherwise pay the compile (1.2 s for one
    kernel whose cache key changed with every process) before its first collect."""
    env = {**os.environ, "NUMBA_DEBUG_CACHE": "1"}
    runs = [
        subprocess.run([sys.executable, "-c", _ACT_EVERY_SEARCH], env=env, capture_output=True, text=True,
                       timeout=300, check=True).stdout  # fmt: skip
        for _ in range(2)
    ]
    second = runs[1].splitlines()
    assert any("data loaded" in line and "mcts" in line for line in second)
    assert [line for line in second if "data saved" in line] == []
