"""``scripts/tools/slow_suite.py``: the slow checks in resumable pieces, one record of the whole.

Run on a small project of its own (a passing test, a failing one, a slow-marked one and a learning file whose
tests are pieces of their own), so the record's counts, the failure and the resume are known in advance.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "scripts" / "tools" / "slow_suite.py"


def _project(root: Path) -> None:
    (root / "tests").mkdir(parents=True)
    (root / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: long\n")
    (root / "tests" / "test_a.py").write_text(textwrap.dedent("""
        import pytest

        def test_ok():
            assert True

        def test_bad():
            assert 1 == 2, "one is not two"

        @pytest.mark.slow
        def test_long():
            assert True
    """))
    (root / "tests" / "test_learning.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.parametrize("seed", [0, 1])
        def test_goal(seed):
            assert seed >= 0
    """))


def _tool(root: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), "--rootdir", str(root), "--output-dir", str(out),
                           "--mark", "not slow", *extra], capture_output=True, text=True, timeout=300)


def test_pieces_are_recorded_with_their_failures_and_a_second_call_runs_only_what_is_missing(tmp_path):
    root, out = tmp_path / "proj", tmp_path / "out"
    _project(root)
    first = _tool(root, out)
    assert first.returncode == 1, first.stdout + first.stderr  # a failing test fails the tool
    results = sorted(p.name for p in (out / "results").glob("*.json"))
    # one piece for test_a.py, one per learning test; the slow-marked test is not selected
    assert results == ["tests_test_a.py.json", "tests_test_learning.py_test_goal_0.json",
                       "tests_test_learning.py_test_goal_1.json"]
    record = json.loads((out / "results" / "tests_test_a.py.json").read_text())
    outcomes = {t["id"]: t["outcome"] for t in record["tests"]}
    assert outcomes == {"tests/test_a.py::test_ok": "passed", "tests/test_a.py::test_bad": "failed"}
    assert record["commit"] == "unknown" and record["exit_code"] == 1
    text = (out / "summary.md").read_text()
    assert "4 tests run of 4 collected in 3 pieces: 1 failed, 3 passed" in text
    assert "`tests/test_a.py::test_bad`: " in text and "one is not two" in text

    # a stopped run resumes: only the missing piece runs again, the stored ones are kept as they are
    kept = {name: (out / "results" / name).read_bytes() for name in results[:2]}
    (out / "results" / results[2]).unlink()
    second = _tool(root, out)
    assert second.returncode == 1
    assert "tests/test_learning.py::test_goal[1]" in second.stdout
    assert "tests/test_a.py (" not in second.stdout
    assert {name: (out / "results" / name).read_bytes() for name in results[:2]} == kept
    assert "4 tests run of 4 collected in 3 pieces" in (out / "summary.md").read_text()

    # a wall budget already spent starts no piece, even with --rerun
    third = _tool(root, out, "--rerun", "--max-wall-s", "0")
    assert "--max-wall-s 0 reached" in third.stdout
    assert {name: (out / "results" / name).read_bytes() for name in results[:2]} == kept

    # the stored pieces count as collected even when the calls that ran them left no collected.json behind
    (out / "collected.json").unlink()
    fourth = _tool(root, out, "--paths", "tests/test_learning.py")
    assert "4 tests run of 4 collected in 3 pieces" in (out / "summary.md").read_text(), fourth.stdout
