"""The tokenizer process never computes with torch: tokenizers, Jinja chat templates and PIL image
processors are all it runs. transformers imports torch anyway wherever torch is installed (its
configuration module reads rope defaults with it), which is most of a tokenizer's start. Marking
torch absent before transformers loads makes transformers take its torch-free path, which it
supports for exactly this use: tokenizers, configurations and processors without models."""

from __future__ import annotations

import logging
import sys

ABSENT_MESSAGE = "PyTorch was not found"


def keep_torch_out() -> None:
    """Makes `import torch` fail in this process, unless it is already loaded (an in-process engine
    shares the process with the worker's model). Call before transformers is imported."""
    if "torch" in sys.modules or "transformers" in sys.modules:
        return
    sys.modules["torch"] = None  # type: ignore[assignment]  # None: the import system refuses the name
    # transformers says at import that models will not be available: true, and meant here
    logging.getLogger("transformers").addFilter(lambda record: ABSENT_MESSAGE not in record.getMessage())
