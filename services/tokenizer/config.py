"""Tokenizer configuration (flags `--x-y`, environment `ZTGI_X_Y`)."""

from __future__ import annotations

import dataclasses

from ztgi.common.config import require
from ztgi.common.model_source import DEFAULT_MODEL_ID
from ztgi.common.request_limit import MAX_IMAGE_PIXELS
from ztgi.common.service_config import PeerConfig, ReadyFileConfig, RequestLimits


@dataclasses.dataclass(frozen=True)
class TokenizerConfig(PeerConfig, RequestLimits, ReadyFileConfig):
    """One tokenizer replica: text to ids and back, with TGI's limits (launcher defaults)."""

    model_id: str = DEFAULT_MODEL_ID
    tokenizer_index: int = dataclasses.field(default=0, metadata={
        "help": "this replica's number, in its log lines"})
    max_image_pixels: int = MAX_IMAGE_PIXELS.field()

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_limits()
        require(self.tokenizer_index >= 0, "--tokenizer-index must be >= 0")
        require(self.max_image_pixels > 0, "--max-image-pixels must be positive")
