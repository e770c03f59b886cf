"""The library called from a user's program: it leaves the program's torch thread count as it found it, and
reports through the ``muzero_tune`` logger instead of printing (the CLI prints those records)."""

from __future__ import annotations

import logging

import pytest
import torch

from muzero_tune.config import make_config

TINY = {
    "model.hidden_dim": 32, "model.latent_dim": 16, "mcts.num_simulations": 4, "learn.batch_size": 32,
    "env.collector_env_num": 4, "env.evaluator_env_num": 2, "eval.n_episodes": 2, "eval.eval_freq": 20,
    "replay.game_segment_length": 20, "max_envstep": 300, "stop_value": None, "logging.mlflow": False,
}  # fmt: skip


@pytest.fixture
def no_cli_handlers():
    """The ``muzero_tune`` logger as a program finds it: without the handler ``muzero-tune`` adds (a CLI test
    in this process may have added it)."""
    logger = logging.getLogger("muzero_tune")
    saved = logger.handlers[:]
    logger.handlers.clear()
    yield
    logger.handlers[:] = saved


@pytest.fixture
def three_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    yield
    torch.set_num_threads(before)


def test_train_and_evaluate_keep_the_callers_threads_and_log_instead_of_printing(
    three_threads, no_cli_handlers, tmp_path, capsys, caplog
):
    from muzero_tune.api import evaluate, train

    cfg = make_config("cartpole_muzero", overrides={**TINY, "logging.output_dir": str(tmp_path)})
    with caplog.at_level(logging.INFO, logger="muzero_tune"):
        summary = train(cfg)
        assert torch.get_num_threads() == 3
        ev = evaluate(str(tmp_path / cfg.exp_name), episodes=1)
        assert torch.get_num_threads() == 3
    assert summary.evals and ev.episode_returns
    assert capsys.readouterr().out == ""  # nothing printed into the caller's stdout
    lines = [r.getMessage() for r in caplog.records if r.name == "muzero_tune"]
    assert any("envstep=" in line and "reward_mean=" in line for line in lines)


def test_a_failing_run_restores_the_threads_too(three_threads, tmp_path):
    from muzero_tune.api import train
    from muzero_tune.errors import RunFolderError

    cfg = make_config("cartpole_muzero", overrides={**TINY, "logging.output_dir": str(tmp_path)})
    train(cfg)
    with pytest.raises(RunFolderError):  # the folder holds a run: refused before training
        train(cfg)
    assert torch.get_num_threads() == 3
