"""Grammars as llguidance grammars, and the check a grammar passes before its request is queued.

The tokenizer checks every grammar against the vocabulary (`GrammarChecker`): one the library
cannot compile is refused there with a `ValidationError` naming the problem, so the worker, which
compiles it again to mask with it (`services/worker/sampling/grammar.py`), never meets a bad one. Both
convert a `Grammar` the same way here.

JSON is generated compactly (`", "` and `": "` separators, no free whitespace): a small model
cannot pad an answer with endless blank lines, and every answer parses with `json.loads`.
llguidance's own limits bound the work a grammar may cost (`LIMITS`), so no grammar hangs the
tokenizer or a worker; a regex whose counted repetitions write out to more than MAX_REGEX_SIZE
positions is refused before it compiles (`regex_size.py`): the library's limits let
`(x{1000}){1000}` through to seconds of masking and a failure at its second token.
"""

from __future__ import annotations

import collections
import json
import re
from typing import TYPE_CHECKING, Any

import llguidance

from ztgi.common.messages import Grammar
from ztgi.common.parameters import ValidationError
from ztgi.common.regex_size import MAX_REGEX_SIZE, regex_size

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
LIMITS = llguidance.LLParserLimits(verbose_errors=False)  # errors name the problem, not the parser state
MAX_CACHED_GRAMMARS = 256
LARK_REGEX = re.compile(r"/((?:\\.|[^/\\\n])+)/")  # a lark grammar's regex literals: /.../


def to_llguidance(grammar: Grammar) -> str:
    """The llguidance grammar of `grammar`; ValueError when a JSON schema is not a JSON object."""
    if grammar.type == "json":
        return llguidance.LLMatcher.grammar_from_json_schema(grammar.value, overrides=JSON_OPTIONS)
    if grammar.type == "regex":
        return llguidance.LLMatcher.grammar_from_regex(grammar.value)
    return llguidance.LLMatcher.grammar_from_lark(grammar.value)


def json_grammar(schema: Any, lenient: bool = False) -> Grammar:
    """A `json` grammar for a schema given as a JSON value; `lenient` ignores keywords the library
    does not implement (best effort) instead of refusing the schema."""
    if lenient and isinstance(schema, dict):
        schema = {**schema, "x-guidance": {**schema.get("x-guidance", {}), "lenient": True}}
    return Grammar("json", json.dumps(schema))


def lltokenizer(hf_tokenizer: Any, eos_token_ids: list[int] | None = None) -> llguidance.LLTokenizer:
    """The vocabulary as llguidance sees it (slow to build for a large vocabulary: build it once).
    `llguidance.hf` is imported here: it imports transformers, which the gateway (a user of this
    module's grammars) has no other need of."""
    import llguidance.hf

    return llguidance.hf.from_tokenizer(hf_tokenizer, eos_token=eos_token_ids or None)


def new_matcher(tokenizer: llguidance.LLTokenizer, grammar: Grammar) -> llguidance.LLMatcher:
    """A matcher at the grammar's start; ValidationError naming the problem when it cannot compile."""
    if grammar.type == "regex":
        _require_small_regex(grammar.value)
    elif grammar.type == "lark":
        for pattern in LARK_REGEX.findall(grammar.value):
            _require_small_regex(pattern)
    try:
        compiled = to_llguidance(grammar)
    except ValueError as exc:
        raise ValidationError("grammar", f"`grammar` is not valid: {_first_line(exc)}") from None
    matcher = llguidance.LLMatcher(tokenizer, compiled, log_level=0, limits=LIMITS)
    if matcher.is_error():
        raise ValidationError("grammar", f"`grammar` cannot be compiled: {_first_line(matcher.get_error())}")
    return matcher


def _require_small_regex(pattern: str) -> None:
    size = regex_size(pattern)
    if size is not None and size > MAX_REGEX_SIZE:
        raise ValidationError("grammar", f"`grammar` is too large: the regex's counted repetitions write out to "
                                         f"{size} positions, more than {MAX_REGEX_SIZE} (use `*` or `+`, or "
                                         f"smaller counts)")


class GrammarChecker:
    """Compiles each grammar once against the vocabulary and remembers the verdict."""

    def __init__(self, hf_tokenizer: Any) -> None:
        self.hf_tokenizer = hf_tokenizer
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._verdicts: collections.OrderedDict[Grammar, str | None] = collections.OrderedDict()

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        if self._tokenizer is None:
            self._tokenizer = lltokenizer(self.hf_tokenizer)
        return self._tokenizer

    def check(self, grammar: Grammar) -> None:
        """Raises ValidationError when `grammar` cannot constrain this vocabulary."""
        if grammar not in self._verdicts:
            self._verdicts[grammar] = self._verdict(grammar)
            if len(self._verdicts) > MAX_CACHED_GRAMMARS:
                self._verdicts.popitem(last=False)
        self._verdicts.move_to_end(grammar)
        error = self._verdicts[grammar]
        if error is not None:
            raise ValidationError("grammar", error)

    def _verdict(self, grammar: Grammar) -> str | None:
        try:
            matcher = new_matcher(self.tokenizer, grammar)
        except ValidationError as exc:
            return str(exc)
        matcher.compute_bitmask()  # the first step builds the lexer's start: its limits apply now
        if matcher.is_error():
            return f"`grammar` cannot be compiled: {_first_line(matcher.get_error())}"
        return None


def _first_line(error: object) -> str:
    """The library's message on one line (a regex error spans several: the pattern, a caret)."""
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    return text[:500] or "unknown error"
