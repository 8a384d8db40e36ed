"""`DenseRows` (`kernels/csrc/dense_linear_avx2.c`): float32 decode rows by a plain float32 weight in C,
and `PackedLinear`'s choice between it and oneDNN by the number of rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ztgi.services.worker.layers.packed_linear import DENSE_ROWS_MAX, DenseRows, PackedLinear

needs_kernel = pytest.mark.skipif(DenseRows.load() is None, reason="the C rows product needs an x86 CPU with AVX2")


def _weight_and_rows(out_features: int, in_features: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(out_features * 1000 + rows)
    return (torch.randn(out_features, in_features, generator=generator),
            torch.randn(rows, in_features, generator=generator))


@needs_kernel
@pytest.mark.parametrize("out_features", [1, 7, 8, 9, 96, 1000])
@pytest.mark.parametrize("rows", [0, 1, 3, DENSE_ROWS_MAX])
def test_rows_equal_f_linear_for_every_tile_tail(out_features: int, rows: int):
    """Every output of a full and a short last tile, for no row, one and many, within float32's
    rounding of F.linear (another summation order); a weight large enough to split across threads."""
    in_features = 2048 if out_features == 1000 else 64
    weight, x = _weight_and_rows(out_features, in_features, rows)
    y = DenseRows.load()(x, weight)
    assert y.shape == (rows, out_features) and y.dtype == torch.float32
    torch.testing.assert_close(y, F.linear(x, weight), rtol=1e-4, atol=1e-4)


@needs_kernel
def test_strided_rows_are_made_contiguous_first():
    """A view whose rows are not adjacent in memory (every other row of a larger tensor) gives the
    result of its contiguous copy."""
    weight, x = _weight_and_rows(24, 32, 8)
    torch.testing.assert_close(DenseRows.load()(x[::2], weight), F.linear(x[::2], weight), rtol=1e-4, atol=1e-4)


@needs_kernel
def test_a_width_not_in_whole_vectors_is_refused_by_the_kernel_and_not_taken_by_the_layer():
    """in_features 12 (not a multiple of 8): the C function says no (status 1), and a layer on such a
    weight never offers it rows: oneDNN or F.linear serves them."""
    weight, x = _weight_and_rows(16, 12, 2)
    with pytest.raises(RuntimeError, match="status 1"):
        DenseRows.load()(x, weight)
    layer = PackedLinear(weight)
    assert layer.dense_rows is None
    torch.testing.assert_close(layer(x), F.linear(x, weight), rtol=1e-4, atol=1e-4)


@needs_kernel
@pytest.mark.parametrize("rows", [1, DENSE_ROWS_MAX, DENSE_ROWS_MAX + 1, 200])
def test_the_layer_keeps_one_plain_weight_for_both_kernels(rows: int):
    """A float32 layer holds its weight once, plain (no oneDNN packed copy beside it); a decode step's
    rows and a prefill's both give F.linear's result."""
    weight, x = _weight_and_rows(40, 64, rows)
    layer = PackedLinear(weight)
    assert layer.dense_rows is not None and not layer.packed
    assert layer.weight.layout == torch.strided and torch.equal(layer.weight, weight)
    torch.testing.assert_close(layer(x.view(1, rows, 64)), F.linear(x, weight).view(1, rows, 40),
                               rtol=1e-4, atol=1e-4)


def test_bfloat16_and_float16_weights_are_not_taken():
    """Only float32 weights on CPU: other dtypes keep oneDNN's or torch's path."""
    assert not DenseRows.takes(torch.zeros(8, 8, dtype=torch.bfloat16))
    assert not DenseRows.takes(torch.zeros(8, 8, dtype=torch.float16))
    assert DenseRows.takes(torch.zeros(8, 8))
