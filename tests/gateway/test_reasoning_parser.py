"""The `<think>` parser as pure logic: whole answers, answers fed piece by piece (tags split
anywhere, and as SmolLM2's tokens split them), and answers whose template opened the reasoning."""

from __future__ import annotations

import pytest

from ztgi.common.config import ConfigError
from ztgi.common.model_source import ModelSource
from ztgi.services.gateway.reasoning_parser import ReasoningStream, check_reasoning_parser, split_reasoning
from ztgi.services.tokenizer.loading import load_tokenizer

ANSWER = "<think>\nThe user greets me.\n</think>\n\nHello!"


def fed(text: str, size: int, opened: bool = False) -> tuple[str, str, list[tuple[str, str]]]:
    """(reasoning, content, every piece's split) of `text` fed `size` characters at a time."""
    stream = ReasoningStream(opened)
    pieces = [text[i:i + size] for i in range(0, len(text), size)] or [""]
    splits = [stream.feed(piece, final=i == len(pieces) - 1) for i, piece in enumerate(pieces)]
    return ("".join(s.reasoning for s in splits), "".join(s.content for s in splits),
            [(s.reasoning, s.content) for s in splits])


def test_whole_answer_splits_at_the_tags() -> None:
    """Reasoning between the tags, the answer after them without the blank lines between."""
    split = split_reasoning(ANSWER)
    assert (split.reasoning, split.content) == ("\nThe user greets me.\n", "Hello!")


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 100])
def test_any_split_of_the_tags_gives_the_same_answer(size: int) -> None:
    """Fed in pieces of any size (tags cut anywhere), the parts are those of the whole answer."""
    reasoning, content, _ = fed(ANSWER, size)
    assert (reasoning, content) == ("\nThe user greets me.\n", "Hello!")


def test_no_tag_text_is_shown_and_reasoning_streams_before_the_end() -> None:
    """A piece that may begin `</think>` is held back, the rest of the reasoning goes out at once."""
    stream = ReasoningStream()
    assert (stream.feed("<thi").reasoning, stream.feed("nk>Hmm").reasoning) == ("", "Hmm")
    assert stream.feed(" ok</").reasoning == " ok"
    split = stream.feed("think>Yes", final=True)
    assert (split.reasoning, split.content) == ("", "Yes")


def test_answer_without_tags_is_all_content() -> None:
    """No `<think>` first: the answer is content, streamed as it comes (a `<` waits one piece)."""
    assert (split_reasoning("Hello <think> there").reasoning, split_reasoning("Hello <think> there").content) == (
        "", "Hello <think> there")
    _, content, splits = fed("Hi there", 2)
    assert content == "Hi there" and splits[0] == ("", "Hi")
    _, content, splits = fed("<tag>x</tag>", 2)
    assert content == "<tag>x</tag>" and splits[0] == ("", "") and splits[1] == ("", "<tag")


def test_template_opened_reasoning() -> None:
    """DeepSeek-R1 style: the prompt ended with `<think>`, only `</think>` appears."""
    for size in (1, 4, 100):
        assert fed("Let me see.\n</think>\n\n42", size, opened=True)[:2] == ("Let me see.\n", "42")
        assert fed("<think>Again.</think>42", size, opened=True)[:2] == ("Again.", "42")  # the tag written anyway
    assert fed("Cut short", 3, opened=True)[:2] == ("Cut short", "")


def test_unfinished_reasoning_is_all_reasoning() -> None:
    """An answer cut by max_tokens inside the reasoning has no content; a held `</thi` is released."""
    assert fed("<think>Still thinking</thi", 3)[:2] == ("Still thinking</thi", "")
    assert fed("", 1)[:2] == ("", "")
    assert fed("  <thi", 2)[:2] == ("", "  <thi")  # ended before `<think>` was whole: content


def test_parser_names() -> None:
    """think and vLLM's names are parsers; another name is a ConfigError that lists them."""
    for name in ("think", "deepseek_r1", "qwen3", None):
        check_reasoning_parser(name)
    with pytest.raises(ConfigError, match="'granite' is not a reasoning parser: use one of think, deepseek_r1"):
        check_reasoning_parser("granite")


def test_real_token_texts(smollm2: ModelSource) -> None:
    """SmolLM2's tokens of a think answer (each tag split into several) feed the same parts; no
    piece of a tag reaches either part."""
    tokenizer = load_tokenizer(smollm2.path)
    ids = tokenizer.encode("<think>\nParis is the capital.\n</think>\n\nParis.", add_special_tokens=False)
    texts = [tokenizer.decode([token_id]) for token_id in ids]
    assert "<think>" not in texts and "</think>" not in texts  # the tags are several tokens
    stream = ReasoningStream()
    splits = [stream.feed(text, final=i == len(texts) - 1) for i, text in enumerate(texts)]
    assert "".join(s.reasoning for s in splits) == "\nParis is the capital.\n"
    assert "".join(s.content for s in splits) == "Paris."
    assert not any("<" in s.reasoning + s.content or ">" in s.reasoning + s.content for s in splits)
