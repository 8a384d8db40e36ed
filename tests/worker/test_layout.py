"""The worker's layout by role, read from the source's import statements (`ast`, TYPE_CHECKING ones included).

The worker's root holds the service and what only it uses (engine, batch cache, config, registration,
threads, a worker group's processes); below it each folder has one role, and imports flow one way:

    kernels  <  layers  <  lora  <  vision  <  models  <  shards  <  paged, padded  <  the root
    sampling <  models

A folder below the root imports no module of the root but the protocols (`backend.py`), and the
two engines never import each other: what both need lives in `layers/` or `models/`.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

import ztgi

PACKAGE_ROOT = Path(ztgi.__file__).parent
WORKER = "ztgi.services.worker"
MAX_ROOT_FILES = 13
PROTOCOLS = {f"{WORKER}.backend"}
# a folder may import the folders listed after it, and its own
MAY_IMPORT = {
    "kernels": set(),
    "sampling": set(),
    "layers": {"kernels"},
    "lora": {"kernels", "layers"},
    "vision": {"kernels", "layers", "lora"},
    "models": {"kernels", "layers", "lora", "sampling", "vision"},
    "shards": {"kernels", "layers", "lora", "sampling", "models", "vision"},
    "paged": {"kernels", "layers", "lora", "sampling", "models", "shards", "vision"},
    "padded": {"kernels", "layers", "sampling", "models"},
}


def _modules() -> dict[str, Path]:
    """Every module of the product (the `ztgi` package, through its links), by dotted name."""
    found: dict[str, Path] = {}
    for folder, _, files in os.walk(PACKAGE_ROOT, followlinks=True):
        for file in files:
            path = Path(folder, file)
            if path.suffix == ".py":
                parts = path.relative_to(PACKAGE_ROOT).with_suffix("").parts
                found[".".join(("ztgi", *parts)).removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _imported(module: str, path: Path) -> Iterator[str]:
    """The product modules `module` imports, anywhere in the file."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield from _known(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                yield from _known(submodule if submodule in MODULES else base)


def _known(name: str) -> Iterator[str]:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    if name and name != "ztgi":
        yield name


GRAPH = {module: set(_imported(module, path)) - {module} for module, path in MODULES.items()}


def _cycles() -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for start in sorted(GRAPH):
        if start in index:
            continue
        work = [(start, iter(sorted(GRAPH[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(GRAPH.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def _folder(module: str) -> str | None:
    """The worker folder a worker module is in (`paged`, `layers`...); None for the root's modules."""
    parts = module.removeprefix(WORKER + ".").split(".")
    return parts[0] if len(parts) > 1 else None


def _worker_edges() -> Iterator[tuple[str, str]]:
    for module, imported in GRAPH.items():
        if module.startswith(WORKER + "."):
            for other in sorted(imported):
                if other.startswith(WORKER + "."):
                    yield module, other


def test_the_graph_sees_the_worker_imports():
    """The import graph is read from the source: the engine's known imports are in it."""
    assert f"{WORKER}.backend" in GRAPH[f"{WORKER}.engine"]
    assert f"{WORKER}.models.families" in GRAPH[f"{WORKER}.paged.model"]
    assert f"{WORKER}.kernels.native_library" in GRAPH[f"{WORKER}.layers.quantization.block_linear"]


def test_no_import_cycle_in_the_product():
    """No two modules of the product import each other, directly or through others."""
    assert _cycles() == []


def test_the_cycle_check_finds_a_cycle():
    """The cycle check itself: a graph with a loop through three modules reports them."""
    saved = dict(GRAPH)
    try:
        GRAPH.update({"a": {"b"}, "b": {"c"}, "c": {"a"}})
        assert ["a", "b", "c"] in _cycles()
    finally:
        GRAPH.clear()
        GRAPH.update(saved)


def test_at_most_thirteen_files_at_the_worker_root():
    """The worker's root keeps the service and its own pieces; everything else has a folder."""
    root = MODULES[WORKER].parent
    files = sorted(path.name for path in root.iterdir() if path.is_file())
    assert len(files) <= MAX_ROOT_FILES, files


def test_folders_import_no_root_module_but_the_protocols():
    """A module below the worker's root imports nothing from the root but `backend.py`."""
    upward = [(module, other) for module, other in _worker_edges()
              if _folder(module) is not None and _folder(other) is None and other not in PROTOCOLS]
    assert upward == []


def test_folders_import_in_one_direction():
    """kernels < layers < lora < vision < models < shards < paged, padded; sampling < models; the engines
    never import each other."""
    assert {_folder(module) for module in MODULES if module.startswith(WORKER + ".")} - {None} == set(MAY_IMPORT)
    wrong = [(module, other) for module, other in _worker_edges()
             if (here := _folder(module)) is not None and (there := _folder(other)) not in (None, here)
             and there not in MAY_IMPORT[here]]
    assert wrong == []


def test_rotate_is_defined_once():
    """The rotary embedding's arithmetic has one definition in the worker, in layers/rotary.py."""
    defined = [module for module, path in MODULES.items() if module.startswith(WORKER)
               for node in ast.parse(path.read_text()).body
               if isinstance(node, ast.FunctionDef) and node.name == "rotate"]
    assert defined == [f"{WORKER}.layers.rotary"]
