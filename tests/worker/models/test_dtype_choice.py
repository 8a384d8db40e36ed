"""`--dtype auto` on CPU: bfloat16 where the CPU has bfloat16 matrix units, float32 elsewhere."""

from __future__ import annotations

import pytest
import torch

from ztgi.services.worker.models import dtype_choice
from ztgi.services.worker.models.loading import resolve_dtype


def test_bfloat16_where_the_cpu_has_bfloat16_units(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(dtype_choice, "cpu_has_bf16_matrix_units", lambda: True)
    monkeypatch.setattr(dtype_choice, "can_pack", lambda device, dtype: True)
    assert resolve_dtype("auto", torch.device("cpu")) is torch.bfloat16


def test_float32_without_bfloat16_units(monkeypatch: pytest.MonkeyPatch):
    """An AVX2-only CPU (no bfloat16 kernel in oneDNN) stays in float32."""
    monkeypatch.setattr(dtype_choice, "cpu_has_bf16_matrix_units", lambda: False)
    assert resolve_dtype("auto", torch.device("cpu")) is torch.float32


def test_float32_where_onednn_cannot_pack_bfloat16(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(dtype_choice, "cpu_has_bf16_matrix_units", lambda: True)
    monkeypatch.setattr(dtype_choice, "can_pack", lambda device, dtype: False)
    assert resolve_dtype("auto", torch.device("cpu")) is torch.float32


def test_explicit_dtypes_are_kept(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(dtype_choice, "cpu_has_bf16_matrix_units", lambda: True)
    assert resolve_dtype("float32", torch.device("cpu")) is torch.float32
    assert resolve_dtype("bfloat16", torch.device("cpu")) is torch.bfloat16


def test_this_cpu_is_read_from_torch():
    """The rule reads the same flags torch's own kernels dispatch on."""
    expected = torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()
    assert dtype_choice.cpu_has_bf16_matrix_units() == expected
