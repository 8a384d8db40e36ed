"""Tokenizer configuration (flags `--x-y`, environment `ZTGI_X_Y`)."""

from __future__ import annotations

import dataclasses

from common import curve
from common.config import require
from common.endpoints import DEFAULT_SCHEDULER_URL, Endpoints
from common.model_source import DEFAULT_MODEL_ID
from common.parameters import ParameterLimits


@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
    """One tokenizer replica: text to ids and back, with TGI's limits (launcher defaults)."""

    scheduler_url: str = DEFAULT_SCHEDULER_URL
    model_id: str = DEFAULT_MODEL_ID
    tokenizer_index: int = 0
    max_input_tokens: int = 4095
    max_total_tokens: int = 4096
    max_stop_sequences: int = 4
    max_top_n_tokens: int = 5
    max_best_of: int = 2
    heartbeat_interval_ms: int = 1000
    handshake_timeout_s: float = dataclasses.field(default=30.0, metadata={
        "help": "exit with code 1 when the handshake with the scheduler (CURVE keys) has kept failing this "
                "long; a scheduler that is not up yet is waited for without limit"})
    curve_server_public_key_file: str | None = dataclasses.field(default=None, metadata={
        "help": "the scheduler's CURVE public key file (NAME.key from `ztgi keygen`): encrypts the link"})
    curve_secret_key_file: str | None = dataclasses.field(default=None, metadata={
        "help": "this tokenizer's CURVE keypair (NAME.key_secret); unset: a fresh one per process"})
    log_level: str = "INFO"
    log_rate_limit_s: float = dataclasses.field(default=10.0, metadata={
        "help": "a warning repeated more than 10 times within this many seconds is counted, not written "
                "(one line then says how many were suppressed); 0: every line is written"})

    def __post_init__(self) -> None:
        require(self.log_rate_limit_s >= 0, "--log-rate-limit-s must be >= 0")
        Endpoints(self.scheduler_url)  # validates the URL
        require(self.tokenizer_index >= 0, "--tokenizer-index must be >= 0")
        require(self.max_input_tokens > 0, "--max-input-tokens must be positive")
        require(self.max_input_tokens < self.max_total_tokens,
                f"--max-input-tokens ({self.max_input_tokens}) must be less than --max-total-tokens "
                f"({self.max_total_tokens})")
        require(self.max_stop_sequences >= 0, "--max-stop-sequences must be >= 0")
        require(self.max_top_n_tokens >= 0, "--max-top-n-tokens must be >= 0")
        require(self.max_best_of >= 1, "--max-best-of must be >= 1")
        require(self.heartbeat_interval_ms > 0, "--heartbeat-interval-ms must be positive")
        require(self.handshake_timeout_s > 0, "--handshake-timeout-s must be positive")
        curve.client_keys(self.curve_server_public_key_file, self.curve_secret_key_file)  # validates

    @property
    def curve_keys(self) -> curve.CurveKeys | None:
        return curve.client_keys(self.curve_server_public_key_file, self.curve_secret_key_file)

    @property
    def endpoints(self) -> Endpoints:
        return Endpoints(self.scheduler_url)

    @property
    def limits(self) -> ParameterLimits:
        return ParameterLimits(
            max_best_of=self.max_best_of, max_stop_sequences=self.max_stop_sequences,
            max_top_n_tokens=self.max_top_n_tokens, max_input_tokens=self.max_input_tokens,
            max_total_tokens=self.max_total_tokens)
