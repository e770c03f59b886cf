"""Pipeline-level resume, proven on the real driver core and the real sync driver (not only the learner).

A core is trained on real collected data, its resume state (buffer included) goes through a checkpoint
file, and a fresh core loaded from that file must equal the original exactly: counters, LR step, replay
buffer (segments and priorities), the driver's sampling RNG (same first sampled indices) and the next train
step. Without the buffer, the sync driver must not update before ``learn.resume_warmup_transitions`` fresh
transitions, and it continues the evaluation index exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from muzero_tune.config import make_config
from muzero_tune.pipeline.collector import SegmentCollector
from muzero_tune.pipeline.core import DriverCore, setup_torch_threads
from muzero_tune.pipeline.sync_driver import train_muzero_segment
from muzero_tune.runs.checkpoint import FORMAT, load_checkpoint, save_checkpoint
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
    "stop_value": None,
    "logging.quiet": True,
    "learn.lr_schedule": "cosine",
    "learn.lr_total_train_iter": 200,
    "seed": 2,
}


def _cfg(tmp, **extra):
    return make_config("cartpole_muzero", overrides={**SMALL, "logging.output_dir": str(tmp), **extra})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(cfg, the original core after 40 train steps, the checkpoint file of its state with the buffer)."""
    setup_torch_threads()
    tmp = tmp_path_factory.mktemp("core_resume")
    cfg = _cfg(tmp)
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


@pytest.fixture()
def restored(saved):
    cfg, _, path = saved
    core = DriverCore(cfg, MemoryReporter())
    core.load_resume_state(load_checkpoint(path)["resume"])
    return core


def test_counters_and_lr_equal_the_checkpoints(saved, restored):
    _, core, _ = saved
    assert restored.train_iter == core.train_iter >= 40
    assert restored.counters.env_steps == core.counters.env_steps > 0
    assert restored.counters.eval_index == core.counters.eval_index == 3
    assert restored.counters.train_epoch == core.counters.train_epoch
    assert restored.counters.episodes == core.counters.episodes > 0
    lr = restored.learner.optimizer.param_groups[0]["lr"]
    assert lr == core.learner.optimizer.param_groups[0]["lr"] < SMALL.get("learn.learning_rate", 1e-3)
    assert restored.learner.scheduler.last_epoch == core.learner.scheduler.last_epoch == core.train_iter


def test_the_restored_buffer_equals_the_saved_one(saved, restored):
    _, core, _ = saved
    a, b = core.buffer.state_dict(), restored.buffer.state_dict()

    def same(x, y):
        if isinstance(x, dict):
            assert x.keys() == y.keys()
            for k in x:
                same(x[k], y[k])
        elif isinstance(x, (list, tuple)):
            assert len(x) == len(y)
            for u, v in zip(x, y):
                same(u, v)
        elif isinstance(x, (np.ndarray, torch.Tensor)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        else:
            assert x == y

    same(a, b)
    assert restored.buffer.num_transitions == core.buffer.num_transitions > 0
    assert restored.min_transitions == core.min_transitions  # buffer restored: no warm-up gate


def test_sampling_and_the_next_train_step_continue_as_uninterrupted(saved, restored):
    _, core, _ = saved
    original = DriverCore(core.cfg, MemoryReporter())  # the uninterrupted run, from the same in-memory state
    original.load_resume_state(core.resume_state(include_buffer=True))
    s1 = original.buffer.sample(32, original.rng)
    s2 = restored.buffer.sample(32, restored.rng)
    np.testing.assert_array_equal(s1.flat_index, s2.flat_index)
    o1, o2 = original.train_step(), restored.train_step()
    assert o1.metrics == o2.metrics
    for (k, p1), (_, p2) in zip(
        original.learner.model.state_dict().items(), restored.learner.model.state_dict().items()
    ):
        assert torch.equal(p1, p2), k


def test_without_the_buffer_no_update_before_the_warmup_and_the_eval_index_continues(saved, tmp_path):
    cfg, core, path = saved
    ckpt = load_checkpoint(path)
    del ckpt["resume"]["buffer"]
    warmup = 200
    cfg2 = _cfg(
        tmp_path, max_envstep=core.counters.env_steps + 400, **{"learn.resume_warmup_transitions": warmup}
    )
    rep = MemoryReporter()
    train_muzero_segment(cfg2, reporter=rep, resume_from=ckpt)
    assert rep.progress[0]["envstep"] > core.counters.env_steps
    waited = [r for r in rep.progress if r["train_iter"] == core.train_iter]
    trained = [r for r in rep.progress if r["train_iter"] > core.train_iter]
    assert waited and all(r["buffer/transitions"] < warmup for r in waited[:-1])  # collected, no update
    assert trained and trained[0]["buffer/transitions"] >= warmup  # the first update after the warm-up
    assert rep.evals[0]["eval_index"] == 4  # 3 in the checkpoint, then exactly the next one
