"""StopSequences: matches across token texts, the earliest completed sequence wins."""

from __future__ import annotations

from ztgi.services.tokenizer.stop_sequences import StopSequences


def _feed(stops: StopSequences, texts: list[str]) -> list[int | None]:
    return [stops.find(text) for text in texts]


def test_match_inside_one_text_ends_after_the_sequence():
    """A sequence inside one token's text is found; the end indexes that text."""
    assert StopSequences(["lo w"]).find("hello world") == 7


def test_match_spanning_several_texts():
    """A sequence split over three token texts is found in the one that completes it."""
    assert _feed(StopSequences(["abcdef"]), ["xxab", "cd", "efyy"]) == [None, None, 2]


def test_earliest_completed_sequence_wins():
    """Of several sequences completed by one text, the one that ends first stops it."""
    assert StopSequences(["world", "lo"]).find("hello world") == 5


def test_no_sequences_never_match():
    """Without stop sequences, or with empty texts, nothing matches."""
    assert _feed(StopSequences([]), ["a", "b"]) == [None, None]
    assert StopSequences(["a"]).find("") is None


def test_a_hit_is_reported_once_then_only_new_text_counts():
    """A sequence already inside the kept tail is not reported again by later texts."""
    stops = StopSequences(["ab"])
    assert _feed(stops, ["xa", "b", "c", "ab"]) == [None, 1, None, 2]


def test_single_character_sequence():
    """One-character sequences need no tail and match in the text that holds them."""
    assert _feed(StopSequences(["\n"]), ["Hi", " there\nmore"]) == [None, 7]
