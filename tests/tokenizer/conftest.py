"""Fixtures for the tokenizer's tests: SmolLM2's real tokenizer, loaded once."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerBase

from ztgi.common.model_source import ModelSource
from ztgi.services.tokenizer.loading import load_tokenizer


@pytest.fixture(scope="session")
def tokenizer(smollm2: ModelSource) -> PreTrainedTokenizerBase:
    """SmolLM2's fast tokenizer (49152 ids, ChatML template)."""
    return load_tokenizer(smollm2.path)
