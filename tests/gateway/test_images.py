"""Images in requests: what the gateway sends the scheduler (the files' exact bytes, in order) and
every bad image refused with a clear 4xx before anything is queued.

A real gateway talks to a scripted scheduler whose Info says the model takes images; a real HTTP
server on 127.0.0.1 in a thread plays the hosts image URLs point at, and records every request so
that a test can say nothing was fetched.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import shutil
import threading
import time
from collections.abc import Iterator

import pytest
import requests
from aiohttp import web

from tests.gateway.conftest import GatewayProcess, new_run_dir
from tests.gateway.scripted_scheduler import ScriptedScheduler
from tests.vision_models import drawn_image
from ztgi.common.config import ConfigError, config_from_namespace
from ztgi.common.free_ports import free_port
from ztgi.common.messages import ChatMessage, ContentPart, Generate
from ztgi.common.parameters import ValidationError
from ztgi.services.gateway import image_inputs
from ztgi.services.gateway.config import GatewayConfig
from ztgi.services.gateway.image_inputs import decode_data_url, host_allowed, pending_image, with_images

PNG = drawn_image(16, 12, seed=1, image_format="PNG")
JPEG = drawn_image(20, 16, seed=2, image_format="JPEG")
MAX_IMAGE_BYTES = 4096
FETCH_TIMEOUT_S = 0.5


def data_url(image: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(image).decode()}"


class ImageServer:
    """The hosts behind image URLs: a real aiohttp server on 127.0.0.1, run in its own thread."""

    def __init__(self) -> None:
        self.port = free_port()
        self.paths: list[str] = []  # every request it received, in order
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="image-server", daemon=True)

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def start(self) -> ImageServer:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(5)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    async def _start(self) -> None:
        @web.middleware
        async def record(request: web.Request, handler: web.RequestHandler) -> web.StreamResponse:
            self.paths.append(request.path)
            return await handler(request)

        app = web.Application(middlewares=[record])
        app.router.add_get("/image.png", lambda _: web.Response(body=PNG, content_type="image/png"))
        app.router.add_get("/photo.jpg", lambda _: web.Response(body=JPEG, content_type="image/jpeg"))
        app.router.add_get("/slow.png", self._slow)
        app.router.add_get("/huge.png", lambda _: web.Response(body=b"x" * (MAX_IMAGE_BYTES + 1)))
        app.router.add_get("/huge-chunked.png", self._chunked)
        app.router.add_get("/moved.png", self._moved)
        app.router.add_get("/empty.png", lambda _: web.Response(body=b""))
        self.runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    @staticmethod
    async def _slow(request: web.Request) -> web.Response:
        await asyncio.sleep(FETCH_TIMEOUT_S * 4)
        return web.Response(body=PNG)

    @staticmethod
    async def _chunked(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()  # no Content-Length: the limit must hold while reading
        await response.prepare(request)
        for _ in range(3):
            await response.write(b"y" * (MAX_IMAGE_BYTES // 2))
        await response.write_eof()
        return response

    @staticmethod
    async def _moved(request: web.Request) -> web.Response:
        raise web.HTTPFound("/image.png")


@pytest.fixture(scope="module")
def image_server() -> Iterator[ImageServer]:
    server = ImageServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def vision_run_dir() -> Iterator[str]:
    run_dir = new_run_dir()
    yield run_dir
    shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def vision_scheduler_module(vision_run_dir: str) -> Iterator[ScriptedScheduler]:
    scheduler = ScriptedScheduler(f"ipc://{vision_run_dir}", vision=True).start()
    yield scheduler
    scheduler.stop()


@pytest.fixture(scope="module")
def vision_gateway(vision_scheduler_module: ScriptedScheduler, vision_run_dir: str) -> Iterator[GatewayProcess]:
    gateway = GatewayProcess(f"ipc://{vision_run_dir}", "--allowed-media-domains", "127.0.0.1",
                             "--media-fetch-timeout-s", str(FETCH_TIMEOUT_S), "--max-image-bytes",
                             str(MAX_IMAGE_BYTES), "--max-images-per-request", "3")
    gateway.wait_healthy()
    yield gateway
    returncode, output = gateway.stop()
    assert returncode == 0 and "Traceback" not in output, output  # every refusal was an answer


@pytest.fixture
def vision_scheduler(vision_scheduler_module: ScriptedScheduler, image_server: ImageServer) -> ScriptedScheduler:
    """The vision model's scheduler, reset, and the image server's log emptied."""
    vision_scheduler_module.reset()
    image_server.paths.clear()
    return vision_scheduler_module


def post(gateway: GatewayProcess, path: str, body: dict) -> requests.Response:
    return requests.post(gateway.url + path, json=body, timeout=10)


def chat(*messages: dict) -> dict:
    return {"model": "any", "messages": list(messages), "max_tokens": 2}


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def text_part(text: str) -> dict:
    return {"type": "text", "text": text}


# -- what reaches the scheduler --------------------------------------------------------------------

def test_chat_image_parts_carry_the_files_in_order(vision_gateway: GatewayProcess, vision_scheduler: ScriptedScheduler,
                                                   image_server: ImageServer) -> None:
    """OpenAI image parts (data: URL, fetched URL, vLLM's string form) become the turn's parts with the
    exact bytes sent, between its text parts; `content` is its text; a turn without images has no parts."""
    body = chat({"role": "system", "content": "Be brief."},
                {"role": "user", "content": [text_part("Compare "), image_part(data_url(PNG)), text_part(" and "),
                                             {"type": "image_url", "image_url": image_server.url("/photo.jpg")}]},
                {"role": "assistant", "content": "Two pictures."},
                {"role": "user", "content": [text_part("Only text here")]})
    response = post(vision_gateway, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    (generate,) = vision_scheduler.messages(Generate)
    system, user, assistant, last = generate.messages
    assert user.content == "Compare  and " and user.parts == [
        ContentPart("text", text="Compare "), ContentPart("image", image=PNG), ContentPart("text", text=" and "),
        ContentPart("image", image=JPEG)]
    assert (system.parts, assistant.parts, last.parts, last.content) == (None, None, None, "Only text here")
    assert image_server.paths == ["/photo.jpg"]


@pytest.mark.parametrize("route", ["/generate", "/generate_stream", "/"])
def test_markdown_images_in_inputs_become_generate_images(vision_gateway: GatewayProcess,
                                                          vision_scheduler: ScriptedScheduler,
                                                          image_server: ImageServer, route: str) -> None:
    """TGI's `![](url)` in `inputs`: the files in order of appearance, `inputs` as the client wrote it."""
    inputs = f"Look: ![a photo]({image_server.url('/photo.jpg')}) then ![]({data_url(PNG)}) - what changed?"
    response = post(vision_gateway, route, {"inputs": inputs, "parameters": {"max_new_tokens": 2}})
    assert response.status_code == 200, response.text
    (generate,) = vision_scheduler.messages(Generate)
    assert generate.images == [JPEG, PNG] and generate.inputs == inputs


def test_responses_and_anthropic_images(vision_gateway: GatewayProcess, vision_scheduler: ScriptedScheduler) -> None:
    """A Responses `input_image` part and an Anthropic base64 `image` block reach the turn's parts."""
    responses = {"model": "any", "max_output_tokens": 2, "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "What is this?"}, {"type": "input_image", "image_url": data_url(JPEG)}]}]}
    assert post(vision_gateway, "/v1/responses", responses).status_code == 200
    anthropic = {"model": "any", "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": base64.b64encode(PNG).decode()}},
        {"type": "text", "text": "Describe it."}]}]}
    assert post(vision_gateway, "/v1/messages", anthropic).status_code == 200
    first, second = vision_scheduler.messages(Generate)
    assert first.messages[-1].parts == [ContentPart("text", text="What is this?"), ContentPart("image", image=JPEG)]
    assert second.messages[-1].parts == [ContentPart("image", image=PNG), ContentPart("text", text="Describe it.")]
    assert second.messages[-1].content == "Describe it."


def test_info_and_models_say_whether_the_model_takes_images(vision_gateway: GatewayProcess,
                                                            vision_scheduler: ScriptedScheduler,
                                                            gateway: GatewayProcess) -> None:
    """/info's `vision` and /v1/models' `input_modalities`: images for the vision model only."""
    for served, vision, modalities in ((vision_gateway, True, ["text", "image"]), (gateway, False, ["text"])):
        assert requests.get(served.url + "/info", timeout=5).json()["vision"] is vision
        (model,) = requests.get(served.url + "/v1/models", timeout=5).json()["data"]
        assert model["input_modalities"] == modalities


def test_a_text_model_reads_markdown_images_as_text(gateway: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """For a text-only model `![](url)` is prompt text (as TGI): nothing fetched, nothing refused."""
    inputs = "Summarize: ![build](https://ci.example.com/badge.svg) passes."
    assert post(gateway, "/generate", {"inputs": inputs}).status_code == 200
    (generate,) = scheduler.messages(Generate)
    assert generate.images is None and generate.inputs == inputs


# -- refusals ------------------------------------------------------------------------------------

def _assert_refused(response: requests.Response, route: str, message: str) -> None:
    """422 in the route's error shape (TGI's or OpenAI's), its message containing `message`."""
    assert response.status_code == 422, response.text
    error = response.json()
    if route.startswith("/v1/"):
        assert error["error"]["type"] == "invalid_request_error" and error["error"]["param"] == "messages"
        assert message in error["error"]["message"], error
    else:
        assert error["error_type"] == "validation" and message in error["error"], error


BAD_DATA_URLS = [
    ("data:text/plain;base64,aGVsbG8=", "the data URL's media type `text/plain` is not an image"),
    ("data:image/png;base64,%%%notbase64", "the data URL's payload is not valid base64"),
    ("data:image/png;base64,", "the data URL holds an empty image"),
    ("data:image/png,rawbytes", "a data URL must be `data:<image type>;base64,<data>`"),
    (data_url(b"z" * (MAX_IMAGE_BYTES + 100)), f"larger than --max-image-bytes {MAX_IMAGE_BYTES}"),
    ("file:///etc/passwd", "is neither a data: URL nor an http(s) URL"),
    ("ftp://127.0.0.1/image.png", "is neither a data: URL nor an http(s) URL"),
]


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/generate"])
@pytest.mark.parametrize("url,message", BAD_DATA_URLS, ids=[m[:30] for _, m in BAD_DATA_URLS])
def test_bad_image_urls_are_refused_at_once(vision_gateway: GatewayProcess, vision_scheduler: ScriptedScheduler,
                                            route: str, url: str, message: str) -> None:
    """A bad data: URL or another scheme: 422 naming the problem, in milliseconds, nothing queued."""
    body = chat({"role": "user", "content": [image_part(url)]}) if route.startswith("/v1/") else \
        {"inputs": f"![]({url})"}
    started = time.monotonic()
    response = post(vision_gateway, route, body)
    assert time.monotonic() - started < 1.0
    _assert_refused(response, route, message)
    assert not vision_scheduler.messages(Generate)


FETCH_FAILURES = [
    ("/missing.png", "HTTP 404 Not Found"),
    ("/slow.png", f"no answer within --media-fetch-timeout-s {FETCH_TIMEOUT_S:g} s"),
    ("/huge.png", f"the image is larger than --max-image-bytes {MAX_IMAGE_BYTES}"),
    ("/huge-chunked.png", f"the image is larger than --max-image-bytes {MAX_IMAGE_BYTES}"),
    ("/moved.png", "HTTP 302 Found (redirects are not followed)"),
    ("/empty.png", "the answer is empty"),
]


@pytest.mark.parametrize("path,message", FETCH_FAILURES, ids=[p for p, _ in FETCH_FAILURES])
def test_failed_fetches_name_the_host_and_what_went_wrong(vision_gateway: GatewayProcess,
                                                          vision_scheduler: ScriptedScheduler,
                                                          image_server: ImageServer, path: str, message: str) -> None:
    """A fetch that fails (status, timeout, size, redirect) is 422 naming the host; nothing is queued."""
    started = time.monotonic()
    response = post(vision_gateway, "/v1/chat/completions",
                    chat({"role": "user", "content": [image_part(image_server.url(path))]}))
    assert time.monotonic() - started < FETCH_TIMEOUT_S + 1.5
    _assert_refused(response, "/v1/", f"fetching the image at host `127.0.0.1` failed: {message}")
    assert image_server.paths == [path] and not vision_scheduler.messages(Generate)


def test_a_refused_connection_is_a_clear_error(vision_gateway: GatewayProcess,
                                               vision_scheduler: ScriptedScheduler) -> None:
    """Nothing listening at the URL's port: 422 saying the gateway cannot connect to the host."""
    response = post(vision_gateway, "/generate", {"inputs": f"![](http://127.0.0.1:{free_port()}/a.png)"})
    _assert_refused(response, "/generate", "fetching the image at host `127.0.0.1` failed: cannot connect")


def test_a_host_not_allowed_is_refused_without_a_connection(vision_gateway: GatewayProcess,
                                                            vision_scheduler: ScriptedScheduler,
                                                            image_server: ImageServer) -> None:
    """`localhost` is not in --allowed-media-domains (127.0.0.1 is): refused naming the flag, even
    beside an allowed URL, and the server hears nothing."""
    allowed, refused = image_server.url("/image.png"), image_server.url("/image.png", host="localhost")
    response = post(vision_gateway, "/v1/chat/completions",
                    chat({"role": "user", "content": [image_part(allowed), image_part(refused)]}))
    _assert_refused(response, "/v1/", "the image URL's host `localhost` is not in --allowed-media-domains (127.0.0.1)")
    assert image_server.paths == []


def test_too_many_images_are_refused_before_any_fetch(vision_gateway: GatewayProcess,
                                                      vision_scheduler: ScriptedScheduler,
                                                      image_server: ImageServer) -> None:
    """Images over all turns count against --max-images-per-request, checked before fetching any."""
    url = image_server.url("/image.png")
    body = chat({"role": "user", "content": [image_part(url), image_part(url)]},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": [image_part(url), image_part(data_url(PNG))]})
    _assert_refused(post(vision_gateway, "/v1/chat/completions", body), "/v1/",
                    "the request has 4 images, more than --max-images-per-request 3")
    _assert_refused(post(vision_gateway, "/generate", {"inputs": f"![]({url})" * 4}), "/generate",
                    "the request has 4 images, more than --max-images-per-request 3")
    assert image_server.paths == []


def test_a_slow_fetch_does_not_hold_other_requests(vision_gateway: GatewayProcess, vision_scheduler: ScriptedScheduler,
                                                   image_server: ImageServer) -> None:
    """While one request waits on a slow image host, another is answered at once."""
    slow = {"inputs": f"![]({image_server.url('/slow.png')})"}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(post, vision_gateway, "/generate", slow)
        while "/slow.png" not in image_server.paths:
            time.sleep(0.01)
        started = time.monotonic()
        assert post(vision_gateway, "/generate", {"inputs": "Hi"}).status_code == 200
        assert time.monotonic() - started < FETCH_TIMEOUT_S and not waiting.done()
        assert waiting.result().status_code == 422


# -- the rules, without sockets --------------------------------------------------------------------

def test_allowed_hosts_match_themselves_and_their_subdomains() -> None:
    """`example.com` allows `img.example.com`, never `badexample.com`; case and a final dot do not matter."""
    domains = ("example.com", "127.0.0.1")
    assert all(host_allowed(host, domains) for host in ("example.com", "img.EXAMPLE.com", "example.com.", "127.0.0.1"))
    assert not any(host_allowed(host, domains) for host in ("badexample.com", "example.com.evil.net", "localhost"))
    assert not host_allowed("example.com", ())


def test_data_urls_decode_to_the_file() -> None:
    """Every image type decodes to its bytes (base64 wrapped in lines too); the size limit is checked on
    the decoded file."""
    for media_type in ("image/png", "image/jpeg", "image/webp", "image/gif", "IMAGE/PNG"):
        assert decode_data_url(data_url(PNG, media_type), len(PNG), "messages") == PNG
    wrapped = "data:image/png;base64," + base64.encodebytes(PNG).decode()  # a line end every 76 characters
    assert "\n" in wrapped and decode_data_url(wrapped, len(PNG), "messages") == PNG
    with pytest.raises(ValidationError, match=f"an image of {len(PNG)} bytes is larger than --max-image-bytes"):
        decode_data_url(data_url(PNG), len(PNG) - 1, "messages")


def test_files_must_fit_together_in_one_message_to_the_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    """Images each under --max-image-bytes whose sum would not fit in the Generate message are refused
    (a frame over the limit would be dropped unread by the scheduler's socket)."""
    monkeypatch.setattr(image_inputs, "MAX_IMAGE_BYTES_PER_MESSAGE", len(PNG) + len(JPEG) - 1)
    image_inputs.check_total_bytes([PNG], "messages")
    with pytest.raises(ValidationError, match="the request's 2 images take .* bytes, more than the .* one request "
                                              "may carry: send fewer or smaller images"):
        image_inputs.check_total_bytes([PNG, JPEG], "messages")


def test_files_replace_pending_images_in_order() -> None:
    """`with_images` fills each turn's image parts in order and leaves text and text-only turns alone."""
    turns = [ChatMessage("user", "a", parts=[pending_image("u1"), ContentPart("text", text="a")]),
             ChatMessage("assistant", "b"), ChatMessage("user", "", parts=[pending_image("u2")])]
    first, second, third = with_images(turns, [PNG, JPEG])
    assert first.parts == [ContentPart("image", image=PNG), ContentPart("text", text="a")]
    assert second == turns[1] and third.parts == [ContentPart("image", image=JPEG)]


def test_media_flags_read_the_environment_and_are_checked() -> None:
    """ZTGI_ALLOWED_MEDIA_DOMAINS sets the hosts; a URL instead of a host, or a zero size, is refused."""
    env = {"ZTGI_ALLOWED_MEDIA_DOMAINS": "Example.com, cdn.example.org", "ZTGI_MAX_IMAGES_PER_REQUEST": "2"}
    config = config_from_namespace(GatewayConfig, argparse.Namespace(), env)
    assert config.allowed_media_domain_list == ("example.com", "cdn.example.org")
    assert (config.max_images_per_request, config.max_image_bytes, config.media_fetch_timeout_s) == (2, 20971520, 10.0)
    assert GatewayConfig().allowed_media_domain_list == ()
    with pytest.raises(ConfigError, match="--allowed-media-domains: 'https://example.com' is not a host name"):
        GatewayConfig(allowed_media_domains="https://example.com")
    with pytest.raises(ConfigError, match="--max-image-bytes must be positive"):
        GatewayConfig(max_image_bytes=0)
