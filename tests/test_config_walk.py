"""Every setting, given a bad or extreme value on the command line, is either refused in one line naming it
before any run folder is written, or a tiny run with it completes: no key crashes later with a traceback.

The walk covers every numeric key (nan, inf, a negative value, an absurdly large one) and every free-text key
(empty, a path climbing out of its folder, an absolute path, control characters), each through
``muzero-tune train`` in this process (the command line's own error handling), with the tiny run on the
policy type a key belongs to (its doc line names the type). A value a key allows may still make training
diverge (a huge loss weight): that run stops with the learner's one-line error, naming the settings that
size a step, and keeps its folder.
"""

from __future__ import annotations

import os
import types
import typing

# MLflow binds its log handler to the sys.stderr of its import: imported here, before a test captures stderr
# (a captured stream is closed after its test, and every later log line would fail on it)
import mlflow  # noqa: F401
import pytest

from muzero_tune.cli import main
from muzero_tune.config import POLICY_TYPES, iter_fields

HUGE_INT = 10**12
HUGE_FLOAT = 1e30
NUMERIC_VALUES = ("nan", "inf", "negative", "huge")
ABSOLUTE = "<absolute>"  # an absolute path inside the test's own folder, filled in per test
PATH_VALUES = ("", "../escaped", ABSOLUTE, "a\x01b")

# a run of a few seconds: few envs, few simulations, a small network, one evaluation
TINY = {
    "max_envstep": 96,
    "max_train_iter": 6,
    "max_wall_s": 120,
    "env.collector_env_num": 2,
    "env.evaluator_env_num": 1,
    "env.max_episode_steps": 24,
    "eval.n_episodes": 1,
    "eval.eval_freq": 3,
    "mcts.num_simulations": 3,
    "learn.batch_size": 8,
    "learn.replay_ratio": 0.1,
    "replay.game_segment_length": 8,
    "replay.capacity_transitions": 2000,
    "model.hidden_dim": 16,
    "model.latent_dim": 8,
    "model.value_support_size": 10,
    "model.reward_support_size": 10,
    "model.projection_dim": 16,
    "policy.num_samples": 2,
    "policy.world_model_embed_dim": 16,
    "policy.context_tokens": 4,
    "logging.quiet": True,
}


def _inner(tp):
    """``int | None`` -> int; anything else as it is."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        (tp,) = [a for a in typing.get_args(tp) if a is not type(None)]
    return tp


def _policy_type_of(doc: str) -> str:
    """The type a policy-specific setting belongs to, from its doc's ``type:`` prefix (muzero if none)."""
    head = doc.split(":", 1)[0] if ":" in doc else ""
    head = head.replace("sampled_*", "sampled_muzero")
    named = [t for t in POLICY_TYPES if t in head.split() or head.startswith(t)]
    return named[0] if named else "muzero"


def _cases():
    cases = []
    for key, tp, f in iter_fields():
        tp = _inner(tp)
        elem = typing.get_args(tp)[0] if typing.get_origin(tp) is tuple else tp
        ptype = _policy_type_of(f.metadata.get("doc", ""))
        if elem in (int, float):
            # as typed on the command line ("nan" / "inf" are refused for an int as "expected an integer")
            huge = HUGE_FLOAT if elem is float else HUGE_INT
            values = {"nan": "nan", "inf": "inf", "negative": -1, "huge": huge}
            for kind in NUMERIC_VALUES:
                cases.append(pytest.param(key, values[kind], ptype, id=f"{key}={kind}"))
        elif elem is str and not f.metadata.get("choices"):
            for i, value in enumerate(PATH_VALUES):
                cases.append(pytest.param(key, value, ptype, id=f"{key}=path{i}"))
    return cases


CASES = _cases()


def test_the_walk_covers_every_numeric_and_free_text_key():
    keys = {c.values[0] for c in CASES}
    assert {"learn.learning_rate", "mcts.discount", "seed", "exp_name", "logging.output_dir"} <= keys
    assert len(CASES) >= 4 * 100, len(CASES)


def _written_outside(root: str, allowed: str) -> list[str]:
    out = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            if not path.startswith(allowed + os.sep):
                out.append(path)
    return out


@pytest.mark.parametrize("key, value, ptype", CASES)
def test_a_value_is_refused_in_one_line_or_a_tiny_run_completes(key, value, ptype, tmp_path, capsys):
    cwd = tmp_path / "work"
    cwd.mkdir()
    runs = cwd / "runs"
    if value == ABSOLUTE:
        value = str(tmp_path / "absolute" / "place")
    overrides = {**TINY, "logging.output_dir": str(runs), key: value}
    if key.startswith("logging.mlflow_"):
        overrides["logging.mlflow"] = True  # the key is read only then
    argv = ["train", "--preset", f"cartpole_{ptype}"]
    for k, v in overrides.items():
        argv += ["--set", f"{k}={v}"]
    old = os.getcwd()
    os.chdir(cwd)
    try:
        status = main(argv)
    finally:
        os.chdir(old)
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    if status == 2 and "training diverged" in captured.err:
        # a value the key allows whose run diverged: one line, stopped by the learner, its folder kept
        assert len(lines) == 1 and "learn.learning_rate" in lines[0], (key, value, captured.err)
    elif status == 2:
        assert len(lines) == 1 and key in lines[0], (key, value, captured.err)
        assert not runs.exists() or not any(runs.iterdir()), f"{key}={value!r} wrote {list(runs.iterdir())}"
    else:
        assert status == 0 and "stopped (" in captured.out, (key, value, captured.err)
    if key not in ("logging.output_dir", "logging.mlflow_tracking_uri"):  # these name where to write
        outside = _written_outside(str(tmp_path), str(runs))
        assert not outside, f"{key}={value!r} wrote outside the output folder: {outside[:3]}"
