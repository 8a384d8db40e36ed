"""Ids to text: one step's tokens for the requests this tokenizer owns become stream events."""

from __future__ import annotations

import collections
import logging
import math

from transformers import PreTrainedTokenizerBase

from ztgi.common.codec import encode
from ztgi.common.messages import (
    Adopt,
    ClientOutput,
    DetokenizeJob,
    Encoded,
    FinalDetails,
    FinishReason,
    GenerateParameters,
    Generation,
    RequestKey,
    StreamEvent,
    StreamEvents,
    TextBatch,
    Token,
    TokenStep,
    TopTokens,
)
from ztgi.services.tokenizer.decode_state import DecodeState

logger = logging.getLogger(__name__)


class Detokenizer:
    """Keeps each owned request's `DecodeState` and turns a `DetokenizeJob` into a `TextBatch`.

    Every token becomes a `StreamEvent` (TGI: special tokens stream with their text and
    `special=True`; `generated_text` skips them). A stop sequence found in the streamed text
    ends the request there: the text stops right after the sequence, the finish reason is
    `stop_sequence`, and the key goes to `TextBatch.finished`. A request whose last event was
    sent is forgotten, so tokens still in flight for it are skipped.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        # every token is decoded twice (DecodeState.next_text): a fast tokenizer's Rust backend
        # gives the same text as `decode(..., clean_up_tokenization_spaces=False)` without
        # transformers' per-call argument handling
        self.backend = tokenizer.backend_tokenizer if tokenizer.is_fast else None
        self.special_ids = frozenset(tokenizer.all_special_ids)
        self.key_to_state: dict[RequestKey, DecodeState] = {}

    @property
    def num_requests(self) -> int:
        return len(self.key_to_state)

    def start(self, encoded: Encoded, params: GenerateParameters, scheduler_nonce: str = "") -> None:
        """Owns the decode state of a request this tokenizer just encoded for that scheduler."""
        self.key_to_state[encoded.key] = DecodeState.start(encoded, params, scheduler_nonce)

    def adopt(self, adopt: Adopt, scheduler_nonce: str = "") -> None:
        """Rebuilds the state of a lost tokenizer's request from the tokens its client has seen."""
        state = DecodeState.start(adopt.encoded, adopt.parameters, scheduler_nonce)
        for token_id in adopt.emitted_ids:
            text = state.next_text(token_id, self._decode)
            if token_id not in self.special_ids:
                state.add_generated_text(text)
            state.stop_sequences.find(text)
        self.key_to_state[adopt.encoded.key] = state

    def forget(self, keys: list[RequestKey]) -> None:
        for key in keys:
            self.key_to_state.pop(key, None)

    def keep_only(self, scheduler_nonce: str) -> int:
        """Drops every request of another scheduler (one that restarted: the new one will never
        send a token of them, and their clients have failed them); how many were dropped."""
        stale = [key for key, state in self.key_to_state.items() if state.scheduler_nonce != scheduler_nonce]
        self.forget(stale)
        return len(stale)

    def detokenize(self, job: DetokenizeJob) -> TextBatch:
        """One step: events grouped into one `StreamEvents` per client, and stop-sequence hits."""
        client_to_events: dict[bytes, list[StreamEvent]] = collections.defaultdict(list)
        finished: list[RequestKey] = []
        for step in job.steps:
            answer = self.next_event(step)
            if answer is None:
                continue
            event, stopped = answer
            client_to_events[step.key.client_id].append(event)
            if stopped:
                finished.append(step.key)
        outputs = [ClientOutput(client_id, encode(StreamEvents(events)))
                   for client_id, events in client_to_events.items()]
        return TextBatch(outputs=outputs, finished=finished, job_id=job.job_id)

    # -- one request's step --------------------------------------------------------------------

    def next_event(self, step: TokenStep) -> tuple[StreamEvent, bool] | None:
        """One token's event, and True when a stop sequence ended the request here; None for a
        request this tokenizer does not own (already finished or forgotten): the token is skipped."""
        state = self.key_to_state.get(step.key)
        if state is None:
            logger.debug("token for unknown request %r skipped", step.key)
            return None
        state.cached_tokens = step.cached_tokens
        return self._event(step.key, state, step.generation)

    def _event(self, key: RequestKey, state: DecodeState, generation: Generation) -> tuple[StreamEvent, bool]:
        """This token's event; True when a stop sequence ended the request here."""
        try:
            return self._advance(key, state, generation)
        except Exception as exc:  # one broken request must not take the step down
            logger.exception("detokenizing %r failed", key)
            self.key_to_state.pop(key, None)
            return StreamEvent(request_id=key.request_id, error=f"detokenization failed: {exc}",
                               error_type="generation"), generation.finish_reason is None

    def _advance(self, key: RequestKey, state: DecodeState, generation: Generation) -> tuple[StreamEvent, bool]:
        if generation.finish_reason == "error":  # the worker failed the request (its grammar): no text
            del self.key_to_state[key]
            return StreamEvent(request_id=key.request_id, error=generation.error or "generation failed",
                               error_type="generation"), False
        if generation.prefill_ids is not None and state.decoder_input_details:
            state.prefill = self._prefill_tokens(generation.prefill_ids, generation.prefill_logprobs)
            state.prefill_top_tokens = self._prefill_top_tokens(generation)
        if generation.embedding is not None:
            state.embedding = generation.embedding
        text, finish_reason = self._next_text(state, generation)
        special = generation.token_id in self.special_ids
        if not special:
            state.add_generated_text(text)
        token = Token(id=generation.token_id, text=text, logprob=generation.logprob, special=special)
        top_tokens = self._top_tokens(state, generation)
        if finish_reason is None:
            return StreamEvent(request_id=key.request_id, token=token, top_tokens=top_tokens), False
        del self.key_to_state[key]
        event = StreamEvent(request_id=key.request_id, token=token, top_tokens=top_tokens,
                            generated_text=state.generated_text, details=self._details(state, finish_reason))
        return event, finish_reason == "stop_sequence"

    def _next_text(self, state: DecodeState, generation: Generation) -> tuple[str, FinishReason | None]:
        """The token's text and the request's finish reason, a stop sequence cutting the text."""
        finish_reason = generation.finish_reason
        text = state.next_text(generation.token_id, self._decode, flush=finish_reason is not None)
        if finish_reason is None:  # TGI: length and EOS take precedence over a stop sequence
            end = state.stop_sequences.find(text)
            if end is not None:
                return text[:end], "stop_sequence"
        return text, finish_reason

    def _details(self, state: DecodeState, finish_reason: FinishReason) -> FinalDetails:
        return FinalDetails(
            finish_reason=finish_reason,
            generated_tokens=state.num_generated_tokens,
            input_tokens=len(state.input_ids),
            seed=state.seed,
            prefill=state.prefill,
            cached_tokens=state.cached_tokens,
            prefill_top_tokens=state.prefill_top_tokens,
            embedding=state.embedding,
        )

    # -- token texts ---------------------------------------------------------------------------

    def _decode(self, ids: list[int]) -> str:
        if self.backend is not None:
            return self.backend.decode(ids, skip_special_tokens=False)
        text = self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        assert isinstance(text, str), "one sequence decodes to one string"
        return text

    def _tokens(self, ids: list[int], logprobs: list[float | None]) -> list[Token]:
        """Each id decoded on its own (TGI's texts for top and prefill tokens)."""
        if not ids:
            return []  # batch_decode([]) answers [""]
        single_ids = [[token_id] for token_id in ids]
        if self.backend is not None:
            texts = self.backend.decode_batch(single_ids, skip_special_tokens=False)
        else:
            texts = self.tokenizer.batch_decode(single_ids, skip_special_tokens=False,
                                                clean_up_tokenization_spaces=False)
        return [Token(id=token_id, text=text, logprob=logprob, special=token_id in self.special_ids)
                for token_id, text, logprob in zip(ids, texts, logprobs)]

    def _top_tokens(self, state: DecodeState, generation: Generation) -> list[Token]:
        if not state.top_n_tokens:
            return []
        return self._tokens(generation.top_ids, list(generation.top_logprobs))

    def _prefill_tokens(self, prefill_ids: list[int], prefill_logprobs: list[float] | None) -> list[Token]:
        # the first prompt token has no logprob (NaN on the wire): TGI reports null
        logprobs = [None if math.isnan(lp) else lp for lp in (prefill_logprobs or [])]
        logprobs += [None] * (len(prefill_ids) - len(logprobs))
        return self._tokens(prefill_ids, logprobs)

    def _prefill_top_tokens(self, generation: Generation) -> list[TopTokens]:
        """Each prompt position's likeliest tokens (none for the first), decoded in one call."""
        ids, logprobs = generation.prefill_top_ids, generation.prefill_top_logprobs
        if ids is None or logprobs is None:
            return []
        flat = self._tokens([i for row in ids for i in row], [lp for row in logprobs for lp in row])
        rows, start = [], 0
        for row in ids:
            rows.append(TopTokens(flat[start:start + len(row)]))
            start += len(row)
        return rows
