"""Which peer spoke over which connection of a ROUTER, so a dropped connection names its peer.

A ZMQ socket monitor reports a closed connection by its file descriptor only; every message a
ROUTER receives carries the descriptor it came over (`ZMQ_SRCFD`). Kept together, they say at
once which worker or tokenizer vanished (a process that exits or is killed closes its
connections), long before its heartbeats are missed. Heartbeats remain the fallback for what
closes nothing: a frozen process, a host that is gone, a cut cable.
"""

from __future__ import annotations


class PeerConnections:
    """The last connection (descriptor) each identity spoke over, and the reverse."""

    def __init__(self) -> None:
        self.fd_to_identity: dict[int, bytes] = {}
        self.identity_to_fd: dict[bytes, int] = {}

    def on_message(self, fd: int, identity: bytes) -> None:
        if self.identity_to_fd.get(identity) != fd:
            self.identity_to_fd[identity] = fd
            self.fd_to_identity[fd] = identity

    def on_disconnected(self, fd: int) -> bytes | None:
        """The identity whose current connection this was, or None (an older one of a peer that
        reconnected since, or a peer that never spoke)."""
        identity = self.fd_to_identity.pop(fd, None)
        if identity is None or self.identity_to_fd.get(identity) != fd:
            return None
        del self.identity_to_fd[identity]
        return identity
