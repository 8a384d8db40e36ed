"""The installed bench tool stays a tool: few files, public surfaces only, no studies."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOL = ROOT / "benchmarks"
MAX_TOOL_FILES = 30
ALLOWED_COMMON = ("ztgi.common.config", "ztgi.common.logs", "ztgi.common.model_source", "ztgi.common.gc_freeze",
                  "ztgi.common.child_process", "ztgi.common.free_ports", "ztgi.common.health_probe")


def imported_modules(path: pathlib.Path) -> list[str]:
    """Every module `path` imports, at any depth (imports inside functions count)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] if node.level == 0 else [f".{node.module}"]
    return names


def test_the_tool_keeps_at_most_30_python_files() -> None:
    files = sorted(TOOL.rglob("*.py"))
    assert 0 < len(files) <= MAX_TOOL_FILES, [f.name for f in files]


@pytest.mark.parametrize("path", sorted(TOOL.rglob("*.py")), ids=lambda p: p.name)
def test_the_tool_imports_public_surfaces_only(path: pathlib.Path) -> None:
    """No service internals, no studies, no relative imports; of ztgi.common only the generic helpers."""
    for name in imported_modules(path):
        assert not name.startswith(("ztgi.services", "services", "studies", ".")), f"{path.name} imports {name}"
        assert not name.startswith(("common", "benchmarks")), f"{path.name} imports {name} bare"
        if name.startswith("ztgi.common"):
            assert name in ALLOWED_COMMON, f"{path.name} imports {name}"


@pytest.mark.parametrize("folder", ["ztgi", "common", "services", "benchmarks"])
def test_nothing_installed_imports_the_studies(folder: str) -> None:
    for path in sorted((ROOT / folder).rglob("*.py")):
        if path.is_relative_to(ROOT / "ztgi") and path.resolve() != path:
            continue  # ztgi/common, ztgi/services and ztgi/bench are links to the folders checked themselves
        assert not any(name.startswith("studies") for name in imported_modules(path)), path
