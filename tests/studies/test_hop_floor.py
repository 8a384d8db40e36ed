"""The hop floor tool: its figures on known times, and real runs over real processes and sockets."""

from __future__ import annotations

import re

from studies.hop_floor import HopFloorConfig, main, render


def test_render_reports_percentiles_of_the_route_and_per_hop() -> None:
    """Ten messages of 100..1000 us: p10 190, p50 550, p90 910 (interpolated), 550 / 8 per hop."""
    text = render([float(t) for t in range(1000, 0, -100)], HopFloorConfig(messages=10, gap_ms=0))
    assert text == "8 hops, 10 messages 0 ms apart: p50 550 us (p10 190, p90 910); per hop p50 69 us\n"


def test_a_run_times_every_message_over_the_route(capsys) -> None:
    """A hub and two peers as processes, the client timing each message around the route."""
    assert main(["--messages", "20", "--gap-ms", "0", "--warmup", "2"]) == 0
    output = capsys.readouterr().out
    match = re.fullmatch(r"8 hops, 20 messages 0 ms apart: p50 (\d+) us \(p10 (\d+), p90 (\d+)\); "
                         r"per hop p50 (\d+) us\n", output)
    assert match, output
    p50, p10, p90, per_hop = map(int, match.groups())
    assert 0 < p10 <= p50 <= p90 and per_hop > 0


def test_an_http_run_times_every_request_to_its_first_event(capsys) -> None:
    """A bare aiohttp server as a process, the client timing each request to its first SSE event."""
    assert main(["--http", "--messages", "10", "--gap-ms", "0", "--warmup", "2"]) == 0
    output = capsys.readouterr().out
    match = re.fullmatch(r"HTTP request to first SSE event, 10 requests 0 ms apart: p50 (\d+) us "
                         r"\(p10 (\d+), p90 (\d+)\)\n", output)
    assert match, output
    p50, p10, p90 = map(int, match.groups())
    assert 0 < p10 <= p50 <= p90


def test_bad_flags_exit_2(capsys) -> None:
    assert main(["--messages", "1"]) == 2
    assert "--messages must be >= 2" in capsys.readouterr().err
