"""Reads a `text/event-stream` HTTP response as parsed JSON events."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import requests


def iter_events(response: requests.Response) -> Iterator[dict[str, Any]]:
    """Each `data:` line as JSON, as it arrives."""
    for line in response.iter_lines():
        if line.startswith(b"data:"):
            yield json.loads(line[len(b"data:"):])


def read_events(response: requests.Response) -> list[dict[str, Any]]:
    return list(iter_events(response))
