"""Gateway configuration (flags `--x-y`, environment `ZTGI_X_Y`)."""

from __future__ import annotations

import dataclasses

from ztgi.common.config import ConfigError, require
from ztgi.common.request_limit import MAX_CLIENT_BATCH_SIZE, MAX_PAYLOAD_BYTES
from ztgi.common.service_config import PeerConfig, RequestLimits
from ztgi.services.gateway.media_limits import MediaLimits
from ztgi.services.gateway.reasoning_parser import check_reasoning_parser


@dataclasses.dataclass(frozen=True)
class GatewayConfig(PeerConfig, RequestLimits, MediaLimits):
    """One HTTP gateway replica: TGI's HTTP API over the scheduler's frontend.

    The limits are the ones requests are validated against before anything is queued (HTTP
    422); they should match the scheduler's (the launcher passes the same ZTGI_* values to both).
    """

    host: str = "127.0.0.1"
    port: int = 8080
    reuse_port: bool = dataclasses.field(default=False, metadata={
        "help": "let several gateways listen on the same port (SO_REUSEPORT)"})
    gateway_index: int = dataclasses.field(default=0, metadata={
        "help": "this replica's number, in its log lines"})
    max_client_batch_size: int = MAX_CLIENT_BATCH_SIZE.field()
    max_payload_bytes: int = MAX_PAYLOAD_BYTES.field()
    body_read_timeout_s: float = dataclasses.field(default=30.0, metadata={
        "help": "a request body not received within this many seconds is answered 408 and its "
                "connection closed (a client that sends part of a body and stops holds it until then)"})
    request_timeout_s: float = 600.0
    query_timeout_s: float = dataclasses.field(default=5.0, metadata={
        "help": "how long /health, /info and /metrics wait for the scheduler's answer"})
    heartbeat_misses: int = 5
    compute_type: str = dataclasses.field(default="ztgi", metadata={
        "help": "the x-compute-type header of every answer, as TGI sends it"})
    api_key: str | None = dataclasses.field(default=None, metadata={
        "help": "when set, generation routes need `Authorization: Bearer <key>` (a flag shows in `ps`: "
                "prefer ZTGI_API_KEY or --api-key-file)"})
    api_key_file: str | None = dataclasses.field(default=None, metadata={
        "help": "a file whose first line is the API key (instead of --api-key)"})
    cors_allow_origin: str = dataclasses.field(default="", metadata={
        "help": "comma-separated origins allowed to call from a browser (`*`: any)"})
    shutdown_timeout_s: float = 10.0
    reasoning_parser: str | None = dataclasses.field(default=None, metadata={
        "help": "split answers into `reasoning_content` and `content` at `<think>...</think>`: think "
                "(or vLLM's names deepseek_r1, qwen3); none: answers are all content"})

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_limits()
        require(0 <= self.port < 65536, f"--port {self.port} is not a TCP port")
        require(self.gateway_index >= 0, "--gateway-index must be >= 0")
        require(self.max_client_batch_size >= 0, "--max-client-batch-size must be >= 0")
        require(self.max_payload_bytes > 0, "--max-payload-bytes must be positive")
        require(self.request_timeout_s > 0, "--request-timeout-s must be positive")
        require(self.body_read_timeout_s > 0, "--body-read-timeout-s must be positive")
        require(self.query_timeout_s > 0, "--query-timeout-s must be positive")
        require(self.heartbeat_misses > 0, "--heartbeat-misses must be positive")
        require(self.shutdown_timeout_s >= 0, "--shutdown-timeout-s must be >= 0")
        check_reasoning_parser(self.reasoning_parser)
        self.check_media()
        if self.api_key_file is not None:
            require(self.api_key is None, "give the API key once: --api-key or --api-key-file, not both")
            object.__setattr__(self, "api_key", read_api_key(self.api_key_file))
        require(self.api_key is None or self.api_key.strip() == self.api_key != "",
                "--api-key must be non-empty, without surrounding spaces")

    @property
    def cors_allow_origins(self) -> tuple[str, ...]:
        return tuple(origin.strip() for origin in self.cors_allow_origin.split(",") if origin.strip())


def read_api_key(path: str) -> str:
    """The key on the first line of `path` (a line end stripped); ConfigError naming the file
    when it cannot be read or its first line is empty. The key itself is never in the message."""
    try:
        with open(path, encoding="utf-8") as file:
            key = file.readline().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--api-key-file {path}: {exc.__class__.__name__}: cannot read it") from None
    require(key != "", f"--api-key-file {path}: its first line is empty")
    return key
