"""Integration: a short sync CartPole run, its checkpoints, resume, the CLI, and no Ray; a short sync
Pendulum run with a test-only continuous policy (continuous actions through the whole pipeline)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from muzero_tune.cli import main as cli_main
from muzero_tune.config import make_config
from muzero_tune.pipeline.core import EVAL_SEED_OFFSET
from muzero_tune.pipeline.evaluator import Evaluator
from muzero_tune.pipeline.sync_driver import train_muzero_segment
from muzero_tune.policies import registry
from muzero_tune.policies.base import ActOutput, LossOutput, Policy
from muzero_tune.replay.targets import make_batch
from muzero_tune.runs.checkpoint import latest_checkpoint, load_policy, to_numpy_tree
from muzero_tune.runs.reporter import MemoryReporter

SMALL = {
    "model.hidden_dim": 32,
    "model.latent_dim": 16,
    "mcts.num_simulations": 4,
    "learn.batch_size": 32,
    "env.collector_env_num": 4,
    "env.evaluator_env_num": 2,
    "eval.n_episodes": 2,
    "eval.eval_freq": 20,
    "replay.game_segment_length": 20,
    "max_envstep": 400,
    "stop_value": None,
    "logging.quiet": True,
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    cfg = make_config("cartpole_muzero", overrides={**SMALL, "logging.output_dir": str(out), "exp_name": "t"})
    summary = train_muzero_segment(cfg)
    return cfg, summary, os.path.join(str(out), "t")


def test_short_run_completes_trains_and_writes_loadable_checkpoints(run):
    cfg, summary, run_dir = run
    assert summary.stop_reason == "max_envstep" and summary.env_steps >= 400
    assert summary.train_iter > 0 and len(summary.evals) >= 2
    files = sorted(os.listdir(os.path.join(run_dir, "ckpt")))
    assert len(files) == len(summary.evals)
    ckpt = torch.load(os.path.join(run_dir, "ckpt", files[-1]), weights_only=True)
    assert ckpt["evaluated"]["version"] == summary.evals[-1]["train_iter"]
    assert ckpt["resume"]["counters"]["env_steps"] == summary.env_steps
    assert ckpt["resume"]["learner"]["train_iter"] == summary.train_iter
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert [r["eval_index"] for r in rows] == list(range(1, len(summary.evals) + 1))


def test_checkpoint_evaluated_weights_reproduce_reward(run, capsys):
    _, summary, run_dir = run
    path = latest_checkpoint(run_dir)
    cfg, policy, model, ckpt = load_policy(path)
    assert cli_main(["eval", path]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["reward_mean"] == pytest.approx(ckpt["evaluated"]["metrics"]["reward_mean"])
    assert out["version"] == ckpt["evaluated"]["version"]
    # re-evaluated with evaluation settings changed: the overrides reach the evaluator
    assert cli_main(["eval", path, "--set", "eval.n_episodes=3", "--set", "eval.unvisited_q=min"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["episodes"] == 3 and out["overrides"] == {"eval.n_episodes": "3", "eval.unvisited_q": "min"}


def test_resume_continues_counters_exactly(run):
    cfg, summary, run_dir = run
    path = latest_checkpoint(run_dir)
    rep = MemoryReporter()
    cfg2 = make_config(
        "cartpole_muzero",
        overrides={
            **SMALL,
            "max_envstep": summary.env_steps + 200,
            "learn.resume_warmup_transitions": 64,
            "logging.output_dir": os.path.dirname(run_dir),
            "exp_name": "t_resumed",
        },
    )
    s2 = train_muzero_segment(cfg2, reporter=rep, resume_from=path)
    first = rep.evals[0]
    assert first["eval_index"] == len(summary.evals) + 1
    assert first["train_iter"] > summary.train_iter and first["envstep"] > summary.env_steps
    assert s2.env_steps >= summary.env_steps + 200


def test_building_batches_ahead_leaves_the_run_unchanged(run, tmp_path):
    """``learn.prefetch_next_batch`` (on in ``run``) only moves work: the same run without it takes the same
    train steps, evaluates the same rewards and ends with the same weights, bit for bit."""
    cfg, summary, run_dir = run
    off = make_config(
        "cartpole_muzero",
        overrides={
            **SMALL,
            "logging.output_dir": str(tmp_path),
            "exp_name": "t",
            "learn.prefetch_next_batch": False,
        },
    )
    assert cfg.learn.prefetch_next_batch and not off.learn.prefetch_next_batch
    s_off = train_muzero_segment(off)
    assert (s_off.env_steps, s_off.train_iter) == (summary.env_steps, summary.train_iter)
    assert [e["reward_mean"] for e in s_off.evals] == [e["reward_mean"] for e in summary.evals]
    on_state = torch.load(latest_checkpoint(run_dir), weights_only=False)
    off_state = torch.load(latest_checkpoint(str(tmp_path / "t")), weights_only=False)
    for part in ("model", "target_model", "optimizer"):
        a, b = on_state["resume"]["learner"][part], off_state["resume"]["learner"][part]
        if part == "optimizer":
            a, b = a["state"], b["state"]
            a = {f"{i}.{k}": v for i, st in a.items() for k, v in st.items()}
            b = {f"{i}.{k}": v for i, st in b.items() for k, v in st.items()}
        assert a.keys() == b.keys() and a
        for key in a:
            assert torch.equal(torch.as_tensor(a[key]), torch.as_tensor(b[key])), (part, key)
    assert on_state["resume"]["driver_rng"] == off_state["resume"]["driver_rng"]


def test_sync_pipeline_never_starts_ray(tmp_path):
    code = (
        "import sys; from muzero_tune.config import make_config;"
        "from muzero_tune.pipeline.sync_driver import train_muzero_segment;"
        f"cfg = make_config('cartpole_muzero', overrides={{**{SMALL!r}, 'max_envstep': 100,"
        f" 'logging.output_dir': {str(tmp_path)!r}}});"
        "train_muzero_segment(cfg); print('ray' in sys.modules)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "False"


def test_cli_train_smoke(tmp_path, capsys):
    args = ["train", "--preset", "cartpole_muzero", "--set", f"logging.output_dir={tmp_path}"]
    for k, v in {**SMALL, "max_envstep": 100}.items():
        args += ["--set", f"{k}={'none' if v is None else v}"]
    assert cli_main(args) == 0
    assert "stopped (max_envstep)" in capsys.readouterr().out
    assert cli_main(["train", "--set", "learn.batch_siz=3"]) == 2


def test_continuous_env_with_a_discrete_policy_fails_clearly(tmp_path):
    from muzero_tune.config import ConfigError

    cfg = make_config(
        "cartpole_muzero",
        overrides={**SMALL, "env.env_id": "Pendulum-v1", "logging.output_dir": str(tmp_path)},
    )
    with pytest.raises(ConfigError, match="continuous actions"):
        train_muzero_segment(cfg)
    assert not os.path.exists(os.path.join(str(tmp_path), cfg.exp_name))


# ---------------------------------------------------------------------------------- continuous actions


class UnitActionPolicy(Policy):
    """Test-only continuous policy standing in for a sampled type: random actions in [-1, 1]; its 'model'
    regresses the root value target from the observation and the K unrolled actions, so the learner
    consumes ``TrainBatch.actions`` [B, K, D] float32."""

    name = "unit_action_test"
    action_kinds = ("continuous",)
    seen_batch_actions: list = []

    def build_model(self):
        k, d = self.cfg.replay.num_unroll_steps, self.spec.action_dim
        return torch.nn.Linear(self.spec.obs_shape[0] + k * d, 1)

    def act(self, model, obs, legal_mask, *, explore, temperature, rng, state=None, env_index=None):
        b = obs.shape[0]
        actions = self.spec.random_actions(rng, (b,))
        zeros = np.zeros(b, np.float32)
        stats = {
            "child_visits": np.ones((b, 1), np.float32),
            "sampled_actions": actions[:, None].copy(),
            "root_value": zeros,
            "legal_mask": legal_mask,
        }
        return ActOutput(actions=actions, step_stats=stats, root_value=zeros, predicted_value=zeros)

    def make_batch(self, sample, *, target_model, rng, reanalyze_count=0, defer_bootstrap=False):
        rc = self.cfg.replay
        return make_batch(
            sample,
            num_unroll_steps=rc.num_unroll_steps,
            td_steps=rc.td_steps,
            discount=0.97,
            num_actions=self.spec.num_actions,
            action_dim=self.spec.action_dim,
            value_fn=lambda obs: np.zeros(len(obs), np.float32),
            rng=rng,
            all_obs=False,
            extra_stats=("sampled_actions",),
        )

    def reanalyze(self, target_model, obs, legal_mask, rng):
        raise AssertionError("reanalyze is not configured in this test")

    def compute_loss(self, model, batch, *, train_iter):
        type(self).seen_batch_actions.append(
            (batch.actions.shape, batch.actions.dtype.name, batch.extras["sampled_actions"].shape)
        )
        obs = torch.as_tensor(batch.obs[:, 0])
        acts = torch.as_tensor(batch.actions).reshape(len(obs), -1)
        pred = model(torch.cat([obs, acts], dim=1)).squeeze(-1)
        per = (pred - torch.as_tensor(batch.target_value[:, 0])) ** 2
        loss = (torch.as_tensor(batch.weights) * per).mean()
        return LossOutput(
            loss=loss,
            per_sample_loss=per.detach(),
            priorities=(per.detach().numpy() + 1e-3).astype(np.float32),
        )


# Pendulum with the test's continuous policy standing in for sampled_muzero (no reanalyze: it has no search)
PENDULUM_UNIT = {
    **SMALL,
    "env.env_id": "Pendulum-v1",
    "policy.type": "sampled_muzero",
    "max_envstep": 300,
    "env.max_episode_steps": 50,
    "eval.eval_freq": 10,
    "replay.buffer_reanalyze_freq": 0,
    "replay.reanalyze_ratio": 0.0,
    "learn.batch_size": 16,
}


def test_continuous_sync_run_trains_and_checkpoints_unit_actions(tmp_path, monkeypatch):
    """Pendulum through the whole sync pipeline with a continuous test policy standing in for a sampled
    type: the learner gets [B, K, D] float32 actions, the checkpoint (with its replay buffer) holds [M, D]
    float32 actions in [-1, 1], and its evaluated snapshot re-evaluates to the reported reward."""
    monkeypatch.setitem(registry.POLICY_CLASSES, "sampled_muzero", f"{__name__}:UnitActionPolicy")
    cfg = make_config(
        "cartpole_muzero",
        overrides={
            **PENDULUM_UNIT,
            "tune.save_replay_buffer": True,
            "logging.output_dir": str(tmp_path),
            "exp_name": "cont",
        },
    )
    summary = train_muzero_segment(cfg)
    assert summary.train_iter > 0
    k = cfg.replay.num_unroll_steps
    assert set(UnitActionPolicy.seen_batch_actions) == {((16, k, 1), "float32", (16, k + 1, 1, 1))}
    path = latest_checkpoint(os.path.join(str(tmp_path), "cont"))
    ckpt = torch.load(path, weights_only=True)
    segs = to_numpy_tree(ckpt["resume"]["buffer"])["segments"]
    assert segs and all(s["actions"].dtype == np.float32 and s["actions"].shape[1:] == (1,) for s in segs)
    assert all(np.all(np.abs(s["actions"]) <= 1.0) for s in segs)
    _, policy, model, _ = load_policy(path)
    res = Evaluator(cfg, policy, policy.spec, seed=cfg.seed + EVAL_SEED_OFFSET).evaluate(model)
    assert res.reward_mean == pytest.approx(ckpt["evaluated"]["metrics"]["reward_mean"])


def test_continuous_async_local_mode_carries_unit_actions(tmp_path, monkeypatch):
    """The async driver (actors in-process, ``ray_local_mode``): collector results cross the message
    boundary with [M, D] float32 segments and the learner trains on [B, K, D] batches."""
    from muzero_tune.distributed.async_driver import train_muzero_segment_async

    monkeypatch.setitem(registry.POLICY_CLASSES, "sampled_muzero", f"{__name__}:UnitActionPolicy")
    monkeypatch.setattr(UnitActionPolicy, "seen_batch_actions", [])
    cfg = make_config(
        "cartpole_muzero",
        overrides={
            **PENDULUM_UNIT,
            "logging.output_dir": str(tmp_path),
            "policy.async_pipeline.enabled": True,
            "policy.async_pipeline.ray_local_mode": True,
        },
    )
    out: list = []
    summary = train_muzero_segment_async(cfg, reporter=MemoryReporter(), driver_out=out)
    assert summary.stop_reason == "max_envstep" and summary.train_iter > 0 and summary.evals
    k = cfg.replay.num_unroll_steps
    assert set(UnitActionPolicy.seen_batch_actions) == {((16, k, 1), "float32", (16, k + 1, 1, 1))}
    segs = out[0].core.buffer.segments
    assert segs and all(s.actions.dtype == np.float32 and s.actions.shape == (s.num_stored, 1) for s in segs)
