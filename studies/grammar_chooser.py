"""What the grammar costs the worker's chooser per step: a batch with no grammar (run it on a tree
without grammar support too: the two must be the same), and one with half its rows constrained.

Scores are random logits of the SmolLM2 vocabulary; each constrained row follows its own JSON
schema, so its masks are real ones. One torch thread.

    python -m studies.grammar_chooser [--rows 16] [--steps 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from ztgi.common.messages import SamplingParameters
from ztgi.services.worker.sampling.next_token_chooser import NextTokenChooser

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {
    "type": "string"}}}, "required": ["name", "tags"]}


def time_steps(chooser: NextTokenChooser, rows: int, steps: int, vocab_size: int) -> list[float]:
    generator = torch.Generator().manual_seed(0)
    times = []
    for _ in range(steps):
        scores = torch.randn((rows, vocab_size), generator=generator)
        started = time.perf_counter()
        chooser(scores)
        times.append(time.perf_counter() - started)
    return times


def summary(times: list[float]) -> dict[str, float]:
    micros = sorted(t * 1e6 for t in times)
    return {"median_us": round(statistics.median(micros), 1), "p90_us": round(micros[int(len(micros) * 0.9)], 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--model-id", default="smollm2")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    vocab_size = 49152
    free = NextTokenChooser([SamplingParameters()] * args.rows, torch.device("cpu"))
    print(json.dumps({"batch": f"{args.rows} rows, no grammar", **summary(time_steps(free, args.rows, args.steps,
                                                                                      vocab_size))}))
    if "grammar" not in SamplingParameters.__dataclass_fields__:
        return
    from ztgi.common.grammar import json_grammar
    from ztgi.services.worker.sampling import grammar

    _ = grammar.configure(args.model_id).tokenizer  # the vocabulary loads once per worker, before serving
    params = [SamplingParameters(grammar=json_grammar(SCHEMA)) if i % 2 else SamplingParameters()
              for i in range(args.rows)]
    half = NextTokenChooser(params, torch.device("cpu"))
    print(json.dumps({"batch": f"{args.rows} rows, half with a JSON schema (ignoring EOS as it comes)",
                      **summary(time_steps(half, args.rows, args.steps, vocab_size))}))


if __name__ == "__main__":
    main()
