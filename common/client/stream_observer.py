"""The observer a request's stream reports to as it goes (the gateway's metrics)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ztgi.common.messages import GenerateParameters, StreamEvent


class StreamObserver(Protocol):
    """Watches one request's stream: every event as it arrives, then the end; `finished` is
    False when the stream stopped before its final event."""

    def on_event(self, event: StreamEvent) -> None: ...

    def on_close(self, finished: bool) -> None: ...


ObserverFactory = Callable[[GenerateParameters], StreamObserver]
