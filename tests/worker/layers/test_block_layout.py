"""`BlockLayout`: every kind of `BlockCodes` packed for the kernel reads back as the same weights."""

from __future__ import annotations

import pytest
import torch

from tests.worker.layers.block_helpers import KIND_IDS, KINDS, block_codes, needs_kernel
from ztgi.services.worker.layers.quantization.block_codes import BlockCodes
from ztgi.services.worker.layers.quantization.block_layout import BlockLayout
from ztgi.services.worker.layers.quantization.block_linear import BlockLinear


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("symmetric", [False, True], ids=["offsets", "centered"])
@pytest.mark.parametrize("out_features", [16, 40])
def test_packed_codes_read_back_as_the_same_weights(kind, symmetric, out_features):
    """Nibbles, bit planes or bytes, scales and offsets (or the center) unpack to the codes, scales
    and offsets packed: the same weights, bit for bit; offsets stored only where not -center scales."""
    codes = block_codes(*kind, out_features, 96, symmetric, seed=out_features)
    layout = BlockLayout.pack(codes)
    back = layout.unpacked()
    assert torch.equal(back.codes, codes.codes) and torch.equal(back.scales, codes.scales)
    assert torch.equal(back.dequantized(), codes.dequantized())
    assert (layout.center != 0) == symmetric and (layout.offset_factors.numel() == 0) == symmetric
    assert layout.planes.numel() == (0 if kind[0] in (4, 8) else -(-out_features // 16) * 3 * (kind[0] - 4) * 64)


def test_codes_with_every_bit_set_keep_their_high_bits():
    """The top codes (all ones) and zeros side by side: no bit plane drops or moves a bit."""
    codes = torch.tensor([[63, 0] * 16, [0, 63] * 16], dtype=torch.uint8).repeat(8, 2)
    block = BlockCodes.plain(codes, 6, 16, torch.ones(16, 4), torch.zeros(16, 4))
    assert torch.equal(BlockLayout.pack(block).unpacked().codes, codes)


@needs_kernel
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_layer_dequantized_is_the_codes_weights(kind):
    """`dequantized()` (the weights as the kernel sees them) is `BlockCodes.dequantized()`."""
    codes = block_codes(*kind, 40, 64, False, seed=7)
    layer = BlockLinear.load(codes)
    assert torch.equal(layer.dequantized(), codes.dequantized())


def test_inputs_not_in_whole_blocks_are_refused():
    with pytest.raises(ValueError, match="multiple of 32"):
        BlockLayout.pack(block_codes(6, 16, None, 16, 48, False))
