"""The served model's Info, asked of the scheduler once and kept (OpenAI answers name the model)."""

from __future__ import annotations

from ztgi.common.client.async_client import AsyncZtgiClient
from ztgi.common.messages import InfoReply


class ServedModel:
    """Caches the scheduler's InfoReply once a worker has registered a model."""

    def __init__(self, client: AsyncZtgiClient) -> None:
        self.client = client
        self._info: InfoReply | None = None

    async def info(self) -> InfoReply:
        if self._info is None or not self._info.model_id:  # no worker yet: ask again next time
            self._info = await self.client.info()
        return self._info
