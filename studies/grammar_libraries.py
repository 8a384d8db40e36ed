"""llguidance, xgrammar and outlines-core side by side on our vocabulary (the SmolLM2 tokenizer).

For each library and each schema of a varied set: whether it compiles, how long that takes, and
whether the constraint is exact on two documents: a valid one must be accepted token by token and
end in an accepting state; an invalid one must be refused somewhere. Along the valid documents, the
time to compute one token mask (one request, one step) is recorded. A library that is not installed
is skipped.

    python -m studies.grammar_libraries [--model-id smollm2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import TYPE_CHECKING, Any

import torch

from ztgi.services.tokenizer.loading import load_tokenizer

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

# (name, schema, a valid document, an invalid document)
SCHEMAS: list[tuple[str, dict[str, Any], Any, Any]] = [
    ("object", {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                "required": ["name", "age"]}, {"name": "Ada", "age": 36}, {"name": "Ada"}),
    ("nested objects", {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
        "required": ["address"]}}, "required": ["user"]},
     {"user": {"address": {"city": "Paris"}}}, {"user": {"address": {}}}),
    ("bounded array", {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3},
     [1, 2], [1, 2, 3, 4]),
    ("enum", {"type": "string", "enum": ["red", "green", "blue"]}, "green", "pink"),
    ("const", {"type": "object", "properties": {"kind": {"const": "point"}}, "required": ["kind"]},
     {"kind": "point"}, {"kind": "line"}),
    ("anyOf", {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}]}, "abc", "abcd"),
    ("oneOf", {"oneOf": [{"type": "boolean"}, {"type": "null"}]}, None, 1),
    ("nullable type", {"type": "object", "properties": {"x": {"type": ["string", "null"]}}, "required": ["x"]},
     {"x": None}, {"x": 1}),
    ("pattern", {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}, "AB-123", "AB-12"),
    ("format date", {"type": "string", "format": "date"}, "2024-02-29", "2024-13-01"),
    ("format date-time", {"type": "string", "format": "date-time"}, "2024-02-29T12:30:00Z", "yesterday"),
    ("format email", {"type": "string", "format": "email"}, "ada@example.com", "ada-at-example"),
    ("format uuid", {"type": "string", "format": "uuid"}, "123e4567-e89b-12d3-a456-426614174000", "123"),
    ("format ipv4", {"type": "string", "format": "ipv4"}, "192.168.0.1", "192.168.0"),
    ("integer range", {"type": "integer", "minimum": 10, "maximum": 99}, 42, 100),
    ("number range", {"type": "number", "exclusiveMinimum": 0, "maximum": 1}, 0.5, 1.5),
    ("string length", {"type": "string", "minLength": 2, "maxLength": 4}, "abc", "abcde"),
    ("$defs and $ref", {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}},
                                           "required": ["x"]}},
                        "type": "array", "items": {"$ref": "#/$defs/point"}}, [{"x": 1}], [{"y": 1}]),
    ("recursive $ref", {"$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["value"], "additionalProperties": False}}, "$ref": "#/$defs/node"},
     {"value": 1, "children": [{"value": 2}]}, {"value": 1, "children": [{}]}),
    ("additionalProperties false", {"type": "object", "properties": {"a": {"type": "integer"}},
                                    "additionalProperties": False}, {"a": 1}, {"a": 1, "b": 2}),
    ("additionalProperties schema", {"type": "object", "additionalProperties": {"type": "integer"}},
     {"k": 1}, {"k": "v"}),
    ("allOf", {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                         {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
     {"a": 1, "b": "x"}, {"a": 1}),
    ("prefixItems", {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
     ["a", 1], [1, "a"]),
    ("multipleOf", {"type": "integer", "multipleOf": 5}, 15, 16),
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [1, 2], [1, 1]),
    ("minProperties", {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1},
     {"a": 1}, {}),
    ("tool call", {"type": "object", "properties": {
        "location": {"type": "string", "description": "City"}, "unit": {"type": "string", "enum": ["c", "f"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["location", "unit"],
        "additionalProperties": False}, {"location": "Paris", "unit": "c", "days": 3},
     {"location": "Paris", "unit": "k"}),
]


class Library:
    """One constrained-decoding library behind four calls."""

    name = ""
    setup_s = 0.0  # building the library's view of the vocabulary

    def __init__(self, tokenizer: Any) -> None:
        self.vocab_size = len(tokenizer)
        self.eos_token_id = tokenizer.eos_token_id

    def compile(self, schema: str) -> Any: ...
    def matcher(self, compiled: Any) -> Any: ...
    def mask(self, matcher: Any, bitmask: torch.Tensor) -> None: ...
    def consume(self, matcher: Any, token: int) -> bool:
        raise NotImplementedError

    def accepting(self, matcher: Any) -> bool:
        raise NotImplementedError


class LLGuidance(Library):
    name = "llguidance"

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        import llguidance
        import llguidance.hf
        self.lib = llguidance
        started = time.perf_counter()
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer)
        self.setup_s = time.perf_counter() - started

    def compile(self, schema: str) -> Any:
        options: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
        grammar = self.lib.LLMatcher.grammar_from_json_schema(schema, overrides=options)
        matcher = self.lib.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return grammar

    def matcher(self, compiled: Any) -> Any:
        return self.lib.LLMatcher(self.tokenizer, compiled, log_level=0)

    def mask(self, matcher: Any, bitmask: torch.Tensor) -> None:
        row = bitmask[0]
        matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)

    def consume(self, matcher: Any, token: int) -> bool:
        return matcher.consume_token(token)

    def accepting(self, matcher: Any) -> bool:
        return matcher.is_accepting() or matcher.is_stopped()


class XGrammar(Library):
    name = "xgrammar"

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        import xgrammar
        self.lib = xgrammar
        started = time.perf_counter()
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size)
        self.compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
        self.setup_s = time.perf_counter() - started

    def compile(self, schema: str) -> Any:
        return self.compiler.compile_json_schema(schema, any_whitespace=False, separators=(", ", ": "))

    def matcher(self, compiled: Any) -> Any:
        return self.lib.GrammarMatcher(compiled)

    def mask(self, matcher: Any, bitmask: torch.Tensor) -> None:
        matcher.fill_next_token_bitmask(bitmask)

    def consume(self, matcher: Any, token: int) -> bool:
        return matcher.accept_token(token)

    def accepting(self, matcher: Any) -> bool:
        return matcher.is_terminated()


class OutlinesCore(Library):
    name = "outlines-core"

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        import outlines_core
        self.lib = outlines_core
        started = time.perf_counter()
        self.vocabulary = outlines_core.Vocabulary(self.eos_token_id, _byte_vocabulary(tokenizer))
        self.setup_s = time.perf_counter() - started

    def compile(self, schema: str) -> Any:
        regex = self.lib.json_schema.build_regex_from_schema(schema)
        return self.lib.Index(regex, self.vocabulary)

    def matcher(self, compiled: Any) -> Any:
        return self.lib.Guide(compiled)

    def mask(self, matcher: Any, bitmask: torch.Tensor) -> None:
        matcher.write_mask_into(bitmask.data_ptr(), bitmask.numel(), 4)

    def consume(self, matcher: Any, token: int) -> bool:
        if token not in matcher.get_tokens():
            return False
        matcher.advance(token)
        return True

    def accepting(self, matcher: Any) -> bool:
        return matcher.is_finished()


def _byte_vocabulary(tokenizer: Any) -> dict[bytes, list[int]]:
    """Token bytes to ids for a byte-level BPE vocabulary (special tokens left out)."""
    unicode_to_byte = {u: b for b, u in _gpt2_byte_alphabet().items()}
    special = set(tokenizer.all_special_ids)
    vocabulary: dict[bytes, list[int]] = {}
    for token, token_id in tokenizer.get_vocab().items():
        if token_id in special or not all(c in unicode_to_byte for c in token):
            continue
        vocabulary.setdefault(bytes(unicode_to_byte[c] for c in token), []).append(token_id)
    return vocabulary


def _gpt2_byte_alphabet() -> dict[int, str]:
    """GPT-2's byte-level BPE alphabet: printable bytes stand for themselves, the others are
    shifted past 255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    alphabet = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in alphabet:
            alphabet[b] = chr(256 + shifted)
            shifted += 1
    return alphabet


def _allowed(bitmask: torch.Tensor, token: int) -> bool:
    return bool((int(bitmask[0, token // 32]) >> (token % 32)) & 1)


def walk(library: Library, compiled: Any, tokens: list[int], mask_times: list[float] | None) -> bool:
    """Whether the matcher takes `tokens` then EOS; each mask's time is appended to `mask_times`."""
    matcher = library.matcher(compiled)
    bitmask = torch.zeros((1, (library.vocab_size + 31) // 32), dtype=torch.int32)
    for token in tokens:
        started = time.perf_counter()
        library.mask(matcher, bitmask)
        if mask_times is not None:
            mask_times.append(time.perf_counter() - started)
        if not _allowed(bitmask, token) or not library.consume(matcher, token):
            return False
    return library.accepting(matcher) or library.consume(matcher, library.eos_token_id)


def measure(library: Library, tokenizer: Any, repeats: int) -> dict[str, Any]:
    supported: list[str] = []
    failures: dict[str, str] = {}
    compile_times: list[float] = []
    mask_times: list[float] = []
    for name, schema, valid, invalid in SCHEMAS:
        try:
            started = time.perf_counter()
            compiled = library.compile(json.dumps(schema))
            compile_times.append(time.perf_counter() - started)
        except Exception as exc:  # each library raises its own types
            failures[name] = f"compile: {str(exc).splitlines()[0][:100]}"
            continue
        valid_tokens = tokenizer.encode(json.dumps(valid), add_special_tokens=False)
        invalid_tokens = tokenizer.encode(json.dumps(invalid), add_special_tokens=False)
        if not walk(library, compiled, valid_tokens, None):
            failures[name] = "refuses a valid document"
        elif walk(library, compiled, invalid_tokens, None):
            failures[name] = "accepts an invalid document"
        else:
            supported.append(name)
            for _ in range(repeats):
                walk(library, compiled, valid_tokens, mask_times)
    mask_us = sorted(t * 1e6 for t in mask_times)
    return {
        "library": library.name, "setup_s": round(library.setup_s, 2),
        "supported": f"{len(supported)}/{len(SCHEMAS)}", "failures": failures,
        "compile_ms_median": round(statistics.median(compile_times) * 1e3, 2) if compile_times else None,
        "compile_ms_max": round(max(compile_times) * 1e3, 2) if compile_times else None,
        "mask_us_median": round(statistics.median(mask_us), 1) if mask_us else None,
        "mask_us_p99": round(mask_us[int(len(mask_us) * 0.99)], 1) if mask_us else None,
        "mask_us_mean": round(statistics.fmean(mask_us), 1) if mask_us else None,
        "num_masks": len(mask_us),
    }


LIBRARIES: list[type[Library]] = [LLGuidance, XGrammar, OutlinesCore]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-id", default="smollm2")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    tokenizer = load_tokenizer(args.model_id)
    for make in LIBRARIES:
        try:
            library = make(tokenizer)
        except ImportError as exc:
            print(json.dumps({"library": make.name, "skipped": str(exc)}))
            continue
        print(json.dumps(measure(library, tokenizer, args.repeats), indent=1))


if __name__ == "__main__":
    main()
