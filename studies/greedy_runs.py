"""Greedy token ids of the same prompts (as token ids) from ztgi in-process and from llama-server over HTTP.

ztgi runs `ztgi.LLM` (the server's engine and batching, every prompt queued at once) in a fresh
spawned process per model, so one model's memory and threads never reach the next.
llama-server runs one slot and one request at a time through `/completion`: the prompt as token
ids, `temperature 0` with the temperature sampler alone (the argmax of the logits),
`cache_prompt false`, the generated ids from `return_tokens`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import multiprocessing
import urllib.request
from collections.abc import Sequence

from ztgi.bench.llama_server import LlamaServer, server_flags

REQUEST_TIMEOUT_S = 600.0


@dataclasses.dataclass(frozen=True)
class GreedyRequests:
    """The prompts as token ids, each request's token budget, and whether EOS ends a request."""

    input_ids: list[list[int]]
    max_new_tokens: list[int]
    ignore_eos: bool = True

    @property
    def max_total_tokens(self) -> int:
        return max(len(ids) + n for ids, n in zip(self.input_ids, self.max_new_tokens))


def ztgi_greedy(model: str, dtype: str, quantize: str, requests: GreedyRequests) -> list[list[int]]:
    """Each request's greedy ids from `ztgi.LLM(model, dtype, quantize=...)` on the CPU, run in a
    spawned process."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(_ztgi_greedy_here, model, dtype, quantize, requests).result()


def _ztgi_greedy_here(model: str, dtype: str, quantize: str, requests: GreedyRequests) -> list[list[int]]:
    from ztgi import LLM, SamplingParams

    llm = LLM(model, dtype=dtype, device="cpu", quantize=quantize, prefix_caching=False)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=requests.ignore_eos)
              for n in requests.max_new_tokens]
    prompts = [{"prompt_token_ids": ids} for ids in requests.input_ids]
    return [list(output.outputs[0].token_ids) for output in llm.generate(prompts, params, use_tqdm=False)]


def llama_server_greedy(binary: str, gguf: str, requests: GreedyRequests, num_threads: int) -> list[list[int]]:
    """Each request's greedy ids from `llama-server -m GGUF` (one slot), one request after another."""
    flags = server_flags(gguf, 1, num_threads, requests.max_total_tokens, cache_prompt=False)
    with LlamaServer(binary, flags) as server:
        return [completion_ids(server.url, ids, n, requests.ignore_eos)
                for ids, n in zip(requests.input_ids, requests.max_new_tokens)]


def completion_ids(url: str, input_ids: Sequence[int], max_new_tokens: int, ignore_eos: bool) -> list[int]:
    """One greedy `/completion` of `input_ids`: the generated token ids."""
    body = {"prompt": list(input_ids), "n_predict": max_new_tokens, "temperature": 0.0, "samplers": ["temperature"],
            "cache_prompt": False, "ignore_eos": ignore_eos, "return_tokens": True, "stream": False}
    request = urllib.request.Request(f"{url}/completion", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
        return [int(token_id) for token_id in json.load(response)["tokens"]]
