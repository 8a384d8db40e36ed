"""Security invariants of the code base: no pickle anywhere, ZMQ and HTTP on loopback by default."""

from __future__ import annotations

import pathlib
import re

import pytest

from ztgi.common.endpoints import DEFAULT_SCHEDULER_URL, ENDPOINT_NAMES, Endpoints
from ztgi.services.gateway.config import GatewayConfig
from ztgi.services.launcher.config import LaunchConfig
from ztgi.services.scheduler.config import SchedulerConfig

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("common", "services", "benchmarks")
UNSAFE_DESERIALIZERS = re.compile(
    r"\bimport (c?pickle|dill|cloudpickle|shelve|marshal)\b|\bfrom (c?pickle|dill|cloudpickle|shelve|marshal) import"
    r"|\bpickle\.|\b(recv|send)_pyobj\b|allow_pickle\s*=\s*True|yaml\.load\(|\bjoblib\.load\(")
TORCH_LOAD = re.compile(r"\btorch\.load\(")


def source_files() -> list[pathlib.Path]:
    files = [path for package in PACKAGES for path in (REPO_ROOT / package).rglob("*.py")]
    assert len(files) > 30, files  # the scan really ran over the package
    return files


def test_no_pickle_anywhere() -> None:
    """No module uses pickle or anything built on it (pyzmq's *_pyobj, numpy allow_pickle, dill, ...)."""
    offenders = [f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}"
                 for path in source_files()
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if UNSAFE_DESERIALIZERS.search(line)]
    assert not offenders, offenders


def test_torch_load_only_with_weights_only() -> None:
    """Every torch.load call passes weights_only=True (plain torch.load unpickles arbitrary objects)."""
    offenders = []
    for path in source_files():
        text = path.read_text()
        for match in TORCH_LOAD.finditer(text):
            call = text[match.end():text.find(")", match.end()) + 1]
            if not re.search(r"weights_only\s*=\s*True", call):
                offenders.append(f"{path.relative_to(REPO_ROOT)}: torch.load({call}")
    assert not offenders, offenders


@pytest.mark.parametrize("name", ENDPOINT_NAMES)
def test_default_endpoints_are_loopback(name: str) -> None:
    """With no configuration the scheduler binds and peers connect on 127.0.0.1 only."""
    endpoints = Endpoints()
    assert endpoints.scheduler_url == DEFAULT_SCHEDULER_URL
    assert endpoints.bind(name).startswith("tcp://127.0.0.1:")
    assert endpoints.connect(name).startswith("tcp://127.0.0.1:")
    assert SchedulerConfig().endpoints.bind(name) == endpoints.bind(name)


def test_other_interfaces_only_when_asked() -> None:
    """A bind beyond loopback needs an explicit --bind-host (compose) or a non-loopback URL."""
    assert Endpoints("tcp://127.0.0.1:7000", bind_host="0.0.0.0").bind("frontend") == "tcp://0.0.0.0:7000"
    assert Endpoints("tcp://scheduler:7000").bind("workers") == "tcp://scheduler:7004"


def test_http_listens_on_loopback_by_default() -> None:
    """The gateway and the launcher serve HTTP on 127.0.0.1 unless --host says otherwise."""
    assert GatewayConfig().host == "127.0.0.1"
    assert LaunchConfig().host == "127.0.0.1"
