"""`studies.product_bound` times a GGUF's products as built against the same without scale arithmetic."""

from __future__ import annotations

import pytest
import torch

from studies import product_bound
from tests.worker.layers.gguf_files import Q, random_blocks, write_gguf
from ztgi.services.worker.kernels import native_library
from ztgi.services.worker.layers.quantization.block_linear import CPU_FLAGS, Int8BlockLinear, quantize_blocks

# the study builds `block_linear.c` itself, the AVX512-VNNI source
pytestmark = pytest.mark.skipif(not set(CPU_FLAGS) <= native_library.cpu_flags()
                                or Int8BlockLinear.load(*quantize_blocks(torch.ones(16, 32))) is None,
                                reason="no AVX512-VNNI/BF16 CPU or no C compiler here")

HIDDEN, INTERMEDIATE = 256, 512
SHAPES = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (HIDDEN, HIDDEN), "attn_v": (HIDDEN, HIDDEN),
          "attn_output": (HIDDEN, HIDDEN), "ffn_gate": (INTERMEDIATE, HIDDEN), "ffn_up": (INTERMEDIATE, HIDDEN),
          "ffn_down": (HIDDEN, INTERMEDIATE)}


def test_the_float_terms_become_one_integer_add():
    source = product_bound.SOURCE.read_text()
    bound = product_bound.without_scales(source)
    assert product_bound.INTEGER_ADD in bound and product_bound.INTEGER_ADD not in source
    scaled_dot = "_mm512_fmadd_ps(_mm512_cvtepi32_ps(dot)"
    assert scaled_dot in source and scaled_dot not in bound


def test_it_times_every_kind_in_both_builds(tmp_path, capsys):
    tensors = {f"blk.0.{name}.weight": (Q.Q4_K, random_blocks(Q.Q4_K, *shape, seed=number))
               for number, (name, shape) in enumerate(SHAPES.items())}
    tensors["token_embd.weight"] = (Q.Q6_K, random_blocks(Q.Q6_K, 64, HIDDEN, seed=9))
    path = tmp_path / "tiny.gguf"
    write_gguf(str(path), tensors)
    assert product_bound.main([str(path), "--rows", "3", "--steps", "2"]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[2:]}
    assert set(rows) == {"qkv", "o", "gate_up", "down", "head", "all"}
    assert all(float(built) > 0 and float(bound) > 0 and float(ratio) > 0 for built, bound, ratio in rows.values())
