"""Text to ids: chat template, truncation, TGI's length limits, grammar check and parameter resolution."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from ztgi.common.grammar import GrammarChecker
from ztgi.common.messages import (
    ChatMessage,
    Encoded,
    Generate,
    GenerateParameters,
    RequestKey,
    SimpleToken,
    TokenizeQuery,
    Tool,
)
from ztgi.common.parameters import (
    ParameterLimits,
    ValidationError,
    resolve_sampling,
    validate_lengths,
    validate_parameters,
)
from ztgi.services.tokenizer.chat_template import ChatTemplate


class Encoder:
    """Turns a client's `Generate` into the `Encoded` request a worker can run.

    Raises `ValidationError` (TGI's message) for anything the request cannot be served with.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, limits: ParameterLimits, tokenizer_id: bytes) -> None:
        self.tokenizer = tokenizer
        self.limits = limits
        self.tokenizer_id = tokenizer_id
        self.grammars = GrammarChecker(tokenizer)
        self.template = ChatTemplate(tokenizer)

    def encode(self, key: RequestKey, generate: Generate) -> Encoded:
        validate_parameters(generate.parameters, self.limits)
        return self._encoded(key, self.input_ids(generate), generate.parameters)

    def encode_ids(self, key: RequestKey, input_ids: list[int], params: GenerateParameters) -> Encoded:
        """The same from prompt ids the caller already has (offline inference's token-id prompts)."""
        validate_parameters(params, self.limits)
        if not input_ids:
            raise ValidationError("inputs", "`inputs` cannot be empty")
        return self._encoded(key, list(input_ids), params)

    def _encoded(self, key: RequestKey, input_ids: list[int], params: GenerateParameters) -> Encoded:
        if params.grammar is not None:
            self.grammars.check(params.grammar)  # a grammar the worker could not compile never gets queued
        self._check_logit_bias(params)
        if params.truncate is not None:
            input_ids = input_ids[-params.truncate:]  # TGI truncates from the left
        if params.embed:
            _check_embedding_length(len(input_ids), self.limits)
        max_new_tokens = 1 if params.embed else params.max_new_tokens  # an embedding is one prefill
        if max_new_tokens is None:
            max_new_tokens = max(self.limits.max_total_tokens - len(input_ids), 0)
        validate_lengths(len(input_ids), max_new_tokens, self.limits)
        return Encoded(
            key=key,
            input_ids=input_ids,
            sampling=resolve_sampling(params),
            max_new_tokens=max_new_tokens,
            ignore_eos=params.ignore_eos,
            top_n_tokens=params.top_n_tokens or 0,
            prefill_logprobs=params.decoder_input_details,
            tokenizer_id=self.tokenizer_id,
            embed=params.embed,
        )

    def input_ids(self, generate: Generate) -> list[int]:
        """The prompt's ids before truncation: raw `inputs`, `messages` through the template, or
        the client's own `input_ids`, each checked to be in the vocabulary."""
        if generate.input_ids is not None:
            return self.checked_ids(generate.input_ids)
        if generate.messages is not None:
            # the template writes the special tokens itself
            return self._tokenize(self.render_chat(generate.messages, generate.tools), add_special_tokens=False)
        if not generate.inputs:
            raise ValidationError("inputs", "`inputs` cannot be empty")
        return self._tokenize(generate.inputs, generate.parameters.add_special_tokens)

    def _check_logit_bias(self, params: GenerateParameters) -> None:
        vocab_size = len(self.tokenizer)
        for entry in params.logit_bias or ():
            if not 0 <= entry.token_id < vocab_size:
                raise ValidationError("logit_bias", f"`logit_bias` token id {entry.token_id} is outside the "
                                                    f"vocabulary [0, {vocab_size})")

    def checked_ids(self, input_ids: list[int]) -> list[int]:
        """Token ids a client sent: a non-empty list of ids the tokenizer knows."""
        if not input_ids:
            raise ValidationError("prompt", "a token-id prompt cannot be empty")
        vocab_size = len(self.tokenizer)
        for token_id in input_ids:
            if not 0 <= token_id < vocab_size:
                raise ValidationError("prompt", f"token id {token_id} of `prompt` is outside the vocabulary "
                                                f"[0, {vocab_size})")
        return list(input_ids)

    def tokenize(self, query: TokenizeQuery) -> list[SimpleToken]:
        """TGI's /tokenize: each token with its text and character offsets in `inputs`.

        Special tokens added by the tokenizer have empty offsets (and so empty text); `truncate`
        keeps the last tokens, as for generation. A query with `messages` tokenizes the chat
        template's prompt (whose special tokens the template writes).
        """
        if query.messages is not None:
            text = self.render_chat(query.messages)
            return self._offsets(text, add_special_tokens=False, truncate=query.truncate)
        if not query.inputs:
            raise ValidationError("inputs", "`inputs` cannot be empty")
        if query.truncate is not None and not 0 < query.truncate <= self.limits.max_input_tokens:
            raise ValidationError("truncate", f"`truncate` must be strictly positive and less than or equal to "
                                              f"{self.limits.max_input_tokens}. Given: {query.truncate}")
        return self._offsets(query.inputs, query.add_special_tokens, query.truncate)

    def detokenize(self, input_ids: list[int]) -> str:
        """vLLM's /detokenize: the text of token ids (special tokens kept, as vLLM decodes)."""
        text = self.tokenizer.decode(self.checked_ids(input_ids), skip_special_tokens=False)
        assert isinstance(text, str), "one sequence decodes to one string"
        return text

    def _offsets(self, text: str, add_special_tokens: bool, truncate: int | None) -> list[SimpleToken]:
        if not self.tokenizer.is_fast:
            raise ValidationError("inputs", "No fast tokenizer available: offsets are unknown")
        encoding = self.tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
        tokens = [SimpleToken(token_id, text[start:stop], start, stop)
                  for token_id, (start, stop) in zip(encoding["input_ids"], encoding["offset_mapping"])]
        return tokens[-truncate:] if truncate is not None else tokens

    def render_chat(self, messages: list[ChatMessage], tools: list[Tool] | None = None) -> str:
        """The prompt text of a conversation (and the tools it may call), ending with the
        assistant's generation prompt."""
        if not messages:
            raise ValidationError("messages", "`messages` cannot be empty")
        return self.template.render(messages, tools)

    def _tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        try:
            return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        except Exception as exc:
            raise ValidationError("inputs", f"tokenizer error {exc}") from None


def _check_embedding_length(num_input_tokens: int, limits: ParameterLimits) -> None:
    """An embedding input longer than the server takes, named in the embeddings API's words."""
    most = min(limits.max_input_tokens, limits.max_total_tokens - 1)
    if num_input_tokens > most:
        raise ValidationError("input", f"an input of {num_input_tokens} tokens is longer than the {most} tokens "
                                       f"this server embeds (--max-input-tokens); send `truncate_prompt_tokens` "
                                       f"to keep its last tokens")
