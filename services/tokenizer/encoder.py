"""Text (and a vision model's images) to ids: chat template, image placeholders, truncation, TGI's
length limits, grammar check and parameter resolution."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from ztgi.common.grammar import GrammarChecker
from ztgi.common.markdown_images import split_at_images
from ztgi.common.messages import (
    ChatMessage,
    Encoded,
    EncodedImage,
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
from ztgi.services.tokenizer.image_spans import locate_images, truncate_images
from ztgi.services.tokenizer.vision_processor import ProcessedImage, VisionProcessor


class Encoder:
    """Turns a client's `Generate` into the `Encoded` request a worker can run.

    Raises `ValidationError` (TGI's message) for anything the request cannot be served with. A
    vision-language model's encoder has its `vision` processor (`loading.load_vision_processor`); a
    text model's refuses images, naming `model_name`.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, limits: ParameterLimits, tokenizer_id: bytes,
                 vision: VisionProcessor | None = None, model_name: str = "") -> None:
        self.tokenizer = tokenizer
        self.limits = limits
        self.tokenizer_id = tokenizer_id
        self.vision = vision
        self.model_name = model_name or tokenizer.name_or_path
        self.grammars = GrammarChecker(tokenizer)
        self.template = ChatTemplate(tokenizer)

    def encode(self, key: RequestKey, generate: Generate) -> Encoded:
        """The one entry point for a client's request (the service's and offline `LLM`'s)."""
        validate_parameters(generate.parameters, self.limits)
        input_ids, images = self.prompt(generate)
        return self._encoded(key, input_ids, generate.parameters, images)

    def encode_ids(self, key: RequestKey, input_ids: list[int], params: GenerateParameters,
                   images: list[EncodedImage] | None = None) -> Encoded:
        """The same from prompt ids the caller already has (offline inference's token-id prompts, and
        the `n` sequences of one offline prompt); `images` as `prompt` placed them in these ids."""
        validate_parameters(params, self.limits)
        if not input_ids:
            raise ValidationError("inputs", "`inputs` cannot be empty")
        if self.vision is not None and not images:
            locate_images(input_ids, [], self.vision.image_token_id)  # no image tokens without images
        return self._encoded(key, list(input_ids), params, list(images or ()))

    def _encoded(self, key: RequestKey, input_ids: list[int], params: GenerateParameters,
                 images: list[EncodedImage]) -> Encoded:
        if params.grammar is not None:
            self.grammars.check(params.grammar)  # a grammar the worker could not compile never gets queued
        self._check_logit_bias(params)
        if params.truncate is not None:  # TGI truncates from the left
            num_cut = max(len(input_ids) - params.truncate, 0)
            input_ids = input_ids[num_cut:]
            images = truncate_images(images, num_cut, params.truncate)
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
            images=images,
        )

    def prompt(self, generate: Generate) -> tuple[list[int], list[EncodedImage]]:
        """The prompt's ids before truncation, and its images in order with their spans in them."""
        files = _image_files(generate)
        if self.vision is None:
            if files:
                raise ValidationError("images", f"this model does not take images: {self.model_name}")
            return self.input_ids(generate), []
        processed = self.vision.process(files)
        input_ids = self._vision_ids(generate, processed)
        return input_ids, locate_images(input_ids, processed, self.vision.image_token_id)

    def _vision_ids(self, generate: Generate, images: list[ProcessedImage]) -> list[int]:
        """A vision model's prompt: each image's placeholder (written by the template, or put where
        a markdown image was) expanded to its tokens before the whole text is tokenized."""
        assert self.vision is not None
        if generate.input_ids is not None:
            return self.checked_ids(generate.input_ids)
        if generate.messages is not None:
            text = self.render_chat(generate.messages, generate.tools)
            return self._tokenize(self.vision.expand(text, images), add_special_tokens=False)
        if not generate.inputs:
            raise ValidationError("inputs", "`inputs` cannot be empty")
        text = self._with_image_strings(generate.inputs, len(images))
        return self._tokenize(self.vision.expand(text, images), generate.parameters.add_special_tokens)

    def _with_image_strings(self, inputs: str, num_images: int) -> str:
        """TGI's `inputs` with each markdown image replaced by the family's image string; `inputs`
        without markdown images already hold the model's own placeholders (vLLM's prompts with
        `multi_modal_data`, offline), one per image, as `expand` checks."""
        assert self.vision is not None
        pieces = split_at_images(inputs)
        if len(pieces) == 1:
            return inputs
        if len(pieces) - 1 != num_images:
            raise ValidationError("images", f"`inputs` has {len(pieces) - 1} markdown images but the request "
                                            f"carries {num_images} image files")
        return self.vision.image_string.join(pieces)

    def input_ids(self, generate: Generate) -> list[int]:
        """The prompt's ids before truncation: raw `inputs`, `messages` through the template, or
        the client's own `input_ids`, each checked to be in the vocabulary (a vision model's images
        expanded to their placeholder tokens)."""
        if self.vision is not None:
            return self.prompt(generate)[0]
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


def _image_files(generate: Generate) -> list[bytes]:
    """The request's image files in prompt order: its chat turns' image parts, or its markdown images'."""
    if generate.messages is not None:
        return [part.image for message in generate.messages for part in message.parts or () if part.type == "image"]
    return list(generate.images or ())


def _check_embedding_length(num_input_tokens: int, limits: ParameterLimits) -> None:
    """An embedding input longer than the server takes, named in the embeddings API's words."""
    most = min(limits.max_input_tokens, limits.max_total_tokens - 1)
    if num_input_tokens > most:
        raise ValidationError("input", f"an input of {num_input_tokens} tokens is longer than the {most} tokens "
                                       f"this server embeds (--max-input-tokens); send `truncate_prompt_tokens` "
                                       f"to keep its last tokens")
