"""Config: overrides, presets, YAML, and the bad-input table (each error before any work starts)."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest

from muzero_tune.config import (
    PRESETS,
    ConfigError,
    ExperimentConfig,
    apply_overrides,
    from_flat_dict,
    leaf_keys,
    make_config,
    parse_set_args,
    resolved_async,
    to_flat_dict,
    validate,
)
from muzero_tune.envs.factory import MissingDependencyError


def test_defaults_are_valid_and_frozen():
    cfg = validate(ExperimentConfig())
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 3  # type: ignore[misc]


def test_async_pipeline_holds_the_spec_table_with_its_defaults():
    ap = ExperimentConfig().policy.async_pipeline
    expected = {
        "num_collector_actors": 1,
        "num_evaluator_actors": 1,
        "max_eval_inflight": 1,
        "max_train_chunk_steps": 4,
        "weight_sync_interval": 1,
        "max_policy_lag": 0,
        "eval_at_start": False,
        "collector_num_cpus": 1.0,
        "evaluator_num_cpus": 1.0,
        "collector_num_gpus": 0.0,
        "evaluator_num_gpus": 0.0,
        "buffer_stats_interval": 100,
        "poll_interval_s": 0.1,
        "shutdown_timeout_s": 30.0,
        "ray_local_mode": False,
    }
    for k, v in expected.items():
        assert getattr(ap, k) == v, k
    r = resolved_async(
        apply_overrides(
            ExperimentConfig(), {"policy.async_pipeline.num_collector_actors": 3}
        ).policy.async_pipeline
    )
    assert r.max_collect_inflight == 3 and r.max_train_budget_queue_size == 6


def test_overrides_coerce_strings_and_round_trip():
    cfg = apply_overrides(
        ExperimentConfig(),
        parse_set_args(
            [
                "learn.batch_size=128",
                "learn.learning_rate=1e-3",
                "replay.use_priority=false",
                "stop_value=none",
                "learn.lr_milestones=[10, 20]",
                "env.max_episode_steps=200",
            ]
        ),
    )
    assert cfg.learn.batch_size == 128 and cfg.learn.learning_rate == 1e-3
    assert cfg.replay.use_priority is False and cfg.stop_value is None
    assert cfg.learn.lr_milestones == (10, 20) and cfg.env.max_episode_steps == 200
    assert from_flat_dict(to_flat_dict(cfg)) == cfg
    assert len(to_flat_dict(cfg)) == len(leaf_keys())


def test_the_config_schema_and_the_registry_share_one_list_of_policy_names():
    from muzero_tune.config import PolicyConfig
    from muzero_tune.policies.registry import POLICY_TYPES, get_policy_class

    allowed = PolicyConfig.__dataclass_fields__["type"].metadata
    assert set(POLICY_TYPES) == {
        "muzero", "muzero_context", "muzero_rnn_full_obs", "efficientzero", "sampled_efficientzero",
        "sampled_muzero", "gumbel_muzero", "stochastic_muzero", "unizero", "sampled_unizero",
    }  # fmt: skip
    assert tuple(allowed["choices"]) == POLICY_TYPES
    for name in POLICY_TYPES:
        make_config("cartpole_muzero", overrides={"policy.type": name}, check_env=False)
        assert isinstance(get_policy_class(name), type)
    with pytest.raises(ConfigError, match="policy.type.*allowed"):
        make_config("cartpole_muzero", overrides={"policy.type": "alphazero"})


def test_presets_resolve_and_yaml(tmp_path):
    for name in PRESETS:
        try:
            cfg = make_config(name)
        except MissingDependencyError:  # an optional extra (box2d, mujoco) not installed: the env check
            cfg = make_config(name, check_env=False)  # is tests/test_envs.py's; the rest still resolves
        assert cfg.exp_name == name
    pong = make_config("pong_muzero")
    assert (pong.env.frame_stack, pong.env.frame_size_px, pong.replay.game_segment_length) == (4, 64, 20)
    assert (pong.mcts.num_simulations, pong.learn.batch_size, pong.learn.optimizer) == (50, 256, "sgd")
    assert pong.learn.ssl_loss_weight > 0 and pong.learn.replay_ratio == 0.25
    f = tmp_path / "c.yaml"
    f.write_text("learn:\n  batch_size: 64\nmcts.num_simulations: 7\n")
    cfg = make_config("cartpole_muzero", yaml_path=str(f), overrides={"learn.batch_size": 32})
    assert cfg.learn.batch_size == 32 and cfg.mcts.num_simulations == 7  # --set wins over YAML


BAD = [
    # (overrides, key named in the message, fragment of what is allowed)
    ({"learn.batch_siz": 3}, "learn.batch_siz", "did you mean 'learn.batch_size'"),
    ({"nosuch": 1}, "nosuch", "no such setting"),
    ({"learn.batch_size": "abc"}, "learn.batch_size", "expected an integer"),
    ({"learn.batch_size": 2.5}, "learn.batch_size", "expected an integer"),
    ({"replay.use_priority": "maybe"}, "replay.use_priority", "expected a bool"),
    ({"learn.batch_size": 0}, "learn.batch_size", ">= 1"),
    ({"learn.num_threads": 0}, "learn.num_threads", ">= 1"),
    ({"replay.priority_beta": 1.5}, "replay.priority_beta", "<= 1"),
    ({"mcts.discount": 0.0}, "mcts.discount", "> 0"),
    ({"learn.optimizer": "adm"}, "learn.optimizer", "did you mean 'adam'"),
    ({"eval.unvisited_q": "mean"}, "eval.unvisited_q", "allowed: parent, min"),
    ({"env.frame_size_px": 80}, "env.frame_size_px", "allowed: 64, 96"),
    ({"env.env_id": "CartPol-v1"}, "env.env_id", "CartPole-v1"),
    ({"env.env_id": "NoSuchEnv-v9"}, "env.env_id", "unknown environment id"),
    ({"policy.type": "alphazero"}, "policy.type", "allowed: muzero"),
    ({"learn.device": "tpu"}, "learn.device", "cpu, auto, cuda"),
    ({"policy.async_pipeline.weight_sync_interval": 0}, "policy.async_pipeline.weight_sync_interval", ">= 1"),
    (
        {"policy.async_pipeline.max_collect_inflight": 3},
        "policy.async_pipeline.max_collect_inflight",
        "num_collector_actors",
    ),
    ({"policy.async_pipeline.poll_interval_s": 0}, "policy.async_pipeline.poll_interval_s", "> 0"),
    ({"env.env_id": "ALE/Pong-v5"}, "model.kind", "conv"),
    ({"learn.lr_milestones": [5, 2]}, "learn.lr_milestones", "increasing"),
    ({"replay.capacity_transitions": 10}, "replay.capacity_transitions", "batch_size"),
    ({"learn": 3}, "learn", "is a section"),
]


@pytest.mark.parametrize(
    "overrides,key,allowed", BAD, ids=[b[1] + ":" + str(list(b[0].values())[0]) for b in BAD]
)
def test_bad_input_fails_clearly_before_any_work(overrides, key, allowed):
    before = set(sys.modules)
    with pytest.raises(ConfigError) as err:
        make_config("cartpole_muzero", overrides=overrides)
    msg = str(err.value)
    assert key in msg and allowed in msg, msg
    assert err.value.key == key
    # nothing heavy was started or even imported by validation (in this process the other tests have
    # imported them already: the fresh interpreter below is the check that can fail)
    assert not {m for m in set(sys.modules) - before if m.split(".")[0] in ("torch", "ray")}


def test_validation_imports_neither_torch_nor_ray_in_a_fresh_interpreter():
    """Every BAD case refused in a new Python process, which then holds no torch or ray module; and importing
    torch there does show up (the check sees imports)."""
    import subprocess

    code = (
        "import json, sys\n"
        "from muzero_tune.config import ConfigError, make_config\n"
        f"for overrides in json.loads({json.dumps(json.dumps([b[0] for b in BAD]))}):\n"
        "    try:\n"
        "        make_config('cartpole_muzero', overrides=overrides)\n"
        "    except ConfigError:\n"
        "        pass\n"
        "    else:\n"
        "        sys.exit(f'accepted {overrides}')\n"
        "heavy = lambda: sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'ray'})\n"
        "before = heavy()\n"
        "import torch\n"
        "print(json.dumps([before, heavy()]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [[], ["torch"]]


def test_unknown_preset():
    with pytest.raises(ConfigError, match="cartpole_muzero"):
        make_config("cartpole_muzro")
