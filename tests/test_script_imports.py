"""Every script under scripts/ imports names that exist: a module moved inside the package, or a helper
moved between script folders, breaks a benchmark that no default test runs, so each `from X import name`
of a script is resolved here without running the script."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _from_imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of each top-level or nested `from module import names` in one script."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
            out.append((node.module, [alias.name for alias in node.names]))
    return out


def _is_ours(module: str, folder: Path) -> bool:
    """The package's own modules and the scripts' sibling helpers; third-party imports are the
    installer's concern."""
    root = module.split(".")[0]
    return root == "muzero_tune" or (folder / f"{root}.py").exists()


def _is_submodule(module: str, name: str) -> bool:
    try:
        importlib.import_module(f"{module}.{name}")
    except ImportError:
        return False
    return True


SCRIPT_FILES = sorted(SCRIPTS.rglob("*.py"))


def test_the_scripts_folder_is_found():
    assert len(SCRIPT_FILES) > 10, SCRIPTS


@pytest.mark.parametrize("path", SCRIPT_FILES, ids=lambda p: str(p.relative_to(SCRIPTS)))
def test_a_scripts_imports_resolve(path, monkeypatch):
    monkeypatch.setattr(sys, "path", [str(path.parent), *sys.path])
    missing = []
    for module, names in _from_imports(path):
        if not _is_ours(module, path.parent):
            continue
        try:
            loaded = importlib.import_module(module)
        except ModuleNotFoundError as err:
            missing.append(f"{module} ({err})")
            continue
        missing += [f"{module}.{name}" for name in names
                    if name != "*" and not hasattr(loaded, name) and not _is_submodule(module, name)]
    assert not missing, f"{path.relative_to(SCRIPTS.parent)} imports what does not exist: {missing}"
