"""Writes the prefill-heavy set, `benchmarks/data/prefill_heavy.jsonl` (`python -m studies.prefill_heavy_dataset`).

The traffic issue 23 describes: prompts of 20 to 740 tokens and short answers that stop at EOS, so
that prompt tokens outweigh output tokens about five to one (the mixed set is the other way round:
short chat questions, long answers). Each of the 64 requests is a document of its own followed by
one instruction that asks for a short answer (a title, a sentence, a few words). The document
comes first, so no two prompts share more than the chat turn's three opening tokens: within a
pass a prefix cache saves nothing. The prompt lengths are spread evenly over 20-740 tokens
(SmolLM2's tokenizer), in a shuffled order.
"""

from __future__ import annotations

import json
import os
import random

from studies.prefix_datasets import DATA_DIR, sentences

NUM_REQUESTS = 64
MIN_PROMPT_TOKENS = 20
MAX_PROMPT_TOKENS = 740
# (instruction, max_new_tokens): short answers; the caps also bound SmolLM2's rambling on the
# meaningless documents, which brings the output to about a sixth of the prompt tokens.
INSTRUCTIONS = (
    ("Give the text above a title of at most eight words.", 64),
    ("In one sentence, what is the text above about?", 192),
    ("Name three words that appear in the text above.", 128),
    ("Summarize the text above in two sentences.", 256),
    ("Is the text above about a city, a person or nature? Answer in one word.", 64),
    ("Write one question a reader might ask about the text above.", 128),
    ("Which season does the text above make you think of, and why? Answer in one sentence.", 192),
    ("What is the first word of the text above?", 64),
)
# A `sentences` document of N words is about N * 13 / 12 tokens (one per word, one per full stop).
TOKENS_PER_WORD = 13 / 12
INSTRUCTION_TOKENS = 24
# A user's turn in SmolLM2's chat format, without the default system prompt that every request
# would otherwise share.
CHAT_TURN = "<|im_start|>user\n{message}<|im_end|>\n<|im_start|>assistant\n"


def prompt_lengths(rng: random.Random, num_requests: int = NUM_REQUESTS) -> list[int]:
    """Target prompt lengths in tokens, evenly spread over [MIN, MAX] and shuffled."""
    step = (MAX_PROMPT_TOKENS - MIN_PROMPT_TOKENS) / (num_requests - 1)
    lengths = [round(MIN_PROMPT_TOKENS + i * step) for i in range(num_requests)]
    rng.shuffle(lengths)
    return lengths


def prefill_heavy(rng: random.Random, num_requests: int = NUM_REQUESTS) -> list[dict]:
    lines = []
    for number, length in enumerate(prompt_lengths(rng, num_requests)):
        instruction, max_new_tokens = INSTRUCTIONS[number % len(INSTRUCTIONS)]
        num_words = max(1, round((length - INSTRUCTION_TOKENS) / TOKENS_PER_WORD))
        prompt = CHAT_TURN.format(message=f"{sentences(rng, num_words)}\n\n{instruction}")
        lines.append({"prompt": prompt, "max_new_tokens": max_new_tokens})
    return lines


def main() -> None:
    with open(os.path.join(DATA_DIR, "prefill_heavy.jsonl"), "w", encoding="utf-8") as file:
        file.writelines(json.dumps(line) + "\n" for line in prefill_heavy(random.Random(23)))


if __name__ == "__main__":
    main()
