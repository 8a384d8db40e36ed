"""deploy/kubernetes: rendered by `kubectl kustomize`, valid against the Kubernetes schemas, and tied
to the code it runs.

No cluster here: the manifests are rendered with kubectl (skipped where it is absent), every object
is checked offline against the API schemas `kubernetes-validate` bundles (strict: an unknown field
fails), and what the manifests say is compared with what ztgi does: each variable they set is one
the service in that container reads (and the values build a valid config, keys included), the
Services expose the ports the services bind, the NetworkPolicy selects the scheduler and admits the
release's pods, the probes ask routes the gateway has and files the peers write.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import pathlib
from typing import Any

import pytest

from tests.deploy.manifests import (
    RELEASE,
    RENDERS,
    Manifest,
    containers,
    cores,
    environment,
    literal,
    matches,
    mounted_secret_files,
    one,
    render,
    service_of,
)
from ztgi.common import curve, model_source
from ztgi.common.config import config_from_namespace, env_name
from ztgi.common.endpoints import ENDPOINT_NAMES, Endpoints
from ztgi.common.flags_reference import COMMANDS, config_class
from ztgi.services.gateway.app import make_app
from ztgi.services.gateway.config import GatewayConfig

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed (pip install -e '.[dev]')")

# Variables the manifests set that are no flag: who reads each
NON_FLAG_VARIABLES = {
    "ZTGI_CACHE_DIR": inspect.getsource(model_source.cache_root),
    "HF_HOME": "huggingface_hub: the Hub cache (a Hub model id's download)",
}


@pytest.fixture(scope="module", params=list(RENDERS))
def manifests(request: pytest.FixtureRequest) -> list[Manifest]:
    return render(RENDERS[request.param])


@pytest.fixture(scope="module")
def shipped() -> list[Manifest]:
    return render(RENDERS["shipped"])


# -- the schemas ---------------------------------------------------------------------------------

def test_every_object_is_valid_against_the_kubernetes_schemas(manifests: list[Manifest]) -> None:
    """Each rendered object validates (strict: no unknown field) against the newest bundled API."""
    version = kubernetes_validate.latest_version()
    assert {m["kind"] for m in manifests} >= {"Deployment", "Service", "ConfigMap", "NetworkPolicy",
                                               "PodDisruptionBudget"}
    for manifest in manifests:
        kubernetes_validate.validate(manifest, version, strict=True)


def test_the_schema_check_refuses_a_misspelled_field(shipped: list[Manifest]) -> None:
    """The validation above is not vacuous: a container field spelled wrong is refused."""
    deployment = one(shipped, "Deployment", "ztgi-worker")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(), strict=True)


# -- the shape -----------------------------------------------------------------------------------

def test_one_scheduler_and_each_tier_scaled_on_its_own(manifests: list[Manifest]) -> None:
    """One scheduler Deployment, replaced (Recreate) not rolled; a Deployment per scalable tier;
    every pod of the release carries the release's labels."""
    scheduler = one(manifests, "Deployment", "ztgi-scheduler")
    assert scheduler["spec"]["replicas"] == 1 and scheduler["spec"]["strategy"]["type"] == "Recreate"
    services = sorted(service_of(c) for _, c in containers(manifests))
    assert services == ["gateway", "scheduler", "tokenizer", "worker"]
    for deployment, _ in containers(manifests):
        assert matches(RELEASE, deployment["spec"]["template"]["metadata"]["labels"])


def test_the_images_come_from_the_kustomize_image_entry() -> None:
    """Every container runs the image the kustomization names: as shipped, and as the overlay sets it."""
    for name, expected in (("shipped", "ztgi:latest"), ("example overlay", "registry.example.com/ztgi:0.1.0")):
        assert {c["image"] for _, c in containers(render(RENDERS[name]))} == {expected}


# -- the variables -------------------------------------------------------------------------------

def test_every_variable_is_one_the_service_reads(manifests: list[Manifest]) -> None:
    """Each ZTGI_* variable a container sets is a flag of the service it runs (docs/flags.md); the
    others are the few read outside the flags."""
    config_paths = dict(COMMANDS)
    for _, container in containers(manifests):
        cls = config_class(config_paths[f"ztgi {service_of(container)}"])
        flags = {env_name(field.name) for field in _fields(cls)}
        for variable in environment(manifests, container):
            assert variable in flags or variable in NON_FLAG_VARIABLES, \
                f"{service_of(container)} reads no {variable}"
    assert "ZTGI_CACHE_DIR" in NON_FLAG_VARIABLES["ZTGI_CACHE_DIR"]


def test_the_variables_make_a_valid_config_with_keys_from_ztgi_keygen(
        manifests: list[Manifest], tmp_path: pathlib.Path) -> None:
    """Each service's config built from the container's variables (CURVE files as `ztgi keygen`
    writes them, where the Secret's items put them) validates: limits agree, key files load."""
    curve.write_keypair(str(tmp_path / "keys"), "scheduler")
    curve.write_keypair(str(tmp_path / "keys"), "peer")
    config_paths = dict(COMMANDS)
    for deployment, container in containers(manifests):
        files = mounted_secret_files(deployment, container, tmp_path / "keys")
        env = {name: literal(value, container) for name, value in environment(manifests, container).items()}
        env = {name: files.get(value, value) for name, value in env.items()}
        cls = config_class(config_paths[f"ztgi {service_of(container)}"])
        config_from_namespace(cls, argparse.Namespace(), environ=env)
    assert (tmp_path / "keys" / "peer.key").exists()


def _fields(cls: type) -> list[Any]:
    return list(dataclasses.fields(cls))


def test_worker_threads_follow_the_cpu_limit(manifests: list[Manifest]) -> None:
    """A worker's torch threads are its own CPU limit in whole cores (a fraction would round up
    to a thread more than the quota pays for)."""
    worker = one(manifests, "Deployment", "ztgi-worker")["spec"]["template"]["spec"]["containers"][0]
    reference = environment(manifests, worker)["ZTGI_NUM_THREADS"]["resourceFieldRef"]
    assert reference == {"containerName": "worker", "resource": "limits.cpu", "divisor": "1"}
    assert cores(worker["resources"]["limits"]["cpu"]).is_integer()


# -- ports and the network policy ----------------------------------------------------------------

def test_the_scheduler_service_exposes_the_ports_the_scheduler_binds(manifests: list[Manifest]) -> None:
    """ZTGI_SCHEDULER_URL names the scheduler's Service, and the Service and the container expose,
    by endpoint name, exactly the five ports the scheduler binds from that URL on every interface."""
    scheduler = one(manifests, "Deployment", "ztgi-scheduler")
    container = scheduler["spec"]["template"]["spec"]["containers"][0]
    env = environment(manifests, container)
    endpoints = Endpoints(env["ZTGI_SCHEDULER_URL"], env["ZTGI_BIND_HOST"])
    bound = {name: endpoints.bind(name) for name in ENDPOINT_NAMES}
    assert set(bound.values()) == {f"tcp://0.0.0.0:{p['containerPort']}" for p in container["ports"]}
    service = one(manifests, "Service", endpoints.connect("frontend").split("//")[1].split(":")[0])
    assert matches(service["spec"]["selector"], scheduler["spec"]["template"]["metadata"]["labels"])
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for port in service["spec"]["ports"]:
        assert endpoints.connect(port["name"]).endswith(f":{port['port']}")
        assert bound[port["name"]] == f"tcp://0.0.0.0:{container_ports[port['targetPort']]}"
    assert {p["name"] for p in service["spec"]["ports"]} == set(ENDPOINT_NAMES)


def test_the_gateway_service_is_one_address_on_the_port_the_gateways_listen_on(manifests: list[Manifest]) -> None:
    """The `ztgi` Service's 8080 reaches every gateway pod, on the port ZTGI_PORT makes it listen on."""
    gateway = one(manifests, "Deployment", "ztgi-gateway")
    container = gateway["spec"]["template"]["spec"]["containers"][0]
    env = environment(manifests, container)
    service = one(manifests, "Service", "ztgi")
    [port] = service["spec"]["ports"]
    assert port["port"] == 8080 and service["spec"]["type"] == "ClusterIP"
    assert matches(service["spec"]["selector"], gateway["spec"]["template"]["metadata"]["labels"])
    [http] = [p for p in container["ports"] if p["name"] == port["targetPort"]]
    assert str(http["containerPort"]) == env["ZTGI_PORT"] and env["ZTGI_HOST"] == "0.0.0.0"


def test_the_network_policy_admits_only_the_release_to_the_scheduler(manifests: list[Manifest]) -> None:
    """It selects the scheduler's pods and no other; it admits every pod of the release (by label),
    to the scheduler's five ports only."""
    policy = one(manifests, "NetworkPolicy", "ztgi-scheduler")
    selector = policy["spec"]["podSelector"]["matchLabels"]
    for deployment, container in containers(manifests):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert matches(selector, labels) == (service_of(container) == "scheduler")
    [rule] = policy["spec"]["ingress"]
    [source] = rule["from"]
    assert set(source) == {"podSelector"} and matches(source["podSelector"]["matchLabels"], RELEASE)
    for deployment, _ in containers(manifests):
        assert matches(source["podSelector"]["matchLabels"], deployment["spec"]["template"]["metadata"]["labels"])
    scheduler = one(manifests, "Deployment", "ztgi-scheduler")["spec"]["template"]["spec"]["containers"][0]
    bound_ports = {("TCP", p["containerPort"]) for p in scheduler["ports"]}
    assert {(p["protocol"], p["port"]) for p in rule["ports"]} == bound_ports
    assert policy["spec"]["policyTypes"] == ["Ingress"]


# -- probes, metrics, disruptions ----------------------------------------------------------------

def gateway_routes() -> set[tuple[str, str]]:
    app = make_app(GatewayConfig())
    return {(route.method, route.resource.canonical) for route in app.router.routes() if route.resource is not None}


def test_gateway_probes_and_metrics_ask_routes_the_gateway_has(manifests: list[Manifest]) -> None:
    """Readiness is /health (503 until a worker is ready); liveness a route that asks nothing of
    the scheduler, so a gateway waiting for workers is not restarted; the scrape path is /metrics."""
    gateway = one(manifests, "Deployment", "ztgi-gateway")["spec"]["template"]
    container = gateway["spec"]["containers"][0]
    routes = gateway_routes()
    readiness, liveness = container["readinessProbe"]["httpGet"], container["livenessProbe"]["httpGet"]
    assert readiness["path"] == "/health" and liveness["path"] == "/ping"
    annotations = gateway["metadata"]["annotations"]
    for path in (readiness["path"], liveness["path"], annotations["prometheus.io/path"]):
        assert ("GET", path) in routes
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == environment(manifests, container)["ZTGI_PORT"]


def test_ping_asks_nothing_of_the_scheduler() -> None:
    """The liveness route's handler never touches the scheduler client."""
    from ztgi.services.gateway import handlers
    assert "CLIENT" not in inspect.getsource(handlers.ping)


def test_peer_probes_read_the_ready_file_the_peer_writes(manifests: list[Manifest]) -> None:
    """Workers and tokenizers: readiness is `ztgi probe` on the ZTGI_READY_FILE the service writes,
    on a writable volume, allowing several heartbeats; no liveness probe (a peer whose scheduler is
    away is not broken, and restarting it would not bring the scheduler back)."""
    for deployment, container in containers(manifests):
        if service_of(container) not in ("worker", "tokenizer"):
            continue
        env = environment(manifests, container)
        command = container["readinessProbe"]["exec"]["command"]
        assert command[:4] == ["ztgi", "probe", "--ready-file", env["ZTGI_READY_FILE"]]
        max_age_s = float(command[command.index("--max-age-s") + 1])
        assert max_age_s >= 5 * int(env.get("ZTGI_HEARTBEAT_INTERVAL_MS", 1000)) / 1000
        assert _writable(deployment, container, env["ZTGI_READY_FILE"])
        assert "livenessProbe" not in container


def test_the_grace_period_outlasts_each_drain(manifests: list[Manifest]) -> None:
    """The kubelet's SIGKILL comes after the scheduler's and the workers' drains and after the
    gateway's wait for the endpoints to drop it plus its streams' shutdown timeout, as the configs
    read them."""
    config_paths = dict(COMMANDS)
    drains = {"scheduler": "drain_timeout_s", "worker": "drain_timeout_s", "gateway": "shutdown_timeout_s"}
    for deployment, container in containers(manifests):
        service = service_of(container)
        if service not in drains:
            continue
        env = {name: literal(value, container) for name, value in environment(manifests, container).items()}
        env = {name: value for name, value in env.items() if "CURVE" not in name}
        config = config_from_namespace(config_class(config_paths[f"ztgi {service}"]), argparse.Namespace(), environ=env)
        pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", ["sleep", "0"])
        assert pre_stop[0] == "sleep"
        grace_s = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace_s > float(pre_stop[1]) + getattr(config, drains[service]), service
    gateway = one(manifests, "Deployment", "ztgi-gateway")["spec"]["template"]["spec"]["containers"][0]
    assert gateway["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]


def test_disruption_budgets_cover_workers_and_gateways(manifests: list[Manifest]) -> None:
    """One budget each for workers and gateways, each selecting its Deployment's pods."""
    for name in ("ztgi-worker", "ztgi-gateway"):
        budget = one(manifests, "PodDisruptionBudget", name)
        labels = one(manifests, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
        assert matches(budget["spec"]["selector"]["matchLabels"], labels)
        assert budget["spec"]["maxUnavailable"] == 1


# -- security and storage ------------------------------------------------------------------------

def _writable(deployment: Manifest, container: Manifest, path: str) -> bool:
    """Whether `path` lies on a mounted volume that is not read-only and not a Secret."""
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    return any(path.startswith(m["mountPath"].rstrip("/") + "/") or path == m["mountPath"]
               for m in container.get("volumeMounts", [])
               if not m.get("readOnly") and "secret" not in volumes[m["name"]])


def test_every_pod_runs_as_non_root_on_a_read_only_root(manifests: list[Manifest]) -> None:
    """Non-root, no privilege escalation, no capabilities, a read-only root file system; what the
    services write (/tmp, the model cache) is a volume."""
    for deployment, container in containers(manifests):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
        assert pod["automountServiceAccountToken"] is False
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
        assert security["capabilities"]["drop"] == ["ALL"]
        assert _writable(deployment, container, "/tmp")
        env = environment(manifests, container)
        for variable in ("ZTGI_CACHE_DIR", "HF_HOME"):
            if variable in env:
                assert _writable(deployment, container, env[variable]), variable
        assert ("ZTGI_CACHE_DIR" in env) == (service_of(container) in ("worker", "tokenizer"))


def test_every_container_has_requests_and_limits(manifests: list[Manifest]) -> None:
    """CPU and memory requested and capped for every container."""
    for _, container in containers(manifests):
        resources = container["resources"]
        for bound in ("requests", "limits"):
            assert set(resources[bound]) == {"cpu", "memory"}, container["name"]


def test_the_example_overlay_shares_one_model_cache() -> None:
    """The overlay's patch swaps the model cache for its claim in workers and tokenizers, in place
    (the volume keeps its name and the mounts their volume)."""
    overlay = render(RENDERS["example overlay"])
    one(overlay, "PersistentVolumeClaim", "ztgi-model-cache")
    for name in ("ztgi-worker", "ztgi-tokenizer"):
        volumes = one(overlay, "Deployment", name)["spec"]["template"]["spec"]["volumes"]
        assert len({v["name"] for v in volumes}) == len(volumes)
        [cache] = [v for v in volumes if v["name"] == "model-cache"]
        assert cache == {"name": "model-cache", "persistentVolumeClaim": {"claimName": "ztgi-model-cache"}}
