"""Greedy token ids of the same prompts (as token ids) from ztgi in-process and from llama-server over HTTP,
with the two best candidates and their logprobs at every position.

ztgi runs `ztgi.LLM` (the server's engine and batching, every prompt queued at once, `logprobs=2`)
in a fresh spawned process per model, so one model's memory and threads never reach the next.
llama-server runs one slot and one request at a time through `/completion`: the prompt as token
ids, `temperature 0` with the temperature sampler alone (the argmax of the logits),
`cache_prompt false`, the generated ids from `return_tokens`, the top two of the logits' softmax
from `n_probs 2` (before sampling).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import multiprocessing
import urllib.request
from collections.abc import Sequence
from typing import Any

from ztgi.bench.llama_server import LlamaServer, server_flags

REQUEST_TIMEOUT_S = 600.0
WEIGHT_LOGGERS = ("ztgi.services.worker.paged.model", "ztgi.services.worker.padded.model",
                  "ztgi.services.worker.models.gguf_module", "ztgi.services.worker.layers.quantization.stored_linear")
Candidates = list[tuple[int, float]]  # the two best (token id, logprob) at one position, best first


@dataclasses.dataclass(frozen=True)
class GreedyRequests:
    """The prompts as token ids, each request's token budget, and whether EOS ends a request."""

    input_ids: list[list[int]]
    max_new_tokens: list[int]
    ignore_eos: bool = True

    @property
    def max_total_tokens(self) -> int:
        return max(len(ids) + n for ids, n in zip(self.input_ids, self.max_new_tokens))


@dataclasses.dataclass(frozen=True)
class GreedyRun:
    """Each request's generated ids and, at each of its positions, the two best candidates; `notes`:
    what the server said of the weights it runs (ztgi's log lines: blocks as stored, or dequantized)."""

    ids: list[list[int]]
    top2: list[list[Candidates]]
    notes: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"ids": self.ids, "top2": self.top2, "notes": self.notes}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GreedyRun:
        top2 = [[[(int(i), float(p)) for i, p in step] for step in steps] for steps in data["top2"]]
        return cls(data["ids"], top2, data.get("notes", []))


def ztgi_greedy(model: str, dtype: str, quantize: str, requests: GreedyRequests) -> GreedyRun:
    """Each request's greedy run from `ztgi.LLM(model, dtype, quantize=...)` on the CPU, in a spawned process."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(_ztgi_greedy_here, model, dtype, quantize, requests).result()


def _ztgi_greedy_here(model: str, dtype: str, quantize: str, requests: GreedyRequests) -> GreedyRun:
    from ztgi import LLM, SamplingParams

    notes = _NoteTaker()
    llm = LLM(model, dtype=dtype, device="cpu", quantize=quantize, prefix_caching=False)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=requests.ignore_eos, logprobs=2)
              for n in requests.max_new_tokens]
    prompts = [{"prompt_token_ids": ids} for ids in requests.input_ids]
    sequences = [output.outputs[0] for output in llm.generate(prompts, params, use_tqdm=False)]
    return GreedyRun([list(sequence.token_ids) for sequence in sequences],
                     [[_ranked(step) for step in sequence.logprobs or []] for sequence in sequences], notes.lines)


class _NoteTaker(logging.Handler):
    """Keeps the INFO lines of the loggers that say which weights the worker runs."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        for name in WEIGHT_LOGGERS:
            logging.getLogger(name).setLevel(logging.INFO)
            logging.getLogger(name).addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _ranked(step: dict[int, Any]) -> Candidates:
    """A step's top candidates (`Logprob`s with a rank), best first."""
    ranked = sorted((logprob.rank, token_id, logprob.logprob) for token_id, logprob in step.items()
                    if logprob.rank is not None)
    return [(token_id, value) for _, token_id, value in ranked[:2]]


def llama_server_greedy(binary: str, gguf: str, requests: GreedyRequests, num_threads: int) -> GreedyRun:
    """Each request's greedy run from `llama-server -m GGUF` (one slot), one request after another."""
    flags = server_flags(gguf, 1, num_threads, requests.max_total_tokens, cache_prompt=False)
    with LlamaServer(binary, flags) as server:
        answers = [completion(server.url, ids, n, requests.ignore_eos)
                   for ids, n in zip(requests.input_ids, requests.max_new_tokens)]
    return GreedyRun([ids for ids, _ in answers], [top2 for _, top2 in answers])


def completion(url: str, input_ids: Sequence[int], max_new_tokens: int,
               ignore_eos: bool) -> tuple[list[int], list[Candidates]]:
    """One greedy `/completion` of `input_ids`: the generated ids and each position's two best candidates."""
    body = {"prompt": list(input_ids), "n_predict": max_new_tokens, "temperature": 0.0, "samplers": ["temperature"],
            "cache_prompt": False, "ignore_eos": ignore_eos, "return_tokens": True, "n_probs": 2, "stream": False}
    request = urllib.request.Request(f"{url}/completion", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
        answer = json.load(response)
    top2 = [[(int(top["id"]), float(top["logprob"])) for top in step["top_logprobs"][:2]]
            for step in answer["completion_probabilities"]]
    return [int(token_id) for token_id in answer["tokens"]], top2
