"""Writes the prefix-caching workloads next to the mixed set, in the bench tool's `benchmarks/data/`
(`python -m studies.prefix_datasets`).

- `shared_prefix.jsonl`: 32 requests sharing one ~1,500-token document, each with its own question
  (RAG, a long system prompt): with prefix caching only the first computes the document.
- `multi_turn.jsonl`: 16 conversations of 6 turns, turn-major (every conversation's turn k before
  any turn k+1): each prompt is the transcript so far, so a turn's prompt starts with the one before.
  The assistant replies in the transcripts are fixed text, not what the model answered.

`two_documents` builds the placement benchmark's workload (studies/placement.py) in memory:
questions on two documents, interleaved.
"""

from __future__ import annotations

import json
import os
import random

from ztgi.bench.workload import MIXED_DATASET_PATH, WORDS

DATA_DIR = os.path.dirname(MIXED_DATASET_PATH)  # the built-in sets ship with the bench tool
DOCUMENT_WORDS = 1450


def sentences(rng: random.Random, num_words: int) -> str:
    """`num_words` random one-token words as sentences of 12 (a document with no meaning to copy)."""
    words = rng.choices(WORDS, k=num_words)
    return " ".join(" ".join(words[i:i + 12]).capitalize() + "." for i in range(0, num_words, 12))


def _question(rng: random.Random, number: int, document: str) -> str:
    return (f"Document:\n{document}\n\nQuestion {number}: in one sentence, what does the document say "
            f"about the {rng.choice(WORDS)} and the {rng.choice(WORDS)}?\nAnswer:")


def shared_prefix(rng: random.Random) -> list[dict]:
    document = sentences(rng, DOCUMENT_WORDS)
    return [{"prompt": _question(rng, i + 1, document), "max_new_tokens": 32} for i in range(32)]


def two_documents(rng: random.Random, num_requests: int, pattern: str, document_words: int) -> list[tuple[int, str]]:
    """Questions on two documents, each request its own: (document 0 or 1, prompt). `pattern`
    interleaves them: `alternate` (A B A B ...) or `random` (each request's document drawn)."""
    documents = [sentences(rng, document_words) for _ in range(2)]
    picks = [i % 2 if pattern == "alternate" else rng.randrange(2) for i in range(num_requests)]
    return [(d, _question(rng, i + 1, documents[d])) for i, d in enumerate(picks)]


def multi_turn(rng: random.Random, num_conversations: int = 16, num_turns: int = 6) -> list[dict]:
    transcripts = [f"System: you are assistant number {c}. {sentences(rng, 150)}\n" for c in range(num_conversations)]
    lines = []
    for _ in range(num_turns):
        for c in range(num_conversations):
            transcripts[c] += f"User: {sentences(rng, 30)}\nAssistant:"
            lines.append({"prompt": transcripts[c], "max_new_tokens": 32})
            transcripts[c] += f" {sentences(rng, 36)}\n"
    return lines


def main() -> None:
    for name, lines in (("shared_prefix", shared_prefix(random.Random(18))),
                        ("multi_turn", multi_turn(random.Random(18)))):
        with open(os.path.join(DATA_DIR, f"{name}.jsonl"), "w", encoding="utf-8") as file:
            file.writelines(json.dumps(line) + "\n" for line in lines)


if __name__ == "__main__":
    main()
