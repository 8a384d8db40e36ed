"""Loading a model's tokenizer (never its weights)."""

from __future__ import annotations

import logging

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from ztgi.common.model_source import resolve_model

logger = logging.getLogger(__name__)


def load_tokenizer(model_id: str) -> PreTrainedTokenizerBase:
    """The fast tokenizer of `model_id` (resolved like the worker's model); raises
    ModelNotFoundError when the id names nothing loadable here."""
    source = resolve_model(model_id)
    tokenizer = AutoTokenizer.from_pretrained(source.path)
    if not tokenizer.is_fast:
        logger.warning("%s has no fast tokenizer: encoding and decoding will be slow", source.name)
    logger.info("tokenizer of %s loaded (vocabulary %d)", source.name, len(tokenizer))
    return tokenizer
