"""Root visit counts of MuZero's search on one small tree, per reward scale: does it follow its values?

Three actions, root prior logits [2, 0, 0], a constant reward r per step with values consistent with it
(V = r / (1 - discount), discount 0.997), action 2 worth +0.5 in Q over the others, no root noise,
deterministic tie-breaks. A search whose Q normalisation is right gives action 2 the most visits for every r.

    python scripts/tools/search_scale.py                      # both Q transforms, unvisited_q=min
    python scripts/tools/search_scale.py --unvisited-q parent
"""

from __future__ import annotations

import argparse
import inspect

import numpy as np
import torch

from muzero_tune.mcts import MuZeroSearch

REWARDS = (5.0, 1.0, 0.01, 0.0, -0.01, -1.0, -5.0)
DISCOUNT = 0.997


def visits(r: float, sims: int, *, unvisited_q: str, q_transform: str | None) -> list[int]:
    """Root visit counts [3] on the tree of the module docstring."""
    v = r / (1.0 - DISCOUNT)

    def recurrent_fn(latent: torch.Tensor, actions: np.ndarray):
        s = latent[:, 0].long().numpy()
        bonus = np.where((s == 0) & (actions == 2), 0.5, 0.0)
        ns = np.where(s == 0, np.where(actions == 2, 2, 1), s)
        n = len(actions)
        return torch.as_tensor(ns, dtype=torch.float64)[:, None], r + bonus, np.full(n, v), np.zeros((n, 3))

    knobs = dict(num_actions=3, num_simulations=sims, discount=DISCOUNT, unvisited_q=unvisited_q)
    if q_transform is not None:
        knobs["q_transform"] = q_transform
    out = MuZeroSearch(**knobs).run(
        root_latent=torch.zeros(1, 1, dtype=torch.float64),
        root_policy_logits=np.array([[2.0, 0.0, 0.0]]),
        legal_mask=np.ones((1, 3), bool),
        recurrent_fn=recurrent_fn,
        add_noise=False,
        deterministic=True,
        rng=np.random.default_rng(0),
        root_value=np.array([v]),
    )
    return out.visit_counts[0].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--unvisited-q", default="min", choices=("min", "parent"))
    args = parser.parse_args()
    has_transform = "q_transform" in inspect.signature(MuZeroSearch.__init__).parameters
    transforms = ("tree_min_max", "parent_and_siblings") if has_transform else (None,)
    for q_transform in transforms:
        print(f"q_transform={q_transform or 'tree_min_max'} unvisited_q={args.unvisited_q}")
        print("| reward per step | visits at 25 simulations | at 50 |")
        print("|---|---|---|")
        for r in REWARDS:
            row = [visits(r, s, unvisited_q=args.unvisited_q, q_transform=q_transform) for s in (25, 50)]
            print(f"| {r:+g} | {row[0]} | {row[1]} |")
        print()


if __name__ == "__main__":
    main()
