"""How large a regex grows once its counted repetitions are written out, before llguidance sees it.

llguidance's lexer builds a regex by derivatives: `x{1000}` is a thousand positions, and nested
counts multiply, so `(x{1000}){1000}` (15 characters) is a million. Its limits catch some of
these at the first mask, but not all: that one compiled, took seconds for its first mask and
failed at the second step, stalling its worker meanwhile. Counting the written-out size takes
microseconds, so a request whose regex is too large is refused (422) before anything compiles it.
"""

from __future__ import annotations

import re
from re import _constants as constants  # type: ignore[attr-defined]  # Python 3.11+: `re`'s own parser
from re import _parser as parser  # type: ignore[attr-defined]
from typing import Any

MAX_REGEX_SIZE = 10_000  # written-out positions; above this a step's mask costs tens of ms or more


def regex_size(pattern: str) -> int | None:
    """Positions of `pattern` with each counted repetition written out (an unbounded one counted
    at its minimum, at least once); None when Python's parser does not read the pattern (a
    syntax only llguidance knows: the library's own limits then apply alone)."""
    try:
        parsed = parser.parse(pattern)
    except (re.error, RecursionError, OverflowError):
        return None
    return _size(list(parsed))


def _size(items: list[tuple[Any, Any]]) -> int:
    total = 0
    for op, arg in items:
        if op in (constants.MAX_REPEAT, constants.MIN_REPEAT, getattr(constants, "POSSESSIVE_REPEAT", None)):
            low, high, sub = arg
            count = max(low, 1) if high == constants.MAXREPEAT else max(high, 1)
            total += count * _size(list(sub))
        elif op == constants.SUBPATTERN:
            total += _size(list(arg[-1]))
        elif op == constants.BRANCH:
            total += sum(_size(list(branch)) for branch in arg[1])
        elif op in (constants.ASSERT, constants.ASSERT_NOT):
            total += _size(list(arg[1]))
        else:
            total += 1
    return total
