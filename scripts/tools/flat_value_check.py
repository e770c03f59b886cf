"""Does the search see any difference between actions? Train a preset briefly, then probe the trained net.

Trains ``--preset`` (sync pipeline, ``--set`` overrides applied) for ``--env-steps`` env steps, prints every
evaluation's reward_mean, policy entropy and value prediction / target means, and then, on states from
random play of the same env, prints:

- the spread of the predicted value over the states (a net that has learned nothing state-specific
  predicts one constant);
- the spread of Q(s, a) = r(s, a) + discount * v(s') over the actions, per state, against the smallest
  span the search's min-max normalisation can have (the root's recorded Q, discount * v(root), differs from
  its children's Q by about (1 - discount) * |v| = |r| on a constant-reward task): a spread far below that
  span cannot move the visits away from the prior;
- the entropy of the root visit distributions (the policy targets) with collection noise, and which action
  the greedy evaluation search picks.

    python scripts/tools/flat_value_check.py --preset cartpole_muzero --set env.env_id=Acrobot-v1 \
        --env-steps 6000
    python scripts/tools/flat_value_check.py --preset acrobot_muzero --env-steps 12000
    # no training
    python scripts/tools/flat_value_check.py --checkpoint runs/acrobot_muzero/ckpt/eval_000005.pt
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from muzero_tune.config import from_flat_dict, make_config, parse_set_args, validate
from muzero_tune.envs.factory import make_env
from muzero_tune.models import logits_to_scalar
from muzero_tune.pipeline.core import make_policy
from muzero_tune.pipeline.sync_driver import train_muzero_segment
from muzero_tune.runs.checkpoint import load_checkpoint
from muzero_tune.runs.reporter import MemoryReporter


def random_play_states(env_id: str, *, episodes: int, seed: int, every: int) -> np.ndarray:
    """Observations [N, *obs_shape] float32: every ``every``-th step of ``episodes`` random episodes."""
    env = make_env(env_id, seed=seed)
    rng = np.random.default_rng(seed)
    n_actions = int(env.action_space.n)
    out = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        done, t = False, 0
        while not done:
            if t % every == 0:
                out.append(np.asarray(obs, dtype=np.float32))
            obs, _, term, trunc, _ = env.step(int(rng.integers(n_actions)))
            done, t = term or trunc, t + 1
    return np.stack(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="cartpole_muzero")
    p.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    p.add_argument("--env-steps", type=int, default=6000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", default="runs/flat_value_check")
    p.add_argument("--checkpoint", default=None, help="probe this eval checkpoint's snapshot (no training)")
    args = p.parse_args(argv)
    if args.checkpoint:
        ckpt = load_checkpoint(args.checkpoint)
        cfg = validate(from_flat_dict(ckpt["config"]))
        weights, metrics = ckpt["evaluated"]["weights"], ckpt["evaluated"]["metrics"]
        evals = [metrics]
    else:
        cfg = make_config(args.preset, overrides={
            "seed": args.seed, "max_envstep": args.env_steps, "stop_value": None, "logging.quiet": True,
            "logging.output_dir": args.output_dir, **parse_set_args(args.overrides)})
        rep = MemoryReporter()
        train_muzero_segment(cfg, reporter=rep)
        weights, evals = rep.snapshots[-1]["weights"], rep.evals
    keys = ("reward_mean", "train/policy_entropy", "train/value_pred_mean", "train/value_target_mean")
    for e in evals:
        print(f"env_steps {e['envstep']:>6}: " + "  ".join(f"{k} {e.get(k, float('nan')):.3f}" for k in keys))

    policy, spec = make_policy(cfg)
    model = policy.build_model()
    model.load_state_dict(weights)
    model.eval()
    obs = random_play_states(cfg.env.env_id, episodes=6, seed=100, every=5)
    n, a_n, gamma = len(obs), spec.num_actions, cfg.mcts.discount
    with torch.no_grad():
        root = model.initial_inference(torch.as_tensor(obs))
        v = logits_to_scalar(root.value_logits.float(), support_size=model.value_support_size).numpy()
        q = np.zeros((n, a_n))
        for a in range(a_n):
            rec = model.recurrent_inference(root.latent, torch.full((n,), a, dtype=torch.long))
            r = logits_to_scalar(rec.reward_logits.float(), support_size=model.reward_support_size).numpy()
            q[:, a] = r + gamma * logits_to_scalar(rec.value_logits.float(),
                                                   support_size=model.value_support_size).numpy()
    spread = q.max(1) - q.min(1)
    root_gap = np.abs(gamma * v - q.mean(1))  # |root's recorded Q - its children's|: a floor on the span
    print(f"\n{n} states from random play of {cfg.env.env_id} "
          f"(net after {evals[-1]['envstep']} env steps)")
    print(f"value: min {v.min():.2f}  median {np.median(v):.2f}  max {v.max():.2f}  std {v.std():.3f}")
    print(f"Q spread over the {a_n} actions: median {np.median(spread):.4f}  "
          f"p90 {np.quantile(spread, 0.9):.4f}; "
          f"|root Q - child Q| (min-max span floor): median {np.median(root_gap):.3f}")
    legal = np.ones((n, a_n), dtype=bool)
    noisy, _ = policy.search_observations(model, obs, legal, add_noise=True, deterministic=False,
                                          rng=np.random.default_rng(0))
    vd = noisy.visit_distribution
    ent = -(vd * np.log(vd + 1e-12)).sum(1)
    print(f"visit-target entropy (collect search): mean {ent.mean():.4f} "
          f"(uniform: ln {a_n} = {np.log(a_n):.4f}); largest visit share median {np.median(vd.max(1)):.3f}")
    greedy, _ = policy.search_observations(model, obs, legal, add_noise=False, deterministic=True,
                                           rng=np.random.default_rng(0))
    hist = np.bincount(greedy.visit_counts.argmax(1), minlength=a_n)
    print(f"greedy (evaluation) action per state: {hist.tolist()} (counts of actions 0..{a_n - 1})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
