"""ztgi's public Python surface.

    from ztgi import LLM, SamplingParams          # offline batch inference in this process
    from ztgi import Client, AsyncClient          # a running server's scheduler, over ZMQ

`LLM` runs the worker's engine under the scheduler's batching loop in the calling process (no
sockets, no child processes); the clients talk to a server started with `ztgi launch`. Names are
imported on first use, so `ztgi`'s command line does not load torch for services that never touch
the model.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Any

try:
    __version__ = importlib.metadata.version("ztgi")
except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0.0.0+unknown"

_EXPORTS = {
    "LLM": ("ztgi.llm", "LLM"),
    "SamplingParams": ("ztgi.sampling_params", "SamplingParams"),
    "LoRARequest": ("ztgi.lora_request", "LoRARequest"),
    "RequestOutput": ("ztgi.outputs", "RequestOutput"),
    "CompletionOutput": ("ztgi.outputs", "CompletionOutput"),
    "Logprob": ("ztgi.outputs", "Logprob"),
    "EmbeddingRequestOutput": ("ztgi.outputs", "EmbeddingRequestOutput"),
    "Client": ("ztgi.common.client.sync_client", "ZtgiClient"),
    "AsyncClient": ("ztgi.common.client.async_client", "AsyncZtgiClient"),
    "ZtgiError": ("ztgi.common.client.errors", "ZtgiError"),
    "GenerateParameters": ("ztgi.common.messages", "GenerateParameters"),
}

__all__ = [
    "LLM",
    "AsyncClient",
    "Client",
    "CompletionOutput",
    "EmbeddingRequestOutput",
    "GenerateParameters",
    "Logprob",
    "RequestOutput",
    "SamplingParams",
    "ZtgiError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ztgi' has no attribute {name!r}")
    module_name, attribute = _EXPORTS[name]
    value = getattr(importlib.import_module(module_name), attribute)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
