"""The scheduler's verbs, each run as one engine call: what rank 0 and the other ranks of a group share."""

from __future__ import annotations

from ztgi.common.messages import Clear, Decode, Filter, HealthCheck, Prefill, Warmup
from ztgi.services.worker.engine import Engine

COMMANDS = (Warmup, Prefill, Decode, Filter, Clear, HealthCheck)


def run_command(engine: Engine, command: object) -> object:
    """The engine's answer to one command (the engine answers its own failures)."""
    match command:
        case Warmup():
            return engine.warmup(command)
        case Prefill():
            return engine.prefill(command)
        case Decode():
            return engine.decode(command)
        case Filter():
            return engine.filter(command)
        case Clear():
            return engine.clear(command)
        case HealthCheck():
            return engine.health_check(command)
    raise AssertionError(f"not a command: {command!r}")
