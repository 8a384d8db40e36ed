"""The Kirchenbauer watermark: seeded green lists, the logit bias, and detection in generated text."""

from __future__ import annotations

import pytest
import torch

from tests.worker.engine_helpers import batch_of, request, run_to_end, token_ids
from ztgi.services.worker.config import WorkerConfig
from ztgi.services.worker.padded.model import PaddedModel as Model
from ztgi.services.worker.sampling import watermark

VOCAB_SIZE = 1000


def test_greenlist_is_seeded_by_the_previous_token():
    """The same previous token gives the same gamma-sized green list; another token gives another."""
    first = watermark.greenlist_ids(7, VOCAB_SIZE, 0.5)
    assert torch.equal(first, watermark.greenlist_ids(7, VOCAB_SIZE, 0.5))
    assert len(first) == 500 and len(set(first.tolist())) == 500
    assert not torch.equal(first, watermark.greenlist_ids(8, VOCAB_SIZE, 0.5))
    assert len(watermark.greenlist_ids(7, VOCAB_SIZE, 0.25)) == 250


def test_apply_biases_only_the_green_tokens_of_watermarked_rows():
    """delta is added to exactly the green ids of the listed rows; the other row is untouched."""
    scores = torch.zeros(2, VOCAB_SIZE)
    biased = watermark.apply(scores, torch.tensor([3, 3]), rows=[1])
    green = watermark.greenlist_ids(3, VOCAB_SIZE, watermark.settings.gamma)
    assert torch.equal(biased[0], scores[0])
    assert biased[1, green].eq(watermark.settings.delta).all()
    assert biased[1].sum().item() == pytest.approx(watermark.settings.delta * len(green))


def test_generated_text_carries_a_detectable_watermark(tiny_model: Model):
    """Sampled with the watermark, 48 tokens score z > 4; the same request without it scores near 0."""
    prompt = [1, 504, 3458, 314, 4649, 8506]
    marked, plain = request(1, prompt, 48, ignore_eos=True, do_sample=True, seed=5, watermark=True), \
        request(2, prompt, 48, ignore_eos=True, do_sample=True, seed=5)
    tokens = token_ids(run_to_end(tiny_model, batch_of(tiny_model, [marked, plain])))
    vocab_size = tiny_model.config.vocab_size
    assert watermark.z_score(prompt[-1:] + tokens[1], vocab_size) > 4
    assert abs(watermark.z_score(prompt[-1:] + tokens[2], vocab_size)) < 3


def test_watermark_strength_is_validated():
    """gamma outside (0, 1) or a negative delta is refused with the flag's name."""
    with pytest.raises(ValueError, match="--watermark-gamma"):
        WorkerConfig(watermark_gamma=1.0)
    with pytest.raises(ValueError, match="--watermark-delta"):
        WorkerConfig(watermark_delta=-1.0)
