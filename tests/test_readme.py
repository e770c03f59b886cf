"""The README stays true: every Python code block runs (each in a fresh interpreter, in a scratch folder),
the Layout section names what is in the tree, and the package declares its version and licence."""

from __future__ import annotations

import configparser
import importlib.metadata
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md")).read()
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 2


def _block_params() -> list:
    """One param per block; a block that runs a Tune sweep (two full-size CartPole trials, about 55 s here) is
    slow: ``make_trainable`` under ``tune.Tuner`` with a grid search runs end to end in the default tests in
    test_tune.py's sweep fixtures and in every ``conftest.fit_one_trial`` run."""
    slow = pytest.mark.slow
    return [pytest.param(i, marks=slow) if "tune.Tuner(" in block else i for i, block in enumerate(BLOCKS)]


def test_the_readme_has_a_python_block_the_default_tests_run():
    assert any("tune.Tuner(" not in block for block in BLOCKS)


@pytest.mark.parametrize("index", _block_params())
def test_python_block_runs(index, tmp_path):
    """Each README Python block runs in a fresh interpreter (the Tune block is slow).

    Default-tier twin: tests/test_readme.py::test_python_block_runs[0] (a block run as a user runs it) and
    tests/test_sweep_cli.py::test_a_grid_over_any_key_runs_a_trial_per_value_and_a_name_is_never_mixed (the
    trainable under ``tune.Tuner`` with a grid over ``learn.learning_rate``, as the Tune block has it).
    """
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "PYTHONPATH": ROOT}
    res = subprocess.run(
        [sys.executable, "-c", BLOCKS[index]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert res.returncode == 0, f"block {index}:\n{BLOCKS[index]}\n--- stderr:\n{res.stderr[-3000:]}"


def test_layout_section_matches_the_tree():
    layout = README.split("## Layout", 1)[1].split("```", 2)[1]
    named = set(re.findall(r"^\s{2}([\w.]+/?)\s", layout, flags=re.M))  # entries under muzero_tune/
    top = set(re.findall(r"^([\w.]+/?)\s", layout, flags=re.M))
    pkg = os.path.join(ROOT, "muzero_tune")
    have = {
        f + "/" if os.path.isdir(os.path.join(pkg, f)) else f
        for f in os.listdir(pkg)
        if not f.startswith(("_", ".")) or f in ("__init__.py", "__main__.py")
    }
    assert {n for n in named} == have, named ^ have
    for entry in top - {"muzero_tune/"}:
        assert os.path.exists(os.path.join(ROOT, entry.rstrip("/"))), entry


def test_version_and_license():
    import muzero_tune

    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    assert cfg["metadata"]["version"] == "attr: muzero_tune.__version__"  # one place
    assert importlib.metadata.version("muzero-tune") == muzero_tune.__version__
    for cmd in (["muzero-tune"], [sys.executable, "-m", "muzero_tune"]):
        out = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.strip() == f"muzero-tune {muzero_tune.__version__}"
    assert cfg["metadata"]["license"] == "Apache-2.0"
    with open(os.path.join(ROOT, "LICENSE")) as f:
        text = f.read()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert f"Version {muzero_tune.__version__}" in README


def test_every_setting_has_a_row_in_the_configuration_table():
    from muzero_tune.config import leaf_keys

    with open(os.path.join(ROOT, "docs", "configuration.md")) as f:
        table = f.read()
    assert [key for key in leaf_keys() if f"| `{key}` |" not in table] == []


def test_the_files_the_suite_starts_first_exist():
    """conftest's longest-first list names test files that exist (a renamed file would silently lose its
    place at the front)."""
    from tests.conftest import LONGEST_FILES_FIRST

    here = os.path.dirname(os.path.abspath(__file__))
    assert [f for f in LONGEST_FILES_FIRST if not os.path.isfile(os.path.join(here, f))] == []
