"""The backends a new connection may go to, each taken in turn.

The set changes as the name behind them resolves to more or fewer addresses (replicas started or
gone); the turn carries over, so a refresh does not send the next connections all to the first.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple


class Address(NamedTuple):
    host: str
    port: int


class Rotation:
    def __init__(self) -> None:
        self.addresses: tuple[Address, ...] = ()
        self._turn = 0

    def update(self, addresses: Iterable[Address]) -> None:
        """The backends are now `addresses` (in a stable order, without repeats)."""
        self.addresses = tuple(sorted(set(addresses)))

    def order(self) -> list[Address]:
        """Every backend, starting with the one whose turn it is; the next call starts one further."""
        if not self.addresses:
            return []
        start = self._turn % len(self.addresses)
        self._turn = start + 1
        return [*self.addresses[start:], *self.addresses[:start]]
