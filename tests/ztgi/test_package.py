"""The public surface: what `ztgi` exports, and a command line that stays light."""

from __future__ import annotations

import ast
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import ztgi
from ztgi.common.client.async_client import AsyncZtgiClient
from ztgi.common.client.sync_client import ZtgiClient


def test_exports() -> None:
    """`from ztgi import ...` gives the offline API, the direct clients and the version."""
    from ztgi import LLM, AsyncClient, Client, RequestOutput, SamplingParams
    from ztgi.llm import LLM as llm_class

    assert (Client, AsyncClient) == (ZtgiClient, AsyncZtgiClient)
    assert (LLM is llm_class and SamplingParams.__name__ == "SamplingParams"
            and RequestOutput.__name__ == "RequestOutput")
    assert ztgi.__version__ and set(ztgi.__all__) <= set(dir(ztgi))
    assert all(getattr(ztgi, name) is not None for name in ztgi.__all__)
    with pytest.raises(AttributeError, match="nothing_here"):
        ztgi.nothing_here  # noqa: B018


def test_command_line_does_not_load_torch() -> None:
    """`ztgi gateway` and friends start through ztgi.cli: importing it (and ztgi) loads no model code."""
    code = "import sys, ztgi, ztgi.cli; print('torch' in sys.modules, 'transformers' in sys.modules)"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert completed.stdout.split() == ["False", "False"], completed.stderr


REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "ztgi", "common", "services", "benchmarks")


def test_a_wheel_installs_one_import_name(tmp_path: Path) -> None:
    """A built wheel holds `ztgi` alone (common, services and benchmarks inside it), with its data files."""
    for name in SOURCES:
        source, target = REPO_ROOT / name, tmp_path / "src" / name
        if source.is_dir():
            shutil.copytree(source, target, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(exist_ok=True)
            shutil.copy(source, target)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(tmp_path / "src")], check=True, capture_output=True, timeout=300)
    [wheel] = (tmp_path / "dist").glob("ztgi-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"ztgi", f"{wheel.name.split('-py')[0]}.dist-info"}
    for expected in ("ztgi/common/codec.py", "ztgi/services/worker/service.py", "ztgi/bench/data/mixed.jsonl",
                     "ztgi/services/gateway/openapi.json", "ztgi/services/worker/kernels/csrc/block_linear.c"):
        assert expected in names
    assert not any(name.startswith("ztgi/studies") for name in names)


def test_no_module_imports_the_repository_folders_bare() -> None:
    """Every import names ztgi.common, ztgi.services or ztgi.bench, never the bare folder (two copies)."""
    bare = []
    for folder in ("ztgi", "common", "services", "benchmarks", "studies", "tests"):
        for path in (REPO_ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                bare += [f"{path}: {name}" for name in names
                         if name.split(".")[0] in ("common", "services", "benchmarks")]
    assert bare == []


def test_cli_main_leaves_the_callers_stop_signals_alone(tmp_path) -> None:
    """`ztgi.cli.main` called from Python returns with SIGTERM, SIGINT and SIGHUP as they were: only
    the `ztgi` process itself turns deaf to them while it exits. (A caller left ignoring SIGTERM
    passes that on to every child it forks, which `terminate()` can then no longer stop.)"""
    from ztgi.cli import main as cli_main
    from ztgi.common.early_stop import STOP_SIGNALS

    before = [signal.getsignal(signum) for signum in STOP_SIGNALS]
    assert cli_main(["keygen", str(tmp_path), "scheduler"]) == 0
    assert [signal.getsignal(signum) for signum in STOP_SIGNALS] == before
