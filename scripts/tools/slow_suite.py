"""The slow checks (``pytest -m slow``) run in pieces that resume, with one record of the whole.

The slow checks take hours on a small machine, longer than one sitting may last. This runs them one piece
at a time (a test file, or each test of ``tests/test_learning.py`` on its own), each in its own pytest
process, and stores each piece's outcome the moment it ends: ``<output-dir>/results/<piece>.json`` (every
test's outcome and seconds, the piece's wall seconds, the commit it ran on and whether the tree had
uncommitted changes, the load average before and after); ``collected.json`` keeps every node id the calls
into the folder collected, which the summary counts against. A second call skips the stored pieces, so a run
that was stopped goes on where it stopped; ``--rerun`` runs them again. ``<output-dir>/summary.md`` is
rebuilt after every piece: totals, the wall time summed over pieces, the commits the pieces ran on, and one
line per test.

    python scripts/tools/slow_suite.py --output-dir runs/slow_suite                 # every slow check
    python scripts/tools/slow_suite.py --output-dir runs/slow_suite --max-wall-s 7200  # none after 2 h
    python scripts/tools/slow_suite.py --output-dir runs/slow_suite --summary-only
    python scripts/tools/slow_suite.py --output-dir runs/x --mark "not slow" --paths tests/test_support.py

Paths are inside the project (``--rootdir``, this repository by default), as pytest's node ids are.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# files whose tests are each a long run of their own: one piece per test
PER_TEST_FILES = ("tests/test_learning.py",)


def collect(root: Path, mark: str, paths: list[str]) -> list[str]:
    """The node ids pytest selects in ``root`` under ``-m mark`` in ``paths`` (``tests/`` when empty)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "--collect-only", "-m", mark, *(paths or ["tests"])]
    out = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    ids = [line.strip() for line in out.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    if out.returncode not in (0, 5) or (out.returncode == 0 and not ids):
        raise SystemExit(f"slow_suite: collecting failed (exit {out.returncode}):\n{out.stdout[-2000:]}"
                         f"{out.stderr[-2000:]}")
    return ids


def pieces(node_ids: list[str]) -> dict[str, list[str]]:
    """Piece name -> its node ids, in collection order: one piece per file, one per test in
    :data:`PER_TEST_FILES`."""
    out: dict[str, list[str]] = {}
    for nid in node_ids:
        path = nid.split("::", 1)[0]
        key = nid if path in PER_TEST_FILES else path
        out.setdefault(key, []).append(nid)
    return out


def piece_file_name(piece: str) -> str:
    """A file name for a piece: its node id with every run of unsafe characters as one ``_``."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", piece).strip("_")[:180] + ".json"


def git_state(root: Path) -> tuple[str, bool]:
    """(HEAD's commit, whether tracked files differ from it); ("unknown", False) outside a git tree."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                    capture_output=True, text=True, check=True).stdout.strip())
        return head, dirty
    except (OSError, subprocess.CalledProcessError):
        return "unknown", False


def parse_junit(xml_path: Path, node_ids: list[str]) -> list[dict]:
    """One dict per test case of a JUnit XML file: ``id`` (its node id among ``node_ids``, matched by the
    test's name), ``outcome`` (passed / failed / error / skipped) and ``seconds``; a failure keeps the start
    of its message."""
    by_name = {nid.rsplit("::", 1)[-1]: nid for nid in node_ids}
    tests = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        name = case.get("name") or ""
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = "failed" if tag == "failure" else tag
                message = (el.get("message") or "")[:400]
                break
        tests.append({"id": by_name.get(name, f"{case.get('classname')}::{name}"), "outcome": outcome,
                      "seconds": round(float(case.get("time") or 0.0), 1), "message": message})
    return tests


def run_piece(root: Path, name: str, node_ids: list[str], mark: str, results_dir: Path) -> dict:
    """Run one piece in its own pytest process and store its record; returns the record."""
    xml_path = results_dir / (piece_file_name(name) + ".xml")
    commit, dirty = git_state(root)
    load_before = os.getloadavg()[0]
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", mark, f"--junitxml={xml_path}", *node_ids]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    wall_s = time.monotonic() - t0
    tests = parse_junit(xml_path, node_ids) if xml_path.exists() else []
    xml_path.unlink(missing_ok=True)
    record = {
        "piece": name, "node_ids": node_ids, "exit_code": proc.returncode, "wall_s": round(wall_s, 1),
        "tests": tests, "commit": commit, "uncommitted_changes": dirty,
        "loadavg_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "output_tail": (proc.stdout + proc.stderr)[-3000:] if proc.returncode not in (0, 5) else "",
    }
    (results_dir / piece_file_name(name)).write_text(json.dumps(record, indent=1))
    return record


def broken(record: dict) -> bool:
    """A piece whose pytest process failed without a test report (a crash, a collection error)."""
    return record["exit_code"] not in (0, 5) and not record["tests"]


def write_summary(out: Path, collected: set[str]) -> tuple[list[dict], str]:
    """Read every stored piece, write ``summary.md``; returns (the records, the summary's text)."""
    records = [json.loads(p.read_text()) for p in sorted((out / "results").glob("*.json"))]
    text = summary(records, collected)
    (out / "summary.md").write_text(text)
    return records, text


def summary(records: list[dict], collected: set[str]) -> str:
    """The markdown record of the stored pieces; ``collected``: the node ids the calls collected (a stored
    piece's tests count as collected too, whichever call ran it)."""
    tests = [t for r in records for t in r["tests"]]
    expected = len(collected | {t["id"] for t in tests}) or None
    counts = Counter(t["outcome"] for t in tests)
    wall_s = sum(r["wall_s"] for r in records)
    commits = Counter((r["commit"][:12], r["uncommitted_changes"]) for r in records)
    lines = ["# Slow checks", ""]
    of = f" of {expected} collected" if expected is not None else ""
    lines.append(f"{len(tests)} tests run{of} in {len(records)} pieces: "
                 + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
                 + f"; {wall_s:,.0f} s wall summed over the pieces (each its own pytest process, one after "
                 "another).")
    lines.append("")
    lines.append("Commits: " + ", ".join(f"{c}{' (uncommitted changes)' if d else ''}: {n} pieces"
                                         for (c, d), n in commits.items()))
    for r in filter(broken, records):
        lines.append(f"\nPiece {r['piece']} ended with exit {r['exit_code']} and no test report.")
    lines += ["", "| test | outcome | seconds |", "|---|---|---|"]
    for t in tests:
        lines.append(f"| `{t['id']}` | {t['outcome']} | {t['seconds']:,.1f} |")
    failed = [t for t in tests if t["outcome"] in ("failed", "error")]
    if failed:
        lines += ["", "## Failures", ""]
        lines += [f"- `{t['id']}`: {t['message']}" for t in failed]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output-dir", required=True, help="where results/ and summary.md go")
    ap.add_argument("--mark", default="slow", help="the marker expression (default: slow)")
    ap.add_argument("--paths", nargs="*", default=[], help="test files or folders (default: tests/)")
    ap.add_argument("--rootdir", default=str(REPO), help="the project the tests run in (default: this one)")
    ap.add_argument("--max-wall-s", type=float, default=None, help="start no new piece after this long")
    ap.add_argument("--rerun", action="store_true", help="run stored pieces again")
    ap.add_argument("--summary-only", action="store_true", help="rebuild summary.md, run nothing")
    args = ap.parse_args(argv)

    out = Path(args.output_dir)
    root = Path(args.rootdir).resolve()
    results_dir = out / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    # every node id collected by the calls into this folder (calls may name different --paths)
    collected_path = out / "collected.json"
    collected = set(json.loads(collected_path.read_text())) if collected_path.exists() else set()
    node_ids = [] if args.summary_only else collect(root, args.mark, args.paths)
    if node_ids:
        collected |= set(node_ids)
        collected_path.write_text(json.dumps(sorted(collected), indent=0))
    t0 = time.monotonic()
    todo = pieces(node_ids)
    for i, (name, ids) in enumerate(todo.items(), 1):
        if (results_dir / piece_file_name(name)).exists() and not args.rerun:
            continue
        if args.max_wall_s is not None and time.monotonic() - t0 > args.max_wall_s:
            print(f"[slow_suite] --max-wall-s {args.max_wall_s:.0f} reached: {name} and later pieces not "
                  "started (a second call resumes)", flush=True)
            break
        print(f"[slow_suite] {i}/{len(todo)} {name} ({len(ids)} tests)", flush=True)
        rec = run_piece(root, name, ids, args.mark, results_dir)
        outcomes = Counter(t["outcome"] for t in rec["tests"])
        print(f"[slow_suite]   exit {rec['exit_code']}, {rec['wall_s']:.0f} s: {dict(outcomes)}", flush=True)
        write_summary(out, collected)
    records, text = write_summary(out, collected)
    print(text.split("\n\n")[1])
    failed = any(t["outcome"] in ("failed", "error") for r in records for t in r["tests"])
    return 1 if failed or any(map(broken, records)) else 0


if __name__ == "__main__":
    sys.exit(main())
