"""Where each message from the scheduler goes: a request's queue or a query's future."""

from __future__ import annotations

import asyncio
import logging

from ztgi.common.client.errors import ZtgiError
from ztgi.common.messages import (
    AdapterReply,
    HealthReply,
    InfoReply,
    StatsReply,
    StreamEvent,
    StreamEvents,
    TokenizeReply,
)

logger = logging.getLogger(__name__)

class RequestRouter:
    """One queue per request in flight (by `request_id`) and one future per query waiting for
    its reply (by `query_id`); a failure of the link ends them all at once."""

    def __init__(self) -> None:
        self.request_id_to_queue: dict[str, asyncio.Queue[StreamEvent]] = {}
        self.query_id_to_future: dict[str, asyncio.Future] = {}

    def __len__(self) -> int:
        return len(self.request_id_to_queue)

    def open_request(self, request_id: str) -> asyncio.Queue[StreamEvent]:
        if request_id in self.request_id_to_queue:
            raise ZtgiError(f"request_id {request_id!r} is already in flight on this client", "validation")
        queue: asyncio.Queue[StreamEvent] = asyncio.Queue()
        self.request_id_to_queue[request_id] = queue
        return queue

    def close_request(self, request_id: str) -> None:
        self.request_id_to_queue.pop(request_id, None)

    def open_query(self, query_id: str) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.query_id_to_future[query_id] = future
        return future

    def close_query(self, query_id: str) -> None:
        self.query_id_to_future.pop(query_id, None)

    def route(self, msg: object) -> None:
        """Every event of `StreamEvents` to its request's queue, or a reply to its query."""
        match msg:
            case StreamEvents():
                for event in msg.events:
                    self._route_event(event)
            case HealthReply() | InfoReply() | StatsReply() | TokenizeReply() | AdapterReply():
                future = self.query_id_to_future.get(msg.query_id)
                if future is not None and not future.done():
                    future.set_result(msg)

    def _route_event(self, event: StreamEvent) -> None:
        queue = self.request_id_to_queue.get(event.request_id)
        if queue is None:
            logger.debug("event for request %s that is no longer in flight: dropped", event.request_id)
            return
        queue.put_nowait(event)

    def fail_all(self, error: str, error_type: str) -> list[str]:
        """Ends every open stream with an error event and every pending query with ZtgiError;
        returns the ids of the requests it ended (they may still be alive somewhere)."""
        request_ids = list(self.request_id_to_queue)
        for request_id, queue in self.request_id_to_queue.items():
            queue.put_nowait(StreamEvent(request_id=request_id, error=error, error_type=error_type))
        for future in self.query_id_to_future.values():
            if not future.done():
                future.set_exception(ZtgiError(error, error_type))
        return request_ids
