"""PeerConnections: a closed connection's descriptor names the peer that spoke over it last."""

from __future__ import annotations

from ztgi.services.scheduler.peer_connections import PeerConnections


def test_disconnect_names_the_peer_once() -> None:
    """The descriptor a peer spoke over names it when it closes; a second event names no one."""
    connections = PeerConnections()
    connections.on_message(13, b"worker-a")
    connections.on_message(14, b"worker-b")
    assert connections.on_disconnected(13) == b"worker-a"
    assert connections.on_disconnected(13) is None
    assert connections.on_disconnected(99) is None  # a peer that never spoke


def test_old_connection_of_a_reconnected_peer_names_no_one() -> None:
    """A peer that reconnected (new descriptor) is not lost when its old connection's close is reported."""
    connections = PeerConnections()
    connections.on_message(13, b"worker-a")
    connections.on_message(17, b"worker-a")
    assert connections.on_disconnected(13) is None
    assert connections.on_disconnected(17) == b"worker-a"


def test_reused_descriptor_names_its_new_peer() -> None:
    """A descriptor the kernel gave to a new peer names that peer."""
    connections = PeerConnections()
    connections.on_message(13, b"worker-a")
    assert connections.on_disconnected(13) == b"worker-a"
    connections.on_message(13, b"worker-b")
    assert connections.on_disconnected(13) == b"worker-b"
