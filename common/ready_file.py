"""A file a worker or tokenizer keeps fresh while the scheduler counts it as ready, for an orchestrator's probe.

Workers and tokenizers serve no port of their own, so Kubernetes cannot ask them over HTTP whether
they are ready. Started with `--ready-file PATH`, a peer writes PATH each time the scheduler answers
its heartbeat while it is ready to serve (a worker: registered and warmed up; a tokenizer: heard
by the scheduler at all) and removes it when it starts and when it stops. The file's age is then
how long ago the scheduler last confirmed this peer, and a peer that hangs, loses its scheduler or
is dropped by it lets the file age: `ztgi probe --ready-file PATH --max-age-s S` exits 0 while the
file is younger than S seconds, 1 otherwise, saying why.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_MAX_AGE_S = 10.0  # ten heartbeats at the default 1 s interval


class ReadyFile:
    """The file at `path`, or nothing at all when `path` is None (no probe configured)."""

    def __init__(self, path: str | None) -> None:
        self.path = None if path is None else Path(path)
        self.failed = False  # a write failed: said once, not at every heartbeat

    def mark_ready(self) -> None:
        """The scheduler just confirmed this peer: the file exists and is new."""
        if self.path is None:
            return
        try:
            self.path.touch()
            self.failed = False
        except OSError as exc:
            if not self.failed:
                logger.warning("cannot write the ready file %s (probes will say not ready): %s", self.path, exc)
            self.failed = True

    def clear(self) -> None:
        """Not ready (starting or stopping): the file is gone."""
        if self.path is not None:
            try:
                self.path.unlink(missing_ok=True)
            except OSError as exc:
                logger.warning("cannot remove the ready file %s: %s", self.path, exc)


def not_ready_reason(path: str, max_age_s: float, now: float | None = None) -> str | None:
    """Why the peer writing `path` is not ready, or None when it is."""
    try:
        written = os.stat(path).st_mtime
    except FileNotFoundError:
        return f"{path} does not exist: the scheduler has not counted this peer as ready since it started"
    except OSError as exc:
        return f"cannot read {path}: {exc}"
    age_s = (time.time() if now is None else now) - written
    if age_s > max_age_s:
        return (f"{path} was last written {age_s:.1f} s ago (over --max-age-s {max_age_s:g}): "
                f"the scheduler has not confirmed this peer since")
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """`ztgi probe`: exit 0 when the peer's ready file is fresh, 1 (and why, on stderr) when not."""
    parser = argparse.ArgumentParser(prog="ztgi probe", description=main.__doc__)
    parser.add_argument("--ready-file", required=True,
                        help="the file the worker or tokenizer was started with (--ready-file)")
    parser.add_argument("--max-age-s", type=float, default=DEFAULT_MAX_AGE_S,
                        help="the oldest the file may be, in seconds (several heartbeat intervals)")
    args = parser.parse_args(argv)
    if args.max_age_s <= 0:
        parser.error(f"--max-age-s must be positive, got {args.max_age_s:g}")
    reason = not_ready_reason(args.ready_file, args.max_age_s)
    if reason is not None:
        print(f"not ready: {reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
