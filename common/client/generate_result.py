"""What `generate` returns: a whole generation at once."""

from __future__ import annotations

import dataclasses

from ztgi.common.messages import FinalDetails, Token


@dataclasses.dataclass
class GenerateResult:
    """A whole generation: its text, every token (with top tokens when asked) and details."""

    request_id: str
    text: str
    tokens: list[Token]
    top_tokens: list[list[Token]]
    details: FinalDetails | None
