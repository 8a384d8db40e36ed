"""The config fields every service shares, written once: each service's config extends these.

`LogConfig`: how a process logs (every service and the launcher).
`ServiceConfig`: a service's link to the scheduler: its URL (the scheduler binds it).
`PeerConfig`: a service that connects to the scheduler (tokenizer, worker, gateway): its
heartbeats, its CURVE keys and how long a failing handshake is retried.
`ReadyFileConfig`: a worker's or tokenizer's ready file, for an orchestrator's probe.
`RequestLimits`: TGI's per-request limits, checked by the gateway, the tokenizer and the
scheduler alike (the launcher passes the same values to all three); each field is the one
declaration in `request_limit`.
"""

from __future__ import annotations

import dataclasses

from ztgi.common import curve
from ztgi.common.config import require
from ztgi.common.endpoints import DEFAULT_SCHEDULER_URL, Endpoints
from ztgi.common.parameters import ParameterLimits
from ztgi.common.request_limit import (
    MAX_BEST_OF,
    MAX_INPUT_TOKENS,
    MAX_STOP_SEQUENCES,
    MAX_TOP_N_TOKENS,
    MAX_TOTAL_TOKENS,
)


@dataclasses.dataclass(frozen=True)
class LogConfig:
    """The log level, and how often one repeated warning is written."""

    log_level: str = dataclasses.field(default="INFO", metadata={
        "help": "DEBUG, INFO, WARNING or ERROR"})
    log_rate_limit_s: float = dataclasses.field(default=10.0, metadata={
        "help": "a warning repeated more than 10 times within this many seconds is counted, not written "
                "(one line then says how many were suppressed); 0: every line is written"})

    def __post_init__(self) -> None:
        require(self.log_rate_limit_s >= 0, "--log-rate-limit-s must be >= 0")


@dataclasses.dataclass(frozen=True)
class ServiceConfig(LogConfig):
    """One service process: the scheduler's URL (every address derives from it) and its logging."""

    scheduler_url: str = dataclasses.field(default=DEFAULT_SCHEDULER_URL, metadata={
        "help": "where the scheduler is: tcp://HOST:PORT (five ports from PORT) or ipc:///RUN/DIR (one host)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        Endpoints(self.scheduler_url)  # validates the URL


@dataclasses.dataclass(frozen=True)
class PeerConfig(ServiceConfig):
    """A service that connects to the scheduler: liveness and the CURVE keys of its link."""

    heartbeat_interval_ms: int = dataclasses.field(default=1000, metadata={
        "help": "how often this process tells the scheduler it is alive"})
    handshake_timeout_s: float = dataclasses.field(default=30.0, metadata={
        "help": "exit with code 1 when the handshake with the scheduler (CURVE keys) has kept failing this "
                "long; a scheduler that is not up yet is waited for without limit"})
    curve_server_public_key_file: str | None = dataclasses.field(default=None, metadata={
        "help": "the scheduler's CURVE public key file (NAME.key from `ztgi keygen`): encrypts the link"})
    curve_secret_key_file: str | None = dataclasses.field(default=None, metadata={
        "help": "this process's CURVE keypair (NAME.key_secret); unset: a fresh one per process"})

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.heartbeat_interval_ms > 0, "--heartbeat-interval-ms must be positive")
        require(self.handshake_timeout_s > 0, "--handshake-timeout-s must be positive")
        curve.client_keys(self.curve_server_public_key_file, self.curve_secret_key_file)  # validates

    @property
    def curve_keys(self) -> curve.CurveKeys | None:
        return curve.client_keys(self.curve_server_public_key_file, self.curve_secret_key_file)

    @property
    def endpoints(self) -> Endpoints:
        return Endpoints(self.scheduler_url)


@dataclasses.dataclass(frozen=True)
class ReadyFileConfig:
    """A peer without a port of its own (worker, tokenizer) says it is ready through a file
    (`common/ready_file.py`)."""

    ready_file: str | None = dataclasses.field(default=None, metadata={
        "help": "write this file each time the scheduler confirms this process is ready (a worker: registered "
                "and warmed up), remove it at start and stop; `ztgi probe --ready-file PATH` reads its age "
                "(a Kubernetes exec probe)"})


@dataclasses.dataclass(frozen=True)
class RequestLimits:
    """TGI's limits on one request (HTTP 422 at the gateway, a rejection at the tokenizer)."""

    max_input_tokens: int = MAX_INPUT_TOKENS.field()
    max_total_tokens: int = MAX_TOTAL_TOKENS.field()
    max_stop_sequences: int = MAX_STOP_SEQUENCES.field()
    max_top_n_tokens: int = MAX_TOP_N_TOKENS.field()
    max_best_of: int = MAX_BEST_OF.field()

    def check_limits(self) -> None:
        """Called by each config's `__post_init__` (a mixin's own would not run in the chain)."""
        require(self.max_input_tokens > 0, "--max-input-tokens must be positive")
        require(self.max_input_tokens < self.max_total_tokens,
                f"--max-input-tokens ({self.max_input_tokens}) must be less than --max-total-tokens "
                f"({self.max_total_tokens})")
        require(self.max_stop_sequences >= 0, "--max-stop-sequences must be >= 0")
        require(self.max_top_n_tokens >= 0, "--max-top-n-tokens must be >= 0")
        require(self.max_best_of >= 1, "--max-best-of must be >= 1")

    @property
    def limits(self) -> ParameterLimits:
        return ParameterLimits(
            max_best_of=self.max_best_of, max_stop_sequences=self.max_stop_sequences,
            max_top_n_tokens=self.max_top_n_tokens, max_input_tokens=self.max_input_tokens,
            max_total_tokens=self.max_total_tokens)
