"""MuZero's search rules pinned by hand-worked trees, independent of the kernels and of mcts/reference.py.

Every expected visit sequence below is derived in the comments from the published formulas (MuZero's pUCT,
Schrittwieser et al. 2020, appendix B; the root's initial inference counted as its first visit as in mctx and
LightZero), with c(N) = 1.25 + ln((N + 19653) / 19652) (pb_c_init 1.25, pb_c_base 19652; c(N) ~ 1.2500 +
N / 19652, which never decides a comparison here). The search runs in deterministic mode; running it with
S = 1, 2, ... simulations gives the root action of each simulation, since a deterministic search with S + 1
simulations repeats the first S. The trees written for the MuZero paper's rule score an unvisited child with
Q_norm 0 (``unvisited_q="min"``, the collect default); the last tests pin the evaluation default, the
parent's mean value (``"parent"``).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from muzero_tune.mcts import MuZeroSearch
from muzero_tune.mcts.stochastic import StochasticMuZeroSearch
from tests.oracles.tables import table_step


class ChainModel:
    """A world model as tables: ``next_state[s][a]``, ``reward[s][a]``, ``value[s]``, ``logits[s]``."""

    def __init__(self, next_state, reward, value, logits):
        self.next_state = np.asarray(next_state)
        self.reward = np.asarray(reward, dtype=np.float64)
        self.value = np.asarray(value, dtype=np.float64)
        self.logits = np.asarray(logits, dtype=np.float64)

    def __call__(self, latent: torch.Tensor, actions: np.ndarray):
        return table_step(self, latent, actions)


def _root_visits(model: ChainModel, sims: int, *, discount: float, legal=None, unvisited_q="min"):
    """Root visit counts [A] of a deterministic, noiseless search with ``sims`` simulations."""
    num_actions = model.logits.shape[1]
    search = MuZeroSearch(
        num_actions=num_actions, num_simulations=sims, discount=discount, unvisited_q=unvisited_q
    )
    out = search.run(
        root_latent=torch.zeros(1, 1, dtype=torch.float64),
        root_policy_logits=model.logits[:1],
        legal_mask=np.ones((1, num_actions), bool) if legal is None else legal,
        recurrent_fn=model,
        add_noise=False,
        deterministic=True,
        rng=np.random.default_rng(0),
        root_value=model.value[:1],
    )
    return out.visit_counts[0]


def _root_sequence(model: ChainModel, sims: int, *, discount: float, unvisited_q="min") -> list[int]:
    """The root action of each of the first ``sims`` simulations."""
    seq, before = [], np.zeros(model.logits.shape[1], int)
    for s in range(1, sims + 1):
        after = _root_visits(model, s, discount=discount, unvisited_q=unvisited_q)
        (changed,) = np.flatnonzero(after - before)
        seq.append(int(changed))
        before = after
    return seq


def test_first_simulation_follows_the_prior():
    """Item 1 of the search-correctness issue. 4 actions, logits [0, 0, 0, 5]: prior p3 = e^5 / (3 + e^5)
    = 0.9802, p0..2 = 0.0066. Every step: reward 1, value 20, the same logits; root value 20; discount 0.997.

    Simulation 0: the root has N = 1 (its counted first visit), so score(a) = p_a * sqrt(1) / 1 * c(1):
    1.2254 for a3 against 0.0083 -> a3 (with N = 0 every score would be 0 and a0 would win the tie).
    After it, min-max holds the root's seeded value 20, Q(a3) = 1 + 0.997 * 20 = 20.94 and the root's value
    (20 + 20.94) / 2 = 20.47, so Q_norm(a3) = 1.0 (never the raw Q 20.94).
    Later: an unvisited action scores at most 0.0066 * sqrt(25) * 1.2513 = 0.041, while a3 scores at least its
    exploration term 0.9802 * sqrt(N) * 1.25 / (1 + n3) >= 0.9802 * 1.25 / sqrt(N) >= 0.245 for N <= 25, plus
    Q_norm >= 0. So all 25 simulations go to a3: visits [0, 0, 0, 25].
    """
    model = ChainModel(next_state=[[0, 0, 0, 0]], reward=[[1.0] * 4], value=[20.0], logits=[[0, 0, 0, 5.0]])
    np.testing.assert_array_equal(_root_visits(model, 25, discount=0.997), [0, 0, 0, 25])


def test_a_reward_pulls_the_search_away_from_the_prior():
    """2 actions, discount 0.5, root prior [0.7, 0.3] (logits ln(7/3), 0), root value 0. a0 -> state A
    (reward 0, value 0); a1 -> state B (reward 2, value 0); below A and B every step has reward 0, value 0,
    uniform logits (A -> A, B -> B).

    sim 0 (N = 1): a0: 0.7 * 1 * 1.25 / 1 = 0.875; a1: 0.375 -> a0. Backup G = 0: Q(A) = 0; root value 0;
        min-max [0, 0] (span floored at value_delta_max 0.01, Q_norm(A) = 0).
    sim 1 (N = 2, sqrt 1.414): a0: 0 + 0.7 * 1.414 * 1.25 / 2 = 0.619; a1: 0.3 * 1.414 * 1.25 = 0.530 -> a0.
    sim 2 (N = 3, sqrt 1.732): a0: 0.7 * 1.732 * 1.25 / 3 = 0.505; a1: 0.3 * 1.732 * 1.25 = 0.650 -> a1.
        Backup G = 0: Q(B) = 2 + 0.5 * 0 = 2; G = 2; root value_sum 2, N 4, root value 2 / 4 = 0.5;
        min-max [0, 2].
    sim 3 (N = 4, sqrt 2): a0: Q_norm 0 + 0.7 * 2 * 1.25 / 3 = 0.583; a1: Q_norm(2) = 1 + 0.3 * 2 * 1.25 / 2
        = 1.375 -> a1. Backup (a leaf under B, value 0): Q(B) = 2 + 0.5 * 0 / 2 = 2; G = 2; root value 0.8.
    sim 4 (N = 5, sqrt 2.236): a0: 0 + 0.7 * 2.236 * 1.25 / 3 = 0.652; a1: 1 + 0.3 * 2.236 * 1.25 / 3
        = 1.280 -> a1.
    Root actions: [0, 0, 1, 1, 1].
    """
    p0 = math.log(7 / 3)
    model = ChainModel(
        next_state=[[1, 2], [1, 1], [2, 2]],
        reward=[[0.0, 2.0], [0.0, 0.0], [0.0, 0.0]],
        value=[0.0, 0.0, 0.0],
        logits=[[p0, 0.0], [0.0, 0.0], [0.0, 0.0]],
    )
    assert _root_sequence(model, 5, discount=0.5) == [0, 0, 1, 1, 1]


def test_discount_and_the_roots_value_set_the_normalisation():
    """3 actions, discount 0.9, uniform priors 1/3, root value 10 (the root's seeded min-max entry: its own
    value 10). a0 -> X (reward 0, value 10), a1 -> Y (reward 0, value 0), a2 -> Z (reward 5, value 0);
    below, each state loops to itself with reward 0 and its own value and uniform logits.

    sim 0 (N = 1): every score 1/3 * 1.25 -> tie -> a0 (lowest index). Backup G = 10: Q(X) = 0.9 * 10 = 9;
        G = 9; root value_sum 19, N 2, root value 9.5. min-max [9, 10].
    sim 1 (N = 2, sqrt 1.414): a0: Q_norm (9 - 9) / 1 = 0 + 1/3 * 1.414 * 1.25 / 2 = 0.295; a1, a2: 0 + 1/3 *
        1.414 * 1.25 = 0.589 -> tie -> a1. Backup G = 0: Q(Y) = 0; G = 0; root value_sum 19, N 3, root
        value 6.33. min-max [0, 10].
    sim 2 (N = 3, sqrt 1.732): a0: 9 / 10 = 0.9 + 1/3 * 1.732 * 1.25 / 2 = 0.361 -> 1.261; a1: 0 + 0.361;
        a2: 0 + 1/3 * 1.732 * 1.25 = 0.722 -> a0. Inside X (N = 1, children unvisited): tie -> X'. Backup
        G = 10: Q(X') = 9; G = 9; X: value_sum 19, N 2, Q(X) = 0.9 * 9.5 = 8.55; G = 8.1; root value_sum
        27.1, N 4, root value 6.775. min-max [0, 10].
    sim 3 (N = 4, sqrt 2): a0: 0.855 + 1/3 * 2 * 1.25 / 3 = 0.278 -> 1.133; a1: 0 + 1/3 * 2 * 1.25 / 2
        = 0.417; a2: 0 + 1/3 * 2 * 1.25 = 0.833 -> a0. Inside X: X' (Q 9, norm 0.9) beats its unvisited
        siblings; inside X' a tie -> X''. Backup G = 10: Q(X) = 0.9 * 27.1 / 3 = 8.13; root value_sum 34.39.
    sim 4 (N = 5, sqrt 2.236): a0: 0.813 + 1/3 * 2.236 * 1.25 / 4 = 0.233 -> 1.046; a1: 0 + 1/3 * 2.236 *
        1.25 / 2 = 0.466; a2: 1/3 * 2.236 * 1.25 = 0.932 -> a0.
    Root actions: [0, 1, 0, 0, 0]. (With the root's entry at 0.9 * its value, the reward-0 edge into the
    root, min-max would hold [8.55, 9] after sim 0: a0 would normalise to 1 and win sim 1 too.)
    """
    u = [0.0, 0.0, 0.0]
    model = ChainModel(
        next_state=[[1, 2, 3], [1, 1, 1], [2, 2, 2], [3, 3, 3]],
        reward=[[0.0, 0.0, 5.0], u, u, u],
        value=[10.0, 10.0, 0.0, 0.0],
        logits=[u, u, u, u],
    )
    assert _root_sequence(model, 5, discount=0.9) == [0, 1, 0, 0, 0]


def test_stochastic_search_first_simulation_follows_the_prior():
    """The chance-node search shares the root rule: with one chance outcome per afterstate, the tree of the
    first test gives all 25 visits to a3 there too."""
    logits = np.array([[0.0, 0.0, 0.0, 5.0]])

    def afterstate_fn(latent, actions):
        n = len(actions)
        return latent, np.full(n, 20.0), np.zeros((n, 1))

    def recurrent_fn(latent, codes):
        n = len(codes)
        return latent, np.ones(n), np.full(n, 20.0), np.repeat(logits, n, 0)

    search = StochasticMuZeroSearch(num_actions=4, num_chances=1, num_simulations=25, discount=0.997)
    out = search.run(
        root_latent=torch.zeros(1, 1),
        root_policy_logits=logits,
        legal_mask=np.ones((1, 4), bool),
        recurrent_fn=recurrent_fn,
        afterstate_fn=afterstate_fn,
        add_noise=False,
        deterministic=True,
        rng=np.random.default_rng(0),
        root_value=np.array([20.0]),
    )
    np.testing.assert_array_equal(out.visit_counts[0], [0, 0, 0, 25])


def _losing_favourite() -> ChainModel:
    """2 actions, discount 1, root prior [0.9, 0.1] (logits ln 9, 0), root value 10. a0 -> state A (reward 0,
    value 0; A -> A the same); a1 -> state B (reward 0, value 10; B -> B the same); uniform logits below."""
    return ChainModel(
        next_state=[[1, 2], [1, 1], [2, 2]],
        reward=[[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]],
        value=[10.0, 0.0, 10.0],
        logits=[[math.log(9.0), 0.0], [0.0, 0.0], [0.0, 0.0]],
    )


def test_an_unvisited_child_is_scored_with_its_parents_value():
    """The evaluation default (``unvisited_q="parent"``): an unvisited child's Q_norm is normalise(value_sum /
    visit_count) of the node it hangs from. Tree: :func:`_losing_favourite`.

    Every simulation before a1's first goes to a0 and backs up G = 0, so after simulation s - 1 the root has
    N = s + 1 visits (its counted one included), n0 = s, value_sum 10 and mean value 10 / N; min-max holds
    the root's seeded value 10, Q(A) = 0 and the root's value 10 / N: [0, 10], so Q_norm(A) = 0 and the
    unvisited a1 gets Q_norm 1 / N. With c = c(N) ~ 1.25:
        a0: 0 + 0.9 * sqrt(N) / N * c = 1.125 / sqrt(N);    a1: 1 / N + 0.1 * sqrt(N) * c.
    sim 0 (N = 1): min-max holds only the seeded 10 (span floored at value_delta_max), so a1's Q_norm is
        normalise(10) = 0: a0 1.125 against 0.125 -> a0.
    sim 4 (N = 5): 0.503 against 0.2 + 0.280 = 0.480 -> a0.
    sim 5 (N = 6): 0.459 against 0.167 + 0.306 = 0.473 -> a1.
    Under the MuZero paper's rule (Q_norm 0) a1 scores only 0.1 * sqrt(N) * c and waits until N = 10.
    """
    model = _losing_favourite()
    assert _root_sequence(model, 6, discount=1.0, unvisited_q="parent") == [0, 0, 0, 0, 0, 1]
    assert _root_sequence(model, 6, discount=1.0, unvisited_q="min") == [0, 0, 0, 0, 0, 0]


def test_the_parent_rule_holds_below_the_root():
    """The same tree one level down: a root whose only legal action leads (reward 0, discount 1) to X, the
    old root (value 10, prior [0.9, 0.1] over A and B).

    sim 0 expands X (G = 10). At simulation s >= 1 the descent passes X with N(X) = s visits, mean 10 / s;
    min-max holds the root's seeded 10, Q(X), Q(A) = 0 and the root's value 20 / (s + 1) <= 10: [0, 10] as
    above.
    So X at N(X) = N chooses as the root did at N: its first B comes at N(X) = 6, simulation 6 (7 in all),
    and under the min rule not before N(X) = 10.
    """
    base = _losing_favourite()
    model = ChainModel(
        next_state=[[1, 1], [2, 3], [2, 2], [3, 3]],
        reward=[[0.0, 0.0]] * 4,
        value=[10.0, 10.0, 0.0, 10.0],
        logits=[[0.0, 0.0], base.logits[0].tolist(), [0.0, 0.0], [0.0, 0.0]],
    )
    for rule, b_visits in (("parent", 1), ("min", 0)):
        search = MuZeroSearch(num_actions=2, num_simulations=7, discount=1.0, unvisited_q=rule)
        search.run(
            root_latent=torch.zeros(1, 1, dtype=torch.float64),
            root_policy_logits=model.logits[:1],
            legal_mask=np.array([[True, False]]),
            recurrent_fn=model,
            add_noise=False,
            deterministic=True,
            rng=np.random.default_rng(0),
            root_value=model.value[:1],
        )
        t = search.tree
        x = t.children[0, 0, 0]
        b = t.children[0, x, 1]
        assert (t.visit_count[0, b] if b >= 0 else 0) == b_visits, rule


def test_evaluation_uses_eval_unvisited_q_and_collection_mcts_unvisited_q():
    """A policy's searches without root noise (evaluation) take ``eval.unvisited_q``; those with it (collect,
    reanalyze) take ``mcts.unvisited_q``: each knob changes only its own searches."""
    from muzero_tune.config import make_config
    from muzero_tune.envs.factory import env_spec
    from muzero_tune.policies.muzero import MuZeroPolicy

    obs = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)  # [B, 4] CartPole observations
    mask = np.ones((32, 2), bool)

    def visits(explore: bool, **overrides) -> np.ndarray:
        cfg = make_config("cartpole_muzero", overrides={"seed": 0, **overrides})
        policy = MuZeroPolicy(cfg, env_spec("CartPole-v1"))
        torch.manual_seed(0)
        model = policy.build_model().eval()
        with torch.no_grad():  # a confident prior and spread values, so that the two rules part
            model.pred_policy.weight.mul_(30.0)
            for p in (*model.pred_value.parameters(), *model.dyn_reward.parameters()):
                p.normal_(0.0, 0.3)
        out = policy.act(model, obs, mask, explore=explore, temperature=1.0, rng=np.random.default_rng(1))
        return out.step_stats["child_visits"]  # [B, A]

    greedy_parent = visits(False, **{"eval.unvisited_q": "parent"})
    greedy_min = visits(False, **{"eval.unvisited_q": "min"})
    assert not np.array_equal(greedy_parent, greedy_min)
    np.testing.assert_array_equal(greedy_parent, visits(False, **{"mcts.unvisited_q": "min"}))
    both = {"eval.unvisited_q": "min", "mcts.unvisited_q": "parent"}
    np.testing.assert_array_equal(greedy_min, visits(False, **both))
    collect_min = visits(True, **{"eval.unvisited_q": "parent"})
    np.testing.assert_array_equal(collect_min, visits(True, **{"eval.unvisited_q": "min"}))
    assert not np.array_equal(collect_min, visits(True, **{"mcts.unvisited_q": "parent"}))
