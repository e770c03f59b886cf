"""The data-parallel learner group (``learn.num_learners``): two gloo learners on half a batch each train
the model the in-process learner trains on the whole batch; both pipelines, Tune and a killed learner."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import torch
from conftest import ACTOR_CPUS

from muzero_tune.config import make_config
from muzero_tune.distributed.learner_group import LearnerFailureError, LearnerGroup, shard_batch
from muzero_tune.distributed.placement import bundles, standalone_placement
from muzero_tune.pipeline.collector import SegmentCollector
from muzero_tune.pipeline.core import DriverCore
from muzero_tune.policies.registry import POLICY_CLASSES
from muzero_tune.runs.reporter import MemoryReporter

SMALL = {
    "model.hidden_dim": 32, "model.latent_dim": 16, "mcts.num_simulations": 4, "learn.batch_size": 32,
    "env.collector_env_num": 4, "env.evaluator_env_num": 2, "eval.n_episodes": 2, "eval.eval_freq": 20,
    "replay.game_segment_length": 20, "logging.quiet": True, "stop_value": None,
    # a run with its actors and two learners fits the test cluster: 1 + 0.25 + 0.25 + 2 x 0.5 CPUs
    **ACTOR_CPUS, "learn.learner_resources": {"CPU": 0.5},
}  # fmt: skip
# float32 sums over 32 rows, or over two 16-row halves averaged by the all-reduce, differ in their last bits;
# after Adam's steps the parameters, its moments and the priorities agree to these
ATOL, RTOL = 2e-5, 1e-4


def _group_core(cfg, placement):
    def make(c, policy):
        return LearnerGroup(c, policy, placement=placement)

    return DriverCore(cfg, MemoryReporter(), make_learner=make)


def _fill(cfg, core: DriverCore) -> None:
    """One collect of the core's current weights (collector seed 0) pushed into its buffer."""
    collector = SegmentCollector(cfg, core.policy, core.spec, seed=0)
    core.push_collect(collector.collect(core.learner.model, temperature=1.0))
    collector.close()


def _flat_state(state: dict) -> dict[str, torch.Tensor]:
    out = {}
    for part in ("model", "target_model"):
        out.update({f"{part}.{k}": v for k, v in state[part].items()})
    for idx, st in state["optimizer"]["state"].items():
        out.update({f"optimizer.{idx}.{k}": torch.as_tensor(v) for k, v in st.items()})
    return out


def test_shards_are_the_batch_rows_in_order():
    cfg = make_config("cartpole_muzero", overrides=SMALL)
    core = DriverCore(cfg, MemoryReporter())
    _fill(cfg, core)
    from muzero_tune.replay.targets import resolve_bootstrap

    _, batch = core.build_batch()
    batch = resolve_bootstrap(batch)
    halves = shard_batch(batch, 2)
    for name in ("obs", "actions", "target_value", "target_policy", "weights", "flat_index"):
        joined = np.concatenate([getattr(h, name) for h in halves])
        np.testing.assert_array_equal(joined, getattr(batch, name))
    assert [h.batch_size for h in halves] == [16, 16] and halves[1].make_time == batch.make_time
    with pytest.raises(ValueError, match="3 equal shards"):
        shard_batch(batch, 3)
    core.close()


def test_two_learners_on_half_batches_match_one_learner_on_the_whole(ray_cluster):
    """The same collected data in both drivers; after 6 steps (two target-network copies) the priorities of
    every step, the parameters, the target network and Adam's moments agree within ATOL/RTOL."""
    base = make_config("cartpole_muzero", overrides={**SMALL, "learn.target_update_interval": 3})
    cfg2 = make_config("cartpole_muzero", overrides={**SMALL, "learn.target_update_interval": 3,
                                                     "learn.num_learners": 2})  # fmt: skip
    assert bundles(cfg2) == [{"CPU": 1.0}, {"CPU": 0.5}, {"CPU": 0.5}]
    placement = standalone_placement(cfg2, learner_on_gpu=False, timeout_s=60)
    one = DriverCore(base, MemoryReporter())
    two = _group_core(cfg2, placement)
    try:
        for core in (one, two):  # the same weights and seed: the same data
            _fill(base, core)
        assert one.buffer.num_transitions == two.buffer.num_transitions
        for _ in range(6):
            a, b = one.train_step(), two.train_step()
            np.testing.assert_allclose(b.priorities, a.priorities, atol=ATOL, rtol=RTOL)
            assert b.metrics["train/loss_total"] == pytest.approx(a.metrics["train/loss_total"], rel=1e-4)
        sa, sb = one.learner.state_dict(), two.learner.state_dict()
        assert sb["train_iter"] == sa["train_iter"] == 6
        fa, fb = _flat_state(sa), _flat_state(sb)
        assert fa.keys() == fb.keys() and any(k.endswith("exp_avg_sq") for k in fa)
        for k in fa:
            torch.testing.assert_close(fb[k], fa[k], atol=ATOL, rtol=RTOL, msg=k)
        # the driver's copies are rank 0's weights
        for k, v in two.learner.model.state_dict().items():
            torch.testing.assert_close(v, sb["model"][k], atol=0, rtol=0)
    finally:
        two.close()
        one.close()
        placement.remove()


@pytest.mark.parametrize("pipeline", ["sync", "async"])
def test_a_run_with_two_learners_trains_and_resumes_in_process(pipeline, ray_cluster, tmp_path):
    """``train`` with 2 learners in the run's placement group (its bundles: driver, actors, 2 learners);
    its checkpoint resumes with the learner in the driver's process."""
    from muzero_tune.api import train
    from muzero_tune.runs.checkpoint import find_checkpoint
    from muzero_tune.runs.reporter import default_reporter

    over = {**SMALL, "learn.num_learners": 2, "max_envstep": 200, "logging.output_dir": str(tmp_path),
            "exp_name": pipeline, "policy.async_pipeline.enabled": pipeline == "async",
            "policy.async_pipeline.num_collector_actors": 1, "logging.mlflow": False}  # fmt: skip
    cfg = make_config("cartpole_muzero", overrides=over)
    summary = train(cfg, reporter=default_reporter(cfg))
    assert summary.train_iter > 0 and summary.evals and np.isfinite(summary.evals[-1]["reward_mean"])
    ckpt = find_checkpoint(os.path.join(str(tmp_path), pipeline)).checkpoint
    resumed = train(
        make_config("cartpole_muzero", overrides={**over, "learn.num_learners": 0, "max_envstep": 300,
                                                  "learn.resume_warmup_transitions": 32}),
        reporter=MemoryReporter(), resume_from=ckpt,
    )  # fmt: skip
    assert resumed.train_iter > ckpt["resume"]["learner"]["train_iter"]


def test_a_killed_learner_stops_the_run_with_a_clear_error(ray_cluster, tmp_path):
    """A learner process killed from outside: the next step raises LearnerFailureError naming it."""
    import ray

    cfg = make_config("cartpole_muzero", overrides={**SMALL, "learn.num_learners": 2,
                                                    "learn.learner_timeout_s": 60})  # fmt: skip
    placement = standalone_placement(cfg, learner_on_gpu=False, timeout_s=60)
    core = _group_core(cfg, placement)
    try:
        _fill(cfg, core)
        core.train_step()
        pid = ray.get(core.learner.workers[1].ping.remote())["pid"]
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(LearnerFailureError, match=r"learner .*1.* at train_iter 1"):
            for _ in range(3):
                core.train_step()
    finally:
        core.close()
        placement.remove()


TINY = {
    "mcts.num_simulations": 4, "learn.batch_size": 16, "env.collector_env_num": 2, "env.evaluator_env_num": 1,
    "eval.n_episodes": 1, "eval.eval_freq": 10, "replay.game_segment_length": 20, "max_envstep": 120,
    "stop_value": None, "logging.quiet": True, "learn.num_learners": 2,
    "policy.async_pipeline.num_collector_actors": 1, **ACTOR_CPUS, "learn.learner_resources": {"CPU": 0.5},
}  # fmt: skip


def _trains_with_two_learners(policy_type: str, asynchronous: bool) -> None:
    from muzero_tune.api import train

    cfg = make_config(f"cartpole_{policy_type}", overrides={
        **TINY, "policy.async_pipeline.enabled": asynchronous,
    })  # fmt: skip
    rep = MemoryReporter()
    summary = train(cfg, reporter=rep)
    assert summary.train_iter > 0 and rep.evals
    assert all(np.isfinite(e["reward_mean"]) for e in rep.evals)
    losses = [row["train/loss_total"] for row in rep.progress + rep.evals if "train/loss_total" in row]
    assert losses and all(np.isfinite(losses))


@pytest.mark.parametrize("policy_type", [
    t if t in ("muzero", "unizero") else pytest.param(t, marks=pytest.mark.slow) for t in POLICY_CLASSES
])  # fmt: skip
def test_every_policy_type_trains_with_two_learners_async(policy_type, ray_cluster):
    """Each type's CartPole preset on the async pipeline with 2 learners: its loss runs under DDP (its
    extra state -- LSTM, chance codes, transformer caches, sampled actions -- on the learners' side) while
    Ray actors collect and evaluate; the run trains and evaluates (muzero and unizero in the default suite,
    the other eight with ``-m slow``).

    Default-tier twin:
    tests/test_learner_group.py::test_every_policy_type_trains_with_two_learners_async[muzero]
    tests/test_learner_group.py::test_every_policy_type_trains_with_two_learners_async[unizero]
    """
    _trains_with_two_learners(policy_type, asynchronous=True)


@pytest.mark.slow
@pytest.mark.parametrize("policy_type", list(POLICY_CLASSES))
def test_every_policy_type_trains_with_two_learners_sync(policy_type, ray_cluster):
    """The same on the sync pipeline (its learner side is the async one's; the default suite runs it for
    muzero through the resume test).

    Default-tier twin:
    tests/test_learner_group.py::test_a_run_with_two_learners_trains_and_resumes_in_process[sync]
    tests/test_learner_group.py::test_every_policy_type_trains_with_two_learners_async[unizero]
    """
    _trains_with_two_learners(policy_type, asynchronous=False)


def test_a_tune_trial_reserves_and_uses_the_learner_bundles(ray_cluster, tmp_path):
    """The trial's placement group is [driver, collector, evaluator, learner, learner]; the trial's learners
    are created in its last two bundles (a group without them is refused before training) and it reports."""
    from muzero_tune.tune.resources import placement_group_factory
    from muzero_tune.tune.sweep import run_sweep

    over = {**TINY, "tune.storage_path": str(tmp_path), "tune.mlflow": False, "max_envstep": 200}
    cfg = make_config("cartpole_muzero", overrides={**over, "policy.async_pipeline.enabled": True})
    assert placement_group_factory(cfg).bundles == [{"CPU": 1.0}, {"CPU": 0.25}, {"CPU": 0.25}, {"CPU": 0.5},
                                                    {"CPU": 0.5}]
    res = run_sweep("quickstart", name="learners", overrides=over,
                    param_space_extra={"policy.async_pipeline.enabled": True, "seed": 0})  # fmt: skip
    (trial,) = list(res.results)
    assert trial.error is None and trial.metrics["eval_index"] >= 1 and trial.metrics["train_iter"] > 0
