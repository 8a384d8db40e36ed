"""Boot nonces and socket identities."""

from __future__ import annotations

import os
import uuid


def new_boot_nonce() -> str:
    """A fresh value per process start, so peers can tell a restart from a hiccup."""
    return uuid.uuid4().hex


def new_identity(role: str) -> bytes:
    """A DEALER identity that is unique across hosts and restarts."""
    return f"{role}-{os.getpid()}-{uuid.uuid4().hex[:8]}".encode()
