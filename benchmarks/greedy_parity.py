"""Comparing two greedy runs of the same prompt that computed it in different shapes.

A request resumed on another worker, preempted and recomputed, or verified in a speculative chunk
has its logits computed by other kernels than the run it is compared with (a chunk instead of
decode steps, another batch shape), so they differ in the last float bits. Where the reference's
two best tokens are that close, greedy may take the other one, and from there the texts part. Two
runs agree when they are equal, or equal up to a position where the reference had such a near-tie
and the other run took the runner-up.
"""

from __future__ import annotations

import dataclasses

NEAR_TIE = 1e-3  # logprob gap: far above float32's differences between kernels, far below a real preference


@dataclasses.dataclass
class GreedyStream:
    """One streamed greedy answer with its top-2 candidates at each position (`top_n_tokens: 2`)."""

    ids: list[int] = dataclasses.field(default_factory=list)
    texts: list[str] = dataclasses.field(default_factory=list)
    top2: list[list[tuple[int, float]]] = dataclasses.field(default_factory=list)

    def add(self, event: dict) -> None:
        """Appends one `/generate_stream` event."""
        self.ids.append(event["token"]["id"])
        self.texts.append(event["token"]["text"])
        self.top2.append([(top["id"], top["logprob"]) for top in event.get("top_tokens") or []])

    @classmethod
    def from_details(cls, details: dict) -> GreedyStream:
        """A `/generate` answer's `details` (asked with `top_n_tokens: 2`) as a stream."""
        stream = cls()
        for token, top in zip(details["tokens"], details.get("top_tokens") or [[]] * len(details["tokens"])):
            stream.add({"token": token, "top_tokens": top})
        return stream

    @property
    def text(self) -> str:
        return "".join(self.texts)


def greedy_difference(reference: GreedyStream, got: GreedyStream, tolerance: float = NEAR_TIE) -> str | None:
    """None when the streams are equal, or equal up to a near-tie of the reference where `got`
    took the runner-up; otherwise what differs."""
    if got.ids == reference.ids:
        return None
    at = next((i for i, (a, b) in enumerate(zip(reference.ids, got.ids)) if a != b), None)
    if at is None:
        return f"one stream is a prefix of the other: {reference.text!r} vs {got.text!r}"
    top = reference.top2[at]
    if len(top) != 2:
        return f"no top-2 candidates at position {at}: stream with top_n_tokens 2"
    (best, best_logprob), (second, second_logprob) = top
    where = f"position {at}: {reference.text!r} vs {got.text!r}"
    if {got.ids[at], reference.ids[at]} != {best, second}:  # an exact tie may be listed in either order
        return f"not the runner-up at {where}"
    if best_logprob - second_logprob > tolerance:
        return f"gap {best_logprob - second_logprob:.2e} at {where}"
    return None


def parts_at_near_tie(reference: GreedyStream, got: GreedyStream, tolerance: float = NEAR_TIE) -> bool:
    return got.ids != reference.ids and greedy_difference(reference, got, tolerance) is None


def assert_same_greedy(reference: GreedyStream, got: GreedyStream, tolerance: float = NEAR_TIE) -> None:
    difference = greedy_difference(reference, got, tolerance)
    assert difference is None, difference
