"""`studies.int4_decode` runs its comparisons and checks the one-call step's logits."""

from __future__ import annotations

import pytest
import torch

from studies import int4_decode
from ztgi.common.config import ConfigError
from ztgi.services.worker.kernels import native_library
from ztgi.services.worker.layers.quantization.block_linear import CPU_FLAGS, Int8BlockLinear, quantize_blocks

# the study ends on the one-call decode stack, whose other kernels need AVX512-BF16 (the block
# products alone also run with AVX2)
pytestmark = pytest.mark.skipif(not set(CPU_FLAGS) <= native_library.cpu_flags()
                                or Int8BlockLinear.load(*quantize_blocks(torch.ones(16, 32))) is None,
                                reason="no AVX512-VNNI/BF16 CPU or no C compiler here")


def test_it_times_products_and_steps_in_turns(capsys):
    """Every row count for the layers and the head, and a decode step whose two paths give
    bit-identical logits."""
    assert int4_decode.main(["--rows", "1,3", "--steps", "2x20", "--repeats", "1", "--num-threads", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    products = [line.split() for line in lines if line.split() and line.split()[0] in ("1", "3")]
    assert len(products) == 4 and all(row[-1].endswith("x") and float(row[1]) > 0 for row in products)
    step = next(line for line in lines if "2 x 20" in line)
    assert step.endswith("bit-identical")


@pytest.mark.parametrize("flag,value", [("--rows", "0"), ("--rows", "a"), ("--steps", "2by20"), ("--steps", "0x5")])
def test_malformed_flags_are_refused(flag, value):
    with pytest.raises((ConfigError, SystemExit)):
        int4_decode.main([flag, value])
