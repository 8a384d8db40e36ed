"""Whether the served model's chat template opens the reasoning block itself.

DeepSeek-R1's distills (and Qwen3's thinking-only releases) end their generation prompt with
`<think>`: the answer starts inside the reasoning. The gateway asks a tokenizer once for the
template's prompt of a one-line chat and keeps the answer, as llama.cpp decides "thinking forced
open" from the template.
"""

from __future__ import annotations

import logging

from ztgi.common.client.async_client import AsyncZtgiClient
from ztgi.common.client.errors import ZtgiError
from ztgi.common.messages import ChatMessage
from ztgi.services.gateway.reasoning_parser import OPEN

logger = logging.getLogger(__name__)

PROBE = [ChatMessage("user", "Hi")]


class ReasoningStart:
    """Caches whether generation prompts end with `<think>` (asked again until a tokenizer answers)."""

    def __init__(self, client: AsyncZtgiClient) -> None:
        self.client = client
        self._opened: bool | None = None

    async def opened(self) -> bool:
        if self._opened is None:
            try:
                tokens = await self.client.tokenize("", messages=PROBE)
            except (ZtgiError, TimeoutError) as exc:
                logger.warning("cannot read the chat template's generation prompt (%s); taking answers to "
                               "start outside the reasoning for now", exc)
                return False
            self._opened = "".join(token.text for token in tokens).rstrip().endswith(OPEN)
            logger.info("the chat template %s the reasoning block", "opens" if self._opened else "does not open")
        return self._opened


async def reasoning_opened(start: ReasoningStart | None) -> bool | None:
    """How a chat answer's parser starts: None without `--reasoning-parser`, else whether the
    template opened the reasoning block."""
    return None if start is None else await start.opened()
