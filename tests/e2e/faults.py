"""Helpers for the fault and soak tests: a small-vocabulary model, streams, pids, RSS."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import threading
import time

import requests
import torch

from tests.conftest import TOKENIZER_FILES
from tests.e2e.server import LaunchedServer

SERVICES = ("scheduler", "worker", "tokenizer", "gateway")
# every limit fits the small model's 2048 positions; liveness is fast so faults show within seconds;
# float32, where a stream's tokens do not depend on what shares its batch (bfloat16's rounding does)
FAST_FLAGS = ("--max-input-tokens", "512", "--max-total-tokens", "2048", "--max-batch-prefill-tokens", "2048",
              "--heartbeat-interval-ms", "200", "--heartbeat-misses", "5", "--dtype", "float32")


def build_small_vocab_model(directory: str, tokenizer_dir: str, vocab_size: int = 8192) -> str:
    """A 2-layer random Llama over the first `vocab_size` ids of SmolLM2's real tokenizer.

    Prompts made of common words encode below `vocab_size` and are served; a rarer word
    ("Hello" is 19556) makes the worker reject its prefill: a real per-batch failure.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        bos_token_id=1, eos_token_id=2, pad_token_id=2, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory)
    for name in TOKENIZER_FILES:
        if os.path.exists(os.path.join(tokenizer_dir, name)):
            shutil.copy(os.path.join(tokenizer_dir, name), directory)
    return directory


def child_pids(server: LaunchedServer, service: str) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(server.process.pid), "-f", f"services.{service}"],
                         capture_output=True, text=True).stdout
    return sorted(int(pid) for pid in out.split())


def all_child_pids(server: LaunchedServer) -> dict[str, list[int]]:
    return {service: child_pids(server, service) for service in SERVICES}


def rss_kb(pid: int) -> int:
    """VmRSS of a process in kB, from /proc (psutil is not a dependency)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise ValueError(f"no VmRSS for pid {pid}")


@dataclasses.dataclass
class StreamOutcome:
    """What one /generate_stream call saw: token texts, the final event, and when it ended."""

    texts: list[str] = dataclasses.field(default_factory=list)
    final: dict | None = None
    ended_at: float = 0.0
    status: int = 0

    @property
    def error(self) -> str | None:
        return None if self.final is None else self.final.get("error")


def stream(server: LaunchedServer, prompt: str, max_new_tokens: int, progress: list | None = None,
           close_after: int | None = None, close_event: threading.Event | None = None,
           **parameters: object) -> StreamOutcome:
    """Streams one request; with `close_after`, drops the connection after that many tokens
    (once `close_event` is set, if given)."""
    body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new_tokens, "ignore_eos": True, **parameters}}
    outcome = StreamOutcome()
    with requests.post(server.url + "/generate_stream", json=body, stream=True, timeout=120) as response:
        outcome.status = response.status_code
        if response.status_code != 200:  # failed before its first event: a TGI error body
            outcome.final = response.json()
        for line in response.iter_lines(decode_unicode=True) if response.status_code == 200 else ():
            if not line or not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if event.get("token"):
                outcome.texts.append(event["token"]["text"])
                if progress is not None:
                    progress.append(1)
            if "error" in event or event.get("generated_text") is not None:
                outcome.final = event
                break
            if close_after is not None and len(outcome.texts) >= close_after:
                if close_event is not None:
                    close_event.wait(60)
                break
    outcome.ended_at = time.monotonic()
    return outcome


def wait_for(condition, timeout_s: float, interval_s: float = 0.1) -> float:
    """Polls `condition` until true; returns the seconds it took, or raises TimeoutError."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"not true within {timeout_s:g} s")
        time.sleep(interval_s)
    return time.monotonic() - started


def health(server: LaunchedServer) -> tuple[int, str]:
    try:
        response = requests.get(server.url + "/health", timeout=10)
    except requests.RequestException as exc:
        return 0, str(exc)
    return response.status_code, response.text
