"""The machine-limits study's pieces: the measured rates are positive, the packed bytes are the layers'."""

from __future__ import annotations

import torch

from studies import machine_limits


def test_rates_are_measured():
    """Each rate by the kernel this CPU has (fbgemm's int8 product without VNNI, float32 through
    oneDNN without bfloat16 units), and float32 anywhere."""
    assert machine_limits.read_bandwidth(1 << 24) > 1e8
    assert machine_limits.float_matrix_rate(32, 256, 256) > 1e8
    assert machine_limits.float_matrix_rate(32, 256, 256, torch.float32) > 1e8
    assert machine_limits.int8_matrix_rate(32, 256, 256) > 1e8


def test_packed_bytes_of_the_embedded_model():
    """SmolLM2 as stored: Q4_1 layers of 4-bit codes with the file's float16 scale and offset per 32
    weights (5 bits a weight, padded to tiles of 16 outputs), and the Q8_0 head (8 bits and a float16
    scale per 32): 5.74 bits a weight in all, the file's own."""
    num_bytes, num_weights = machine_limits.packed_bytes("smollm2")
    assert 0.70 * num_weights < num_bytes < 0.75 * num_weights
