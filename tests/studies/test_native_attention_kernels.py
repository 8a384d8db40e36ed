"""The kernels-against-torch benchmark runs, prints each shape, and refuses malformed shapes."""

from __future__ import annotations

import pytest

from studies import native_attention_kernels
from ztgi.common.config import ConfigError
from ztgi.services.worker.kernels.native_attention import NativeAttention


@pytest.mark.skipif(NativeAttention.load() is None, reason="no AVX512-BF16 CPU or no C compiler here")
def test_it_times_every_shape_in_turns(capsys):
    assert native_attention_kernels.main(["--decode", "1x40,3x20", "--prefill", "0+20,16+5", "--repeats", "1",
                                          "--num-threads", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for shape in ("decode 1 x ~40", "decode 3 x ~20", "prefill 20 after 0", "prefill 5 after 16"):
        row = next(line for line in lines if shape in line)
        torch_ms, in_place_ms, ratio = row.split()[-3:]
        assert float(torch_ms) > 0 and float(in_place_ms) > 0 and ratio.endswith("x")


@pytest.mark.parametrize("flag,value", [("--decode", "16by500"), ("--prefill", "0+0"), ("--decode", "x5")])
def test_malformed_shapes_are_refused(flag, value):
    with pytest.raises((ConfigError, SystemExit)):
        native_attention_kernels.main([flag, value])
