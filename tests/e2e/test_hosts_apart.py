"""The scheduler and two workers on hosts apart: each in a network namespace of its own, linked to
the scheduler's by a veth pair of its own, CURVE on with only listed client keys. One worker's
link is cut under load and restored: its streams resume on the other worker, none lost, and it
rejoins by itself. The tokenizer and the gateway run in the root namespace, on a third link.

Needs root (`ip netns`); skipped otherwise.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import pathlib
import re
import time
from collections.abc import Callable, Iterator

import pytest
import requests

from tests.e2e.faults import wait_for
from tests.e2e.netns import Link, NetnsUnavailable, Network
from tests.fuzz.processes import ServiceProcess
from ztgi.bench.greedy_parity import GreedyStream, assert_same_greedy
from ztgi.common import curve
from ztgi.common.free_ports import free_port

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "The best way to learn is",
           "Water boils at", "My favourite food is", "import numpy as np", "The sun is"]
MAX_NEW_TOKENS = 100  # long enough that a stream outlives the 1 s heartbeat window and its resumption
SCHEDULER_PORT = 5550  # the scheduler's namespace is its own: any port is free there
# what every service reads, wired by environment as docker-compose.yml does; float32, where a
# resumed stream's re-prefill parts from its decode steps only at a near-tie; liveness is fast
# (a silent worker is lost after 5 x 200 ms); round-robin, so both workers hold streams and serve
SHARED_ENV = {
    "ZTGI_MODEL_ID": "smollm2", "ZTGI_DTYPE": "float32", "ZTGI_DEVICE": "cpu",
    "ZTGI_MAX_INPUT_TOKENS": "512", "ZTGI_MAX_TOTAL_TOKENS": "2048", "ZTGI_MAX_BATCH_PREFILL_TOKENS": "2048",
    "ZTGI_MEMORY_BUDGET_MB": "512", "ZTGI_HEARTBEAT_INTERVAL_MS": "200", "ZTGI_HEARTBEAT_MISSES": "5",
    "ZTGI_PLACEMENT": "round-robin", "ZTGI_LOG_LEVEL": "INFO",
}
STARTUP_TIMEOUT_S = 180.0
# the cut lasts this long at least: several heartbeat windows, so TCP backs off its retransmissions
# and 25 heartbeats queue behind the cut, to be answered at once when the link is back
LINK_DOWN_S = 5.0


class HostsApart:
    """The namespaces, links and keys (made at once), the processes (`start`, `stop`)."""

    def __init__(self, network: Network, key_dir: str) -> None:
        self.network = network
        self.worker_namespaces = [network.add_namespace(f"w{i}") for i in (1, 2)]
        self.worker_links = [network.link(namespace) for namespace in self.worker_namespaces]
        self.front_link = network.link(None)  # the root namespace: tokenizer, gateway and this test
        self.server_public, self.server_secret = curve.write_keypair(f"{key_dir}/server", "scheduler")
        self.clients_dir = f"{key_dir}/clients"  # every peer's key is listed: each gets in
        self.peer_secrets = {name: curve.write_keypair(self.clients_dir, name)[1]
                             for name in ("worker-0", "worker-1", "tokenizer", "gateway")}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.processes: list[ServiceProcess] = []
        self.workers: list[ServiceProcess] = []

    def start(self) -> None:
        """The scheduler in its namespace, each worker in its own, the tokenizer and the gateway here."""
        self.scheduler = self._start("scheduler", self.network.hub, {
            "ZTGI_SCHEDULER_URL": f"tcp://{self.front_link.hub_address}:{SCHEDULER_PORT}",
            "ZTGI_BIND_HOST": "0.0.0.0",  # in its namespace: its three link addresses (and loopback)
            "ZTGI_CURVE_SECRET_KEY_FILE": self.server_secret, "ZTGI_CURVE_CLIENT_KEYS_DIR": self.clients_dir})
        for i, link in enumerate(self.worker_links):
            self.workers.append(self._start_peer(f"worker-{i}", link, {"ZTGI_WORKER_INDEX": str(i)}))
        self._start_peer("tokenizer", self.front_link, {})
        self._start_peer("gateway", self.front_link, {"ZTGI_HOST": "127.0.0.1", "ZTGI_PORT": str(self.port)})

    def _start_peer(self, name: str, link: Link, env: dict[str, str]) -> ServiceProcess:
        """A peer that reaches the scheduler by its address on `link`, with its own CURVE key."""
        return self._start(name.split("-")[0], link.namespace, {
            **env, "ZTGI_SCHEDULER_URL": f"tcp://{link.hub_address}:{SCHEDULER_PORT}",
            "ZTGI_CURVE_SERVER_PUBLIC_KEY_FILE": self.server_public,
            "ZTGI_CURVE_SECRET_KEY_FILE": self.peer_secrets[name]})

    def _start(self, service: str, namespace: str | None, env: dict[str, str]) -> ServiceProcess:
        process = ServiceProcess(service, env={**SHARED_ENV, **env}, prefix=self.network.exec_prefix(namespace))
        self.processes.append(process)
        return process

    def wait_ready(self) -> None:
        """Both workers warmed up and the gateway healthy."""
        def ready() -> bool:
            dead = [p for p in self.processes if not p.alive]
            assert not dead, f"{dead[0].service} exited:\n{self.logs()}"
            return (all(self.num_ready(worker) for worker in self.workers)
                    and requests.get(self.url + "/health", timeout=10).status_code == 200)
        self.wait("ready", lambda: _quietly(ready), STARTUP_TIMEOUT_S)

    def wait(self, what: str, condition: Callable[[], bool], timeout_s: float) -> float:
        """`wait_for` at 20 ms; a timeout fails with every process's log."""
        try:
            return wait_for(condition, timeout_s, interval_s=0.02)
        except TimeoutError:
            raise AssertionError(f"not {what} within {timeout_s:g} s:\n{self.logs()}") from None

    def identity(self, worker: ServiceProcess) -> str:
        found = re.search(r"worker (\S+) connected to", worker.output())
        return found.group(1) if found else "?"

    def num_ready(self, worker: ServiceProcess) -> int:
        """How many times the scheduler said this worker is ready (warmed up)."""
        return self.scheduler.output().count(f"worker {self.identity(worker)} ready:")

    def logs(self) -> str:
        return "\n".join(f"--- {p.service}\n{p.output()}" for p in self.processes)

    def stop(self) -> dict[str, int]:
        """Gateway, scheduler, tokenizer, workers (the launcher's order); each exit code."""
        order = ("gateway", "scheduler", "tokenizer", "worker")
        return {f"{p.service}-{i}": p.stop() for i, p in sorted(enumerate(self.processes),
                                                                 key=lambda item: order.index(item[1].service))}


def _quietly(condition: Callable[[], bool]) -> bool:
    try:
        return condition()
    except requests.RequestException:  # the gateway is not listening yet
        return False


@pytest.fixture
def hosts_apart(tmp_path: pathlib.Path) -> Iterator[HostsApart]:
    try:
        network = Network()
    except NetnsUnavailable as exc:
        pytest.skip(f"hosts apart need network namespaces: {exc}")
    try:
        deployment = HostsApart(network, str(tmp_path / "keys"))
        try:
            deployment.start()
            yield deployment
        finally:
            deployment.stop()
    finally:
        network.close()


@dataclasses.dataclass
class TimedStream:
    """One /generate_stream: its greedy tokens, when each arrived, and an error event if any."""

    max_new_tokens: int = MAX_NEW_TOKENS
    greedy: GreedyStream = dataclasses.field(default_factory=GreedyStream)
    arrivals: list[float] = dataclasses.field(default_factory=list)
    error: str | None = None
    done: bool = False

    @property
    def complete(self) -> bool:
        return self.error is None and len(self.greedy.ids) == self.max_new_tokens


def run_stream(url: str, prompt: str, into: TimedStream) -> TimedStream:
    """Streams `prompt` greedily into `into`, which another thread may watch meanwhile."""
    parameters = {"max_new_tokens": into.max_new_tokens, "ignore_eos": True, "top_n_tokens": 2}
    try:
        with requests.post(url + "/generate_stream", json={"inputs": prompt, "parameters": parameters},
                           stream=True, timeout=120) as response:
            for line in response.iter_lines():
                if line.startswith(b"data:"):
                    event = json.loads(line[5:])
                    if "error" in event:
                        into.error = event["error"]
                        break
                    into.greedy.add(event)
                    into.arrivals.append(time.monotonic())
    except requests.RequestException as exc:
        into.error = repr(exc)
    into.done = True
    return into


def all_streams(url: str, max_new_tokens: int = MAX_NEW_TOKENS) -> list[TimedStream]:
    """Every prompt streamed at once with nothing cut; each must complete."""
    streams = [TimedStream(max_new_tokens) for _ in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        list(pool.map(lambda pair: run_stream(url, *pair), zip(PROMPTS, streams)))
    assert all(stream.complete for stream in streams), [stream.error for stream in streams]
    return streams


def time_to_resume(streams: list[TimedStream], cut_at: float) -> float:
    """From the cut to the token that ended the longest silence any stream had after it: the
    first token a resumed stream got from the other worker."""
    silences = []
    for stream in streams:
        times = [cut_at, *(t for t in stream.arrivals if t > cut_at)]
        silences += [(end - start, end) for start, end in zip(times, times[1:])]
    return max(silences)[1] - cut_at


def requests_served(url: str) -> dict[str, float]:
    """ztgi_worker_requests_served per worker identity, from the gateway's /metrics."""
    text = requests.get(url + "/metrics", timeout=30).text
    return {worker: float(value) for worker, value in
            re.findall(r'^ztgi_worker_requests_served(?:_total)?\{worker="([^"]+)"\} (\S+)$', text, re.M)}


@dataclasses.dataclass(frozen=True)
class Outage:
    """What a link cut under load cost: times in seconds from the cut, but `rejoin_s`, from the
    restore; what the scheduler said of the cut worker after the cut."""

    noticed_s: float  # the scheduler says the worker is lost
    resume_s: float  # the resumed streams' first token from the other worker
    link_down_s: float
    rejoin_s: float  # the scheduler says the worker is ready again
    num_requeued: int  # the worker's requests put back in the queue when it was lost
    num_registrations: int  # its Hellos after the cut (one: no registration and warmup for nothing)

    def __str__(self) -> str:
        return (f"{self.num_requeued} requests resumed on the other worker; cut noticed after "
                f"{self.noticed_s:.2f} s, streams resumed after {self.resume_s:.2f} s, link down "
                f"{self.link_down_s:.2f} s, worker ready {self.rejoin_s:.2f} s after the restore "
                f"({self.num_registrations} registration)")


def cut_under_load(apart: HostsApart, streams: list[TimedStream]) -> Outage:
    """Streams every prompt into `streams`; once each has 3 tokens, cuts worker 0's link; once every
    stream has a token from after the loss and `LINK_DOWN_S` have passed, restores it; waits until
    the worker is ready again."""
    worker, link = apart.workers[0], apart.worker_links[0]
    name = f"worker {apart.identity(worker)}"
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        for prompt, stream in zip(PROMPTS, streams):
            pool.submit(run_stream, apart.url, prompt, stream)
        apart.wait("streaming", lambda: all(len(s.arrivals) >= 3 or s.done for s in streams), 120)
        log_at_cut = len(apart.scheduler.output())

        def since_cut() -> str:
            return apart.scheduler.output()[log_at_cut:]

        cut_at = time.monotonic()
        apart.network.cut(link)
        noticed_s = apart.wait("lost", lambda: f"{name} lost (missed heartbeats)" in since_cut(), 30)
        noticed_at = time.monotonic()
        apart.wait("resumed", lambda: all(s.done or s.arrivals[-1] > noticed_at for s in streams), 60)
        time.sleep(max(0.0, cut_at + LINK_DOWN_S - time.monotonic()))
        restored_at = time.monotonic()
        apart.network.restore(link)
        rejoin_s = apart.wait("rejoined", lambda: f"{name} ready:" in since_cut(), 60)
    requeued = re.search(rf"{name} lost \(missed heartbeats\): (\d+) requests go back", since_cut())
    assert requeued, since_cut()
    return Outage(noticed_s, time_to_resume(streams, cut_at), restored_at - cut_at, rejoin_s,
                  int(requeued.group(1)), since_cut().count(f"{name} registered:"))


@pytest.mark.slow
def test_a_cut_link_resumes_elsewhere_and_rejoins(hosts_apart: HostsApart) -> None:
    """8 greedy streams across two workers on hosts apart; worker 0's link cut once each has 3
    tokens: every stream completes, equal to its undisturbed text (up to a float near-tie); the
    link restored, worker 0 registers, warms up and serves again by itself."""
    apart, network = hosts_apart, hosts_apart.network
    links = [*apart.worker_links, apart.front_link]
    for namespace, link in zip(apart.worker_namespaces, apart.worker_links):  # its own link, nothing else
        assert network.addresses(namespace) == ["127.0.0.1", link.address]
        assert [network.routes_to(namespace, other.address) for other in links if other != link] == [False, False]
    apart.wait_ready()
    assert f"bound tcp://0.0.0.0:{SCHEDULER_PORT} (CURVE)" in apart.scheduler.output()
    expected = [stream.greedy for stream in all_streams(apart.url)]

    streams = [TimedStream() for _ in PROMPTS]
    outage = cut_under_load(apart, streams)
    num_lost = sum(not stream.complete for stream in streams)
    print(f"\nhosts apart: {num_lost} of {len(streams)} requests lost; {outage}")
    assert num_lost == 0, [stream.error for stream in streams]
    assert outage.num_requeued >= 1, apart.scheduler.output()
    for reference, resumed in zip(expected, streams):
        assert_same_greedy(reference, resumed.greedy)

    # the rejoined worker serves: new requests go to both (round-robin)
    before = requests_served(apart.url)
    all_streams(apart.url, max_new_tokens=4)
    after = requests_served(apart.url)
    for worker in apart.workers:
        identity = apart.identity(worker)
        assert after.get(identity, 0) > before.get(identity, 0), (identity, before, after)
    codes = apart.stop()
    assert set(codes.values()) == {0}, (codes, apart.logs())
