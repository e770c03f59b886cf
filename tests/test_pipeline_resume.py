"""Resume, proven against a run that never stopped.

**Sync pipeline** (deterministic for a seed: one torch thread, seeded collector, evaluator, driver and
learner). The sync driver checkpoints only at an evaluation, which follows a collect and its train budget;
"step k" is such a checkpoint. A run resumed at step k from the checkpoint *file* equals the straight run
bit for bit at every later evaluation up to its end (about step 2k), for all ten policy types: model
weights, target network, optimizer state, LR schedule position, replay buffer (segments, priorities, clock,
evictions), counters (env steps, train_iter, train epochs, episodes and the recent returns, eval index,
replay-ratio remainder, reanalyze calls), the torch / numpy / Python global RNGs, the driver's sampling RNG,
the collector's RNG, every env's episode in flight (replayed from its reset seed or its ``np_random`` state
with the actions taken so far, then going on as in the straight run), the builders' unfinished segments
(stream ids included), the carried acting state of the types that keep one, and each evaluation's snapshot
and metrics. Not identical: wall-clock figures (``wall_s``, ``*_per_s``, ``eval_duration_s``, the learner's
``train_time_s``). This needs the replay buffer in the checkpoint (``tune.save_replay_buffer=true``), which
also carries the collector's state; without it the episodes in flight restart and learning waits for
``learn.resume_warmup_transitions`` fresh transitions (the last test).

**Async pipeline** (not deterministic): a checkpoint restores exactly what the driver held when it wrote it
(counters, learner, replay buffer, driver RNG), and a resumed async run continues those counters.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os

import gymnasium as gym
import numpy as np
import pytest
import torch

from muzero_tune.api import train
from muzero_tune.config import make_config, to_flat_dict
from muzero_tune.pipeline.collector import SegmentCollector
from muzero_tune.pipeline.core import DriverCore, make_policy, setup_torch_threads
from muzero_tune.pipeline.sync_driver import train_muzero_segment
from muzero_tune.policies.registry import POLICY_TYPES
from muzero_tune.runs.checkpoint import (
    FORMAT,
    eval_checkpoints,
    load_checkpoint,
    save_checkpoint,
    to_numpy_tree,
)
from muzero_tune.runs.reporter import MemoryReporter
from muzero_tune.runs.resume import resume_config

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
    "stop_value": None,
    "logging.quiet": True,
    "learn.lr_schedule": "cosine",
    "learn.lr_total_train_iter": 200,
    "seed": 2,
}

# the straight-run comparison: tiny networks and searches, and every piece of state in play -- a buffer
# small enough to evict, buffer reanalyze every budget, a cosine LR schedule short enough to move, target
# network copies every few steps (types that use a soft update keep it)
EXACT = {
    "model.hidden_dim": 16,
    "model.latent_dim": 8,
    "mcts.num_simulations": 3,
    "learn.batch_size": 8,
    "env.collector_env_num": 2,
    "env.evaluator_env_num": 1,
    "eval.n_episodes": 1,
    "eval.eval_freq": 4,
    "replay.game_segment_length": 8,
    "replay.capacity_transitions": 32,
    "replay.buffer_reanalyze_freq": 1.0,
    "learn.lr_schedule": "cosine",
    "learn.lr_total_train_iter": 60,
    "learn.target_update_interval": 5,
    "tune.save_replay_buffer": True,
    "max_envstep": 100,
    "stop_value": None,
    "seed": 3,
    "logging.quiet": True,
    "logging.progress_interval_s": 0,
}
WALL_CLOCK = {"wall_s", "train_time_s", "envstep_per_s", "train_iter_per_s", "eval_duration_s"}


def differences(a, b, path: str = "") -> list[str]:
    """The paths at which two checkpoint trees differ, bit for bit (tensors by their bytes, so NaNs count as
    equal only with the same payload), wall-clock entries left out."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a if k not in WALL_CLOCK for d in differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: {len(a)} != {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, (np.ndarray, torch.Tensor)) and isinstance(b, (np.ndarray, torch.Tensor)):
        x, y = torch.as_tensor(a), torch.as_tensor(b)
        if x.dtype != y.dtype or x.shape != y.shape:
            return [f"{path}: {x.dtype}{tuple(x.shape)} != {y.dtype}{tuple(y.shape)}"]
        def as_bytes(t: torch.Tensor) -> torch.Tensor:
            return t.contiguous().flatten().view(torch.uint8) if t.numel() else t

        return [] if torch.equal(as_bytes(x), as_bytes(y)) else [f"{path}: values differ"]
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    return [] if type(a) is type(b) and a == b else [f"{path}: {a!r} != {b!r}"]


def test_differences_sees_one_changed_bit_and_nothing_else():
    tree = {"w": torch.tensor([1.0, float("nan")]), "n": [3, {"x": np.arange(3)}], "wall_s": 1.0}
    other = copy.deepcopy(tree)
    other["wall_s"] = 2.0
    assert differences(tree, other) == []
    other["w"] = torch.tensor([np.nextafter(np.float32(1.0), np.float32(2.0)), float("nan")])
    other["n"][1]["x"] = np.array([0, 1, 3])
    assert differences(tree, other) == [".w: values differ", ".n[1].x: values differ"]


def _metrics_rows(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if k not in WALL_CLOCK} for line in f]


@pytest.mark.parametrize("policy_type", POLICY_TYPES)
def test_a_run_resumed_from_a_checkpoint_file_equals_the_straight_run(policy_type, tmp_path):
    """Straight run to the end; a second run resumed (through ``train(resume_from=FILE)``) from the straight
    run's checkpoint nearest half its train steps, with episodes in flight; from there on every checkpoint
    of the two is the same, bit for bit, but for wall-clock figures (see the module docstring)."""
    setup_torch_threads()
    out = str(tmp_path)
    train(make_config(f"cartpole_{policy_type}", overrides={**EXACT, "logging.output_dir": out,
                                                            "exp_name": "straight"}))  # fmt: skip
    straight = eval_checkpoints(os.path.join(out, "straight", "ckpt"))
    final = load_checkpoint(straight[-1])
    k_final = final["resume"]["learner"]["train_iter"]
    def distance_from_half(p: str) -> int:
        return abs(2 * load_checkpoint(p)["resume"]["learner"]["train_iter"] - k_final)

    mid_path = min(straight[:-1], key=distance_from_half)
    mid = load_checkpoint(mid_path)
    k = mid["resume"]["learner"]["train_iter"]
    assert 0 < k < k_final

    # what the checkpoint at step k holds that a restart would lose: episodes in flight, unfinished segments
    col = mid["resume"]["collector"]
    assert any(len(a) > 0 for a in col["episode_actions"])
    assert any(len(b["actions"]) > 0 for b in col["builders"])

    cfg, _ = resume_config(mid["config"], {"exp_name": "resumed"})
    train(cfg, resume_from=mid_path)
    resumed = eval_checkpoints(os.path.join(out, "resumed", "ckpt"))
    later = straight[straight.index(mid_path) + 1 :]
    assert [os.path.basename(p) for p in resumed] == [os.path.basename(p) for p in later]
    for a, b in zip(later, resumed):
        ckpt_a, ckpt_b = load_checkpoint(a), load_checkpoint(b)
        assert (ckpt_a["config"].pop("exp_name"), ckpt_b["config"].pop("exp_name")) == ("straight", "resumed")
        assert differences(ckpt_a, ckpt_b) == [], os.path.basename(a)
    assert _metrics_rows(os.path.join(out, "resumed")) == _metrics_rows(os.path.join(out, "straight"))[
        len(straight) - len(later) :
    ]
    # the span compared changed what it claims to compare (the global RNGs move only for the types whose
    # loss or search draws from them; they are compared all the same)
    moved = differences(mid["resume"], final["resume"])
    for part in (".learner.model", ".learner.target_model", ".learner.optimizer", ".learner.scheduler",
                 ".buffer.segments", ".buffer.priorities", ".driver_rng", ".collector.rng",
                 ".collector.builders", ".collector.episode_actions", ".counters.episodes",
                 ".counters.reanalyze_calls"):  # fmt: skip
        assert any(d.startswith(part) for d in moved), part
    evicted = [c["resume"]["buffer"]["evicted_transitions"] for c in (mid, final)]
    assert evicted[1] > evicted[0]  # the resumed span evicted too


# ------------------------------------------------------------------------------------------- the collector


@pytest.mark.parametrize(
    "preset, env_id",
    [
        ("cartpole_muzero_context", "muzero_tune/StochasticCartPole-v1"),  # np_random in every step
        ("pendulum_sampled_efficientzero", "Pendulum-v1"),  # continuous actions
    ],
)
def test_a_collector_restored_from_a_checkpoint_file_collects_what_the_original_does(
    preset, env_id, tmp_path
):
    setup_torch_threads()
    cfg = make_config(preset, overrides={
        **{k: EXACT[k] for k in ("model.hidden_dim", "model.latent_dim", "mcts.num_simulations")},
        "env.env_id": env_id, "env.collector_env_num": 3, "replay.game_segment_length": 7, "seed": 5,
    })  # fmt: skip
    policy, spec = make_policy(cfg)
    torch.manual_seed(0)
    model = policy.build_model()
    original = SegmentCollector(cfg, policy, spec, seed=11)
    for _ in range(6):
        original.collect(model, temperature=1.0)
    path = str(tmp_path / "collector.pt")
    save_checkpoint(path, {"format": FORMAT, "config": {}, "evaluated": {},
                           "collector": original.state_dict()})  # fmt: skip
    restored = SegmentCollector(cfg, policy, spec, seed=11)
    assert restored.load_state_dict(to_numpy_tree(load_checkpoint(path)["collector"])) == 3
    saved = original.state_dict()
    assert sum(len(a) for a in saved["episode_actions"]) > 0  # episodes were in flight
    if env_id != "Pendulum-v1":  # 200-step episodes: all still the first
        # one of them a later episode, which started from the env's np_random state, not from a seed
        assert any(s < 0 and len(a) for s, a in zip(saved["episode_seeds"], saved["episode_actions"]))
    for _ in range(4):
        a = original.collect(model, temperature=1.0)
        b = restored.collect(model, temperature=1.0)
        assert (a.episode_returns, a.episode_lengths, a.envstep_delta) == (
            b.episode_returns, b.episode_lengths, b.envstep_delta)  # fmt: skip
        assert len(a.segments) == len(b.segments) > 0
        for s, t in zip(a.segments, b.segments):
            assert differences(vars(s), vars(t)) == []
    assert differences(original.state_dict(), restored.state_dict()) == []
    original.close()
    restored.close()


class OwnRandomEnv(gym.Env):
    """Starts each episode at a point drawn from an RNG of its own (not ``np_random``), so its episodes
    cannot be replayed from a seed; episodes are truncated after ``length_steps``."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(4,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length_steps: int):
        self.own = np.random.default_rng()
        self.length_steps = length_steps
        self.x = np.zeros(4, np.float32)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = self.own.normal(size=4).astype(np.float32), 0
        return self.x.copy(), {}

    def step(self, action):
        self.x, self.t = self.x + (1.0 if action else -1.0), self.t + 1
        return self.x.copy(), 1.0, False, self.t >= self.length_steps, {}


def test_an_env_that_cannot_be_replayed_starts_a_new_episode_with_a_warning(caplog):
    tiny = {k: EXACT[k] for k in ("model.hidden_dim", "model.latent_dim", "mcts.num_simulations")}
    cfg = make_config("cartpole_muzero", overrides={**tiny, "replay.game_segment_length": 50})
    policy, spec = make_policy(cfg)
    model = policy.build_model()
    def make(seed: int) -> OwnRandomEnv:  # env 0's episodes end after 12 steps, env 1's after 20
        return OwnRandomEnv(12 + 8 * seed)

    original = SegmentCollector(cfg, policy, spec, seed=0, num_envs=2, make=make)
    original.collect(model, temperature=1.0, num_segments=1)  # until env 0's first episode ends
    state = original.state_dict()
    assert [len(a) for a in state["episode_actions"]] == [0, 12]  # env 1 is 12 steps into its episode
    restored = SegmentCollector(cfg, policy, spec, seed=0, num_envs=2, make=make)
    with caplog.at_level(logging.WARNING, logger="muzero_tune"):
        assert restored.load_state_dict(state) == 0
    assert caplog.text.count("reached another observation") == 2
    after = restored.state_dict()
    assert [len(b["actions"]) for b in after["builders"]] == [0, 0]  # env 1's unfinished segment was dropped
    assert [len(a) for a in after["episode_actions"]] == [0, 0]
    episodes = [b["episode_index"] for b in state["builders"]]
    assert [b["episode_index"] for b in after["builders"]] == [e + 1 for e in episodes]
    assert restored.collect(model, temperature=1.0, num_segments=1).segments  # and it goes on collecting


# --------------------------------------------------------------------------- the core, and without a buffer


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(cfg, the original core after 40 train steps, the checkpoint file of its state with the buffer)."""
    setup_torch_threads()
    tmp = tmp_path_factory.mktemp("core_resume")
    cfg = make_config("cartpole_muzero", overrides={**SMALL, "logging.output_dir": str(tmp)})
    core = DriverCore(cfg, MemoryReporter())
    collector = SegmentCollector(cfg, core.policy, core.spec, seed=cfg.seed)
    try:
        while core.train_iter < 40:
            budget = core.push_collect(
                collector.collect(core.learner.model, temperature=1.0, policy_version=core.train_iter)
            )
            if core.trainable():
                for _ in range(budget):
                    core.train_step()
                core.budget_done()
    finally:
        collector.close()
    core.counters.eval_index = 3  # as if three evaluations had run
    path = str(tmp / "state.pt")
    save_checkpoint(
        path,
        {
            "format": FORMAT,
            "config": core.flat_config,
            "evaluated": {},
            "resume": core.resume_state(include_buffer=True),
        },
    )
    return cfg, core, path


def test_a_core_restored_from_the_file_holds_the_original_cores_counters_lr_and_buffer(saved):
    cfg, core, path = saved
    restored = DriverCore(cfg, MemoryReporter())
    restored.load_resume_state(load_checkpoint(path)["resume"])
    assert restored.train_iter == core.train_iter >= 40
    assert differences(restored.counters.as_dict(), core.counters.as_dict()) == []
    lr = restored.learner.optimizer.param_groups[0]["lr"]
    assert lr == core.learner.optimizer.param_groups[0]["lr"] < 1e-3
    assert restored.learner.scheduler.last_epoch == core.learner.scheduler.last_epoch == core.train_iter
    assert differences(restored.buffer.state_dict(), core.buffer.state_dict()) == []
    assert restored.buffer.num_transitions == core.buffer.num_transitions > 0
    assert restored.min_transitions == core.min_transitions  # buffer restored: no warm-up gate


def test_without_the_buffer_no_update_before_the_warmup_and_the_eval_index_continues(saved, tmp_path):
    cfg, core, path = saved
    ckpt = load_checkpoint(path)
    del ckpt["resume"]["buffer"]
    warmup = 200
    cfg2 = make_config("cartpole_muzero", overrides={
        **SMALL, "logging.output_dir": str(tmp_path), "max_envstep": core.counters.env_steps + 400,
        "learn.resume_warmup_transitions": warmup,
    })  # fmt: skip
    rep = MemoryReporter()
    train_muzero_segment(cfg2, reporter=rep, resume_from=ckpt)
    assert rep.progress[0]["envstep"] > core.counters.env_steps
    waited = [r for r in rep.progress if r["train_iter"] == core.train_iter]
    trained = [r for r in rep.progress if r["train_iter"] > core.train_iter]
    assert waited and all(r["buffer/transitions"] < warmup for r in waited[:-1])  # collected, no update
    assert trained and trained[0]["buffer/transitions"] >= warmup  # the first update after the warm-up
    assert rep.evals[0]["eval_index"] == 4  # 3 in the checkpoint, then exactly the next one


# ------------------------------------------------------------------------------------------------- async


class CheckpointAndRecord(MemoryReporter):
    """At evaluation number ``at``: writes that evaluation's checkpoint file as the standalone reporter does,
    and records what the driver's core holds at that moment, read from the live objects."""

    def __init__(self, path: str, at: int, probe: list, flat_config: dict):
        super().__init__()
        self.path, self.at, self.probe, self.flat_config = path, at, probe, flat_config
        self.held: dict | None = None

    def on_eval(self, metrics, evaluated, resume_state) -> None:
        super().on_eval(metrics, evaluated, resume_state)
        if len(self.evals) != self.at:
            return
        save_checkpoint(self.path, {"format": FORMAT, "config": self.flat_config, "evaluated": evaluated,
                                    "resume": resume_state()})  # fmt: skip
        self.held = held_by(self.probe[0].core)


def held_by(core: DriverCore) -> dict:
    """A copy of what ``core`` holds, and the draw its buffer gives with a copy of its RNG."""
    learner = core.learner
    draw = core.buffer.sample(16, copy.deepcopy(core.rng), tick=False)
    return copy.deepcopy({
        "counters": core.counters.as_dict(),
        "model": learner.model.state_dict(), "target_model": learner.target_model.state_dict(),
        "optimizer": learner.optimizer.state_dict(), "scheduler": learner.scheduler.state_dict(),
        "train_iter": learner.train_iter, "driver_rng": core.rng.bit_generator.state,
        "buffer": core.buffer.state_dict(), "transitions": core.buffer.num_transitions,
        "draw": {"flat_index": draw.flat_index, "positions": draw.positions, "weights": draw.weights,
                 "make_time": draw.make_time},
    })  # fmt: skip


def test_an_async_checkpoint_restores_what_the_driver_held_and_the_resumed_run_continues_it(
    tmp_path, ray_cluster, async_config
):
    from muzero_tune.distributed.async_driver import train_muzero_segment_async

    # 120 env steps: about 20 train steps before the second evaluation's checkpoint
    cfg = async_config(tmp_path, {"max_envstep": 120, "eval.eval_freq": 10, "tune.save_replay_buffer": True})
    path = str(tmp_path / "eval_2.pt")
    probe: list = []
    rep = CheckpointAndRecord(path, 2, probe, to_flat_dict(cfg))
    train_muzero_segment_async(cfg, reporter=rep, driver_out=probe)
    held = rep.held
    assert held is not None and held["train_iter"] > 0 and held["transitions"] > 0
    resume = load_checkpoint(path)["resume"]
    assert "collector" not in resume  # async collectors are actors: their episodes restart after a resume

    restored = DriverCore(cfg, MemoryReporter())
    restored.load_resume_state(resume)
    assert differences(held_by(restored), held) == []

    saved = held["counters"]
    again = MemoryReporter()
    cfg2 = async_config(tmp_path, {"max_envstep": saved["env_steps"] + 120, "eval.eval_freq": 10},
                        exp_name="resumed")  # fmt: skip
    summary = train_muzero_segment_async(cfg2, reporter=again, resume_from=path)
    assert all(r["envstep"] >= saved["env_steps"] for r in again.progress)
    assert summary.env_steps >= cfg2.max_envstep  # it went on to its new budget
    assert all(r["train_iter"] >= held["train_iter"] for r in again.progress)
    # trained on from the restored learner (the summary: the last budgets may train after the last progress
    # row)
    assert summary.train_iter > held["train_iter"]
    assert all(r["collect/episodes"] >= saved["episodes"] for r in again.progress)
    assert again.evals and again.evals[0]["eval_index"] == saved["eval_index"] + 1
