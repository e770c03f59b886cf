"""What the command line tells about presets: ``presets`` (a table), ``presets NAME`` (every setting), and
``train --help`` listing the values of the preset it would run."""

from __future__ import annotations

import pytest

from muzero_tune.cli import main as cli_main


def test_presets_is_a_table_of_env_type_goal_and_budget(capsys):
    assert cli_main(["presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["preset", "env", "policy", "type", "goal", "budget", "(env", "steps)"]
    row = next(line for line in lines if line.startswith("minigrid_empty_muzero "))
    assert row.split()[1:] == ["MiniGrid-Empty-5x5-v0", "muzero", "reward_mean", ">=", "0.9", "20,000"]


def test_presets_name_prints_every_resolved_setting_marking_the_presets_own(capsys):
    assert cli_main(["presets", "minigrid_empty_muzero"]) == 0
    lines = capsys.readouterr().out.splitlines()
    out = {line[2:].split(" = ", 1)[0]: line for line in lines}  # key -> its line
    assert out["mcts.discount"] == "* mcts.discount = 0.95"
    assert out["learn.num_learners"] == "  learn.num_learners = 0"  # not the preset's: the default
    assert cli_main(["presets", "no_such_preset"]) == 2
    assert "allowed: cartpole_muzero" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "line"), [
    (["train", "--help"], "  mcts.discount (float, cartpole_muzero 0.997)"),
    (["train", "--preset", "minigrid_empty_muzero", "--help"],
     "  mcts.discount (float, minigrid_empty_muzero 0.95; default 0.997)"),
    (["train", "--preset=acrobot_muzero", "--help"],
     "  replay.td_steps (int, acrobot_muzero 50; default"),
])  # fmt: skip
def test_train_help_lists_the_values_of_the_preset_it_would_run(argv, line, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli_main(argv)
    assert exit_.value.code == 0
    assert any(text.startswith(line) for text in capsys.readouterr().out.splitlines())
