"""Gateway configuration (flags `--x-y`, environment `ZTGI_X_Y`)."""

from __future__ import annotations

import dataclasses

from common import curve
from common.config import require
from common.endpoints import DEFAULT_SCHEDULER_URL, Endpoints
from common.parameters import ParameterLimits


@dataclasses.dataclass(frozen=True)
class GatewayConfig:
    """One HTTP gateway replica: TGI's HTTP API over the scheduler's frontend.

    The limits are the ones requests are validated against before anything is queued (HTTP
    422); they should match the scheduler's (the launcher passes the same ZTGI_* values to both).
    """

    scheduler_url: str = DEFAULT_SCHEDULER_URL
    host: str = "127.0.0.1"
    port: int = 8080
    reuse_port: bool = False
    gateway_index: int = 0
    max_input_tokens: int = 4095
    max_total_tokens: int = 4096
    max_stop_sequences: int = 4
    max_top_n_tokens: int = 5
    max_best_of: int = 2
    max_client_batch_size: int = 4
    max_payload_bytes: int = 2 * 1024 * 1024
    body_read_timeout_s: float = dataclasses.field(default=30.0, metadata={
        "help": "a request body not received within this many seconds is answered 408 and its "
                "connection closed (a client that sends part of a body and stops holds it until then)"})
    request_timeout_s: float = 600.0
    query_timeout_s: float = 5.0
    heartbeat_interval_ms: int = 1000
    heartbeat_misses: int = 5
    handshake_timeout_s: float = dataclasses.field(default=30.0, metadata={
        "help": "exit with code 1 when the handshake with the scheduler (CURVE keys) has kept failing this "
                "long; a scheduler that is not up yet is waited for without limit"})
    compute_type: str = "ztgi"
    api_key: str | None = dataclasses.field(default=None, metadata={
        "help": "when set, generation routes need `Authorization: Bearer <key>`"})
    cors_allow_origin: str = dataclasses.field(default="", metadata={
        "help": "comma-separated origins allowed to call from a browser (`*`: any)"})
    shutdown_timeout_s: float = 10.0
    curve_server_public_key_file: str | None = dataclasses.field(default=None, metadata={
        "help": "the scheduler's CURVE public key file (NAME.key from `ztgi keygen`): encrypts the link"})
    curve_secret_key_file: str | None = dataclasses.field(default=None, metadata={
        "help": "this gateway's CURVE keypair (NAME.key_secret); unset: a fresh one per process"})
    log_level: str = "INFO"
    log_rate_limit_s: float = dataclasses.field(default=10.0, metadata={
        "help": "a warning repeated more than 10 times within this many seconds is counted, not written "
                "(one line then says how many were suppressed); 0: every line is written"})

    def __post_init__(self) -> None:
        require(self.log_rate_limit_s >= 0, "--log-rate-limit-s must be >= 0")
        Endpoints(self.scheduler_url)  # validates the URL
        require(0 <= self.port < 65536, f"--port {self.port} is not a TCP port")
        require(self.gateway_index >= 0, "--gateway-index must be >= 0")
        require(0 < self.max_input_tokens < self.max_total_tokens,
                f"--max-input-tokens ({self.max_input_tokens}) must be positive and less than "
                f"--max-total-tokens ({self.max_total_tokens})")
        for name in ("max_stop_sequences", "max_top_n_tokens", "max_best_of", "max_client_batch_size"):
            require(getattr(self, name) >= 0, f"--{name.replace('_', '-')} must be >= 0")
        require(self.max_payload_bytes > 0, "--max-payload-bytes must be positive")
        require(self.request_timeout_s > 0, "--request-timeout-s must be positive")
        require(self.body_read_timeout_s > 0, "--body-read-timeout-s must be positive")
        require(self.query_timeout_s > 0, "--query-timeout-s must be positive")
        require(self.handshake_timeout_s > 0, "--handshake-timeout-s must be positive")
        require(self.heartbeat_interval_ms > 0 and self.heartbeat_misses > 0,
                "--heartbeat-interval-ms and --heartbeat-misses must be positive")
        require(self.shutdown_timeout_s >= 0, "--shutdown-timeout-s must be >= 0")
        curve.client_keys(self.curve_server_public_key_file, self.curve_secret_key_file)  # validates
        require(self.api_key is None or self.api_key.strip() == self.api_key != "",
                "--api-key must be non-empty, without surrounding spaces")

    @property
    def cors_allow_origins(self) -> tuple[str, ...]:
        return tuple(origin.strip() for origin in self.cors_allow_origin.split(",") if origin.strip())

    @property
    def curve_keys(self) -> curve.CurveKeys | None:
        return curve.client_keys(self.curve_server_public_key_file, self.curve_secret_key_file)

    @property
    def limits(self) -> ParameterLimits:
        return ParameterLimits(
            max_best_of=self.max_best_of, max_stop_sequences=self.max_stop_sequences,
            max_top_n_tokens=self.max_top_n_tokens, max_input_tokens=self.max_input_tokens,
            max_total_tokens=self.max_total_tokens)
