"""Every slow check names its default-tier twin: the default test that fails when the slow one's proof would.

Each test module under ``tests/`` is read as source (``ast``). A test function is slow when one of its
decorators is the ``slow`` mark (``@pytest.mark.slow``, or a name bound to it), when the module's
``pytestmark`` holds it, or, for some of its cases, when a ``pytest.param(..., marks=...)`` of its
parametrize list carries it (written in the decorator, or in a module-level list or function the decorator
names). Its docstring must hold ``Default-tier twin:`` followed, in the same paragraph, by the node ids of
its twins (``tests/test_x.py::test_name`` or ``tests/test_x.py::test_name[case]``); a function slow only in
some cases may name a module-level table instead, whose strings are the node ids. Every node id named must
be a default test: the function exists at the module level of that file and carries no slow mark, and an id
with a ``[case]`` names a case of its parametrize lists that is not slow.
"""

from __future__ import annotations

import ast
import enum
import importlib
import re
import sys
from functools import cache
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
MARKER = "Default-tier twin:"
NODE_ID = re.compile(r"tests/[\w/]+\.py::\w+(?:\[[^\]\s]+\])?")


def _ends_in_mark(node: ast.AST, name: str) -> bool:
    """``node`` is ``<...>.mark.<name>`` (``pytest.mark.slow``, ``mark.slow``)."""
    return (isinstance(node, ast.Attribute) and node.attr == name
            and (ast.unparse(node.value) == "mark" or ast.unparse(node.value).endswith(".mark")))  # fmt: skip


class Module:
    """One test module's source: its module-level definitions and the slow marks in it."""

    def __init__(self, path: Path):
        self.path = path
        self.tree = ast.parse(path.read_text(), filename=str(path))
        self.defs: dict[str, ast.AST] = {}  # module-level names: assigned values and functions
        for node in self.tree.body:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self.defs[target.id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
                self.defs[node.target.id] = node.value
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.defs[node.name] = node
        self.aliases: set[str] = set()  # names bound to the slow mark anywhere in the module
        assigns = [n for n in ast.walk(self.tree) if isinstance(n, ast.Assign)]
        while True:
            new = {t.id for a in assigns if self.is_slow(a.value)
                   for t in a.targets if isinstance(t, ast.Name)}  # fmt: skip
            if new <= self.aliases:
                break
            self.aliases |= new
        self.module_slow = "pytestmark" in self.defs and self.is_slow(self.defs["pytestmark"])
        self.tests = {n.name: n for n in self.tree.body
                      if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test")}

    def is_slow(self, node: ast.AST) -> bool:
        """``node`` is the slow mark, a name bound to it, or a list or tuple holding one of those."""
        if isinstance(node, (ast.List, ast.Tuple)):
            return any(self.is_slow(e) for e in node.elts)
        if isinstance(node, ast.Name):
            return node.id in self.aliases
        if isinstance(node, ast.Call):  # pytest.mark.slow(reason=...)
            node = node.func
        return _ends_in_mark(node, "slow")

    def whole_slow(self, fn: ast.FunctionDef) -> bool:
        return self.module_slow or any(self.is_slow(d) for d in fn.decorator_list)

    def parametrize(self, fn: ast.FunctionDef) -> list[ast.Call]:
        return [d for d in fn.decorator_list
                if isinstance(d, ast.Call) and _ends_in_mark(d.func, "parametrize")]  # fmt: skip

    def slow_cases(self, fn: ast.FunctionDef) -> bool:
        """A ``pytest.param`` with the slow mark among its parametrize lists (followed through the
        module-level names the decorators use)."""
        todo: list[ast.AST] = list(self.parametrize(fn))
        seen: set[str] = set()
        while todo:
            for sub in ast.walk(todo.pop()):
                if isinstance(sub, ast.Name) and sub.id in self.defs and sub.id not in seen:
                    seen.add(sub.id)
                    todo.append(self.defs[sub.id])
                if (isinstance(sub, ast.Call) and ast.unparse(sub.func).split(".")[-1] == "param"
                        and any(k.arg == "marks" and self.is_slow(k.value) for k in sub.keywords)):
                    return True
        return False

@cache
def module(rel: str) -> Module:
    return Module(ROOT / rel)


def _test_modules() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in TESTS.rglob("test_*.py"))


def _case_id(value, argname: str, index: int) -> str:
    """The id pytest gives one argument value it was not given an id for."""
    if isinstance(value, str):
        return value.encode("unicode_escape").decode("ascii")
    if value is None or isinstance(value, (int, float, bool, complex)):
        return str(value)
    if isinstance(value, enum.Enum):
        return str(value)
    if isinstance(getattr(value, "__name__", None), str) and (isinstance(value, type) or callable(value)):
        return value.__name__
    return f"{argname}{index}"


def _one_list(mark) -> list[tuple[str, bool]]:
    """(id, slow) of each case of one parametrize mark."""
    import pytest

    ParameterSet = type(pytest.param(None))
    argnames, argvalues = mark.args[0], list(mark.args[1])
    names = [a.strip() for a in argnames.split(",")] if isinstance(argnames, str) else list(argnames)
    ids = mark.kwargs.get("ids")
    out = []
    for i, v in enumerate(argvalues):
        ps = v if isinstance(v, ParameterSet) else ParameterSet.extract_from(v, force_tuple=len(names) == 1)
        slow = any(m.name == "slow" for m in ps.marks)
        if ps.id is not None:
            case = ps.id
        elif isinstance(ids, (list, tuple)) and i < len(ids) and ids[i] is not None:
            case = str(ids[i])
        elif callable(ids):
            got = [(ids(x), x, n) for x, n in zip(ps.values, names)]
            case = "-".join(str(g) if g is not None else _case_id(x, n, i) for g, x, n in got)
        else:
            case = "-".join(_case_id(x, n, i) for x, n in zip(ps.values, names))
        out.append((case, slow))
    return out


def _imported(rel: str):
    """The test module ``rel`` as pytest imports it (by its name, from ``tests/`` on the path)."""
    if str(TESTS) not in sys.path:  # pytest puts it there when it imports the test modules
        sys.path.insert(0, str(TESTS))
    return importlib.import_module(Path(rel).stem)


def table_ids(rel: str, name: str) -> list[str] | None:
    """The node ids among the strings of the module-level table ``name`` of ``rel`` (its values, for a
    dict), or None when ``name`` is no table."""
    table = getattr(_imported(rel), name, None)
    if isinstance(table, dict):
        table = list(table.values())
    if not isinstance(table, (list, tuple)):
        return None
    items = [x for v in table for x in (v if isinstance(v, (list, tuple)) else [v])]
    return [x for x in items if isinstance(x, str) and NODE_ID.fullmatch(x)]


def cases(rel: str, name: str) -> dict[str, bool]:
    """Every case id of ``name`` in ``rel`` (its parametrize lists crossed as pytest crosses them, the
    decorator nearest the function first) -> whether that case is slow."""
    fn = getattr(_imported(rel), name)
    combined = {"": False}
    for mark in [m for m in getattr(fn, "pytestmark", []) if m.name == "parametrize"]:
        combined = {f"{c}-{d}" if c else d: s or t for c, s in combined.items() for d, t in _one_list(mark)}
    return combined


def twin_problem(node_id: str) -> str | None:
    """Why ``node_id`` is not a default test, or None when it is one."""
    rel, _, rest = node_id.partition("::")
    name, _, case = rest.partition("[")
    case = case[:-1] if case else ""
    if not (ROOT / rel).is_file():
        return f"{node_id}: no file {rel}"
    mod = module(rel)
    fn = mod.tests.get(name)
    if fn is None:
        return f"{node_id}: no test function {name} in {rel}"
    if mod.whole_slow(fn):
        return f"{node_id}: slow itself"
    if not case:
        return None
    if not mod.parametrize(fn):
        return f"{node_id}: {name} is not parametrised"
    found = cases(rel, name)
    if case not in found:
        return f"{node_id}: no case [{case}] among {sorted(found)}"
    return f"{node_id}: the case [{case}] is slow" if found[case] else None


def slow_tests() -> list[tuple[str, Module, ast.FunctionDef, bool]]:
    """(file::name, its module, its function, slow in some cases only) of every slow test."""
    out = []
    for rel in _test_modules():
        mod = module(rel)
        for name, fn in mod.tests.items():
            whole = mod.whole_slow(fn)
            if whole or mod.slow_cases(fn):
                out.append((f"{rel}::{name}", mod, fn, not whole))
    return out


def twins_of(mod: Module, fn: ast.FunctionDef, cases_only: bool) -> tuple[list[str], str | None]:
    """The twin node ids a slow test's docstring names, or why it names none."""
    doc = ast.get_docstring(fn) or ""
    if MARKER not in doc:
        return [], f"its docstring has no '{MARKER}' line"
    text = doc.split(MARKER, 1)[1].split("\n\n")[0]
    ids = NODE_ID.findall(text)
    if cases_only:
        rel = str(mod.path.relative_to(ROOT))
        for word in re.findall(r"\b[A-Za-z_]\w*\b", text):
            if word in mod.defs and not isinstance(mod.defs[word], (ast.FunctionDef, ast.AsyncFunctionDef)):
                ids += table_ids(rel, word) or []
    return ids, None if ids else f"'{MARKER}' is followed by no node id"


def test_the_checker_sees_each_way_the_suite_marks_a_test_slow(tmp_path):
    """Each form of the slow mark the suite uses is found (a decorator, a ``pytest.param`` in the decorator's
    list, one in a list a module-level function builds from a name bound to the mark) and so is a module-level
    ``pytestmark``; a mark inside a string, a ``skipif`` and another mark are not slow; a twin's id is
    checked down to its case."""
    found = {(mod.path.name, fn.name, only) for _, mod, fn, only in slow_tests()}
    assert ("test_learning.py", "test_preset_reaches_its_threshold", False) in found  # @pytest.mark.slow
    assert ("test_atari_smoke.py", "test_pong_smoke_run_writes_loadable_checkpoints", True) in found
    assert ("test_readme.py", "test_python_block_runs", True) in found  # slow = pytest.mark.slow; marks=slow
    assert not any(name == "test_slow_suite_tool.py" for name, _, _ in found)  # a mark inside a string only
    assert not module("tests/test_proc_cpu.py").module_slow  # its pytestmark is a skipif
    src = tmp_path / "test_src.py"
    src.write_text("import pytest\npytestmark = [pytest.mark.slow]\n\n\ndef test_a():\n    pass\n")
    whole = Module(src)
    assert whole.module_slow and whole.whole_slow(whole.tests["test_a"])
    src.write_text("import pytest\n\n\n@pytest.mark.timeout(5)\ndef test_a():\n    pass\n")
    timed = Module(src)
    assert not timed.whole_slow(timed.tests["test_a"]) and not timed.slow_cases(timed.tests["test_a"])

    pong = "tests/test_atari_smoke.py::test_pong_smoke_run_writes_loadable_checkpoints"
    assert twin_problem(f"{pong}[sync]") is None
    assert "is slow" in twin_problem(f"{pong}[async]")
    assert "no case" in twin_problem(f"{pong}[gpu]")
    assert "slow itself" in twin_problem("tests/test_learning.py::test_preset_reaches_its_threshold")
    assert "no test function" in twin_problem("tests/test_slow_marks.py::test_nothing_of_that_name")
    assert "no file" in twin_problem("tests/test_nothing_here.py::test_a")
    assert twin_problem("tests/test_slow_marks.py::test_every_slow_test_names_a_default_tier_twin") is None


def test_every_slow_test_names_a_default_tier_twin():
    problems = []
    for where, mod, fn, cases_only in slow_tests():
        ids, why = twins_of(mod, fn, cases_only)
        if why:
            problems.append(f"{where}: {why}")
        problems += [f"{where}: twin {p}" for p in filter(None, map(twin_problem, ids))]
    assert not problems, "\n".join(problems)
