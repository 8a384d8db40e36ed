"""API key (Bearer, 401 in each API's error shape) and the CORS allow-list, on a real gateway."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import openai
import pytest
import requests

from tests.gateway.conftest import GatewayProcess
from tests.gateway.scripted_scheduler import ScriptedScheduler
from tests.gateway.sse_reader import read_events
from ztgi.common.config import ConfigError, parse_config
from ztgi.common.messages import Generate, LoadAdapter, UnloadAdapter
from ztgi.services.gateway.config import GatewayConfig

API_KEY = "s3cret-key"
ALLOWED = "https://app.example.com"
DENIED = "https://evil.example.com"
PROTECTED = [("POST", "/"), ("POST", "/generate"), ("POST", "/generate_stream"), ("POST", "/invocations"),
             ("POST", "/tokenize"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
             ("GET", "/v1/models"), ("POST", "/v1/load_lora_adapter"), ("POST", "/v1/unload_lora_adapter")]
OPEN = ["/health", "/info", "/ping", "/docs", "/api-doc/openapi.json"]
GENERATE = {"inputs": "Hi", "parameters": {"max_new_tokens": 2}}


@pytest.fixture(scope="module")
def secured(shared_scheduler: ScriptedScheduler, shared_run_dir: str) -> Iterator[GatewayProcess]:
    """A gateway with an API key and one allowed origin, on the shared scripted scheduler."""
    gateway = GatewayProcess(f"ipc://{shared_run_dir}", "--api-key", API_KEY,
                             "--cors-allow-origin", f"{ALLOWED}, http://localhost:3000")
    gateway.wait_healthy()
    yield gateway
    returncode, output = gateway.stop()
    assert returncode == 0, output
    assert API_KEY not in output  # the key is never logged


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("method,path", PROTECTED)
def test_generation_routes_need_the_key(secured: GatewayProcess, scheduler: ScriptedScheduler,
                                        method: str, path: str) -> None:
    """Without the key, a wrong key or another scheme, every generation route is 401 and nothing is queued."""
    for headers in ({}, bearer("wrong"), {"Authorization": f"Basic {API_KEY}"}, bearer(API_KEY + "x")):
        response = requests.request(method, secured.url + path, json=GENERATE, headers=headers, timeout=5)
        assert response.status_code == 401, (headers, response.text)
        assert response.headers["WWW-Authenticate"] == "Bearer"
        error = response.json()["error"]
        message = error["message"] if path.startswith("/v1/") else error  # OpenAI's shape under /v1
        assert "API key" in message
    assert not scheduler.messages(Generate)


def test_right_key_is_served(secured: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """The right Bearer key (any case of the scheme) reaches the scheduler; TGI 401 has TGI's shape."""
    response = requests.post(secured.url + "/generate", json=GENERATE, headers=bearer(API_KEY), timeout=5)
    assert response.status_code == 200 and response.json() == {"generated_text": " a b"}
    response = requests.post(secured.url + "/", json=GENERATE, headers={"Authorization": f"bearer {API_KEY}"},
                             timeout=5)
    assert response.status_code == 200
    refused = requests.post(secured.url + "/generate", json=GENERATE, timeout=5).json()
    assert refused["error_type"] == "authentication"


def test_adapter_commands_need_the_key(secured: GatewayProcess, scheduler: ScriptedScheduler,
                                      tmp_path: pathlib.Path) -> None:
    """Loading and unloading LoRA adapters needs the key: without it nothing reaches the scheduler."""
    load = {"lora_name": "sql", "lora_path": str(tmp_path)}
    for path, body in (("/v1/load_lora_adapter", load), ("/v1/unload_lora_adapter", {"lora_name": "sql"})):
        assert requests.post(secured.url + path, json=body, timeout=5).status_code == 401
    assert not scheduler.messages(LoadAdapter) and not scheduler.messages(UnloadAdapter)
    for path, body in (("/v1/load_lora_adapter", load), ("/v1/unload_lora_adapter", {"lora_name": "sql"})):
        response = requests.post(secured.url + path, json=body, headers=bearer(API_KEY), timeout=5)
        assert response.status_code == 200, response.text
    assert [m.name for m in scheduler.messages(UnloadAdapter)] == ["sql"]


def test_openai_client_with_and_without_the_key(secured: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """The openai client's api_key is the Bearer key; a wrong one raises AuthenticationError."""
    with openai.OpenAI(base_url=secured.url + "/v1", api_key="wrong", max_retries=0, timeout=10) as client:
        with pytest.raises(openai.AuthenticationError) as caught:
            client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Hi"}])
        assert caught.value.body["code"] == "authentication" and "API key" in caught.value.body["message"]
    with openai.OpenAI(base_url=secured.url + "/v1", api_key=API_KEY, max_retries=0, timeout=10) as client:
        completion = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Hi"}],
                                                    max_tokens=2)
        assert completion.choices[0].message.content == " a b"


@pytest.mark.parametrize("path", OPEN)
def test_health_info_and_docs_stay_open(secured: GatewayProcess, scheduler: ScriptedScheduler, path: str) -> None:
    """Routes that spend no model time need no key."""
    assert requests.get(secured.url + path, timeout=5).status_code == 200


def test_allowed_origin_gets_the_cors_header(secured: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """A listed origin gets Access-Control-Allow-Origin on JSON answers, errors and streams."""
    origin = {"Origin": ALLOWED}
    info = requests.get(secured.url + "/info", headers=origin, timeout=5)
    assert info.headers["Access-Control-Allow-Origin"] == ALLOWED and "Origin" in info.headers["Vary"]
    refused = requests.post(secured.url + "/generate", json=GENERATE, headers=origin, timeout=5)
    assert refused.status_code == 401 and refused.headers["Access-Control-Allow-Origin"] == ALLOWED
    stream = requests.post(secured.url + "/generate_stream", json=GENERATE, headers={**origin, **bearer(API_KEY)},
                           stream=True, timeout=5)
    assert stream.headers["Access-Control-Allow-Origin"] == ALLOWED
    assert read_events(stream)[-1]["generated_text"] == " a b"
    other = requests.get(secured.url + "/info", headers={"Origin": "http://localhost:3000"}, timeout=5)
    assert other.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"


def test_other_origin_gets_no_cors_header(secured: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """An unlisted origin (or no Origin at all) gets no CORS header; the answer itself is unchanged."""
    for headers in ({"Origin": DENIED}, {}):
        response = requests.get(secured.url + "/info", headers=headers, timeout=5)
        assert response.status_code == 200 and "Access-Control-Allow-Origin" not in response.headers


def test_preflight(secured: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """OPTIONS preflight: 204 with methods and headers for a listed origin (no key needed), 403 otherwise."""
    ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}
    allowed = requests.options(secured.url + "/v1/chat/completions", headers={"Origin": ALLOWED, **ask}, timeout=5)
    assert allowed.status_code == 204
    assert allowed.headers["Access-Control-Allow-Origin"] == ALLOWED
    assert "POST" in allowed.headers["Access-Control-Allow-Methods"]
    assert allowed.headers["Access-Control-Allow-Headers"] == "authorization,content-type"
    denied = requests.options(secured.url + "/generate", headers={"Origin": DENIED, **ask}, timeout=5)
    assert denied.status_code == 403 and "Access-Control-Allow-Origin" not in denied.headers
    assert DENIED in denied.json()["error"]


def test_without_an_api_key_everything_is_open(gateway: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """The default gateway (no --api-key) serves generation routes to anyone and sends no CORS header."""
    response = requests.post(gateway.url + "/generate", json=GENERATE, headers={"Origin": ALLOWED}, timeout=5)
    assert response.status_code == 200 and "Access-Control-Allow-Origin" not in response.headers


def test_payload_limit_on_openai_routes_is_413(gateway: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """--max-payload-bytes holds on /v1 too, answered in OpenAI's error shape."""
    body = {"model": "any", "messages": [{"role": "user", "content": "x" * 70_000}]}
    response = requests.post(gateway.url + "/v1/chat/completions", json=body, timeout=5)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large" and "65536" in response.json()["error"]["message"]
    assert not scheduler.messages(Generate)


@pytest.mark.parametrize("source", ["file", "environment"])
def test_the_key_from_a_file_or_the_environment_never_shows_in_ps(shared_scheduler: ScriptedScheduler,
                                                                   shared_run_dir: str, scheduler: ScriptedScheduler,
                                                                   tmp_path: pathlib.Path, source: str) -> None:
    """--api-key-file (the key on its first line) or ZTGI_API_KEY: the key is enforced, and it is
    not on the gateway's command line (which `ps` shows to every user of the host)."""
    if source == "file":
        key_file = tmp_path / "api.key"
        key_file.write_text(API_KEY + "\n")
        gateway = GatewayProcess(f"ipc://{shared_run_dir}", "--api-key-file", str(key_file))
    else:
        gateway = GatewayProcess(f"ipc://{shared_run_dir}", env={"ZTGI_API_KEY": API_KEY})
    try:
        gateway.wait_healthy()
        with open(f"/proc/{gateway.process.pid}/cmdline", "rb") as cmdline:
            assert API_KEY.encode() not in cmdline.read()
        assert requests.post(gateway.url + "/generate", json=GENERATE, timeout=5).status_code == 401
        answer = requests.post(gateway.url + "/generate", json=GENERATE, headers=bearer(API_KEY), timeout=5)
        assert answer.status_code == 200
    finally:
        returncode, output = gateway.stop()
    assert returncode == 0 and API_KEY not in output


def test_an_unreadable_or_empty_key_file_or_two_keys_are_refused(tmp_path: pathlib.Path) -> None:
    """A key file that cannot be read, an empty first line, or both --api-key and --api-key-file:
    a ConfigError naming the file or the flags, never the key."""
    empty = tmp_path / "empty.key"
    empty.write_text("\n" + API_KEY)
    cases = [([f"--api-key-file={tmp_path / 'missing.key'}"], "cannot read it"),
             ([f"--api-key-file={empty}"], "first line is empty"),
             (["--api-key", API_KEY, f"--api-key-file={empty}"], "not both")]
    for argv, problem in cases:
        with pytest.raises(ConfigError, match=problem) as caught:
            parse_config(GatewayConfig, argv)
        assert API_KEY not in str(caught.value)
