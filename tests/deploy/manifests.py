"""deploy/kubernetes rendered by `kubectl kustomize`, and what the tests read from the objects."""

from __future__ import annotations

import math
import pathlib
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
RENDERS = {"shipped": KUBERNETES, "example overlay": KUBERNETES / "overlays" / "example"}
RELEASE = {"app.kubernetes.io/name": "ztgi", "app.kubernetes.io/instance": "ztgi"}

Manifest = dict[str, Any]


def render(directory: pathlib.Path) -> list[Manifest]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the kustomizations cannot be rendered")
    result = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return list(yaml.safe_load_all(result.stdout))


def find(manifests: list[Manifest], kind: str, name: str | None = None) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind and (name is None or m["metadata"]["name"] == name)]


def one(manifests: list[Manifest], kind: str, name: str) -> Manifest:
    [found] = find(manifests, kind, name)
    return found


def containers(manifests: list[Manifest]) -> Iterator[tuple[Manifest, Manifest]]:
    """(Deployment, container) for every container of every Deployment."""
    for deployment in find(manifests, "Deployment"):
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            yield deployment, container


def service_of(container: Manifest) -> str:
    """The ztgi command the container runs: scheduler, tokenizer, worker or gateway."""
    command = container["command"]
    assert command[0] == "ztgi" and len(command) == 2, command
    return str(command[1])


def environment(manifests: list[Manifest], container: Manifest) -> dict[str, Any]:
    """Each variable the container gets: its value, or the `valueFrom` that gives it; ConfigMaps
    named in `envFrom` resolved to their data."""
    env: dict[str, Any] = {}
    for source in container.get("envFrom", []):
        env.update(one(manifests, "ConfigMap", source["configMapRef"]["name"])["data"])
    for variable in container.get("env", []):
        assert variable["name"] not in env, f"{variable['name']} is set twice"
        env[variable["name"]] = variable.get("value", variable.get("valueFrom"))
    return env


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def literal(value: Any, container: Manifest) -> str:
    """A variable's value as the kubelet gives it: a resourceFieldRef is the resource in `divisor`s, rounded up."""
    if isinstance(value, str):
        return value
    field = value["resourceFieldRef"]
    assert field["containerName"] == container["name"] and field["divisor"] == "1"
    return str(math.ceil(cores(container["resources"]["limits"]["cpu"])))


def cores(quantity: str) -> float:
    return int(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def mounted_secret_files(deployment: Manifest, container: Manifest, keys: pathlib.Path) -> dict[str, str]:
    """Each path where the container sees a file of the ztgi-curve Secret, to that file here; a
    directory of them (the scheduler's client keys) to a directory holding them."""
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    files: dict[str, str] = {}
    for mount in container.get("volumeMounts", []):
        secret = volumes[mount["name"]].get("secret")
        if secret is None:
            continue
        assert secret["secretName"] == "ztgi-curve"
        directory = keys.parent / mount["name"]
        directory.mkdir(exist_ok=True)
        for item in secret["items"]:
            shutil.copy(keys / item["key"], directory / item["path"])
            files[f"{mount['mountPath']}/{item['path']}"] = str(directory / item["path"])
        files[mount["mountPath"]] = str(directory)
    return files
